"""The typed model of a manifest: `ToolOptions`, `ToolSpec` and `Manifest`.

These are what the rest of the system (the broker, the server, the CLI) reads: every tool's
original and Python name, its normalised input and output schemas and its ``x-ptc`` options. A
`Manifest` also carries its warnings, the hash of its canonical JSON (the cache key of rendered
modules) and, privately, the typed plan the renderers print.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from stubs_gen.types import Plan
    from stubs_gen.validate import ArgumentValidator

__all__ = ["Manifest", "Mode", "ToolOptions", "ToolSpec"]

Mode = Literal["echo", "mock", "host", "client"]


@dataclass(frozen=True)
class ToolOptions:
    """Per-tool options from the tool's ``x-ptc`` object."""

    mode: Mode = "echo"
    read_only: bool = False
    needs_approval: bool = False
    has_mock: bool = False
    mock: Any = None
    summary_fields: tuple[str, ...] = ()
    handler: str | None = None
    mcp_content: bool = False  # answers may be lists of MCP content items (stubs_gen.content)


@dataclass(frozen=True)
class ToolSpec:
    """One tool, dialect-free."""

    name: str
    python_name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    options: ToolOptions
    param_names: dict[str, str]


@dataclass(frozen=True)
class Manifest:
    """A loaded manifest: its tools in manifest order, warnings and canonical hash."""

    tools: tuple[ToolSpec, ...]
    warnings: tuple[str, ...]
    sha256: str
    _plan: Plan = field(repr=False, compare=False)
    _by_name: dict[str, ToolSpec] = field(default_factory=dict, repr=False, compare=False)
    _validators: dict[str, ArgumentValidator] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._by_name.update((tool.name, tool) for tool in self.tools)

    def tool(self, name: str) -> ToolSpec | None:
        """The tool with this original name, or None."""
        return self._by_name.get(name)

    @property
    def names(self) -> dict[str, str]:
        """Python name -> original tool name."""
        return {tool.python_name: tool.name for tool in self.tools}

    def prepare_validators(self) -> None:
        """Builds every tool's validator now (importing ``jsonschema`` on first use), so that
        the cost falls on preparing the request, not on the script's first tool call, whose
        wall time is the script's limit."""
        from stubs_gen.validate import ArgumentValidator

        for tool in self.tools:
            if tool.name not in self._validators:
                self._validators[tool.name] = ArgumentValidator(tool.input_schema)

    def validate(self, tool_name: str, arguments: dict[str, Any]) -> list[str]:
        """Problems with a call's arguments; ``[]`` when the call is valid."""
        validator = self._validators.get(tool_name)
        if validator is None:
            spec = self._by_name.get(tool_name)
            if spec is None:
                return [f"unknown tool {tool_name!r}"]
            from stubs_gen.validate import ArgumentValidator

            validator = ArgumentValidator(spec.input_schema)
            self._validators[tool_name] = validator
        return validator.check(arguments)
