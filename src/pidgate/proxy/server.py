"""The proxy as a whole: listeners, the quota manager's housekeeping, graceful shutdown.

Owns: ``ProxyServer`` (start / stop / addresses) and ``DecisionCounters``, the in-process tally
of decisions that the demo shows (and that metrics will read).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

from pidgate.config import Settings
from pidgate.protocol.api_versions import proxy_api_version_limits
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.admission import (
    DecisionObserver,
    Gatekeeper,
    ProduceContext,
    monotonic_ms,
    quota_clock_ms,
)
from pidgate.proxy.connection import ClientConnection
from pidgate.proxy.context import ProxyContext
from pidgate.proxy.identity import IdentityPolicy
from pidgate.proxy.logs import RateLimitedLog, get_logger
from pidgate.proxy.routing import Address, BrokerRoute, Router
from pidgate.proxy.tls import CertificateReloader, client_ssl_context, upstream_ssl_context
from pidgate.quota.manager import Admitted, Decision, QuotaManager
from pidgate.quota.policy import QuotaPolicy


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


def quota_manager_for(settings: Settings) -> QuotaManager:
    quota = settings.quota
    return QuotaManager(
        QuotaPolicy(
            window_ms=quota.window_ms,
            window_num=quota.window_num,
            false_positive_rate=quota.false_positive_rate,
            default_producer_ids_rate=quota.default_producer_ids_rate,
            user_producer_ids_rates=quota.user_producer_ids_rates,
            max_principals=quota.max_principals,
            max_total_bits=quota.max_total_bits,
        )
    )


class ProxyServer:
    def __init__(self, settings: Settings, observers: tuple[DecisionObserver, ...] = ()) -> None:
        self.settings = settings
        self.counters = DecisionCounters()
        self.quota = quota_manager_for(settings)
        log = RateLimitedLog(
            max_events=settings.logging.rate_limit_events,
            interval_ms=settings.logging.rate_limit_interval_ms,
        )
        self.router = Router(settings.proxy, self._open_broker_listener)
        self.context = ProxyContext(
            settings=settings,
            gatekeeper=Gatekeeper(
                self.quota, (self.counters, *observers), on_observer_error=self._observer_failed
            ),
            router=self.router,
            log=log,
            api_version_limits=proxy_api_version_limits(),
            identity=IdentityPolicy(settings),
            upstream_ssl=upstream_ssl_context(settings.upstream_tls),
        )
        self._client_ssl = client_ssl_context(settings.client_tls)
        self._certificates = (
            CertificateReloader(self._client_ssl, settings.client_tls) if self._client_ssl else None
        )
        self._bootstrap: asyncio.Server | None = None
        self._broker_servers: dict[int, asyncio.Server] = {}
        self._housekeeping: asyncio.Task[None] | None = None
        self._stopping = False
        self._reloading: asyncio.Task[None] | None = None

    def _observer_failed(self, observer: DecisionObserver, error: Exception) -> None:
        self.context.log.warning(
            "observer_failed",
            key=type(observer).__name__,
            observer=type(observer).__name__,
            error=repr(error),
        )

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        listen = self.settings.proxy.listen
        self._bootstrap = await loop.create_server(
            lambda: ClientConnection(self.context, lambda: self.router.bootstrap_upstreams),
            listen.host,
            listen.port,
            reuse_address=True,
            ssl=self._client_ssl,
        )
        self._housekeeping = asyncio.ensure_future(self._expire_periodically())
        if self._certificates is not None:
            self._reloading = asyncio.ensure_future(self._reload_certificates_periodically())
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
        deadline = monotonic_ms() + self.settings.proxy.shutdown_grace_ms
        while monotonic_ms() < deadline and any(not conn.idle for conn in self.context.connections):
            await asyncio.sleep(0.05)
        closing = list(self.context.connections)
        for conn in closing:
            conn.close()
        for task in (self._housekeeping, self._reloading):
            if task is not None:
                task.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await task
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
                lambda: ClientConnection(self.context, lambda: [route.upstream]),
                host,
                port,
                reuse_address=True,
                ssl=self._client_ssl,
            )
        except (OSError, OverflowError) as error:  # OverflowError: base + node_id > 65535
            # Retried on the next response naming this broker; rate-limited, since that can be
            # every Produce response while the port stays taken.
            self.context.log.warning(
                "broker_listener_failed",
                key=str(route.node_id),
                node_id=route.node_id,
                listen=f"{host}:{port}",
                upstream=f"{route.upstream[0]}:{route.upstream[1]}",
                error=str(error),
            )
            raise
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

    async def _expire_periodically(self) -> None:
        interval_s = self.settings.quota.cleanup_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                forgotten = self.quota.expire(quota_clock_ms())
            except Exception as error:  # keep expiring next time; never take shutdown down
                self.context.log.warning("quota_expiry_failed", key="expire", error=repr(error))
                continue
            if forgotten:
                get_logger().debug("principals_forgotten", count=forgotten)
