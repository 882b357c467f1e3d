"""Connection limits and the idle timeout, through a real pidgate in front of a real tansu.

Every test client connects from 127.0.0.1, so the total and the per-IP limit would look alike:
each test sets one of them small and the other large, and checks which one was counted
(``pidgate_protocol_errors{kind=...}``). Over a limit, the new connection is closed at once
(before anything is read or forwarded) while the connections already open keep being answered;
closing one frees its slot. A connection quiet for ``idle_timeout_ms`` with nothing owed is
closed (also one that sent half a frame and stalled); one that keeps talking is not.

Also the quota failure policy end to end (fault injection: the running quota manager's ``admit``
is replaced by one that raises; no real part raises on demand). Max frame size is covered by
test_bad_input.py (oversized frame), max in-flight by test_pipelining.py (client that never
reads).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsResponse

from pidgate.proxy.background import BackgroundProxy
from pidgate.quota.manager import Decision
from tests.integration.conftest import anonymous_quota
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    KafkaSocket,
    api_versions_request,
    create_topic,
    decode_produce,
    decode_response,
    encode_request,
    init_producer_id,
    produce_frame,
    produce_partition_errors,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

StartProxy = Callable[..., BackgroundProxy]


def round_trip(conn: KafkaSocket, correlation_id: int) -> None:
    """One ApiVersions request answered on ``conn`` (the connection is open and served)."""
    conn.sendall(encode_request(api_versions_request(3), 3, correlation_id))
    response = decode_response(ApiVersionsResponse, conn.recv_frame(), 3)
    assert response.error_code == 0


def protocol_errors(gate: BackgroundProxy, kind: str) -> int:
    return gate.server.metrics._protocol_errors.get(kind, 0)


def open_served(gate: BackgroundProxy, count: int) -> list[KafkaSocket]:
    conns = []
    for i in range(count):
        conn = KafkaSocket(gate.bootstrap, timeout_s=5.0)
        round_trip(conn, i)  # counted by pidgate before the next one opens
        conns.append(conn)
    return conns


def check_limit(gate: BackgroundProxy, limit: int, kind: str, other_kind: str) -> None:
    conns = open_served(gate, limit)
    try:
        for attempt in range(3):  # each one beyond the limit is closed at once, unanswered
            with KafkaSocket(gate.bootstrap, timeout_s=5.0) as extra:
                started = time.monotonic()
                extra.sendall(encode_request(api_versions_request(3), 3, 100 + attempt))
                assert extra.expect_closed(timeout_s=5.0) == b""
                assert time.monotonic() - started < 2.0
        wait_until(lambda: protocol_errors(gate, kind) == 3, 5.0, f"3 counted as {kind}")
        assert protocol_errors(gate, other_kind) == 0
        for conn in conns:  # the connections within the limit keep working
            round_trip(conn, 200)
        assert gate.server.connection_limits.total == limit
        conns.pop().close()  # a closed one frees its slot
        wait_until(lambda: gate.server.connection_limits.total == limit - 1, 5.0, "slot released")
        conns.extend(open_served(gate, 1))
    finally:
        for conn in conns:
            conn.close()
    wait_until(lambda: gate.server.connection_limits.total == 0, 5.0, "every slot released")


def test_per_ip_limit_closes_connections_beyond_it(start_proxy: StartProxy) -> None:
    gate = start_proxy(proxy={"max_connections": 1000, "max_connections_per_ip": 3})
    check_limit(gate, 3, "connection_limit_per_ip", "connection_limit")


def test_total_limit_closes_connections_beyond_it(start_proxy: StartProxy) -> None:
    gate = start_proxy(proxy={"max_connections": 3, "max_connections_per_ip": 1000})
    check_limit(gate, 3, "connection_limit", "connection_limit_per_ip")


def test_idle_connections_are_closed_busy_ones_are_not(start_proxy: StartProxy) -> None:
    idle_ms = 600
    gate = start_proxy(proxy={"idle_timeout_ms": idle_ms})
    with (
        KafkaSocket(gate.bootstrap) as idle,
        KafkaSocket(gate.bootstrap) as half_frame,
        KafkaSocket(gate.bootstrap) as busy,
    ):
        round_trip(idle, 1)  # answered, then silent: nothing owed
        half_frame.sendall(b"\x00\x00\x01\x00\x00")  # 256 bytes announced, 1 sent, then stall
        started = time.monotonic()
        deadline = started + 3 * idle_ms / 1000
        correlation_id = 2
        while time.monotonic() < deadline:  # bounded: ~1.8 s of requests every 150 ms
            round_trip(busy, correlation_id)
            correlation_id += 1
            time.sleep(0.15)
        assert idle.expect_closed(timeout_s=1.0) == b""
        assert half_frame.expect_closed(timeout_s=1.0) == b""
        round_trip(busy, correlation_id)  # still open after 3 idle timeouts of activity


def test_idle_timeout_zero_never_closes(start_proxy: StartProxy) -> None:
    gate = start_proxy(proxy={"idle_timeout_ms": 0})
    with KafkaSocket(gate.bootstrap) as conn:
        round_trip(conn, 1)
        time.sleep(0.5)
        round_trip(conn, 2)


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_quota_failure_policy_end_to_end(start_proxy: StartProxy, policy: str) -> None:
    gate = start_proxy(
        quota=anonymous_quota(producer_ids_rate=100, window_seconds=60),
        proxy={"quota_failure_policy": policy, "quota_failure_throttle_ms": 1500},
        rejection={"max_throttle_time_ms": 5000},  # above the failure throttle: sent as is
    )
    topic = unique_name("fail-policy")
    create_topic(gate.bootstrap, topic)
    producer_id, _ = init_producer_id(gate.bootstrap)
    quota = gate.server.context.gatekeeper.quota

    def admit(principal: str, producer_ids: Collection[int], now_ms: int) -> Decision:
        raise RuntimeError("injected quota failure")  # fault injection

    gate.call(setattr, quota, "admit", admit)
    wait_until(lambda: quota.admit is admit, 5.0, "fault injected")
    with KafkaSocket(gate.bootstrap) as conn:
        conn.sendall(produce_frame(topic, producer_id, correlation_id=7))
        response: Any = decode_produce(conn.recv_frame(), 8)
        round_trip(conn, 8)  # the connection survives the failure either way
    errors = produce_partition_errors(response)
    if policy == "open":
        assert errors == [0]
        assert response.throttle_time_ms == 0
    else:
        assert errors == [REJECTED_DEFAULT]
        assert response.throttle_time_ms == 1500
    assert protocol_errors(gate, "quota_failure") == 1
