"""The proxy as a whole, its composition root: builds the rooms (quota control, operations,
serving) and wires them to each other, starts them in order (the cluster joined, then the
listeners, then housekeeping) and stops them gracefully (stop reading, let requests finish,
close, save).

Owns: ``ProxyServer`` (start / stop / reload / state / addresses). Must not import ``runtime``,
``workers`` or ``background`` (they run it); what a room does lives in the room.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from pidgate.config import Settings
from pidgate.protocol import native
from pidgate.protocol.api_versions import inspected_api_version_limits
from pidgate.proxy.decision_counters import DecisionCounters
from pidgate.proxy.housekeeping import Housekeeping
from pidgate.proxy.logs import RateLimitedLog, get_logger
from pidgate.proxy.operations.event_log import EventLog
from pidgate.proxy.operations.http import AdminHttpServer
from pidgate.proxy.operations.metrics import DELIVERY_TIMEOUT_MS_DEFAULT, ProxyMetrics
from pidgate.proxy.quota_control.admission import (
    DecisionObserver,
    Gatekeeper,
    monotonic_ms,
    quota_clock_ms,
)
from pidgate.proxy.quota_control.fleet import FleetCollector, FleetSync
from pidgate.proxy.quota_control.pid_frontier import FrontierResult
from pidgate.proxy.quota_control.quota_admin import QuotaAdmin
from pidgate.proxy.quota_control.quotas_in_force import open_quota_control
from pidgate.proxy.quota_control.room import QuotaControlRoom
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.proxy.serving.connection import ClientConnection
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.express import COMPILED as EXPRESS_LANE
from pidgate.proxy.serving.flow_control import ConnectionLimits
from pidgate.proxy.serving.identity import IdentityPolicy
from pidgate.proxy.serving.routing import Address, BrokerRoute, Router
from pidgate.proxy.serving.tls import CertificateReloader, client_ssl_context, upstream_ssl_context
from pidgate.proxy.upstream_check import unanswered_reason


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
        self.quota_room = QuotaControlRoom(
            settings, self.quota_control, log, frontier_probed=self.metrics.frontier_probed
        )
        fleet_outbox = self.quota_room.fleet_outbox
        self.event_log = self._open_event_log(settings)
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
                    *((fleet_outbox,) if fleet_outbox else ()),
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
            quota_admin=QuotaAdmin(
                self.quota_control.effective_rates, self.quota_room.apply_quota_changes
            ),
            waiting_room=self._open_waiting_room(settings),
        )
        self.connection_limits = ConnectionLimits()
        self.metrics.before_collect = self._flush_connection_counters
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
        self._stopping = False
        self._housekeeping = Housekeeping(
            lambda: self.settings, self.quota_room, self._certificates, log
        )

    @property
    def fleet(self) -> FleetSync | None:
        """This member's fleet sync once joined (None: no ``fleet.id``, or not started)."""
        return self.quota_room.fleet

    @property
    def last_frontier(self) -> FrontierResult | None:
        """The latest PID frontier probe."""
        return self.quota_room.last_frontier

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

    def reload(self, settings: Settings) -> None:
        """Apply a re-read config file (SIGHUP): quotas, rejection table, log rate limits, quota
        failure policy, connection limits and idle timeout (at their next check). Listener, TLS
        and routing settings need a restart and are left as they are."""
        self.quota_room.reload(settings)
        self.settings = settings
        self.context.settings = settings
        self.context.gatekeeper.failure_policy = settings.proxy.quota_failure_policy
        self.context.gatekeeper.failure_throttle_ms = settings.proxy.quota_failure_throttle_ms
        self.metrics.config_reloaded(True)
        get_logger().info("config_reloaded", producer_ids_rate=self.quota_control.effective_rates())

    def state(self) -> dict[str, Any]:
        state = self.quota_room.state()
        state["connections"] = len(self.context.connections)
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
        listen = self.settings.proxy.listen
        await self._warn_before_serving()
        await self.quota_room.learn_frontier_at_start()
        await self.quota_room.start_fleet()
        if self.quota_room.fleet is not None:
            self.metrics.registry.register(FleetCollector(self.quota_room.fleet))
        try:
            self._bootstrap = await self._serve_clients(
                listen.host, listen.port, lambda: self.router.bootstrap_upstreams
            )
        except OSError as error:
            raise OSError(
                error.errno,
                f"bootstrap listener {listen} (setting proxy.listen, --listen, "
                f"PIDGATE_PROXY_LISTEN): {error.strerror or error}",
            ) from error
        await self.quota_room.start_shared_store()
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
        self._housekeeping.start()
        if not self.quota_control.effective_rates():
            self.context.notices.no_quota()
        if native.PURE_REASON is not None:
            # The one line a missing compiled module gets (issue "native"): everything works,
            # at the pure path's CPU cost per request.
            forced = native.PURE_REASON.startswith(native.PURE_PYTHON_ENV)
            log_pure = get_logger().info if forced else get_logger().warning
            log_pure("pure_python_data_path", reason=native.PURE_REASON)
        get_logger().info(
            "pidgate_started",
            data_path=native.DATA_PATH,
            express_lane=EXPRESS_LANE,
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
        await self.quota_room.leave_cluster()
        if self.event_log is not None:
            await asyncio.to_thread(self.event_log.close)
        await self._housekeeping.stop()
        await self.quota_room.stop()  # the state file's last write
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        get_logger().info("pidgate_stopped", connections_closed=len(closing))

    def _flush_connection_counters(self) -> None:
        """Each open connection hands over what its express lane counted (before a scrape)."""
        for conn in self.context.connections:
            conn.flush_counters()

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

    async def _serve_clients(
        self,
        host: str,
        port: int,
        upstreams: Callable[[], list[Address]],
        node_id: int | None = None,
    ) -> asyncio.Server:
        """A listener whose connections go to ``upstreams``; ``node_id``: the broker it stands
        for (None: the bootstrap listener)."""
        return await asyncio.get_running_loop().create_server(
            lambda: ClientConnection(
                self.context, upstreams, node_id, limits=self.connection_limits
            ),
            host,
            port,
            reuse_address=True,
            reuse_port=self.settings.proxy.reuse_port or None,
            ssl=self._client_ssl,
        )

    async def _open_broker_listener(self, route: BrokerRoute) -> None:
        if route.node_id in self._broker_servers or self._stopping:
            return
        host = self.settings.proxy.listen.host
        port = self.settings.proxy.broker_listen_port(route.node_id)
        try:
            server = await self._serve_clients(host, port, lambda: [route.upstream], route.node_id)
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
