"""The request paths `bench.store_scale` times on a filled store, and what it keeps of them.

At each size the same calls (``--rounds`` each): admission and completion of a new execution, a
get by id and an idempotency look-up from the middle of the history, the holder of a session, a
page of each list filter, every page of a 20-cell session's cells, and a checkpoint and a
``verify --since-checkpoint`` after ``--new`` executions; then the store's bytes per execution.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.scale_history import admission, fill_api, result
from sandbox.audit import AuditQuery, SqlAuditStore
from sandbox.audit.publisher import CheckpointPublisher

__all__ = ["BIG", "SMALL", "SMALL_SIZE", "ScaleEngine", "measure"]

BIG, SMALL = "big", "small"
SMALL_SIZE = 500


@dataclass
class ScaleEngine:
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


def measure(engine: ScaleEngine, size: int, rounds: int, key: Ed25519PrivateKey, new: int) -> None:
    store = engine.store
    rng = random.Random(size)
    times: dict[str, list[float]] = {}
    fresh: list[str] = []

    workload = engine.workload

    def admit(_: int) -> None:
        made = admission(BIG, engine.next_id, workload=workload)
        engine.next_id += 1
        fresh.append(made.execution_id)
        store.admit(made)

    times["admission"] = _timed(rounds, admit)
    times["completion"] = _timed(rounds, lambda n: store.complete(fresh[n], result(fresh[n], 1)))
    middle = [rng.randrange(size // 4, size // 4 * 3) for _ in range(rounds)]
    times["get by id"] = _timed(rounds, lambda n: store.get(BIG, f"{BIG}-{middle[n]:09d}"))
    keyed = [m - m % 4 for m in middle]
    times["idempotency look-up"] = _timed(rounds, lambda n: store.by_key(BIG, f"key-{keyed[n]}"))
    session = f"s-{size:x}"[:12]
    store.admit(
        replace(admission(BIG, engine.next_id, workload=workload), execution_id=session, labels={})
    )
    engine.next_id += 1
    store.heartbeat("127.0.0.1:1", 600)
    times["holder of a session"] = _timed(rounds, lambda n: store.holder(BIG, session))
    for _ in range(20):  # the session's cells, among the newest records
        cell = admission(BIG, engine.next_id, session=session, workload=workload)
        engine.next_id += 1
        store.admit(cell)
        store.complete(cell.execution_id, result(cell.execution_id, 1))
        fill_api(
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
            fill_api(store, BIG, engine.next_id, engine.next_id + new, workload)
            engine.next_id += new
            started = time.perf_counter()
            (signed,) = publisher.publish_once()
            checkpoint_times.append(time.perf_counter() - started)
            fill_api(store, BIG, engine.next_id, engine.next_id + new, workload)
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
