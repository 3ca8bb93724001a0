"""Sub-commands of `ptc`; each module exposes ``register(subparsers)`` that sets ``handler``."""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class Command(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[Any]) -> None: ...


def _load() -> list[Command]:
    from sandbox.commands import audit, health, mcp, replay, run, runtime, serve, stubs, tenants

    return [run, stubs, audit, tenants, serve, mcp, replay, health, runtime]


COMMANDS: list[Command] = _load()
