"""Shared fixtures: one real, started Engine on the process backend per test module.

The engine is asynchronous; the tests are plain functions. `EngineHarness` runs the engine's
event loop in a background thread and offers a blocking `run()`, so all tests of a module reuse
one warm pool (starting an engine costs a bubblewrap probe and a cgroup set-up) and stay fast.
The scope is the module, not the session: only one process backend can be open per process (its
cgroup parent is named after our pid), so a session-wide engine would lock other test packages
out of theirs. CLI tests run `ptc` in subprocesses.

`harness.leftovers()` lists what an execution left behind: processes, cgroups, mounts and
temporary entries that do not belong to the warm pool's idle sandboxes. Tests assert it is empty.

Tests marked `requires_docker` (anywhere under tests/) are skipped, with the reason, when no Docker
engine answers or the runtime image is missing or stale: `docker_unavailable_reason()`. Tests
marked `requires_gvisor` (the Docker backend under runsc) are skipped, with the reason, when the
engine has no runsc registered either: `gvisor_unavailable_reason()`; with
``PTC_REQUIRE_GVISOR=1`` (set by scripts/test.sh, so CI never loses the gVisor tier quietly) they
fail instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from sandbox.backends.factory import build_backend
from sandbox.backends.process.backend import ProcessBackendConfig
from sandbox.engine import Engine, EngineConfig, ExecutionRequest, RunHooks
from sandbox.errors import Unavailable
from sandbox.expectations import ExpectedCalls
from sandbox.guest import FORK_LOOP_FILE, GUEST_FILES, ZYGOTE_FILES
from sandbox.handlers import Approver, ToolHandler
from sandbox.limits import parse_limit_args
from sandbox.result import ExecutionResult
from tests.postgres_support import (
    POSTGRES_URL,
    REQUIRE_POSTGRES,
    UNSET_REASON,
    fresh_schema,
    postgres_required,
)
from tests.ptc_cli import run_ptc

T = TypeVar("T")
POOL_SIZE = 2
# What the process backend's runtime dir holds for as long as the backend lives.
RUNTIME_FILES = frozenset((*GUEST_FILES, *ZYGOTE_FILES, FORK_LOOP_FILE))
REQUIRE_GVISOR = "PTC_REQUIRE_GVISOR"


def _mounts() -> set[str]:
    return {
        " ".join(line.split()[3:5])
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    }


def _own_tmp_entries(pid: int) -> set[Path]:
    """The temporary entries named after process ``pid``: a `ptc*` name with the pid as one of
    its ``-``-separated parts (``ptc-runtime-<pid>-<random>``, the process backend's runtime
    directory). Other processes on this machine use the `ptc` prefix too (other test runs,
    servers, benchmarks): their entries are none of this process's business."""
    token = str(pid)
    found: set[Path] = set()
    for parent in {Path("/tmp"), Path(tempfile.gettempdir())}:
        with contextlib.suppress(OSError):
            found.update(
                p
                for p in parent.iterdir()
                if p.name.startswith("ptc") and token in p.name.split("-")
            )
    return found


@functools.cache
def docker_unavailable_reason() -> str | None:
    """Why the Docker backend cannot run here (no engine, missing or stale image), or None."""
    from sandbox.backends.docker import engine_client

    try:
        client = engine_client.connect(engine_client.engine_address())
    except Unavailable as exc:
        return exc.message
    try:
        engine_client.check_image(client, engine_client.default_image())
    except Unavailable as exc:
        return exc.message
    finally:
        client.close()
    return None


@functools.cache
def gvisor_unavailable_reason() -> str | None:
    """Why the Docker backend cannot run containers under runsc here, or None."""
    from sandbox.backends.docker import engine_client

    reason = docker_unavailable_reason()
    if reason is not None:
        return reason
    try:
        client = engine_client.connect(engine_client.engine_address())
    except Unavailable as exc:
        return exc.message
    try:
        engine_client.check_runtime(client, "runsc")
    except Unavailable as exc:
        return exc.message
    finally:
        client.close()
    return None


def gvisor_required() -> bool:
    """True when gVisor tests must run (``PTC_REQUIRE_GVISOR=1``): unavailable, they fail."""
    return os.environ.get(REQUIRE_GVISOR, "") not in ("", "0")


@pytest.hookimpl(trylast=True)  # after other conftests have marked their Docker tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("requires_gvisor") is not None and gvisor_required():
            continue  # not skipped: pytest_runtest_setup fails it when gVisor is unavailable
        if item.get_closest_marker("requires_docker") is not None:
            reason = docker_unavailable_reason()
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=f"requires_docker: {reason}"))


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL schema's URL (tests/postgres_support.py); mark the test
    ``requires_postgres``."""
    with fresh_schema() as schema:
        yield schema.url


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures start a runsc backend
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("requires_postgres") is not None and not POSTGRES_URL:
        if postgres_required():
            pytest.fail(f"{REQUIRE_POSTGRES}=1 but {UNSET_REASON}", pytrace=False)
        pytest.skip(f"requires_postgres: {UNSET_REASON}")
    if item.get_closest_marker("requires_gvisor") is None:
        return
    reason = gvisor_unavailable_reason()
    if reason is None:
        return
    if gvisor_required():
        pytest.fail(f"{REQUIRE_GVISOR}=1 but gVisor is unavailable: {reason}", pytrace=False)
    pytest.skip(f"requires_gvisor: {reason}")


class EngineHarness:
    """A started Engine whose event loop runs in a daemon thread."""

    def __init__(self, pool_size: int = POOL_SIZE, **backend_options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="engine-loop", daemon=True
        )
        self._thread.start()
        self.baseline_mounts = _mounts()
        self.baseline_tmp = _own_tmp_entries(os.getpid())
        self.backend = build_backend(
            "process", ProcessBackendConfig(pool_size=pool_size, **backend_options)
        )
        self.engine = Engine(EngineConfig(backends={"process": self.backend}))
        self.call(self.engine.start())
        self.call(self.backend.pool.wait_ready())
        assert self.backend._runtime_dir is not None
        self.runtime_dir = self.backend._runtime_dir

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 110) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def run(
        self,
        script: str,
        *,
        manifest: Any = "[]",
        limits: Mapping[str, object] | None = None,
        policy: str = "none",
        expected_calls: tuple[ExpectedCalls, ...] = (),
        handlers: Mapping[str, ToolHandler] | None = None,
        approver: Approver | None = None,
        runtime: str | None = None,
    ) -> ExecutionResult:
        """One execution; ``limits`` as on the command line (``{"wall_time": 2}``)."""
        request = ExecutionRequest(
            script=script,
            manifest=manifest,
            limits=parse_limit_args(f"{k}={v}" for k, v in (limits or {}).items()),
            policy=policy,  # type: ignore[arg-type]
            expected_calls=expected_calls,
            runtime=runtime,
        )
        return self.call(
            self.engine.execute(request, hooks=RunHooks(handlers=handlers or {}, approver=approver))
        )

    def zygote_pid(self) -> int:
        """The host pid of the backend's fork server (bwrap's child)."""
        zygote = self.backend.zygote
        assert zygote is not None
        pids = zygote.pids()
        assert len(pids) == 2, pids  # bwrap and the zygote
        return pids[1]

    def assert_healthy(self) -> None:
        """The engine still runs a plain script after whatever the test did."""
        result = self.run("print('still ok')")
        assert (result.status, result.exit_code, result.stdout) == ("ok", 0, "still ok\n"), (
            result.to_json()
        )

    # -- what must not survive an execution ---------------------------------------------------
    def _idle(self) -> list[Any]:
        # The runtimes' pools (`sandbox.backends.process.runtimes`) hold idle sandboxes too.
        envs = self.backend.runtimes.envs.values() if self.backend.runtimes is not None else ()
        return [*self.backend.pool._idle, *(h for env in envs for h in env.pool._idle)]

    def settle(self) -> None:
        """Waits until cgroups of finished sandboxes are gone, the pool is full again and no
        sandbox is starting."""

        async def _wait() -> None:
            # Finished sandboxes' cgroups are removed in the background: wait for that first.
            await self.backend.drain()
            pool = self.backend.pool
            for _ in range(1000):
                # Not only full: a refill deferred after an acquire would start a sandbox (a
                # forked process, a cgroup not yet holding it) in the middle of the check.
                if pool.settled:
                    break
                await asyncio.sleep(0.01)
            envs = self.backend.runtimes.envs.values() if self.backend.runtimes else ()
            for env in envs:
                await asyncio.to_thread(env.zygote.wait_retired)
                for _ in range(1000):
                    if env.pool.settled:
                        break
                    await asyncio.sleep(0.01)
            await self.backend.drain()  # the cgroups of surplus sandboxes just disposed of
            # Replaced zygotes exit once their last sandbox has (the pool disposed of their
            # idle ones above).
            if self.backend.zygote is not None:
                await asyncio.to_thread(self.backend.zygote.wait_retired)

        self.call(_wait())

    def leftovers(self, allow: set[int] | frozenset[int] = frozenset()) -> list[str]:
        """Processes, cgroups, mounts and temporary entries not owned by an idle pooled sandbox
        (or, for processes, listed in ``allow``: helpers the test itself runs)."""
        self.settle()
        idle = self._idle()
        problems: list[str] = []
        # Processes: every descendant of this test process must belong to an idle sandbox.
        allowed: set[int] = set(allow)
        # The fork server (bwrap and the zygote) lives as long as the backend.
        zygote = self.backend.zygote
        allowed.update(zygote.pids() if zygote is not None else [])
        if self.backend.runtimes is not None:  # one fork server per runtime in use
            allowed.update(self.backend.runtimes.zygote_pids())
        # A replaced zygote lives on while it has sandboxes (its children must be idle ones).
        zygotes = [zygote] if zygote is not None else []
        if self.backend.runtimes is not None:
            zygotes += [env.zygote for env in self.backend.runtimes.envs.values()]
        for pid in [pid for z in zygotes for pid in z.retired_pids()]:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).children(recursive=True):
                    allowed.add(pid)
        for handle in idle:
            allowed.add(handle.pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                allowed.update(c.pid for c in psutil.Process(handle.pid).children(True))
        for child in psutil.Process().children(recursive=True):
            if child.pid not in allowed:
                try:
                    problems.append(f"process {child.pid}: {' '.join(child.cmdline())[:120]}")
                except psutil.NoSuchProcess:
                    continue
        # Cgroups: our parent holds exactly the idle sandboxes' cgroups.
        cgroups = self.backend.cgroups
        if cgroups is not None:
            expected = {
                path for handle in idle if handle.cgroup is not None for path in handle.cgroup.paths
            }
            for parent in cgroups.parent_paths:
                for cgroup in parent.iterdir():
                    if cgroup.is_dir() and cgroup not in expected:
                        procs = (cgroup / "cgroup.procs").read_text().split()
                        problems.append(f"cgroup {cgroup} (processes {procs})")
        # Host processes run as the sandbox uid (or a uid of the per-sandbox range): only inside
        # idle sandboxes.
        uid = self.backend.config.uid
        uids = self.backend.uids
        for proc in psutil.process_iter(["uids", "pid"]):
            real = proc.info["uids"].real if proc.info["uids"] is not None else None
            if real == uid or (uids is not None and real in uids.range):
                if proc.pid in allowed:
                    continue
                cg = Path(f"/proc/{proc.pid}/cgroup")
                try:
                    mine = f"/ptc-{os.getpid()}-" in cg.read_text()
                except OSError:
                    continue
                if mine:
                    problems.append(f"sandbox-uid process {proc.pid} outside the pool")
        # Container engines (other engineers' Docker tests) mount under /var/lib and /run.
        new_mounts = {
            m
            for m in _mounts() - self.baseline_mounts
            if not m.split()[1].startswith(("/var/lib/", "/run/"))
        }
        problems += [f"mount {m}" for m in sorted(new_mounts)]
        # Temporary entries: only this process's own. Its backend's runtime dir holds the guest
        # files and nothing else; any other entry named after this process (another backend's
        # runtime dir that was not removed) is a leftover. Entries of other processes on this
        # machine come and go and are not looked at. The CLI's are checked through a private
        # TMPDIR, the runtime dir itself when the harness closes.
        stray = _own_tmp_entries(os.getpid()) - self.baseline_tmp - {self.runtime_dir}
        problems += [f"temporary entry {p}" for p in sorted(stray)]
        if self.runtime_dir.exists():
            extra = {p.name for p in self.runtime_dir.iterdir()} - RUNTIME_FILES
            problems += [f"runtime dir entry {self.runtime_dir / n}" for n in sorted(extra)]
        return problems

    def close(self) -> None:
        self.call(self.engine.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def harness() -> Iterator[EngineHarness]:
    h = EngineHarness()
    yield h
    parents = h.backend.cgroups.parent_paths if h.backend.cgroups else []
    h.close()
    assert not h.runtime_dir.exists(), "the runtime dir survived Engine.close()"
    assert not [p for p in parents if p.exists()], "the cgroup parent survived Engine.close()"
    assert not psutil.Process().children(recursive=True), "sandbox processes survived close()"


@pytest.fixture
def engine_harness() -> type[EngineHarness]:
    """The harness class, for tests that need a backend configured their own way (a test module
    may also import it: ``from tests.conftest import EngineHarness``)."""
    return EngineHarness


@pytest.fixture
def clean(harness: EngineHarness) -> Iterator[EngineHarness]:
    """The shared harness, checked for leftovers after the test."""
    yield harness
    assert harness.leftovers() == []


@pytest.fixture(scope="session")
def ptc() -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_ptc`, for tests that drive the command line."""
    return run_ptc
