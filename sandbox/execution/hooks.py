"""`RunHooks`: the host's hooks into one run, as one frozen value.

Whoever runs an execution (the gRPC server's runner and stream, `ptc run`, the integrations, a
replay, a session rebuild) may hook into it in five ways; the engine, the recorder and the
server's runner hand them on unchanged. One value carries the five so that each signature on
that route names the hooks once, and a new hook is added in one place rather than six:

| hook | called | with |
| --- | --- | --- |
| ``handlers`` | for each tool call in a mode the engine does not serve itself | the call |
| ``approver`` | for each call to a tool that needs approval | the call |
| ``on_output`` | for each chunk the script writes, as it writes it | the chunk |
| ``on_started`` | once, when the sandbox is there and before the script runs | `StartedInfo` |
| ``cancel`` | (an event, not a call) set by the caller to stop the run | |

Each is optional: `NO_HOOKS` is a run nobody watches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sandbox.capture import OutputCallback
from sandbox.execution.request import StartedInfo
from sandbox.handlers import Approver, ToolHandler

__all__ = ["NO_HOOKS", "RunHooks"]


@dataclass(frozen=True)
class RunHooks:
    """The host's hooks into one run (the module's table says when each is called)."""

    handlers: Mapping[str, ToolHandler] = field(default_factory=dict)
    approver: Approver | None = None
    on_output: OutputCallback | None = None
    on_started: Callable[[StartedInfo], None] | None = None
    cancel: asyncio.Event | None = None

    def with_handlers(self, handlers: Mapping[str, ToolHandler]) -> RunHooks:
        """These hooks with ``handlers`` under this value's own (whose modes win)."""
        return replace(self, handlers={**handlers, **self.handlers})


NO_HOOKS = RunHooks()
