"""Kafka 4 clients through pidgate: api keys pidgate does not inspect keep the broker's own
version ranges (ConsumerGroupHeartbeat of KIP-848, the telemetry APIs of KIP-714, ...), Fetch
keeps v16+ with its node_endpoints (KIP-951) rewritten, and the share-group APIs (KIP-932), whose
endpoints pidgate cannot rewrite without schemas, are not advertised."""

from __future__ import annotations

import struct
import uuid

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import ApiVersionsResponse

from pidgate.protocol.api_versions import (
    INSPECTED_APIS,
    NOT_FORWARDED_APIS,
    forwarded_untouched,
    inspected_api_version_limits,
    narrow_api_versions_response,
)
from pidgate.protocol.endpoints import BrokerEndpoint, endpoints_in_response, rewrite_endpoints
from pidgate.protocol.errors import UnsupportedApiError
from pidgate.protocol.headers import parse_response_header, peek_request_header

CONSUMER_GROUP_HEARTBEAT = 68
GET_TELEMETRY_SUBSCRIPTIONS = 71
PUSH_TELEMETRY = 72
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79

#: What an Apache Kafka 4.x broker advertises for some keys (ranges as in its ApiVersions).
KAFKA4 = {
    0: (3, 12),
    1: (4, 17),
    3: (0, 13),
    18: (0, 4),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    GET_TELEMETRY_SUBSCRIPTIONS: (0, 0),
    PUSH_TELEMETRY: (0, 0),
    SHARE_FETCH: (1, 1),
    SHARE_ACKNOWLEDGE: (1, 1),
    80: (0, 0),  # a key newer than any schema pidgate has
}


def advertised(version: int = 3) -> dict[int, tuple[int, int]]:
    keys = [(k, lo, hi) for k, (lo, hi) in KAFKA4.items()]
    body = ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0).encode(
        version=version
    )
    narrowed = narrow_api_versions_response(
        body, version, inspected_api_version_limits(), drop=NOT_FORWARDED_APIS
    )
    answer = ApiVersionsResponse.decode(narrowed, version=version)
    return {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}


@pytest.mark.parametrize("version", [0, 3])
def test_keys_pidgate_does_not_inspect_keep_the_brokers_ranges(version: int) -> None:
    ranges = advertised(version)
    for key in (CONSUMER_GROUP_HEARTBEAT, GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY, 80):
        assert ranges[key] == KAFKA4[key]
    assert ranges[1] == (4, 17)  # Fetch v16+ stays: its node_endpoints are rewritten
    assert ranges[0] == (3, 12)
    assert SHARE_FETCH not in ranges and SHARE_ACKNOWLEDGE not in ranges


def test_requests_are_forwarded_untouched_unless_inspected() -> None:
    limits = inspected_api_version_limits()
    assert set(limits) == INSPECTED_APIS
    for key in (CONSUMER_GROUP_HEARTBEAT, PUSH_TELEMETRY, 80, 9999, 2, 8, 9):
        assert forwarded_untouched(key, limits)
    for key in INSPECTED_APIS:
        assert not forwarded_untouched(key, limits)
    with pytest.raises(UnsupportedApiError, match="not one pidgate forwards"):
        forwarded_untouched(SHARE_FETCH, limits)


def test_the_correlation_id_sits_at_a_fixed_offset_whatever_the_api() -> None:
    # A ConsumerGroupHeartbeat v1 header (v2, flexible) and a header of an api no schema knows.
    for api_key, version in ((CONSUMER_GROUP_HEARTBEAT, 1), (80, 0)):
        payload = struct.pack(">hhih", api_key, version, 4242, 3) + b"abc\x00" + b"body"
        assert peek_request_header(payload) == (api_key, version, 4242)
        # Its response: the correlation id, and no claim about the (unknown) header layout.
        assert (
            parse_response_header(struct.pack(">i", 4242) + b"\x00rest", api_key, version)[0]
            == 4242
        )


def fetch_response(version: int, endpoints: list[tuple[int, str, int]]) -> bytes:
    R = FetchResponse
    P = R.FetchableTopicResponse.PartitionData
    partition = P(
        partition_index=0,
        error_code=6,  # NOT_LEADER_OR_FOLLOWER: the case KIP-951 sends endpoints for
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        aborted_transactions=[P.AbortedTransaction(producer_id=5, first_offset=1)],
        preferred_read_replica=-1,
        records=b"\x00" * 300,
        current_leader=P.LeaderIdAndEpoch(leader_id=7, leader_epoch=3),
    )
    other = P(
        partition_index=1, error_code=0, high_watermark=10, last_stable_offset=10,
        log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1, records=None,
    )  # fmt: skip
    response = R(
        throttle_time_ms=0,
        error_code=0,
        session_id=9,
        responses=[
            R.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=[partition, other]),
            R.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=[]),
        ],
        node_endpoints=[
            R.NodeEndpoint(node_id=n, host=h, port=p, rack="r1") for n, h, p in endpoints
        ],
    )
    return bytes(response.encode(version=version))


def to_proxy(endpoint: BrokerEndpoint) -> tuple[str, int]:
    return "pidgate.local", 30000 + endpoint.node_id


@pytest.mark.parametrize("version", [16, 17, 18])
def test_fetch_node_endpoints_are_rewritten_records_untouched(version: int) -> None:
    body = fetch_response(version, [(7, "broker-7.internal", 9092), (8, "broker-8", 9093)])
    assert endpoints_in_response(1, version, body) == (
        BrokerEndpoint(7, "broker-7.internal", 9092),
        BrokerEndpoint(8, "broker-8", 9093),
    )
    rewritten = rewrite_endpoints(1, version, body, to_proxy)
    assert rewritten is not None
    decoded = FetchResponse.decode(rewritten, version=version)
    assert [(e.node_id, e.host, e.port, e.rack) for e in decoded.node_endpoints] == [
        (7, "pidgate.local", 30007, "r1"),
        (8, "pidgate.local", 30008, "r1"),
    ]
    original = FetchResponse.decode(body, version=version)
    assert decoded.responses == original.responses  # every partition and record byte kept
    assert decoded.session_id == 9


def test_fetch_without_endpoints_is_not_copied() -> None:
    assert rewrite_endpoints(1, 17, fetch_response(17, []), to_proxy) is None
    assert rewrite_endpoints(1, 15, b"anything: v15 has no node_endpoints", to_proxy) is None
    with pytest.raises(UnsupportedApiError):
        rewrite_endpoints(1, 19, fetch_response(18, [(1, "h", 1)]), to_proxy)
