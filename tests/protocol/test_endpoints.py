"""Tests for pidgate.protocol.endpoints: build with kafka-python, rewrite, decode, compare."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin.cluster import DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer.produce import ProduceResponse

from pidgate.protocol.endpoints import (
    ENDPOINT_BEARING_APIS,
    BrokerEndpoint,
    endpoints_in_response,
    pure_produce_response_passes_unchanged,
    rewrite_endpoints,
)
from pidgate.protocol.errors import ProtocolError, UnsupportedApiError
from pidgate.protocol.headers import parse_response_header

from ..compiled_modules import import_compiled

BROKERS = [(1, "broker-1.internal", 9092, "rack-a"), (2, "broker-2.internal", 9093, None)]


def to_proxy(ep: BrokerEndpoint) -> tuple[str, int]:
    return "pidgate.local", 19000 + ep.node_id


def metadata(version: int) -> bytes:
    M = MetadataResponse
    resp = M(
        version=version,
        throttle_time_ms=0,
        brokers=[
            M.MetadataResponseBroker(node_id=n, host=h, port=p, rack=r) for n, h, p, r in BROKERS
        ],
        cluster_id="c1",
        controller_id=1,
        topics=[],
    )
    return bytes(resp.encode(version=version))


def find_coordinator(version: int) -> bytes:
    F = FindCoordinatorResponse
    if version < 4:
        resp = F(version=version, error_code=0, node_id=2, host="broker-2.internal", port=9093)
    else:
        resp = F(
            version=version,
            coordinators=[
                F.Coordinator(
                    key="g1", node_id=1, host="broker-1.internal", port=9092, error_code=0
                ),
                F.Coordinator(key="g2", node_id=-1, host="", port=-1, error_code=15),
                F.Coordinator(
                    key="g3", node_id=2, host="broker-2.internal", port=9093, error_code=0
                ),
            ],
        )
    return bytes(resp.encode(version=version))


def describe_cluster(version: int) -> bytes:
    D = DescribeClusterResponse
    resp = D(
        version=version,
        cluster_id="c1",
        controller_id=1,
        brokers=[
            D.DescribeClusterBroker(broker_id=n, host=h, port=p, rack=r) for n, h, p, r in BROKERS
        ],
    )
    return bytes(resp.encode(version=version))


def produce(version: int, with_endpoints: bool) -> bytes:
    R = ProduceResponse
    T = R.TopicProduceResponse
    P = T.PartitionProduceResponse
    part: dict[str, Any] = {"index": 0, "error_code": 6, "base_offset": -1}
    if version >= 10 and with_endpoints:
        part["current_leader"] = P.LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
    topic: dict[str, Any] = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"name": "orders"}
    kwargs: dict[str, Any] = {}
    if version >= 10 and with_endpoints:
        kwargs["node_endpoints"] = [
            R.NodeEndpoint(node_id=n, host=h, port=p, rack=r) for n, h, p, r in BROKERS
        ]
    resp = R(
        version=version,
        responses=[
            T(
                **topic,
                partition_responses=[
                    P(**part),
                    P(
                        index=1,
                        error_code=0,
                        base_offset=5,
                        record_errors=[
                            T.PartitionProduceResponse.BatchIndexAndErrorMessage(
                                batch_index=0, batch_index_error_message="x"
                            )
                        ]
                        if version >= 8
                        else [],
                    ),
                ],
            )
        ],
        throttle_time_ms=4,
        **kwargs,
    )
    return bytes(resp.encode(version=version))


CASES = (
    [(3, v, metadata) for v in range(0, 14)]
    + [(10, v, find_coordinator) for v in range(0, 7)]
    + [(60, v, describe_cluster) for v in range(0, 3)]
)
CLASSES: dict[int, Any] = {
    3: MetadataResponse,
    10: FindCoordinatorResponse,
    60: DescribeClusterResponse,
}


def endpoints_of(api_key: int, version: int, msg: Any) -> list[tuple[int, str, int]]:
    if api_key == 3:
        return [(b.node_id, b.host, b.port) for b in msg.brokers]
    if api_key == 60:
        return [(b.broker_id, b.host, b.port) for b in msg.brokers]
    if version < 4:
        return [(msg.node_id, msg.host, msg.port)]
    return [(c.node_id, c.host, c.port) for c in msg.coordinators]


@pytest.mark.parametrize(("api_key", "version", "build"), CASES)
def test_rewrite_every_version(api_key: int, version: int, build: Any) -> None:
    body = build(version)
    found = endpoints_in_response(api_key, version, body)
    assert found and all(ep.host.startswith("broker-") for ep in found)
    new = rewrite_endpoints(api_key, version, body, to_proxy)
    assert new is not None
    before = CLASSES[api_key].decode(body, version=version)
    after = CLASSES[api_key].decode(new, version=version)
    expected = [
        (n, "pidgate.local", 19000 + n) if n >= 0 and h else (n, h, p)
        for n, h, p in endpoints_of(api_key, version, before)
    ]
    assert endpoints_of(api_key, version, after) == expected
    # Everything else is untouched: restoring the endpoints gives the original bytes back.
    restore = {ep.node_id: (ep.host, ep.port) for ep in found}
    back = rewrite_endpoints(api_key, version, new, lambda ep: restore[ep.node_id])
    assert back == body
    # Identity rewrite -> None (forward the original bytes).
    assert rewrite_endpoints(api_key, version, body, lambda ep: (ep.host, ep.port)) is None


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_without_node_endpoints_is_none(version: int) -> None:
    body = produce(version, with_endpoints=False)
    assert rewrite_endpoints(0, version, body, to_proxy) is None
    assert endpoints_in_response(0, version, body) == ()


@pytest.mark.parametrize("version", range(10, 14))
def test_produce_node_endpoints_rewritten(version: int) -> None:
    body = produce(version, with_endpoints=True)
    assert endpoints_in_response(0, version, body) == tuple(
        BrokerEndpoint(n, h, p) for n, h, p, _ in BROKERS
    )
    new = rewrite_endpoints(0, version, body, to_proxy)
    assert new is not None
    before = ProduceResponse.decode(body, version=version)
    after = ProduceResponse.decode(new, version=version)
    assert [(e.node_id, e.host, e.port, e.rack) for e in after.node_endpoints] == [
        (n, "pidgate.local", 19000 + n, r) for n, _h, _p, r in BROKERS
    ]
    assert after.responses == before.responses
    assert after.throttle_time_ms == 4
    # Same bytes as kafka-python would produce after mutating the decoded message.
    for e in before.node_endpoints:
        e.host, e.port = to_proxy(BrokerEndpoint(e.node_id, e.host, e.port))
    assert new == bytes(before.encode())


def test_produce_unknown_top_level_tag_without_endpoints() -> None:
    body = produce(10, with_endpoints=False)
    assert body.endswith(b"\x00")
    body_with_tag = body[:-1] + b"\x01\x07\x01\xaa"  # an unknown tag 7
    assert rewrite_endpoints(0, 10, body_with_tag, to_proxy) is None


def test_other_apis_and_versions() -> None:
    assert frozenset({0, 1, 3, 10, 60}) == ENDPOINT_BEARING_APIS
    assert rewrite_endpoints(1, 15, b"whatever", to_proxy) is None  # no node_endpoints < v16
    assert rewrite_endpoints(2, 12, b"whatever", to_proxy) is None
    assert endpoints_in_response(18, 3, b"whatever") == ()
    with pytest.raises(UnsupportedApiError):
        rewrite_endpoints(3, 14, metadata(13), to_proxy)


@given(
    st.sampled_from(
        [(3, 12), (10, 3), (10, 6), (60, 0), (0, 10), (0, 13), (3, 0), (1, 16), (1, 18)]
    ),
    st.binary(max_size=100),
)
def test_garbage_only_protocol_errors(key_version: tuple[int, int], data: bytes) -> None:
    api_key, version = key_version
    with contextlib.suppress(ProtocolError):
        rewrite_endpoints(api_key, version, data, to_proxy)
    with contextlib.suppress(ProtocolError):
        endpoints_in_response(api_key, version, data)


# --- Produce v10+ responses passed on unread (produce_response_passes_unchanged) --------------

COMPILED, NOT_BUILT = import_compiled("pidgate.protocol._speedups")
PASSES = [pure_produce_response_passes_unchanged] + (
    [COMPILED.produce_response_passes_unchanged] if COMPILED is not None else []
)


def _payload(body: bytes, header_tags: bytes = b"\x00") -> bytes:
    """A Produce response frame after its size prefix: correlation id 7, header v1's tagged
    fields, the body."""
    return (7).to_bytes(4, "big") + header_tags + body


def _full_path_unchanged(payload: bytes, version: int) -> bool:
    """What the response path's full reading decides: True when it forwards ``payload`` as is."""
    _correlation_id, body_at = parse_response_header(payload, 0, version)
    return rewrite_endpoints(0, version, payload[body_at:], to_proxy) is None


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("version", range(10, 14))
def test_produce_responses_without_node_endpoints_pass_unchanged(passes: Any, version: int) -> None:
    body = produce(version, with_endpoints=False)
    assert passes(_payload(body), version)
    assert passes(memoryview(bytearray(_payload(body))), version)
    # A tagged field in the response header is skipped, not mistaken for the body's.
    assert passes(_payload(body, b"\x01\x05\x02\xaa\xbb"), version)
    assert not passes(_payload(produce(version, with_endpoints=True)), version)
    # Any top-level tag (here an unknown one) sends it to the full path.
    assert not passes(_payload(body[:-1] + b"\x01\x07\x01\xaa"), version)
    for cut in range(len(_payload(body))):
        assert not passes(_payload(body)[:cut], version), cut


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("version", [3, 9, 14, -1])
def test_other_produce_versions_never_pass_here(passes: Any, version: int) -> None:
    body = produce(min(max(version, 3), 13), with_endpoints=False)
    assert not passes(_payload(body), version)


def _mutant(data: st.DataObject) -> tuple[bytes, int]:
    """A valid Produce v10+ response payload, with up to three bytes changed, inserted or cut;
    and the version it is read as."""
    version = data.draw(st.integers(10, 13))
    payload = bytearray(
        _payload(
            produce(version, with_endpoints=data.draw(st.booleans())),
            data.draw(st.sampled_from([b"\x00", b"\x01\x05\x02\xaa\xbb", b"\x80"])),
        )
    )
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(payload)))
        kind = data.draw(st.integers(0, 2))
        if kind == 0 and at < len(payload):
            payload[at] = data.draw(st.integers(0, 255))
        elif kind == 1:
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        else:
            del payload[at : at + data.draw(st.integers(1, 8))]
    return bytes(payload), data.draw(st.sampled_from([version, 9, 10, 11, 12, 13, 14]))


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_a_pass_is_what_the_full_path_would_do_and_both_paths_agree(data: st.DataObject) -> None:
    """On valid, mutated and random responses: the compiled answer is the pure one, and a
    response let through unread is one the full reading would forward untouched, without an
    error."""
    if data.draw(st.booleans()):
        version = data.draw(st.integers(8, 14))
        payload = data.draw(st.binary(max_size=120))
    else:
        payload, version = _mutant(data)
    pure = pure_produce_response_passes_unchanged(payload, version)
    if COMPILED is not None:
        assert COMPILED.produce_response_passes_unchanged(payload, version) == pure
        view = memoryview(b"HEAD" + payload)[4:]
        assert COMPILED.produce_response_passes_unchanged(view, version) == pure
    if pure:
        assert _full_path_unchanged(payload, version)
