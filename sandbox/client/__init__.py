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
from sandbox.client.sessions import AsyncSession, SyncSession
from sandbox.client.sync import Client, SyncExecution
from sandbox.client.tools import ClientTool, build_manifest, function_tool, tool
from sandbox.files import InputFile, OmittedOutput, OutputFile

__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "ClientTool",
    "Execution",
    "InputFile",
    "OmittedOutput",
    "OutputChunk",
    "OutputFile",
    "Progress",
    "Stubs",
    "SyncExecution",
    "SyncSession",
    "build_manifest",
    "function_tool",
    "tool",
]
