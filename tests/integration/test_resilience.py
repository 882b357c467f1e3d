"""The proxy's own failure paths: a failing observer, graceful shutdown with requests in
flight, a broker listener whose port is taken, an upstream address that cannot even be
resolved. Real broker, real sockets; the failing observer is the one fake (no real part raises
on demand)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from pidgate.config import load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.quota.manager import Decision
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    ConnectionClosed,
    KafkaSocket,
    correlation_id_of,
    create_topic,
    decode_produce,
    encode_request,
    init_producer_id,
    metadata_request,
    produce_partition_errors,
    produce_request,
    record_batch,
    unique_name,
)

pytestmark = pytest.mark.integration


class ExplodingObserver:
    """Stands in for a buggy metrics or event-log observer."""

    def __init__(self) -> None:
        self.calls = 0

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")


def test_a_failing_observer_never_changes_what_happens_to_the_request(
    broker: EmbeddedBroker,
) -> None:
    observer = ExplodingObserver()
    settings = proxy_settings(broker, quota=anonymous_quota(10, 3600))
    with BackgroundProxy(settings, observers=(observer,)) as proxy:
        topic = unique_name("observer")
        create_topic(proxy.bootstrap, topic)
        producer_id, epoch = init_producer_id(proxy.bootstrap)
        with KafkaSocket(proxy.bootstrap) as client:
            request = produce_request(9, topic, record_batch(producer_id, epoch, 0))
            client.sendall(encode_request(request, 9, correlation_id=1))
            assert produce_partition_errors(decode_produce(client.recv_frame(), 9)) == [0]
            client.sendall(encode_request(metadata_request([topic]), 1, correlation_id=2))
            assert correlation_id_of(client.recv_frame()) == 2  # the connection is intact
        assert observer.calls == 1
        assert proxy.server.context.gatekeeper.observer_errors == 1


def test_shutdown_answers_every_request_already_read(broker: EmbeddedBroker) -> None:
    settings = proxy_settings(broker, proxy={"shutdown_grace_ms": 5000})
    proxy = BackgroundProxy(settings).start()
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as client:
        client.sendall(encode_request(metadata_request(None), 1, correlation_id=0))
        assert correlation_id_of(client.recv_frame()) == 0
        pipelined = b"".join(
            encode_request(metadata_request(None), 1, correlation_id)
            for correlation_id in (1, 2, 3, 4)
        )
        client.sendall(pipelined)
        stopper = threading.Thread(target=proxy.stop)
        stopper.start()
        received = []
        try:
            while True:
                received.append(correlation_id_of(client.recv_frame()))
        except ConnectionClosed:
            pass
        stopper.join(30)
    # Everything read before the stop is answered, in order, then the connection closes.
    assert received == [1, 2, 3, 4]


def test_a_broker_listener_whose_port_is_taken_is_retried_once_free(
    broker: EmbeddedBroker,
) -> None:
    broker_port = free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", broker_port))
    squatter.listen()
    settings = proxy_settings(broker, proxy={"broker_ports": {TANSU_NODE_ID: broker_port}})
    with BackgroundProxy(settings) as proxy:
        with KafkaSocket(proxy.bootstrap) as client:
            client.sendall(encode_request(metadata_request(None), 1, correlation_id=1))
            client.recv_frame()
        assert proxy.server.broker_listener_ports == {}  # the bind failed
        squatter.close()
        with KafkaSocket(proxy.bootstrap) as client:
            client.sendall(encode_request(metadata_request(None), 1, correlation_id=2))
            client.recv_frame()
        assert proxy.server.broker_listener_ports == {TANSU_NODE_ID: broker_port}
        with KafkaSocket(("127.0.0.1", broker_port)) as client:  # and it forwards
            client.sendall(encode_request(metadata_request(None), 1, correlation_id=3))
            assert correlation_id_of(client.recv_frame()) == 3


def test_an_upstream_name_that_cannot_resolve_closes_the_client_cleanly() -> None:
    bad_host = "x" * 70 + ".invalid"  # a label over 63 characters: idna raises UnicodeError
    settings = load_settings(
        cli_overrides={
            "proxy": {"upstream": [f"{bad_host}:9092"], "listen": f"127.0.0.1:{free_port()}"},
            "admin": {"listen": f"127.0.0.1:{free_port()}"},
            "logging": {"format": "json"},
        }
    )
    with BackgroundProxy(settings) as proxy:
        with KafkaSocket(proxy.bootstrap) as client:
            client.sendall(encode_request(metadata_request(None), 1, correlation_id=1))
            assert client.expect_closed(timeout_s=15) == b""
        deadline = time.monotonic() + 5
        while proxy.server.context.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proxy.server.context.connections  # nothing leaked
