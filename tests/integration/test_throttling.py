"""KIP-936 throttling end to end: real tansu, pidgate in front, real kafka-python and
confluent-kafka (librdkafka) producers.

With a quota of 3 new PIDs per 10 s window for User:ANONYMOUS, a steady idempotent producer
started first keeps delivering with zero errors, while 10 short-lived idempotent producers
(5 kafka-python, 5 librdkafka; a new PID each) are throttled, retry, and eventually deliver
every record exactly once. What reached the broker is read from the broker itself.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import producer_ids_in_log
from tests.integration.conftest import anonymous_quota

pytestmark = pytest.mark.integration

RATE = 3
WINDOW_S = 10
RECORDS_PER_STORM_PRODUCER = 5
STORM_TOPIC = "storm"
STEADY_TOPIC = "steady"
#: Upper bound for the whole storm to drain: 10 PIDs at 3 per 10 s is ~30 s; generous for CI.
STORM_DEADLINE_S = 120


@dataclass
class SteadyProducer:
    """An idempotent librdkafka producer sending a bounded stream for as long as it runs."""

    bootstrap: str
    delivered: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all"}
        )

        def on_delivery(error: object, _message: object) -> None:
            if error is None:
                self.delivered.append(time.monotonic())
            else:
                self.errors.append(str(error))

        for sequence in range(100_000):  # bounded; stopped by the test long before
            if self.stop.is_set():
                break
            producer.produce(STEADY_TOPIC, f"steady-{sequence}".encode(), on_delivery=on_delivery)
            producer.poll(0.02)
        producer.flush(30)


@dataclass
class StormResult:
    name: str
    delivered_at: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def confluent_storm_producer(bootstrap: str, result: StormResult) -> None:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "client.id": result.name,
        }
    )

    def on_delivery(error: object, _message: object) -> None:
        if error is None:
            result.delivered_at.append(time.monotonic())
        else:
            result.errors.append(str(error))

    for index in range(RECORDS_PER_STORM_PRODUCER):
        producer.produce(
            STORM_TOPIC,
            value=f"{result.name}-{index}".encode(),
            key=result.name.encode(),
            on_delivery=on_delivery,
        )
    producer.flush(STORM_DEADLINE_S)


def kafka_python_storm_producer(bootstrap: str, result: StormResult) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        client_id=result.name,
        delivery_timeout_ms=STORM_DEADLINE_S * 1000,
        request_timeout_ms=30_000,
    )
    futures = [
        producer.send(
            STORM_TOPIC, value=f"{result.name}-{index}".encode(), key=result.name.encode()
        )
        for index in range(RECORDS_PER_STORM_PRODUCER)
    ]
    for future in futures:
        try:
            future.get(timeout=STORM_DEADLINE_S)
            result.delivered_at.append(time.monotonic())
        except Exception as error:  # recorded; the test asserts there are none
            result.errors.append(repr(error))
    producer.close(timeout=10)


def create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1) for name in names])
    for future in futures.values():
        future.result(30)


def start_threads(targets: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=target, daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    return threads


def test_storm_is_throttled_steady_producer_unaffected_everyone_delivers_once(
    broker: EmbeddedBroker, start_proxy: Callable[..., BackgroundProxy]
) -> None:
    proxy = start_proxy(quota=anonymous_quota(RATE, WINDOW_S))
    create_topics(proxy.bootstrap, STORM_TOPIC, STEADY_TOPIC)

    steady = SteadyProducer(proxy.bootstrap)
    (steady_thread,) = start_threads([steady.run])
    deadline = time.monotonic() + 30
    while not steady.delivered and time.monotonic() < deadline:
        time.sleep(0.05)
    assert steady.delivered, f"steady producer never delivered: {steady.errors}"

    storm_started = time.monotonic()
    results = [StormResult(f"storm-kp-{i}") for i in range(5)]
    results += [StormResult(f"storm-ck-{i}") for i in range(5)]
    targets: list[Callable[[], None]] = [
        (lambda r=r: kafka_python_storm_producer(proxy.bootstrap, r))
        if "kp" in r.name
        else (lambda r=r: confluent_storm_producer(proxy.bootstrap, r))
        for r in results
    ]
    storm_threads = start_threads(targets)
    for thread in storm_threads:
        thread.join(STORM_DEADLINE_S + 30)
    storm_ended = time.monotonic()
    steady_during_storm = [t for t in steady.delivered if storm_started <= t <= storm_ended]
    steady.stop.set()
    steady_thread.join(60)

    # Every short-lived producer, of both libraries, eventually delivered all its records.
    for result in results:
        assert result.errors == [], f"{result.name} lost records: {result.errors[:3]}"
        assert len(result.delivered_at) == RECORDS_PER_STORM_PRODUCER, result.name

    # They were throttled on the way: the quota made some of them wait for the window to refill.
    counters = proxy.server.counters
    assert counters.produce_requests_rejected > 0
    # Both libraries were among the throttled (only 2 of the 10 PIDs fit the first burst).
    assert counters.rejections_by_client_software["kafka-python"] > 0
    assert counters.rejections_by_client_software["confluent-kafka-python"] > 0
    assert counters.new_producer_ids_admitted == 11  # the steady producer + 10 storm producers

    # The steady producer never saw an error and kept delivering through the storm.
    assert steady.errors == []
    assert len(steady_during_storm) > 0
    storm_seconds = storm_ended - storm_started
    busiest_gap = max(
        (b - a for a, b in itertools.pairwise(steady_during_storm)),
        default=0.0,
    )
    assert busiest_gap < max(5.0, storm_seconds / 3), "the steady producer stalled"

    # No more new PIDs than the quota allows: by time T after the start, at most
    # RATE (the initial burst) + RATE * T / WINDOW_S PIDs can have been admitted. Delivery
    # callbacks come after admission, so counting first deliveries can only under-count.
    first_deliveries = sorted(min(r.delivered_at) for r in results)
    for admitted_so_far, delivered_at in enumerate(first_deliveries, start=2):  # + steady's PID
        allowed = RATE + RATE * (delivered_at - storm_started + 1) / WINDOW_S
        assert admitted_so_far <= allowed + 1e-9, (admitted_so_far, delivered_at - storm_started)

    # What reached the broker, read from the broker itself: 10 storm PIDs, each with exactly
    # its records (no duplicates from the retries, nothing lost).
    in_log = producer_ids_in_log(broker.bootstrap, STORM_TOPIC, [0])
    assert len(in_log) == 10
    assert all(count == RECORDS_PER_STORM_PRODUCER for count in in_log.values()), in_log
    assert sum(Counter(in_log).values()) == 10 * RECORDS_PER_STORM_PRODUCER
