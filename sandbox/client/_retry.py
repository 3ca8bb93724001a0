"""When the SDK asks again, and how: one idempotency key per logical execution, bounded retries.

Every `AsyncClient.execute` and `AsyncClient.run` sends an idempotency key (a uuid4, made once
per call) and, when an attempt fails in a way that leaves the execution's outcome unknown, sends
the same request with the same key again. The server answers a key it has already admitted
with that execution's result instead of running it again (`sandbox.server.idempotency`), so a
retry is asking for the execution by its key, never a blind rerun.

Which failures leave the outcome unknown (`retryable`):

- UNAVAILABLE: no server answered, a server refused (stopping, a failing audit store), or a
  balancer gave up waiting (nginx turns its ``grpc_read_timeout`` into a 504, which gRPC clients
  see as UNAVAILABLE, while the server goes on running the script);
- INTERNAL and UNKNOWN: what a balancer makes of a stream or call it reset (nginx: a server
  killed under an open stream, a request body over ``client_max_body_size``).

Everything else (a refused request, a deadline the caller set) is final. Attempts are at most
`RetryPolicy.attempts`, spaced by an exponential backoff with full jitter, and all of them
together stay within the call's own ``timeout``. When they run out, the last error is raised
as it came, with a note (``__notes__``) naming the key and the number of attempts: the outcome is
then unknown, and a call with the same ``idempotency_key`` can ask again later.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

import grpc

from sandbox.errors import PtcError

__all__ = ["Deadline", "RetryPolicy", "new_key", "retryable", "unknown_outcome"]

_RETRY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
)


@dataclass(frozen=True)
class RetryPolicy:
    """How many attempts a call makes at most (1: never retry) and the backoff between them."""

    attempts: int = 5
    backoff_s: float = 0.25  # before the second attempt, doubled each time after
    max_backoff_s: float = 4.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts: at least 1, got {self.attempts}")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("backoff_s, max_backoff_s: must not be negative")

    def delay(self, attempt: int) -> float:
        """The pause after failed attempt number ``attempt`` (1-based): full jitter, so that
        clients a balancer failed together do not come back together."""
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))


def new_key() -> str:
    return str(uuid.uuid4())


def retryable(error: PtcError) -> bool:
    return error.code in _RETRY_CODES


class Deadline:
    """The call's ``timeout`` shared by every attempt."""

    def __init__(self, timeout: float | None) -> None:
        self._ends = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> float | None:
        return None if self._ends is None else max(0.0, self._ends - time.monotonic())

    def allows(self, pause: float) -> bool:
        left = self.remaining()
        return left is None or left > pause


def unknown_outcome(error: PtcError, key: str, attempts: int) -> None:
    """``error``, the call's last, with a note (`BaseException.add_note`: its message stays the
    server's) that its outcome is unknown and which key asks for it again."""
    error.add_note(
        f"idempotency_key {key!r}: no answer after {attempts} attempt"
        f"{'s' if attempts != 1 else ''}; the execution may or may not have run: ask again with "
        "this key, never with a new one, to learn its outcome"
    )
