"""Pipelined requests on one raw socket through pidgate, in front of a real tansu broker.

Proves: responses come back in exactly request order even when pidgate answers one of them
itself (a throttled Produce) between responses the broker owes; the local rejection decodes
with kafka-python's ProduceResponse at the request's own version, carries the rejection code on
every partition and a positive throttle_time_ms; admitted requests get the broker's answer;
acks=0 Produce requests get no response at all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from pidgate.proxy.background import BackgroundProxy
from tests.integration.conftest import anonymous_quota
from tests.integration.helpers import (
    PRODUCE_KEY,
    REJECTED_DEFAULT,
    KafkaSocket,
    advertised_versions,
    api_versions_request,
    correlation_id_of,
    create_topic,
    decode_produce,
    decode_response,
    encode_request,
    init_producer_id,
    metadata_request,
    produce_partition_errors,
    produce_request,
    record_batch,
    unique_name,
)

pytestmark = pytest.mark.integration

PRODUCE_VERSIONS = (3, 7, 9, 10, 11)
# Mute after a rejection is capped short so the test does not wait out a whole window.
SHORT_MUTE = {"max_throttle_time_ms": 300}


def test_pidgate_advertises_the_produce_versions_under_test(start_proxy) -> None:
    proxy = start_proxy()
    versions = advertised_versions(proxy.bootstrap)
    low, high = versions[PRODUCE_KEY]
    # pidgate walks Produce from v3 (RecordBatch v2) on; the broker (tansu) goes to 11.
    assert low == 3
    assert high >= max(PRODUCE_VERSIONS)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_pipelined_responses_keep_request_order_around_a_rejection(
    start_proxy, version: int
) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 60), rejection=SHORT_MUTE)
    topic = unique_name(f"pipe-v{version}")
    create_topic(proxy.bootstrap, topic)
    metadata_version = 1
    # Real PIDs from the broker (tansu refuses batches from PIDs it never handed out).
    pid_a, epoch_a = init_producer_id(proxy.bootstrap)
    pid_b, epoch_b = init_producer_id(proxy.bootstrap)

    requests = [
        # (correlation id, what, encoded request)
        (
            101,
            "produce A (new PID, admitted)",
            encode_request(
                produce_request(version, topic, record_batch(pid_a, epoch_a, 0, count=2)),
                version,
                101,
            ),
        ),
        (
            102,
            "metadata",
            encode_request(metadata_request([topic], metadata_version), metadata_version, 102),
        ),
        (
            103,
            "produce B (new PID, over quota)",
            encode_request(
                produce_request(version, topic, record_batch(pid_b, epoch_b, 0, count=1)),
                version,
                103,
            ),
        ),
        (
            104,
            "produce A again (known PID)",
            encode_request(
                produce_request(version, topic, record_batch(pid_a, epoch_a, 2, count=1)),
                version,
                104,
            ),
        ),
        (105, "api versions", encode_request(api_versions_request(3), 3, 105)),
    ]
    with KafkaSocket(proxy.bootstrap, timeout_s=20) as conn:
        conn.sendall(b"".join(encoded for _, _, encoded in requests))
        payloads = [conn.recv_frame() for _ in requests]

    assert [correlation_id_of(p) for p in payloads] == [cid for cid, _, _ in requests]

    first, metadata, rejected, second, api_versions = payloads
    first_response = decode_produce(first, version)
    assert produce_partition_errors(first_response) == [0]
    assert first_response.responses[0].name == topic

    rejected_response = decode_produce(rejected, version)
    assert rejected_response.header.correlation_id == 103
    assert [t.name for t in rejected_response.responses] == [topic]
    assert produce_partition_errors(rejected_response) == [REJECTED_DEFAULT]
    assert rejected_response.throttle_time_ms > 0

    second_response = decode_produce(second, version)
    assert produce_partition_errors(second_response) == [0]
    # The broker appended A's second batch right after its first two records.
    first_offset = first_response.responses[0].partition_responses[0].base_offset
    second_offset = second_response.responses[0].partition_responses[0].base_offset
    assert second_offset == first_offset + 2

    metadata_response = decode_response(MetadataResponse, metadata, metadata_version)
    assert [t.name for t in metadata_response.topics] == [topic]
    broker_ports = {b.port for b in metadata_response.brokers}
    assert broker_ports == set(proxy.server.broker_listener_ports.values())

    versions_response = decode_response(ApiVersionsResponse, api_versions, 3)
    assert versions_response.error_code == 0

    counters = proxy.server.counters
    assert counters.produce_requests_rejected == 1
    assert pid_b in counters.rejected_producer_ids
    assert counters.new_producer_ids_admitted == 1


@pytest.mark.parametrize("version", (3, 9, 11))
def test_acks_zero_produce_gets_no_response(start_proxy, version: int) -> None:
    proxy = start_proxy()
    topic = unique_name(f"acks0-v{version}")
    create_topic(proxy.bootstrap, topic)
    fire_and_forget = produce_request(version, topic, record_batch(count=3), acks=0)
    acknowledged = produce_request(version, topic, record_batch(count=1), acks=-1)
    with KafkaSocket(proxy.bootstrap, timeout_s=20) as conn:
        conn.sendall(
            encode_request(fire_and_forget, version, 201)
            + encode_request(api_versions_request(3), 3, 202)
            + encode_request(fire_and_forget, version, 203)
            + encode_request(acknowledged, version, 204)
        )
        first = conn.recv_frame()
        second = conn.recv_frame()
    # The acks=0 requests (201, 203) are skipped: the next thing read is the next response.
    assert correlation_id_of(first) == 202
    assert decode_response(ApiVersionsResponse, first, 3).error_code == 0
    assert correlation_id_of(second) == 204
    response = decode_produce(second, version)
    assert produce_partition_errors(response) == [0]
    # Both acks=0 requests (3 records each) were written before the acknowledged one.
    assert response.responses[0].partition_responses[0].base_offset == 6


def test_client_that_does_not_read_is_bounded_and_loses_nothing(
    start_proxy: Callable[..., BackgroundProxy],
) -> None:
    """Backpressure: a client pipelining thousands of requests without reading responses.
    pidgate stops reading it (at most max_in_flight_requests owed, a bounded buffer towards
    it) instead of buffering megabytes; nothing is dropped, and every response arrives, in
    order, once the client reads."""
    max_in_flight = 8
    proxy = start_proxy(
        proxy={"max_in_flight_requests": max_in_flight, "write_buffer_high_bytes": 1024}
    )
    # Big responses (metadata for topics with long names), so that what pidgate would have to
    # buffer without backpressure (~25 MB) is far beyond what the kernel's socket buffers hold.
    topics = [unique_name("backpressure-" + "x" * 200) for _ in range(20)]
    for topic in topics:
        create_topic(proxy.bootstrap, topic)
    request_count = 5000
    frames = b"".join(
        encode_request(metadata_request(topics, version=1), 1, correlation_id)
        for correlation_id in range(request_count)
    )
    with KafkaSocket(proxy.bootstrap, timeout_s=30) as client:
        sender = threading.Thread(target=client.sock.sendall, args=(frames,), daemon=True)
        sender.start()  # blocks once pidgate stops reading; that is the point
        time.sleep(2.0)
        (connection,) = proxy.server.context.connections
        assert len(connection._slots) <= max_in_flight
        buffered_towards_client = connection.transport.get_write_buffer_size()
        assert buffered_towards_client <= 64 * 1024, buffered_towards_client
        received = [correlation_id_of(client.recv_frame()) for _ in range(request_count)]
        sender.join(30)
    assert received == list(range(request_count))
