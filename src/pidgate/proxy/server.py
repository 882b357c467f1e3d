"""The proxy as a whole: listeners, the quota manager's housekeeping, graceful shutdown.

Owns: ``ProxyServer`` (start / stop / addresses) and ``DecisionCounters``, the in-process tally
of decisions that the demo shows (and that metrics will read).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pidgate.config import Settings
from pidgate.protocol.api_versions import inspected_api_version_limits
from pidgate.protocol.client_quotas.entities import PRODUCER_IDS_RATE, QuotaChange
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.logs import RateLimitedLog, get_logger
from pidgate.proxy.operations.event_log import EventLog
from pidgate.proxy.operations.http import AdminHttpServer
from pidgate.proxy.operations.metrics import DELIVERY_TIMEOUT_MS_DEFAULT, ProxyMetrics
from pidgate.proxy.operations.stepping import LOOP_STEP_PRINCIPALS, run_in_steps
from pidgate.proxy.quota_control.admission import (
    DecisionObserver,
    Gatekeeper,
    ProduceContext,
    monotonic_ms,
    quota_clock_ms,
)
from pidgate.proxy.quota_control.fleet import (
    FleetCollector,
    FleetError,
    FleetOutbox,
    FleetRecord,
    FleetSync,
)
from pidgate.proxy.quota_control.pid_frontier import FrontierProber, FrontierResult
from pidgate.proxy.quota_control.quota_admin import QuotaAdmin, entity_key
from pidgate.proxy.quota_control.quotas_in_force import (
    EncodedSave,
    encode_for_saving_in_steps,
    open_quota_control,
    snapshot_for_saving,
    write_encoded,
    write_snapshot,
)
from pidgate.proxy.quota_control.shared_store import QuotaOverride, SharedQuotaStore
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.proxy.serving.connection import ClientConnection
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.flow_control import ConnectionLimits
from pidgate.proxy.serving.identity import IdentityPolicy
from pidgate.proxy.serving.routing import Address, BrokerRoute, Router
from pidgate.proxy.serving.tls import CertificateReloader, client_ssl_context, upstream_ssl_context
from pidgate.proxy.upstream_check import describe_error, unanswered_reason
from pidgate.quota.grandfather import Enforcement
from pidgate.quota.manager import Admitted, Decision


@dataclass
class DecisionCounters:
    """Running totals of quota decisions (a ``DecisionObserver``)."""

    new_producer_ids_admitted: int = 0
    produce_requests_rejected: int = 0
    rejected_producer_ids: set[int] = field(default_factory=set)
    max_rejected_ids_kept: int = 100_000
    #: Rejected Produce requests by ApiVersions client_software_name ("unknown" when not sent).
    rejections_by_client_software: Counter[str] = field(default_factory=Counter)
    max_client_software_kept: int = 100

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        if isinstance(decision, Admitted):
            self.new_producer_ids_admitted += len(decision.new_producer_ids)
            self.rejected_producer_ids.difference_update(decision.new_producer_ids)
        else:
            self.produce_requests_rejected += 1
            software = context.client_software_name or "unknown"
            # The name is the client's choice: bound the table (a per-connection random name
            # must not grow it forever).
            if software in self.rejections_by_client_software or (
                len(self.rejections_by_client_software) < self.max_client_software_kept
            ):
                self.rejections_by_client_software[software] += 1
            else:
                self.rejections_by_client_software["other"] += 1
            if len(self.rejected_producer_ids) < self.max_rejected_ids_kept:
                self.rejected_producer_ids.update(decision.unknown_producer_ids)


def _log_long_wait(
    log: RateLimitedLog, principal: str, producer_id: int, waited_ms: int, threshold_ms: int
) -> None:
    """KIP-91: a throttled producer gives its records up after delivery.timeout.ms (120 s by
    default); say when one of its PIDs has waited half of that, and when all of it."""
    past = "delivery_timeout" if threshold_ms >= DELIVERY_TIMEOUT_MS_DEFAULT else "half"
    log.warning(
        "producer_id_throttled_past_delivery_timeout"
        if past == "delivery_timeout"
        else "producer_id_throttled_past_half_delivery_timeout",
        key=principal,
        principal=principal,
        producer_id=producer_id,
        waited_ms=waited_ms,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS_DEFAULT,
        hint="clients fail records after delivery.timeout.ms: raise producer_ids_rate for this "
        "user if these producers are legitimate",
    )


class ProxyServer:
    def __init__(self, settings: Settings, observers: tuple[DecisionObserver, ...] = ()) -> None:
        self.settings = settings
        self.counters = DecisionCounters()
        self.quota_control = open_quota_control(settings, quota_clock_ms)
        self.quota = self.quota_control.manager
        log = RateLimitedLog(
            max_events=settings.logging.rate_limit_events,
            interval_ms=settings.logging.rate_limit_interval_ms,
        )
        self.metrics = ProxyMetrics(
            self.quota,
            quota_clock_ms,
            max_user_labels=settings.admin.max_user_labels,
            on_long_wait=functools.partial(_log_long_wait, log),
        )
        self.event_log = self._open_event_log(settings)
        #: What this member admitted, for the fleet (None: no fleet.id).
        self.fleet_outbox = self._open_fleet_outbox(settings)
        self.fleet: FleetSync | None = None
        if self.event_log is not None:
            self.metrics.event_log_stats = self.event_log.stats
        self.router = Router(settings.proxy, self._open_broker_listener)
        self.context = ProxyContext(
            settings=settings,
            gatekeeper=Gatekeeper(
                self.quota,
                (
                    self.counters,
                    self.metrics,
                    *((self.event_log,) if self.event_log else ()),
                    *((self.fleet_outbox,) if self.fleet_outbox else ()),
                    *observers,
                ),
                on_observer_error=self._observer_failed,
                failure_policy=settings.proxy.quota_failure_policy,
                failure_throttle_ms=settings.proxy.quota_failure_throttle_ms,
                on_quota_error=self._quota_failed,
            ),
            router=self.router,
            log=log,
            api_version_limits=inspected_api_version_limits(),
            identity=IdentityPolicy(settings),
            upstream_ssl=upstream_ssl_context(settings.upstream_tls),
            traffic=self.metrics,
            event_log=self.event_log,
            quota_admin=QuotaAdmin(self.quota_control.effective_rates, self._apply_quota_changes),
            waiting_room=self._open_waiting_room(settings),
        )
        self.connection_limits = ConnectionLimits()
        #: Quota failures not yet logged (one line per logging interval says how many).
        self._quota_failures_unlogged = 0
        self._quota_failure_logged_ms: int | None = None
        self._admin: AdminHttpServer | None = None
        self._client_ssl = client_ssl_context(settings.client_tls)
        self._certificates = (
            CertificateReloader(self._client_ssl, settings.client_tls) if self._client_ssl else None
        )
        self._bootstrap: asyncio.Server | None = None
        self._broker_servers: dict[int, asyncio.Server] = {}
        self._housekeeping: asyncio.Task[None] | None = None
        self._stopping = False
        self._reloading: asyncio.Task[None] | None = None
        self._persisting: asyncio.Task[None] | None = None
        #: Held while the state file is written: a periodic write still running in its thread
        #: when pidgate stops is never left to replace the final, newer one.
        self._state_write_lock = threading.Lock()
        self._shared_store: SharedQuotaStore | None = None
        self._probes: set[asyncio.Future[None]] = set()
        self._prober = FrontierProber(
            [str(upstream) for upstream in settings.proxy.upstream],
            security=dict(settings.shared_store.security),
            timeout_ms=settings.quota.grandfather_probe_timeout_ms,
        )
        #: The latest PID frontier probe (for /state), and when it finished (quota clock).
        self.last_frontier: FrontierResult | None = None
        self.last_frontier_ms: int | None = None
        self.quota_control.on_enforcement_began = self._enforcement_began

    def _open_fleet_outbox(self, settings: Settings) -> FleetOutbox | None:
        fleet = settings.fleet
        if fleet.id is None:
            return None
        self.quota.announce_refreshes = True
        listen = settings.proxy.listen
        instance = settings.shared_store.instance_id or (
            f"{settings.proxy.effective_advertised_host}_{listen.port}"
        )
        # A per-process suffix: this process skips its own records, but a restarted member
        # replays those of its previous incarnation.
        member = f"{instance}-{secrets.token_hex(4)}"
        return FleetOutbox(member, quota_clock_ms, fleet.max_pending_producer_ids)

    async def _start_fleet(self) -> None:
        """Join the fleet before serving: read the fleet topic one window back and apply it,
        so every PID the fleet admitted within the window is known here and every bucket has
        the fleet's level (issue "fleet")."""
        outbox = self.fleet_outbox
        topic = self.settings.fleet.effective_topic
        if outbox is None or topic is None:
            return
        loop = asyncio.get_running_loop()

        def on_records(records: list[FleetRecord]) -> None:  # on the fleet thread
            loop.call_soon_threadsafe(self._apply_fleet, records)

        fleet = FleetSync(
            [str(upstream) for upstream in self.settings.proxy.upstream],
            topic,
            outbox,
            on_records,
            window_ms=self.settings.quota.window_ms,
            flush_interval_ms=self.settings.fleet.flush_interval_ms,
            security=dict(self.settings.shared_store.security),
        )
        try:
            await asyncio.to_thread(fleet.start, self.settings.fleet.catch_up_timeout_ms / 1000)
        except FleetError as error:
            raise OSError(f"fleet {self.settings.fleet.id!r}: {error}") from error
        # Records the reader handed over before it reported the catch-up are applied by now:
        # the loop runs call_soon_threadsafe callbacks in order.
        self.fleet = fleet
        self.metrics.registry.register(FleetCollector(fleet))

    def _apply_fleet(self, records: list[FleetRecord]) -> None:
        """Other members' admissions, on the event loop: their PIDs become known here and, in
        fleet scope, their tokens are debited here, each at the time it was taken."""
        fleet_scope = self.settings.fleet.scope == "fleet"
        now_ms = quota_clock_ms()
        for record in records:
            self.quota.learn(
                record.principal,
                record.new_producer_ids + record.known_producer_ids,
                len(record.new_producer_ids) if fleet_scope else 0,
                min(record.ts_ms, now_ms),
            )

    def _open_event_log(self, settings: Settings) -> EventLog | None:
        config = settings.event_log
        if config.directory is None:
            return None
        listen = settings.proxy.listen
        return EventLog(
            config.directory,
            instance=config.instance or f"{settings.proxy.effective_advertised_host}:{listen.port}",
            # The decision's own instant, so the backtest replays at the same times.
            now_ms=lambda: self.context.gatekeeper.decided_at_ms or quota_clock_ms(),
            tokens_for=self.quota.tokens,
            gzip=config.gzip,
            rotate_bytes=config.rotate_bytes,
            rotate_interval_s=float(config.rotate_interval_s),
            max_queued_events=config.max_queued_events,
        )

    def _apply_quota_changes(
        self, changes: list[tuple[int, QuotaChange]]
    ) -> Mapping[int, tuple[int, str | None]]:
        failures = self.quota_control.apply_changes(changes)
        for _, change in changes:
            if change.key != PRODUCER_IDS_RATE:
                continue  # a mode change: quota_control logs quota_mode_changed itself
            get_logger().info(
                "quota_changed",
                user=entity_key(change.entity),
                producer_ids_rate=change.rate,
                source="client_quotas_api",
            )
        return failures

    def reload(self, settings: Settings) -> None:
        """Apply a re-read config file (SIGHUP): quotas, rejection table, log rate limits, quota
        failure policy, connection limits and idle timeout (at their next check). Listener, TLS
        and routing settings need a restart and are left as they are."""
        self.quota_control.reload(settings)
        self.settings = settings
        self.context.settings = settings
        self.context.gatekeeper.failure_policy = settings.proxy.quota_failure_policy
        self.context.gatekeeper.failure_throttle_ms = settings.proxy.quota_failure_throttle_ms
        self.metrics.config_reloaded(True)
        get_logger().info("config_reloaded", producer_ids_rate=self.quota_control.effective_rates())

    def state(self) -> dict[str, Any]:
        state = self.quota_control.state()
        probe = self.last_frontier
        state["grandfather"]["last_probe"] = (
            None
            if probe is None
            else {
                "frontier": probe.frontier,
                "reason": probe.reason,
                "brokers": {str(node): list(pids) for node, pids in probe.per_broker.items()},
                "finished_ms": self.last_frontier_ms,
                "elapsed_ms": probe.elapsed_ms,
            }
        )
        state["connections"] = len(self.context.connections)
        if self.fleet is not None:
            state["fleet"] = {"id": self.settings.fleet.id, "scope": self.settings.fleet.scope}
            state["fleet"].update(self.fleet.status())
        state["listeners"] = {
            "bootstrap": "{}:{}".format(*self.bootstrap_address) if self._bootstrap else None,
            "brokers": self.broker_listener_ports,
        }
        return state

    async def upstream_ready(self) -> bool | str:
        """For /readyz: every listener serves and an upstream broker accepts a TCP connection;
        otherwise the reason (``no upstream broker answered at 127.0.0.1:9 (connection
        refused)``)."""
        not_ready = self.context.notices.not_ready_reason
        if not_ready is not None:
            return not_ready
        return await unanswered_reason(self.router.bootstrap_upstreams) or True

    def _observer_failed(self, observer: DecisionObserver, error: Exception) -> None:
        self.metrics.observer_error()
        self.context.log.warning(
            "observer_failed",
            key=type(observer).__name__,
            observer=type(observer).__name__,
            error=repr(error),
        )

    def _quota_failed(self, error: Exception) -> None:
        """The quota manager raised (``Gatekeeper``'s ``on_quota_error``): counted every time,
        logged at most once per ``logging.rate_limit_interval_ms`` (a broken quota fails every
        Produce: thousands a second), each line saying how many failures it stands for."""
        self.metrics.protocol_error("quota_failure")  # the former place; kept for dashboards
        self.metrics.quota_failure()
        self._quota_failures_unlogged += 1
        now_ms = monotonic_ms()
        last = self._quota_failure_logged_ms
        if last is not None and now_ms - last < self.settings.logging.rate_limit_interval_ms:
            return
        self._quota_failure_logged_ms = now_ms
        failures, self._quota_failures_unlogged = self._quota_failures_unlogged, 0
        get_logger().error(
            "quota_failure",
            error=repr(error),
            policy=self.context.gatekeeper.failure_policy,
            failures=failures,
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listen = self.settings.proxy.listen
        await self._warn_before_serving()
        # Enforcement begins now for every principal without saved state: learn the PID
        # frontier before the first request is read (bounded by the probe timeout).
        await self._resolve_enforcement(self.quota.begin_enforcement(quota_clock_ms()), "start")
        await self._start_fleet()
        try:
            self._bootstrap = await loop.create_server(
                lambda: ClientConnection(
                    self.context,
                    lambda: self.router.bootstrap_upstreams,
                    limits=self.connection_limits,
                ),
                listen.host,
                listen.port,
                reuse_address=True,
                reuse_port=self.settings.proxy.reuse_port or None,
                ssl=self._client_ssl,
            )
        except OSError as error:
            raise OSError(
                error.errno,
                f"bootstrap listener {listen} (setting proxy.listen, --listen, "
                f"PIDGATE_PROXY_LISTEN): {error.strerror or error}",
            ) from error
        await self._start_shared_store()
        if self.settings.admin.enabled:
            admin = self.settings.admin.listen
            self._admin = AdminHttpServer(self.metrics, self.state, self.upstream_ready)
            try:
                await self._admin.start(admin.host, admin.port)
            except OSError as error:
                raise OSError(
                    error.errno,
                    f"admin HTTP listener {admin} (setting admin.listen, --http, "
                    f"PIDGATE_ADMIN_LISTEN): {error.strerror or error}",
                ) from error
        self._housekeeping = asyncio.ensure_future(self._expire_periodically())
        if self.settings.state.path is not None:
            self._persisting = asyncio.ensure_future(self._persist_periodically())
        if self._certificates is not None:
            self._reloading = asyncio.ensure_future(self._reload_certificates_periodically())
        if not self.quota_control.effective_rates():
            self.context.notices.no_quota()
        get_logger().info(
            "pidgate_started",
            listen=str(listen),
            mode=self.settings.proxy.mode,
            upstream=[str(hp) for hp in self.settings.proxy.upstream],
            default_producer_ids_rate=self.settings.quota.default_producer_ids_rate,
            user_producer_ids_rates=self.settings.quota.user_producer_ids_rates,
            window_seconds=self.settings.quota.window_size_seconds,
            client_tls=self.settings.client_tls.enabled,
            sasl=self.settings.identity.sasl,
            upstream_tls=self.settings.upstream_tls.enabled,
        )

    async def _warn_before_serving(self) -> None:
        """What will go wrong with these settings, said before the (up to
        ``quota.grandfather_probe_timeout_ms``) frontier probe: no upstream broker answering,
        sidecar mode without a fleet."""
        unanswered = await unanswered_reason(self.router.bootstrap_upstreams)
        if unanswered is not None:
            self.context.notices.upstream_unreachable_at_start(unanswered)
        if self.settings.proxy.mode == "sidecar" and self.settings.fleet.id is None:
            self.context.notices.sidecar_without_fleet()

    def _open_waiting_room(self, settings: Settings) -> WaitingRoom | None:
        rejection = settings.rejection
        if rejection.max_hold_ms <= 0:
            return None
        room = WaitingRoom(rejection.max_held_requests, rejection.max_held_bytes, time.monotonic)
        # A raised (or removed) quota relieves held requests at once, not at the next refill.
        self.quota_control.on_policy_changed.append(room.wake_soon_all)
        self.metrics.waiting_room = room
        return room

    async def stop(self) -> None:
        """Stop accepting and reading, let requests already read finish within the grace
        period, then close. Requests a client sends after this are never forwarded, so its
        retry through another pidgate cannot duplicate them."""
        self._stopping = True  # no new broker listeners from here on
        servers = [s for s in (self._bootstrap, *self._broker_servers.values()) if s is not None]
        for server in servers:
            server.close()
        for conn in list(self.context.connections):
            conn.begin_shutdown()
        if self.context.waiting_room is not None:
            self.context.waiting_room.close()
        deadline = monotonic_ms() + self.settings.proxy.shutdown_grace_ms
        while monotonic_ms() < deadline and any(not conn.idle for conn in self.context.connections):
            await asyncio.sleep(0.05)
        closing = list(self.context.connections)
        for conn in closing:
            conn.close()
        if self._admin is not None:
            await self._admin.stop()
        if self._shared_store is not None:
            await asyncio.to_thread(self._shared_store.stop)
        if self.fleet is not None:
            await asyncio.to_thread(self.fleet.stop)
        await asyncio.to_thread(self._prober.close)
        if self.event_log is not None:
            await asyncio.to_thread(self.event_log.close)
        for task in (self._housekeeping, self._reloading, self._persisting, *self._probes):
            if task is not None:
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
        if self.settings.state.path is not None:
            # After the periodic save is cancelled: this is the last write (the lock waits for
            # one that was already running in its thread).
            self._save_state_now()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        get_logger().info("pidgate_stopped", connections_closed=len(closing))

    # -- addresses ----------------------------------------------------------------------------

    @property
    def bootstrap_address(self) -> Address:
        assert self._bootstrap is not None
        host, port = self._bootstrap.sockets[0].getsockname()[:2]
        return (host, port)

    @property
    def broker_listener_ports(self) -> dict[int, int]:
        return {
            node: server.sockets[0].getsockname()[1]
            for node, server in self._broker_servers.items()
            if server.sockets
        }

    # -- internals ----------------------------------------------------------------------------

    async def _open_broker_listener(self, route: BrokerRoute) -> None:
        if route.node_id in self._broker_servers or self._stopping:
            return
        loop = asyncio.get_running_loop()
        host = self.settings.proxy.listen.host
        port = self.settings.proxy.broker_listen_port(route.node_id)
        try:
            server = await loop.create_server(
                lambda: ClientConnection(
                    self.context,
                    lambda: [route.upstream],
                    route.node_id,
                    limits=self.connection_limits,
                ),
                host,
                port,
                reuse_address=True,
                reuse_port=self.settings.proxy.reuse_port or None,
                ssl=self._client_ssl,
            )
        except (OSError, OverflowError) as error:  # OverflowError: base + node_id > 65535
            # Retried on the next response naming this broker; rate-limited, since that can be
            # every Produce response while the port stays taken. Not ready meanwhile: Metadata
            # sends clients to this port.
            fix = (
                "free the port, or move it with proxy.broker_ports "
                f"({{{route.node_id}: PORT}}) or proxy.broker_port_base (--broker-port-base)"
            )
            self.context.notices.listener_failed(
                f"broker listener for node {route.node_id}",
                f"{host}:{port}: {getattr(error, 'strerror', None) or error}; {fix}",
            )
            self.context.log.warning(
                "broker_listener_failed",
                key=str(route.node_id),
                node_id=route.node_id,
                listen=f"{host}:{port}",
                upstream=f"{route.upstream[0]}:{route.upstream[1]}",
                error=str(error),
                fix=fix,
            )
            raise
        self.context.notices.listener_opened(f"broker listener for node {route.node_id}")
        self._broker_servers[route.node_id] = server
        get_logger().info(
            "broker_listener_opened",
            node_id=route.node_id,
            listen=f"{host}:{port}",
            upstream=f"{route.upstream[0]}:{route.upstream[1]}",
        )

    async def _reload_certificates_periodically(self) -> None:
        assert self._certificates is not None
        interval_s = self.settings.client_tls.reload_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                if self._certificates.reload_if_changed():
                    get_logger().info(
                        "certificates_reloaded", certfile=str(self.settings.client_tls.certfile)
                    )
            except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
                self.context.log.warning(
                    "certificates_reload_failed",
                    key="reload",
                    error=str(error),
                    certfile=str(self.settings.client_tls.certfile),
                )

    async def _start_shared_store(self) -> None:
        """Join the fleet's shared quota topic: catch up on its overrides before serving, then
        publish local changes and apply remote ones as they come."""
        shared = self.settings.shared_store
        if shared.topic is None:
            return
        loop = asyncio.get_running_loop()
        listen = self.settings.proxy.listen

        def on_change(override: QuotaOverride) -> None:  # on the store's reader thread
            loop.call_soon_threadsafe(self._apply_shared, override)

        store = SharedQuotaStore(
            [str(upstream) for upstream in self.settings.proxy.upstream],
            shared.topic,
            shared.instance_id or f"{self.settings.proxy.effective_advertised_host}:{listen.port}",
            on_change,
            security=dict(shared.security),
        )
        await asyncio.to_thread(store.start)
        self._shared_store = store

        def publish(user: str, rate: int | None) -> None:
            future = loop.run_in_executor(None, store.publish, QuotaOverride(user, rate))
            future.add_done_callback(self._published)

        self.quota_control.listeners.append(publish)

    def _published(self, future: asyncio.Future[None]) -> None:
        error = future.exception()
        if error is not None:  # applied here already; the fleet learns it on a later change
            self.context.log.warning("shared_store_publish_failed", key="publish", error=str(error))

    def _apply_shared(self, override: QuotaOverride) -> None:
        if self.quota_control.apply_remote(override.user, override.producer_ids_rate):
            get_logger().info(
                "quota_changed",
                user=override.user,
                producer_ids_rate=override.producer_ids_rate,
                source="shared_store",
            )

    # -- grandfathering: the PID frontier --------------------------------------------------------

    def _enforcement_began(self, enforcement: Enforcement) -> None:
        """A policy change made principals limited (on the event loop): probe the frontier now;
        until it answers (milliseconds), their unknown PIDs are admitted as in learning mode."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # changed from outside the loop (tests): nothing can probe
            enforcement.resolve(None, "quota changed outside the event loop: no probe")
            return
        task = loop.create_task(self._resolve_enforcement(enforcement, "quota_change"))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _resolve_enforcement(self, enforcement: Enforcement, cause: str) -> None:
        policy = self.quota.policy
        if enforcement.grace_ms == 0:
            enforcement.disable("grandfathering off (quota.grandfather_grace_ms = 0)")
            return
        if cause == "start" and (
            policy.default_producer_ids_rate is None and not policy.user_producer_ids_rates
        ):
            # Nobody is limited: a later change that limits someone probes then. (No
            # connection is made before that: pidgate talks to the brokers only for clients.)
            enforcement.disable("no principal limited at start")
            return
        try:
            result = await asyncio.to_thread(self._prober.probe)
        except Exception as error:  # probe_frontier reports failures; this is a bug guard
            result = FrontierResult(None, f"probe crashed: {describe_error(error)}")
        now = quota_clock_ms()
        self.last_frontier, self.last_frontier_ms = result, now
        enforcement.resolve(result.frontier, result.reason)
        self.metrics.frontier_probed(result.frontier, now)
        if result.frontier is not None:
            get_logger().info(
                "pid_frontier_learnt",
                cause=cause,
                frontier=result.frontier,
                brokers={str(node): pids for node, pids in result.per_broker.items()},
                elapsed_ms=result.elapsed_ms,
                retries=result.retries,
                reason=result.reason,
                enforcement_began_ms=enforcement.began_ms,
                grace_ms=enforcement.grace_ms,
            )
        else:
            get_logger().warning(
                "grandfather_learning_mode",
                cause=cause,
                reason=result.reason,
                elapsed_ms=result.elapsed_ms,
                grace_ms=enforcement.grace_ms,
                action="unknown PIDs of principals whose enforcement began now are admitted "
                "and recorded, never rejected, until the grace period ends",
            )

    def _save_state_now(self) -> None:
        try:
            snapshot = snapshot_for_saving(self.quota_control)
            with self._state_write_lock:
                write_snapshot(snapshot, self.settings)
        except OSError as error:
            get_logger().error(
                "state_file_write_failed", path=str(self.settings.state.path), error=str(error)
            )
            return
        get_logger().info("state_saved", path=str(self.settings.state.path))

    async def _persist_periodically(self) -> None:
        interval_s = self.settings.state.persist_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                # Copied and encoded on the loop a step of principals at a time (each principal
                # copied whole), the loop let through between steps; compressed and written in
                # a thread.
                save = await run_in_steps(
                    encode_for_saving_in_steps(self.quota_control, LOOP_STEP_PRINCIPALS)
                )
                await asyncio.to_thread(self._write_encoded, save)
            except OSError as error:
                self.context.log.warning(
                    "state_file_write_failed",
                    key="state",
                    path=str(self.settings.state.path),
                    error=str(error),
                )
            except Exception as error:  # a bug: keep saving next time, say so now
                self.context.log.warning("state_save_failed", key="state", error=repr(error))

    def _write_encoded(self, save: EncodedSave) -> None:
        with self._state_write_lock:
            write_encoded(save, self.settings)

    async def _expire_periodically(self) -> None:
        interval_s = self.settings.quota.cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            # A step of principals at a time, the loop let through between steps.
            try:
                forgotten = await run_in_steps(
                    self.quota.expire_in_steps(quota_clock_ms(), LOOP_STEP_PRINCIPALS)
                )
            except Exception as error:  # keep expiring next time; never take shutdown down
                self.context.log.warning("quota_expiry_failed", key="expire", error=repr(error))
                continue
            if forgotten:
                get_logger().debug("principals_forgotten", count=forgotten)
