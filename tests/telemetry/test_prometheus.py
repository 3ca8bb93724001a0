"""A real Prometheus (Debian's `prometheus`, installed by scripts/setup.sh --dev) scrapes a real
`ptc serve --metrics-listen`, and the figures read back through Prometheus's HTTP query API match
the executions this test made. The test runs its own Prometheus on a loopback port with a
temporary config and data directory, and stops it.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.client import Client
from tests.ptc_cli import run_ptc
from tests.ptc_serve import ptc_serve
from tests.telemetry.telemetry_support import echo_manifest

SCRAPE_WAIT_S = 40


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`ptc serve` with metrics: (gRPC address, metrics address)."""
    with ptc_serve(
        "--pool-size", "1", "--audit-db", str(tmp_path / "audit.db"),
        "--metrics-listen", "127.0.0.1:0",
    ) as serving:  # fmt: skip
        metrics = serving.metrics_address
        assert metrics is not None and metrics.startswith("127.0.0.1:"), metrics
        yield serving.address, metrics


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Our own Prometheus process: (its base URL, its config file to write targets into)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the `prometheus` binary is missing: run scripts/setup.sh --dev")
    yield f"http://127.0.0.1:{_free_port()}", tmp_path / "prometheus.yml"


def _start_prometheus(url: str, config: Path, target: str) -> subprocess.Popen[bytes]:
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: ptc\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    return subprocess.Popen(
        [
            str(shutil.which("prometheus")),
            f"--config.file={config}",
            f"--storage.tsdb.path={config.parent / 'prometheus-data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _by(results: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in results}


def test_prometheus_scrapes_what_the_executions_did(served, prometheus) -> None:
    address, metrics_address = served
    url, config = prometheus
    manifest = echo_manifest("lookup")
    ids = []
    with Client(address) as client:
        for _ in range(2):
            ok = client.execute("import tools\ntools.lookup(x=1)\ntools.lookup(x=2)\n", manifest)
            assert ok.status == "ok"
            ids.append(ok.execution_id)
        error = client.execute("raise ValueError('no')", manifest)
        assert error.status == "error"
        over = client.execute(
            "import tools\ntools.lookup(x=1)\ntry:\n    tools.lookup(x=2)\n"
            "except tools.ToolError:\n    pass\n",
            manifest,
            limits={"max_tool_calls": 1},
        )
        assert over.status == "limit_exceeded"
        rejected = client.execute("def (:", manifest)
        assert rejected.status == "rejected"
        ids += [error.execution_id, over.execution_id, rejected.execution_id]

    # The exposition itself: labels are bounded sets, never an execution id.
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        exposition = response.read().decode()
    assert not [i for i in ids if i in exposition]

    proc = _start_prometheus(url, config, metrics_address)
    try:
        deadline = time.monotonic() + SCRAPE_WAIT_S
        executions: dict[str, float] = {}
        while time.monotonic() < deadline:
            try:
                executions = _by(
                    _query(url, 'sum by (status) (ptc_executions_total{job="ptc"})'), "status"
                )
            except OSError:
                executions = {}
            if executions:
                break
            time.sleep(0.5)
        assert executions == {"ok": 2, "error": 1, "limit_exceeded": 1, "rejected": 1}

        assert _by(_query(url, "sum by (tenant) (ptc_executions_total)"), "tenant") == {
            "default": 5
        }
        assert _query_value(url, 'sum(ptc_executions_total{backend="process"})') == 5
        assert _by(_query(url, "sum by (status) (ptc_tool_calls_total)"), "status") == {
            "ok": 5,
            "refused": 1,
        }
        assert _by(_query(url, "sum by (mode) (ptc_tool_calls_total)"), "mode") == {"echo": 6}
        assert _by(_query(url, "sum by (limit) (ptc_violations_total)"), "limit") == {
            "max_tool_calls": 1
        }
        assert _query_value(url, "sum(ptc_execution_duration_seconds_count)") == 5
        assert _query_value(url, "sum(ptc_queue_wait_duration_seconds_count)") == 5
        assert _by(
            _query(url, "sum by (operation) (ptc_audit_write_duration_seconds_count)"),
            "operation",
        ) == {"admit": 5, "complete": 5}
        starts = _by(_query(url, "ptc_sandbox_start_duration_seconds_count"), "backend")
        assert set(starts) == {"process"}
        assert starts["process"] >= 4  # four executions took a sandbox; each was started once
        sandboxes = _query(url, "ptc_sandboxes")
        assert {(r["metric"]["backend"], r["metric"]["state"]) for r in sandboxes} == {
            ("process", "idle"),
            ("process", "busy"),
        }
        assert _by([r for r in sandboxes if r["metric"]["state"] == "busy"], "state") == {"busy": 0}
        rooms = _by(_query(url, 'ptc_sandbox_rooms{backend="process"}'), "state")
        assert (rooms["limit"], rooms["waiting"]) == (64, 0)  # max_sandboxes' default
        assert 1 <= rooms["held"] <= 8  # the warm pool's idle sandboxes, nothing running
        assert _query_value(url, "ptc_sandbox_rooms_evicted_total") == 0
        assert _query_value(url, "ptc_active_sessions") == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err.decode()[-2000:]


def _query_value(url: str, promql: str) -> float:
    results = _query(url, promql)
    assert len(results) == 1, results
    return float(results[0]["value"][1])


def test_bad_metrics_listen_is_a_clear_error() -> None:
    proc = run_ptc(
        "serve", "--listen", "127.0.0.1:0", "--audit-db", "memory", "--metrics-listen", "nowhere"
    )
    assert proc.returncode == 2
    assert "--metrics-listen 'nowhere': expected HOST:PORT" in proc.stderr


def test_metrics_port_in_use_is_unavailable_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        (tmp_path / "server.toml").write_text(f'metrics_listen = "127.0.0.1:{port}"\n')
        proc = run_ptc(
            "serve", "--listen", "127.0.0.1:0", "--audit-db", "memory",
            "--config", str(tmp_path / "server.toml"),
        )  # fmt: skip
    assert proc.returncode == 12, proc.stderr
    assert f"--metrics-listen 127.0.0.1:{port}: cannot listen" in proc.stderr
    assert "listening on" not in proc.stdout


def _gauge(metrics_address: str, name: str) -> float:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} is not exposed")


def test_active_sessions_gauge_follows_the_sessions(served) -> None:
    address, metrics_address = served
    with Client(address) as client:
        assert _gauge(metrics_address, "ptc_active_sessions") == 0
        with client.session() as session:
            assert session.execute("x = 1").status == "ok"
            assert _gauge(metrics_address, "ptc_active_sessions") == 1
        assert _gauge(metrics_address, "ptc_active_sessions") == 0
