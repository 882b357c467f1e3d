"""Bad input from one client never hurts anyone else.

Against one pidgate in front of a real tansu broker, each kind of bad request must make pidgate
close *that* connection cleanly, without answering it, while a real producer connected before
keeps producing through the same pidgate, an idle raw connection opened before still gets
answers, and fresh connections still work. Plus: an unreachable upstream closes the client
cleanly and pidgate recovers once the broker appears; an ApiVersions request newer than pidgate
gets the broker-style v0 UNSUPPORTED_VERSION answer (KIP-511).
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka.protocol.metadata import ApiVersionsResponse

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from tests.integration.conftest import proxy_settings
from tests.integration.helpers import (
    API_VERSIONS_KEY,
    UNSUPPORTED_VERSION,
    KafkaSocket,
    PidgateProcess,
    advertised_versions,
    api_versions_request,
    correlation_id_of,
    create_topic,
    decode_produce,
    decode_response,
    encode_request,
    produce_partition_errors,
    produce_request,
    record_batch,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

MAX_FRAME_BYTES = 65_536
_SIZE = struct.Struct(">i")


@pytest.fixture(scope="module")
def gate(broker: EmbeddedBroker) -> Iterator[BackgroundProxy]:
    """One pidgate for every bad input of this module (the point: it survives them all)."""
    running = BackgroundProxy(
        proxy_settings(broker, proxy={"max_frame_bytes": MAX_FRAME_BYTES})
    ).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def topic(gate: BackgroundProxy) -> str:
    name = unique_name("bad-input")
    create_topic(gate.bootstrap, name)
    return name


class DeliveryTally:
    def __init__(self) -> None:
        self.delivered = 0
        self.errors: list[str] = []

    def __call__(self, error: Any, message: Any) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.errors.append(str(error))


def produce_and_confirm(producer: Producer, tally: DeliveryTally, topic: str, count: int) -> None:
    before = tally.delivered
    for i in range(count):
        producer.produce(topic, key=b"bystander", value=b"%d" % i)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} messages still queued after 30 s"
    assert tally.errors == []
    assert tally.delivered == before + count


@pytest.fixture(scope="module")
def bystander(gate: BackgroundProxy, topic: str) -> Iterator[tuple[Producer, DeliveryTally]]:
    """A real idempotent librdkafka producer, connected before any bad input arrives."""
    tally = DeliveryTally()
    producer = Producer(
        {
            "bootstrap.servers": gate.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "on_delivery": tally,
        }
    )
    produce_and_confirm(producer, tally, topic, 10)
    yield producer, tally
    producer.flush(10)


def request_header(api_key: int, api_version: int, correlation_id: int, flexible: bool) -> bytes:
    client_id = b"bad-input"
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id)) + client_id
    return header + (b"\x00" if flexible else b"")


def framed(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def oversized_frame() -> tuple[bytes, bool]:
    payload = request_header(API_VERSIONS_KEY, 3, 1, True) + b"\x00" * 16
    return _SIZE.pack(MAX_FRAME_BYTES + 1) + payload, False


def truncated_frame() -> tuple[bytes, bool]:
    whole = encode_request(api_versions_request(3), 3, 1)
    return whole[: len(whole) - 5], True  # then the client closes its side


def garbage(seed: int) -> Callable[[], tuple[bytes, bool]]:
    def build() -> tuple[bytes, bool]:
        rng = random.Random(seed)
        # A plausible size and api key bytes that name no Kafka API (>= 0x4000), then noise.
        payload = struct.pack(">h", rng.randrange(0x4000, 0x7FFF)) + rng.randbytes(46)
        return framed(payload), False

    return build


def produce_header_random_body() -> tuple[bytes, bool]:
    # A valid Produce v9 request header followed by noise: the Produce walk must refuse it.
    rng = random.Random(7)
    return framed(request_header(0, 9, 1, True) + rng.randbytes(64)), False


def unknown_api_key() -> tuple[bytes, bool]:
    return framed(request_header(9999, 0, 1, False) + b"\x00" * 8), False


def version_above_advertised() -> tuple[bytes, bool]:
    # Metadata is an api pidgate rewrites, so it only lets the versions it can parse through;
    # v99 is above any (APIs pidgate does not inspect are the broker's to judge).
    return framed(request_header(3, 99, 1, False) + b"\x00" * 8), False


def negative_size() -> tuple[bytes, bool]:
    return _SIZE.pack(-16) + request_header(API_VERSIONS_KEY, 0, 1, False) + b"\x00" * 12, False


def produce_records_cut_inside_batch_header() -> tuple[bytes, bool]:
    # A well-framed Produce whose records field holds only 30 bytes of a 61-byte batch header.
    batch = record_batch(count=1)
    request = produce_request(9, "bad-input-topic", batch[:30])
    return encode_request(request, 9, 1), False


def produce_frame_ends_inside_batch_header() -> tuple[bytes, bool]:
    # The frame's size says the request ends in the middle of the batch header, although the
    # records length inside says more bytes follow.
    batch = record_batch(count=1)
    whole = encode_request(produce_request(9, "bad-input-topic", batch), 9, 1)
    cut = whole[: len(whole) - len(batch) + 40]  # 40 bytes into the batch
    return _SIZE.pack(len(cut) - 4) + cut[4:], False


BAD_INPUTS: dict[str, Callable[[], tuple[bytes, bool]]] = {
    "oversized_frame": oversized_frame,
    "truncated_frame_then_close": truncated_frame,
    "garbage_1": garbage(1),
    "garbage_2": garbage(2),
    "garbage_3": garbage(3),
    "produce_header_random_body": produce_header_random_body,
    "unknown_api_key": unknown_api_key,
    "known_api_version_above_advertised": version_above_advertised,
    "negative_size_prefix": negative_size,
    "produce_records_cut_inside_batch_header": produce_records_cut_inside_batch_header,
    "produce_frame_ends_inside_batch_header": produce_frame_ends_inside_batch_header,
}


def api_versions_roundtrip(conn: KafkaSocket, correlation_id: int) -> None:
    conn.sendall(encode_request(api_versions_request(3), 3, correlation_id))
    payload = conn.recv_frame()
    assert correlation_id_of(payload) == correlation_id
    assert decode_response(ApiVersionsResponse, payload, 3).error_code == 0


def test_metadata_v99_is_above_what_pidgate_advertises(gate: BackgroundProxy) -> None:
    # The premise of the "version above advertised" case.
    assert advertised_versions(gate.bootstrap)[3][1] < 99


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(
    gate: BackgroundProxy,
    topic: str,
    bystander: tuple[Producer, DeliveryTally],
    case: str,
) -> None:
    producer, tally = bystander
    data, half_close = BAD_INPUTS[case]()
    with KafkaSocket(gate.bootstrap, timeout_s=20) as idle, KafkaSocket(gate.bootstrap) as bad:
        api_versions_roundtrip(idle, 1)  # the idle connection is up and proxied
        bad.sendall(data)
        if half_close:
            bad.sock.shutdown(socket.SHUT_WR)
        received = bad.expect_closed(timeout_s=15)
        assert received == b"", f"pidgate answered a bad request: {received[:80]!r}"

        # The connection opened before still works, and so does the producer.
        api_versions_roundtrip(idle, 2)
        produce_and_confirm(producer, tally, topic, 20)

    # And a fresh connection works too: the process is unaffected.
    with KafkaSocket(gate.bootstrap) as fresh:
        api_versions_roundtrip(fresh, 3)


def test_api_versions_newer_than_pidgate_gets_v0_unsupported_version(
    gate: BackgroundProxy,
) -> None:
    encoded = bytearray(encode_request(api_versions_request(3), 3, 77))
    struct.pack_into(">h", encoded, 6, 9)  # request_api_version := 9 (the body stays v3-shaped)
    with KafkaSocket(gate.bootstrap, timeout_s=20) as conn:
        conn.sendall(bytes(encoded))
        payload = conn.recv_frame()
        # Like a broker (KIP-511): a v0 response, whatever version was asked for.
        response = decode_response(ApiVersionsResponse, payload, 0)
        assert response.header.correlation_id == 77
        assert response.error_code == UNSUPPORTED_VERSION
        listed = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert listed.get(API_VERSIONS_KEY) == (0, 4)
        # The connection stays open, so the client retries with a version both sides speak.
        api_versions_roundtrip(conn, 78)


def test_unreachable_upstream_closes_the_client_and_pidgate_recovers() -> None:
    upstream_port = free_port()  # nothing listens here (yet)
    gate = PidgateProcess(f"127.0.0.1:{upstream_port}", free_port())
    try:
        gate.wait_listening()
        for correlation_id in (1, 2):
            with KafkaSocket(gate.bootstrap, timeout_s=20) as conn:
                conn.sendall(encode_request(api_versions_request(3), 3, correlation_id))
                assert conn.expect_closed(timeout_s=15) == b""
            assert gate.process.poll() is None, "pidgate died after an unreachable upstream"
        wait_until(
            lambda: any(e.get("event") == "upstream_unreachable" for e in gate.log_events()),
            10,
            "an upstream_unreachable log event",
        )
        unreachable = next(e for e in gate.log_events() if e["event"] == "upstream_unreachable")
        assert f"127.0.0.1:{upstream_port}" in str(unreachable.get("upstreams"))

        # The broker comes up on that port: the same pidgate process now serves clients.
        with EmbeddedBroker(port=upstream_port):
            with KafkaSocket(gate.bootstrap, timeout_s=20) as conn:
                api_versions_roundtrip(conn, 3)
            topic = unique_name("recovered")
            create_topic(gate.bootstrap, topic)
            with KafkaSocket(gate.bootstrap, timeout_s=20) as conn:
                conn.sendall(encode_request(produce_request(9, topic, record_batch(count=2)), 9, 4))
                payload = conn.recv_frame()
            assert correlation_id_of(payload) == 4
            assert produce_partition_errors(decode_produce(payload, 9)) == [0]
            assert gate.terminate() == 0
    finally:
        gate.close()


def test_many_bad_connections_in_a_row_leave_no_connection_behind(gate: BackgroundProxy) -> None:
    """Bounded storm of bad connections; pidgate's connection table drains back."""
    baseline = len(gate.server.context.connections)
    deadline = time.monotonic() + 20
    for i in range(30):
        assert time.monotonic() < deadline
        data, _ = garbage(100 + i)()
        with KafkaSocket(gate.bootstrap, timeout_s=10) as bad:
            bad.sendall(data)
            assert bad.expect_closed(timeout_s=10) == b""
    wait_until(
        lambda: len(gate.server.context.connections) <= baseline,
        10,
        "pidgate to forget the closed connections",
    )
