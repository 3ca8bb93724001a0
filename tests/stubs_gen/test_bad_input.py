"""Bad manifests: a `ManifestError` naming the tool and the JSON path; `ptc stubs` exits 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stubs_gen import ManifestError, load_manifest
from tests.ptc_cli import run_ptc as _ptc

SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}}

CASES: list[tuple[str, Any, str | None, str, str]] = [
    # id, manifest, tool, path, words in the message
    ("not-json", "{nope", None, "$", "not valid JSON"),
    ("nan", '[{"name": "a", "parameters": {"enum": [NaN]}}]', None, "$", "not valid JSON"),
    ("scalar", "42", None, "$", "array of tool definitions"),
    ("object-without-tools", {"name": "a"}, None, "$", "without a 'tools' array"),
    ("tools-not-array", {"tools": {}}, None, "$.tools", "must be an array"),
    ("entry-not-object", [1], "tools[0]", "$[0]", "must be an object"),
    ("unknown-dialect", [{"title": "a", "schema": {}}], "tools[0]", "$[0]", "unknown dialect"),
    (
        "unknown-envelope-type",
        [{"type": "web_search_20250305", "name": "web"}],
        "web",
        "$[0].type",
        "unknown dialect",
    ),
    ("no-name", [{"parameters": SCHEMA}], "tools[0]", "$[0]", "has no 'name'"),
    (
        "openai-no-name",
        {"tools": [{"name": "ok"}, {"type": "function", "function": {"parameters": SCHEMA}}]},
        "tools[1]",
        "$.tools[1].function",
        "has no 'name'",
    ),
    ("empty-name", [{"name": ""}], "tools[0]", "$[0].name", "non-empty string"),
    ("duplicate", [{"name": "a"}, {"name": "a"}], "a", "$[1]", "duplicate tool name"),
    ("colliding", [{"name": "a.b"}, {"name": "a b"}], "a b", "$[1]", "'a.b' and 'a b'"),
    (
        "bad-type",
        [{"name": "t", "parameters": {"type": "object", "properties": {"x": {"type": 5}}}}],
        "t",
        "$[0].parameters.properties.x.type",
        "invalid schema",
    ),
    (
        "properties-list",
        [{"name": "t", "input_schema": {"type": "object", "properties": []}}],
        "t",
        "$[0].input_schema.properties",
        "'properties' must be an object",
    ),
    (
        "unknown-type-name",
        [
            {
                "name": "t",
                "inputSchema": {"type": "object", "properties": {"x-y": {"type": "strin"}}},
            }
        ],
        "t",
        "$[0].inputSchema.properties['x-y'].type",
        "unknown type 'strin'",
    ),
    (
        "bad-pattern",
        [{"name": "t", "parameters": {"properties": {"x": {"type": "string", "pattern": "("}}}}],
        "t",
        "$[0].parameters.properties.x.pattern",
        "bad regular expression",
    ),
    (
        "dangling-ref",
        [{"name": "t", "parameters": {"properties": {"x": {"$ref": "#/$defs/Nope"}}}}],
        "t",
        "$[0].parameters.properties.x.$ref",
        "does not resolve",
    ),
    (
        "non-object-parameters",
        [{"name": "t", "parameters": {"type": "string"}}],
        "t",
        "$[0].parameters",
        "type 'object'",
    ),
    (
        "required-not-list",
        [{"name": "t", "parameters": {"properties": {}, "required": "x"}}],
        "t",
        "$[0].parameters.required",
        "'required' must be an array",
    ),
    (
        "unknown-x-ptc-option",
        [{"name": "t", "x-ptc": {"needs_aproval": True}}],
        "t",
        "$[0]['x-ptc'].needs_aproval",
        "unknown x-ptc option",
    ),
    (
        "mock-without-result",
        [{"type": "function", "function": {"name": "t"}, "x-ptc": {"mode": "mock"}}],
        "t",
        "$[0]['x-ptc']",
        "needs a 'mock' result",
    ),
    (
        "bad-mode",
        [{"name": "t", "x-ptc": {"mode": "remote"}}],
        "t",
        "$[0]['x-ptc'].mode",
        "'mode' must be one of",
    ),
    (
        "bad-handler",
        [{"name": "t", "x-ptc": {"mode": "host", "handler": "os.system"}}],
        "t",
        "$[0]['x-ptc'].handler",
        "module:function",
    ),
    (
        "ambiguous",
        [{"name": "t", "parameters": SCHEMA, "input_schema": SCHEMA}],
        "t",
        "$[0]",
        "ambiguous dialect",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "tool", "path", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_manifest_is_a_manifest_error(
    manifest: Any, tool: str | None, path: str, words: str
) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(manifest)
    error = info.value
    assert (error.tool, error.path) == (tool, path)
    assert words in str(error)
    assert path in str(error)
    if tool is not None:
        assert repr(tool) in str(error)


def test_deep_nesting_is_a_manifest_error() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ManifestError, match="nested"):
        load_manifest([{"name": "t", "parameters": {"properties": {"x": schema}}}])
    with pytest.raises(ManifestError):
        load_manifest("[" * 100_000 + "]" * 100_000)


def test_cli_bad_manifest_exits_2_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"name": "t", "parameters": {"properties": {"x": {"type": 5}}}}]))
    done = _ptc("stubs", str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert "tool 't' at $[0].parameters.properties.x.type: invalid schema" in done.stderr
    done = _ptc("stubs", "-", stdin="not json")
    assert (done.returncode, "Traceback" in done.stderr) == (2, False)
    assert "not valid JSON" in done.stderr
    done = _ptc("stubs", str(tmp_path / "missing.json"))
    assert (done.returncode, "Traceback" in done.stderr) == (2, False)


def test_cli_prints_module_compact_and_json(tmp_path: Path) -> None:
    manifest = [{"name": "a.b", "parameters": {"properties": {"x": {"type": "string"}}}}]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(manifest))
    module = _ptc("stubs", str(path))
    assert module.returncode == 0, module.stderr
    assert "def a_b(*, x: str=_OMITTED)" in module.stdout
    compact = _ptc("stubs", "-", "--compact", stdin=json.dumps(manifest))
    assert compact.returncode == 0
    assert "def a_b(*, x: str=...)" in compact.stdout
    payload = json.loads(_ptc("stubs", str(path), "--json").stdout)
    assert set(payload) == {"module", "compact", "names", "warnings", "manifest_hash"}
    assert payload["module"] == module.stdout
    assert payload["compact"] == compact.stdout
    assert payload["names"] == {"a_b": "a.b"}
    assert payload["warnings"] == []
    assert len(payload["manifest_hash"]) == 64
