"""The limit table, the proto `Limits`, docs/limits.md and the violation order agree.

Every limit in `sandbox.limits.LIMIT_SPECS` has: a proto `Limits` field of the same name as its
canonical field, carrying its unit (``_ms`` for times, ``_bytes`` for sizes, none for counts),
optional (unset means inherit) and commented with the limit's name; a row in `Limits` and
`ResolvedLimits`, the defaults and the ceilings; a row in the module docstring's table and in
the limits table of docs/limits.md; and a place in `VIOLATION_ORDER`, which that page's Limits section
lists in the same order. Nothing is in one and missing from another.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

import sandbox.limits
import sandbox.message_bounds
from sandbox._proto import sandbox_pb2 as pb
from sandbox.limits import CEILINGS, DEFAULTS, LIMIT_SPECS, Limits, ResolvedLimits
from sandbox.result import VIOLATION_ORDER

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto" / "ptc" / "sandbox" / "v1" / "sandbox.proto"
LIMITS_DOC = ROOT / "docs" / "limits.md"
NAMES = [spec.name for spec in LIMIT_SPECS]
# Violations beyond resources: not limits a request sets, but listed in the order.
CHECKS = {"expected_calls", "protocol"}
SUFFIX = {"s": "_ms", "bytes": "_bytes"}


def _doc_section(title: str) -> str:
    text = LIMITS_DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n#", start + 1)  # up to the next heading of any level
    return text[start : end if end >= 0 else len(text)]


def _proto_limits_comments() -> dict[str, str]:
    """Each field of ``message Limits`` with the comment lines just above it."""
    body = re.search(r"message Limits \{(.*?)\n\}", PROTO.read_text(), re.S)
    assert body is not None, "no message Limits in the proto"
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in body.group(1).splitlines():
        line = line.strip()
        if line.startswith("//"):
            pending.append(line)
        elif match := re.match(r"(?:optional\s+)?\w+\s+(\w+)\s*=\s*\d+;", line):
            comments[match.group(1)] = " ".join(pending)
            pending = []
    return comments


def test_names_and_fields_are_unique() -> None:
    assert len(set(NAMES)) == len(NAMES)
    assert len({spec.field for spec in LIMIT_SPECS}) == len(LIMIT_SPECS)
    assert not CHECKS & set(NAMES)


@pytest.mark.parametrize("spec", LIMIT_SPECS, ids=NAMES)
def test_field_carries_its_unit(spec: sandbox.limits.LimitSpec) -> None:
    suffix = SUFFIX.get(spec.unit)
    if suffix is None:  # a count: no unit suffix
        assert spec.unit == "count" and spec.scale == 1
        assert not spec.field.endswith(("_ms", "_s", "_bytes")), spec.field
    else:
        assert spec.field.endswith(suffix), (spec.field, spec.unit)
        assert spec.scale == (1000 if spec.unit == "s" else 1)
    # The name is the field less its unit: what the command line and violations use.
    assert spec.field in (spec.name, spec.name + "_ms", spec.name + "_bytes"), spec


def test_proto_limits_has_exactly_one_optional_uint64_field_per_limit() -> None:
    fields = {f.name: f for f in pb.Limits.DESCRIPTOR.fields}
    assert sorted(fields) == sorted(spec.field for spec in LIMIT_SPECS)
    for field in fields.values():
        assert field.type == FieldDescriptor.TYPE_UINT64, field.name
        assert field.has_presence, f"{field.name}: unset must mean inherit"
    # The generated code is that of the .proto file (make gen), and each field's comment
    # names its limit.
    comments = _proto_limits_comments()
    assert sorted(comments) == sorted(fields)
    for spec in LIMIT_SPECS:
        assert f"`{spec.name}`" in comments[spec.field], (spec.field, comments[spec.field])


def test_dataclasses_defaults_and_ceilings_have_every_limit() -> None:
    fields = [spec.field for spec in LIMIT_SPECS]
    assert [f.name for f in dataclasses.fields(Limits)] == fields
    assert [f.name for f in dataclasses.fields(ResolvedLimits)] == fields
    for spec in LIMIT_SPECS:
        assert 0 < DEFAULTS.value(spec.name) <= CEILINGS.value(spec.name), spec.name


def test_module_docstring_table_has_every_limit() -> None:
    doc = sandbox.limits.__doc__ or ""
    rows = {
        cells[0]: cells[1]
        for line in doc.splitlines()
        if line.startswith("| ") and not line.startswith("| name")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert rows == {spec.name: spec.field for spec in LIMIT_SPECS}


def test_readme_limits_table_has_a_row_per_limit() -> None:
    section = _doc_section("Limits")
    named: list[str] = []
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            named += re.findall(r"`(\w+)`", first_cell)
    assert sorted(named) == sorted(NAMES)


def test_violation_order_has_every_limit_and_check_once() -> None:
    assert len(set(VIOLATION_ORDER)) == len(VIOLATION_ORDER)
    assert set(VIOLATION_ORDER) == set(NAMES) | CHECKS


def test_readme_lists_the_violation_order() -> None:
    section = _doc_section("Limits")
    # "... in a fixed order, ...: `protocol, wall_time, ...`" (one code span, or one per name).
    match = re.search(r"in a fixed order[^:]*:\s*((?:`[\w,\s]+`,?\s*)+)", section)
    assert match is not None, "docs/limits.md's Limits section does not list the violation order"
    documented = re.findall(r"\w+", match.group(1))
    assert tuple(documented) == VIOLATION_ORDER


_UNITS = {"byte": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "ms": 1, "s": 1000, "": 1}


def _canonical(text: str) -> int:
    number, _, unit = text.strip().replace(",", "").partition(" ")
    return int(number) * _UNITS[unit]


def test_readme_limits_table_shows_each_minimum_and_ceiling() -> None:
    section = _doc_section("Limits")
    header = next(line for line in section.splitlines() if line.startswith("| name"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    low, high = columns.index("minimum"), columns.index("maximum (default ceiling)")
    seen: dict[str, tuple[int, int]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            names = re.findall(r"`(\w+)`", cells[0])
            lows, highs = cells[low].split(" / "), cells[high].split(" / ")
            # One value for a group (`stdout_bytes` / `stderr_bytes`) applies to each.
            lows, highs = (v * len(names) if len(v) == 1 else v for v in (lows, highs))
            for name, minimum, maximum in zip(names, lows, highs, strict=True):
                seen[name] = (_canonical(minimum), _canonical(maximum))
    assert seen == {spec.name: (spec.minimum, CEILINGS.value(spec.name)) for spec in LIMIT_SPECS}
    bound = sandbox.message_bounds.request_bytes_bound(CEILINGS)
    assert f"({bound // 1024**2} MiB)" in section and bound % 1024**2 == 0
