"""Python names for tools, parameters and TypedDicts (DESIGN.md, "Stub names").

A tool's or parameter's Python name is its original name with every character outside
``[A-Za-z0-9_]`` replaced by ``_``, a ``_`` prefix when it starts with a digit and a ``_`` suffix
when it is a Python keyword. Names the generated module defines itself are reserved: a tool may
not take them (a clear error beats a stub that silently shadows ``ToolError``), and a parameter
that would shadow a helper its stub body uses gets one more ``_`` suffix.
"""

from __future__ import annotations

import keyword
import re

__all__ = [
    "MODULE_RESERVED",
    "PARAM_RESERVED",
    "TYPE_RESERVED",
    "pascal",
    "python_name",
]

_INVALID = re.compile(r"[^A-Za-z0-9_]")
_WORDS = re.compile(r"[A-Za-z][a-z0-9]*|[0-9]+|[a-z0-9]+")

# Names bound at module level by the generated module (see render.py); a tool cannot use them.
MODULE_RESERVED = frozenset(
    {
        "aio",
        "ToolError",
        "InvalidArguments",
        "CallRefused",
        "CallDenied",
        "annotations",
        "_call",
        "_acall",
        "_t",
        "_Omitted",
        "_OMITTED",
        "_aio_twin",
        "_b",
    }
)
# Globals a stub body reads: a parameter with one of these names would shadow it.
PARAM_RESERVED = frozenset({"_call", "_acall", "_OMITTED"})
# Names a TypedDict must not take: module names, and the bare typing names of the compact form.
TYPE_RESERVED = MODULE_RESERVED | frozenset(
    {"Any", "Literal", "TypedDict", "Required", "NotRequired", "None", "True", "False"}
)


def python_name(name: str) -> str:
    """The Python identifier for a tool or parameter name, per the stub-name rule."""
    ident = _INVALID.sub("_", name)
    if not ident or ident[0].isdigit():
        ident = "_" + ident
    if keyword.iskeyword(ident):
        ident += "_"
    return ident


def pascal(*parts: str) -> str:
    """``PascalCase`` of the words in ``parts``: ``get_weather``, ``opts`` -> ``GetWeatherOpts``."""
    words: list[str] = []
    for part in parts:
        words.extend(w[0].upper() + w[1:] for w in _WORDS.findall(part))
    out = "".join(words) or "T"
    if out[0].isdigit():
        out = "T" + out
    return out
