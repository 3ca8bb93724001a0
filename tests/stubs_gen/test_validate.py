"""`Manifest.validate`: BFCL's dialect on standard JSON Schema; messages name the argument."""

from __future__ import annotations

from typing import Any

import pytest

from stubs_gen import load_manifest

MANIFEST = load_manifest(
    [
        {
            "name": "weather",
            "parameters": {
                "type": "dict",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "default": "three"},
                    "temp": {"type": "float", "default": None},
                    "units": {"type": "string", "enum": ["c", "f"], "default": "kelvin"},
                    "point": {"type": "tuple", "items": {"type": "float"}},
                    "data": {"type": "any"},
                    "note": {"type": "string", "optional": True},
                    "opts": {
                        "type": "dict",
                        "properties": {"depth": {"type": "integer", "minimum": 1}},
                        "required": ["depth"],
                    },
                },
                "required": ["city", "note"],
            },
        }
    ]
)

CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("valid-minimal", {"city": "Oslo"}, []),
    ("float-accepts-int", {"city": "Oslo", "temp": 3}, []),
    ("tuple-is-array", {"city": "x", "point": [1, 2.5]}, []),
    ("any-is-anything", {"city": "x", "data": {"a": [1, None]}}, []),
    ("wrong-type", {"city": 42}, ["argument 'city': expected string, got 42"]),
    ("missing", {}, ["missing required argument 'city'"]),
    (
        "not-in-enum",
        {"city": "x", "units": "k"},
        ['argument \'units\': expected one of "c", "f", got "k"'],
    ),
    ("unknown-argument", {"city": "x", "zip": 1}, ["unexpected argument 'zip'"]),
    (
        "nested",
        {"city": "x", "opts": {"depth": 0}},
        ["argument 'opts.depth': 0 is less than the minimum of 1"],
    ),
    (
        "nested-missing",
        {"city": "x", "opts": {}},
        ["argument 'opts': missing required key 'depth'"],
    ),
    (
        "array-item",
        {"city": "x", "point": [1, "n"]},
        ["argument 'point[1]': expected number, got \"n\""],
    ),
]


@pytest.mark.parametrize(
    ("arguments", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_validate(arguments: dict[str, Any], expected: list[str]) -> None:
    assert MANIFEST.validate("weather", arguments) == expected


def test_unknown_tool_and_non_object_arguments() -> None:
    assert MANIFEST.validate("nope", {}) == ["unknown tool 'nope'"]
    assert MANIFEST.validate("weather", [1]) == ["arguments: expected object, got [1]"]  # type: ignore[arg-type]


def test_defaults_never_validated_nor_injected() -> None:
    spec = MANIFEST.tool("weather")
    assert spec is not None
    assert spec.input_schema["properties"]["units"]["default"] == "kelvin"
    assert spec.input_schema["required"] == ["city"]  # "optional": true wins over required
    assert MANIFEST.validate("weather", {"city": "x"}) == []


def test_extra_top_level_arguments_allowed_when_schema_says_so() -> None:
    manifest = load_manifest(
        [
            {
                "name": "t",
                "input_schema": {"type": "object", "properties": {}, "additionalProperties": True},
            }
        ]
    )
    assert manifest.validate("t", {"anything": 1}) == []


# -- the fast path agrees with jsonschema ------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from jsonschema import Draft202012Validator  # noqa: E402

from stubs_gen.validate import ArgumentValidator, _fast_accept  # noqa: E402

_SCALAR_TYPES = ["string", "integer", "number", "boolean", "null"]
_scalar_schema = st.one_of(
    st.sampled_from(_SCALAR_TYPES).map(lambda t: {"type": t}),
    st.lists(st.sampled_from(_SCALAR_TYPES), min_size=1, max_size=3, unique=True).map(
        lambda ts: {"type": ts, "description": "d"}
    ),
)
_flat_schema = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]), _scalar_schema, max_size=4
).flatmap(
    lambda props: st.lists(st.sampled_from(sorted(props) or ["a"]), unique=True).map(
        lambda req: {"type": "object", "properties": props, "required": req}
    )
)
_json_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1.0, -3.0, 0.0, 2.5]),
    st.text(max_size=5),
)


@settings(max_examples=400, deadline=None)
@given(_flat_schema, st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), _json_scalar))
def test_fast_path_accepts_only_what_jsonschema_accepts(schema, arguments):
    validator = ArgumentValidator(schema)
    strict = dict(schema, additionalProperties=False)
    fast = _fast_accept(strict)
    assert fast is not None  # these flat shapes all take the fast path
    expected_valid = Draft202012Validator(strict).is_valid(arguments)
    if fast(arguments):
        assert expected_valid, (schema, arguments)
    assert (validator.check(arguments) == []) == expected_valid


def test_fast_path_declines_other_shapes():
    assert (
        _fast_accept({"type": "object", "properties": {"a": {"type": "string", "enum": ["x"]}}})
        is None
    )
    assert _fast_accept({"type": "object", "properties": {"a": {"type": "array"}}}) is None
    assert _fast_accept({"type": "object", "properties": {}, "additionalProperties": True}) is None
