"""Output written before a kill reaches a client of a real `ptc serve`, on every backend,
through the SDK: unary `Execute` returns the lines in its result, and `ExecuteStream` sends them
as output events while the script still runs, before the result.

Each kill path is `tests/output_kills.py`'s: three lines on stdout and three on stderr, no
flush, then a limit tripped. In the streamed runs the script calls a client tool between its
lines and the trip; the tool (run here, in the test) takes what output events had arrived by
then, which is the proof that the lines left the sandbox as they were written, not at its end.
Progress events count them too (`Progress.stdout_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.client import Client
from sandbox.client.aio import OutputChunk, Progress
from sandbox.limits import Limits, parse_limit_args
from sandbox.result import ExecutionResult
from sandbox.tenants import hash_key
from tests.output_kills import KILLS, SESSION_KILLS, STDERR_LINES, STDOUT_LINES, Kill
from tests.ptc_serve import ptc_serve

KEY = "ptc-test-key-output-before-kill-0123"
BACKENDS = [
    pytest.param("process", id="process"),
    pytest.param("docker", id="docker", marks=pytest.mark.requires_docker),
    pytest.param(
        "gvisor", id="gvisor", marks=[pytest.mark.requires_docker, pytest.mark.requires_gvisor]
    ),
]
CHECKPOINT = "import tools\ntools.checkpoint()\n"


class Served:
    def __init__(self, address: str, backend: str) -> None:
        self.address = address
        self.backend = backend


@pytest.fixture(scope="module", params=BACKENDS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """`ptc serve` offering one backend to its one tenant."""
    backend: str = request.param
    tenants = tmp_path_factory.mktemp("tenants") / "tenants.toml"
    tenants.write_text(
        f'[[tenant]]\nid = "acme"\nkeys = ["{hash_key(KEY)}"]\nbackends = ["{backend}"]\n'
    )
    flags = {"process": [], "docker": ["--docker"], "gvisor": ["--gvisor"]}[backend]
    args = ["--pool-size", "1", "--audit-db", "memory", "--tenants", str(tenants), *flags]
    with ptc_serve(*args) as serving:
        yield Served(serving.address, backend)


@pytest.fixture
def client(served: Served) -> Iterator[Client]:
    with Client(served.address, KEY) as connected:
        yield connected


def _limits(kill: Kill) -> Limits:
    return parse_limit_args(f"{k}={v}" for k, v in kill.limits.items())


def _assert_killed_with_lines(result: ExecutionResult, kill: Kill) -> None:
    assert result.status == "limit_exceeded", result.to_json()
    assert [(v.limit, v.action) for v in result.violations] == [kill.violation]
    assert result.stdout == STDOUT_LINES
    assert result.stderr.startswith(STDERR_LINES), result.stderr


class Stream:
    """What an `ExecuteStream` client saw: output events, and those that had arrived when the
    script's `checkpoint` tool call reached it."""

    def __init__(self) -> None:
        self.chunks: list[OutputChunk] = []
        self.progress: list[Progress] = []
        self.at_checkpoint: dict[str, str] = {}

    def text(self, stream: str) -> str:
        return b"".join(c.data for c in self.chunks if c.stream == stream).decode()

    def checkpoint(self) -> str:
        """Says that the script has printed its lines."""
        self.at_checkpoint = {"stdout": self.text("stdout"), "stderr": self.text("stderr")}
        return "ok"

    def run(
        self, client: Client, kill: Kill, served: Served, session_id: str = ""
    ) -> ExecutionResult:
        return client.run(
            kill.script(CHECKPOINT),
            [self.checkpoint],
            limits=_limits(kill),
            backend=None if session_id else served.backend,
            session_id=session_id,
            on_output=self.chunks.append,
            on_progress=self.progress.append,
        )

    def assert_lines_came_first(self, kill: Kill) -> None:
        assert self.at_checkpoint == {"stdout": STDOUT_LINES, "stderr": STDERR_LINES}
        assert self.text("stdout") == STDOUT_LINES
        assert self.text("stderr").startswith(STDERR_LINES)
        if kill.violation[0] == "wall_time":  # runs past a second: progress counted the lines
            assert self.progress, "no progress event in a run of two seconds"
            assert self.progress[-1].stdout_bytes == len(STDOUT_LINES)
            # (a traceback may follow the lines on stderr once the cell is interrupted)
            assert self.progress[-1].stderr_bytes >= len(STDERR_LINES)


@pytest.mark.parametrize("kill", list(KILLS))
def test_execute_returns_the_lines_before_a_kill(client: Client, served: Served, kill: str) -> None:
    path = KILLS[kill]
    result = client.execute(path.script(), limits=_limits(path), backend=served.backend)
    _assert_killed_with_lines(result, path)


@pytest.mark.parametrize("kill", list(KILLS))
def test_execute_stream_sends_the_lines_as_they_are_written(
    client: Client, served: Served, kill: str
) -> None:
    path, stream = KILLS[kill], Stream()
    result = stream.run(client, path, served)
    _assert_killed_with_lines(result, path)
    stream.assert_lines_came_first(path)
    after = client.execute("print('still ok')", backend=served.backend)
    assert (after.status, after.stdout) == ("ok", "still ok\n")


@pytest.mark.parametrize("kill", list(SESSION_KILLS))
def test_session_cells_keep_the_lines_before_a_kill(
    client: Client, served: Served, kill: str
) -> None:
    path = SESSION_KILLS[kill]
    with client.session(limits=_limits(path), backend=served.backend) as unary:
        result = unary.execute(path.script(), limits=_limits(path))
        _assert_killed_with_lines(result, path)
        assert bool(result.session_lost) == path.ends_session, result.session_lost
    stream = Stream()
    with client.session(limits=_limits(path), backend=served.backend) as streamed:
        result = stream.run(client, path, served, session_id=streamed.id)
        _assert_killed_with_lines(result, path)
        stream.assert_lines_came_first(path)
        assert bool(result.session_lost) == path.ends_session, result.session_lost
