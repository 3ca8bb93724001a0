"""The client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the sandbox service, and
`tool` / `function_tool` to turn plain Python functions into client-side tools."""

from sandbox.client.aio import ApprovalRequest, AsyncClient, Execution, OutputChunk, Stubs
from sandbox.client.sessions import AsyncSession, SyncSession
from sandbox.client.sync import Client, SyncExecution
from sandbox.client.tools import ClientTool, build_manifest, function_tool, tool

__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "ClientTool",
    "Execution",
    "OutputChunk",
    "Stubs",
    "SyncExecution",
    "SyncSession",
    "build_manifest",
    "function_tool",
    "tool",
]
