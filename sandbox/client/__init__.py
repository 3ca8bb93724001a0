"""The client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the sandbox service, and
`tool` / `function_tool` to turn plain Python functions into client-side tools."""

from sandbox.client.aio import (
    ApprovalRequest,
    AsyncClient,
    Execution,
    OutputChunk,
    Progress,
    Stubs,
)
from sandbox.client.sync import Client, SyncExecution
from sandbox.client.tools import ClientTool, build_manifest, function_tool, tool

__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "Client",
    "ClientTool",
    "Execution",
    "OutputChunk",
    "Progress",
    "Stubs",
    "SyncExecution",
    "build_manifest",
    "function_tool",
    "tool",
]
