"""The isolation floor's one process: host and zygote together (standard library only).

Started by `bench.floor` as ``python -I -S -B bench/floor_zygote.py GUEST_DIR CONFIG_JSON``
(as root, like the process backend's host). It imports what our zygote imports (the guest
runtime: `sandbox/guest/bootstrap.py`, `_confine.py`), freezes its heap, and then runs blocks
of ``print(1)`` sandboxes on request, each doing exactly what our process backend does for one
sandbox and nothing else, every step switchable:

- ``cgroup``: a fresh cgroup in every v1 hierarchy with our limits (memory and memsw, pids, CFS
  period and quota), the child moved in before it goes on (it waits for a byte, as ours does),
  its usage read after its exit (the files our `V1Controls.usage` reads), then removed;
- ``pidns`` (the child is cloned as pid 1 of a new pid namespace, as our zygote's clone3 does),
  ``mntns``, ``netns``, ``ipcns``, ``utsns`` (and the hostname), ``cgroupns``;
- ``tmpfs`` (`/tmp` and `/dev/shm`), ``proc`` (pid 1's own `/proc`), ``lo`` (loopback up);
- ``rlimits`` (our job's: cpu, fsize, nofile, core), ``uid`` (to nobody), ``caps`` (ambient
  cleared, capset to none; the bounding set is emptied once, here, as our zygote does),
  ``seccomp`` (no_new_privs and our own BPF program, `sandbox.backends.process.seccomp`);
- ``bootstrap``: our guest bootstrap and its protocol (ready frame, job frame, end frame);
  off, the child runs the script directly and exits.

The host side is one thread and one poll loop: no event loop, no worker thread, no thread per
sandbox. Requests on stdin, one JSON object a line: ``{"total": N, "concurrency": C, "steps":
[...]}``; the reply on stdout, one JSON line: the rate and this process's CPU (host and zygote),
its children's (the sandboxes, by rusage and by their cgroups) and the children's minor faults.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import itertools
import json
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time

GUEST_DIR, CONFIG = sys.argv[1], json.loads(sys.argv[2])
sys.argv = sys.argv[:1]  # bootstrap reads its channel from fd 3 when given no argument
sys.path.insert(0, GUEST_DIR)

import _confine  # type: ignore[import-not-found]  # noqa: E402
import bootstrap  # type: ignore[import-not-found]  # noqa: E402

HEADER = struct.Struct(">I")
CHANNEL_FD = 3
EXIT_SETUP_FAILED = 70
NOBODY = 65534
CLONE_NS = {
    "mntns": _confine.CLONE_NEWNS,
    "netns": _confine.CLONE_NEWNET,
    "ipcns": _confine.CLONE_NEWIPC,
    "utsns": _confine.CLONE_NEWUTS,
    "cgroupns": _confine.CLONE_NEWCGROUP,
}
RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "fsize_bytes": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core_bytes": resource.RLIMIT_CORE,
}


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


class Cgroup:
    """One sandbox's cgroup in every v1 hierarchy: raw writes of what our manager writes."""

    def __init__(self, name: str) -> None:
        self.dirs = {c: os.path.join(base, name) for c, base in CONFIG["cgroups"].items()}
        self.unique = sorted(set(self.dirs.values()))
        for d in self.unique:
            os.mkdir(d)
        memory = self.dirs["memory"]
        limit = str(CONFIG["memory_bytes"])
        _write(f"{memory}/memory.limit_in_bytes", limit)
        if os.path.exists(f"{memory}/memory.memsw.limit_in_bytes"):
            _write(f"{memory}/memory.memsw.limit_in_bytes", limit)
        else:
            _write(f"{memory}/memory.swappiness", "0")
        _write(f"{self.dirs['pids']}/pids.max", str(CONFIG["processes"]))
        _write(f"{self.dirs['cpu']}/cpu.cfs_period_us", "100000")
        _write(f"{self.dirs['cpu']}/cpu.cfs_quota_us", "100000")

    def add(self, pid: int) -> None:
        for d in self.unique:
            _write(f"{d}/cgroup.procs", str(pid))

    def usage_and_remove(self) -> int:
        memory = self.dirs["memory"]
        _read(f"{memory}/memory.max_usage_in_bytes")
        _read(f"{memory}/memory.oom_control")
        _read(f"{memory}/memory.failcnt")
        _read(f"{self.dirs['pids']}/pids.events")
        cpu_ns = int(_read(f"{self.dirs['cpuacct']}/cpuacct.usage"))
        for d in self.unique:
            deadline = time.monotonic() + 1.0
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy for a moment after its last task exited
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.001)
        return cpu_ns


def _child(steps: frozenset[str], fds: tuple[int, int, int], workdir: str, script: str) -> None:
    """The sandbox: the steps our zygote's child and pid 1 take, in the same order."""
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(high[1], 1)
        os.dup2(high[2], 2)
        os.dup2(high[0], CHANNEL_FD)
        os.closerange(CHANNEL_FD + 1, os.sysconf("SC_OPEN_MAX"))
        os.setsid()
        if os.read(CHANNEL_FD, 1) != b"g":
            os._exit(EXIT_SETUP_FAILED)
        flags = 0
        for step, flag in CLONE_NS.items():
            if step in steps:
                flags |= flag
        if flags:
            _confine._check(_confine._libc.unshare(flags), "unshare")
        if "mntns" in steps:
            _confine._mount("none", "/", None, _confine.MS_REC | _confine.MS_PRIVATE, None)
        if "utsns" in steps:
            socket.sethostname("sandbox")
        if "tmpfs" in steps:
            _confine.mount_tmpfs("/tmp", CONFIG["tmp_bytes"])
            _confine.mount_tmpfs("/dev/shm", CONFIG["tmp_bytes"])
            os.chdir("/tmp")
        else:
            os.chdir(workdir)
        if "lo" in steps:
            _confine.up_loopback()
        if "proc" in steps:
            _confine.mount_proc()
        if "uid" in steps:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
        if "caps" in steps:
            _confine.drop_capabilities()
        if "seccomp" in steps:
            SECCOMP.install()
        if "bootstrap" in steps:
            bootstrap.main()  # applies the job's rlimits; never returns
        if "rlimits" in steps:
            for name, value in CONFIG["rlimits"].items():
                soft = int(value)
                resource.setrlimit(RLIMITS[name], (soft, soft + 1 if name == "cpu_s" else soft))
    except BaseException as exc:
        os.write(2, f"floor: set-up failed: {exc!r}\n".encode())
        os._exit(EXIT_SETUP_FAILED)
    code = 0
    try:
        exec(compile(script, "<script>", "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:
        os.write(2, f"floor: the script raised {exc!r}\n".encode())
        code = 1
    sys.stdout.flush()
    os._exit(code)


class Sandbox:
    """The host's side of one sandbox: its descriptors, its frames, its exit."""

    def __init__(self, steps: frozenset[str], workdir: str, index: int, job: Job) -> None:
        self.steps = steps
        self.job = job
        self.host, guest = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.cgroup = Cgroup(f"{CONFIG['prefix']}-{index}") if "cgroup" in steps else None
        pid = CLONER.fork() if "pidns" in steps else os.fork()
        if pid == 0:
            _child(steps, (guest.fileno(), out_w, err_w), workdir, job.script)
        self.pid = pid
        guest.close()
        os.close(out_w)
        os.close(err_w)
        self.out, self.err = out_r, err_r
        self.pidfd = os.pidfd_open(pid)
        if self.cgroup is not None:
            self.cgroup.add(pid)
        self.host.send(b"g")
        self.host.setblocking(False)
        self.stdout = b""
        self.stderr = b""
        self.frames = bytearray()
        self.ended = "bootstrap" not in steps  # the end frame, when there is a protocol
        self.exited = False
        self.status = -1
        self.open = 4  # descriptors still registered
        self.cpu_ns = 0  # its cgroup's CPU time (cpuacct.usage), when it has one

    def fds(self) -> list[int]:
        return [self.host.fileno(), self.out, self.err, self.pidfd]

    def on_channel(self) -> bool:
        """Reads frames; False once the channel is closed."""
        try:
            chunk = self.host.recv(65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.frames += chunk
        while len(self.frames) >= HEADER.size:
            (length,) = HEADER.unpack_from(self.frames)
            if len(self.frames) < HEADER.size + length:
                break
            frame = json.loads(bytes(self.frames[HEADER.size : HEADER.size + length]))
            del self.frames[: HEADER.size + length]
            if frame["t"] == "ready":
                self.host.sendall(self.job.frame)
            elif frame["t"] == "end":
                if frame["status"] != "ok":
                    raise RuntimeError(f"sandbox {self.pid} reported {frame}")
                self.ended = True
        return True

    def on_exit(self) -> None:
        _pid, status = os.waitpid(self.pid, 0)
        self.status = os.waitstatus_to_exitcode(status)
        self.exited = True

    def close(self) -> None:
        for fd in (self.out, self.err, self.pidfd):
            os.close(fd)
        self.host.close()
        if self.cgroup is not None:
            self.cpu_ns = self.cgroup.usage_and_remove()
        if self.status != 0 or self.stdout != self.job.expect or not self.ended:
            raise RuntimeError(
                f"sandbox {self.pid} ({sorted(self.steps)}): status {self.status}, stdout "
                f"{self.stdout!r}, ended {self.ended}, stderr {self.stderr[-500:]!r}"
            )


class Job:
    """What every sandbox of a block runs, its job frame, and the stdout it must print."""

    def __init__(self, script: str, expect: str, rlimits: bool) -> None:
        self.script = script
        self.expect = expect.encode()
        frame = {
            "t": "job",
            "script": script,
            "stubs": CONFIG["stubs"],
            "rlimits": CONFIG["rlimits"] if rlimits else {},
            "max_call_bytes": CONFIG["max_call_bytes"],
            "files": [],
            "outputs": CONFIG["outputs"],
        }
        body = json.dumps(frame).encode()
        self.frame = HEADER.pack(len(body)) + body


def _kill(box: Sandbox) -> None:
    """A sandbox left behind by a failed block: killed, reaped, its cgroup removed."""
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(box.pidfd, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(box.pid, 0)
    box.status = 0
    with contextlib.suppress(Exception):
        box.close()


def run_block(
    total: int, concurrency: int, steps: frozenset[str], workdir: str, job: Job
) -> dict[str, float]:
    poller = select.poll()
    owner: dict[int, tuple[Sandbox, str]] = {}
    live: set[Sandbox] = set()
    try:
        return _run(total, concurrency, steps, workdir, job, poller, owner, live)
    finally:
        for box in live:
            _kill(box)


def _run(
    total: int,
    concurrency: int,
    steps: frozenset[str],
    workdir: str,
    job: Job,
    poller: select.poll,
    owner: dict[int, tuple[Sandbox, str]],
    live: set[Sandbox],
) -> dict[str, float]:
    started = done = cgroup_ns = 0
    me0, kids0 = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    t0 = time.perf_counter()
    while done < total:
        while started < total and len(live) < concurrency:
            box = Sandbox(steps, workdir, next(NAMES), job)
            started += 1
            live.add(box)
            for fd, kind in zip(box.fds(), ("chan", "out", "err", "exit"), strict=True):
                owner[fd] = (box, kind)
                poller.register(fd, select.POLLIN)
        for fd, _event in poller.poll():
            box, kind = owner[fd]
            keep = True
            if kind == "chan":
                keep = box.on_channel()
            elif kind in ("out", "err"):
                chunk = os.read(fd, 65536)
                if kind == "out":
                    box.stdout += chunk
                else:
                    box.stderr += chunk
                keep = bool(chunk)
            else:
                box.on_exit()
                keep = False
            if not keep:
                poller.unregister(fd)
                del owner[fd]
                box.open -= 1
            if box.open == 0:
                live.discard(box)
                box.close()
                cgroup_ns += box.cpu_ns
                done += 1
    elapsed = time.perf_counter() - t0
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return {
        "rate": total / elapsed,
        "host_zygote_s": (me.ru_utime + me.ru_stime) - (me0.ru_utime + me0.ru_stime),
        "sandboxes_s": (kids.ru_utime + kids.ru_stime) - (kids0.ru_utime + kids0.ru_stime),
        "sandbox_minflt": kids.ru_minflt - kids0.ru_minflt,
        "sandboxes_cgroup_s": cgroup_ns / 1e9,
    }


with open(CONFIG["seccomp_file"], "rb") as _program:
    SECCOMP = _confine.SeccompFilter(_program.read())
CLONER = _confine.CloneIntoPidNamespace()
NAMES = itertools.count()
STEPS = frozenset(CONFIG["steps"])


def main() -> None:
    CLONER.probe()
    if not CLONER.available:
        raise SystemExit(f"floor: no clone into a pid namespace: {CLONER.why_not}")
    _confine.empty_bounding_set(_confine.last_capability())
    workdir = tempfile.mkdtemp(prefix="ptc-floor-")
    os.chmod(workdir, 0o1777)
    gc.collect()
    gc.freeze()  # as our zygote: children leave the frozen heap alone
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        steps = frozenset(request["steps"])
        reply: dict[str, object]
        if unknown := sorted(steps - STEPS):
            reply = {"error": f"unknown steps {unknown}: the steps are {sorted(STEPS)}"}
        else:
            script, expect = request.get("script", "print(1)"), request.get("expect", "1\n")
            job = Job(script, expect, "rlimits" in steps)
            try:
                reply = {**run_block(request["total"], request["concurrency"], steps, workdir, job)}
            except Exception as exc:  # the block failed: say why, stay ready for the next
                reply = {"error": str(exc)}
        print(json.dumps(reply), flush=True)
    shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
