"""Per-sandbox cgroups: limits and accounting for a sandbox *as a whole*, on cgroup v1 or v2.

This package owns every write to a cgroup filesystem. The process backend asks it for one fresh
cgroup per sandbox, nested under the server's own cgroup in a per-server parent directory
(``<prefix>-<server pid>-<n>``), puts the sandbox's first process into it, and later reads usage and
kills whatever is left. Limits set here bind all processes and threads of the sandbox together,
which per-process rlimits cannot do:

======================  ====================================  ===================================
limit / usage           cgroup v1                             cgroup v2
======================  ====================================  ===================================
memory (no swap)        memory.limit_in_bytes (+ memsw)       memory.max, memory.swap.max = 0
processes and threads   pids.max                              pids.max
CPU bandwidth           cpu.cfs_quota_us / cpu.cfs_period_us  cpu.max
CPU time used           cpuacct.usage                         cpu.stat usage_usec
peak memory             memory.max_usage_in_bytes             memory.peak
memory limit hit        memory.failcnt                        memory.events max
OOM kill happened       memory.oom_control oom_kill           memory.events oom_kill
fork refused            pids.events max                       pids.events max
peak processes          (none)                                pids.peak (Linux 6.1+)
kill everything         freezer.state + SIGKILL + thaw        cgroup.kill (else cgroup.freeze)
======================  ====================================  ===================================

What differs between the versions sits behind one interface (`CgroupControls`, in
`controls.py`), with one module per version (`v1.py`: a hierarchy per controller, possibly
co-mounted; `v2.py`: one unified tree with ``subtree_control``); `discovery.py` finds the
mounted hierarchies and our place in them, `sandbox_cgroup.py` is one sandbox's cgroup (moving
processes in, killing them race-free, removal) and `manager.py` creates them.

It is hand-written on purpose: no well-kept Python library manages both v1 and v2, and the
parts that matter for a sandbox (write order of memsw, race-free kill, stale cleanup) are short.

:meth:`CgroupManager.detect` fails closed: it returns ``None`` and records a reason (not root, a
read-only cgroupfs, a missing controller, v2 controllers that cannot be delegated) when it cannot
actually create a cgroup and write its limits, so the backend can report that instead of running
sandboxes without whole-sandbox limits.
"""

from sandbox.backends.process.cgroups.controls import CgroupLimits, CgroupUsage
from sandbox.backends.process.cgroups.files import CgroupError
from sandbox.backends.process.cgroups.manager import CgroupManager
from sandbox.backends.process.cgroups.sandbox_cgroup import SandboxCgroup

__all__ = [
    "CgroupError",
    "CgroupLimits",
    "CgroupManager",
    "CgroupUsage",
    "SandboxCgroup",
]
