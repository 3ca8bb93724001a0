"""Python names for tools, parameters and TypedDicts (DESIGN.md, "Stub names").

A tool's or parameter's Python name is its original name in Unicode normal form NFKC (the form
Python itself gives every identifier when it compiles: ``ﬁle`` in a script *is* ``file``), with
every character that cannot appear at its place in an identifier replaced by ``_``, a ``_``
prefix when it starts with a character that may only continue one (a digit) and a ``_`` suffix
when it is a Python keyword. So a name that is a valid identifier, ASCII or not (``año``), is
kept as the model reads it, and an ASCII name maps exactly as it always did (``send-email`` ->
``send_email``). The stub sends the original name, so the schema's key is what the broker
validates and the call log records. Two names with one Python name (``ﬁle`` and ``file``, or
``a-b`` and ``a_b``) are a collision error naming both.

Names the generated module defines itself are reserved: a tool may not take them (a clear error
beats a stub that silently shadows ``ToolError``), and a parameter that would shadow a helper its
stub body uses gets one more ``_`` suffix.
"""

from __future__ import annotations

import keyword
import re
import unicodedata

__all__ = [
    "MODULE_RESERVED",
    "PARAM_RESERVED",
    "TYPE_RESERVED",
    "collision",
    "is_identifier",
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
    ident = _identifier(unicodedata.normalize("NFKC", name))
    if not is_identifier(ident):  # a replacement made a composable sequence: the ASCII rule is safe
        ident = _identifier(_INVALID.sub("_", name))
    if keyword.iskeyword(ident):
        ident += "_"
    return ident


def collision(kind: str, first: str, second: str, ident: str) -> str:
    """The error of two ``kind`` (tools, parameters) with one Python name; names that print
    alike (they differ only in Unicode normalization) are also shown escaped."""
    message = f"{kind} {first!r} and {second!r} both map to the Python name {ident!r}"
    if unicodedata.normalize("NFC", first) == unicodedata.normalize("NFC", second):
        message += f" ({first!a} and {second!a}: one name in two Unicode forms)"
    return message


def _identifier(text: str) -> str:
    chars = [c if ("a" + c).isidentifier() else "_" for c in text]
    if not chars or not chars[0].isidentifier():
        chars.insert(0, "_")  # a digit (or a combining mark): kept, behind a "_"
    return "".join(chars)


def is_identifier(ident: str) -> bool:
    """Whether Python compiles ``ident`` to itself: an identifier already in NFKC (``ﬁle`` is an
    identifier, but one Python reads as ``file``)."""
    return ident.isidentifier() and unicodedata.normalize("NFKC", ident) == ident


def pascal(*parts: str) -> str:
    """``PascalCase`` of the words in ``parts``: ``get_weather``, ``opts`` -> ``GetWeatherOpts``;
    ``año_vehiculo`` -> ``AñoVehiculo``. A word is a letter followed by lower-case letters and
    digits, or a run of digits (for ASCII, exactly ``_WORDS``)."""
    out = "".join(w[0].upper() + w[1:] for part in parts for w in _words(part))
    if not is_identifier(
        out or "T"
    ):  # an upper-cased letter outside NFKC or identifiers: ASCII words
        out = "".join(w[0].upper() + w[1:] for part in parts for w in _WORDS.findall(part))
    out = out or "T"
    if out[0].isdigit():
        out = "T" + out
    return out


def _words(text: str) -> list[str]:
    words: list[str] = []
    for char in unicodedata.normalize("NFKC", text):
        last = words[-1] if words else ""
        if char.isdigit() and char.isascii() and last.isdigit():
            words[-1] += char
        elif char.isalpha() or (char.isdigit() and char.isascii()):
            lower = char.islower() or (char.isdigit() and char.isascii())
            if last and lower and not last.isdigit():
                words[-1] += char
            else:
                words.append(char)
        else:
            words.append("")  # a separator ends the word
    return [w for w in words if w]
