"""The backend seam: take a job, return an outcome.

A backend owns where a script runs (a namespaced process, a container); everything else (the
broker, limits, output capture, result assembly) is shared. The service talks to backends only
through `Backend`; a backend hands out single-use `SandboxHandle`s from its warm pool and
`sandbox.backends.session.run_session` drives one handle through one job, identically for every
backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sandbox.backends.channel import FrameChannel
from sandbox.capture import CappedOutput, OutputStream
from sandbox.limits import ResolvedLimits
from sandbox.protocol import GuestEnd
from sandbox.result import Violation

__all__ = ["Backend", "Job", "Outcome", "ResourceUsage", "SandboxHandle"]


@dataclass(frozen=True)
class Job:
    execution_id: str
    script: str
    stubs: str
    limits: ResolvedLimits
    max_call_bytes: int = 1 << 20


@dataclass(frozen=True)
class ResourceUsage:
    """What the kernel accounted for the whole sandbox."""

    cpu_time_s: float = 0.0
    peak_memory_bytes: int = 0
    oom_killed: bool = False
    pids_limit_hit: bool = False


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


class SandboxHandle(Protocol):
    """One started, ready, single-use sandbox."""

    channel: FrameChannel  # past the guest's `ready`; the handle closes it when disposed of
    stdout: OutputStream
    stderr: OutputStream
    isolation: list[str]
    has_cgroup_cpu: bool
    has_cgroup_pids: bool

    @property
    def alive(self) -> bool:
        """False once the sandbox's main process has exited."""

    async def apply_limits(self, limits: ResolvedLimits) -> None:
        """Sets whole-sandbox limits (cgroups) before the job is sent."""

    async def wait(self) -> int:
        """Waits for the sandbox to end; returns the exit code (negative for a signal)."""

    async def kill(self) -> None:
        """Kills every process of the sandbox."""

    def usage(self) -> ResourceUsage: ...

    async def dispose(self) -> None:
        """Releases everything the sandbox held; idempotent."""


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def acquire(self, limits: ResolvedLimits) -> SandboxHandle:
        """A fresh sandbox for these limits: from the warm pool when one there fits, else
        started on demand."""

    def isolation(self) -> list[str]: ...

    async def close(self) -> None: ...
