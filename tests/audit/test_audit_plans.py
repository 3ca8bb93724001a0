"""Every read a request makes is answered by an index, on both engines: checked with EXPLAIN.

The statements are the store's own: a recording wrapper around the store's database seam keeps
each SQL statement and its parameters as the public calls (``list`` with each filter and a
page token, ``get``, ``by_key``, ``holder``) run them against a real, populated store; each is
then explained on the same database (`_faults` says what fails). PostgreSQL is asked with its
sequential scans, bitmap scans, sorts, hash and merge joins disabled: on tables this small its
planner would pick them for cost, and disabled they still appear when no index can answer the
statement, which is what this checks (how the plans fare at a million executions is measured by
`bench.store_scale`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from sandbox.audit import AuditQuery, SqlAuditStore
from sandbox.result import ExecutionStatus
from tests.audit.audit_support import admission, result
from tests.audit.conftest import AuditDb


class _Recording:
    """Delegates to the store's `Db`, keeping every statement run through it."""

    def __init__(self, db: Any, seen: list[tuple[str, tuple[object, ...]]]) -> None:
        self._db, self._seen = db, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    @contextmanager
    def read(self) -> Iterator[Any]:
        with self._db.read() as tx:
            yield _RecordingTx(tx, self._seen)

    @contextmanager
    def write(self) -> Iterator[Any]:
        with self._db.write() as tx:
            yield _RecordingTx(tx, self._seen)

    def read_one(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        self._seen.append((sql, tuple(params)))
        return list(self._db.read_one(sql, params))


class _RecordingTx:
    def __init__(self, tx: Any, seen: list[tuple[str, tuple[object, ...]]]) -> None:
        self._tx, self._seen = tx, seen

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        self._seen.append((sql, tuple(params)))
        return list(self._tx.execute(sql, params))

    def executemany(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self._tx.executemany(sql, rows)  # writes of rows: nothing to explain

    def stream(self, sql: str, params: Sequence[object] = ()) -> Iterator[tuple[Any, ...]]:
        self._seen.append((sql, tuple(params)))
        yield from self._tx.stream(sql, params)


def _fill(store: SqlAuditStore) -> None:
    for tenant, count in (("big", 300), ("small", 20)):
        for i in range(count):
            eid = f"{tenant}-{i:04d}"
            labels = {"ptc.session_id": f"s-{i % 7:04x}"} if i % 3 else {}
            base = admission(tenant, eid, at=1000.0 + i)
            key = f"k{i}" if i % 5 == 0 else ""
            store.admit(replace(base, labels=labels, idempotency_key=key))
            if i % 10 == 9:
                continue  # left running
            tools = ("search", "fetch", "search") if i % 2 else ("fetch",)
            violations = ("memory",) if i % 4 == 1 else ()
            status = ExecutionStatus.LIMIT_EXCEEDED if violations else ExecutionStatus.OK
            store.complete(eid, result(eid, status, tools, violations))


QUERIES = {
    "no filter": AuditQuery(limit=20),
    "status": AuditQuery(status="limit_exceeded", limit=20),
    "session": AuditQuery(session_id="s-0003", limit=20),
    "tool": AuditQuery(tool="fetch", limit=20),
    "rare tool": AuditQuery(tool="nothing-calls-it", limit=20),
    "violation": AuditQuery(violation="memory", limit=20),
    "tool and violation": AuditQuery(tool="search", violation="memory", limit=20),
    "session and status": AuditQuery(session_id="s-0001", status="ok", limit=5),
}


def _explain(audit_db: AuditDb, sql: str, params: tuple[object, ...]) -> list[str]:
    if audit_db.kind == "sqlite":
        return [str(r[3]) for r in audit_db.raw("EXPLAIN QUERY PLAN " + sql, params)]
    import psycopg

    with psycopg.connect(audit_db.target, autocommit=True) as conn:
        for method in ("seqscan", "bitmapscan", "sort", "hashjoin", "mergejoin"):
            conn.execute(f"SET enable_{method} = off")
        with psycopg.ClientCursor(conn) as cursor:
            cursor.execute("EXPLAIN " + sql.replace("?", "%s"), params)
            return [str(r[0]) for r in cursor.fetchall()]


def _faults(audit_db: AuditDb, sql: str, plan: list[str], single: bool) -> list[str]:
    """What in ``plan`` reads more than the answer: a whole table; a sort or set of every
    match before the page's first row; outside a page walk that stops at its ``LIMIT``, an
    index searched by tenant alone (every row of the tenant); and for a page of one filter
    (``single``), anything but one index walk whose condition is the whole filter (a row
    filter or a join would skip rows of the walk, as many as the tenant has)."""
    paged = "LIMIT" in sql
    if audit_db.kind == "sqlite":
        faults = [
            step
            for step in plan
            if (step.startswith("SCAN ") and not step.endswith(" CONSTANT ROWS"))  # not VALUES
            or "TEMP B-TREE" in step
            or "LIST SUBQUERY" in step
            or (not paged and step.endswith("(tenant=?)"))
        ]
        if paged and single and len(plan) != 1:
            faults.append("more than one index walk: " + " | ".join(plan))
        return faults
    faults = [line for line in plan if "Seq Scan" in line or line.lstrip("-> ").startswith("Sort")]
    if paged and single:
        faults += [line for line in plan if "Filter:" in line or "Join" in line or "Loop" in line]
    if not paged:
        faults += [
            line
            for line in plan
            if "Index Cond:" in line and "tenant =" in line and " AND " not in line
        ]
    return faults


def _statements(
    store: SqlAuditStore, calls: list[tuple[str, Any]]
) -> list[tuple[str, str, tuple[object, ...]]]:
    seen: list[tuple[str, tuple[object, ...]]] = []
    inner = store._db
    store._db = _Recording(inner, seen)
    out: list[tuple[str, str, tuple[object, ...]]] = []
    try:
        for name, call in calls:
            del seen[:]
            call()
            out += [(name, sql, params) for sql, params in seen]
    finally:
        store._db = inner
    return out


@pytest.fixture
def filled(audit_db: AuditDb) -> SqlAuditStore:
    store = audit_db.open()
    _fill(store)
    if audit_db.kind == "postgres":
        audit_db.raw("ANALYZE")
    return store


def test_every_read_of_a_request_is_answered_by_an_index(
    audit_db: AuditDb, filled: SqlAuditStore
) -> None:
    store = filled
    calls: list[tuple[str, Any]] = []
    for name, query in QUERIES.items():
        calls.append((f"list by {name}", lambda q=query: store.list("big", q)))
        _first, token = store.list("big", query)
        if token is not None:
            calls.append(
                (
                    f"list by {name}, page 2",
                    lambda q=query, t=token: store.list("big", replace(q, page_token=t)),
                )
            )
    calls += [
        ("get", lambda: store.get("big", "big-0150")),
        ("idempotency", lambda: store.by_key("big", "k150")),
        ("holder", lambda: store.holder("big", "big-0159")),
    ]
    statements = _statements(store, calls)
    assert {name for name, _, _ in statements} >= {name for name, _ in calls}
    problems = {}
    for name, sql, params in statements:
        single = not any(f"by {q}" in name for q in ("tool and", "session and"))
        faults = _faults(audit_db, sql, _explain(audit_db, sql, params), single)
        if faults:
            problems[f"{name}: {sql}"] = faults
    assert problems == {}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_each_filter_pages_through_exactly_its_matches(
    audit_db: AuditDb, filled: SqlAuditStore, name: str
) -> None:
    """The index walk, its batches and page tokens give the same rows as a plain reading of
    every record would, newest first, with no record twice."""
    query = replace(QUERIES[name], limit=7)
    every, token = filled.list("big", AuditQuery(limit=1000))
    assert token is None

    def matches(record: Any) -> bool:
        calls = [c.tool for c in record.result.calls] if record.result else []
        limits = [v.limit for v in record.result.violations] if record.result else []
        return (
            (not query.status or record.status == query.status)
            and (
                not query.session_id
                or record.admission.labels.get("ptc.session_id") == query.session_id
            )
            and (not query.tool or query.tool in calls)
            and (not query.violation or query.violation in limits)
        )

    expected = [r.admission.execution_id for r in every if matches(r)]
    got: list[str] = []
    while True:
        page, token = filled.list("big", query)
        assert len(page) <= 7
        got += [r.admission.execution_id for r in page]
        if token is None:
            break
        query = replace(query, page_token=token)
    assert got == expected
    assert name == "rare tool" or expected  # the data exercises each filter


def test_the_text_stored_once_is_read_and_pruned_through_its_keys(
    audit_db: AuditDb, filled: SqlAuditStore
) -> None:
    """Every statement on ``contents`` (`sandbox.audit._contents`) that a
    request or a periodic job runs: a read that puts a script and manifest back (a store that
    has not cached them: another server's), the look-up of `verify` since a checkpoint, an
    admission's writes, and retention's walk to the rows it removes; and retention's delete of
    the pruned admissions' idempotency keys, each by its primary key."""
    for i in range(200):  # texts of their own: the planner sees a table worth its index
        filled.admit(admission("big", f"own-{i:03d}", script=f"print({i})", at=6000.0 + i))
    if audit_db.kind == "postgres":
        audit_db.raw("ANALYZE")
    # Two stores with nothing cached (other servers'): the texts are read from the rows.
    store, other = audit_db.open("plans-fresh"), audit_db.open("plans-fresh-2")
    head = audit_db.raw("SELECT seq, head_hash FROM chain_heads WHERE tenant = 'big'")[0]
    new = admission("big", "big-new", script="print('new')", at=5000.0)
    calls: list[tuple[str, Any]] = [
        ("admit", lambda: store.admit(new)),
        ("complete", lambda: store.complete("big-new", result("big-new"))),
        ("verify since", lambda: store.verify("big", (int(head[0]), str(head[1])))),
        ("prune", lambda: store.prune("big", before=1100.0)),
    ]
    statements = [
        s
        for s in _statements(store, [("list", lambda: store.list("big", AuditQuery(limit=20)))])
        + _statements(other, [("get", lambda: other.get("big", "big-0150"))])
        + _statements(store, calls)
        if "content" in s[1]
        or "kind = 'admitted'" in s[1]  # the admissions prune reads
        or "DELETE FROM idempotency_keys" in s[1]  # the keys they name
    ]
    assert {name for name, _, _ in statements} == {"list", "get", "admit", "verify since", "prune"}
    pruning = [sql for name, sql, _ in statements if name == "prune"]
    assert any("SELECT payload FROM entries" in sql for sql in pruning)
    assert any("DELETE FROM idempotency_keys" in sql for sql in pruning)
    assert (filled.by_key("big", "k0"), filled.by_key("big", "k150")) == (None, "big-0150")
    assert any("SELECT digest, body FROM contents" in sql for _, sql, _ in statements)
    problems = {}
    for name, sql, params in statements:
        faults = _faults(audit_db, sql, _explain(audit_db, sql, params), False)
        if faults:
            problems[f"{name}: {sql}"] = faults
    assert problems == {}
    # The prune removed the rows only the pruned records named; the rest still read back.
    assert filled.verify().ok
    kept = store.get("big", "big-new")
    assert kept is not None and kept.admission.script == "print('new')"


def test_the_tenants_are_read_through_the_index_not_the_executions(
    audit_db: AuditDb, filled: SqlAuditStore
) -> None:
    """`tenants()` walks the executions index one tenant at a time (each step a descent to the
    smallest tenant above the last, a LIMIT 1 on PostgreSQL), never a scan of its rows; it
    still finds a tenant that has executions rows and no chain (an inserted row)."""
    audit_db.raw(
        "INSERT INTO executions (execution_id, tenant, admit_seq, status, admitted_at, backend, "
        "script_sha256, manifest_sha256, instance, prev_hash, record_hash) "
        "VALUES ('x-1', 'no-chain', 1, 'ok', 0, 'process', '', '', 'h', '', '')"
    )
    assert filled.tenants() == ["big", "no-chain", "small"]
    ((_, sql, params),) = _statements(filled, [("tenants", filled.tenants)])
    plan = _explain(audit_db, sql, params)
    if audit_db.kind == "sqlite":
        reads = [step for step in plan if "executions" in step]
        assert reads and all(step.startswith("SEARCH ") for step in reads), plan
        assert not [step for step in plan if step.startswith("SCAN e")], plan
    else:
        scans = [n for n, line in enumerate(plan) if " on executions" in line]
        assert scans, plan
        for n in scans:
            assert "Index Only Scan" in plan[n] and "Limit" in plan[n - 1], plan


def test_the_idempotency_look_up_reads_one_structure(
    audit_db: AuditDb, filled: SqlAuditStore
) -> None:
    """Schema step 11: the look-up of a key is one B-tree descent. On SQLite the table has no
    rowids, so the primary key's B-tree holds the row (no second probe of the table); on
    PostgreSQL the primary key's index carries ``execution_id``, so the look-up is an
    index-only scan that reads no heap page once the table is vacuumed."""
    ((_, sql, params),) = _statements(
        filled, [("idempotency", lambda: filled.by_key("big", "k150"))]
    )
    assert filled.by_key("big", "k150") == "big-0150"
    if audit_db.kind == "sqlite":
        assert _explain(audit_db, sql, params) == [
            "SEARCH idempotency_keys USING PRIMARY KEY (tenant=? AND idem_key=?)"
        ]
        return
    import psycopg

    audit_db.raw("VACUUM idempotency_keys")
    with psycopg.connect(audit_db.target, autocommit=True) as conn:
        conn.execute("SET enable_seqscan = off")  # 64 rows: see the module's docstring
        explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql.replace("?", "%s")
        plan = [str(row[0]) for row in conn.execute(explain, params).fetchall()]
    assert plan[0].startswith("Index Only Scan using idempotency_keys_pkey on idempotency_keys"), (
        plan
    )
    assert "Heap Fetches: 0" in [line.strip() for line in plan], plan
    (options,) = audit_db.raw(
        "SELECT reloptions FROM pg_class WHERE oid = 'idempotency_keys'::regclass"
    )
    assert sorted(options[0]) == [
        "autovacuum_vacuum_insert_scale_factor=0",
        "autovacuum_vacuum_insert_threshold=10000",
    ]
