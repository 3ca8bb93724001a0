"""A blocking client's stream that ends abnormally ends its iterator with the error, in bounded
time, against a real `ptc serve`: killed with SIGKILL mid-stream, or the client closed under the
reader. Before, the iterator ended as if the output were complete (the error only in `result`),
and iterating a second time waited forever on an empty queue. Ctrl-C in a reader blocked in the
iterator's wait raises KeyboardInterrupt there (it did before too: the wait is a lock's)."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from sandbox.client import Client, SyncExecution
from sandbox.errors import Cancelled, Unavailable
from tests.ptc_serve import PYTHON, ROOT, ptc_serve, start_serve, stop_serve

# Prints for up to a minute: long past the kill, yet never forever should the kill not come.
CHATTY = "import time\nfor i in range(1200):\n    print(i, flush=True)\n    time.sleep(0.05)"
# The client side sees a dead peer's connection close at once on loopback (~20 ms measured).
END_BOUND_S = 10.0


def _bounded(action: Callable[[], object], timeout_s: float = END_BOUND_S) -> object:
    """What ``action`` returned or raised, run on a thread that must end within ``timeout_s``:
    a wait that never ends fails the test instead of hanging it."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still waiting after {timeout_s} s"
    return outcome[0]


def _read(execution: SyncExecution, on_third: Callable[[], None]) -> tuple[float, object]:
    """Iterates ``execution``, calling ``on_third`` at its third chunk; how long the iterator
    took to end after that, and how it ended (an exception, or the number of chunks)."""
    marks: list[float] = []

    def iterate() -> int:
        got = 0
        for _chunk in execution:
            got += 1
            if got == 3:
                marks.append(time.monotonic())
                on_third()
        return got

    outcome = _bounded(iterate, 60.0)
    assert marks, f"fewer than 3 chunks came: {outcome!r}"
    return time.monotonic() - marks[0], outcome


def test_server_killed_mid_stream_ends_the_iterator_with_its_error() -> None:
    proc, serving = start_serve()
    try:
        with Client(serving.address) as client:
            execution = client.stream(CHATTY)
            took, ended = _read(execution, lambda: proc.send_signal(signal.SIGKILL))
            assert isinstance(ended, Unavailable), f"the iterator ended with {ended!r}"
            assert ended.code == grpc.StatusCode.UNAVAILABLE
            assert took < END_BOUND_S
            # `result` says the same, and iterating again ends at once with it.
            with pytest.raises(Unavailable):
                execution.result(END_BOUND_S)
            again = _bounded(lambda: list(execution))
            assert isinstance(again, Unavailable), again
    finally:
        killed = proc.pid
        stop_serve(proc, read=False)
    # A server started after it sweeps what the killed one left on the host.
    with ptc_serve():
        pass
    assert not list(Path(tempfile.gettempdir()).glob(f"ptc-runtime-{killed}-*"))


def test_client_closed_mid_stream_ends_the_iterator_and_the_server_serves_on() -> None:
    with ptc_serve() as serving:
        client = Client(serving.address)
        execution = client.stream(CHATTY)
        took, ended = _read(execution, client.close)
        assert isinstance(ended, Cancelled), f"the iterator ended with {ended!r}"
        assert ended.message == "the client was closed while the stream ran"
        assert took < END_BOUND_S
        again = _bounded(lambda: list(execution))
        assert isinstance(again, Cancelled), again
        with Client(serving.address) as other:
            result = other.run("print('still serving')")
        assert (result.status, result.stdout) == ("ok", "still serving\n")


def test_a_complete_stream_can_be_iterated_again() -> None:
    with ptc_serve() as serving, Client(serving.address) as client:
        execution = client.stream("for i in range(3): print(i, flush=True)")
        chunks = _bounded(lambda: b"".join(c.data for c in execution))
        assert chunks == b"0\n1\n2\n"
        assert _bounded(lambda: list(execution)) == []  # the end, at once: no wait
        assert execution.result(END_BOUND_S).stdout == "0\n1\n2\n"


# A caller blocked in the iterator, as an interactive Python has it: SIGINT to Python's own
# handler (set here, since a test run started in the background inherits SIGINT ignored).
CTRL_C_READER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from sandbox.client import Client
client = Client(sys.argv[1])
execution = client.stream("import time\\nprint('go', flush=True)\\ntime.sleep(60)")
try:
    for chunk in execution:
        print(chunk.data.decode().strip(), flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    client.close()
    sys.exit(7)
"""


def test_ctrl_c_while_iterating_ends_the_wait() -> None:
    with ptc_serve() as serving:
        reader = subprocess.Popen(
            [PYTHON, "-c", CTRL_C_READER, serving.address],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline() == "go\n"  # now blocked in the iterator
            reader.send_signal(signal.SIGINT)
            out, err = reader.communicate(timeout=END_BOUND_S)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.communicate()
        assert (reader.returncode, out) == (7, "interrupted\n"), err
