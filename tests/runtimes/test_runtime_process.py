"""Runtimes on the process backend, embedded: numpy computes, preloaded once per runtime's own
fork server; the runtime is read-only; a numpy allocation over the memory limit is a `memory`
violation; a missing runtime or one built for another Python is refused before any sandbox."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.engine import ExecutionRequest
from sandbox.errors import InvalidArgument, NotFound
from sandbox.runtimes.store import MOUNT_POINT
from tests.runtimes.runtime_support import EngineHarness, world_traversable_dir

NUMPY_SCRIPT = """
import numpy as np
a = np.array([[3.0, 1.0], [1.0, 2.0]])
x = np.linalg.solve(a, np.array([9.0, 8.0]))
print(x.tolist(), int(np.arange(1000).sum()))
"""


@pytest.fixture(scope="module")
def harness(runtimes_dir: Path) -> Iterator[EngineHarness]:
    h = EngineHarness(pool_size=1, runtimes_dir=str(runtimes_dir))
    yield h
    h.close()


def test_numpy_computes_in_its_runtime(harness: EngineHarness) -> None:
    result = harness.run(NUMPY_SCRIPT, runtime="np")
    assert (result.status, result.stdout, result.stderr) == ("ok", "[2.0, 3.0] 499500\n", "")
    assert result.isolation[-1] == "runtime:np"
    assert "fs:readonly-runtime" in result.isolation
    assert harness.leftovers() == []


def test_preload_is_per_runtime(harness: EngineHarness) -> None:
    script = "import sys; print('numpy' in sys.modules, sys.flags.no_site, sys.flags.isolated)"
    preloaded = harness.run(script, runtime="np")
    assert (preloaded.status, preloaded.stdout) == ("ok", "True 1 1\n")
    plain = harness.run(script, runtime="pure")
    assert (plain.status, plain.stdout) == ("ok", "False 1 1\n")


def _guest_stdlib_path(harness: EngineHarness) -> list[str]:
    """The guest interpreter's own sys.path under -I -S: its standard library, nothing else."""
    done = subprocess.run(
        [harness.backend.python, "-I", "-S", "-c", "import sys; print(sys.path)"],
        capture_output=True, text=True, timeout=30, check=True, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return list(ast.literal_eval(done.stdout))


@pytest.mark.parametrize("runtime", ["np", "pure", None])
def test_a_runtime_sandbox_sees_no_host_path(harness: EngineHarness, runtime: str | None) -> None:
    # The fork server imported numpy before forking (np): that left no path of its own behind.
    # The sandbox sees its guest directory, the standard library and its runtime's site, in that
    # order, and nothing of the host (no venv, no user site, no working directory, no runtimes
    # root).
    script = "import json, sys; print(json.dumps(sys.path))"
    result = harness.run(script, runtime=runtime)
    assert result.status == "ok", result.to_json()
    site = [] if runtime is None else [f"{MOUNT_POINT}/site"]
    # The fork server and the bootstrap each put the guest directory first: "/ptc" twice.
    path = json.loads(result.stdout)
    assert path[:2] == ["/ptc", "/ptc"]
    assert path[2:] == [*_guest_stdlib_path(harness), *site]


def test_one_fork_server_per_runtime(harness: EngineHarness) -> None:
    harness.run("print(1)", runtime="np")
    harness.run("print(1)", runtime="pure")
    runtimes = harness.backend.runtimes
    assert runtimes is not None
    assert sorted(runtimes.envs) == ["np", "pure"]
    assert harness.backend.zygote is not None
    pids = [harness.backend.zygote.pids()] + [e.zygote.pids() for e in runtimes.envs.values()]
    assert all(len(p) == 2 for p in pids)
    assert len({p[1] for p in pids}) == 3  # three distinct zygotes


def test_pure_python_package_and_separation(harness: EngineHarness) -> None:
    pure = harness.run("import six; print(six.PY3)", runtime="pure")
    assert (pure.status, pure.stdout) == ("ok", "True\n")
    for runtime in ("pure", None):
        missing = harness.run("import numpy", runtime=runtime)
        assert missing.status == "error"
        assert missing.error is not None
        assert (missing.error.type, missing.error.message) == (
            "ModuleNotFoundError",
            "No module named 'numpy'",
        )
    bare = harness.run("import sys; print([p for p in sys.path if 'runtime' in p])")
    assert (bare.status, bare.stdout) == ("ok", "[]\n")


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("/ptc-runtime/site/evil.py", "OSError 30"),  # EROFS: a new file on the ro mount
        ("/ptc-runtime/x", "OSError 30"),
        # An existing file is root's and 0644: the permission check comes first (EACCES).
        ("/ptc-runtime/site/numpy/__init__.py", "PermissionError 13"),
    ],
)
def test_a_sandbox_cannot_write_into_its_runtime(
    harness: EngineHarness, runtimes_dir: Path, target: str, error: str
) -> None:
    script = f"""
try:
    open({target!r}, "a").write("pwned")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""
    result = harness.run(script, runtime="np")
    assert (result.status, result.stdout) == ("ok", f"{error}\n")
    assert not (runtimes_dir / "np" / "site" / "evil.py").exists()
    assert "pwned" not in (runtimes_dir / "np" / "site" / "numpy" / "__init__.py").read_text()
    harness.assert_healthy()


def test_the_runtime_is_mounted_read_only(harness: EngineHarness) -> None:
    script = """
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if fields[4] == "/ptc-runtime":
        print(fields[5].split(",")[0])
"""
    result = harness.run(script, runtime="np")
    assert (result.status, result.stdout) == ("ok", "ro\n")


def test_numpy_over_the_memory_limit_is_a_memory_violation(harness: EngineHarness) -> None:
    limit = 128 * 1024 * 1024
    script = "import numpy as np\na = np.ones(64 * 1024 * 1024)  # 512 MiB\nprint(a.sum())\n"
    result = harness.run(script, runtime="np", limits={"memory": limit})
    assert result.status == "limit_exceeded", result.to_json()
    memory = [v for v in result.violations if v.limit == "memory"]
    assert len(memory) == 1, result.violations
    assert memory[0].limit_value == limit
    assert memory[0].evidence == "kernel"
    assert result.stdout == ""
    # Just under: the same script with an array that fits passes.
    fits = harness.run(
        "import numpy as np\nprint(np.ones(4 * 1024 * 1024).sum())\n",
        runtime="np",
        limits={"memory": limit},
    )
    assert (fits.status, fits.stdout) == ("ok", "4194304.0\n")
    harness.assert_healthy()
    assert harness.leftovers() == []


def _started_total(harness: EngineHarness) -> int:
    """Sandboxes ever started, by the default pool and every runtime's own."""
    runtimes = harness.backend.runtimes
    envs = runtimes.envs.values() if runtimes is not None else ()
    return int(harness.backend.pool.started_total + sum(e.pool.started_total for e in envs))


def test_missing_runtime_is_refused_before_any_sandbox(harness: EngineHarness) -> None:
    harness.settle()
    started = _started_total(harness)
    with pytest.raises(NotFound) as caught:
        harness.run("print(1)", runtime="nope")
    assert caught.value.message.startswith("runtime: no runtime named 'nope' in ")
    assert caught.value.message.endswith(" (have: np, pure)")
    with pytest.raises(InvalidArgument) as bad:
        harness.run("print(1)", runtime="../np")
    assert bad.value.message.startswith("runtime: '../np' is not a valid runtime name")
    assert _started_total(harness) == started
    runtimes = harness.backend.runtimes
    assert runtimes is not None and "nope" not in runtimes.envs
    harness.assert_healthy()


def test_runtime_for_another_python_is_refused(harness: EngineHarness, runtimes_dir: Path) -> None:
    other = world_traversable_dir("ptcrt-other-")
    try:
        shutil.copytree(runtimes_dir / "pure", other / "old")
        meta = json.loads((other / "old" / "runtime.json").read_text())
        (other / "old" / "runtime.json").write_text(json.dumps({**meta, "python": "3.99"}))
        runtimes = harness.backend.runtimes
        assert runtimes is not None
        harness.settle()
        started = _started_total(harness)
        store, runtimes.store = runtimes.store, type(runtimes.store)(other)
        try:
            request = ExecutionRequest(script="print(1)", runtime="old")
            with pytest.raises(InvalidArgument) as caught:
                harness.call(harness.engine.execute(request))
        finally:
            runtimes.store = store
        assert caught.value.message == (
            "runtime: 'old' was built for Python 3.99, but the sandbox runs Python 3.11; "
            "rebuild it (`ptc runtime rm old` then `ptc runtime build old ...`)"
        )
        # Refused before any sandbox was taken: none started, no fork server for it.
        assert _started_total(harness) == started
        assert "old" not in runtimes.envs
    finally:
        shutil.rmtree(other, ignore_errors=True)
    harness.assert_healthy()


def test_default_runtime_is_the_standard_library(harness: EngineHarness) -> None:
    for runtime in (None, "", "default"):
        result = harness.run("import json; print(json.dumps([1]))", runtime=runtime)
        assert (result.status, result.stdout) == ("ok", "[1]\n")
        assert not any(layer.startswith("runtime:") for layer in result.isolation)
