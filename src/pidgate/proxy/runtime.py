"""Running the proxy as a process: the event loop (uvloop when installed), signal handling and
graceful shutdown (stop accepting, let in-flight requests finish, exit 0).

Owns: ``run_proxy`` and ``new_event_loop``. Runs the server: must not import ``workers`` or
``background`` (they call it), nor any room directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence

from pidgate.config import Settings
from pidgate.proxy.logs import configure_logging, get_logger
from pidgate.proxy.server import ProxyServer


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when available (about 2x the small-frame rate of the default loop here),
    the default loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _reload(server: ProxyServer, reload_settings: Callable[[], Settings]) -> None:
    try:
        settings = reload_settings()
    except Exception as error:  # a bad file must not take the proxy down: keep the old one
        server.metrics.config_reloaded(False)
        get_logger().error("config_reload_failed", error=str(error))
        return
    server.reload(settings)


async def serve_until_signalled(
    server: ProxyServer, reload_settings: Callable[[], Settings] | None = None
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if reload_settings is not None:
        loop.add_signal_handler(signal.SIGHUP, _reload, server, reload_settings)
    try:
        await server.start()
        await stop.wait()
        get_logger().info("shutdown_requested", grace_ms=server.settings.proxy.shutdown_grace_ms)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
        await server.stop()


def run_proxy(
    settings: Settings,
    reload_settings: Callable[[], Settings] | None = None,
    ignored_environment: Sequence[str] = (),
) -> int:
    """Serve until SIGTERM/SIGINT; SIGHUP re-reads the configuration through
    ``reload_settings`` (quotas and the rejection table take effect at once).
    ``ignored_environment``: ``PIDGATE_*`` variables the loader skipped as Kubernetes service
    links, warned about once."""
    configure_logging(settings.logging)
    if ignored_environment:
        get_logger().warning(
            "environment_variables_ignored",
            variables=list(ignored_environment),
            reason="they look like Kubernetes service links (a Service named pidgate), not "
            "pidgate settings",
            fix="set enableServiceLinks: false in the pod spec, or rename the Service",
        )
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve_until_signalled(ProxyServer(settings), reload_settings))
    except OSError as error:
        get_logger().error("startup_failed", error=str(error))
        return 1
    finally:
        loop.close()
    return 0
