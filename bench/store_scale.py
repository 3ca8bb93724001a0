"""The audit store at 10 thousand, 100 thousand and a million executions: is every request flat?

    .venv/bin/python -m bench.store_scale [--sizes 2000,20000] [--engines sqlite,postgres]
        [--rounds 15] [--api-up-to 100000] [--pg-url URL]

One store per engine (a SQLite file in a temporary directory; a fresh schema of the PostgreSQL
server ``--pg-url`` or ``$PTC_TEST_POSTGRES_URL`` names, dropped afterwards) is filled with one
big tenant's executions up to each size in turn, plus a small second tenant, and at each size
the same calls are timed (``--rounds`` each, p50 and p95):

- ``admission``, ``completion``: `admit` and `complete` of a new execution;
- ``get by id``: `get` of an execution from the middle of the history;
- ``holder of a session``: `holder` (which server holds a session);
- ``idempotency look-up``: `by_key` of a key from the middle of the history;
- ``list: ...``: a page of 50 with no filter, by status, by a tool most executions call, by a
  tool few call, by violation, by session; and a page of the small tenant;
- ``a session's cells``: every page of a 20-cell session's executions, as a rebuild reads them;
- ``checkpoint, 1000 new``: `CheckpointPublisher.publish_once` after 1,000 new executions
  (``--new``);
- ``verify since checkpoint``: `verify` from that checkpoint's frontier after 1,000 more (what
  ``ptc audit verify --since-checkpoint`` does after checking the checkpoint's signature).

Executions are filled through `admit` and `complete`, one transaction each, up to
``--api-up-to``; past it, through the same code a transaction at a time for 2,000 executions
(`_admit_in` and `_complete_in` under one lock of the chain head: the same entries, rows and
hashes), and the whole chain is verified at the end of the run. Prints each path's growth from
the smallest size to the largest (target at most 1.3x) and the store's bytes per execution
(SQLite: the file after a WAL checkpoint; PostgreSQL: every table with its indexes).

``--workloads`` (each a store of its own): ``repeat``, an agent's history, where every
execution carries the same 6 KB manifest and one of 16 scripts of about 1.3 KB (a retry, a
scheduled run or a template filled in again repeats its script verbatim); ``unique``, the same
manifest with a script no other execution has. The bytes per execution of the two bound what
storing a repeated script or manifest once saves.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.harness import Report, bench_parser, percentile
from sandbox.audit import Admission, AuditQuery, SqlAuditStore, open_store
from sandbox.audit._codec import canonical, result_to_json
from sandbox.audit.publisher import CheckpointPublisher
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

BIG, SMALL = "big", "small"
SMALL_SIZE = 500
BULK = 2000
TARGET = 1.3
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


def _script(workload: str, i: int) -> str:
    """About 1.3 KB of script: one of `SCRIPTS` (``repeat``) or execution ``i``'s own."""
    return _SCRIPT.format(n=i % SCRIPTS if workload == "repeat" else i, k=i % 7 + 1)


def _admission(
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
        script=_script(workload, i),
        manifest_json=MANIFEST,
        manifest_sha256="ab" * 32,
        backend="process",
        policy="none",
        effective_limits=DEFAULTS,
        labels=labels,
        admitted_at=1_700_000_000.0 + i,
        idempotency_key=f"key-{i}" if i % 4 == 0 else "",
    )


def _result(execution_id: str, i: int) -> ExecutionResult:
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


def _fill_api(
    store: SqlAuditStore, tenant: str, start: int, stop: int, workload: str = "repeat"
) -> None:
    for i in range(start, stop):
        admission = _admission(tenant, i, workload=workload)
        store.admit(admission)
        store.complete(admission.execution_id, _result(admission.execution_id, i))


def _fill_bulk(
    store: SqlAuditStore, tenant: str, start: int, stop: int, workload: str = "repeat"
) -> None:
    """The store's own admission and completion code, ``BULK`` executions per transaction."""
    db = store._db
    for first in range(start, stop, BULK):
        with db.write() as tx:
            head = store._lock_head(tx, tenant)
            for i in range(first, min(first + BULK, stop)):
                admission = _admission(tenant, i, workload=workload)
                data, payload = store._admission_payload(admission)
                entry = store._admit_in(tx, admission, data, payload, head)
                done = result_to_json(_result(admission.execution_id, i))
                done["execution_id"] = admission.execution_id
                record = (tenant, admission.execution_id)
                entry = store._complete_in(
                    tx, record, (entry.seq, entry.entry_hash), done, canonical(done), "running"
                )
                head = (entry.seq, entry.entry_hash)


@dataclass
class _Engine:
    name: str
    target: str
    size_of: Callable[[], int]
    store: SqlAuditStore
    workload: str = "repeat"
    filled: int = 0
    next_id: int = 10**8  # ids of executions made while timing, apart from the history
    times: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    bytes_per: dict[int, float] = field(default_factory=dict)


def _timed(rounds: int, call: Callable[[int], Any]) -> list[float]:
    samples = []
    for n in range(rounds):
        started = time.perf_counter()
        call(n)
        samples.append(time.perf_counter() - started)
    return samples


def _measure(engine: _Engine, size: int, rounds: int, key: Ed25519PrivateKey, new: int) -> None:
    store = engine.store
    rng = random.Random(size)
    times: dict[str, list[float]] = {}
    fresh: list[str] = []

    workload = engine.workload

    def admit(_: int) -> None:
        admission = _admission(BIG, engine.next_id, workload=workload)
        engine.next_id += 1
        fresh.append(admission.execution_id)
        store.admit(admission)

    times["admission"] = _timed(rounds, admit)
    times["completion"] = _timed(rounds, lambda n: store.complete(fresh[n], _result(fresh[n], 1)))
    middle = [rng.randrange(size // 4, size // 4 * 3) for _ in range(rounds)]
    times["get by id"] = _timed(rounds, lambda n: store.get(BIG, f"{BIG}-{middle[n]:09d}"))
    keyed = [m - m % 4 for m in middle]
    times["idempotency look-up"] = _timed(rounds, lambda n: store.by_key(BIG, f"key-{keyed[n]}"))
    session = f"s-{size:x}"[:12]
    store.admit(
        replace(_admission(BIG, engine.next_id, workload=workload), execution_id=session, labels={})
    )
    engine.next_id += 1
    store.heartbeat("127.0.0.1:1", 600)
    times["holder of a session"] = _timed(rounds, lambda n: store.holder(BIG, session))
    for _ in range(20):  # the session's cells, among the newest records
        cell = _admission(BIG, engine.next_id, session=session, workload=workload)
        engine.next_id += 1
        store.admit(cell)
        store.complete(cell.execution_id, _result(cell.execution_id, 1))
        _fill_api(
            store, BIG, engine.next_id, engine.next_id + 3, workload
        )  # other executions between
        engine.next_id += 3
    queries = {
        "list: no filter": AuditQuery(limit=50),
        "list: status": AuditQuery(status="limit_exceeded", limit=50),
        "list: a tool most call": AuditQuery(tool="search", limit=50),
        "list: a tool few call": AuditQuery(tool="fetch", limit=50),
        "list: violation": AuditQuery(violation="memory", limit=50),
        "list: an old session": AuditQuery(session_id="s-000007", limit=50),
    }
    for label, query in queries.items():
        times[label] = _timed(rounds, _lister(store, query))
    times["list: the small tenant"] = _timed(rounds, lambda n: store.list(SMALL, AuditQuery()))

    def cells(_: int) -> None:
        token, seen = None, 0
        while True:
            page, token = store.list(BIG, AuditQuery(session_id=session, limit=8, page_token=token))
            seen += len(page)
            if token is None:
                break
        assert seen == 20, seen

    times["a session's cells"] = _timed(rounds, cells)
    with tempfile.TemporaryDirectory() as directory:
        publisher = CheckpointPublisher(store, key, directory=directory)
        publisher.publish_once()  # the tenants' first checkpoints: the whole trees, once
        checkpoint_times, verify_times = [], []
        for _ in range(max(2, rounds // 5)):
            _fill_api(store, BIG, engine.next_id, engine.next_id + new, workload)
            engine.next_id += new
            started = time.perf_counter()
            (signed,) = publisher.publish_once()
            checkpoint_times.append(time.perf_counter() - started)
            _fill_api(store, BIG, engine.next_id, engine.next_id + new, workload)
            engine.next_id += new
            started = time.perf_counter()
            frontier = store.frontier_at(BIG, signed.tree_size)
            assert frontier is not None and frontier.root() == signed.root_hash
            assert frontier.proves_last()
            report = store.verify(BIG, (signed.tree_size, frontier.last_hash))
            verify_times.append(time.perf_counter() - started)
            assert report.ok and report.records == new, report
        times[f"checkpoint, {new} new"] = checkpoint_times
        times["verify since checkpoint"] = verify_times
    engine.times[size] = times
    count = engine.filled + SMALL_SIZE + (engine.next_id - 10**8)
    engine.bytes_per[size] = engine.size_of() / count


def _lister(store: SqlAuditStore, query: AuditQuery) -> Callable[[int], Any]:
    return lambda _: store.list(BIG, query)


@contextlib.contextmanager
def _sqlite() -> Iterator[tuple[str, Callable[[str], int]]]:
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "audit.sqlite3")

        def size(_: str) -> int:
            conn = sqlite3.connect(path)
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()
            return os.path.getsize(path)

        yield path, size


@contextlib.contextmanager
def _postgres(url: str) -> Iterator[tuple[str, Callable[[str], int]]]:
    import psycopg

    schema = f"bench_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in url else "?"
    target = f"{url}{separator}options=-csearch_path%3D{schema}"

    def size(_: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT SUM(pg_total_relation_size(c.oid)) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()
        return int(row[0] if row else 0)

    try:
        yield target, size
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def run_engine(
    report: Report,
    name: str,
    target: str,
    size_of: Callable[[str], int],
    sizes: list[int],
    rounds: int,
    api_up_to: int,
    new: int = 1000,
    workload: str = "repeat",
) -> _Engine:
    store = open_store(target, instance="bench")
    engine = _Engine(f"{name} ({workload})", target, lambda: size_of(target), store, workload)
    name = engine.name
    key = Ed25519PrivateKey.generate()
    try:
        _fill_api(store, SMALL, 0, SMALL_SIZE)
        for size in sizes:
            started = time.perf_counter()
            api_stop = min(size, max(api_up_to, engine.filled))
            _fill_api(store, BIG, engine.filled, api_stop, workload)
            _fill_bulk(store, BIG, api_stop, size, workload)
            report.print(
                f"{name}: filled to {size:,} executions in {time.perf_counter() - started:.1f} s "
                f"({api_stop - engine.filled:,} through admit/complete, {size - api_stop:,} in "
                f"batches)"
            )
            engine.filled = size
            _measure(engine, size, rounds, key, new)
            report.section(f"{name}, {size:,} executions of {BIG} (+{SMALL_SIZE} of {SMALL})")
            for label, samples in engine.times[size].items():
                report.timings(label, samples)
            report.figure("bytes per execution", engine.bytes_per[size], "B", fmt=".0f")
        started = time.perf_counter()
        verified = store.verify()
        report.print(
            f"{name}: the whole store verifies: {verified.ok} ({verified.records:,} records, "
            f"{time.perf_counter() - started:.1f} s)"
        )
        assert verified.ok, verified.problems[:5]
    finally:
        store.close()
    return engine


def growth(report: Report, engine: _Engine) -> dict[str, float]:
    """p50 at the largest size over p50 at the smallest, per path."""
    sizes = sorted(engine.times)
    low, high = engine.times[sizes[0]], engine.times[sizes[-1]]
    report.section(
        f"{engine.name}: growth of p50 from {sizes[0]:,} to {sizes[-1]:,} executions "
        f"(target at most {TARGET}x)"
    )
    ratios = {}
    for label in low:
        ratio = percentile(high[label], 0.5) / max(percentile(low[label], 0.5), 1e-9)
        ratios[label] = ratio
        report.figure(label, ratio, "x", note="over" if ratio > TARGET else "")
    return ratios


def main(report: Report, args: Any) -> None:
    sizes = sorted(int(s.replace("_", "")) for s in args.sizes.split(","))
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"--workloads: unknown workload {unknown[0]!r} ({', '.join(WORKLOADS)})")
    for name, workload in ((n, w) for n in args.engines.split(",") for w in workloads):
        if name == "sqlite":
            context = _sqlite()
        elif name == "postgres":
            url = args.pg_url or os.environ.get("PTC_TEST_POSTGRES_URL", "")
            if not url:
                report.print("postgres: skipped (no --pg-url and no $PTC_TEST_POSTGRES_URL)")
                continue
            context = _postgres(url)
        else:
            raise SystemExit(f"--engines: unknown engine {name!r} (sqlite, postgres)")
        with context as (target, size_of):
            engine = run_engine(
                report,
                name,
                target,
                size_of,
                sizes,
                args.rounds,
                args.api_up_to,
                args.new,
                workload,
            )
        if len(sizes) > 1:
            growth(report, engine)


def parser() -> Any:
    options = bench_parser(__doc__, rounds=15)
    options.add_argument("--sizes", default="2000,20000", help="executions of the big tenant")
    options.add_argument("--engines", default="sqlite,postgres", help="sqlite and/or postgres")
    options.add_argument(
        "--api-up-to", type=int, default=100_000, help="fill through admit/complete up to this"
    )
    options.add_argument(
        "--new", type=int, default=1000, help="executions appended before each checkpoint"
    )
    options.add_argument(
        "--workloads", default=",".join(WORKLOADS), help="repeat and/or unique (a store each)"
    )
    options.add_argument("--pg-url", default=None, help="PostgreSQL server (a fresh schema)")
    return options


if __name__ == "__main__":
    arguments = parser().parse_args()
    with Report("store_scale", arguments) as report:
        main(report, arguments)
