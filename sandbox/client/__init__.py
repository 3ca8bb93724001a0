"""The client SDK: `Client` (blocking) and `AsyncClient` (asyncio) for the sandbox service, and
`tool` / `function_tool` to turn plain Python functions into client-side tools.

How to run a script is one `RunOptions` value (or the same names as keyword arguments); how to
create a session, one `SessionOptions`. Every method returns the SDK's own types (results,
records, session states), never a `sandbox._proto` message."""

from sandbox.client.aio import (
    ApprovalRequest,
    AsyncClient,
    Execution,
    OutputChunk,
    Progress,
    RetryPolicy,
    StreamCallbacks,
    Stubs,
)
from sandbox.client.sessions import AsyncSession, SyncSession
from sandbox.client.sync import Client, SyncExecution
from sandbox.client.tools import ClientTool, build_manifest, function_tool, tool
from sandbox.files import InputFile, OmittedOutput, OutputFile
from sandbox.keepalive import Keepalive
from sandbox.options import RunOptions, SessionOptions
from sandbox.records import (
    ExecutionPage,
    ExecutionQuery,
    ExecutionRecord,
    SessionInfo,
    SessionState,
)

__all__ = [
    "ApprovalRequest",
    "AsyncClient",
    "AsyncSession",
    "Client",
    "ClientTool",
    "Execution",
    "ExecutionPage",
    "ExecutionQuery",
    "ExecutionRecord",
    "InputFile",
    "Keepalive",
    "OmittedOutput",
    "OutputChunk",
    "OutputFile",
    "Progress",
    "RetryPolicy",
    "RunOptions",
    "SessionInfo",
    "SessionOptions",
    "SessionState",
    "StreamCallbacks",
    "Stubs",
    "SyncExecution",
    "SyncSession",
    "build_manifest",
    "function_tool",
    "tool",
]
