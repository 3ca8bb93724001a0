"""Runtime edges a new user meets first, through the paths users take (`ptc runtime build`,
`ptc run`, a real `ptc serve --runtimes-dir` with and without a tenants file, the SDK):

- a build into a directory the sandbox's uid cannot traverse is refused, naming it, with nothing
  built (not a build that fails only at the first execution); the directories a build
  creates are traversable whatever the umask;
- a runtime name is checked in one order on every path: a bad name is INVALID_ARGUMENT (naming
  the rule) before any tenant check, one that is not built NOT_FOUND, one a tenant may not use
  PERMISSION_DENIED; a tenant's errors name only its own runtimes.

The runtime built here is bare (an empty requirements file, from an empty wheelhouse): no index
is needed, and it runs like any other.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.client import Client
from sandbox.errors import InvalidArgument, NotFound, PermissionDenied
from sandbox.tenants import hash_key
from tests.ptc_serve import ptc_serve
from tests.runtimes.runtime_support import PYTHON, ROOT, world_traversable_dir

ACME = "ptc-test-key-runtime-edges-acme-0123456789"
BETA = "ptc-test-key-runtime-edges-beta-0123456789"
TENANTS = f"""
[[tenant]]
id = "acme"
keys = ["{hash_key(ACME)}"]
runtimes = ["bare", "gone"]  # "gone" is never built

[[tenant]]
id = "beta"
keys = ["{hash_key(BETA)}"]
"""
BAD_NAME = (
    "runtime: '../bare' is not a valid runtime name (1-64 of [a-z0-9._-], starting with a "
    "letter or digit, no '..')"
)


def _build(
    root: Path, name: str, inputs: Path, *, umask: int = 0o022
) -> subprocess.CompletedProcess[str]:
    (inputs / "empty.txt").write_text("")
    (inputs / "wheels").mkdir(exist_ok=True)
    return subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "runtime", "--dir", str(root), "build", name,
         "-r", str(inputs / "empty.txt"), "--wheelhouse", str(inputs / "wheels")],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False, umask=umask,
    )  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A world-traversable parent holding ``rt/bare``, built under a private umask into
    directories that did not exist yet."""
    parent = world_traversable_dir("ptcrt-edges-")
    try:
        done = _build(parent / "new" / "rt", "bare", tmp_path_factory.mktemp("in"), umask=0o077)
        assert done.returncode == 0, done.stderr
        yield parent / "new" / "rt"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_a_build_creates_its_directories_traversable_under_a_private_umask(built: Path) -> None:
    for path in (built.parent, built, built / "bare", built / "bare" / "site"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, path
    done = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--runtime", "bare", "--json"],
        input="print(6 * 7)", capture_output=True, text=True, cwd=ROOT, timeout=120,
        check=False, env={**os.environ, "PTC_RUNTIMES_DIR": str(built)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["stdout"]) == ("ok", "42\n")
    assert result["isolation"][-1] == "runtime:bare"


def test_a_build_under_an_untraversable_directory_is_refused(tmp_path: Path) -> None:
    parent = world_traversable_dir("ptcrt-private-")
    try:
        private = parent / "private"
        private.mkdir(mode=0o700)
        private.chmod(0o700)
        done = _build(private / "rt", "bare", tmp_path)
        assert done.returncode == InvalidArgument.exit_code, done.stderr
        assert done.stdout == ""
        assert done.stderr == (
            f"ptc runtime: runtime: 'bare': {private} (mode 0700) cannot be traversed by other "
            f"users, and a sandbox reads its runtime as a uid of its own: a runtime in "
            f"{private / 'rt'} could never run; make it traversable (chmod o+x {private}) or "
            "build into a directory that is (--dir or $PTC_RUNTIMES_DIR); nothing was built\n"
        )
        assert list(private.iterdir()) == []  # nothing created, nothing built
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="module")
def tenants_server(built: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`ptc serve --runtimes-dir` with a tenants file; $PTC_RUNTIMES_DIR names an empty
    directory, so only the flag can find the runtime."""
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(TENANTS)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    env = {**os.environ, "PTC_RUNTIMES_DIR": str(elsewhere)}
    with ptc_serve(
        "--pool-size", "1", "--audit-db", "memory", "--tenants", str(tenants),
        "--runtimes-dir", str(built), env=env,
    ) as serving:  # fmt: skip
        yield serving.address


def _refusal(client: Client, runtime: str, *, session: bool = False) -> tuple[type, str]:
    try:
        if session:
            client.session(runtime=runtime).create()
        else:
            client.execute("print(1)", runtime=runtime)
    except (InvalidArgument, NotFound, PermissionDenied) as exc:
        return type(exc), exc.message
    raise AssertionError(f"runtime {runtime!r} was not refused")


@pytest.mark.parametrize("session", [False, True], ids=["execute", "create-session"])
def test_served_runtime_names_with_a_tenants_file(tenants_server: str, session: bool) -> None:
    with Client(tenants_server, ACME) as acme, Client(tenants_server, BETA) as beta:
        ran = acme.execute("print(6 * 7)", runtime="bare")
        assert (ran.status, ran.stdout, ran.isolation[-1]) == ("ok", "42\n", "runtime:bare")
        # A bad name is refused as such, before the tenant's list is consulted.
        assert _refusal(acme, "../bare", session=session) == (InvalidArgument, BAD_NAME)
        assert _refusal(beta, "../bare", session=session) == (InvalidArgument, BAD_NAME)
        # Not built: NOT_FOUND, whether or not it is on the tenant's list.
        assert _refusal(acme, "gone", session=session) == (
            NotFound,
            "runtime: no runtime named 'gone' on this server (tenant 'acme' may use: bare, gone)",
        )
        assert _refusal(beta, "nope", session=session) == (
            NotFound,
            "runtime: no runtime named 'nope' on this server (tenant 'beta' may use: only the "
            "default)",
        )
        # Built, but not the tenant's.
        assert _refusal(beta, "bare", session=session) == (
            PermissionDenied,
            "runtime: tenant 'beta' may not use 'bare' (allowed: only the default)",
        )
        healthy = beta.execute("print('still ok')")
    assert (healthy.status, healthy.stdout) == ("ok", "still ok\n")


def test_cli_run_through_the_server_gets_each_code(tenants_server: str) -> None:
    def run(runtime: str, key: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "sandbox.cli", "run", "-", "--server", tenants_server,
             "--runtime", runtime, "--json"],
            input="print(1)", capture_output=True, text=True, cwd=ROOT, timeout=120,
            check=False, env={**os.environ, "PTC_API_KEY": key},
        )  # fmt: skip

    for runtime, key, error, message in [
        ("../bare", BETA, InvalidArgument, BAD_NAME),
        ("nope", ACME, NotFound, "runtime: no runtime named 'nope' on this server (tenant "
         "'acme' may use: bare, gone)"),
        ("bare", BETA, PermissionDenied, "runtime: tenant 'beta' may not use 'bare' (allowed: "
         "only the default)"),
    ]:  # fmt: skip
        done = run(runtime, key)
        assert done.returncode == error.exit_code, done.stderr
        label = "" if error is InvalidArgument else f"{error.label}: "  # the CLI's convention
        assert done.stderr == f"ptc run: {label}server {tenants_server}: {message}\n"
    ok = run("bare", ACME)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["stdout"] == "1\n"
    session = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "session", "create", "--server", tenants_server,
         "--runtime", "nope", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
        env={**os.environ, "PTC_API_KEY": BETA},
    )  # fmt: skip
    assert session.returncode == NotFound.exit_code, session.stderr
    assert session.stderr.endswith(
        "runtime: no runtime named 'nope' on this server (tenant 'beta' may use: only the "
        "default)\n"
    )


def test_served_runtime_names_without_a_tenants_file(built: Path) -> None:
    """The single tenant may name any runtime: the server answers as `ptc run` does."""
    with (
        ptc_serve("--pool-size", "1", "--audit-db", "memory", "--runtimes-dir", str(built)) as s,
        Client(s.address) as client,
    ):
        ran = client.execute("print(6 * 7)", runtime="bare")
        assert (ran.status, ran.stdout) == ("ok", "42\n")
        assert _refusal(client, "../bare") == (InvalidArgument, BAD_NAME)
        kind, message = _refusal(client, "nope")
        assert kind is NotFound
        assert message == f"runtime: no runtime named 'nope' in {built} (have: bare)"
    embedded = subprocess.run(
        [PYTHON, "-m", "sandbox.cli", "run", "-", "--runtime", "nope"],
        input="print(1)", capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
        env={**os.environ, "PTC_RUNTIMES_DIR": str(built)},
    )  # fmt: skip
    assert embedded.returncode == NotFound.exit_code
    assert (
        embedded.stderr
        == f"ptc run: not found: runtime: no runtime named 'nope' in {built} (have: bare)\n"
    )
