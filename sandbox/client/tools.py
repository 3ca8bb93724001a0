"""Client-side tools: a plain Python function becomes a manifest entry and a local callable.

    @tool(read_only=True)
    def get_weather(city: str, unit: Literal["C", "F"] = "C") -> dict[str, float]:
        '''Current weather for a city.

        Args:
            city: the city's name.
            unit: temperature unit.
        '''

The JSON Schema of the parameters comes from the signature through pydantic (a model built with
`create_model` from the annotations and defaults), descriptions from the docstring (its first
paragraph for the tool, a Google-style ``Args:`` section or ``:param x:`` lines for the
parameters), and the result's schema from the return annotation. The entry is in `client` mode:
when the script calls it, the server asks this client to run it, and the arguments are validated
by the same pydantic model before the function sees them. Tools are not read-only unless said so,
so that the broker serialises calls with side effects.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import pydantic
import pydantic_core

from sandbox.request_caps import check_manifest_size

__all__ = ["ClientTool", "build_manifest", "function_tool", "tool"]


@dataclass(frozen=True)
class ClientTool:
    """A manifest entry in `client` mode and the function that serves it."""

    name: str
    entry: dict[str, Any]
    function: Callable[..., Any]
    arguments: type[pydantic.BaseModel]

    async def invoke(self, arguments: Any) -> str:
        """Validates ``arguments``, calls the function, returns its result as JSON text."""
        return await self._call(self.arguments.model_validate(arguments))

    async def invoke_json(self, arguments_json: str | bytes) -> str:
        """`invoke` for arguments as JSON text, validated as they are parsed (one pass)."""
        return await self._call(self.arguments.model_validate_json(arguments_json))

    async def _call(self, model: pydantic.BaseModel) -> str:
        kwargs = {name: getattr(model, name) for name in type(model).model_fields}
        if inspect.iscoroutinefunction(self.function):
            value = await self.function(**kwargs)
        else:
            value = await asyncio.to_thread(self.function, **kwargs)
        return json.dumps(pydantic_core.to_jsonable_python(value), ensure_ascii=False)


def function_tool(
    function: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    read_only: bool = False,
    needs_approval: bool = False,
) -> ClientTool:
    """The `ClientTool` for ``function``; raises TypeError for a signature JSON cannot carry."""
    tool_name = name or function.__name__
    summary, param_docs = _parse_docstring(inspect.getdoc(function) or "")
    hints = typing.get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(
                f"tool {tool_name!r}: parameter {param.name!r} must be passable by keyword"
            )
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (
            hints.get(param.name, Any),
            pydantic.Field(default, description=param_docs.get(param.name)),
        )
    model: type[pydantic.BaseModel] = pydantic.create_model(f"{tool_name}_arguments", **fields)
    options: dict[str, Any] = {
        "mode": "client",
        "read_only": read_only,
        "needs_approval": needs_approval,
    }
    returns = hints.get("return", inspect.Signature.empty)
    if returns not in (inspect.Signature.empty, None, type(None), Any):
        options["returns"] = _clean(pydantic.TypeAdapter(returns).json_schema())
    entry = {
        "name": tool_name,
        "description": description if description is not None else summary,
        "parameters": _clean(model.model_json_schema()),
        "x-ptc": options,
    }
    return ClientTool(tool_name, entry, function, model)


@overload
def tool(function: Callable[..., Any]) -> ClientTool: ...
@overload
def tool(
    *, name: str | None = None, read_only: bool = False, needs_approval: bool = False
) -> Callable[[Callable[..., Any]], ClientTool]: ...
def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    read_only: bool = False,
    needs_approval: bool = False,
) -> ClientTool | Callable[[Callable[..., Any]], ClientTool]:
    """Decorator form of `function_tool`: ``@tool`` or ``@tool(read_only=True)``."""

    def wrap(fn: Callable[..., Any]) -> ClientTool:
        return function_tool(fn, name=name, read_only=read_only, needs_approval=needs_approval)

    return wrap(function) if function is not None else wrap


ToolLike = ClientTool | Callable[..., Any] | Mapping[str, Any]


def build_manifest(tools: str | Sequence[ToolLike]) -> tuple[str, dict[str, ClientTool]]:
    """The manifest JSON text and the client functions by tool name.

    ``tools`` is raw manifest JSON text (passed through unchanged) or a list of manifest entries
    (dicts in any dialect), functions and `ClientTool`s.
    """
    if isinstance(tools, str):
        check_manifest_size(tools)  # before sending, as the server would refuse it
        return tools, {}
    if not tools:  # no tools: the JSON of an empty list, as below, without encoding it
        return "[]", {}
    entries: list[Any] = []
    local: dict[str, ClientTool] = {}
    for item in tools:
        if isinstance(item, Mapping):
            entries.append(dict(item))
            continue
        client_tool = item if isinstance(item, ClientTool) else function_tool(item)
        if client_tool.name in local:
            raise ValueError(f"two client tools are named {client_tool.name!r}")
        local[client_tool.name] = client_tool
        entries.append(client_tool.entry)
    text = json.dumps(entries, ensure_ascii=False)
    check_manifest_size(text)
    return text, local


def _clean(schema: Any) -> Any:
    """Drops pydantic's generated titles, which only add noise to stubs and prompts."""
    if isinstance(schema, dict):
        return {
            k: _clean(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))
        }
    if isinstance(schema, list):
        return [_clean(v) for v in schema]
    return schema


_GOOGLE_ARG = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_ARG = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?)\s*:\s*$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph, and parameter descriptions from ``Args:`` or ``:param`` lines."""
    summary = doc.split("\n\n", 1)[0].strip()
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = 0
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        rest = _REST_ARG.match(line)
        if rest:
            current = rest.group(1)
            params[current] = rest.group(2).strip()
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        arg = _GOOGLE_ARG.match(line)
        if arg and (current is None or indent <= arg_indent):
            current, arg_indent = arg.group(1).lstrip("*"), indent
            params[current] = arg.group(2).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return summary, params
