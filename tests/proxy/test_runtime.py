"""The serving process (``runtime.serve_until_signalled``): what it does once it listens."""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref

from pidgate.config import load_settings
from pidgate.demo.broker import free_port
from pidgate.proxy.runtime import serve_until_signalled
from pidgate.proxy.server import ProxyServer


class _Node:
    """Something a reference cycle can be made of (and weakly referenced)."""

    partner: _Node | None = None


def test_objects_alive_when_the_server_listens_are_frozen_and_later_cycles_still_collected() -> (
    None
):
    """Once pidgate listens, everything alive then (the server, its settings, modules) is out
    of the collector's generations, so a full collection no longer walks it; a reference
    cycle made while serving is still collected."""
    port = free_port()
    settings = load_settings(
        cli_overrides={
            "proxy": {"upstream": [f"127.0.0.1:{free_port()}"], "listen": f"127.0.0.1:{port}"},
            "admin": {"enabled": False},
        }
    )
    server = ProxyServer(settings)

    async def serve_then_stop() -> tuple[bool, bool, bool]:
        serving = asyncio.create_task(serve_until_signalled(server))
        try:
            for _ in range(200):
                if gc.get_freeze_count():
                    break
                await asyncio.sleep(0.05)
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # it listens
            tracked_ids = {id(tracked) for tracked in gc.get_objects()}
            server_frozen = id(server) not in tracked_ids and gc.is_tracked(server)
            settings_frozen = id(server.settings) not in tracked_ids
            first, second = _Node(), _Node()
            first.partner, second.partner = second, first
            cycle_member = weakref.ref(first)
            del first, second
            gc.collect()
            return server_frozen, settings_frozen, cycle_member() is None
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)

    try:
        server_frozen, settings_frozen, cycle_collected = asyncio.run(serve_then_stop())
    finally:
        gc.unfreeze()  # the rest of the suite runs with a collector as usual
    assert server_frozen
    assert settings_frozen
    assert cycle_collected
