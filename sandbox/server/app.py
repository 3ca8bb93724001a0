"""Builds, starts and stops the gRPC server: the service, health, reflection, and their parts.

    server = SandboxServer(ServerConfig(listen="127.0.0.1:0"))
    await server.start()          # server.address is "127.0.0.1:<port>"
    ...
    await server.stop()           # drain: finish or cancel in-flight runs, close the pool

The health service reports SERVING for the whole server and for `ptc.sandbox.v1.SandboxService`
while every backend can serve (started, and its warm pool not failing to start sandboxes), and
NOT_SERVING otherwise; a backend that fails its start-up checks leaves the server running and
answering UNAVAILABLE, so an operator can see why. Readiness, a separate service name
(`fleet.READINESS_SERVICE`), also needs a warm pool and an audit store that answers and takes
writes (`fleet.Readiness`, `audit_writes.AuditWrites`).
Stopping is ordered: health (readiness too) goes NOT_SERVING and new executions are refused with
UNAVAILABLE while the listener stays open, in-flight executions get `shutdown_grace_s` to finish
and are then cancelled (and recorded as `interrupted`), then the listener closes, the pool is
drained and the store closed. With a PostgreSQL store the tenancy is `GlobalQuotas`
(`fleet.fleet_tenancy`). With a store on disk the server joins the fleet sharing it
(`fleet.Membership`, at its advertised address) and carries session calls for sessions another
server holds to that server (`forwarding.Forwarder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, Any

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sandbox._proto import sandbox_pb2 as pb
from sandbox._proto import sandbox_pb2_grpc as pb_grpc
from sandbox.audit.base import AuditStore
from sandbox.backends.base import Backend
from sandbox.backends.process.cgroups.own_memory import own_memory
from sandbox.engine import Engine, EngineConfig
from sandbox.errors import InvalidArgument, PtcError, Unavailable
from sandbox.keepalive import Keepalive, server_options
from sandbox.limits import CEILINGS
from sandbox.message_bounds import request_bytes_bound, result_bytes_bound
from sandbox.runtimes import RuntimeStore
from sandbox.server import fleet
from sandbox.server.audit_writes import AuditWrites
from sandbox.server.config import ServerConfig
from sandbox.server.forwarding import FleetChannels, Forwarder
from sandbox.server.host_handlers import HostHandlers
from sandbox.server.interceptors import ErrorInterceptor
from sandbox.server.memory_budget import MemoryFit, fit_max_sandboxes, memory_ceiling
from sandbox.server.peers import FleetIdentity, outgoing_credentials
from sandbox.server.runner import Runner
from sandbox.server.service import SandboxServicer
from sandbox.server.store_memory import MemoryAuditStore
from sandbox.server.tenancy import SingleTenant
from sandbox.server.tls import ServerTls, server_credentials
from sandbox.tenants.base import Tenancy

if TYPE_CHECKING:
    from sandbox.audit.publisher import CheckpointPublisher

__all__ = ["SandboxServer"]

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SandboxService"].full_name
HEALTH_POLL_S = 1.0
FAILED_STARTS_UNHEALTHY = 3
STOP_BACKSTOP_S = 2.0
# The largest request the documented caps allow (script, manifest, input files under the
# ceilings, the rest): gRPC refuses a larger message with RESOURCE_EXHAUSTED before it is read.
RECEIVE_LIMIT_BYTES = request_bytes_bound(CEILINGS)


class SandboxServer:
    def __init__(
        self,
        config: ServerConfig | None = None,
        *,
        engine: Engine | None = None,
        store: AuditStore | None = None,
        tenancy: Tenancy | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        tenancy = tenancy or self._load_tenancy()
        self.memory_fit: MemoryFit | None = None
        if engine is None:
            self.memory_fit = fit_max_sandboxes(
                self.config.max_sandboxes, memory_ceiling(tenancy), own_memory()
            )
        self.engine = engine or Engine(EngineConfig(backends=self._default_backends()))
        self.store: AuditStore = store or self._open_store()
        self.tenancy: Tenancy = fleet.fleet_tenancy(self.config, tenancy)
        self.writes = AuditWrites(self.store)  # keeps completions the store refuses
        self.readiness = fleet.Readiness(self.store, self.writes)
        self.host = HostHandlers(
            self.config.host_handlers,
            self.config.host_handler_timeout_s,
            self.config.host_handler_concurrency,
        )
        self.runner = Runner(
            self.engine,
            self.writes,
            self.tenancy,
            self.host,
            RuntimeStore(self.config.runtimes_dir),
        )
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        self.address = ""
        self.membership: fleet.Membership | None = None
        self.forwarder: Forwarder | None = None
        self.backend_error: str | None = None
        self._server: aio.Server | None = None
        self._monitor: asyncio.Task[None] | None = None
        self.metrics_address = ""  # HOST:PORT of /metrics, when served
        self._metrics_server: Any = None
        self.checkpoints = _checkpoint_publisher(self.config, self.store)
        self._checkpointing: asyncio.Task[None] | None = None

    def _default_backends(self) -> dict[str, Backend]:
        from sandbox.backends.factory import BackendOptions, build_backends

        # The pool size, the sandbox count and degraded mode are the process backend's; a Docker
        # one keeps its own.
        shared = BackendOptions(runtimes_dir=self.config.runtimes_dir)
        wanted = {
            "process": dataclasses.replace(
                shared,
                pool_size=self.config.pool_size,
                max_sandboxes=(
                    self.memory_fit.max_sandboxes if self.memory_fit else self.config.max_sandboxes
                ),
                allow_degraded=self.config.allow_degraded,
            )
        }
        if self.config.docker:
            wanted["docker"] = shared
        if self.config.gvisor:
            wanted["gvisor"] = shared
        return build_backends(wanted)

    def _open_store(self) -> AuditStore:
        if self.config.audit_db is None:
            return MemoryAuditStore()
        from sandbox.audit import open_store

        store = open_store(self.config.audit_db, instance=self.config.instance_id)
        # Records this instance admitted before a crash never completed: say so, once.
        interrupted = store.mark_interrupted()
        if interrupted:
            log.warning("audit: %d executions were interrupted by a restart", interrupted)
        return store

    def _load_tenancy(self) -> Tenancy:
        if self.config.tenants is None:
            return SingleTenant()
        from sandbox.tenants import load_tenancy

        return load_tenancy(self.config.tenants)

    async def start(self) -> str:
        """Starts the backends and the server; returns the address it listens on."""
        tls, credentials = self._transport_security()
        fleet_identity = FleetIdentity(None if tls is None else tls.fleet_ca)
        self.forwarder = await self._forwarder(fleet_identity, tls is not None)
        if self.config.metrics_listen:  # first: a bad address fails before anything starts
            self._serve_metrics(self.config.metrics_listen)
        try:
            await self.engine.start()
        except PtcError as exc:
            self.backend_error = exc.message
            log.error("the sandbox backend cannot serve: %s", exc.message)
        await fleet.start_tenancy(self.tenancy)
        server = self._grpc_server(fleet_identity)
        host, _, _port = self.config.listen.rpartition(":")
        port = (
            server.add_insecure_port(self.config.listen)
            if credentials is None
            else server.add_secure_port(self.config.listen, credentials)
        )
        if port == 0:
            raise Unavailable(f"cannot listen on {self.config.listen}")
        await server.start()
        self._server = server
        self.address = f"{host}:{port}"
        if self.config.audit_db is not None:  # in memory there is no fleet to join
            self._join_fleet()
        await self._set_health()
        self._monitor = asyncio.create_task(self._watch_health())
        if self.checkpoints is not None:
            interval = self.config.checkpoint_interval_s or DEFAULT_CHECKPOINT_INTERVAL_S
            self._checkpointing = asyncio.create_task(self.checkpoints.run(interval))
        return self.address

    def _transport_security(self) -> tuple[ServerTls | None, grpc.ServerCredentials | None]:
        """The TLS settings and the credentials they make, read and checked before anything
        starts (a bad file fails with its name, at once); refuses an address off loopback where
        nothing authenticates callers, and warns where nothing encrypts them."""
        host = self.config.listen.rpartition(":")[0].strip("[]")
        if not self.tenancy.requires_auth and not _is_loopback(host):
            raise InvalidArgument(
                f"listen: {self.config.listen} is not a loopback address, and without a tenants "
                "file nothing authenticates callers; configure tenants or listen on 127.0.0.1"
            )
        tls = ServerTls.from_options(
            self.config.tls_cert,
            self.config.tls_key,
            self.config.tls_client_ca,
            self.config.fleet_ca,
        )
        credentials = None if tls is None else server_credentials(tls)
        if tls is None and not _is_loopback(host):
            log.warning(
                "listen: %s without TLS: API keys and scripts cross the network in plaintext; "
                "serve TLS (--tls-cert, --tls-key) unless a proxy in front terminates it",
                self.config.listen,
            )
        return tls, credentials

    def _grpc_server(self, fleet_identity: FleetIdentity) -> aio.Server:
        """The gRPC server with its services (sandbox, health, reflection), not yet listening."""
        limit = self.config.max_message_bytes
        server = aio.server(
            interceptors=[ErrorInterceptor(self.tenancy, fleet_identity)],
            options=[
                ("grpc.max_receive_message_length", RECEIVE_LIMIT_BYTES),
                # A result (or a record: its request and result) as large as the limits allow
                # must reach the client as a result, never as RESOURCE_EXHAUSTED.
                ("grpc.max_send_message_length", limit + result_bytes_bound(CEILINGS)),
                ("grpc.so_reuseport", 0),
                # Accept the clients' keepalive pings (never GOAWAY too_many_pings at our SDKs'
                # rate) and ping the clients, so that a vanished one's calls end.
                *server_options(self.config.keepalive_interval_s, self.config.keepalive_timeout_s),
            ],
        )
        pb_grpc.add_SandboxServiceServicer_to_server(
            SandboxServicer(self.runner, self.forwarder), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME, fleet.READINESS_SERVICE),
            server,
        )
        return server

    def _join_fleet(self) -> None:
        """Advertises this server to the fleet sharing its store, under a renewed lease."""
        advertised = self.config.advertise or _reachable(self.address)
        if self.forwarder is not None:
            self.forwarder.address = advertised
        self.membership = fleet.Membership(self.writes, advertised, self.config.member_lease_ttl_s)
        self.membership.start()

    async def _forwarder(self, identity: FleetIdentity, tls: bool) -> Forwarder | None:
        """What carries session calls to the server holding them; None without a shared store
        (in memory) or, under a fleet CA, without this server's fleet certificate."""
        config = self.config
        credentials = outgoing_credentials(
            tls, config.fleet_cert, config.fleet_key, config.fleet_peer_ca
        )
        if config.audit_db is None:
            return None
        if not identity.uses_certificates:  # the fleet's proof is the store's secret
            identity.secret = await asyncio.to_thread(self.writes.fleet_secret)
        elif config.fleet_cert is None:
            log.warning(
                "fleet: no fleet certificate (--fleet-cert, --fleet-key): session calls for "
                "sessions other servers hold are answered here (NOT_FOUND), not carried to them"
            )
            return None
        channels = FleetChannels(
            credentials,
            RECEIVE_LIMIT_BYTES + result_bytes_bound(CEILINGS),
            # A peer silent as long as a client may be is given up on the same way.
            Keepalive(self.config.keepalive_interval_s, self.config.keepalive_timeout_s),
        )
        return Forwarder(
            self.writes,
            identity,
            channels,
            instance=config.instance_id or socket.gethostname(),  # as the audit store's
            holds=self.runner.sessions.holds,
        )

    def _serve_metrics(self, listen: str) -> None:
        from sandbox.telemetry import metrics

        served = metrics.serve(metrics.enable(self.engine.config.backends), listen)
        self._metrics_server = served
        host = listen.rpartition(":")[0]
        self.metrics_address = f"{host}:{served.server_address[1]}"

    def serving(self) -> bool:
        """Health follows the default backend; another one (Docker without an engine) being
        unavailable is answered per request with UNAVAILABLE."""
        if self.backend_error is not None:
            return False
        default = self.engine.config.backends.get(self.engine.config.default_backend)
        return default is not None and _backend_ok(default)

    async def _set_health(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.serving()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        await self._set_readiness()

    async def _set_readiness(self) -> None:
        default = self.engine.config.backends.get(self.engine.config.default_backend)
        try:
            pool = default.pool if default is not None else None
            idle = None if pool is None or not pool.target else pool.idle
        except PtcError:
            idle = 0  # not started: cold
        ready = await self.readiness.check(
            self.serving(), idle, draining=self.runner.refusing is not None
        )
        await self.health.set(
            fleet.READINESS_SERVICE,
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING,
        )

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            await self._set_health()

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful shutdown: nothing admitted is lost, nothing started is left behind."""
        grace = self.config.shutdown_grace_s if grace_s is None else grace_s
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
            self._monitor = None
        # Drain: health (liveness, service and readiness) turns NOT_SERVING at once and new
        # executions are refused with UNAVAILABLE, while the listener stays open so that load
        # balancers and clients can see both; in-flight executions get the grace to finish.
        self.runner.refusing = fleet.DRAINING_MESSAGE
        await self.health.enter_graceful_shutdown()
        if self.runner.in_flight:
            log.warning(
                "draining: %d executions in flight get %.1f s to finish",
                self.runner.in_flight,
                grace,
            )
        await self.runner.drain(grace)
        if self._server is not None:
            # Closes the listener; RPCs still open (their runs ended above) get the backstop.
            await self._server.stop(STOP_BACKSTOP_S)
            self._server = None
        await self.runner.drain(0)
        if self.membership is not None:
            await self.membership.close()
            self.membership = None
        if self.forwarder is not None:
            await self.forwarder.channels.close()
        await fleet.close_tenancy(self.tenancy)
        await self.readiness.close()
        await self._last_recovery()
        await self.engine.close()
        self._left_behind()
        await self._last_checkpoint()
        self.store.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        from sandbox.telemetry import tracing

        tracing.shutdown()  # flushes spans still batched

    def _left_behind(self) -> None:
        """Says which host handlers still run: their executions have ended (recorded with the
        call cancelled); their threads are daemons, and the process exits without them."""
        self.host.threads.close()
        busy = self.host.threads.busy()
        if busy:
            log.warning(
                "host handlers: %d calls still run at shutdown and are left behind (the process"
                " exits without them): %s",
                len(busy),
                ", ".join(f"{tool} for {seconds:.1f} s" for tool, seconds in busy),
            )

    async def _last_recovery(self) -> None:
        """Writes the completions the store refused, if it takes them now; says which records
        stay `running` otherwise (the next start with this instance id marks them)."""
        if not self.writes.pending:
            return
        try:
            await asyncio.to_thread(self.writes.recover)
        except Exception:
            log.exception("audit: writing the kept completions at shutdown failed")
        lost = self.writes.abandon()
        if lost:
            log.error(
                "audit: the store still refuses writes (%s): %d records stay `running` until "
                "the next start with instance id %r marks them `interrupted`: %s",
                self.writes.failure,
                len(lost),
                self.config.instance_id or "(the host name)",
                ", ".join(lost),
            )

    async def _last_checkpoint(self) -> None:
        """Stops the periodic checkpoints and signs one over what this run recorded."""
        if self._checkpointing is not None:
            self._checkpointing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpointing
            self._checkpointing = None
        if self.checkpoints is not None:
            try:
                await asyncio.to_thread(self.checkpoints.publish_once)
            except PtcError as exc:
                log.error("audit checkpoint at shutdown failed: %s", exc.message)

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _reachable(address: str) -> str:
    """``address`` as another server reaches it: a wildcard host becomes this host's name."""
    host, _, port = address.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", ""):  # noqa: S104  -- recognised, not bound
        return f"{socket.gethostname()}:{port}"
    return address


def _backend_ok(backend: Backend) -> bool:
    try:
        pool = backend.pool
    except PtcError:
        return False  # not started
    return pool is None or pool.failed_starts < FAILED_STARTS_UNHEALTHY


DEFAULT_CHECKPOINT_INTERVAL_S = 300.0


def _checkpoint_publisher(config: ServerConfig, store: AuditStore) -> CheckpointPublisher | None:
    """The checkpoint publisher when checkpoints are configured; refuses what cannot work."""
    if config.checkpoint_interval_s is None and config.checkpoint_dir is None:
        return None
    from sandbox.audit import SqlAuditStore
    from sandbox.audit.checkpoints import load_private_key
    from sandbox.audit.publisher import CheckpointPublisher

    if config.checkpoint_interval_s is not None and config.checkpoint_interval_s <= 0:
        raise InvalidArgument(
            f"checkpoint interval {config.checkpoint_interval_s}: must be a positive number "
            "of seconds"
        )
    if not isinstance(store, SqlAuditStore):
        raise InvalidArgument(
            "audit checkpoints need an audit store (--audit-db PATH|URL), not one in memory"
        )
    publisher = CheckpointPublisher(
        store,
        load_private_key(config.checkpoint_key),
        directory=config.checkpoint_dir,
        origin=config.instance_id,
    )
    if config.metrics_listen:  # the third way of publishing: ptc_audit_checkpoint_* gauges
        from sandbox.telemetry import metrics

        publisher.add_hook(metrics.audit_checkpoint)
        publisher.add_refusal_hook(metrics.audit_checkpoint_refused)
    return publisher
