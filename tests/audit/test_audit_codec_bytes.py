"""The audit codec's bytes are the ones the chain was hashed with: a cheaper way to write them
must spell every record exactly as ``json.dumps`` with the canonical arguments did.

Every entry hash of every stored chain depends on these bytes (`ptc audit verify` recomputes
them), so the references here are the original definitions, spelled out, and two entry hashes
that the original code computed, as constants.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from sandbox.audit._codec import admission_to_json, canonical, entry_hash, result_to_json
from sandbox.result import ExecutionStatus
from tests.audit.audit_support import admission, result


def _reference(value: object) -> str:
    """`canonical` as first written."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def _reference_hash(
    tenant: str, seq: int, kind: str, execution_id: str, at_us: int, payload: str, prev: str
) -> str:
    """`entry_hash` as first written."""
    import hashlib

    header = _reference(
        {
            "v": 1,
            "tenant": tenant,
            "seq": seq,
            "kind": kind,
            "execution_id": execution_id,
            "at_us": at_us,
            "prev": prev,
        }
    )
    return "sha256:" + hashlib.sha256((header + "\n" + payload).encode("utf-8")).hexdigest()


ODD_TEXT = [
    "",
    "acme",
    'quote " and backslash \\ and slash /',
    "new\nline\ttab\rreturn\x00nul\x01\x1f\x7f",
    "é ü ß 漢字 \u2028\u2029 \U0001f600",
    "s-" + "0f" * 16,
    "x" * 5000,
]


def _records() -> list[Any]:
    adm = admission("acme", script="print('é\\n')\nx = \"q\"\n")
    admitted = admission_to_json(adm, time.time()) | {"instance": "host-1"}
    plain = result_to_json(result(adm.execution_id, tools=()))
    rich = result_to_json(
        result(
            adm.execution_id,
            status=ExecutionStatus.LIMIT_EXCEEDED,
            tools=("search", "fetch", "search"),
            violations=("wall_time", "memory"),
            stdout="out ü \x00 \U0001f600\n" * 3,
        )
    )
    return [
        admitted,
        plain | {"execution_id": adm.execution_id},
        rich | {"execution_id": adm.execution_id},
        {"reason": "the server stopped", "instance": "h", "handed_over": True},
        {"through_seq": 12, "through_hash": "sha256:" + "0" * 64, "records": 3, "before": 1.5},
        {
            "floats": [0.1, 1e-7, 1e16, 1e22, -0.0, 2.5e-300, 123456789.123456789],
            "ints": [0, -1, 2**63, -(2**70)],
            "nested": {"b": [None, True, False], "a": {"z": 1, "é": 2, "A": 3}},
            "text": ODD_TEXT,
        },
    ]


@pytest.mark.parametrize("index", range(6))
def test_canonical_writes_the_bytes_json_dumps_wrote(index: int) -> None:
    record = _records()[index]
    assert canonical(record) == _reference(record)


def test_canonical_still_refuses_what_it_refused() -> None:
    for bad in (math.nan, math.inf, {"x": [-math.inf]}):
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            canonical(bad)
    with pytest.raises(TypeError, match="is not JSON serializable"):
        canonical({"x": object()})


@pytest.mark.parametrize("text", ODD_TEXT, ids=range(len(ODD_TEXT)))
def test_entry_hash_is_the_hash_of_the_canonical_header(text: str) -> None:
    for seq, at_us in ((1, 0), (41, 1_733_100_000_123_456), (2**62, 2**63 - 1), (-3, -7)):
        args = (text, seq, "completed", text, at_us, '{"a":1}', text)
        assert entry_hash(*args) == _reference_hash(*args)
        args = ("acme", seq, text, "e-1", at_us, text, "sha256:" + "ab" * 32)
        assert entry_hash(*args) == _reference_hash(*args)


def test_entry_hash_matches_hashes_the_original_code_computed() -> None:
    weird = 'e-é"\\\n\x01\U0001f600'
    prev = "sha256:" + "ab" * 32
    assert entry_hash("acme", 41, "completed", weird, 1733100000123456, '{"a":1}', prev) == (
        "sha256:7e8b672853c8c16fc3a9b2db525fdc32fb20d60e478d069903dfb8f5e8f5666b"
    )
    assert entry_hash("", 1, "admitted", "", 0, "", "") == (
        "sha256:10529c54fffef10811f4c8ae510797b4478bc186e27c4a334e1e1798b8068191"
    )


def test_entry_hash_refuses_a_number_that_is_not_an_int() -> None:
    with pytest.raises(TypeError):
        entry_hash("acme", 1.0, "admitted", "e", 0, "", "")  # type: ignore[arg-type]
