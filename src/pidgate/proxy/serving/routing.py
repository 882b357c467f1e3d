"""Where client connections go and what broker addresses clients are told.

gateway: one bootstrap listener plus one listener per broker (``broker_port_base + node_id``),
opened when a response first shows that broker; every broker endpoint in a response is
rewritten to its pidgate listener, so clients never bypass the proxy.
sidecar: one upstream broker; endpoints are rewritten through an explicit map, or left alone
when the broker already advertises the sidecar's address.

Owns: ``Router`` and ``BrokerRoute``. The actual binding of sockets is the server's job; the
router asks for it through the ``open_listener`` callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pidgate.config import ProxySettings
from pidgate.protocol.endpoints import BrokerEndpoint

Address = tuple[str, int]


@dataclass
class BrokerRoute:
    """The current upstream address of one broker; updated when metadata shows it moved."""

    node_id: int
    upstream: Address


class Router:
    def __init__(
        self,
        settings: ProxySettings,
        open_listener: Callable[[BrokerRoute], Awaitable[None]],
    ) -> None:
        self._settings = settings
        self._open_listener = open_listener
        self._routes: dict[int, BrokerRoute] = {}
        self._listener_tasks: dict[int, asyncio.Task[None]] = {}
        #: Brokers whose listener is not known to be bound yet.
        self._unbound: set[int] = set()
        self._sidecar_map: dict[Address, Address] = {
            _address(key): (target.host, target.port)
            for key, target in settings.advertised_endpoints.items()
        }

    @property
    def bootstrap_upstreams(self) -> list[Address]:
        return [(hp.host, hp.port) for hp in self._settings.upstream]

    @property
    def routes(self) -> dict[int, BrokerRoute]:
        return dict(self._routes)

    def rewrite(self, endpoint: BrokerEndpoint) -> Address:
        """The address clients must use for ``endpoint`` (an ``EndpointRewriter``)."""
        if self._settings.mode == "sidecar":
            return self._sidecar_map.get(
                (endpoint.host, endpoint.port), (endpoint.host, endpoint.port)
            )
        route = self._routes.get(endpoint.node_id)
        if route is None:
            self._routes[endpoint.node_id] = BrokerRoute(
                endpoint.node_id, (endpoint.host, endpoint.port)
            )
            self._unbound.add(endpoint.node_id)
        else:
            route.upstream = (endpoint.host, endpoint.port)
        return (
            self._settings.effective_advertised_host,
            self._settings.broker_listen_port(endpoint.node_id),
        )

    def listeners_ready(self) -> asyncio.Future[None] | None:
        """None when every known broker has a listener; otherwise a future that completes once
        the missing listeners are bound. A response naming a broker must not reach the client
        before that broker's listener accepts connections, or the client's first connect fails.
        """
        if not self._unbound:  # the common case, on every Produce response: nothing to do
            return None
        pending = []
        for node_id in list(self._unbound):
            task = self._listener_tasks.get(node_id)
            if task is not None and task.done():
                if not task.cancelled() and task.exception() is None:
                    self._unbound.discard(node_id)
                    continue
                task = None  # the bind failed: try again rather than advertise a dead port
            if task is None:
                task = asyncio.ensure_future(self._open_listener(self._routes[node_id]))
                self._listener_tasks[node_id] = task
            pending.append(task)
        if not pending:
            return None
        return asyncio.ensure_future(_wait_all(pending))


async def _wait_all(tasks: list[asyncio.Task[None]]) -> None:
    # A listener that failed to bind is logged by the server; the response still goes out.
    await asyncio.gather(*tasks, return_exceptions=True)


def _address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return (host.strip("[]"), int(port))
