"""Kafka 4 APIs through a real pidgate: forwarded untouched in the broker's own versions, Fetch
v16+ node_endpoints rewritten to pidgate's listeners, share-group APIs withheld.

tansu advertises none of these APIs (no KIP-848 ConsumerGroupHeartbeat, no KIP-714 telemetry,
Fetch below v16), so the broker here is a small scripted peer that answers ApiVersions with a
Kafka 4.x-like range table, echoes canned bodies for the APIs pidgate must not look into, and
answers Fetch v17 with a NOT_LEADER_OR_FOLLOWER partition plus node_endpoints (KIP-951). It
records every request payload it receives, so the test can compare bytes end to end. librdkafka's
telemetry and ``group.protocol=consumer`` are not exercised: no broker here implements them.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import uuid
from collections.abc import Iterator

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.metadata import ApiVersionsResponse

from pidgate.config import load_settings
from pidgate.demo.broker import free_port
from pidgate.proxy.background import BackgroundProxy
from tests.integration.helpers import (
    ConnectionClosed,
    KafkaSocket,
    advertised_versions,
    encode_request,
)

pytestmark = pytest.mark.integration

_SIZE = struct.Struct(">i")
NODE_ID = 7
CONSUMER_GROUP_HEARTBEAT = 68
PUSH_TELEMETRY = 72
SHARE_FETCH = 78
RANGES = {
    0: (3, 12),
    1: (4, 17),
    3: (0, 12),
    18: (0, 4),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    71: (0, 0),
    PUSH_TELEMETRY: (0, 0),
    SHARE_FETCH: (1, 1),
    79: (1, 1),
}
#: A canned response body per api key the peer answers without parsing (any bytes will do: the
#: point is that pidgate passes them through unchanged).
CANNED = {CONSUMER_GROUP_HEARTBEAT: b"\x00" * 7 + b"heartbeat-body", PUSH_TELEMETRY: b"telemetry"}


class Kafka4Peer:
    """One thread per connection on 127.0.0.1, every socket with a timeout; stop() joins all."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.received: list[tuple[int, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Kafka4Peer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self.server.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buffer = b""
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                while len(buffer) >= 4 and len(buffer) >= 4 + _SIZE.unpack_from(buffer)[0]:
                    size = _SIZE.unpack_from(buffer)[0]
                    payload, buffer = buffer[4 : 4 + size], buffer[4 + size :]
                    conn.sendall(self._answer(payload))

    def _answer(self, payload: bytes) -> bytes:
        api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
        with self._lock:
            self.received.append((api_key, payload))
        if api_key == 18:
            keys = [(k, lo, hi) for k, (lo, hi) in RANGES.items()]
            body = ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0).encode(
                version=min(version, 3)
            )
            header = struct.pack(">i", correlation_id)  # ApiVersions: header v0 always
        elif api_key == 1:
            body = fetch_body(version, self.port)
            header = struct.pack(">i", correlation_id) + b"\x00"
        else:
            body = CANNED.get(api_key, b"")
            header = struct.pack(">i", correlation_id) + b"\x00"
        return _SIZE.pack(len(header) + len(body)) + header + bytes(body)


def fetch_body(version: int, port: int) -> bytes:
    R = FetchResponse
    P = R.FetchableTopicResponse.PartitionData
    partition = P(
        partition_index=0, error_code=6, high_watermark=-1, last_stable_offset=-1,
        log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1,
        records=b"records-bytes",
        current_leader=P.LeaderIdAndEpoch(leader_id=NODE_ID, leader_epoch=2),
    )  # fmt: skip
    response = R(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[R.FetchableTopicResponse(topic_id=uuid.UUID(int=1), partitions=[partition])],
        node_endpoints=[R.NodeEndpoint(node_id=NODE_ID, host="127.0.0.1", port=port, rack=None)],
    )
    return bytes(response.encode(version=version))


@pytest.fixture
def gate() -> Iterator[tuple[BackgroundProxy, Kafka4Peer, int]]:
    with Kafka4Peer() as peer:
        broker_port = free_port()
        settings = load_settings(
            cli_overrides={
                "proxy": {
                    "upstream": [peer.bootstrap],
                    "listen": f"127.0.0.1:{free_port()}",
                    "broker_ports": {NODE_ID: broker_port},
                },
                "admin": {"enabled": False},
                "logging": {"format": "json"},
            }
        )
        with BackgroundProxy(settings) as proxy:
            yield proxy, peer, broker_port


def raw_request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    # Header v2 (flexible): api_key, version, correlation_id, client_id, no tagged fields.
    payload = struct.pack(">hhih", api_key, version, correlation_id, 2) + b"k4" + b"\x00" + body
    return _SIZE.pack(len(payload)) + payload


def test_kafka4_apis_are_advertised_as_the_broker_does(
    gate: tuple[BackgroundProxy, Kafka4Peer, int],
) -> None:
    proxy, _, _ = gate
    versions = advertised_versions(proxy.bootstrap)
    assert versions[CONSUMER_GROUP_HEARTBEAT] == (0, 1)  # KIP-848
    assert versions[71] == (0, 0) and versions[PUSH_TELEMETRY] == (0, 0)  # KIP-714
    assert versions[1] == (4, 17)  # Fetch v16+ kept
    assert SHARE_FETCH not in versions and 79 not in versions  # endpoints pidgate cannot rewrite


@pytest.mark.parametrize("api_key", [CONSUMER_GROUP_HEARTBEAT, PUSH_TELEMETRY])
def test_uninspected_requests_and_responses_pass_byte_for_byte(
    gate: tuple[BackgroundProxy, Kafka4Peer, int], api_key: int
) -> None:
    proxy, peer, _ = gate
    body = b"\x05group\x00\x00\x00\x01" + bytes(range(40))  # whatever the client sends
    request = raw_request(api_key, RANGES[api_key][1], 31, body)
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(request)
        response = conn.recv_frame()
    assert response == struct.pack(">i", 31) + b"\x00" + CANNED[api_key]
    assert (api_key, request[4:]) in peer.received


def test_fetch_v17_node_endpoints_point_at_pidgate(
    gate: tuple[BackgroundProxy, Kafka4Peer, int],
) -> None:
    proxy, _, broker_port = gate

    request = FetchRequest(max_wait_ms=10, min_bytes=1, topics=[])
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(encode_request(request, 17, 5))
        payload = conn.recv_frame()
    answer = FetchResponse.decode(payload[5:], version=17)  # correlation id + tagged fields
    ((endpoint,),) = [answer.node_endpoints]
    assert (endpoint.node_id, endpoint.host, endpoint.port) == (NODE_ID, "127.0.0.1", broker_port)
    assert answer.responses[0].partitions[0].records == b"records-bytes"
    # ... and pidgate opened that listener, in front of the broker the endpoint named.
    with KafkaSocket(("127.0.0.1", broker_port)) as conn:
        conn.sendall(raw_request(CONSUMER_GROUP_HEARTBEAT, 1, 6, b""))
        assert conn.recv_frame() == struct.pack(">i", 6) + b"\x00" + CANNED[68]


def test_share_fetch_is_refused(gate: tuple[BackgroundProxy, Kafka4Peer, int]) -> None:
    proxy, peer, _ = gate
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(raw_request(SHARE_FETCH, 1, 9, b"\x00" * 20))
        with contextlib.suppress(ConnectionClosed):
            assert conn.expect_closed(timeout_s=10) == b""
    assert all(api_key != SHARE_FETCH for api_key, _ in peer.received)
