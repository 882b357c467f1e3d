"""Holding a throttled Produce until its tokens come (issue "patience",
proxy/quota_control/waiting_room.py),
over real sockets against tansu: released when the bucket refills or the quota is raised,
answered with the honest remaining wait before the client's own request timeout, never
forwarded once its client is gone, bounded, and nothing on its connection overtakes it."""

from __future__ import annotations

import socket
import time
from typing import Any

from kafka import KafkaConsumer

from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    KafkaSocket,
    correlation_id_of,
    create_topic,
    decode_produce,
    encode_request,
    init_producer_id,
    metadata_request,
    produce_frame,
    produce_partition_errors,
    unique_name,
    wait_until,
)

NOT_ENOUGH_REPLICAS = 19


def hold_stats(proxy: BackgroundProxy) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        room = proxy.server.context.waiting_room
        assert room is not None
        return {
            "held": room.held_requests,
            "held_bytes": room.held_bytes,
            "refused": room.stats.refused,
            **room.stats.outcomes,
        }

    return proxy.call_and_wait(read)


def spend_the_only_token(proxy: BackgroundProxy, topic: str) -> None:
    """The first new PID takes the bucket's one token."""
    first, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(produce_frame(topic, first, 1))
        assert produce_partition_errors(decode_produce(conn.recv_frame(), 8)) == [0]


def test_a_held_produce_is_forwarded_when_its_token_comes(start_proxy) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 3))  # one new PID per 3 s
    topic = unique_name("hold-refill")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    second, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as conn:
        started = time.monotonic()
        conn.sendall(produce_frame(topic, second, 7))
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "held: 1")
        response = decode_produce(conn.recv_frame(), 8)
        waited_s = time.monotonic() - started
    # Answered by the broker once the token came: no error, no throttle, no retry spent.
    assert produce_partition_errors(response) == [0]
    assert response.throttle_time_ms == 0
    assert 0.5 < waited_s < 6.0
    stats = hold_stats(proxy)
    assert stats["released"] == 1 and stats["expired"] == 0 and stats["held"] == 0
    assert stats["held_bytes"] == 0


def test_a_raised_quota_releases_every_held_produce_within_a_second(
    start_proxy, broker: EmbeddedBroker
) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 3600))
    topic = unique_name("hold-raise")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    waiting = [KafkaSocket(proxy.bootstrap, timeout_s=15) for _ in range(3)]
    try:
        for n, conn in enumerate(waiting):
            pid, _ = init_producer_id(proxy.bootstrap)
            conn.sendall(produce_frame(topic, pid, 100 + n))
        wait_until(lambda: hold_stats(proxy)["held"] == 3, 5, "held: 3")
        time.sleep(1.0)  # held, not answered: a rejection would be readable by now
        for conn in waiting:
            conn.sock.settimeout(0.05)
            try:
                conn.sock.recv(1, socket.MSG_PEEK)
                raise AssertionError("a held Produce was answered before the quota changed")
            except TimeoutError:
                pass
            conn.sock.settimeout(15)
        raised = proxy_settings(broker, quota=anonymous_quota(100, 3600))
        raised_at = time.monotonic()
        proxy.call_and_wait(lambda: proxy.server.reload(raised))  # what SIGHUP does
        answers = [decode_produce(conn.recv_frame(), 8) for conn in waiting]
        relieved_s = time.monotonic() - raised_at
    finally:
        for conn in waiting:
            conn.close()
    assert [produce_partition_errors(a) for a in answers] == [[0], [0], [0]]
    assert relieved_s < 1.0
    assert hold_stats(proxy)["released"] == 3


def test_a_hold_ends_inside_the_clients_request_timeout_with_the_honest_wait(
    start_proxy,
) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 60))  # the next token in ~60 s
    topic = unique_name("hold-expire")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    second, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as conn:
        started = time.monotonic()
        # A client with request.timeout.ms = 1500 (the Java console producer's default)
        conn.sendall(produce_frame(topic, second, 9, timeout_ms=1500))
        response = decode_produce(conn.recv_frame(), 8)
        answered_s = time.monotonic() - started
    # Held for 2/3 of its timeout, then told the truth: the token is ~59 s away. A client
    # that honours throttle_time_ms (Java, KIP-219) spends one retry on the whole wait.
    assert 0.9 < answered_s < 1.5
    assert produce_partition_errors(response) == [NOT_ENOUGH_REPLICAS]
    assert 55_000 < response.throttle_time_ms <= 60_000
    assert hold_stats(proxy)["expired"] == 1


def test_the_wait_told_counts_the_requests_held_ahead(start_proxy) -> None:
    """Two waiting for a token each: the one whose hold ends first is told when the second
    token comes, not the first (which the request ahead of it will take)."""
    proxy = start_proxy(quota=anonymous_quota(1, 10))  # one token per 10 s
    topic = unique_name("hold-ahead")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    with (
        KafkaSocket(proxy.bootstrap, timeout_s=15) as ahead,
        KafkaSocket(proxy.bootstrap, timeout_s=15) as behind,
    ):
        first, _ = init_producer_id(proxy.bootstrap)
        ahead.sendall(produce_frame(topic, first, 1, timeout_ms=30_000))
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "the first held")
        second, _ = init_producer_id(proxy.bootstrap)
        behind.sendall(produce_frame(topic, second, 2, timeout_ms=1500))
        answer = decode_produce(behind.recv_frame(), 8)
    assert produce_partition_errors(answer) == [NOT_ENOUGH_REPLICAS]
    # Two tokens away (~20 s from the spend), less the ~1-2 s already gone.
    assert 15_000 < answer.throttle_time_ms <= 20_000


def test_a_produce_held_for_a_client_that_went_away_is_never_forwarded(
    start_proxy, broker: EmbeddedBroker
) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 3600))
    topic = unique_name("hold-gone")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    second, _ = init_producer_id(proxy.bootstrap)
    conn = KafkaSocket(proxy.bootstrap)
    conn.sendall(produce_frame(topic, second, 11))
    wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "held: 1")
    conn.close()
    wait_until(lambda: hold_stats(proxy)["dropped"] == 1, 5, "dropped: 1")
    # Tokens galore now: a request still held would be forwarded by this.
    raised = proxy_settings(broker, quota=anonymous_quota(100, 3600))
    proxy.call_and_wait(lambda: proxy.server.reload(raised))
    time.sleep(0.5)
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        values = [record.value for record in consumer]
    finally:
        consumer.close()
    assert values == [b"v0"]  # the first producer's record only
    stats = hold_stats(proxy)
    assert stats == {**stats, "held": 0, "held_bytes": 0, "released": 0, "dropped": 1}


def test_past_its_bounds_a_throttled_produce_is_answered_at_once(start_proxy) -> None:
    proxy = start_proxy(
        quota=anonymous_quota(1, 3600),
        rejection={"max_held_requests": 1, "max_throttle_time_ms": 500},
    )
    topic = unique_name("hold-full")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    with (
        KafkaSocket(proxy.bootstrap, timeout_s=15) as held,
        KafkaSocket(proxy.bootstrap, timeout_s=15) as refused,
    ):
        pid, _ = init_producer_id(proxy.bootstrap)
        held.sendall(produce_frame(topic, pid, 1))
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "held: 1")
        other, _ = init_producer_id(proxy.bootstrap)
        started = time.monotonic()
        refused.sendall(produce_frame(topic, other, 2))
        answer = decode_produce(refused.recv_frame(), 8)
        assert time.monotonic() - started < 1.0
    assert produce_partition_errors(answer) == [NOT_ENOUGH_REPLICAS]
    assert answer.throttle_time_ms == 500  # the unheld rejection's cap, as before holding
    assert hold_stats(proxy)["refused"] == 1


def test_nothing_on_its_connection_overtakes_a_held_produce(
    start_proxy, broker: EmbeddedBroker
) -> None:
    proxy = start_proxy(quota=anonymous_quota(1, 3600))
    topic = unique_name("hold-order")
    create_topic(proxy.bootstrap, topic)
    spend_the_only_token(proxy, topic)
    pid, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as conn:
        conn.sendall(
            produce_frame(topic, pid, 21) + encode_request(metadata_request([topic]), 1, 22)
        )
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "held: 1")
        raised = proxy_settings(broker, quota=anonymous_quota(100, 3600))
        proxy.call_and_wait(lambda: proxy.server.reload(raised))
        first, second = conn.recv_frame(), conn.recv_frame()
    assert [correlation_id_of(first), correlation_id_of(second)] == [21, 22]
    assert produce_partition_errors(decode_produce(first, 8)) == [0]
