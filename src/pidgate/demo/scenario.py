"""``pidgate demo``: an embedded tansu broker, pidgate in front of it, a steady idempotent
producer and a restart storm of short-lived idempotent producers, shown live once a second.

What it shows: a principal that activates new producer IDs (PIDs) faster than its quota is
throttled (its new producers wait), while a producer whose PID is already known never notices
pidgate; and once the storm is over, the waiting producers get through as tokens refill.

Owns: ``run_demo`` and the demo's scenario (producers, live view, summary). An entry point, at
the top of the layering: may import ``pidgate.proxy`` and below. Everything it starts is bounded
(threads, records, timeouts) and stopped on exit or Ctrl-C: the proxy, the producers, and the
broker process (by PID).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pidgate.config import LoggingSettings, Settings, load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.admission import ANONYMOUS_PRINCIPAL, ProduceContext, Rejected, monotonic_ms
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.logs import configure_logging
from pidgate.quota.manager import Decision

#: The scenario's numbers: with 5 new PIDs per 10 s (a token every 2 s, burst 5) and a new
#: producer every 0.75 s, the storm outruns the quota after ~5 s, and the producers it leaves
#: waiting all get through well before the default 45 s are up.
WINDOW_SECONDS = 10
PRODUCER_IDS_RATE = 5
STEADY_MSGS_PER_S = 200
STORM_START_S = 2.0
STORM_INTERVAL_S = 0.75
STORM_RECORDS = 5
MAX_STORM_PRODUCERS = 60
STEADY_TOPIC = "pidgate-demo-steady"
STORM_TOPIC = "pidgate-demo-storm"
STEADY_CLIENT_ID = "demo-steady"
STORM_CLIENT_PREFIX = "demo-storm-"

_EXIT_OK = 0
_EXIT_SETUP_FAILED = 1
_EXIT_INTERRUPTED = 128 + signal.SIGINT

_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def _out(line: str = "") -> None:
    print(line, flush=True)


# -- what pidgate decided, per storm producer ---------------------------------------------------


@dataclass
class _ClientDecisions:
    rejected_requests: int = 0


class StormDecisionTracker:
    """A ``DecisionObserver``: counts, per storm producer (by client.id), how many of its
    Produce requests pidgate rejected. Runs on the proxy's loop; read from the main thread."""

    def __init__(self, client_prefix: str, max_clients: int) -> None:
        self._prefix = client_prefix
        self._max_clients = max_clients
        self._lock = threading.Lock()
        self._clients: dict[str, _ClientDecisions] = {}

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        client_id = context.client_id
        if client_id is None or not client_id.startswith(self._prefix):
            return
        with self._lock:
            entry = self._clients.get(client_id)
            if entry is None:
                if len(self._clients) >= self._max_clients:
                    return
                entry = self._clients[client_id] = _ClientDecisions()
            if isinstance(decision, Rejected):
                entry.rejected_requests += 1

    def rejected_requests(self, client_id: str) -> int:
        with self._lock:
            entry = self._clients.get(client_id)
            return entry.rejected_requests if entry else 0


# -- a consistent view of the proxy, read on its own loop ------------------------------------


@dataclass(frozen=True)
class ProxyView:
    new_producer_ids_admitted: int
    produce_requests_rejected: int
    producer_ids_waiting: int
    tokens: float


def read_proxy_view(proxy: BackgroundProxy, timeout_s: float = 1.0) -> ProxyView | None:
    """Counters and User:ANONYMOUS's tokens, read on the proxy's loop (the quota manager is
    not thread-safe). None if the loop does not answer in time."""
    result: concurrent.futures.Future[ProxyView] = concurrent.futures.Future()
    server = proxy.server

    def read() -> None:
        try:
            now_ms = monotonic_ms()
            tokens = float(PRODUCER_IDS_RATE)  # a principal not yet tracked has a full bucket
            for state in server.quota.snapshot(now_ms):
                if state.principal == ANONYMOUS_PRINCIPAL:
                    tokens = state.tokens
            counters = server.counters
            result.set_result(
                ProxyView(
                    new_producer_ids_admitted=counters.new_producer_ids_admitted,
                    produce_requests_rejected=counters.produce_requests_rejected,
                    producer_ids_waiting=len(counters.rejected_producer_ids),
                    tokens=tokens,
                )
            )
        except BaseException as error:
            result.set_exception(error)

    try:
        proxy.call(read)
        return result.result(timeout_s)
    except (concurrent.futures.TimeoutError, RuntimeError):
        return None


# -- producers -------------------------------------------------------------------------------


def _producer_config(
    bootstrap: str, client_id: str, message_timeout_ms: int, logger: logging.Logger
) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # Longer than the run: a throttled message waits (librdkafka retries NOT_ENOUGH_REPLICAS
        # with the same PID and sequence) instead of failing; at the end we purge what is left.
        "message.timeout.ms": message_timeout_ms,
        "logger": logger,
    }


@dataclass
class SteadyProducer:
    """One long-lived idempotent producer at a bounded rate; its PID is known after its first
    batch, so pidgate must never get in its way."""

    config: dict[str, Any]
    stop: threading.Event
    msgs_per_s: int = STEADY_MSGS_PER_S
    delivered: int = 0
    delivery_errors: int = 0
    client_errors: int = 0
    local_errors: int = 0
    purged: int = 0
    last_error: str | None = None
    thread: threading.Thread | None = None

    @property
    def errors(self) -> int:
        return self.delivery_errors + self.client_errors + self.local_errors

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.delivered += 1
        elif error.code() in _PURGED:
            self.purged += 1
        else:
            self.delivery_errors += 1
            self.last_error = str(error)

    def _on_error(self, error: KafkaError) -> None:
        if not self.stop.is_set():
            self.client_errors += 1
            self.last_error = str(error)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="demo-steady", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        producer = Producer({**self.config, "error_cb": self._on_error})
        tick_s = 0.05
        per_tick = max(1, round(self.msgs_per_s * tick_s))
        sent = 0
        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                for _ in range(per_tick):
                    try:
                        producer.produce(
                            STEADY_TOPIC, value=b"steady-%d" % sent, on_delivery=self._on_delivery
                        )
                        sent += 1
                    except (BufferError, KafkaException) as error:
                        self.local_errors += 1
                        self.last_error = str(error)
                producer.poll(0)
                next_at += tick_s
                self.stop.wait(max(0.0, next_at - time.monotonic()))
            producer.flush(5.0)  # deliver what is in flight: it must all succeed
        finally:
            if len(producer):
                producer.purge()
                producer.flush(0)


@dataclass
class StormProducer:
    """One short-lived idempotent producer: a new PID, a few records, flush, gone."""

    index: int
    client_id: str
    started_at: float
    delivered_at: float | None = None
    failed: str | None = None
    cancelled: bool = False
    thread: threading.Thread | None = None

    @property
    def waiting(self) -> bool:
        return self.delivered_at is None and self.failed is None and not self.cancelled

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            if self.delivered_at is None:
                self.delivered_at = time.monotonic()
        elif error.code() in _PURGED:
            self.cancelled = self.delivered_at is None and self.failed is None
        elif self.failed is None:
            self.failed = str(error)

    def run(self, config: dict[str, Any], stop: threading.Event) -> None:
        try:
            producer = Producer(config)
        except KafkaException as error:
            self.failed = str(error)
            return
        try:
            for n in range(STORM_RECORDS):
                producer.produce(
                    STORM_TOPIC,
                    key=self.client_id.encode(),
                    value=b"%s #%d" % (self.client_id.encode(), n),
                    on_delivery=self._on_delivery,
                )
            while not stop.is_set() and producer.flush(0.25) > 0:
                pass
        except (BufferError, KafkaException) as error:
            if self.failed is None:
                self.failed = str(error)
        finally:
            if len(producer):
                producer.purge()
                producer.flush(0)


@dataclass
class Storm:
    """Starts a new ``StormProducer`` every ``interval_s`` from ``start_s`` to ``end_s``
    (seconds since ``t0``), at most ``max_producers``, each in its own thread."""

    t0: float
    start_s: float
    end_s: float
    interval_s: float
    max_producers: int
    stop: threading.Event
    config: Callable[[str], dict[str, Any]]
    producers: list[StormProducer] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="demo-storm", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        next_at = self.t0 + self.start_s
        while len(self.producers) < self.max_producers:
            if self.stop.wait(max(0.0, next_at - time.monotonic())):
                return
            if time.monotonic() - self.t0 >= self.end_s:
                return
            index = len(self.producers) + 1
            client_id = f"{STORM_CLIENT_PREFIX}{index:02d}"
            storm_producer = StormProducer(index, client_id, time.monotonic())
            thread = threading.Thread(
                target=storm_producer.run,
                args=(self.config(client_id), self.stop),
                name=client_id,
                daemon=True,
            )
            storm_producer.thread = thread
            self.producers.append(storm_producer)
            thread.start()
            next_at += self.interval_s

    def snapshot(self) -> list[StormProducer]:
        return list(self.producers)


# -- setup -----------------------------------------------------------------------------------


def demo_settings(broker: EmbeddedBroker) -> Settings:
    return load_settings(
        cli_overrides={
            "proxy": {
                "mode": "gateway",
                "upstream": [broker.bootstrap],
                "listen": f"127.0.0.1:{free_port()}",
                "broker_ports": {TANSU_NODE_ID: free_port()},
                "shutdown_grace_ms": 2000,
            },
            "quota": {
                "producer.id.quota.window.size.seconds": WINDOW_SECONDS,
                "users": {"ANONYMOUS": {"producer_ids_rate": PRODUCER_IDS_RATE}},
            },
            "logging": {"level": "info", "format": "json"},
        }
    )


@contextlib.contextmanager
def _logs_in_file() -> Iterator[tuple[logging.Logger, Path]]:
    """pidgate's structlog events (JSON lines) and librdkafka's log lines go to a file that is
    kept for the user, so the terminal only shows the live view. Yields the logger to give
    librdkafka and the file's path; logging goes back to stderr afterwards."""
    descriptor, name = tempfile.mkstemp(prefix="pidgate-demo-", suffix=".log")
    log_file = open(descriptor, "w", buffering=1)  # noqa: SIM115 (closed below)
    configure_logging(LoggingSettings(level="info", format="json"))
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=log_file))
    rdkafka = logging.getLogger("pidgate.demo.librdkafka")
    rdkafka.propagate = False
    rdkafka.setLevel(logging.INFO)
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s librdkafka %(message)s"))
    rdkafka.addHandler(handler)
    try:
        yield rdkafka, Path(name)
    finally:
        rdkafka.removeHandler(handler)
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
        log_file.close()


def _create_topics(bootstrap: str, logger: logging.Logger, timeout_s: float = 20.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=logger)
    futures = admin.create_topics(
        [NewTopic(STEADY_TOPIC, 1, 1), NewTopic(STORM_TOPIC, 3, 1)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for topic, future in futures.items():
        try:
            future.result(timeout_s)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating topic {topic} through pidgate: {error}") from error


class _Signalled(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: stop the demo cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_signalled(signum: int, _frame: object) -> None:
    raise _Signalled(signum)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals(handler: Callable[[int, Any], None] | int) -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``handler`` inside the block (main thread only; elsewhere
    Python cannot install handlers and the block runs as is). Installing the raising handler
    explicitly also makes Ctrl-C work when the demo was started with SIGINT ignored (a shell's
    background job); ``signal.SIG_IGN`` keeps a second Ctrl-C from cutting the bounded cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


# -- the live view ---------------------------------------------------------------------------

_COLUMNS = (
    f"{'':>6} | {'new PIDs':>8}  {'Produce':>8} {'PIDs':>7} | {'steady':>5}  {'':>6} | "
    f"{'storm':>7} {'producers':>9} {'':>7} {'':>6} | tokens",
    f"{'time':>6} | {'admitted':>8}  {'rejected':>8} {'waiting':>7} | "
    f"{'msg/s':>5}  {'errors':>6} | "
    f"{'started':>7} {'delivered':>9} {'waiting':>7} {'failed':>6} | left",
)


def _header(
    broker: EmbeddedBroker, proxy: BackgroundProxy, duration_s: float, log_path: Path
) -> None:
    storm_end = STORM_START_S + _storm_seconds(duration_s)
    _out("pidgate demo: per-principal throttling of NEW producer IDs (KIP-936), live")
    _out()
    _out(f"  broker   tansu on {broker.bootstrap}  broker_pid={broker.pid}")
    _out(f"  pidgate  {proxy.bootstrap} (gateway) -> {broker.bootstrap}; clients connect here")
    _out(
        f"  quota    {ANONYMOUS_PRINCIPAL} may activate {PRODUCER_IDS_RATE} new producer IDs per "
        f"{WINDOW_SECONDS} s window (a token every {WINDOW_SECONDS / PRODUCER_IDS_RATE:.1f} s, "
        f"burst {PRODUCER_IDS_RATE})"
    )
    _out(f"  log      pidgate's own log (JSON lines, incl. pid_throttled events): {log_path}")
    _out()
    _out(
        f"  steady   one long-lived idempotent producer sends {STEADY_MSGS_PER_S} msg/s for the "
        "whole run."
    )
    _out("           Its producer ID is known after its first batch: pidgate never throttles it.")
    _out(
        f"  storm    from {STORM_START_S:.0f} s to {storm_end:.0f} s a NEW idempotent producer "
        f"starts every {STORM_INTERVAL_S} s"
    )
    _out(
        f"           (a crash-looping app: each restart is a new producer ID), sends "
        f"{STORM_RECORDS} records, flushes."
    )
    _out("           Past the quota, pidgate rejects their Produce requests (librdkafka gets")
    _out("           NOT_ENOUGH_REPLICAS and retries) and mutes the connection for the throttle")
    _out("           time; each one gets through when a token frees up. Nothing is lost.")
    _out(f"  stop     after {duration_s:.0f} s, or Ctrl-C")
    _out()
    for line in (
        "pidgate: new PIDs admitted, Produce requests rejected, PIDs waiting (rejected, not",
        "admitted yet); steady producer: messages delivered per second, errors (stays 0);",
        "storm producers: started, delivered, waiting (nothing delivered yet), failed;",
        f"tokens left in {ANONYMOUS_PRINCIPAL}'s bucket (one token = one new producer ID).",
    ):
        _out(("  columns  " if line.startswith("pidgate:") else " " * 11) + line)
    _out()
    for line in _COLUMNS:
        _out(line)


def _live_line(
    elapsed_s: float,
    view: ProxyView | None,
    steady_rate: float,
    steady: SteadyProducer,
    storm: list[StormProducer],
) -> str:
    delivered = sum(1 for p in storm if p.delivered_at is not None)
    waiting = sum(1 for p in storm if p.waiting)
    failed = sum(1 for p in storm if p.failed is not None)
    if view is None:
        proxy_part = f"{'?':>8}  {'?':>8} {'?':>7}"
        tokens = "?"
    else:
        proxy_part = (
            f"{view.new_producer_ids_admitted:>8}  {view.produce_requests_rejected:>8} "
            f"{view.producer_ids_waiting:>7}"
        )
        tokens = f"{view.tokens:.1f}/{PRODUCER_IDS_RATE}"
    return (
        f"{elapsed_s:>5.0f}s | {proxy_part} | {steady_rate:>5.0f}  {steady.errors:>6} | "
        f"{len(storm):>7} {delivered:>9} {waiting:>7} {failed:>6} | {tokens}"
    )


def _storm_seconds(duration_s: float) -> float:
    return duration_s / 3


# -- summary ---------------------------------------------------------------------------------


def _summary(
    *,
    elapsed_s: float,
    interrupted: bool,
    view: ProxyView | None,
    steady: SteadyProducer,
    storm: list[StormProducer],
    tracker: StormDecisionTracker,
    log_path: Path,
) -> None:
    throttled = [p for p in storm if tracker.rejected_requests(p.client_id) > 0]
    recovered = [p for p in throttled if p.delivered_at is not None]
    throttled_ids = {p.client_id for p in throttled}
    unthrottled_ok = [
        p for p in storm if p.delivered_at is not None and p.client_id not in throttled_ids
    ]
    failed = [p for p in storm if p.failed is not None]
    waiting = [p for p in storm if p.delivered_at is None and p.failed is None]

    def waits(producers: list[StormProducer]) -> list[float]:
        return sorted(p.delivered_at - p.started_at for p in producers if p.delivered_at)

    recovered_waits = waits(recovered)
    fast_waits = waits(unthrottled_ok)
    steady_ok = steady.errors == 0
    result = "interrupted" if interrupted else ("ok" if steady_ok and not failed else "errors")

    def span(values: list[float]) -> str:
        low, high = values[0], values[-1]
        return f"{high:.1f} s" if round(low, 1) == round(high, 1) else f"{low:.1f} to {high:.1f} s"

    _out()
    _out(f"Summary after {elapsed_s:.1f} s{' (interrupted)' if interrupted else ''}:")
    _out(f"  - steady producer: {steady.delivered} messages delivered, {steady.errors} errors.")
    if steady_ok:
        _out("      Its producer ID was known, so pidgate never got in its way.")
    else:
        _out(f"      Last error: {steady.last_error}")
    _out(f"  - storm: {len(storm)} producers started, each with a new producer ID.")
    if unthrottled_ok:
        _out(
            f"      {len(unthrottled_ok)} got in at once, while tokens were left "
            f"(delivered in {span(fast_waits)});"
        )
    _out(
        f"      {len(throttled)} were throttled, and {len(recovered)} of those delivered once a "
        "token freed up"
        + (
            f",\n      after {span(recovered_waits)} "
            f"(median {statistics.median(recovered_waits):.1f} s)."
            if recovered_waits
            else "."
        )
    )
    _out(
        f"      {len(failed)} failed, {len(waiting)} still waiting at the end"
        + (" (purged)." if waiting else ".")
    )
    if failed:
        _out(f"      First failure: {failed[0].failed}")
    if view is not None:
        ceiling = int(PRODUCER_IDS_RATE + PRODUCER_IDS_RATE * elapsed_s / WINDOW_SECONDS)
        _out(
            f"  - pidgate: {view.new_producer_ids_admitted} new producer IDs admitted (the quota "
            f"allows at most {ceiling} in {elapsed_s:.0f} s),"
        )
        _out(f"      {view.produce_requests_rejected} Produce requests rejected.")
    _out(f"  - pidgate's log: {log_path}")
    _out()
    _out("summary (key=value):")
    fields: dict[str, object] = {
        "result": result,
        "elapsed_s": f"{elapsed_s:.1f}",
        "producer_ids_rate": PRODUCER_IDS_RATE,
        "window_s": WINDOW_SECONDS,
        "new_producer_ids_admitted": view.new_producer_ids_admitted if view else -1,
        "produce_requests_rejected": view.produce_requests_rejected if view else -1,
        "producer_ids_waiting": view.producer_ids_waiting if view else -1,
        "steady_delivered": steady.delivered,
        "steady_errors": steady.errors,
        "storm_started": len(storm),
        "storm_delivered": sum(1 for p in storm if p.delivered_at is not None),
        "storm_delivered_unthrottled": len(unthrottled_ok),
        "storm_throttled": len(throttled),
        "storm_delivered_after_throttle": len(recovered),
        "storm_waiting_at_end": len(waiting),
        "storm_failed": len(failed),
        "storm_throttled_wait_median_s": (
            f"{statistics.median(recovered_waits):.1f}" if recovered_waits else "-"
        ),
        "storm_throttled_wait_max_s": f"{recovered_waits[-1]:.1f}" if recovered_waits else "-",
    }
    for key, value in fields.items():
        _out(f"  {key}={value}")


# -- the run ---------------------------------------------------------------------------------


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
        threads: list[threading.Thread] = []
        if self.storm is not None and self.storm.thread is not None:
            threads.append(self.storm.thread)
            threads += [p.thread for p in self.storm.snapshot() if p.thread is not None]
        if self.steady is not None and self.steady.thread is not None:
            threads.append(self.steady.thread)
        stuck = []
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread.name)
        if stuck:
            print(f"pidgate demo: producers still stopping: {', '.join(stuck)}", file=sys.stderr)

    def stop_proxy(self) -> None:
        proxy, self.proxy = self.proxy, None
        if proxy is not None:
            proxy.stop(timeout_s=10.0)

    def stop_broker(self) -> None:
        broker, self.broker = self.broker, None
        if broker is not None:
            broker.cleanup()

    def shut_down(self) -> None:
        """Idempotent: stops whatever is still running, in order."""
        self.stop_producers()
        self.stop_proxy()
        self.stop_broker()


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
        _out(_live_line(now - t0, view, rate, steady, storm.snapshot()))
        tick += 1


def run_demo(duration_s: float = 45.0) -> int:
    """Run the demo for ``duration_s`` seconds (or until Ctrl-C / SIGTERM). 0 on a clean run,
    128 + signal number when stopped by a signal (130 for Ctrl-C), 1 when setup failed."""
    with _stop_signals(_raise_signalled):
        try:
            return _run(duration_s)
        except _Signalled as signalled:  # during setup or cleanup's first steps
            print(f"pidgate demo: stopped by {signalled}", file=sys.stderr)
            return 128 + signalled.signum
        except KeyboardInterrupt:
            return _EXIT_INTERRUPTED


def _run(duration_s: float) -> int:
    with _logs_in_file() as (rdkafka_logger, log_path):
        running = _Running()
        tracker = StormDecisionTracker(STORM_CLIENT_PREFIX, MAX_STORM_PRODUCERS)
        try:
            try:
                _out("pidgate demo: starting an embedded tansu broker and pidgate ...")
                # Assigned before start(), so that an interrupted start is still cleaned up.
                running.broker = broker = EmbeddedBroker()
                broker.start()
                # The observer tells which storm producer was throttled.
                running.proxy = proxy = BackgroundProxy(demo_settings(broker), observers=(tracker,))
                proxy.start()
                _create_topics(proxy.bootstrap, rdkafka_logger)
            except Exception as error:
                print(f"pidgate demo: setup failed: {error}", file=sys.stderr)
                tail = broker.log_tail() if running.broker is not None else ""
                if tail:
                    print(f"tansu log tail:\n{tail}", file=sys.stderr)
                print(f"pidgate log: {log_path}", file=sys.stderr)
                return _EXIT_SETUP_FAILED

            message_timeout_ms = int((duration_s + 120) * 1000)

            def config(client_id: str) -> dict[str, Any]:
                return _producer_config(
                    proxy.bootstrap, client_id, message_timeout_ms, rdkafka_logger
                )

            _header(broker, proxy, duration_s, log_path)
            t0 = time.monotonic()
            running.steady = steady = SteadyProducer(config(STEADY_CLIENT_ID), running.stop)
            running.storm = storm = Storm(
                t0=t0,
                start_s=STORM_START_S,
                end_s=STORM_START_S + _storm_seconds(duration_s),
                interval_s=STORM_INTERVAL_S,
                max_producers=MAX_STORM_PRODUCERS,
                stop=running.stop,
                config=config,
            )
            signalled: _Signalled | None = None
            try:
                steady.start()
                storm.start()
                _watch(proxy, steady, storm, t0, duration_s)
            except _Signalled as stop_signal:
                signalled = stop_signal
            elapsed_s = time.monotonic() - t0
            with _stop_signals(signal.SIG_IGN):
                _out(
                    f"stopping ({signalled} received): producers, pidgate, broker ..."
                    if signalled
                    else "stopping: producers, pidgate, broker ..."
                )
                # Producers first (each purges what is still waiting), then the final counts.
                running.stop_producers()
                view = read_proxy_view(proxy)
                running.shut_down()
                _summary(
                    elapsed_s=elapsed_s,
                    interrupted=signalled is not None,
                    view=view,
                    steady=steady,
                    storm=storm.snapshot(),
                    tracker=tracker,
                    log_path=log_path,
                )
            return _EXIT_OK if signalled is None else 128 + signalled.signum
        finally:
            with _stop_signals(signal.SIG_IGN):
                running.shut_down()
