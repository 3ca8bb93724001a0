"""Telemetry tests: a real `SandboxServer` on an ephemeral loopback port, in this process
(`telemetry_support.InProcessServer`), one per test module."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

from tests.telemetry.telemetry_support import InProcessServer


@pytest.fixture(scope="module")
def server() -> Iterator[InProcessServer]:
    harness = InProcessServer()
    yield harness
    harness.close()
    assert [p.pid for p in psutil.Process().children(recursive=True)] == []
