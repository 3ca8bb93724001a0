"""How a validated tool call is carried out: the handler interface and the built-in modes.

A tool's mode (`x-ptc.mode`) picks its handler: `echo` returns the arguments, `mock` returns the
result given in the manifest, `host` runs an operator-registered Python callable on the host,
`client` asks the gRPC client to run it. The broker owns policy and recording; a handler only
produces a result or raises `ToolFailure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from stubs_gen import ToolSpec

__all__ = [
    "Approval",
    "Approver",
    "ToolCall",
    "ToolFailure",
    "ToolHandler",
    "builtin_handlers",
    "echo_handler",
    "mock_handler",
]


@dataclass(frozen=True)
class ToolCall:
    """A call that passed validation and policy, on its way to a handler."""

    execution_id: str
    seq: int
    tool: ToolSpec
    arguments: dict[str, Any]
    idempotency_key: str


class ToolFailure(Exception):
    """A handler's way to fail a call; the script sees the message in a typed exception."""

    def __init__(self, message: str, kind: Literal["error", "denied", "refused"] = "error"):
        super().__init__(message)
        self.message = message
        self.kind = kind


class ToolHandler(Protocol):
    async def __call__(self, call: ToolCall) -> Any: ...


@dataclass(frozen=True)
class Approval:
    approved: bool
    reason: str = ""


class Approver(Protocol):
    async def __call__(self, call: ToolCall) -> Approval: ...


async def echo_handler(call: ToolCall) -> Any:
    return call.arguments


async def mock_handler(call: ToolCall) -> Any:
    return call.tool.options.mock


def builtin_handlers() -> dict[str, ToolHandler]:
    return {"echo": echo_handler, "mock": mock_handler}
