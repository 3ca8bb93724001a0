"""`ptc audit list | show | export | prune` on a real SQLite file, in subprocesses."""

from __future__ import annotations

import json
from pathlib import Path

from sandbox.audit import open_store
from sandbox.result import ExecutionStatus
from tests.audit.audit_support import admission, result
from tests.ptc_cli import run_ptc as ptc


def _db(tmp_path: Path) -> tuple[str, list[str]]:
    path = str(tmp_path / "audit.sqlite3")
    store = open_store(path)
    ids = []
    for i, (tenant, status, tools) in enumerate(
        [
            ("acme", ExecutionStatus.OK, ("search",)),
            ("acme", ExecutionStatus.ERROR, ("fetch",)),
            ("globex", ExecutionStatus.OK, ("search",)),
        ]
    ):
        adm = admission(tenant, at=1_700_000_000.0 + i)
        store.admit(adm)
        store.complete(adm.execution_id, result(adm.execution_id, status, tools))
        ids.append(adm.execution_id)
    store.close()
    return path, ids


def test_list_show_and_export(tmp_path: Path) -> None:
    path, ids = _db(tmp_path)
    listed = ptc("audit", "list", "--db", path)
    assert listed.returncode == 0, listed.stderr
    assert all(i in listed.stdout for i in ids)
    only = ptc("audit", "list", "--db", path, "--tenant", "acme", "--tool", "fetch", "--json")
    lines = [json.loads(line) for line in only.stdout.splitlines()]
    assert [line["execution_id"] for line in lines] == [ids[1]]
    timed = ptc("audit", "list", "--db", path, "--since", "2023-11-14T22:13:21", "--status", "ok")
    assert ids[2] in timed.stdout and ids[0] not in timed.stdout

    shown = ptc("audit", "show", ids[2], "--db", path)
    assert shown.returncode == 0
    assert json.loads(shown.stdout)["tenant"] == "globex"
    hidden = ptc("audit", "show", ids[2], "--db", path, "--tenant", "acme")
    assert hidden.returncode == 1

    out = tmp_path / "export.jsonl"
    exported = ptc("audit", "export", "--db", path, "--output", str(out))
    assert exported.returncode == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["execution_id"] for r in records) == sorted(ids)
    assert all(r["script"] == "print(1)" and r["result"]["calls"] for r in records)


def test_prune_applies_each_tenants_retention(tmp_path: Path) -> None:
    path, ids = _db(tmp_path)
    config = tmp_path / "tenants.toml"
    config.write_text(
        '[[tenant]]\nid = "acme"\nkeys = ["sha256:' + "0" * 64 + '"]\naudit_retention_days = 1\n'
        '[[tenant]]\nid = "globex"\nkeys = ["sha256:' + "1" * 64 + '"]\naudit_retention_days = 0\n'
    )
    pruned = ptc("audit", "prune", "--db", path, "--tenants", str(config))
    assert pruned.returncode == 0, pruned.stderr
    assert "acme: pruned 2 records" in pruned.stdout
    listed = ptc("audit", "list", "--db", path)
    assert ids[2] in listed.stdout and ids[0] not in listed.stdout
    assert ptc("audit", "verify", "--db", path).returncode == 0


def test_missing_store_is_a_clear_error(tmp_path: Path) -> None:
    missing = ptc("audit", "list", "--db", str(tmp_path / "nope.sqlite3"))
    assert missing.returncode == 2
    assert "no audit store" in missing.stderr
    assert not (tmp_path / "nope.sqlite3").exists()
