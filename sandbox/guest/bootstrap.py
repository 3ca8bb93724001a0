"""Guest bootstrap: the trusted first code in every sandbox (standard library only).

Started ahead of demand by a backend's warm pool, it imports what scripts commonly need (the
expensive part of an interpreter start), says `ready`, and blocks until its one job arrives on
the channel (the socket whose fd is argv[1], or the one `--connect DIR` opens in a container).
Then, before any untrusted byte runs, it lowers its own rlimits, installs the stub runtime and
the stub module as `tools` (compiled when the script first imports it), and runs the script
with top-level `await` allowed (its stdout and stderr line-buffered, so that every complete
line is the host's before any kill can take it).
Finally it reports how the script ended and exits. A sandbox never runs a second job, except in
a session.

A session's sandbox (its first job says ``"session": true``) does not exit: it runs each job as
one cell of a REPL in one persistent `__main__` namespace, reports how the cell ended (with the
``repr`` of a final bare expression, capped), and waits for the next job. A job that carries
stubs replaces the `tools` module's contents in place. An `interrupt` frame from the host raises
KeyboardInterrupt in the running cell (SIGINT to the main thread); a cell that will not stop is
the host's to kill, with the whole session.

The report is advisory: once the script has run, everything this process says is untrusted, and
the host relies on exit status, cgroup accounting and its own clocks for anything that matters.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Imported before `ready` so that scripts do not pay for them (asyncio alone is ~40 ms cold).
import ast
import asyncio
import builtins
import contextlib
import errno
import importlib.machinery
import inspect
import json  # noqa: F401
import resource
import traceback
import types
import typing

import _files  # type: ignore[import-not-found]
import _ptc_runtime  # type: ignore[import-not-found]

if typing.TYPE_CHECKING:
    import importlib.abc
    import queue

    Jobs = queue.SimpleQueue[dict[str, object]]

CONNECT_TIMEOUT_S = 10.0
# After its `bye`, how long the guest waits for the host to close the channel before it exits
# anyway (`_hang_up`). The host closes it as soon as its loop reads the end of stream, and
# kills the sandbox when it disposes of it; the bound only keeps a host that never answers
# from holding the process.
HANG_UP_LINGER_S = 5.0


def _connect(path: str) -> int:
    """Connects to a unix socket the host listens on; returns the fd (bounded retry)."""
    import socket
    import time

    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock.detach()
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _channel_fd(argv: list[str]) -> int:
    """`bootstrap.py FD`: the channel is an inherited socket (the process backend).
    `bootstrap.py --connect DIR`: the host listens on DIR/stdout.sock, DIR/stderr.sock and
    DIR/chan.sock (a container's bind mount); stdout and stderr become the first two."""
    if len(argv) > 2 and argv[1] == "--connect":
        for fd, name in ((1, "stdout.sock"), (2, "stderr.sock")):
            stream = _connect(os.path.join(argv[2], name))
            os.dup2(stream, fd)
            os.close(stream)
        return _connect(os.path.join(argv[2], "chan.sock"))
    return int(argv[1]) if len(argv) > 1 else 3


CHANNEL_FD = _channel_fd(sys.argv)
SCRIPT_NAME = "<script>"
# The streams the interpreter opened, taken before any script could replace them.
_STDOUT, _STDERR = sys.stdout, sys.stderr

# rlimit name in the job -> resource constant
_RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "as_bytes": resource.RLIMIT_AS,
    "fsize_bytes": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "core_bytes": resource.RLIMIT_CORE,
}


def _apply_rlimits(limits: dict[str, int]) -> None:
    if "as_bytes" in limits:
        # Under an address-space limit a thread must cost what it uses, not the stack and
        # malloc arena it reserves (`_threads`); imported here only, where it is needed.
        import _threads  # type: ignore[import-not-found]

        _threads.make_room(int(limits["as_bytes"]), int(limits.get("nproc", 1024)))
        _threads.watch_thread_starts("nproc" in limits)
        _PROCESS_STARTS["as_bytes"] = int(limits["as_bytes"])
    for name, value in limits.items():
        which = _RLIMITS[name]
        soft = hard = int(value)
        if name == "cpu_s":
            hard = soft + 1  # SIGXCPU at soft, SIGKILL one second later
        resource.setrlimit(which, (soft, hard))
    if "nproc" in limits:
        _PROCESS_STARTS["nproc"] = int(limits["nproc"])
        sys.addaudithook(_note_process_start)


# Where no pids cgroup counts the script (gVisor, the degraded process backend) RLIMIT_NPROC
# refuses a fork with EAGAIN, which is also what non-blocking I/O raises. To tell them apart the
# report marks an EAGAIN as a refused process start only when it came out of the very call that
# announced one (CPython's audit events, raised just before the fork). This is the guest's word
# like every report: it keeps honest scripts' non-blocking I/O from reading as a refusal.
_PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn"})
_PROCESS_STARTS: dict[str, object] = {}


def _note_process_start(event: str, args: tuple[object, ...]) -> None:
    if event in _PROCESS_EVENTS or event == "subprocess.Popen":
        caller = sys._getframe(1)  # the Python frame that made the call
        _PROCESS_STARTS["frame"] = caller
        # subprocess.Popen announces itself a few instructions before its fork, in its own
        # (standard library) frame: the frame alone identifies it.
        _PROCESS_STARTS["lasti"] = caller.f_lasti if event in _PROCESS_EVENTS else None


def _process_start_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is EAGAIN from the latest announced process start, under the job's own
    RLIMIT_NPROC (a script that lowered it refused itself)."""
    if not isinstance(exc, OSError) or exc.errno != errno.EAGAIN:
        return False
    nproc = _PROCESS_STARTS.get("nproc")
    if nproc is None or resource.getrlimit(resource.RLIMIT_NPROC)[0] != nproc:
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    lasti = _PROCESS_STARTS.get("lasti")
    return tb.tb_frame is _PROCESS_STARTS.get("frame") and lasti in (None, tb.tb_lasti)


def _line_buffered_output() -> None:
    """Makes every complete line the script prints leave for the host as it is written.

    On a pipe or socket the interpreter buffers stdout by blocks: a script killed for a limit
    (SIGKILL, SIGXCPU, the OOM killer) would take what it printed last with it, and nothing
    would arrive while it runs. Line buffering costs one write per line (bench/output.py).
    Set right before each script or cell runs, on the interpreter's own streams, so no earlier
    step can undo it; a script may still change it for itself (bench/output.py's baseline does).
    """
    for stream in (_STDOUT, _STDERR):
        with contextlib.suppress(Exception):  # not a TextIOWrapper: nothing to set
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _script_line(tb: types.TracebackType | None) -> int:
    line = 0
    for frame, lineno in traceback.walk_tb(tb):
        if frame.f_code.co_filename == SCRIPT_NAME:
            line = lineno
    return line


def _print_traceback(exc: BaseException) -> None:
    """Prints the traceback without the bootstrap's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


def _error_report(exc: BaseException, line: int | None = None) -> dict[str, object]:
    report: dict[str, object] = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "line": line if line is not None else _script_line(exc.__traceback__),
    }
    if isinstance(exc, OSError) and exc.errno is not None:
        report["errno"] = errno.errorcode.get(exc.errno, str(exc.errno))
    if _process_start_refused(exc):
        report["refused_by"] = "RLIMIT_NPROC"
    elif isinstance(exc, RuntimeError) and str(exc) == "can't start new thread":
        refused_by = _thread_start_refused_by()
        if refused_by:
            report["refused_by"] = refused_by
    return report


def _thread_start_refused_by() -> str | None:
    """Which of the job's rlimits refused a thread start: under RLIMIT_AS, what `_threads` saw
    when it failed (RLIMIT_AS when one more stack no longer fit the address space), else
    RLIMIT_NPROC when the job set it; None where neither is the job's (a cgroup counts)."""
    if "as_bytes" in _PROCESS_STARTS:
        import _threads

        return _threads.refused_by() or None
    return "RLIMIT_NPROC" if "nproc" in _PROCESS_STARTS else None


class _LazyTools:
    """Finds and loads the stub module `tools` when the script first imports it. Compiling and
    running the stubs cost about 0.4 ms per execution even for an empty manifest (on the
    guest's path before the script's first line, `bench.forkserver`); a script that imports
    no tool (``print(1)``) now never pays it. The module is the same either way."""

    def __init__(self) -> None:
        self.source = ""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "tools":
            return None
        loader = typing.cast("importlib.abc.Loader", self)  # the protocol, without its import
        return importlib.machinery.ModuleSpec("tools", loader, origin="tools.py")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__file__ = "tools.py"
        code = compile(self.source, "tools.py", "exec", dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102


_TOOLS = _LazyTools()


def _install_tools(stubs: str) -> None:
    """Makes ``stubs`` the module `import tools` gives (compiled at that import)."""
    _TOOLS.source = stubs
    sys.modules.pop("tools", None)
    if _TOOLS not in sys.meta_path:
        sys.meta_path.insert(0, _TOOLS)


def _run_script(script: str) -> None:
    code = compile(
        script, SCRIPT_NAME, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
    )
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))  # noqa: S307
    else:
        exec(code, namespace)  # noqa: S102


def _ending(exc: BaseException) -> tuple[str, int, dict[str, object] | None]:
    """How a script or cell that raised ``exc`` ended: status, exit code and error report
    (the traceback, without the bootstrap's frames, goes to stderr)."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            exit_code = 0
        elif isinstance(code, int):
            exit_code = code & 0xFF
        else:
            print(code, file=sys.stderr)
            exit_code = 1
        if not exit_code:
            return "ok", 0, None
        return (
            "error",
            exit_code,
            {"type": "SystemExit", "message": f"exit code {exit_code}", "line": 0},
        )
    if isinstance(exc, SyntaxError):
        traceback.print_exception(type(exc), exc, None, file=sys.stderr)
        return "syntax_error", 1, _error_report(exc, exc.lineno or 0)
    _print_traceback(exc)
    return "error", 1, _error_report(exc)


def _report(
    channel: object,
    workdir: str,
    outputs_before: dict[str, object],
    job: dict[str, object],
    end: dict[str, object],
) -> bool:
    """Flushes the streams, sends the files written under outputs/, then the end report; False
    when the end report could not be sent. The script may have closed or replaced its streams
    or the channel: report what we can."""
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    with contextlib.suppress(BaseException):
        _files.send_outputs(channel, workdir, outputs_before, job["outputs"])
    try:
        channel.send(end)  # type: ignore[attr-defined]
    except BaseException:
        return False
    return True


VALUE_MAX_CHARS = 64 * 1024
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _install_tools_in_place(stubs: str) -> None:
    """Replaces the contents of the `tools` module a session's cells may have imported (one
    not imported yet is compiled from the new stubs when it is)."""
    module = sys.modules.get("tools")
    if not isinstance(module, types.ModuleType):
        _install_tools(stubs)
        return
    _TOOLS.source = stubs  # a later reload compiles these
    module.__dict__.clear()
    module.__dict__.update({"__name__": "tools", "__file__": "tools.py", "__builtins__": builtins})
    exec(compile(stubs, "tools.py", "exec", dont_inherit=True), module.__dict__)  # noqa: S102


def _run_code(code: types.CodeType, namespace: dict[str, object]) -> object:
    if code.co_flags & inspect.CO_COROUTINE:
        return asyncio.run(eval(code, namespace))  # noqa: S307
    return eval(code, namespace)  # noqa: S307


def _run_cell(source: str, namespace: dict[str, object]) -> str | None:
    """Runs one cell; returns the capped repr of its final bare expression, if any."""
    tree = compile(source, SCRIPT_NAME, "exec", _FLAGS | ast.PyCF_ONLY_AST, dont_inherit=True)
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    _run_code(compile(tree, SCRIPT_NAME, "exec", _FLAGS, dont_inherit=True), namespace)
    if last is None:
        return None
    value = _run_code(compile(last, SCRIPT_NAME, "eval", _FLAGS, dont_inherit=True), namespace)
    if value is None:
        return None
    namespace["_"] = value
    try:
        text = repr(value)
    except Exception as exc:  # the value's own __repr__ failed: say so, as a value
        text = f"<repr failed: {type(exc).__name__}: {exc}>"[:2000]
    if len(text) > VALUE_MAX_CHARS:
        text = text[:VALUE_MAX_CHARS] + f"...[{len(text) - VALUE_MAX_CHARS} chars dropped]"
    return text


def _serve_session(
    channel: object, job: dict[str, object], workdir: str, outputs_before: dict[str, object]
) -> None:
    """The REPL loop of a session's sandbox: one cell per job, until the channel closes.
    Each cell's input files are placed before it runs, and what it wrote or changed under
    `outputs/` (since it began) goes back before its end report."""
    import queue

    jobs: Jobs = queue.SimpleQueue()
    in_cell = _interruptible_cells(channel, jobs)
    namespace = _main_namespace()
    placing_failed: Exception | None = None
    while True:
        end, exit_code = _run_job(job, namespace, in_cell, placing_failed)
        if not _report(channel, workdir, outputs_before, job, end):
            os._exit(exit_code or 1)
        job = _next_job(jobs)
        if job.get("t") != "job":
            os._exit(0)
        try:
            _files.place_inputs(workdir, job.pop("files", []))
            outputs_before, placing_failed = _files.snapshot(workdir), None
        except Exception as exc:  # reported as this cell's failure; the session lives
            outputs_before, placing_failed = {}, exc


def _interruptible_cells(channel: object, jobs: Jobs) -> dict[str, bool]:
    """Starts the channel's session reader, which queues jobs on ``jobs`` and, on the host's
    interrupt, raises KeyboardInterrupt in the main thread while a cell runs (never between
    cells). Returns the flag the loop sets around each cell."""
    import signal
    import threading

    main_thread = threading.main_thread().ident
    in_cell = {"in_cell": False}

    def interrupt() -> None:
        if in_cell["in_cell"] and main_thread is not None:
            with contextlib.suppress(OSError):
                signal.pthread_kill(main_thread, signal.SIGINT)

    # Whatever the sandbox inherited (an ignored SIGINT survives exec), an interrupt raises
    # KeyboardInterrupt in the cell.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    channel.serve_session(jobs, interrupt)  # type: ignore[attr-defined]
    return in_cell


def _main_namespace() -> dict[str, object]:
    """A fresh ``__main__`` whose globals every cell of the session shares."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    return module.__dict__


def _run_job(
    job: dict[str, object],
    namespace: dict[str, object],
    in_cell: dict[str, bool],
    placing_failed: Exception | None,
) -> tuple[dict[str, object], int]:
    """Runs one cell (its stubs installed first) and returns its end report and exit code;
    a failure to place its input files is the cell's failure, reported without running it."""
    status, exit_code, error, value = "ok", 0, None, None
    try:
        if placing_failed is not None:
            raise placing_failed
        stubs = job.get("stubs")
        if isinstance(stubs, str) and stubs:
            _install_tools_in_place(stubs)
        _line_buffered_output()
        in_cell["in_cell"] = True
        value = _run_cell(str(job["script"]), namespace)
    except BaseException as exc:  # the cell's own failure (or an interrupt) is a result
        status, exit_code, error = _ending(exc)
    finally:
        in_cell["in_cell"] = False
    end: dict[str, object] = {"t": "end", "status": status, "exit_code": exit_code}
    end["error"] = error
    if value is not None:
        end["value"] = value
    return end, exit_code


def _next_job(jobs: Jobs) -> dict[str, object]:
    """The next job from the host; an interrupt that raced the cell's end is dropped."""
    while True:
        try:
            return jobs.get()
        except KeyboardInterrupt:
            continue


def _hang_up(channel: object) -> None:
    """Closes stdout and stderr, says ``bye`` and ends the channel, once the end report is sent:
    the host then has all of the execution before this process exits, which ends its wait (the
    kernel tears the process's memory down before it closes its descriptors and reports its
    exit, a millisecond or two the result would wait for; `bench.forkserver`'s warm latency).
    Output a thread of the script writes from here on is lost, as it would be a moment later;
    a copy of stdout a child of the script still holds keeps the host waiting for the exit."""
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    with contextlib.suppress(BaseException):
        channel.send({"t": "bye"})  # type: ignore[attr-defined]
    # Alive until the host has read the `bye` (and with it this process's CPU time, which
    # holds its reaped children's) and closed the channel; the result does not wait for it.
    channel.shut(linger_s=HANG_UP_LINGER_S)  # type: ignore[attr-defined]


def main() -> None:
    try:
        sys.stdin.close()
        os.close(0)
    except OSError:
        pass
    channel = _ptc_runtime.Channel(CHANNEL_FD, max_call_bytes=1 << 20)
    # What no job decides is done before `ready`, while the sandbox waits in the pool, not
    # between a job's arrival and its script's first line (each step's first run after the
    # fork also pays its copy-on-write faults: about 0.45 ms and 40 faults together, timed
    # inside the guest). Open /dev/null on fd 0 so that the script's reads see an empty stdin,
    # not a closed fd; `outputs/` starts empty.
    fd = os.open("/dev/null", os.O_RDONLY)
    if fd != 0:
        os.dup2(fd, 0)
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    workdir = os.getcwd()
    _files.place_inputs(workdir, [])
    channel.send({"t": "ready", "pid": os.getpid()})
    job = channel.recv()
    if job.get("t") != "job":
        os._exit(70)
    channel.max_call_bytes = int(job["max_call_bytes"])
    outputs_before: dict[str, object] = {}  # nothing has run since outputs/ was made empty
    if files := job.pop("files", []):  # popped: the script's memory is its own
        _files.place_inputs(workdir, files)
        outputs_before = _files.snapshot(workdir)  # an input may be placed under outputs/
    _apply_rlimits(job["rlimits"])
    _ptc_runtime.install(channel)
    _install_tools(job["stubs"])
    if job.get("session") is True:
        _serve_session(channel, {**job, "stubs": ""}, workdir, outputs_before)

    status, exit_code, error = "ok", 0, None
    _line_buffered_output()
    try:
        _run_script(job["script"])
    except BaseException as exc:  # the script's own failure is a result, never a crash
        status, exit_code, error = _ending(exc)
    end = {"t": "end", "status": status, "exit_code": exit_code, "error": error}
    if _report(channel, workdir, outputs_before, job, end):
        _hang_up(channel)
    os._exit(exit_code)


if __name__ == "__main__":
    main()
