"""A smolagents `CodeAgent` whose code runs in our sandbox instead of its local executor.

    with EmbeddedRunner() as runner, open_session(runner) as conversation:
        agent = CodeAgent(tools=[...], model=model, executor=SandboxExecutor(conversation))

That is the way to use it: bound to a session (`open_session`, see
`sandbox.integrations.session_runners`), every code action of the agent is the session's next
cell, so names, imports and files persist from one action to the next, as the CodeAgent prompt
promises the model, and an action's final bare expression comes back as its output (a repr).
`SandboxExecutor(runner)` with a plain runner runs each action in a fresh sandbox instead: no
state survives between actions (variables the agent was given are re-sent as JSON literals), for
agents whose actions are independent.

`SandboxExecutor` implements smolagents' `PythonExecutor` interface (`send_tools`,
`send_variables`, `__call__`). The agent's tools are forwarded as client-side tools (their
`inputs` become the JSON Schema the broker validates; the calls run here, in the agent's process,
and are recorded in the call log), and a short prelude binds each of them by name to its stub
(positional arguments allowed), so the code calls `get_weather(city=...)` exactly as with the
local executor. `final_answer(...)` is a client-side tool too: its value becomes the step's final
answer. A failing script raises `SandboxExecutionError` carrying the rendered observation
(output, call summary, the error), which the agent shows the model as the step's error. Its
tracebacks show the code action's own frames with the action's own line numbers: the prelude is
hidden.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from smolagents.local_python_executor import CodeOutput, PythonExecutor
from smolagents.tools import Tool

from sandbox.integrations.execute_tool import ExecuteTool
from sandbox.integrations.forwarded import ForwardedTool, forwarded_tool
from sandbox.integrations.observation import ObservationBudget
from sandbox.integrations.runners import ScriptRunner
from sandbox.limits import Limits
from sandbox.result import ExecutionStatus

__all__ = ["SandboxExecutionError", "SandboxExecutor", "tool_schema"]

_JSON_TYPES = {"string", "boolean", "integer", "number", "array", "object", "null"}


class SandboxExecutionError(Exception):
    """The code action did not end `ok`; the message is the observation the model reads."""


def _property(spec: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    json_kinds = [k for k in kinds if k in _JSON_TYPES]
    if json_kinds and "any" not in kinds:
        out["type"] = json_kinds[0] if len(json_kinds) == 1 else json_kinds
    if spec.get("description"):
        out["description"] = str(spec["description"])
    if "enum" in spec:
        out["enum"] = list(spec["enum"])
    return out


def tool_schema(tool: Tool) -> dict[str, Any]:
    """The JSON Schema of a smolagents tool's `inputs`."""
    inputs: Mapping[str, Mapping[str, Any]] = tool.inputs
    properties = {name: _property(spec) for name, spec in inputs.items()}
    required = [name for name, spec in inputs.items() if not spec.get("nullable")]
    return {"type": "object", "properties": properties, "required": required}


class SandboxExecutor(PythonExecutor):  # type: ignore[misc]  # smolagents is untyped
    def __init__(
        self,
        runner: ScriptRunner,
        *,
        limits: Limits | None = None,
        budget: ObservationBudget | None = None,
    ) -> None:
        self.runner = runner
        self.limits = limits or Limits()
        self.budget = budget or ObservationBudget()
        self.tools: dict[str, Tool] = {}
        self.variables: dict[str, Any] = {}
        self.state: dict[str, Any] = {}

    def send_tools(self, tools: dict[str, Tool]) -> None:
        self.tools = dict(tools)

    def send_variables(self, variables: dict[str, Any]) -> None:
        self.variables = {}
        for name, value in variables.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue  # only JSON crosses the sandbox boundary
            if name.isidentifier():
                self.variables[name] = value

    def _forwarded(self, answers: list[Any]) -> list[ForwardedTool]:
        out = []
        for name, tool in self.tools.items():
            if name == "final_answer":

                async def record(arguments: dict[str, Any]) -> Any:
                    value = next(iter(arguments.values()), None)
                    answers.append(value)
                    return value

                forward = record
            else:

                async def call(arguments: dict[str, Any], tool: Tool = tool) -> Any:
                    return await asyncio.to_thread(tool, **arguments)

                forward = call
            out.append(
                forwarded_tool(
                    name, forward, description=str(tool.description), input_schema=tool_schema(tool)
                )
            )
        return out

    def _prelude(self) -> str:
        # smolagents code calls tools positionally too (`final_answer(x)`); stubs are
        # keyword-only, so each name is bound to a wrapper that names positional arguments.
        lines = ["import tools as _ptc_tools"] if self.tools else []
        for name, tool in sorted(self.tools.items()):
            order = tuple(tool.inputs)
            lines.append(
                f"def {name}(*args, **kwargs):\n"
                f"    return _ptc_tools.{name}(**dict(zip({order!r}, args)), **kwargs)"
            )
        if self.variables:
            lines.append("import json as _json")
            for name, value in self.variables.items():
                lines.append(f"{name} = _json.loads({json.dumps(value)!r})")
        return "\n".join(lines) + ("\n" if lines else "")

    def __call__(self, code_action: str) -> CodeOutput:
        answers: list[Any] = []
        execute = ExecuteTool(
            self.runner, self._forwarded(answers), limits=self.limits, budget=self.budget
        )
        observation = execute.run(code_action, prelude=self._prelude())
        result = observation.result
        if result is None or result.status != ExecutionStatus.OK:
            raise SandboxExecutionError(observation.text)
        if answers:
            return CodeOutput(output=answers[-1], logs=result.stdout, is_final_answer=True)
        # In a session (`open_session`) the action's final bare expression comes back as its
        # repr, as the local executor returns the last expression's value.
        return CodeOutput(output=result.value, logs=result.stdout, is_final_answer=False)
