"""The history `bench.store_scale` fills a store with: what one execution of the big tenant
looks like, and the two ways it is written (the store's API, and the same code in batches).

An execution carries a 6 KB manifest of 12 tools and a script of about 1.3 KB: in the ``repeat``
workload one of `SCRIPTS` (an agent's history, where a retry, a scheduled run or a template
filled in again repeats its script verbatim), in ``unique`` one of its own. Every tenth
execution is a cell of an old 20-cell session, every fourth has an idempotency key ``key-N``,
every 50th hit a memory limit, every 100th also called ``fetch``. `fill_bulk` runs the store's
own admission and completion code (`_admit_in`, `_complete_in`) for `BULK` executions under one
lock of the chain head: the same entries, rows and hashes as `fill_api`, a transaction apart.
"""

from __future__ import annotations

import json

from sandbox.audit import Admission, SqlAuditStore
from sandbox.audit._codec import canonical, result_to_json
from sandbox.limits import DEFAULTS
from sandbox.result import (
    CallRecord,
    CallStatus,
    Evidence,
    ExecutionResult,
    ExecutionStatus,
    Usage,
    Violation,
)

__all__ = ["BULK", "MANIFEST", "WORKLOADS", "admission", "fill_api", "fill_bulk", "result"]

BULK = 2000
WORKLOADS = ("repeat", "unique")
SCRIPTS = 16  # distinct scripts of the ``repeat`` workload
_TOOL = {
    "type": "function",
    "function": {
        "name": "{name}",
        "description": "Looks {name} up in the catalogue and returns the matching entries, newest "
        "first, each with its identifier, title, owner and the time it last changed.",
        "parameters": {
            "type": "object",
            "properties": {
                "q": {"type": "string", "description": "what to look for (words or a phrase)"},
                "n": {"type": "integer", "description": "how many entries at most", "minimum": 1},
                "since": {"type": "string", "description": "only entries changed after (ISO)"},
                "owner": {"type": "string", "description": "only this owner's entries"},
            },
            "required": ["q"],
        },
    },
}
MANIFEST = canonical(
    [
        json.loads(json.dumps(_TOOL).replace("{name}", name))
        for name in ("search", "fetch", *(f"tool_{k:02d}" for k in range(10)))
    ]
)
_SCRIPT = """import tools

# variant {n}: rank what four searches found, fetch the best, report
queries = ["open invoices", "overdue invoices", "disputed charges", "refunds this quarter"]
found = {{}}
for q in queries:
    hits = tools.search(q=q, n={k})
    for hit in hits.get("hits", []):
        found.setdefault(hit["id"], {{"queries": [], "score": 0.0}})
        found[hit["id"]]["queries"].append(q)
        found[hit["id"]]["score"] += float(hit.get("score", 0.0))

ranked = sorted(found.items(), key=lambda item: (-item[1]["score"], item[0]))
details = []
for key, seen in ranked[:10]:
    detail = tools.fetch(id=key)
    if detail.get("status") == "closed":
        continue
    details.append(
        {{
            "id": key,
            "title": detail.get("title", ""),
            "owner": detail.get("owner", "unknown"),
            "amount": round(float(detail.get("amount", 0)), 2),
            "matched": len(seen["queries"]),
        }}
    )

total = sum(d["amount"] for d in details)
owners = sorted({{d["owner"] for d in details}})
print(f"{{len(details)}} open items over {{len(owners)}} owners, total {{total:.2f}}")
for d in details:
    line = f"- {{d['id']}} {{d['title'][:40]}} ({{d['owner']}}): {{d['amount']:.2f}}"
    print(line, f"({{d['matched']}} queries)")
"""


def script(workload: str, i: int) -> str:
    """About 1.3 KB of script: one of `SCRIPTS` (``repeat``) or execution ``i``'s own."""
    return _SCRIPT.format(n=i % SCRIPTS if workload == "repeat" else i, k=i % 7 + 1)


def admission(
    tenant: str, i: int, session: str | None = None, workload: str = "repeat"
) -> Admission:
    labels = {"agent": "bench"}
    if session is not None:
        labels["ptc.session_id"] = session
    elif i % 10 == 0:
        # Every tenth execution is a cell of an old session of 20 cells (200 executions
        # apart): a session's size stays the same whatever the history's.
        labels["ptc.session_id"] = f"s-{i // 200:06x}"
    return Admission(
        execution_id=f"{tenant}-{i:09d}",
        tenant=tenant,
        script=script(workload, i),
        manifest_json=MANIFEST,
        manifest_sha256="ab" * 32,
        backend="process",
        policy="none",
        effective_limits=DEFAULTS,
        labels=labels,
        admitted_at=1_700_000_000.0 + i,
        idempotency_key=f"key-{i}" if i % 4 == 0 else "",
    )


def result(execution_id: str, i: int) -> ExecutionResult:
    tools = ["search", "search"] + (["fetch"] if i % 100 == 0 else [])
    violated = i % 50 == 7
    return ExecutionResult(
        execution_id=execution_id,
        status=ExecutionStatus.LIMIT_EXCEEDED if violated else ExecutionStatus.OK,
        exit_code=-9 if violated else 0,
        stdout="{'hits': [1, 2, 3]}\n" * 2,
        stderr="",
        calls=[
            CallRecord(
                seq=n + 1,
                tool=tool,
                arguments={"q": "ab"[n % 2], "n": i % 7},
                status=CallStatus.OK,
                result={"hits": [1, 2, 3]},
                error=None,
                start_offset_s=0.001 * n,
                duration_s=0.0004,
            )
            for n, tool in enumerate(tools)
        ],
        violations=(
            [Violation("memory", 2.7e8, 2.9e8, "bytes", "killed", "oom", evidence=Evidence.KERNEL)]
            if violated
            else []
        ),
        usage=Usage(wall_time_s=0.05, cpu_time_s=0.03, peak_memory_bytes=1 << 24, tool_calls=2),
        backend="process",
        isolation=["userns", "netns"],
        effective_limits=DEFAULTS,
        started_at=1000.0,
        finished_at=1000.05,
    )


def fill_api(
    store: SqlAuditStore, tenant: str, start: int, stop: int, workload: str = "repeat"
) -> None:
    for i in range(start, stop):
        made = admission(tenant, i, workload=workload)
        store.admit(made)
        store.complete(made.execution_id, result(made.execution_id, i))


def fill_bulk(
    store: SqlAuditStore, tenant: str, start: int, stop: int, workload: str = "repeat"
) -> None:
    """The store's own admission and completion code, ``BULK`` executions per transaction."""
    db = store._db
    for first in range(start, stop, BULK):
        with db.write() as tx:
            head = store._lock_head(tx, tenant)
            for i in range(first, min(first + BULK, stop)):
                made = admission(tenant, i, workload=workload)
                data, payload = store._admission_payload(made)
                entry = store._admit_in(tx, made, data, payload, head)
                done = result_to_json(result(made.execution_id, i))
                done["execution_id"] = made.execution_id
                record = (tenant, made.execution_id)
                entry = store._complete_in(
                    tx, record, (entry.seq, entry.entry_hash), done, canonical(done), "running"
                )
                head = (entry.seq, entry.entry_hash)
