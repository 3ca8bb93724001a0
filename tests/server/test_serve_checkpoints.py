"""Audit checkpoints from a real `ptc serve`: it signs a checkpoint per tenant every interval and
at shutdown (log line, files, and Prometheus gauges when metrics are on), `ptc audit verify
--checkpoint` accepts them, and detects the truncation of the newest records and the head that
the chain alone cannot see."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from sandbox.audit.checkpoints import generate_key, read_checkpoints
from sandbox.client import Client
from sandbox.tenants import hash_key
from tests.ptc_cli import run_ptc as _ptc
from tests.ptc_serve import ptc_serve

ROOT = Path(__file__).resolve().parents[2]
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable
KEYS = {t: f"ptc-test-key-checkpoint-{t}-0123456789" for t in ("alpha", "beta")}
TENANTS = "".join(
    f'[[tenant]]\nid = "{t}"\nkeys = ["{hash_key(k)}"]\nbackends = ["process"]\n\n'
    for t, k in KEYS.items()
)


def _wait_for_size(path: Path, size: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and read_checkpoints(str(path))[0].tree_size == size:
            return
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint of size {size} at {path} within {timeout_s} s")


def test_serve_publishes_checkpoints_that_detect_truncation(tmp_path: Path) -> None:
    db, out, key = tmp_path / "audit.db", tmp_path / "checkpoints", tmp_path / "ck.key"
    key_id = generate_key(key)
    env = {**os.environ, "PTC_CHECKPOINT_KEY": key.read_text()}  # the key from the environment
    latest = out / "default.checkpoint.json"
    with ptc_serve(
        "--pool-size", "1", "--audit-db", str(db), "--instance-id", "ptc-a",
        "--checkpoint-interval", "0.2", "--checkpoint-dir", str(out), env=env,
    ) as serving, Client(serving.address) as client:  # fmt: skip
        assert client.execute("print(1)").stdout == "1\n"
        _wait_for_size(latest, 2)
        assert client.execute("print(2)").stdout == "2\n"
        _wait_for_size(latest, 4)
        assert client.execute("print(3)").stdout == "3\n"
    stderr = serving.stderr
    # The shutdown checkpoint covers the last execution even if no interval came after it.
    (final,) = read_checkpoints(str(latest))
    assert (final.tenant, final.tree_size, final.origin, final.key_id) == (
        "default",
        6,
        "ptc-a",
        key_id,
    )
    assert f"audit checkpoint: tenant=default tree_size=6 root=sha256:{final.root_hash.hex()}" in (
        stderr
    )
    history = out / "checkpoints.jsonl"
    sizes = [c.tree_size for c in read_checkpoints(str(history))]
    # A round may also fall between an execution's admission and its completion (size 1, 3
    # or 5): each such checkpoint is signed and verified like the others.
    assert sizes == sorted(sizes) and sizes[-1] == 6
    assert {2, 4} <= set(sizes) and set(sizes) <= {1, 2, 3, 4, 5, 6}

    verified = _ptc(
        "audit", "verify", "--db", str(db), "--checkpoint", str(history), "--public-key",
        f"{key}.pub",
    )  # fmt: skip
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.count("checkpoint ok: tenant default") == len(sizes)
    assert verified.stdout.endswith("ok: 3 records verified\n")

    # Delete the newest record and move the head back: the chain alone still verifies.
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        (last_id,) = conn.execute("SELECT execution_id FROM entries WHERE seq = 6").fetchone()
        conn.execute("DELETE FROM entries WHERE seq > 4")
        conn.execute("DELETE FROM executions WHERE execution_id = ?", (last_id,))
        conn.execute("DELETE FROM calls WHERE execution_id = ?", (last_id,))
        (head,) = conn.execute("SELECT entry_hash FROM entries WHERE seq = 4").fetchone()
        conn.execute("UPDATE chain_heads SET seq = 4, head_hash = ?", (head,))
    finally:
        conn.close()
    assert _ptc("audit", "verify", "--db", str(db)).returncode == 0
    broken = _ptc(
        "audit", "verify", "--db", str(db), "--checkpoint", str(latest), "--public-key",
        f"{key}.pub",
    )  # fmt: skip
    assert broken.returncode == 1
    assert broken.stderr == (
        f"ptc audit verify: checkpoint of tenant default at size 6 (key {key_id}): the store "
        "holds only 4 entries of tenant default (its chain ends at entry 4): entries 5..6 that "
        "the checkpoint covers were removed: truncated\n"
    )
    assert json.loads(latest.read_text())["tree_size"] == 6


def test_serve_refuses_checkpoints_it_cannot_make(tmp_path: Path) -> None:
    no_key = ("PTC_CHECKPOINT_KEY",)  # the key only as the test passes it
    memory = _ptc(
        "serve", "--listen", "127.0.0.1:0", "--audit-db", "memory", "--checkpoint-dir",
        str(tmp_path), "--checkpoint-key", str(tmp_path / "none.key"), without=no_key,
    )  # fmt: skip
    assert memory.returncode == 2
    assert memory.stderr.strip().endswith(
        "audit checkpoints need an audit store (--audit-db PATH|URL), not one in memory"
    )
    nokey = _ptc(
        "serve", "--listen", "127.0.0.1:0", "--audit-db", str(tmp_path / "a.db"),
        "--checkpoint-interval", "60", without=no_key,
    )  # fmt: skip
    assert nokey.returncode == 2
    assert nokey.stderr.strip().endswith(
        "no checkpoint key: pass a key file or set $PTC_CHECKPOINT_KEY"
    )
    negative = _ptc(
        "serve", "--listen", "127.0.0.1:0", "--audit-db", str(tmp_path / "a.db"),
        "--checkpoint-interval", "-1", without=no_key,
    )  # fmt: skip
    assert negative.returncode == 2
    assert negative.stderr.strip().endswith(
        "checkpoint interval -1.0: must be a positive number of seconds"
    )


def _checkpoint_metrics(metrics_address: str, kind: str) -> dict[str, dict[str, float]]:
    """{sample name: {tenant: value}} of the ptc_audit_checkpoint_* metrics of one kind
    ("gauge" or "counter"; a counter's `_created` samples left out), as scraped."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        if (
            family.name.startswith("ptc_audit_checkpoint_")
            and family.type == kind
            and not family.name.endswith("_created")  # a counter's creation time, as a gauge
        ):
            name = family.name + ("_total" if kind == "counter" else "")
            out[name] = {s.labels["tenant"]: s.value for s in family.samples if s.name == name}
    return out


def _checkpoint_gauges(metrics_address: str) -> dict[str, dict[str, float]]:
    return _checkpoint_metrics(metrics_address, "gauge")


def test_serve_exports_each_tenants_latest_checkpoint_as_gauges(tmp_path: Path) -> None:
    """The third way of publishing: with --metrics-listen, /metrics carries each tenant's latest
    checkpoint, its tree size (the tenant's entries in the store: two per execution) and the
    time it was signed, equal to the signed checkpoint's own."""
    db, out, key = tmp_path / "audit.db", tmp_path / "checkpoints", tmp_path / "ck.key"
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(TENANTS)
    generate_key(key)
    with ptc_serve(
        "--pool-size", "1", "--audit-db", str(db), "--tenants", str(tenants),
        "--metrics-listen", "127.0.0.1:0", "--checkpoint-interval", "0.2", "--checkpoint-dir",
        str(out), "--checkpoint-key", str(key),
    ) as serving:  # fmt: skip
        assert serving.metrics_address is not None
        metrics_address, address = serving.metrics_address, serving.address
        # Declared, and empty until a checkpoint is signed.
        assert _checkpoint_gauges(metrics_address) == {
            "ptc_audit_checkpoint_tree_size": {},
            "ptc_audit_checkpoint_timestamp_seconds": {},
        }
        for tenant, runs in (("alpha", 1), ("beta", 2)):
            with Client(address, api_key=KEYS[tenant]) as client:
                for i in range(runs):
                    assert client.execute(f"print({i})").stdout == f"{i}\n"
        _wait_for_size(out / "alpha.checkpoint.json", 2)
        _wait_for_size(out / "beta.checkpoint.json", 4)
        # The file is written before the hooks run: wait for the gauge to follow.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            gauges = _checkpoint_gauges(metrics_address)
            if gauges["ptc_audit_checkpoint_tree_size"] == {"alpha": 2, "beta": 4}:
                break
            time.sleep(0.05)
        conn = sqlite3.connect(db)
        try:
            entries = dict(conn.execute("SELECT tenant, COUNT(*) FROM entries GROUP BY tenant"))
        finally:
            conn.close()
        signed = {
            t: read_checkpoints(str(out / f"{t}.checkpoint.json"))[0] for t in ("alpha", "beta")
        }
        refusals = "ptc_audit_checkpoint_refusals_total"
        assert _checkpoint_metrics(metrics_address, "counter") == {refusals: {}}
        # Truncate beta's newest record and move its head back, under the running server: the
        # next rounds refuse to sign beta (and count it); alpha is untouched.
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("DELETE FROM entries WHERE tenant = 'beta' AND seq > 2")
            (head,) = conn.execute(
                "SELECT entry_hash FROM entries WHERE tenant = 'beta' AND seq = 2"
            ).fetchone()
            conn.execute(
                "UPDATE chain_heads SET seq = 2, head_hash = ? WHERE tenant = 'beta'", (head,)
            )
        finally:
            conn.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            counted = _checkpoint_metrics(metrics_address, "counter")[refusals]
            if counted.get("beta", 0) >= 2:
                break
            time.sleep(0.05)
        after_truncation = _checkpoint_gauges(metrics_address)
    stderr = serving.stderr
    assert "hook" not in stderr, stderr
    assert entries == {"alpha": 2, "beta": 4}
    assert gauges == {
        "ptc_audit_checkpoint_tree_size": entries,
        "ptc_audit_checkpoint_timestamp_seconds": {
            t: c.timestamp_ms / 1000 for t, c in signed.items()
        },
    }
    assert set(counted) == {"beta"} and counted["beta"] >= 2  # one per round, beta only
    assert after_truncation == gauges  # nothing signed over the truncated store
    assert "audit checkpoint: tenant beta: the store's tree (size 2) does not extend the " in stderr
