"""aiokafka's idempotent producer, throttled by pidgate, recovers and stores each record once.

aiokafka 0.14 sends ApiVersions v0 (no client_software_name) and gives a record up on an error
code it does not know: with 89 THROTTLING_QUOTA_EXCEEDED every record of a throttled producer
failed within 0.2 s (seen against Apache Kafka 3.1.0). pidgate now answers clients it cannot
identify with 19 NOT_ENOUGH_REPLICAS, which aiokafka retries with the same PID and sequence.

tansu cannot start aiokafka's idempotent producer (its InitProducerId v0 answer is an error), so
pidgate forwards to a small peer that asks tansu with InitProducerId v4 on aiokafka's behalf
(``init_pid_shim.py``); every Produce still goes to the real broker.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer
from kafka import KafkaConsumer, TopicPartition

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import fetch_batch_headers
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import create_topic, unique_name
from tests.integration.init_pid_shim import InitProducerIdShim

pytestmark = pytest.mark.integration

RECORDS = 200


async def _produce(bootstrap: str, topic: str, name: str) -> tuple[float, list[int]]:
    """Send RECORDS values, five in flight, and wait for every one: (seconds, offsets)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    started = time.monotonic()
    try:
        futures = [
            await producer.send(topic, f"{name}-{i:04d}".encode(), partition=0)
            for i in range(RECORDS)
        ]
        results = await asyncio.wait_for(asyncio.gather(*futures), 60)
    finally:
        await producer.stop()
    return time.monotonic() - started, [metadata.offset for metadata in results]


def _read_back(bootstrap: str, topic: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        return [record.value for record in consumer]
    finally:
        consumer.close()


def test_a_throttled_aiokafka_idempotent_producer_retries_and_stores_each_record_once(
    broker: EmbeddedBroker,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with InitProducerIdShim(broker.bootstrap) as tansu_for_aiokafka:
        settings = proxy_settings(
            broker,
            # One new PID per 4 s: the first producer takes the token, the second waits for it.
            quota=anonymous_quota(producer_ids_rate=1, window_seconds=4),
            proxy={
                "mode": "sidecar",
                "upstream": [tansu_for_aiokafka],
                "listen": listen,
                "advertised_endpoints": {broker.bootstrap: listen},
            },
        )
        with BackgroundProxy(settings) as proxy:
            topic = unique_name("aiokafka")
            create_topic(proxy.bootstrap, topic)
            first_s, _ = asyncio.run(_produce(proxy.bootstrap, topic, "first"))
            second_s, offsets = asyncio.run(_produce(proxy.bootstrap, topic, "second"))
            rejected = proxy.call_and_wait(lambda: proxy.server.counters.produce_requests_rejected)

    # The second producer was throttled until the token came back, then got everything in.
    assert rejected >= 1
    assert second_s > 1.0 > first_s
    assert offsets == sorted(offsets) and len(set(offsets)) == RECORDS
    stored = _read_back(broker.bootstrap, topic)
    expected = [f"{name}-{i:04d}".encode() for name in ("first", "second") for i in range(RECORDS)]
    assert stored == expected
    # Two PIDs, each at epoch 0: no reset, no epoch bump.
    headers = fetch_batch_headers(broker.bootstrap, topic, [0])
    assert len({h.producer_id for h in headers}) == 2
    assert {h.producer_epoch for h in headers} == {0}
