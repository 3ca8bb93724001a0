"""The SDK's retries (`sandbox.client._retry`) without a balancer: bounded, keyed, and the last
error raised as the server (or the channel) gave it, with a note naming the key."""

from __future__ import annotations

import re
import socket

import pytest

from sandbox.client import Client, RetryPolicy
from sandbox.errors import Unavailable


def test_nobody_listening_is_asked_a_bounded_number_of_times() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Client(f"127.0.0.1:{port}") as client:
        client.retry = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02)
        with pytest.raises(Unavailable) as info:
            client.execute("print(1)", idempotency_key="k-nobody", timeout=30)
    assert info.value.__notes__ == [
        "idempotency_key 'k-nobody': no answer after 3 attempts; the execution may or may not "
        "have run: ask again with this key, never with a new one, to learn its outcome"
    ]
    assert re.search(r"failed to connect|Connection refused", info.value.message)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"attempts": 0}, "attempts: at least 1, got 0"),
        ({"backoff_s": -1.0}, "backoff_s, max_backoff_s: must not be negative"),
    ],
    ids=["no-attempt", "negative-backoff"],
)
def test_a_policy_that_cannot_work_is_refused(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RetryPolicy(**fields)  # type: ignore[arg-type]
