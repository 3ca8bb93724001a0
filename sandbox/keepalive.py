"""HTTP/2 keepalive: how a client learns that its server stopped answering, and how the server
accepts (and sends) the pings that tell.

A server that freezes (SIGSTOP, a hung host, a network path that silently drops packets) sends
no RST and no FIN: without pings, a call on its connection waits for its deadline, and a call
without one waits forever. With `Keepalive` on (the SDK's default) the client sends an HTTP/2
PING after ``interval_s`` without data on a connection with calls in flight; a PING not answered
within ``timeout_s`` closes the connection, and every call on it ends with `Unavailable` saying
so (`Keepalive.message`). A server answers a PING from its HTTP/2 layer, so a healthy server
busy running a long script still answers.

The server accepts pings as often as every `SERVER_MIN_PING_INTERVAL_MS` (half the client's
floor, `MIN_INTERVAL_S`), also between calls (a ping can race a call's end): a gRPC server
answers pings that come more often than it allows with GOAWAY ``too_many_pings``, which would
end the very calls the pings protect. It also pings its clients (`server_options`), so that the
stream of a client that vanished is cancelled (its execution killed, its quota released)
instead of running on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "FAILURE",
    "MIN_INTERVAL_S",
    "SERVER_MIN_PING_INTERVAL_MS",
    "Keepalive",
    "is_keepalive_failure",
    "server_options",
]

FAILURE = "the server stopped answering keepalive pings"  # how `Keepalive.message` starts
# gRPC core's details of a call it ended because a ping went unanswered, by version.
_GRPC_PING_FAILURES = frozenset(
    {"stream removed (ping timeout)", "ping timeout", "keepalive watchdog timeout"}
)
MIN_INTERVAL_S = 1.0  # the shortest interval a client may ask for: twice what the server allows
SERVER_MIN_PING_INTERVAL_MS = 500


@dataclass(frozen=True)
class Keepalive:
    """A client's keepalive pings: a PING after ``interval_s`` seconds without data on a
    connection with calls in flight, the connection given up when it is not answered within
    ``timeout_s``. ``interval_s=None`` (`Keepalive.OFF`) never pings: a frozen server then
    holds a call until its own ``timeout``, or forever without one."""

    OFF: ClassVar[Keepalive]  # no pings

    interval_s: float | None = 20.0
    timeout_s: float = 15.0

    def __post_init__(self) -> None:
        if self.interval_s is not None and not (
            math.isfinite(self.interval_s) and self.interval_s >= MIN_INTERVAL_S
        ):
            raise ValueError(
                f"keepalive interval_s: at least {MIN_INTERVAL_S:g} s (the server refuses pings "
                f"more often than every {SERVER_MIN_PING_INTERVAL_MS} ms), or None for no pings; "
                f"got {self.interval_s!r}"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"keepalive timeout_s: a positive number, got {self.timeout_s!r}")

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def channel_options(self) -> list[tuple[str, int]]:
        """The grpc channel arguments of this policy ([] when off: gRPC's own defaults)."""
        if self.interval_s is None:
            return []
        timeout_ms = _ms(self.timeout_s)
        return [
            ("grpc.keepalive_time_ms", _ms(self.interval_s)),
            ("grpc.keepalive_timeout_ms", timeout_ms),
            # gRPC also times every ping out on its own clock (a minute): ours is the bound.
            ("grpc.http2.ping_timeout_ms", timeout_ms),
            # Keep pinging however long the connection carries no data (a quiet script): by
            # default gRPC stops after two pings without data, and a freeze after that would
            # go unnoticed again.
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.keepalive_permit_without_calls", 0),
        ]

    def message(self, details: str) -> str:
        """What a call ended by an unanswered ping says: what happened, and in how long."""
        return (
            f"{FAILURE}: a ping sent after "
            f"{self.interval_s:g} s without data was not answered within {self.timeout_s:g} s "
            f"(the server is frozen, overloaded or unreachable; gRPC: {details})"
        )


Keepalive.OFF = Keepalive(interval_s=None)


def is_keepalive_failure(details: str | None) -> bool:
    """Whether an UNAVAILABLE status's details are gRPC's own for a ping this side sent and got
    no answer to ("Stream removed (ping timeout)"; "keepalive watchdog timeout" in other
    versions). Only the whole text counts: a status a server sent that quotes these words (a
    server whose own call to a peer failed so) is that server's answer, not our ping's."""
    return (details or "").strip().lower() in _GRPC_PING_FAILURES


def server_options(interval_s: float, timeout_s: float) -> list[tuple[str, int]]:
    """The grpc server arguments: accept pings as often as `SERVER_MIN_PING_INTERVAL_MS`, also
    between calls, and ping clients after ``interval_s`` without data, closing a connection
    whose client does not answer within ``timeout_s``."""
    timeout_ms = _ms(timeout_s)
    return [
        ("grpc.http2.min_recv_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.keepalive_time_ms", _ms(interval_s)),
        ("grpc.keepalive_timeout_ms", timeout_ms),
        ("grpc.http2.ping_timeout_ms", timeout_ms),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
