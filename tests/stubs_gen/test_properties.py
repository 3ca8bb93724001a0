"""Property tests over generated JSON Schemas (valid and invalid-ish).

Whatever the manifest, `load_manifest` and the renderers raise nothing but `ManifestError`, every
module they return compiles, every schema they accept is a valid Draft 2020-12 schema, and
validation returns messages rather than raising.
"""

from __future__ import annotations

import contextlib
import keyword
import sys
import typing
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from stubs_gen import ManifestError, load_manifest, render_compact, render_module
from tests.stubs_gen.stubsgen_support import import_source, install_runtime, restore_runtime

NAMES = st.one_of(
    st.sampled_from(
        [
            "a",
            "x-y",
            "2nd",
            "class",
            "_call",
            "_OMITTED",
            "aio",
            "str",
            "list",
            "k",
            "v",
            "__init__",
            "None",
            "Any",
            "self",
        ]
    ),
    st.sampled_from(sorted(keyword.kwlist)),
    st.text(min_size=0, max_size=8),
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
TYPES = st.sampled_from(
    [
        "string",
        "integer",
        "number",
        "boolean",
        "null",
        "object",
        "array",
        "dict",
        "float",
        "tuple",
        "any",
        "strin",
        5,
    ]
)
DESCRIPTIONS = st.one_of(
    st.text(max_size=30), st.sampled_from(['"""', "a\\", "x'''y\"", "\x00\ud800", 'end"', 3])
)


def _schemas(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keywords = st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(TYPES, st.lists(TYPES, max_size=3)),
            "description": DESCRIPTIONS,
            "properties": st.one_of(st.dictionaries(NAMES, children, max_size=4), st.just([])),
            "required": st.one_of(st.lists(NAMES, max_size=3), st.just("x"), st.booleans()),
            "optional": st.one_of(st.booleans(), st.just("True"), st.lists(NAMES, max_size=2)),
            "items": st.one_of(children, st.lists(children, max_size=3)),
            "prefixItems": st.lists(children, max_size=3),
            "additionalProperties": children,
            "enum": st.one_of(st.lists(JSON, max_size=4), JSON_SCALARS),
            "const": JSON,
            "default": JSON,
            "anyOf": st.lists(children, max_size=3),
            "oneOf": st.lists(children, max_size=3),
            "allOf": st.lists(children, max_size=3),
            "$ref": st.sampled_from(
                ["#", "#/$defs/A", "#/definitions/B", "#/$defs/Missing", "http://x/y", "#anchor"]
            ),
            "$defs": st.dictionaries(st.sampled_from(["A", "B", "a-b"]), children, max_size=2),
            "definitions": st.dictionaries(st.sampled_from(["B"]), children, max_size=1),
            "minimum": st.one_of(
                st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=2)
            ),
            "exclusiveMaximum": st.one_of(st.booleans(), st.integers()),
            "maxLength": st.one_of(st.integers(-2, 5), st.floats(0, 3)),
            "pattern": st.sampled_from(["^a+$", "(", "[a-z]"]),
            "format": st.sampled_from(["date", "email"]),
            "nullable": st.booleans(),
        },
    )
    return st.one_of(st.booleans(), keywords)


SCHEMAS = st.recursive(
    st.one_of(st.booleans(), st.fixed_dictionaries({"type": TYPES})), _schemas, max_leaves=12
)
TOOL = st.fixed_dictionaries(
    {"name": NAMES},
    optional={
        "description": DESCRIPTIONS,
        "parameters": st.one_of(
            SCHEMAS,
            st.fixed_dictionaries(
                {
                    "type": st.just("dict"),
                    "properties": st.dictionaries(NAMES, SCHEMAS, max_size=5),
                    "required": st.lists(NAMES, max_size=3),
                }
            ),
        ),
        "outputSchema": SCHEMAS,
    },
)
MANIFESTS = st.lists(TOOL, min_size=1, max_size=3)


def _check(manifest_json: Any, arguments: dict[str, Any]) -> None:
    try:
        manifest = load_manifest(manifest_json)
        module = render_module(manifest)
        compact = render_compact(manifest)
    except ManifestError:
        return
    compile(compact, "compact.py", "exec")
    _, previous = install_runtime()
    try:
        tools = import_source(module)
        for tool in manifest.tools:
            typing.get_type_hints(getattr(tools, tool.python_name))
            typing.get_type_hints(getattr(tools.aio, tool.python_name))
    finally:
        restore_runtime(previous)
        sys.modules.pop("tools", None)
    for tool in manifest.tools:
        Draft202012Validator.check_schema(tool.input_schema)
        if tool.output_schema is not None:
            Draft202012Validator.check_schema(tool.output_schema)
        assert isinstance(manifest.validate(tool.name, arguments), list)
    assert render_module(load_manifest(manifest_json)) == module


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MANIFESTS, st.dictionaries(NAMES, JSON, max_size=3))
def test_generator_raises_only_manifest_error_and_compiles(
    manifest: Any, arguments: dict[str, Any]
) -> None:
    _check(manifest, arguments)


@settings(max_examples=100, deadline=None)
@given(st.one_of(JSON, st.text(max_size=40), st.binary(max_size=40)))
def test_arbitrary_input_raises_only_manifest_error(source: Any) -> None:
    with contextlib.suppress(ManifestError):
        load_manifest(source)


VALID_TYPES = st.sampled_from(
    ["string", "integer", "number", "boolean", "null", "dict", "float", "tuple", "any"]
)


def _valid(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(NAMES, children, min_size=1, max_size=4),
            },
            optional={
                "required": st.lists(NAMES, max_size=2),
                "description": DESCRIPTIONS.filter(lambda d: isinstance(d, str)),
            },
        ),
        st.fixed_dictionaries({"type": st.sampled_from(["array", "tuple"]), "items": children}),
        st.fixed_dictionaries(
            {"prefixItems": st.lists(children, min_size=1, max_size=3), "items": st.just(False)}
        ),
        st.fixed_dictionaries({"anyOf": st.lists(children, min_size=1, max_size=3)}),
        st.fixed_dictionaries({"type": st.lists(VALID_TYPES, min_size=1, max_size=3, unique=True)}),
        st.fixed_dictionaries(
            {"enum": st.lists(JSON_SCALARS, min_size=1, max_size=4)}, optional={"default": JSON}
        ),
        st.fixed_dictionaries({"type": st.just("object"), "additionalProperties": children}),
        st.fixed_dictionaries({"allOf": st.lists(children, min_size=1, max_size=2)}),
    )


VALID_SCHEMAS = st.recursive(st.fixed_dictionaries({"type": VALID_TYPES}), _valid, max_leaves=10)
VALID_MANIFESTS = st.lists(
    st.fixed_dictionaries(
        {
            "name": NAMES,
            "parameters": st.fixed_dictionaries(
                {
                    "type": st.just("dict"),
                    "properties": st.dictionaries(NAMES, VALID_SCHEMAS, max_size=4),
                },
                optional={
                    "required": st.lists(NAMES, max_size=3),
                    "$defs": st.dictionaries(
                        st.sampled_from(["A", "B"]), VALID_SCHEMAS, max_size=2
                    ),
                },
            ),
        },
        optional={"outputSchema": VALID_SCHEMAS},
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALID_MANIFESTS, st.dictionaries(NAMES, JSON, max_size=3))
def test_valid_schemas_render_and_compile(manifest: Any, arguments: dict[str, Any]) -> None:
    _check(manifest, arguments)
