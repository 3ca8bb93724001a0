"""Tool definitions as published manifests write them: names that are Python identifiers but not
ASCII (kept, in the NFKC form Python compiles them to, and sent under the schema's own key), and
an ``enum`` of item values written at an array's level (read as its items' ``enum``, with one
warning). Through `load_manifest`, the generated module, `ptc stubs` and `ptc run` (on each
backend)."""

from __future__ import annotations

import json
import keyword
import re
import string
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stubs_gen import ManifestError, load_manifest, render_compact, render_module
from stubs_gen.names import python_name
from tests.ptc_cli import run_ptc as _ptc
from tests.real_world_manifest import LIGATURE, MANIFEST, SENT
from tests.stubs_gen.stubsgen_support import FakeRuntime, import_source

ROOT = Path(__file__).resolve().parents[2]
ARRAY_ENUM_WARNING = (
    "tool 'cotizar_vehículo' at $[0].parameters.properties.acciones.enum: an array's 'enum' "
    "lists item values, which no array matches; read as the enum of its items"
)
# The script writes the names as the model was shown them, the ligature included.
SCRIPT = f"""\
import tools
print(tools.cotizar_vehículo(año_vehiculo=2019, {LIGATURE}="F-1", acciones=["view"]))
try:
    tools.cotizar_vehículo(año_vehiculo=2019, acciones=["fly"])
except tools.InvalidArguments as exc:
    print("invalid:", exc)
"""
REFUSED = 'argument \'acciones[0]\': expected one of "view", "edit", got "fly"'


@pytest.mark.parametrize(
    ("name", "ident"),
    [
        ("año_vehiculo", "año_vehiculo"),  # an identifier: kept as it is
        ("日本語", "日本語"),
        (LIGATURE, "ficha"),  # an identifier Python compiles to its NFKC form
        ("\uff49\uff46", "if_"),  # fullwidth "if": NFKC "if", a keyword
        ("x²", "x2"),  # not an identifier, but its NFKC form is
        ("año vehiculo", "año_vehiculo"),  # only the character that cannot be kept is mapped
        ("send-email", "send_email"),  # ASCII names map exactly as before
        ("2nd", "_2nd"),
        ("class", "class_"),
        ("", "_"),
    ],
)
def test_python_names_keep_every_identifier(name: str, ident: str) -> None:
    assert python_name(name) == ident


@given(st.text(alphabet=string.printable, max_size=12))
def test_ascii_names_map_as_they_always_did(name: str) -> None:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)  # the rule before non-ASCII names were kept
    if not ident or ident[0].isdigit():
        ident = "_" + ident
    assert python_name(name) == (ident + "_" if keyword.iskeyword(ident) else ident)


@given(st.text(max_size=12))
def test_every_python_name_is_an_identifier_python_compiles_to_itself(name: str) -> None:
    ident = python_name(name)
    assert ident.isidentifier() and not keyword.iskeyword(ident)
    assert unicodedata.normalize("NFKC", ident) == ident
    if name.isidentifier() and not keyword.iskeyword(unicodedata.normalize("NFKC", name)):
        assert ident == unicodedata.normalize("NFKC", name)  # an identifier is kept


def test_the_stub_keeps_non_ascii_names_and_sends_the_original_keys(runtime: FakeRuntime) -> None:
    manifest = load_manifest(MANIFEST)
    assert manifest.warnings == (ARRAY_ENUM_WARNING,)
    assert manifest.names == {"cotizar_vehículo": "cotizar_vehículo"}
    (spec,) = manifest.tools
    assert spec.param_names == {
        "año_vehiculo": "año_vehiculo",
        "ficha": LIGATURE,
        "acciones": "acciones",
    }
    source = render_module(manifest)
    assert (
        "def cotizar_vehículo(*, año_vehiculo: int, ficha: str=_OMITTED, "
        "acciones: list[_t.Literal['view', 'edit']]=_OMITTED) -> _t.Any:" in source
    )
    assert f"ficha: Sent as '{LIGATURE}'. Optional." in source
    compact = render_compact(manifest)
    assert (
        "def cotizar_vehículo(*, año_vehiculo: int, ficha: str=..., acciones: list[Literal['view', 'edit']]=...):"
        in compact
    )
    tools = import_source(source)
    namespace = {"tools": tools}
    exec(
        compile(
            f'tools.cotizar_vehículo(año_vehiculo=2019, {LIGATURE}="F-1", acciones=["view"])',
            "s",
            "exec",
        ),
        namespace,
    )
    assert runtime.calls == [("sync", "cotizar_vehículo", SENT)]
    # The arguments the stub sends are the ones the schema declares: they validate.
    assert manifest.validate("cotizar_vehículo", SENT) == []
    assert manifest.validate("cotizar_vehículo", {"año_vehiculo": 1, "acciones": ["fly"]}) == [
        REFUSED
    ]


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (
            [{"name": "t", "parameters": {"properties": {LIGATURE: {}, "ficha": {}}}}],
            f"parameters '{LIGATURE}' and 'ficha' both map to the Python name 'ficha'",
        ),
        (
            [{"name": "\ufb01nd"}, {"name": "find"}],
            "tools '\ufb01nd' and 'find' both map to the Python name 'find'",
        ),
        (
            [{"name": "t", "parameters": {"properties": {"a\u00f1o": {}, "an\u0303o": {}}}}],
            "parameters 'a\u00f1o' and 'an\u0303o' both map to the Python name 'a\u00f1o' "
            "('a\\xf1o' and 'an\\u0303o': one name in two Unicode forms)",
        ),
    ],
    ids=["ligature-parameter", "ligature-tool", "decomposed-parameter"],
)
def test_names_equal_under_nfkc_collide(tools: list[Any], message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest(tools)
    assert message in str(caught.value)


def _property(schema: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    manifest = load_manifest([{"name": "t", "parameters": {"properties": {"p": schema}}}])
    return manifest.tools[0].input_schema["properties"]["p"], manifest.warnings


def test_array_level_enum_readings() -> None:
    where = "tool 't' at $[0].parameters.properties.p.enum: an array's 'enum' lists item values"
    moved, warnings = _property({"type": "array", "enum": ["a", "b"]})
    assert moved == {"type": "array", "items": {"enum": ["a", "b"]}}
    assert warnings == (f"{where}, which no array matches; read as the enum of its items",)
    kept, warnings = _property({"type": "array", "items": {"enum": ["x"]}, "enum": ["a"]})
    assert kept == {"type": "array", "items": {"enum": ["x"]}}
    assert warnings == (f"{where}, which no array matches; dropped: the items' own enum stands",)
    # A true array-level enum (its values are arrays) and tuples are left as written.
    for schema in (
        {"type": "array", "items": {"type": "string"}, "enum": [["a"], ["b", "c"]]},
        {"type": "array", "prefixItems": [{"type": "string"}], "enum": ["a"]},
        {"type": "string", "enum": ["a"]},
    ):
        assert _property(schema) == (schema, ())


def test_cli_stubs_keeps_the_names_and_warns_once(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(MANIFEST), encoding="utf-8")
    done = _ptc("stubs", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"ptc stubs: warning: {ARRAY_ENUM_WARNING}\n"
    assert "def cotizar_vehículo(*, año_vehiculo: int, ficha: str=_OMITTED," in done.stdout
    payload = json.loads(_ptc("stubs", str(path), "--json").stdout)
    assert payload["warnings"] == [ARRAY_ENUM_WARNING]
    assert payload["names"] == {"cotizar_vehículo": "cotizar_vehículo"}


@pytest.mark.parametrize(
    "backend",
    [
        "process",
        pytest.param("docker", marks=pytest.mark.requires_docker),
        pytest.param("gvisor", marks=[pytest.mark.requires_docker, pytest.mark.requires_gvisor]),
    ],
)
def test_cli_run_calls_with_the_names_the_model_was_shown(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(MANIFEST), encoding="utf-8")
    done = _ptc("run", "-", "--tools", str(path), "--json", "--backend", backend, stdin=SCRIPT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["stderr"]) == ("ok", "")
    assert result["stdout"] == f"{SENT!r}\ninvalid: {REFUSED}\n"
    calls = [(c["tool"], c["arguments"], c["status"], c.get("error")) for c in result["calls"]]
    assert calls == [
        ("cotizar_vehículo", SENT, "ok", None),
        (
            "cotizar_vehículo",
            {"año_vehiculo": 2019, "acciones": ["fly"]},
            "invalid_arguments",
            REFUSED,
        ),
    ]
