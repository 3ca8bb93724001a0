"""The backend seam: take a job, return an outcome.

A backend owns where a script runs (a namespaced process, a container); everything else (the
broker, limits, output capture, result assembly) is shared. The service talks to backends only
through `Backend`; a backend hands out single-use `SandboxHandle`s from its warm `Pool` and
`sandbox.execution.drive` drives one handle through one job, identically for every backend. A
session (`sandbox.sessions`) keeps one handle for many jobs instead, driven cell by cell by the
same loop (`sandbox.execution.cell`); the handle interface is the same.

Where backends differ in what the host can see of a sandbox or enforce on it, they say so in a
`Capabilities` value (the backend's, and each handle's own, which can be less), never by the
presence of an attribute. Backends are built from configuration by `sandbox.backends.factory`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from sandbox.backends.capacity import Capacity
from sandbox.backends.channel import FrameChannel
from sandbox.capture import CappedOutput, OutputStream
from sandbox.files import InputFile, OmittedOutput, OutputFile
from sandbox.limits import ResolvedLimits
from sandbox.protocol import GuestEnd
from sandbox.result import Violation

__all__ = [
    "Backend",
    "Capabilities",
    "Job",
    "Outcome",
    "Pool",
    "ResourceUsage",
    "SandboxHandle",
    "TmpfsUsage",
]


@dataclass(frozen=True)
class Capabilities:
    """What the host can observe of a sandbox and enforce on it, beyond what every backend does
    (rlimits set by the guest, the host's deadline, capture and broker counts).

    The evidence rules read it to decide whose word a refusal or a death is: where a cgroup
    counts and caps something, its counters are the kernel's word; where none does, the guest's
    rlimits do (RLIMIT_NPROC, RLIMIT_AS) and a refusal is the guest's word. A backend's value is
    what its sandboxes have when the host provides it; a handle's is that sandbox's own (a
    Docker container whose cgroup the host cannot read has no `cgroup_cpu`).
    """

    # A cgroup accounts the sandbox's CPU time: usage is the kernel's figure, and the guest's
    # RLIMIT_CPU is a second off the limit so that the host's reading decides.
    cgroup_cpu: bool = False
    # A cgroup counts and caps the script's own processes and threads.
    cgroup_pids: bool = False
    # A cgroup counts and caps the sandbox's memory.
    cgroup_memory: bool = False
    # Without those cgroups, the host sums the sandbox's processes itself (CPU time and
    # resident memory from /proc, `sandbox.backends.process.host_meter`) and stops the sandbox
    # when a sum passes its limit: whole-sandbox limits, sampled.
    host_accounting: bool = False
    # The script's kernel delivers to it the signals it sends itself even where it is its pid
    # namespace's init (gVisor's does; Linux drops an init's default-action signals). Where it
    # does, a SIGXFSZ death is the kernel's word only when a full tmpfs corroborates it.
    own_signals_delivered: bool = False
    # The backend runs named runtimes (`sandbox.runtimes`): `Backend.check_runtime` can pass.
    runtimes: bool = False


@dataclass(frozen=True)
class Job:
    execution_id: str
    script: str
    stubs: str
    limits: ResolvedLimits
    max_call_bytes: int = 1 << 20
    files: tuple[InputFile, ...] = ()  # placed in the working directory before the script


@dataclass(frozen=True)
class TmpfsUsage:
    """One of the sandbox's private tmpfs mounts, as the host measured it (fstatvfs)."""

    mount: str  # the path inside the sandbox: /tmp, /dev/shm
    used_bytes: int
    size_bytes: int
    available_bytes: int

    @property
    def full(self) -> bool:
        """No block left: a write that needed one was refused with ENOSPC (or EFBIG at the
        same size, since the tmpfs is as large as the file size limit)."""
        return self.available_bytes == 0


@dataclass(frozen=True)
class ResourceUsage:
    """What the kernel accounted for the whole sandbox, and what the host measured of it.

    ``accounted`` is False where no cgroup could be read: the cgroup figures are then zeros,
    not measurements. ``tmpfs`` is empty where the host could not measure the sandbox's mounts.
    """

    cpu_time_s: float = 0.0
    peak_memory_bytes: int = 0
    oom_killed: bool = False
    pids_limit_hit: bool = False
    accounted: bool = False
    memory_limit_hits: int = 0  # charges that hit the memory limit (v1 failcnt, v2 events max)
    pids_limit_hits: int = 0  # process or thread creations refused (pids.events max)
    peak_pids: int | None = None  # cgroup v2 pids.peak, where the kernel has it
    # The host's own sums over the sandbox's processes (no cgroup: `Capabilities.host_accounting`):
    # cpu_time_s and peak_memory_bytes are then its figures, memory_bytes its latest sum.
    host_accounted: bool = False
    memory_bytes: int = 0
    # OOM kills the kernel counted in the cgroup enclosing the server (a pod, a container) while
    # the sandbox lived, where it has no memory cgroup of its own (`enclosing_oom`).
    enclosing_oom_kills: int = 0
    tmpfs: tuple[TmpfsUsage, ...] = ()


@dataclass
class Outcome:
    """How a sandbox ended, as the host observed it."""

    exit_code: int  # negative: killed by that signal
    end: GuestEnd | None  # the guest's own (advisory) report
    stdout: CappedOutput
    stderr: CappedOutput
    violations: list[Violation] = field(default_factory=list)
    wall_time_s: float = 0.0
    resources: ResourceUsage = field(default_factory=ResourceUsage)
    isolation: list[str] = field(default_factory=list)
    cancelled: bool = False
    protocol_error: str | None = None
    outputs: list[OutputFile] = field(default_factory=list)  # what the script left in outputs/
    omitted_outputs: list[OmittedOutput] = field(default_factory=list)


class SandboxHandle(Protocol):
    """One started, ready, single-use sandbox."""

    channel: FrameChannel  # past the guest's `ready`; the handle closes it when disposed of
    stdout: OutputStream
    stderr: OutputStream
    isolation: list[str]
    capabilities: Capabilities  # this sandbox's own

    @property
    def alive(self) -> bool:
        """False once the sandbox's main process has exited."""

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        """Sets whole-sandbox limits (cgroups) before the job is sent."""

    async def wait(self) -> int:
        """Waits for the sandbox to end; returns the exit code (negative for a signal)."""

    def exit_future(self) -> asyncio.Future[int]:
        """`wait` as one future, the same on every call, for done-callbacks: a single-use
        run watches its end through callbacks, not a task. Never cancel it."""

    async def kill(self) -> None:
        """Kills every process of the sandbox."""

    def usage(self) -> ResourceUsage: ...

    async def dispose(self) -> None:
        """Releases everything the sandbox held; idempotent."""


class Pool(Protocol):
    """A backend's warm pool as the service watches it (`sandbox.backends.pool.WarmPool`)."""

    @property
    def idle(self) -> int:
        """Sandboxes started and waiting."""

    @property
    def target(self) -> int:
        """How many it keeps warm now; 0: none (the pool is off)."""

    @property
    def failed_starts(self) -> int:
        """Starts that failed in a row (a success resets it): a pool that cannot start
        sandboxes."""

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Waits until the pool is full, for at most ``timeout`` seconds."""


class Backend(Protocol):
    name: str

    @property
    def capabilities(self) -> Capabilities:
        """What this backend's sandboxes can be observed and held to where the host provides
        it (a started process backend knows whether its host has cgroups)."""

    @property
    def pool(self) -> Pool | None:
        """The warm pool; None for a backend that keeps none. Raises `Unavailable` while the
        backend is not started (or, for Docker, has no engine)."""

    @property
    def capacity(self) -> Capacity | None:
        """The `max_sandboxes` rooms its sandboxes share, which the metrics report; None for a
        backend without such a cap."""

    async def start(self) -> None: ...

    async def acquire(self, limits: ResolvedLimits, runtime: str | None = None) -> SandboxHandle:
        """A fresh sandbox for these limits, in ``runtime`` when one is named (one that
        `check_runtime` let through): from the warm pool when one there fits, else started on
        demand."""

    def check_runtime(self, name: str) -> object:
        """Raises a clear error when runtime ``name`` cannot run here, before any sandbox is
        taken; only called where `capabilities.runtimes` says the backend runs runtimes."""

    def isolation(self) -> list[str]: ...

    async def close(self) -> None: ...
