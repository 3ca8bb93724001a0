"""The fork server's control messages (`sandbox.guest.zygote`: ASCII words, not JSON): a
request that is not a well-formed fork, or comes without its four descriptors, is answered
``error bad fork request``, the descriptors it did carry are closed, the zygote goes on
forking, and the host reports the refusal in words: with its fork loop in C and without."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from sandbox.errors import Unavailable

if TYPE_CHECKING:
    from tests.conftest import EngineHarness

pytestmark = pytest.mark.requires_bwrap

BAD = {
    "not-a-number": (b"fork 12ab pidfd", 4),
    "unknown-mode": (b"fork 1048576 forever", 4),
    "extra-word": (b"fork 1048576 pidfd now", 4),
    "no-descriptors": (b"fork 1048576 pidfd", 0),
    "two-descriptors": (b"fork 1048576 pidfd", 2),
    "json": (b'{"t": "fork", "tmp_bytes": 1048576, "exit_status": "pidfd"}', 4),
    "empty-word": (b"fork  pidfd", 4),
    # Past what the zygote reads: a message longer than its buffer, more descriptors than its
    # control space (the kernel drops the rest), each truncated and then refused.
    "oversized": (b"fork 1048576 pidfd" + b" " * 5000, 4),
    "nine-descriptors": (b"fork 1048576 pidfd", 9),
}


def _fds(pid: int) -> list[str]:
    return os.listdir(f"/proc/{pid}/fd")


@pytest.fixture(params=[True, False], ids=["c-loop", "python-loop"])
def own(
    engine_harness: type[EngineHarness], request: pytest.FixtureRequest
) -> Iterator[EngineHarness]:
    # The C loop hands every request it does not take to the Python loop, which refuses it.
    harness = engine_harness(pool_size=1, native_fork_loop=request.param)
    yield harness
    assert harness.leftovers() == []
    harness.close()


@pytest.mark.parametrize("case", BAD.keys())
def test_a_bad_request_is_refused_and_the_zygote_goes_on(own: EngineHarness, case: str) -> None:
    message, fd_count = BAD[case]
    supervisor = own.backend.zygote
    assert supervisor is not None
    pipes = [os.pipe() for _ in range(fd_count)]
    sent = [read_end for read_end, _ in pipes]
    inodes = {f"pipe:[{os.fstat(fd).st_ino}]" for fd in sent}
    try:
        with supervisor._lock:  # no fork of the pool's may interleave with ours
            zygote = supervisor._zygote
            assert zygote is not None
            reply = zygote.request(message, sent)
        assert reply == [b"error", b"bad", b"fork", b"request"]
        # It closed what it was sent before it answered.
        held = {os.readlink(f"/proc/{own.zygote_pid()}/fd/{fd}") for fd in _fds(own.zygote_pid())}
        assert not inodes & held, inodes & held
        with pytest.raises(Unavailable) as refused:
            supervisor._forked(zygote, reply)
        assert str(refused.value) == "the fork server refused a fork: bad fork request"
        assert supervisor.deaths == 0
    finally:
        for pair in pipes:
            for fd in pair:
                os.close(fd)
    own.assert_healthy()
