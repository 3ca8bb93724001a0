"""Sub-commands of `ptc`; each module exposes ``register(subparsers)`` that sets ``handler``."""

from __future__ import annotations

import argparse
from typing import Any, Protocol

__all__ = ["COMMANDS", "Command"]


class Command(Protocol):
    def register(self, subparsers: argparse._SubParsersAction[Any]) -> None: ...


def _load() -> list[Command]:
    from sandbox.commands import (
        audit,
        health,
        mcp,
        replay,
        run,
        runtime,
        serve,
        session,
        stubs,
        tenants,
    )

    return [run, stubs, audit, tenants, serve, mcp, replay, health, session, runtime]


COMMANDS: list[Command] = _load()
