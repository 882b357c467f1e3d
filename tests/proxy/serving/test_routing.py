"""Where clients are sent: gateway listeners per broker, sidecar endpoint maps."""

from __future__ import annotations

import asyncio

from pidgate.config import load_settings
from pidgate.protocol.endpoints import BrokerEndpoint
from pidgate.proxy.serving.routing import BrokerRoute, Router


def router(**proxy: object) -> tuple[Router, list[BrokerRoute]]:
    opened: list[BrokerRoute] = []

    async def open_listener(route: BrokerRoute) -> None:
        opened.append(route)

    settings = load_settings(cli_overrides={"proxy": {"upstream": ["10.0.0.1:9092"], **proxy}})
    return Router(settings.proxy, open_listener), opened


def test_gateway_rewrites_every_broker_to_its_own_pidgate_listener() -> None:
    gateway, opened = router(listen="127.0.0.1:9092", broker_port_base=20000)
    assert gateway.rewrite(BrokerEndpoint(1, "10.0.0.1", 9092)) == ("127.0.0.1", 20001)
    assert gateway.rewrite(BrokerEndpoint(2, "10.0.0.2", 9092)) == ("127.0.0.1", 20002)
    assert {n: r.upstream for n, r in gateway.routes.items()} == {
        1: ("10.0.0.1", 9092),
        2: ("10.0.0.2", 9092),
    }

    async def open_them() -> None:
        ready = gateway.listeners_ready()
        assert ready is not None
        await ready
        assert gateway.listeners_ready() is None  # opened once, never again

    asyncio.run(open_them())
    assert sorted(route.node_id for route in opened) == [1, 2]


def test_gateway_follows_a_broker_that_moved() -> None:
    gateway, _ = router(advertised_host="proxy.example", broker_ports={1: 30001})
    gateway.rewrite(BrokerEndpoint(1, "10.0.0.1", 9092))
    assert gateway.rewrite(BrokerEndpoint(1, "10.0.0.9", 9093)) == ("proxy.example", 30001)
    assert gateway.routes[1].upstream == ("10.0.0.9", 9093)


def test_sidecar_rewrites_only_mapped_endpoints() -> None:
    sidecar, _ = router(
        mode="sidecar", advertised_endpoints={"10.0.0.1:9092": "sidecar.example:19092"}
    )
    assert sidecar.rewrite(BrokerEndpoint(1, "10.0.0.1", 9092)) == ("sidecar.example", 19092)
    assert sidecar.rewrite(BrokerEndpoint(2, "10.0.0.2", 9092)) == ("10.0.0.2", 9092)
    assert sidecar.listeners_ready() is None  # sidecars open no per-broker listeners
