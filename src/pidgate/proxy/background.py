"""Running a ``ProxyServer`` on its own event loop in a background thread, for embedding
pidgate in another program (the demo) and for tests that inspect its counters.

Owns: ``BackgroundProxy``. Runs the server, as ``runtime`` does: nothing in the proxy may
import it (only the demo and tests do); must not import ``workers``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from pidgate.config import Settings
from pidgate.proxy.quota_control.admission import DecisionObserver
from pidgate.proxy.runtime import new_event_loop
from pidgate.proxy.server import ProxyServer
from pidgate.proxy.with_block import WithBlock

T = TypeVar("T")


class BackgroundProxy(WithBlock):
    def __init__(self, settings: Settings, observers: tuple[DecisionObserver, ...] = ()) -> None:
        self.server = ProxyServer(settings, observers)
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name="pidgate-proxy", daemon=True)
        self._started = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as error:  # reported to the starting thread
            self._error = error
            self._started.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        await self.server.start()
        self._started.set()
        await self._stopped.wait()
        await self.server.stop()

    def start(self, timeout_s: float = 10.0) -> BackgroundProxy:
        self._thread.start()
        if not self._started.wait(timeout_s):
            raise RuntimeError("pidgate did not start in time")
        if self._error is not None:
            raise RuntimeError(f"pidgate failed to start: {self._error}") from self._error
        return self

    def call(self, function: object, *args: object) -> None:
        """Run ``function(*args)`` on the proxy's loop (thread-safe)."""
        assert callable(function)
        self._loop.call_soon_threadsafe(function, *args)

    def call_and_wait(self, function: Callable[[], T], timeout_s: float = 10.0) -> T:
        """Run ``function()`` on the proxy's loop and return its result (or raise its error):
        the proxy's state is not thread-safe, so other threads read it this way."""
        answer: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(function())
            except BaseException as error:
                answer.set_exception(error)

        self._loop.call_soon_threadsafe(run)
        return answer.result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout_s)

    @property
    def bootstrap(self) -> str:
        host, port = self.server.bootstrap_address
        return f"{host}:{port}"

    def __enter__(self) -> BackgroundProxy:
        return self.start()

    def _on_exit(self) -> None:
        self.stop()
