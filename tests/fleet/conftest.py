"""Fixtures of the fleet tests: three `ptc serve` on one PostgreSQL schema, and nginx with the
shipped configuration in front of them (tests/fleet/balancer.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fleet.balancer import Balancer, Fleet, fleet, nginx

# A dead server's lease expires after this; a survivor then marks its records `interrupted`.
MEMBER_LEASE_TTL_S = 2.0
SERVER_ARGS = ("--pool-size", "1", "--member-lease-ttl", str(MEMBER_LEASE_TTL_S))


@pytest.fixture
def three(pg_url: str) -> Iterator[Fleet]:
    """Three servers on a fresh schema, for one test (a test may kill one)."""
    with fleet(pg_url, 3, SERVER_ARGS) as running:
        yield running


@pytest.fixture
def balancer(three: Fleet) -> Iterator[Balancer]:
    """nginx, the shipped configuration, in front of ``three``."""
    with nginx(three.addresses) as running:
        yield running
