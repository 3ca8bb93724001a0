"""Audit checkpoint benchmark (not a test): what signing and checking a checkpoint costs.

    .venv/bin/python -m bench.checkpoints [--rounds 10] [--records 20000]

Fills a temporary SQLite store with ``--records`` executions of one tenant (two chain entries
each), then times, interleaved (`bench.harness`), per round:

- ``chain verify``: `SqlAuditStore.verify` of the tenant, the check that exists without
  checkpoints (the baseline);
- ``publish``: what the publisher pays per changed tenant and interval: read the entry hashes,
  build the Merkle tree, sign (`CheckpointPublisher.publish_once` after one new record);
- ``verify checkpoint``: `ptc audit verify --checkpoint`'s extra work: read the hashes, build
  the tree, a consistency proof from half the size, the signature.

Prints p50/p95 of each and the ratios to the chain verify, and entries per second of ``publish``.
"""

from __future__ import annotations

import os
import tempfile
import uuid

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.harness import Report, bench_parser, interleave_sync, percentile
from sandbox.audit import Admission, SqlAuditStore, open_store
from sandbox.audit.checkpoints import (
    key_id,
    sign_checkpoint,
    tenant_tree,
    verify_checkpoint,
)
from sandbox.audit.merkle import root
from sandbox.audit.publisher import CheckpointPublisher
from sandbox.limits import DEFAULTS
from sandbox.result import ExecutionResult, ExecutionStatus


def _record(store: SqlAuditStore) -> None:
    execution_id = uuid.uuid4().hex
    store.admit(
        Admission(
            execution_id=execution_id,
            tenant="bench",
            script="print(1)\n",
            manifest_json="[]",
            manifest_sha256="ab" * 32,
            backend="process",
            policy="none",
            effective_limits=DEFAULTS,
        )
    )
    store.complete(execution_id, ExecutionResult(execution_id, ExecutionStatus.OK, stdout="1\n"))


def main(report: Report, rounds: int, warmup: int, records: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(os.path.join(tmp, "audit.sqlite3"))
        try:
            for _ in range(records):
                _record(store)
            key = Ed25519PrivateKey.generate()
            keys = {key_id(key.public_key()): key.public_key()}
            half = tenant_tree(store.chain_hashes("bench"), "bench")
            half_size = half.size // 2
            earlier = sign_checkpoint(key, "bench", half_size, root(half.leaves[:half_size]), "b")
            publisher = CheckpointPublisher(store, key, directory=os.path.join(tmp, "cp"))

            def chain_verify() -> None:
                assert store.verify("bench").ok

            def publish() -> None:
                _record(store)  # one new record, so the tenant changed (untimed share is small)
                assert len(publisher.publish_once()) == 1

            def verify() -> None:
                tree = tenant_tree(store.chain_hashes("bench"), "bench")
                assert verify_checkpoint(earlier, keys, tree) == []

            report.section(f"one tenant, {records} records ({2 * records} chain entries)")
            times = interleave_sync(
                {"chain verify": chain_verify, "publish": publish, "verify checkpoint": verify},
                rounds,
                warmup=warmup,
            )
            for label, values in times.items():
                report.timings(label, values)
            base = percentile(times["chain verify"], 0.5)
            for label in ("publish", "verify checkpoint"):
                report.figure(
                    f"{label} / chain verify, p50", percentile(times[label], 0.5) / base, "x"
                )
            report.figure(
                "publish rate",
                2 * records / percentile(times["publish"], 0.5),
                "entries/s",
                fmt=",.0f",
            )
        finally:
            store.close()


if __name__ == "__main__":
    parser = bench_parser(__doc__, rounds=10, warmup=1)
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()
    with Report("checkpoints", args) as report:
        main(report, args.rounds, args.warmup, args.records)
