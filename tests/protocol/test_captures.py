"""Parity on real bytes captured from kafka-python, confluent-kafka (librdkafka) and aiokafka
talking to tansu (see captures/capture.py, which wrote captures/*.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsResponse, FindCoordinatorResponse, MetadataResponse

from pidgate.protocol.api_versions import (
    narrow_api_versions_response,
    parse_api_versions_request,
    proxy_api_version_limits,
)
from pidgate.protocol.endpoints import BrokerEndpoint, endpoints_in_response, rewrite_endpoints
from pidgate.protocol.framing import FrameDecoder
from pidgate.protocol.headers import parse_request_header, parse_response_header
from pidgate.protocol.produce import parse_produce_request

from .kafka_builders import reference_produce, summary_as_reference

CAPTURES = Path(__file__).parent / "captures"
CLIENTS = ("kafka-python", "confluent-kafka", "aiokafka")


def load(client: str) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = json.loads((CAPTURES / f"{client}.json").read_text())["frames"]
    for f in frames:
        f["frame"] = bytes.fromhex(f["frame_hex"])
    return frames


ALL = {name: load(name) for name in (*CLIENTS, "setup")}


def frames(direction: str, api_key: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (client, f)
        for client, fs in ALL.items()
        for f in fs
        if f["direction"] == direction and f["api_key"] == api_key
    ]


def test_every_client_produced() -> None:
    seen = {(c, f["api_version"]) for c, f in frames("request", 0)}
    assert seen == {("kafka-python", 9), ("confluent-kafka", 10), ("aiokafka", 7)}


def test_frame_decoder_on_captured_stream() -> None:
    for fs in ALL.values():
        stream = b"".join(f["frame"] for f in fs if f["direction"] == "request")
        dec = FrameDecoder(max_frame_bytes=1 << 20)
        out: list[bytes] = []
        for i in range(0, len(stream), 37):
            out += dec.feed(stream[i : i + 37])
        assert out == [f["frame"] for f in fs if f["direction"] == "request"]


@pytest.mark.parametrize(
    ("client", "frame"), frames("request", 0), ids=lambda x: x if isinstance(x, str) else ""
)
def test_produce_requests_match_kafka_python(client: str, frame: dict[str, Any]) -> None:
    payload = frame["frame"][4:]
    hdr = parse_request_header(payload)
    body = payload[hdr.header_bytes :]
    summary = parse_produce_request(body, hdr.api_version)
    assert summary_as_reference(summary) == reference_produce(body, hdr.api_version)
    batches = [b for _t, _p, b in summary.iter_batches()]
    assert batches
    if client in ("kafka-python", "confluent-kafka"):  # idempotent producers
        assert summary.producer_ids() and all(b.producer_id >= 0 for b in batches)
        assert summary.acks == -1
    else:
        assert summary.producer_ids() == frozenset()


def test_client_software_names() -> None:
    names = {}
    for client, f in frames("request", 18):
        payload = f["frame"][4:]
        hdr = parse_request_header(payload)
        sw = parse_api_versions_request(payload[hdr.header_bytes :], hdr.api_version)
        names.setdefault(client, set()).add((hdr.api_version, sw.name))
    assert names["kafka-python"] == {(4, "kafka-python")}
    assert names["confluent-kafka"] == {(3, "confluent-kafka-python")}
    assert names["aiokafka"] == {(0, None)}  # aiokafka 0.14 sends ApiVersions v0


def test_api_versions_responses_narrow() -> None:
    limits = proxy_api_version_limits()
    for _client, f in frames("response", 18):
        payload = f["frame"][4:]
        cid, off = parse_response_header(payload, 18, f["api_version"])
        assert cid == f["correlation_id"]
        body = payload[off:]
        narrowed = narrow_api_versions_response(body, f["api_version"], limits)
        before = ApiVersionsResponse.decode(body, version=f["api_version"])
        after = ApiVersionsResponse.decode(narrowed, version=f["api_version"])
        want = []
        for k in before.api_keys:
            if k.api_key in limits:
                lo = max(k.min_version, limits[k.api_key][0])
                hi = min(k.max_version, limits[k.api_key][1])
                if lo <= hi:
                    want.append((k.api_key, lo, hi))
        assert [(k.api_key, k.min_version, k.max_version) for k in after.api_keys] == want
        keys = {k[0] for k in want}
        assert 71 not in keys  # tansu advertises GetTelemetrySubscriptions; we drop it
        assert 0 in keys and 3 in keys and 18 in keys


def test_produce_responses_carry_no_endpoints() -> None:
    for _client, f in frames("response", 0):
        payload = f["frame"][4:]
        _cid, off = parse_response_header(payload, 0, f["api_version"])
        assert rewrite_endpoints(0, f["api_version"], payload[off:], lambda e: ("x", 1)) is None


@pytest.mark.parametrize("api_key", [3, 10])
def test_endpoint_responses_rewrite(api_key: int) -> None:
    cls = {3: MetadataResponse, 10: FindCoordinatorResponse}[api_key]
    captured = frames("response", api_key)
    assert captured
    for _client, f in captured:
        version = f["api_version"]
        payload = f["frame"][4:]
        _cid, off = parse_response_header(payload, api_key, version)
        body = payload[off:]
        # kafka-python re-encodes captured bytes identically, so rewriting changes only endpoints.
        assert bytes(cls.decode(body, version=version).encode()) == body
        found = endpoints_in_response(api_key, version, body)
        assert found and all(ep.host == "127.0.0.1" for ep in found)

        def rewrite(ep: BrokerEndpoint) -> tuple[str, int]:
            return "proxy.example", 30000 + ep.node_id

        new = rewrite_endpoints(api_key, version, body, rewrite)
        assert new is not None
        assert endpoints_in_response(api_key, version, new) == tuple(
            BrokerEndpoint(ep.node_id, "proxy.example", 30000 + ep.node_id) for ep in found
        )
        cls.decode(new, version=version)
