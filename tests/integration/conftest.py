"""Fixtures for tests that talk to a real tansu broker over loopback sockets.

Each module gets its own broker process (started here, stopped by PID at the end); each test
gets its own pidgate, running in a background thread so tests can read its counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pidgate.config import Settings, load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


def proxy_settings(
    broker: EmbeddedBroker,
    quota: dict[str, Any] | None = None,
    proxy: dict[str, Any] | None = None,
    rejection: dict[str, Any] | None = None,
    admin: dict[str, Any] | None = None,
    **sections: dict[str, Any],
) -> Settings:
    """Settings for a gateway in front of ``broker`` on fresh loopback ports (bootstrap, broker
    listener and admin HTTP); other sections (state, identity, ...) as given."""
    overrides: dict[str, Any] = {
        "proxy": {
            "upstream": [broker.bootstrap],
            "listen": f"127.0.0.1:{free_port()}",
            "broker_ports": {TANSU_NODE_ID: free_port()},
            **(proxy or {}),
        },
        "quota": quota or {},
        "logging": {"format": "json"},
        "admin": {"listen": f"127.0.0.1:{free_port()}", **(admin or {})},
        **sections,
    }
    if rejection:
        overrides["rejection"] = rejection
    return load_settings(cli_overrides=overrides)


@pytest.fixture
def start_proxy(broker: EmbeddedBroker) -> Iterator[Callable[..., BackgroundProxy]]:
    """``start_proxy(quota={...}, proxy={...})`` -> a running pidgate, stopped after the test."""
    started: list[BackgroundProxy] = []

    def start(**sections: Any) -> BackgroundProxy:
        running = BackgroundProxy(proxy_settings(broker, **sections)).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def anonymous_quota(producer_ids_rate: int, window_seconds: int) -> dict[str, Any]:
    return {
        "producer.id.quota.window.size.seconds": window_seconds,
        "users": {"ANONYMOUS": {"producer_ids_rate": producer_ids_rate}},
    }
