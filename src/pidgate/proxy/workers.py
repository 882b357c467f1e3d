"""``pidgate serve --workers N``: N processes on one host serving the same listeners.

Why: per-request work is Python's, so one process is one core. Linux's SO_REUSEPORT spreads new
client connections over every process that opened a listener with it; each worker is a full
pidgate and a member of one fleet (``fleet.id``, default ``workers-<host>-<port>``), so PIDs
and token spending are shared through the fleet topic exactly as between hosts
(proxy/quota_control/fleet.py), with the same consistency bound.

The supervisor (this module, in the parent process) starts the workers (``spawn``: nothing of
the parent's event loop or sockets is inherited), gives each its own admin HTTP port on
loopback, state file (``<state.path>.worker<i>``) and event-log instance, and serves the
configured ``admin.listen`` itself: ``/metrics`` merges every worker's samples with a
``worker`` label, ``/state`` holds each worker's state, ``/readyz`` is ready when every worker
is, ``/healthz`` answers while the supervisor runs. SIGTERM/SIGINT stop every worker (each
drains as a single pidgate does) and the supervisor exits 0 when they all did; SIGHUP is passed
to every worker (each re-reads the configuration). A worker that dies is started again after
a second, and logged.

Owns: ``run_workers`` and ``worker_settings``. Linux only. The top of the proxy (only
``pidgate.cli`` imports it): must not import ``background``, and reaches a worker's server
only through ``runtime``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.context
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from pidgate.config import Settings
from pidgate.config.addresses import HostPort
from pidgate.proxy.logs import configure_logging, get_logger
from pidgate.proxy.operations.http import AdminHttpServer
from pidgate.proxy.ports import free_port

__all__ = ["run_workers", "worker_settings"]

_RESTART_DELAY_S = 1.0
_FETCH_TIMEOUT_S = 5.0


def worker_settings(settings: Settings, index: int, admin_port: int) -> Settings:
    """The settings of worker ``index``: shared listeners, its own admin port, state file,
    event-log instance and fleet member name, in the supervisor's fleet."""
    listen = settings.proxy.listen
    host = settings.proxy.effective_advertised_host
    name = f"{host}_{listen.port}-w{index}"
    fleet_id = settings.fleet.id or f"workers-{socket.gethostname()}-{listen.port}"
    state_path = settings.state.path
    return settings.model_copy(
        update={
            "proxy": settings.proxy.model_copy(update={"workers": 1, "reuse_port": True}),
            "admin": settings.admin.model_copy(
                update={"enabled": True, "listen": HostPort(host="127.0.0.1", port=admin_port)}
            ),
            "fleet": settings.fleet.model_copy(update={"id": fleet_id}),
            "shared_store": settings.shared_store.model_copy(update={"instance_id": name}),
            "state": settings.state.model_copy(
                update={
                    "path": None
                    if state_path is None
                    else state_path.with_name(f"{state_path.name}.worker{index}")
                }
            ),
            "event_log": settings.event_log.model_copy(update={"instance": name}),
        }
    )


def _worker_main(
    index: int, admin_port: int, load: Callable[[], Settings], settings: Settings
) -> None:
    """One worker process: a full pidgate; SIGHUP re-reads the configuration through ``load``
    and applies this worker's part again."""
    from pidgate.proxy.runtime import run_proxy

    sys.exit(run_proxy(settings, lambda: worker_settings(load(), index, admin_port)))


class _Worker:
    def __init__(self, index: int, admin_port: int) -> None:
        self.index = index
        self.admin_port = admin_port
        self.process: multiprocessing.context.SpawnProcess | None = None
        self.restarts = 0


async def _http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port), _FETCH_TIMEOUT_S
    )
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), _FETCH_TIMEOUT_S)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 502
    return status, body


class _Merged:
    """A collector over the workers' /metrics texts: every sample gets a ``worker`` label."""

    def __init__(self, texts: Iterable[tuple[int, str]], alive: int, configured: int) -> None:
        self._texts = list(texts)
        self._alive = alive
        self._configured = configured

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for worker, text in self._texts:
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for sample in family.samples:
                    merged.add_sample(
                        sample.name,
                        {**sample.labels, "worker": str(worker)},
                        sample.value,
                        sample.timestamp,
                        sample.exemplar,
                    )
        yield from families.values()
        yield GaugeMetricFamily(
            "pidgate_workers", "Worker processes configured (--workers)", value=self._configured
        )
        yield GaugeMetricFamily(
            "pidgate_workers_alive", "Worker processes running now", value=self._alive
        )


class _Supervisor:
    def __init__(self, settings: Settings, load: Callable[[], Settings]) -> None:
        self.settings = settings
        self.load = load
        self.workers = [_Worker(i, free_port()) for i in range(settings.proxy.workers)]
        self.context = multiprocessing.get_context("spawn")
        self.stopping = False
        self.log = get_logger().bind(component="workers")

    def start(self, worker: _Worker) -> None:
        settings = worker_settings(self.settings, worker.index, worker.admin_port)
        process = self.context.Process(
            target=_worker_main,
            args=(worker.index, worker.admin_port, self.load, settings),
            name=f"pidgate-worker-{worker.index}",
            daemon=False,
        )
        process.start()
        worker.process = process
        self.log.info("worker_started", worker=worker.index, pid=process.pid)

    def alive(self) -> int:
        return sum(1 for w in self.workers if w.process is not None and w.process.is_alive())

    async def watch(self) -> None:
        """Start a worker again when it dies, unless the supervisor is stopping."""
        while not self.stopping:
            await asyncio.sleep(0.5)
            for worker in self.workers:
                process = worker.process
                if self.stopping or process is None or process.is_alive():
                    continue
                self.log.warning("worker_died", worker=worker.index, exit_code=process.exitcode)
                await asyncio.sleep(_RESTART_DELAY_S)
                if not self.stopping:
                    worker.restarts += 1
                    self.start(worker)

    def signal_all(self, signum: int) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.pid and worker.process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signum)

    async def render(self) -> bytes:
        texts: list[tuple[int, str]] = []
        for worker in self.workers:
            with contextlib.suppress(Exception):
                status, body = await _http_get(worker.admin_port, "/metrics")
                if status == 200:
                    texts.append((worker.index, body.decode("utf-8", "replace")))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(texts, self.alive(), len(self.workers)))
        return generate_latest(registry)

    async def state(self) -> dict[str, Any]:
        states: dict[str, Any] = {}
        for worker in self.workers:
            try:
                status, body = await _http_get(worker.admin_port, "/state")
                states[str(worker.index)] = json.loads(body) if status == 200 else None
            except Exception as error:
                states[str(worker.index)] = {"error": f"{type(error).__name__}"}
        return {
            "workers": states,
            "workers_alive": self.alive(),
            "restarts": {str(w.index): w.restarts for w in self.workers},
        }

    async def ready(self) -> bool:
        for worker in self.workers:
            try:
                status, _ = await _http_get(worker.admin_port, "/readyz")
            except Exception:
                return False
            if status != 200:
                return False
        return True


async def _supervise(supervisor: _Supervisor) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, supervisor.signal_all, signal.SIGHUP)
    for worker in supervisor.workers:
        supervisor.start(worker)
    admin: AdminHttpServer | None = None
    if supervisor.settings.admin.enabled:
        admin = AdminHttpServer(supervisor, supervisor.state, supervisor.ready)
        listen = supervisor.settings.admin.listen
        await admin.start(listen.host, listen.port)
    watcher = asyncio.ensure_future(supervisor.watch())
    supervisor.log.info("workers_started", workers=len(supervisor.workers))
    try:
        await stop.wait()
    finally:
        supervisor.stopping = True
        watcher.cancel()
        supervisor.signal_all(signal.SIGTERM)
        grace_s = supervisor.settings.proxy.shutdown_grace_ms / 1000 + 15
        codes = []
        for worker in supervisor.workers:
            process = worker.process
            if process is None:
                continue
            await asyncio.to_thread(process.join, grace_s)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 5)
            codes.append(process.exitcode)
        if admin is not None:
            await admin.stop()
    supervisor.log.info("workers_stopped", exit_codes=codes)
    return 0 if all(code == 0 for code in codes) else 1


def run_workers(settings: Settings, load: Callable[[], Settings]) -> int:
    """Serve with ``settings.proxy.workers`` processes until SIGTERM/SIGINT (Linux only)."""
    configure_logging(settings.logging)
    if not sys.platform.startswith("linux"):
        get_logger().error("startup_failed", error="--workers needs Linux (SO_REUSEPORT)")
        return 1
    from pidgate.proxy.runtime import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(_supervise(_Supervisor(settings, load)))
    except OSError as error:
        get_logger().error("startup_failed", error=str(error))
        return 1
    finally:
        loop.close()
