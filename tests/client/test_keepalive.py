"""A frozen server must not hang its clients: against a real `ptc serve` frozen with SIGSTOP (it
keeps its socket open and answers nothing, as a hung host does), every kind of call of a client
with keepalive pings ends with `Unavailable` saying that the server stopped answering keepalive
pings, in bounded time: the blocking stream's iterator, the asyncio stream, the unary `Execute`
(through its retries) and a session's cell. After SIGCONT the server serves the next call.

The server accepts pings at the clients' rate: a client pinging as often as `Keepalive` allows,
on a stream that carries no data for seconds, is never sent GOAWAY ``too_many_pings`` (a gRPC
server's default allows one ping per five minutes without data). And the server pings its
clients: a client frozen mid-stream has its execution cancelled instead of left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from sandbox.client import AsyncClient, Client, Keepalive, RetryPolicy
from sandbox.errors import InvalidArgument, Unavailable
from sandbox.keepalive import FAILURE, MIN_INTERVAL_S, is_keepalive_failure
from sandbox.server import ServerConfig
from tests.client.test_stream_end import _bounded, _read
from tests.ptc_serve import PYTHON, ROOT, Serving, ptc_serve

# A client that notices a frozen server fast: a ping after 1 s without data, 1 s to answer.
FAST = Keepalive(interval_s=1.0, timeout_s=1.0)
# Noticed within ~2 s on an idle machine; generous for a loaded one, far below "forever".
BOUND_S = 30.0
# A unary call's retries meet a connection that never comes up (gRPC's connect timeout, 20 s).
RETRIED_BOUND_S = 60.0
CHATTY = "import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.1)"
QUIET = "import time\ntime.sleep(30)\nprint('woke')"


@pytest.fixture(scope="module")
def serving() -> Iterator[Serving]:
    with ptc_serve() as serving:
        yield serving


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[Callable[[], None]]:
    """A function that freezes ``pid`` (SIGSTOP); thawed (SIGCONT) on exit, however it ends."""
    try:
        yield lambda: os.kill(pid, signal.SIGSTOP)
    finally:
        os.kill(pid, signal.SIGCONT)


def _names_keepalive(error: object, timeout_s: float = FAST.timeout_s) -> None:
    assert isinstance(error, Unavailable), f"ended with {error!r}"
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert error.message.startswith(f"{FAILURE}: a ping sent after "), error.message
    assert f"not answered within {timeout_s:g} s" in error.message, error.message


def _serves_again(serving: Serving) -> None:
    """After SIGCONT, a new client's call is served."""
    with Client(serving.address) as client:
        result = client.execute("print('thawed')", timeout=BOUND_S)
    assert (result.status, result.stdout) == ("ok", "thawed\n")


def test_a_frozen_server_ends_the_blocking_iterator_naming_keepalive(serving: Serving) -> None:
    with frozen(serving.pid) as freeze, Client(serving.address, keepalive=FAST) as client:
        execution = client.stream(CHATTY)
        took, ended = _read(execution, freeze)  # frozen at the third chunk
        _names_keepalive(ended)
        assert took < BOUND_S
        with pytest.raises(Unavailable, match=FAILURE):  # `result` says the same
            execution.result(BOUND_S)
    _serves_again(serving)


def test_a_frozen_server_ends_the_async_stream_naming_keepalive(serving: Serving) -> None:
    async def scenario(freeze: Callable[[], None]) -> tuple[float, BaseException | None]:
        async with AsyncClient(serving.address, keepalive=FAST) as client:
            execution = await client.start(CHATTY)
            got, started = 0, 0.0
            try:
                async with asyncio.timeout(BOUND_S + 10):
                    async for _chunk in execution:
                        got += 1
                        if got == 3:
                            freeze()
                            started = time.monotonic()
            except Unavailable as error:
                return time.monotonic() - started, error
            return time.monotonic() - started, None

    with frozen(serving.pid) as freeze:
        took, ended = asyncio.run(scenario(freeze))
    _names_keepalive(ended)
    assert took < BOUND_S
    _serves_again(serving)


def test_a_frozen_server_ends_a_unary_execute_through_its_retries(serving: Serving) -> None:
    async def scenario(freeze: Callable[[], None]) -> BaseException | None:
        async with AsyncClient(serving.address, keepalive=FAST) as client:
            assert client.retry.attempts > 1  # the default policy: the failure is retried
            freezing = asyncio.get_running_loop().call_later(1.5, freeze)  # the script sleeps
            try:
                await client.execute(QUIET)
            except Unavailable as error:
                return error
            finally:
                freezing.cancel()
            return None

    with frozen(serving.pid) as freeze:
        started = time.monotonic()
        ended = asyncio.run(scenario(freeze))
        took = time.monotonic() - started
    # The first attempt's keepalive failure is what is raised, not what the retries met.
    _names_keepalive(ended)
    assert isinstance(ended, Unavailable)
    notes = "\n".join(getattr(ended, "__notes__", []))
    assert "idempotency_key" in notes, notes
    assert took < RETRIED_BOUND_S
    _serves_again(serving)


def test_a_frozen_server_ends_a_session_cell_naming_keepalive(serving: Serving) -> None:
    with frozen(serving.pid) as freeze, Client(serving.address, keepalive=FAST) as client:
        client.retry = RetryPolicy(attempts=1)
        session = client.session()
        session.create()
        session.execute("x = 41")
        timer = threading.Timer(1.5, freeze)  # while the cell sleeps
        timer.start()
        started = time.monotonic()
        ended = _bounded(lambda: session.execute("import time\ntime.sleep(30)"), BOUND_S + 10)
        timer.join()
        took = time.monotonic() - started
        _names_keepalive(ended)
        assert took < BOUND_S
    _serves_again(serving)


def test_keepalive_values_are_checked() -> None:
    with pytest.raises(ValueError, match="interval_s: at least 1 s"):
        Keepalive(interval_s=0.2)
    with pytest.raises(ValueError, match="timeout_s: a positive number"):
        Keepalive(timeout_s=0)
    assert Keepalive.OFF.channel_options() == []
    assert Keepalive().interval_s == 20.0 and Keepalive().timeout_s == 15.0
    with pytest.raises(InvalidArgument, match=r"keepalive_interval_s: at least 1 s, got 0\.5"):
        ServerConfig(keepalive_interval_s=0.5)
    with pytest.raises(InvalidArgument, match="keepalive_timeout_s: a positive number"):
        ServerConfig(keepalive_timeout_s=0)


@pytest.mark.parametrize(
    "details,ours",
    [
        ("Stream removed (ping timeout)", True),
        ("keepalive watchdog timeout", True),
        # A server's own answer quoting gRPC's words (its call to a peer failed so) is the
        # server's, not a ping of ours that went unanswered.
        ("session_id: the server holding the session cannot be reached: ping timeout", False),
        ("failed to connect to all addresses", False),
        (None, False),
    ],
)
def test_only_grpcs_own_words_are_a_keepalive_failure(details: str | None, ours: bool) -> None:
    assert is_keepalive_failure(details) is ours


def test_pings_at_the_clients_rate_are_never_refused_as_too_many() -> None:
    """The fastest pinging a client may ask for, on a unary call quiet for 6 s (a ping a second
    with no data: a default gRPC server sends GOAWAY too_many_pings at the third; a stream
    would not do, its progress events are data), and a client
    with the default settings making calls over a few seconds on its open connection."""
    fastest = Keepalive(interval_s=MIN_INTERVAL_S, timeout_s=5.0)
    env = {**os.environ, "GRPC_VERBOSITY": "info", "GRPC_TRACE": "http_keepalive"}
    with ptc_serve(env=env) as serving:
        with Client(serving.address, keepalive=fastest) as client:
            client.retry = RetryPolicy(attempts=1)  # a GOAWAY must fail the call, not be retried
            quiet = client.execute("import time\ntime.sleep(6)\nprint('done')", timeout=BOUND_S)
            assert (quiet.status, quiet.stdout) == ("ok", "done\n")
        with Client(serving.address) as client:
            for _ in range(3):
                assert client.execute("print(1)", timeout=BOUND_S).stdout == "1\n"
                time.sleep(1.0)
    assert "too_many_pings" not in serving.stderr
    assert "GOAWAY" not in serving.stderr.upper()


# A client that streams a quiet script, says its execution's id, and is then frozen by the test.
FROZEN_CLIENT = """
import sys
from sandbox.client import Client, Keepalive
client = Client(sys.argv[1], keepalive=Keepalive.OFF)
execution = client.stream("import time\\ntime.sleep(60)")
while not execution.execution_id:
    import time; time.sleep(0.05)
print(execution.execution_id, flush=True)
execution.result()
"""


def test_the_server_cancels_the_execution_of_a_client_that_stopped_answering() -> None:
    args = ("--keepalive-interval", "1", "--keepalive-timeout", "1")
    with ptc_serve(*args) as serving:
        child = subprocess.Popen(
            [PYTHON, "-c", FROZEN_CLIENT, serving.address],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            execution_id = child.stdout.readline().strip()
            assert execution_id, "the client said no execution id"
            with Client(serving.address) as client:
                assert client.get_execution(execution_id).status == "running"
                child.send_signal(signal.SIGSTOP)
                started = time.monotonic()
                status = "running"
                while status == "running" and time.monotonic() - started < BOUND_S:
                    time.sleep(0.2)
                    status = client.get_execution(execution_id).status
                took = time.monotonic() - started
                assert status == "cancelled", status
                assert took < BOUND_S
                assert client.execute("print('still serving')").stdout == "still serving\n"
        finally:
            child.send_signal(signal.SIGCONT)
            child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
