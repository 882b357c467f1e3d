"""The demo's confluent-kafka producers: one steady long-lived idempotent producer and the
restart storm of short-lived ones, each in its own bounded daemon thread.

Owns: ``producer_config``, ``SteadyProducer``, ``StormProducer`` and ``Storm``. Talks to
pidgate only as a Kafka client does (its bootstrap address); must not import ``pidgate.proxy``
or the demo's display, and prints nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pidgate.demo.plan import (
    STEADY_MSGS_PER_S,
    STEADY_TOPIC,
    STORM_CLIENT_PREFIX,
    STORM_RECORDS,
    STORM_TOPIC,
)

ProducerConfig = dict[str, Any]

#: Delivery errors for messages purged at stop: not failures.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


def producer_config(
    bootstrap: str, client_id: str, message_timeout_ms: int, logger: logging.Logger
) -> ProducerConfig:
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


def _purge_unsent(producer: Producer) -> None:
    if len(producer):
        producer.purge()
        producer.flush(0)


@dataclass
class SteadyProducer:
    """One long-lived idempotent producer at a bounded rate; its PID is known after its first
    batch, so pidgate must never get in its way."""

    config: ProducerConfig
    stop: threading.Event
    msgs_per_s: int = STEADY_MSGS_PER_S
    delivered: int = 0
    delivery_errors: int = 0
    client_errors: int = 0
    local_errors: int = 0
    last_error: str | None = None
    thread: threading.Thread | None = None

    @property
    def errors(self) -> int:
        return self.delivery_errors + self.client_errors + self.local_errors

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.delivered += 1
        elif error.code() not in _PURGED:
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
            _purge_unsent(producer)


@dataclass
class StormProducer:
    """One short-lived idempotent producer: a new PID, a few records, flush, gone."""

    client_id: str
    started_at: float
    delivered_at: float | None = None
    failed: str | None = None
    cancelled: bool = False
    thread: threading.Thread | None = None

    @property
    def delivered(self) -> bool:
        return self.delivered_at is not None

    @property
    def undelivered(self) -> bool:
        """Neither delivered nor failed: still waiting, or purged while waiting."""
        return self.delivered_at is None and self.failed is None

    @property
    def waiting(self) -> bool:
        return self.undelivered and not self.cancelled

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            if self.delivered_at is None:
                self.delivered_at = time.monotonic()
        elif error.code() in _PURGED:
            self.cancelled = self.undelivered
        elif self.failed is None:
            self.failed = str(error)

    def run(self, config: ProducerConfig, stop: threading.Event) -> None:
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
            _purge_unsent(producer)


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
    config: Callable[[str], ProducerConfig]
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
            client_id = f"{STORM_CLIENT_PREFIX}{len(self.producers) + 1:02d}"
            storm_producer = StormProducer(client_id, time.monotonic())
            storm_producer.thread = threading.Thread(
                target=storm_producer.run,
                args=(self.config(client_id), self.stop),
                name=client_id,
                daemon=True,
            )
            self.producers.append(storm_producer)
            storm_producer.thread.start()
            next_at += self.interval_s

    def snapshot(self) -> list[StormProducer]:
        return list(self.producers)

    def threads(self) -> list[threading.Thread]:
        """The driver's thread and every storm producer's, as started so far."""
        driver = [self.thread] if self.thread is not None else []
        return driver + [p.thread for p in self.snapshot() if p.thread is not None]
