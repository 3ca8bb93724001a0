"""Hand the sandbox to an agent framework as its execute tool.

`ExecuteTool` is the framework-neutral core (definitions in the OpenAI, Anthropic and MCP
dialects, a run that returns a bounded `Observation`); `EmbeddedRunner` and `ClientRunner` say
where scripts run. The adapter modules (`openai_sdk`, `anthropic_sdk`, `langchain`,
`openai_agents`, `smolagents`) and `mcp_server` import their framework lazily: import them only
with the matching extra installed (`pip install ptc-sandbox[integrations]`).
"""

from sandbox.integrations.execute_tool import CALLING_CONVENTION, ExecuteTool, Observation
from sandbox.integrations.forwarded import ForwardedTool, forwarded_tool
from sandbox.integrations.observation import (
    ObservationBudget,
    render_observation,
    summarize_result,
)
from sandbox.integrations.runners import ClientRunner, EmbeddedRunner, RunRequest, ScriptRunner
from sandbox.options import RunOptions, SessionOptions

__all__ = [
    "CALLING_CONVENTION",
    "ClientRunner",
    "EmbeddedRunner",
    "ExecuteTool",
    "ForwardedTool",
    "Observation",
    "ObservationBudget",
    "RunOptions",
    "RunRequest",
    "ScriptRunner",
    "SessionOptions",
    "forwarded_tool",
    "render_observation",
    "summarize_result",
]
