"""deploy/kubernetes/README.md's table of variants, written from what the variant tests saw.

The tests in `test_kubernetes_variants` run each variant from the server image and record what
they saw (a result's status and violation, the isolation list, the figures) through
`Outcomes.saw`, into `variants_outcomes.json` beside this file; the table's cells are the
templates below filled from it, written between the README's markers. So the table cannot say
what no test saw:

- a run of the variant tests checks each outcome it sees against the JSON (the figures, which
  vary from run to run, only against the bounds the test itself asserts) and fails, naming the
  cell, when the two differ;
- with ``PTC_K8S_RECORD=1`` it writes what it saw into the JSON instead, and the table with it;
- `test_kubernetes_manifests` (no Docker needed) fails when the README's table is not the
  rendering of the JSON, e.g. after a hand edit: ``python -m tests.deploy.variants_table``
  writes it again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["OUTCOMES", "Outcomes", "read_table", "render_table", "violation_text", "write_table"]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "deploy" / "kubernetes" / "README.md"
OUTCOMES = Path(__file__).with_name("variants_outcomes.json")
TABLE_START = (
    "<!-- variants: written from tests/deploy/variants_outcomes.json by"
    " `python -m tests.deploy.variants_table`; do not edit by hand -->"
)
TABLE_END = "<!-- end of variants -->"
RECORD = os.environ.get("PTC_K8S_RECORD") == "1"

# Each row: its name, then each variant's cell, a template over that variant's outcomes.
ROWS: list[tuple[str, dict[str, str]]] = [
    (
        "becomes Ready on",
        {
            "base": "a stock cluster (Kubernetes >= 1.33 for `hostUsers: false`): ready {ready}",
            "privileged": "a cluster that admits privileged pods (Pod Security level"
            " `privileged` in the namespace): ready {ready}",
        },
    ),
    (
        "container",
        {
            "base": "not privileged: SYS_ADMIN, SETUID, SETGID, KILL in a pod user namespace",
            "privileged": "`privileged: true` (every capability and device), no user namespace",
        },
    ),
    (
        "cgroups",
        {
            "base": "read-only: `--allow-degraded`, rlimits and host accounting",
            "privileged": "read-write: a cgroup per sandbox; without one the server refuses to"
            " start",
        },
    ),
    (
        "memory",
        {
            "base": "the host's sum of the sandbox's processes' resident memory and its `/tmp`,"
            " sampled every 50 ms, kills the sandbox past its limit (4 processes of 200 MiB"
            " under 256 MiB: {holders}, stopped at {holders_mib} MiB); `RLIMIT_AS` per process"
            " as the fast bound, with one malloc arena and smaller thread stacks so that threads"
            " do not use it up (8 threads and 4 subprocesses under 256 MiB: {threads}); past"
            " the pod's own limit (4 sandboxes each growing to 200 MiB under its own 256 MiB, the"
            " pod's limit lowered in place to {pod_oom_limit_mib} MiB), the kernel's OOM kill of"
            " a sandbox process; each sandbox hit ({pod_oom_hit} of the 4): {pod_oom_first}"
            " when the process killed was its first, and again {pod_oom_child} when it was a"
            " child the script survived; the others {pod_oom_others}",
            "privileged": "the sandbox's memory cgroup: all its processes together",
        },
    ),
    (
        "processes",
        {
            "base": "`RLIMIT_NPROC`, counted per uid, and each sandbox has a uid of its own (the"
            " server, root in the pod's user namespace, maps 57344-61439 in the zygote's): a"
            " fork bomb (processes 64) stops at its own {bomb_forks} forks ({bomb}) while"
            " another sandbox's 8 threads and 4 subprocesses run {bomb_neighbour}, the two as"
            " uids {bomb_uids}; in two pods (containers) giving the same uids, the same two at"
            " one uid: {two_pods_same_uid} (the kernel counts per user namespace and uid, and"
            " each server's zygote has its own)",
            "privileged": "pids cgroup, per sandbox",
        },
    ),
    (
        "CPU",
        {
            "base": "the host's sum of the sandbox's processes' CPU time, sampled every 50 ms"
            " (4 burning processes under 1 s: {burners}, at {burners_s} s); `RLIMIT_CPU` per"
            " process; no bandwidth cap",
            "privileged": "cpuacct usage for the whole sandbox, CFS bandwidth",
        },
    ),
    (
        "a memory bomb",
        {
            "base": "{memory_bomb} (the script's `MemoryError` under `RLIMIT_AS`)",
            "privileged": "{memory_bomb} (the cgroup's OOM kill, `observed` its peak)",
        },
    ),
    ("`isolation` of each result", {"base": "{isolation}", "privileged": "{isolation}"}),
    (
        "what the container is",
        {
            "base": "a boundary (pod user namespace: root in it is unprivileged on the node)",
            "privileged": "no boundary: only each sandbox isolates scripts; give these pods"
            " nodes of their own",
        },
    ),
]


def violation_text(result: dict[str, Any]) -> str:
    """A result as the table says it: its status, then its one violation's limit, action and
    evidence."""
    if result["status"] == "ok":
        return "`ok`"
    (violation,) = result["violations"]
    return (
        f"`{result['status']}`: `{violation['limit']}`, `{violation['action']}`,"
        f" evidence `{violation['evidence']}`"
    )


def _load() -> dict[str, dict[str, Any]]:
    if RECORD and not OUTCOMES.exists():
        return {}  # the first recording
    loaded: dict[str, dict[str, Any]] = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    return loaded


def render_table(outcomes: dict[str, dict[str, Any]] | None = None) -> str:
    """The table, its header and rows, from the outcomes (the JSON's by default)."""
    outcomes = _load() if outcomes is None else outcomes
    lines = [
        "| | the base (`deploy/kubernetes`) | `overlays/privileged` |",
        "| --- | --- | --- |",
    ]
    for name, cells in ROWS:
        row = [cells[variant].format(**outcomes[variant]) for variant in ("base", "privileged")]
        lines.append(f"| {name} | {row[0]} | {row[1]} |")
    return "\n".join(lines) + "\n"


def read_table() -> str:
    """What the README has between its markers."""
    text = README.read_text(encoding="utf-8")
    start = text.index(TABLE_START) + len(TABLE_START) + 1
    return text[start : text.index(TABLE_END)]


def write_table() -> None:
    """The README with its table rendered from the JSON."""
    text = README.read_text(encoding="utf-8")
    start = text.index(TABLE_START) + len(TABLE_START) + 1
    end = text.index(TABLE_END)
    README.write_text(text[:start] + render_table() + text[end:], encoding="utf-8")


class Outcomes:
    """What one variant's test saw, checked against the JSON, or recorded into it."""

    def __init__(self, variant: str) -> None:
        self.variant = variant

    def saw(self, key: str, value: Any, *, figure: bool = False) -> None:
        """One outcome: a figure (a time, a size, which of several sandboxes the kernel chose)
        is checked only by the test's own bounds; anything else must be what the table says."""
        if RECORD:
            outcomes = _load()
            outcomes.setdefault(self.variant, {})[key] = value
            OUTCOMES.write_text(json.dumps(outcomes, indent=2, sort_keys=True) + "\n", "utf-8")
            with contextlib.suppress(KeyError):  # until every cell has been seen once
                write_table()
            return
        if figure:
            return
        said = _load().get(self.variant, {}).get(key)
        assert said == value, (
            f"deploy/kubernetes/README.md's table of variants says {self.variant} {key}: {said!r},"
            f" the test saw {value!r}: rerun the variant tests with PTC_K8S_RECORD=1 to write"
            " what they see"
        )


if __name__ == "__main__":
    write_table()
    sys.stdout.write(f"{os.path.relpath(README)}: table of variants written\n")
