"""``pidgate demo``: an embedded tansu broker, pidgate in front of it, a steady idempotent
producer and a restart storm of short-lived idempotent producers, shown live once a second.

What it shows: a principal that activates new producer IDs (PIDs) faster than its quota is
throttled (its new producers wait), while a producer whose PID is already known never notices
pidgate; and once the storm is over, the waiting producers get through as tokens refill.

Owns: ``run_demo``, the order things start and stop in, the once-a-second loop, and all
printing. Everything it starts is bounded (threads, records, timeouts) and stopped on exit or
Ctrl-C: the proxy, the producers, and the broker process (by PID). The parts live beside it:
``plan`` (numbers), ``environment`` (settings, log file, topics), ``producers``, ``tracking``
(what pidgate decided), ``display`` (text), ``signals``. Nothing in the demo imports this
module but ``pidgate.cli``.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pidgate.demo.broker import EmbeddedBroker
from pidgate.demo.display import header_lines, live_line, summary_lines
from pidgate.demo.environment import create_topics, demo_settings, logs_in_file
from pidgate.demo.next_steps import analyze_install_hint, demo_next_steps, pidgate_command
from pidgate.demo.plan import (
    MAX_STORM_PRODUCERS,
    STEADY_CLIENT_ID,
    STORM_CLIENT_PREFIX,
    STORM_INTERVAL_S,
    STORM_START_S,
    storm_end_s,
)
from pidgate.demo.producers import ProducerConfig, SteadyProducer, Storm, producer_config
from pidgate.demo.signals import StopSignal, raise_stop_signal, stop_signals
from pidgate.demo.tracking import ProxyView, StormDecisionTracker, read_proxy_view
from pidgate.proxy.background import BackgroundProxy

_EXIT_OK = 0
_EXIT_SETUP_FAILED = 1
_EXIT_INTERRUPTED = 128 + signal.SIGINT


def _out(lines: Iterable[str]) -> None:
    for line in lines:
        print(line, flush=True)


@dataclass
class _Running:
    """Everything started so far, so that cleanup stops exactly that."""

    broker: EmbeddedBroker | None = None
    proxy: BackgroundProxy | None = None
    steady: SteadyProducer | None = None
    storm: Storm | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def stop_producers(self, join_timeout_s: float = 10.0) -> None:
        """Tell every producer thread to stop (each purges what is still waiting), join them
        within one shared deadline."""
        self.stop.set()
        deadline = time.monotonic() + join_timeout_s
        threads = self.storm.threads() if self.storm is not None else []
        if self.steady is not None and self.steady.thread is not None:
            threads.append(self.steady.thread)
        stuck = []
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread.name)
        if stuck:
            print(f"pidgate demo: producers still stopping: {', '.join(stuck)}", file=sys.stderr)

    def shut_down(self) -> None:
        """Idempotent: stops whatever is still running, in order (producers, proxy, broker)."""
        self.stop_producers()
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            proxy.stop(timeout_s=10.0)
        broker, self.broker = self.broker, None
        if broker is not None:
            broker.cleanup()


def run_demo(duration_s: float = 45.0, event_log: str | Path | None = None) -> int:
    """Run the demo for ``duration_s`` seconds (or until Ctrl-C / SIGTERM). 0 on a clean run,
    128 + signal number when stopped by a signal (130 for Ctrl-C), 1 when setup failed.
    pidgate's log and PID event log go to a new directory ``pidgate-demo-*`` under the
    temporary directory (the event log to ``event_log`` instead, when given); the summary
    ends with the next steps: analyse the event log, open the report, try a test broker."""
    event_dir = Path(event_log).expanduser().resolve() if event_log else None
    if event_dir is not None and event_dir.exists() and not event_dir.is_dir():
        print(f"pidgate demo: --event-log {event_log}: not a directory", file=sys.stderr)
        return _EXIT_SETUP_FAILED
    run_dir = Path(tempfile.mkdtemp(prefix="pidgate-demo-"))
    with stop_signals(raise_stop_signal):
        try:
            return _run(duration_s, run_dir, event_dir or run_dir / "events")
        except StopSignal as signalled:  # during setup or cleanup's first steps
            print(f"pidgate demo: stopped by {signalled}", file=sys.stderr)
            return 128 + signalled.signum
        except KeyboardInterrupt:
            return _EXIT_INTERRUPTED


def _run(duration_s: float, run_dir: Path, event_dir: Path) -> int:
    with logs_in_file(run_dir / "pidgate.log") as (rdkafka_logger, log_path):
        running = _Running()
        # The proxy's observer: tells which storm producer was throttled.
        tracker = StormDecisionTracker(STORM_CLIENT_PREFIX, MAX_STORM_PRODUCERS)
        try:
            started = _set_up(running, tracker, rdkafka_logger, log_path, event_dir)
            if started is None:
                return _EXIT_SETUP_FAILED
            return _produce_and_watch(
                running, *started, tracker, rdkafka_logger, log_path, duration_s, event_dir
            )
        finally:
            with stop_signals(signal.SIG_IGN):
                running.shut_down()


def _set_up(
    running: _Running,
    tracker: StormDecisionTracker,
    rdkafka_logger: logging.Logger,
    log_path: Path,
    event_dir: Path,
) -> tuple[EmbeddedBroker, BackgroundProxy] | None:
    """Broker, then pidgate in front of it, then the topics; None (and why, on stderr) if any
    of it failed."""
    try:
        _out(["pidgate demo: starting an embedded tansu broker and pidgate ..."])
        # Assigned before start(), so that an interrupted start is still cleaned up.
        running.broker = broker = EmbeddedBroker()
        broker.start()
        running.proxy = proxy = BackgroundProxy(
            demo_settings(broker, event_dir), observers=(tracker,)
        )
        proxy.start()
        create_topics(proxy.bootstrap, rdkafka_logger)
    except Exception as error:
        print(f"pidgate demo: setup failed: {error}", file=sys.stderr)
        tail = running.broker.log_tail() if running.broker is not None else ""
        if tail:
            print(f"tansu log tail:\n{tail}", file=sys.stderr)
        print(f"pidgate log: {log_path}", file=sys.stderr)
        return None
    return broker, proxy


def _produce_and_watch(
    running: _Running,
    broker: EmbeddedBroker,
    proxy: BackgroundProxy,
    tracker: StormDecisionTracker,
    rdkafka_logger: logging.Logger,
    log_path: Path,
    duration_s: float,
    event_dir: Path,
) -> int:
    """Header, producers, the live view until ``duration_s`` or a stop signal, then stop the
    producers and print the summary and the next steps. The exit code."""
    message_timeout_ms = int((duration_s + 120) * 1000)

    def config(client_id: str) -> ProducerConfig:
        return producer_config(proxy.bootstrap, client_id, message_timeout_ms, rdkafka_logger)

    _out(
        header_lines(
            broker_bootstrap=broker.bootstrap,
            broker_pid=broker.pid,
            proxy_bootstrap=proxy.bootstrap,
            admin_url=f"http://{proxy.server.settings.admin.listen}",
            duration_s=duration_s,
            log_path=log_path,
        )
    )
    t0 = time.monotonic()
    running.steady = steady = SteadyProducer(config(STEADY_CLIENT_ID), running.stop)
    running.storm = storm = Storm(
        t0=t0,
        start_s=STORM_START_S,
        end_s=storm_end_s(duration_s),
        interval_s=STORM_INTERVAL_S,
        max_producers=MAX_STORM_PRODUCERS,
        stop=running.stop,
        config=config,
    )
    signalled: StopSignal | None = None
    try:
        steady.start()
        storm.start()
        _watch(proxy, steady, storm, t0, duration_s)
    except StopSignal as stop_signal:
        signalled = stop_signal
    elapsed_s = time.monotonic() - t0
    with stop_signals(signal.SIG_IGN):
        _out(
            [
                f"stopping ({signalled} received): producers, pidgate, broker ..."
                if signalled
                else "stopping: producers, pidgate, broker ..."
            ]
        )
        # Producers first (each purges what is still waiting), then the final counts.
        running.stop_producers()
        view = read_proxy_view(proxy)
        running.shut_down()
        _out(
            summary_lines(
                elapsed_s=elapsed_s,
                interrupted=signalled is not None,
                view=view,
                steady=steady,
                storm=storm.snapshot(),
                throttled_client_ids=tracker.throttled_client_ids(),
                log_path=log_path,
                event_dir=event_dir,
            )
        )
        _out(
            demo_next_steps(
                pidgate_command(),
                event_dir,
                event_dir.parent / "pidgate-demo-report",
                analyze_install_hint(),
            )
        )
    return _EXIT_OK if signalled is None else 128 + signalled.signum


def _watch(
    proxy: BackgroundProxy, steady: SteadyProducer, storm: Storm, t0: float, duration_s: float
) -> None:
    """The live view: one line a second until ``duration_s`` after ``t0``."""
    last_delivered, last_at, tick = 0, t0, 1
    view: ProxyView | None = None
    end_at = t0 + duration_s
    while True:
        time.sleep(max(0.0, min(t0 + tick, end_at) - time.monotonic()))
        now = time.monotonic()
        if now >= end_at:
            return
        delivered = steady.delivered
        rate = (delivered - last_delivered) / max(now - last_at, 1e-3)
        last_delivered, last_at = delivered, now
        view = read_proxy_view(proxy) or view
        _out([live_line(now - t0, view, rate, steady.errors, storm.snapshot())])
        tick += 1
