"""The fork server (zygote): the trusted parent of every process sandbox (standard library only).

Started once per backend inside bubblewrap (read-only runtime view, no network, capabilities
only inside its own user namespace), it imports the guest runtime once (`bootstrap`: asyncio,
ast, inspect, json, typing, traceback and the stub runtime), freezes the heap for the garbage
collector so that children do not copy it, and then only forks. It never receives a script, a
manifest or a tenant's data: a fork request carries the sizes of the child's private `/tmp` and
`/dev/shm` and four descriptors (the child's channel, stdout, stderr and exit-status pipe).

Each child, before anything untrusted runs:
1. sets its OOM score to the highest (the kernel kills sandbox processes before the server's
   when a cgroup they share runs out of memory), keeps only its four descriptors (channel at 3,
   as `bootstrap` expects) and starts a session;
2. waits for the host's word on its channel: the host has moved it into its cgroup, so
   everything it ever creates is born there (race-free, like bwrap's `--block-fd` before), and
   names the uid of the sandbox's slot where the host gives each sandbox one (`uid_range` on the
   host's side): ``g``, or ``u`` and the uid in 10 digits;
3. enters new mount, pid, network, ipc, uts and cgroup namespaces, mounts its own `/tmp` and
   `/dev/shm` and brings `lo` up;
4. forks the sandbox's pid 1, which mounts its own `/proc`, takes its slot's uid (when it has
   one), drops every capability, sets no_new_privs and the seccomp filter, and becomes the
   guest bootstrap. The uid is pid 1's, not the first child's: a reaper left outside the
   sandbox is no process of it and does not count against its RLIMIT_NPROC.
Then the first child, by the exit-status mode the host asks for:
- `pidfd` (kernels with PIDFD_INFO_EXIT, 6.15 and newer): it writes pid 1's host pid on the
  status pipe and exits. Pid 1 becomes the zygote's child (the zygote is a child subreaper and
  lets the kernel reap), the host watches it through a pidfd and reads its exit status from the
  kernel: one process per idle sandbox instead of two.
- `reaper`: it stays outside, without capabilities, as the sandbox's reaper: it writes pid 1's
  exit status on the status pipe and kills it if the host goes away.

The zygote kills its children when the host goes away (its control socket reaches EOF). Asked
to retire, it forks no more and exits when its last child has: until then it still reaps them.

Between forks the zygote runs its loop in C where the host gave it one (`_forkloop`, which
loads `forkloop.c` built: the Python loop wrote ~108 pages per fork, each copied while the child
shared it, and the C one writes 3 or 4); the C loop takes only well-formed fork requests and
hands everything else to the Python loop below, which serves all requests when there is no C
loop.

Control messages (SOCK_SEQPACKET, one message each, ASCII words separated by one space,
descriptors as SCM_RIGHTS): host -> zygote `fork TMP_BYTES pidfd|reaper` + 4 fds; zygote ->
host `forked PID 1|0` (a host pid, the sandbox's pid 1 when 1: the zygote is in the host's pid
namespace, so that its children outlive it) or `error MESSAGE`; host -> zygote `retire` (no
reply); at start zygote -> host `ready PID`. Not JSON: every page the zygote writes after a fork
is copied while its sandboxes share it, and parsing and writing JSON touched ~60 more pages per
fork than these splits do (the zygote's CPU per sandbox 1.25 -> 1.05 ms, `bench.forkserver`).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import gc
import os
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_ARGS = sys.argv[1:]  # CONTROL_FD PROGRAM_FD [RUNTIME_SITE PRELOAD]
sys.argv = sys.argv[:1]  # bootstrap reads its channel from fd 3 when given no argument

import _confine  # type: ignore[import-not-found]  # noqa: E402
import _forkloop  # type: ignore[import-not-found]  # noqa: E402
import bootstrap  # type: ignore[import-not-found]  # noqa: E402  # the guest runtime, once

CHANNEL_FD, STDOUT_FD, STDERR_FD, STATUS_FD = 3, 1, 2, 4
MAX_CONTROL_BYTES = 4096
EXIT_SETUP_FAILED = 70
RETIRED_POLL_MS = 50  # how often a retired zygote looks whether its last child has exited
KILL_CHILDREN_TIMEOUT_S = 5.0


def _log(message: str) -> None:
    os.write(2, f"ptc-zygote: {message}\n".encode())


def _receive(control: socket.socket) -> tuple[list[bytes], list[int]] | None:
    """A message's words and descriptors; None when the host has closed the socket."""
    fds = array.array("i")
    data, ancdata, _flags, _addr = control.recvmsg(
        MAX_CONTROL_BYTES, socket.CMSG_SPACE(8 * fds.itemsize)
    )
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return data.split(b" "), list(fds)


def _reply(control: socket.socket, message: bytes) -> None:
    control.send(message)


def _fork_request(words: list[bytes]) -> tuple[int, bool] | None:
    """``fork TMP_BYTES pidfd|reaper`` as (tmp_bytes, reaper); None when it is not one."""
    if len(words) != 3 or words[0] != b"fork" or words[2] not in (b"pidfd", b"reaper"):
        return None
    if not words[1].isdigit():
        return None
    return int(words[1]), words[2] == b"reaper"


def _place_fds(fds: list[int]) -> None:
    """Channel, stdout, stderr, status to 3, 1, 2, 4; everything else closed; stdin empty."""
    # Received descriptors may sit on 1-4 already: move them out of the way first.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in fds]
    channel, stdout, stderr, status = high
    null = os.open("/dev/null", os.O_RDONLY)
    for source, target in ((null, 0), (stdout, STDOUT_FD), (stderr, STDERR_FD)):
        os.dup2(source, target)
    os.dup2(channel, CHANNEL_FD)
    os.dup2(status, STATUS_FD)
    os.closerange(STATUS_FD + 1, os.sysconf("SC_OPEN_MAX"))


UID_DIGITS = 10


def _wait_for_cgroup() -> int | None:
    """The host's go-ahead: ``g`` (the zygote's uid for the sandbox) or ``u`` and the slot's
    uid in 10 digits. Anything else, or the channel's end, means the host gave up on it."""
    word = os.read(CHANNEL_FD, 1)
    if word == b"g":
        return None
    if word != b"u":
        os._exit(EXIT_SETUP_FAILED)
    digits = b""
    while len(digits) < UID_DIGITS:
        chunk = os.read(CHANNEL_FD, UID_DIGITS - len(digits))
        if not chunk:
            os._exit(EXIT_SETUP_FAILED)
        digits += chunk
    if not digits.isdigit():
        os._exit(EXIT_SETUP_FAILED)
    return int(digits)


def _sandbox_init(
    seccomp: _confine.SeccompFilter, reaper: bool, uid: int | None, new_session: bool = True
) -> None:
    """Pid 1 of the new pid namespace: the last trusted steps, then the guest bootstrap."""
    if reaper:  # dies with its reaper (whose own death the host causes); else the host's pidfd
        _confine.set_death_signal(signal.SIGKILL)
    if new_session:
        # A session and process group of its own: kill(0) or killpg from the script must not
        # reach the first child, which would otherwise share its group.
        os.setsid()
    _confine.mount_proc()
    os.close(STATUS_FD)
    if uid is not None:
        _confine.become_sandbox_user(uid)
    _confine.drop_capabilities()
    seccomp.install()
    sys.argv = ["/ptc/bootstrap.py", str(CHANNEL_FD)]  # as a bootstrap started directly sees it
    bootstrap.main()


def _reap(child: int) -> None:
    """The reaper outside the sandbox: pid 1's exit status to the host, or its death when the
    host is gone (the status pipe's reader closed)."""
    for fd in (0, 1, 2, CHANNEL_FD):
        os.close(fd)
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(STATUS_FD, select.POLLERR)
    while True:
        events = dict(poller.poll())
        if pidfd in events:
            break
        if STATUS_FD in events:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            break
    _pid, status = os.waitpid(child, 0)
    with contextlib.suppress(OSError):  # the host is gone: nobody to tell
        os.write(STATUS_FD, f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def _enter_sandbox(tmp_bytes: int, fds: list[int], pid_namespace: bool) -> int | None:
    """Steps 1-3 of every child: its descriptors and session, the cgroup handshake, its own
    namespaces (a pid namespace for its next child unless it was born in one), its tmpfs
    mounts and loopback. Returns the uid the host gave the sandbox, if any."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _confine.volunteer_for_oom_kill()
    _place_fds(fds)
    os.setsid()
    uid = _wait_for_cgroup()
    _confine.unshare_sandbox_namespaces(pid=pid_namespace)
    _confine.mount_tmpfs("/tmp", tmp_bytes)
    _confine.mount_tmpfs("/dev/shm", tmp_bytes)
    os.chdir("/tmp")  # the new tmpfs, not the directory it covers
    _confine.up_loopback()
    return uid


def _set_up_failed(exc: BaseException) -> None:
    """Trusted code failed: say why on the sandbox's stderr, and end."""
    try:
        os.write(STDERR_FD, f"ptc-zygote: sandbox set-up failed: {exc!r}\n".encode())
    finally:
        os._exit(EXIT_SETUP_FAILED)


def _child(tmp_bytes: int, reaper: bool, fds: list[int], seccomp: _confine.SeccompFilter) -> None:
    """A first child: forks the sandbox's pid 1 into a new pid namespace, then reports it and
    exits, or stays as its reaper."""
    try:
        uid = _enter_sandbox(tmp_bytes, fds, pid_namespace=True)
        pid = os.fork()
        if pid == 0:
            _sandbox_init(seccomp, reaper, uid)
            os._exit(0)  # bootstrap.main() never returns
        if not reaper:
            os.write(STATUS_FD, f"{pid}\n".encode())  # the host takes it from here
            os._exit(0)
        _confine.drop_capabilities()
        _reap(pid)
    except BaseException as exc:
        _set_up_failed(exc)


def _children() -> list[int]:
    """Our children: sandboxes' first children while they set up, and every pid 1 whose first
    child has exited (we are its subreaper)."""
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as listing:
        return [int(pid) for pid in listing.read().split()]


def _kill_children() -> None:
    """Until none is left: a first child killed now may just have forked its pid 1, which
    then comes to us as an orphan."""
    deadline = time.monotonic() + KILL_CHILDREN_TIMEOUT_S
    while (children := _children()) and time.monotonic() < deadline:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)


def _direct_child(tmp_bytes: int, fds: list[int], seccomp: _confine.SeccompFilter) -> None:
    """The sandbox's pid 1 itself, born in its own pid namespace (one fork, no first child)."""
    try:
        uid = _enter_sandbox(tmp_bytes, fds, pid_namespace=False)
        _sandbox_init(seccomp, reaper=False, uid=uid, new_session=False)
    except BaseException as exc:
        _set_up_failed(exc)
    os._exit(0)  # bootstrap.main() never returns


def _serve(
    control: socket.socket,
    seccomp: _confine.SeccompFilter,
    cloner: _confine.CloneIntoPidNamespace,
    native: _forkloop.NativeForkLoop | None,
) -> None:
    with contextlib.suppress(OSError):  # the control socket broke under a reply: host gone
        _serve_requests(control, seccomp, cloner, native)
    # The host is gone (or gave up waiting for a retired zygote): so are its sandboxes.
    _kill_children()


def _serve_requests(
    control: socket.socket,
    seccomp: _confine.SeccompFilter,
    cloner: _confine.CloneIntoPidNamespace,
    native: _forkloop.NativeForkLoop | None,
) -> None:
    """Returns when the host has closed the control socket, or a retired zygote has no child
    left; raises OSError when the socket breaks. Well-formed fork requests are served by the
    C loop (``native``) when there is one, everything else here."""
    retired = False
    poller = select.poll()
    poller.register(control, select.POLLIN)
    while True:
        if retired:
            if not _children():
                return
            if not poller.poll(RETIRED_POLL_MS):
                continue
        if native is not None and not retired:
            served = native.serve(control.fileno())
            if served.kind == "child":
                _become_child(control, served.tmp_bytes, served.reaper, served.direct, served.fds,
                              seccomp)  # fmt: skip
            if served.kind == "eof":
                return
            if served.kind == "error":
                _refuse(control, served.fds, f"error fork: {served.error}".encode())
                continue
            received: tuple[list[bytes], list[int]] | None = (
                served.message.split(b" "),
                served.fds,
            )
        else:
            received = _receive(control)
        if received is None:
            return
        words, fds = received
        if words == [b"retire"] and not fds:
            retired = True
            continue
        request = None if retired or len(fds) != 4 else _fork_request(words)
        if request is None:
            _refuse(control, fds, b"error bad fork request")
            continue
        tmp_bytes, reaper = request
        direct = cloner.available and not reaper
        try:
            pid = cloner.fork() if direct else os.fork()
        except OSError as exc:
            _refuse(control, fds, f"error fork: {exc}".encode())
            continue
        if pid == 0:
            _become_child(control, tmp_bytes, reaper, direct, fds, seccomp)
        for fd in fds:
            os.close(fd)
        # 1: the pid is the sandbox's pid 1 (0: its first child's, which reports pid 1).
        _reply(control, b"forked %d %d" % (pid, direct))


def _become_child(
    control: socket.socket,
    tmp_bytes: int,
    reaper: bool,
    direct: bool,
    fds: list[int],
    seccomp: _confine.SeccompFilter,
) -> None:
    """In a child just forked by either loop: it sets up the sandbox and never returns."""
    control.close()
    if direct:
        _direct_child(tmp_bytes, fds, seccomp)
    else:
        _child(tmp_bytes, reaper, fds, seccomp)


def _refuse(control: socket.socket, fds: list[int], answer: bytes) -> None:
    """A request not served: the descriptors it carried closed, the host told why."""
    for fd in fds:
        os.close(fd)
    _reply(control, answer)


def _native_loop(cloner: _confine.CloneIntoPidNamespace) -> _forkloop.NativeForkLoop | None:
    """The fork loop in C when the host gave one (`_forkloop`); the Python loop otherwise."""
    loaded = _forkloop.load(cloner.clone_flags, cloner.tid_address, cloner.available)
    if isinstance(loaded, str):
        _log(f"note: forking from Python (about 0.2 ms more CPU per sandbox): {loaded}")
        return None
    return loaded


def _load_runtime(args: list[str]) -> None:
    """A runtime's packages: its site directory on sys.path (the interpreter started with -I
    -S, so this is the only one), and its ``preload`` modules imported once, here, so that every
    child has them already. Numerical libraries run one thread: a sandbox has one CPU, and a
    thread pool started before fork would not survive into the children."""
    if not args:
        return
    site, preload = args[0], args[1]
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    sys.path.append(site)
    for module in filter(None, preload.split(",")):
        __import__(module)


def main() -> None:
    control_fd, program_fd = int(_ARGS[0]), int(_ARGS[1])
    control = socket.socket(fileno=control_fd)
    with os.fdopen(program_fd, "rb") as source:
        program = source.read()
    _confine.own_mount_namespace()
    _confine.forbid_user_namespaces()
    _confine.make_device_nodes_readonly()
    _confine.empty_bounding_set(_confine.last_capability())
    _load_runtime(_ARGS[2:])
    cloner = _confine.CloneIntoPidNamespace()
    cloner.probe()  # before SIGCHLD is ignored: it waits for its test child
    if not cloner.available:
        # Not a failure: the host logs a "note:" at INFO, not as a warning.
        _log(
            "note: forking twice per sandbox (slower to start one, the same isolation): "
            f"{cloner.why_not}"
        )
    # Children are reaped by the kernel at once, which also records a pid 1's exit status for
    # the host's pidfd (or its reaper has reported it). Orphaned pid 1s come to us.
    _confine.become_subreaper()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    seccomp = _confine.SeccompFilter(program)
    native = _native_loop(cloner)
    gc.collect()
    gc.freeze()  # children leave the frozen heap alone: no copy-on-write from the collector
    _reply(control, b"ready %d" % os.getpid())
    _serve(control, seccomp, cloner, native)


if __name__ == "__main__":
    main()
