"""Prometheus metrics of the server (`ptc serve --metrics-listen 127.0.0.1:9464`).

Off until `enable` is called: every hook is then one ``None`` check, and prometheus_client is not
imported. The metrics live in a registry of their own (not the library's global one), served on
their own HTTP listener. Labels are bounded sets only: a tenant id (from the operator's tenants
file), a backend, a status, a limit name, a tool mode; never an execution id, a tool's arguments
or a script.

    ptc_executions_total{status,backend,tenant}           executions finished, by final status
    ptc_violations_total{limit,action}                     violations recorded
    ptc_tool_calls_total{status,mode}                      tool calls recorded in call logs
    ptc_execution_duration_seconds{backend}                histogram: start to result
    ptc_queue_wait_duration_seconds{tenant}                histogram: waiting for admission
    ptc_sandbox_start_duration_seconds{backend}            histogram: starting one sandbox
    ptc_sandboxes{backend,state}                           gauge: idle (warm) and busy sandboxes
    ptc_sandbox_rooms{backend,state}                       gauge: max_sandboxes limit, held, waiting
    ptc_sandbox_rooms_evicted_total{backend}               counter: idle ones given up to demand
    ptc_active_sessions                                    gauge: open sessions
    ptc_audit_write_duration_seconds{operation}            histogram: admit / complete writes
    ptc_audit_write_failures_total{operation}              counter: writes the store refused
    ptc_audit_completions_pending                          gauge: completions kept, not yet written
    ptc_audit_completions_dropped_total                    counter: completions beyond that bound
    ptc_audit_checkpoint_tree_size{tenant}                 gauge: tree size of its latest checkpoint
    ptc_audit_checkpoint_timestamp_seconds{tenant}         gauge: when that checkpoint was signed
    ptc_audit_checkpoint_refusals_total{tenant}            counter: rounds that would not sign
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sandbox.backends.capacity import Capacity
from sandbox.backends.pool import observe_starts

if TYPE_CHECKING:
    from sandbox.audit.checkpoints import Checkpoint
    from sandbox.backends.base import Backend, Pool
    from sandbox.result import ExecutionResult
    from stubs_gen import Manifest

__all__ = [
    "Metrics",
    "active_sessions",
    "audit_checkpoint",
    "audit_checkpoint_refused",
    "audit_completion_dropped",
    "audit_pending",
    "audit_write",
    "audit_write_failed",
    "enable",
    "execution_finished",
    "execution_started",
    "queue_wait",
    "sandbox_started",
]

# Seconds: from a few ms (an echo script on a warm sandbox) to minutes (the wall-time ceiling).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class Metrics:
    """The server's metrics in one registry of their own."""

    def __init__(self, backends: Mapping[str, Backend] | None = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            from sandbox.errors import Unavailable

            raise Unavailable(
                "metrics need prometheus-client, which is not installed: "
                "pip install 'ptc-sandbox[metrics]'"
            ) from exc

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.executions = Counter(
            "ptc_executions",
            "Executions finished, by final status.",
            ["status", "backend", "tenant"],
            registry=r,
        )
        self.violations = Counter(
            "ptc_violations", "Limit violations recorded.", ["limit", "action"], registry=r
        )
        self.tool_calls = Counter(
            "ptc_tool_calls", "Tool calls recorded in call logs.", ["status", "mode"], registry=r
        )
        self.execution_duration = Histogram(
            "ptc_execution_duration_seconds",
            "Time from an execution's start to its result.",
            ["backend"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "ptc_queue_wait_duration_seconds",
            "Time an execution waited for its tenant's admission (concurrency quota).",
            ["tenant"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.sandbox_start = Histogram(
            "ptc_sandbox_start_duration_seconds",
            "Time to start one sandbox (warm-pool refills and on-demand starts).",
            ["backend"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.active_sessions = Gauge("ptc_active_sessions", "Sessions open now.", registry=r)
        self.in_flight = Gauge(
            "ptc_executions_in_flight",
            "Executions this server holds now: queued for their tenant's slot, or admitted.",
            ["state"],
            registry=r,
        )
        self.audit_write = Histogram(
            "ptc_audit_write_duration_seconds",
            "Time to write to the audit store.",
            ["operation"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        # A store that refuses writes (`sandbox.server.audit_writes`): an alert on failures or
        # on pending completions sees the store fail before the records go missing.
        self.audit_write_failures = Counter(
            "ptc_audit_write_failures",
            "Writes the audit store refused (full disk, read-only, unreachable), by operation.",
            ["operation"],
            registry=r,
        )
        self.audit_pending = Gauge(
            "ptc_audit_completions_pending",
            "Finished executions whose completion the audit store refused, kept in memory "
            "until it takes writes again.",
            registry=r,
        )
        self.audit_dropped = Counter(
            "ptc_audit_completions_dropped",
            "Completions refused by the audit store while the kept ones were at their bound: "
            "their records stay running until the server's next start marks them interrupted.",
            registry=r,
        )
        # Set by the checkpoint publisher's hook (`audit_checkpoint`): an alert on the tree size
        # of a busy tenant not growing, or on the timestamp ageing, sees publication stop.
        self.checkpoint_tree_size = Gauge(
            "ptc_audit_checkpoint_tree_size",
            "Audit entries of the tenant that its latest signed checkpoint covers.",
            ["tenant"],
            registry=r,
        )
        self.checkpoint_timestamp = Gauge(
            "ptc_audit_checkpoint_timestamp_seconds",
            "When the tenant's latest signed audit checkpoint was signed (Unix time).",
            ["tenant"],
            registry=r,
        )
        # Each round that refused to sign a tenant's tree (entries a checkpoint covers are gone
        # or rewritten): nonzero means the store was tampered with or truncated.
        self.checkpoint_refusals = Counter(
            "ptc_audit_checkpoint_refusals",
            "Checkpoint rounds that refused to sign the tenant's tree: entries that an earlier "
            "checkpoint covers were removed or rewritten.",
            ["tenant"],
            registry=r,
        )
        # Sessions rebuilt on this server after their holder died or drained
        # (`sandbox.sessions.rebuild`): a rising `lost` rate means conversations that cannot
        # survive a server (clock, randomness, input files) or bounds set too low.
        self.session_rebuilds = Counter(
            "ptc_session_rebuilds",
            "Sessions this server rebuilt from their record (outcome rebuilt) or reported lost "
            "because their replay differed, could not run or exceeded a bound (outcome lost).",
            ["outcome"],
            registry=r,
        )
        self.session_rebuild_duration = Histogram(
            "ptc_session_rebuild_duration_seconds",
            "Wall time of a session rebuild: take-over, fresh sandbox, replay and checks.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self._busy: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._backends = dict(backends or {})
        r.register(_SandboxCollector(self))

    def sandboxes(self) -> Iterator[tuple[str, str, int]]:
        """(backend, state, count): idle from each warm pool, busy from running executions."""
        with self._lock:
            busy = dict(self._busy)
        for name, backend in self._backends.items():
            pool = _pool(backend)
            yield name, "idle", pool.idle if pool is not None else 0
            yield name, "busy", busy.get(name, 0)

    def rooms(self) -> Iterator[tuple[str, Capacity]]:
        """(backend, its `max_sandboxes` rooms) for the backends that have such a cap."""
        for name, backend in self._backends.items():
            if backend.capacity is not None:
                yield name, backend.capacity

    def watch(self, backends: Mapping[str, Backend]) -> None:
        """Reads these backends' pools from now on."""
        self._backends = dict(backends)

    def backend_of(self, pool: object) -> str:
        """The name of the backend whose warm pool ``pool`` is."""
        for name, backend in self._backends.items():
            if _pool(backend) is pool:
                return name
        return "unknown"

    def busy(self, backend: str, delta: int) -> None:
        with self._lock:
            self._busy[backend] += delta


def _pool(backend: Backend) -> Pool | None:
    try:
        return backend.pool
    except Exception:  # a backend not started yet has no pool (Unavailable)
        return None


class _SandboxCollector:
    """Reads the pools at scrape time, so that the gauge is never stale."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        family = GaugeMetricFamily(
            "ptc_sandboxes",
            "Sandboxes by state: idle (warm, in a pool) or busy (running an execution).",
            labels=["backend", "state"],
        )
        for backend, state, count in self._metrics.sandboxes():
            family.add_metric([backend, state], count)
        yield family
        rooms = GaugeMetricFamily(
            "ptc_sandbox_rooms",
            "max_sandboxes by state: limit, held (sandboxes starting, idle or running) and "
            "waiting (starts an execution waits for, every room taken).",
            labels=["backend", "state"],
        )
        evicted = CounterMetricFamily(
            "ptc_sandbox_rooms_evicted",
            "Idle warm sandboxes disposed of so that an execution waiting for a room got one.",
            labels=["backend"],
        )
        for backend, capacity in self._metrics.rooms():
            rooms.add_metric([backend, "limit"], capacity.limit)
            rooms.add_metric([backend, "held"], capacity.held)
            rooms.add_metric([backend, "waiting"], capacity.waiting)
            evicted.add_metric([backend], capacity.evicted)
        yield rooms
        yield evicted


class _State:
    metrics: Metrics | None = None


_state = _State()


def enable(backends: Mapping[str, Backend] | None = None) -> Metrics:
    """Turns the metrics on for this process (once) and returns them; the pools read are
    those of the latest server that asked (one per process in `ptc serve`)."""
    if _state.metrics is None:
        _state.metrics = Metrics(backends)
        observe_starts(sandbox_started)
    elif backends is not None:
        _state.metrics.watch(backends)
    return _state.metrics


def current() -> Metrics | None:
    return _state.metrics


def disable() -> None:
    """Turns the metrics off again (tests)."""
    _state.metrics = None


def serve(metrics: Metrics, listen: str) -> Any:
    """Serves ``metrics`` on ``listen`` (HOST:PORT) at /metrics; returns the server, whose
    ``server_address`` has the real port when asked for port 0."""
    from prometheus_client import start_http_server

    from sandbox.errors import InvalidArgument, Unavailable

    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit():
        raise InvalidArgument(f"--metrics-listen {listen!r}: expected HOST:PORT")
    try:
        server, _thread = start_http_server(
            int(port_text), addr=host.strip("[]") or "127.0.0.1", registry=metrics.registry
        )
    except OSError as exc:
        raise Unavailable(f"--metrics-listen {listen}: cannot listen: {exc}") from exc
    return server


# -- hooks (one None check when off) -------------------------------------------------------------
def execution_started(backend: str) -> None:
    if _state.metrics is not None:
        _state.metrics.busy(backend, +1)


def execution_finished(
    tenant: str, result: ExecutionResult, manifest: Manifest | None = None, *, started: bool = True
) -> None:
    """Counts a finished execution, its violations and its calls (by the tools' modes)."""
    m = _state.metrics
    if m is None:
        return
    if started:
        m.busy(result.backend, -1)
    m.executions.labels(str(result.status), result.backend, tenant).inc()
    if result.finished_at and result.started_at:
        m.execution_duration.labels(result.backend).observe(
            max(0.0, result.finished_at - result.started_at)
        )
    for violation in result.violations:
        m.violations.labels(violation.limit, str(violation.action)).inc()
    for call in result.calls:
        spec = manifest.tool(call.tool) if manifest is not None else None
        m.tool_calls.labels(str(call.status), spec.options.mode if spec else "unknown").inc()


def in_flight(state: str, delta: int) -> None:
    """An execution entered (+1) or left (-1) ``state``: ``queued`` or ``admitted``."""
    if _state.metrics is not None:
        _state.metrics.in_flight.labels(state).inc(delta)


def queue_wait(tenant: str, seconds: float) -> None:
    if _state.metrics is not None:
        _state.metrics.queue_wait.labels(tenant).observe(seconds)


def sandbox_started(pool: object, seconds: float) -> None:
    """A warm pool (``pool``: whose backend is looked up) started one sandbox."""
    if _state.metrics is not None:
        m = _state.metrics
        m.sandbox_start.labels(m.backend_of(pool)).observe(seconds)


def audit_write(operation: str, seconds: float) -> None:
    if _state.metrics is not None:
        _state.metrics.audit_write.labels(operation).observe(seconds)


def audit_write_failed(operation: str) -> None:
    if _state.metrics is not None:
        _state.metrics.audit_write_failures.labels(operation).inc()


def audit_pending(count: int) -> None:
    """Sets the number of completions kept until the audit store takes writes again."""
    if _state.metrics is not None:
        _state.metrics.audit_pending.set(count)


def audit_completion_dropped() -> None:
    if _state.metrics is not None:
        _state.metrics.audit_dropped.inc()


def audit_checkpoint(checkpoint: Checkpoint) -> None:
    """A `CheckpointPublisher` hook: the tenant's latest checkpoint, its size and time."""
    if _state.metrics is not None:
        m = _state.metrics
        m.checkpoint_tree_size.labels(checkpoint.tenant).set(checkpoint.tree_size)
        m.checkpoint_timestamp.labels(checkpoint.tenant).set(checkpoint.timestamp_ms / 1000)


def audit_checkpoint_refused(tenant: str) -> None:
    """A `CheckpointPublisher` refusal hook: one more round that would not sign the tenant."""
    if _state.metrics is not None:
        _state.metrics.checkpoint_refusals.labels(tenant).inc()


def session_rebuilt(outcome: str, seconds: float) -> None:
    """One session rebuild ended: ``outcome`` is ``rebuilt`` or ``lost``."""
    if _state.metrics is not None:
        _state.metrics.session_rebuilds.labels(outcome).inc()
        _state.metrics.session_rebuild_duration.observe(seconds)


def active_sessions(count: int) -> None:
    """Sets the number of open sessions (the session manager calls it as they change)."""
    if _state.metrics is not None:
        _state.metrics.active_sessions.set(count)
