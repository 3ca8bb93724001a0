"""Fixtures for the stubs_gen tests (helpers live in `stubsgen_support`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.stubs_gen.stubsgen_support import FakeRuntime, install_runtime, restore_runtime


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    fake, previous = install_runtime()
    yield fake
    restore_runtime(previous)
    sys.modules.pop("tools", None)
