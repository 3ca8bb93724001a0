"""Host handlers: operator-registered Python callables that serve `host`-mode tools.

The operator maps tool names to ``module:function`` in the server's config; they are imported
once at start-up, on the host, and never inside a sandbox. A manifest only says that a tool is in
`host` mode (and may repeat the handler's ``module:function``, which must then match what the
operator registered): it can never make the server import anything. Each call runs with a timeout
and under a server-wide concurrency limit; a plain function runs on a thread of the handlers' own
(`host_threads`) so that a slow handler cannot stall the event loop, nor a hung one the server's
other blocking work or its exit. A handler's exception is the call's error, seen by the script as
`ToolError`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sandbox.errors import InvalidArgument
from sandbox.handlers import ToolCall, ToolFailure
from sandbox.server.host_threads import HostThreads
from stubs_gen import Manifest

__all__ = ["HostHandlers", "resolve_callable"]


def resolve_callable(spec: str) -> Callable[..., Any]:
    """Imports ``module:function``; raises InvalidArgument naming the spec."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgument(f"host handler {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidArgument(f"host handler {spec!r}: cannot import {module_name}: {exc}") from exc
    target: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(target):
        raise InvalidArgument(f"host handler {spec!r}: {attr} is not a callable of {module_name}")
    return target


class HostHandlers:
    """The `host` mode handler: dispatches a call to the tool's registered callable."""

    def __init__(
        self, specs: Mapping[str, str], timeout_s: float = 10.0, concurrency: int = 16
    ) -> None:
        self.specs = dict(specs)
        self.functions = {tool: resolve_callable(spec) for tool, spec in self.specs.items()}
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(concurrency)
        self.threads = HostThreads(concurrency)  # plain functions run here, never in the loop's

    def check(self, manifest: Manifest) -> None:
        """Refuses a manifest with a host-mode tool this server cannot serve."""
        for index, tool in enumerate(manifest.tools):
            if tool.options.mode != "host":
                continue
            where = f"manifest: tools[{index}] {tool.name!r}"
            spec = self.specs.get(tool.name)
            if spec is None:
                raise InvalidArgument(
                    f"{where}: is in 'host' mode but this server has no host handler for it"
                )
            if tool.options.handler is not None and tool.options.handler != spec:
                raise InvalidArgument(
                    f"{where}: names handler {tool.options.handler!r}, but the server "
                    f"registered {spec!r} for it"
                )

    async def __call__(self, call: ToolCall) -> Any:
        function = self.functions.get(call.tool.name)
        if function is None:
            raise ToolFailure(f"no host handler is registered for {call.tool.name!r}", "refused")
        coroutine = inspect.iscoroutinefunction(function)
        started = threading.Event()  # a thread took a plain function's call
        async with self._slots:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
            # that meets the call's answer, and the execution's cancel would be lost.
            try:
                async with asyncio.timeout(self.timeout_s):
                    if coroutine:
                        return await function(**call.arguments)
                    args = dict(call.arguments)
                    return await self.threads.run(call.tool.name, function, args, started)
            except TimeoutError:
                never_ran = not coroutine and not started.is_set()
                raise ToolFailure(
                    f"the host handler for {call.tool.name!r} took longer than "
                    f"{self.timeout_s:g} s{self._threads_taken() if never_ran else ''}"
                ) from None

    def _threads_taken(self) -> str:
        """Why a plain function's call never started: every thread still runs an earlier call
        (handlers that hang past their timeout keep their threads)."""
        busy = self.threads.busy()
        longest = f"; the longest: {busy[0][0]!r}, for {busy[0][1]:.0f} s" if busy else ""
        return (
            f": it never started, all {self.threads.size} host handler threads run earlier"
            f" calls{longest}"
        )
