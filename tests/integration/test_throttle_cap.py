"""Without holding (``rejection.max_hold_ms: 0``, or the waiting room full), the throttle sent
to a client, and the mute, are capped (``rejection.max_throttle_time_ms``).

KIP-219 clients sleep for the ``throttle_time_ms`` they are sent, and pidgate mutes every client
for it. Uncapped, that is the time until the quota refills, up to a whole window (an hour by
default): a producer told to wait kept sleeping after the operator raised its quota, and
kafka-python 3.0 ran batches past their delivery timeout while it slept. Capped, every client
retries within the cap and each retry is judged again.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka import KafkaProducer

from pidgate.demo.broker import EmbeddedBroker
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    KafkaSocket,
    create_topic,
    decode_produce,
    init_producer_id,
    produce_frame,
    unique_name,
)

pytestmark = pytest.mark.integration

CAP_MS = 2000
RECORDS = 50


def _librdkafka(bootstrap: str, topic: str) -> Any:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    acked: list[float] = []
    errors: list[str] = []

    def on_delivery(error: Any, _message: Any) -> None:
        (errors.append(str(error)) if error else acked.append(time.monotonic()))

    for i in range(RECORDS):
        producer.produce(topic, b"r%d" % i, partition=0, on_delivery=on_delivery)
    producer.poll(0)

    def wait(timeout_s: float) -> tuple[list[float], list[str]]:
        producer.flush(timeout_s)
        return acked, errors

    return wait


def _kafka_python(bootstrap: str, topic: str) -> Any:
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    acked: list[float] = []
    errors: list[str] = []
    for i in range(RECORDS):
        future = producer.send(topic, b"r%d" % i, partition=0)
        future.add_callback(lambda _m: acked.append(time.monotonic()))
        future.add_errback(lambda e: errors.append(repr(e)))

    def wait(timeout_s: float) -> tuple[list[float], list[str]]:
        producer.flush(timeout_s)
        producer.close(5)
        return acked, errors

    return wait


@pytest.mark.parametrize("client", [_librdkafka, _kafka_python], ids=["librdkafka", "kafka-python"])
def test_a_throttled_producer_recovers_within_the_cap_of_the_quota_being_raised(
    start_proxy, broker: EmbeddedBroker, client: Any
) -> None:
    # One new PID per hour, and it is spent: uncapped, the producer would be told to wait ~1 h.
    proxy = start_proxy(
        quota=anonymous_quota(1, 3600), rejection={"max_throttle_time_ms": CAP_MS, "max_hold_ms": 0}
    )
    topic = unique_name("cap")
    create_topic(proxy.bootstrap, topic)
    spender, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(produce_frame(topic, spender, 1))
        conn.recv_frame()

    wait = client(proxy.bootstrap, topic)
    time.sleep(3.0)  # throttled, retrying
    rejected_before = proxy.call_and_wait(lambda: proxy.server.counters.produce_requests_rejected)
    # Listener settings in a reloaded file are ignored until restart: only the quota changes.
    # The bucket keeps its level (empty) and refills at the new rate: 10 tokens a second.
    raised = proxy_settings(
        broker,
        quota=anonymous_quota(36_000, 3600),
        rejection={"max_throttle_time_ms": CAP_MS, "max_hold_ms": 0},
    )
    raised_at = time.monotonic()
    proxy.call_and_wait(lambda: proxy.server.reload(raised))  # what SIGHUP does
    acked, errors = wait(30)

    assert rejected_before >= 1
    assert errors == []
    assert len(acked) == RECORDS
    # Retried within the cap (plus a token's 0.1 s and the client's own backoff) of the quota
    # being raised, not after the hour the quota first asked it to wait.
    assert min(acked) - raised_at < CAP_MS / 1000 + 3.0


def test_a_rejection_carries_the_capped_throttle_and_mutes_for_it(
    start_proxy, broker: EmbeddedBroker
) -> None:
    proxy = start_proxy(
        quota=anonymous_quota(1, 3600), rejection={"max_throttle_time_ms": 700, "max_hold_ms": 0}
    )
    topic = unique_name("cap-raw")
    create_topic(proxy.bootstrap, topic)
    first, _ = init_producer_id(proxy.bootstrap)
    second, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=10) as conn:
        conn.sendall(produce_frame(topic, first, 1))
        conn.recv_frame()
        conn.sendall(
            produce_frame(topic, second, 2) + produce_frame(topic, first, 3, base_sequence=1)
        )
        rejected = decode_produce(conn.recv_frame(), 8)
        assert rejected.throttle_time_ms == 700  # the quota would have said ~3,600,000
        started = time.monotonic()
        conn.recv_frame()  # the known PID's request, read only after the mute
        assert 0.5 < time.monotonic() - started < 5.0
