"""The execute tool: one framework-neutral tool whose argument is a Python script.

    runner = EmbeddedRunner()                      # or ClientRunner.connect("host:port")
    execute = ExecuteTool(runner, tools=[get_weather, search_manifest_entry])
    definition = execute.openai_definition()       # or anthropic_definition(), mcp_definition()
    observation = execute.run_arguments(tool_call_arguments_json)
    observation.text                               # what goes back to the model

The tool's description carries the calling convention and the compact stub module
(`stubs_gen.render_compact`), so the model knows every typed function it may call without one
JSON definition per tool. The same object runs a call — through any `ScriptRunner`, with the
`RunOptions` the agent builder set (limits, expected call counts, policy, input files) — and
renders the observation (`sandbox.integrations.observation`). A request the service refuses (a
script too large, an unknown tool in `expected_calls`) comes back as an error observation, so
the model can correct itself; it never raises into the framework's loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack

import grpc

from sandbox.client.tools import ToolLike, build_manifest
from sandbox.errors import PtcError
from sandbox.expectations import ExpectedCalls
from sandbox.files import FilesLike, input_files
from sandbox.integrations.observation import ObservationBudget, ScriptSource, render_observation
from sandbox.integrations.runners import RunRequest, ScriptRunner
from sandbox.integrations.session_runners import ClientSessionRunner, EmbeddedSessionRunner
from sandbox.options import RunOptions, RunOverrides
from sandbox.result import ExecutionResult, ExecutionStatus
from sandbox.telemetry.progress import ProgressSnapshot
from stubs_gen import Manifest, load_manifest, render_compact

__all__ = [
    "CALLING_CONVENTION",
    "CODE_PARAMETER",
    "SESSION_CALLING_CONVENTION",
    "ExecuteTool",
    "Observation",
]

# The first line says what a run keeps: nothing over a single-use runner, everything the
# earlier cells left over a session runner (`session_runners`), so that a model neither redoes
# work that is still there nor counts on state that is gone. The TypeScript package's tool says
# the same (tests/data/execute_tool_description_vectors.json holds both descriptions).
_FRESH = "Run a Python 3 script in a fresh sandbox (no network, nothing persists between runs).\n"
_IN_SESSION = (
    "Run a Python 3 script as the next cell of one sandbox session (no network). State persists\n"
    "between runs: the names, imports and files of earlier runs are still there.\n"
)
_CONVENTION = """\
The tools below are typed functions of the module `tools`: `import tools`, then call
`tools.NAME(arg=...)` with keyword arguments. Use loops and branches, and for many independent
calls fan out with `await asyncio.gather(*(tools.aio.NAME(...) for ...))` (top-level await
works). A failing call raises `tools.ToolError` (subclasses: `InvalidArguments`, `CallRefused`,
`CallDenied`); catch it where a failure is expected. Only what you print() comes back, with a
one-line summary of each tool call, so print the reduced answer, not raw results.
"""

CALLING_CONVENTION = _FRESH + _CONVENTION
SESSION_CALLING_CONVENTION = _IN_SESSION + _CONVENTION

CODE_PARAMETER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "The complete Python script to run.",
        }
    },
    "required": ["code"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Observation:
    """One execute-tool call's outcome: the model's text and the full result behind it."""

    text: str
    result: ExecutionResult | None

    @property
    def is_error(self) -> bool:
        return self.result is None or self.result.status != ExecutionStatus.OK


class ExecuteTool:
    """The execute tool over ``tools``, run by ``runner``."""

    def __init__(
        self,
        runner: ScriptRunner,
        tools: Sequence[ToolLike] = (),
        *,
        name: str = "execute_python",
        options: RunOptions | None = None,
        budget: ObservationBudget | None = None,
        instructions: str = "",
        **overrides: Unpack[RunOverrides],
    ) -> None:
        self.runner = runner
        self.tools = list(tools)
        self.name = name
        # How every run of this tool goes (limits, expected calls, policy, input files such as
        # a conversation's uploads, ...): ``options`` or the same names as keywords.
        self.options = RunOptions.of(options, **overrides)
        self.budget = budget or ObservationBudget()
        manifest_json, _local = build_manifest(self.tools)
        self.manifest: Manifest = load_manifest(manifest_json)
        self.stubs = render_compact(self.manifest)
        self.summary_fields: dict[str, tuple[str, ...]] = {
            spec.name: tuple(spec.options.summary_fields)
            for spec in self.manifest.tools
            if spec.options.summary_fields
        }
        self.description = self._describe(instructions)

    def _describe(self, instructions: str) -> str:
        in_session = isinstance(self.runner, (ClientSessionRunner, EmbeddedSessionRunner))
        convention = SESSION_CALLING_CONVENTION if in_session else CALLING_CONVENTION
        extra = instructions.strip() + "\n" if instructions.strip() else ""
        if not self.manifest.tools:
            return convention + extra + "No tools are available to this script.\n"
        return f"{convention}{extra}\n```python\n{self.stubs.rstrip()}\n```\n"

    # -- definitions ---------------------------------------------------------------------------
    @property
    def parameters(self) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(CODE_PARAMETER))  # callers may mutate it
        return copy

    def openai_definition(self) -> dict[str, Any]:
        """Chat Completions `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def openai_responses_definition(self) -> dict[str, Any]:
        """Responses API `tools` entry."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "strict": True,
        }

    def anthropic_definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.parameters,
        }

    def mcp_definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.parameters,
        }

    # -- running -------------------------------------------------------------------------------
    def request(
        self,
        code: str,
        expected_calls: Sequence[ExpectedCalls] | None = None,
        files: FilesLike | None = None,
    ) -> RunRequest:
        """The run of ``code`` with this tool's options, its expected calls replaced and
        ``files`` added to its own when given."""
        options = self.options
        if expected_calls is not None:
            options = replace(options, expected_calls=tuple(expected_calls))
        if files is not None:
            options = replace(options, files=options.files + input_files(files))
        return RunRequest(code, self.tools, options)

    def observe(self, result: ExecutionResult, script: ScriptSource | None = None) -> Observation:
        text = render_observation(result, self.summary_fields, self.budget, script)
        return Observation(text, result)

    def run(
        self,
        code: str,
        expected_calls: Sequence[ExpectedCalls] | None = None,
        *,
        prelude: str = "",
        files: FilesLike | None = None,
    ) -> Observation:
        """Runs ``code``; an adapter's ``prelude`` runs before it, out of the model's sight
        (its frames are hidden and line numbers count from the code's first line). ``files``
        are input files for this run, beside the tool's own."""
        script = _source(prelude, code)
        try:
            result = self.runner.run(self.request(script.text, expected_calls, files))
        except (PtcError, grpc.RpcError) as exc:
            return _refused(exc)
        return self.observe(result, script)

    async def arun(
        self,
        code: str,
        expected_calls: Sequence[ExpectedCalls] | None = None,
        *,
        prelude: str = "",
        files: FilesLike | None = None,
        on_progress: Callable[[ProgressSnapshot], Any] | None = None,
    ) -> Observation:
        script = _source(prelude, code)
        request = replace(self.request(script.text, expected_calls, files), on_progress=on_progress)
        try:
            result = await self.runner.arun(request)
        except (PtcError, grpc.RpcError) as exc:
            return _refused(exc)
        return self.observe(result, script)

    def run_arguments(self, arguments: str | Mapping[str, Any] | None) -> Observation:
        """Runs a tool call given its raw arguments (JSON text or an already parsed mapping)."""
        code = parse_code(arguments)
        if code is None:
            return Observation(_BAD_ARGUMENTS, None)
        return self.run(code)

    async def arun_arguments(self, arguments: str | Mapping[str, Any] | None) -> Observation:
        code = parse_code(arguments)
        if code is None:
            return Observation(_BAD_ARGUMENTS, None)
        return await self.arun(code)


_BAD_ARGUMENTS = 'error: the tool takes one argument, {"code": "<a Python script>"}'


def parse_code(arguments: str | Mapping[str, Any] | None) -> str | None:
    """The ``code`` argument of a tool call, or None when the call did not carry one."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, Mapping):
        return None
    code = arguments.get("code")
    return code if isinstance(code, str) else None


def _source(prelude: str, code: str) -> ScriptSource:
    if prelude and not prelude.endswith("\n"):
        prelude += "\n"
    return ScriptSource(prelude + code, prelude.count("\n"))


def _refused(exc: Exception) -> Observation:
    if isinstance(exc, grpc.RpcError):
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return Observation(f"error: the sandbox service refused the request: {details}", None)
    return Observation(f"error: the sandbox refused the request: {exc}", None)
