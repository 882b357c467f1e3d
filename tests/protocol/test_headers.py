"""Tests for pidgate.protocol.headers against kafka-python's header encoding."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader as KpRequestHeader
from kafka.protocol.api_header import ResponseHeader as KpResponseHeader

from pidgate.protocol.errors import MalformedMessageError, ProtocolError, UnsupportedApiError
from pidgate.protocol.headers import (
    FLEXIBLE_REQUEST_FROM,
    KNOWN_API_VERSIONS,
    NEVER_FLEXIBLE,
    encode_response_header,
    parse_request_header,
    parse_response_header,
    response_header_is_flexible,
)


def kp_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> bytes:
    flexible = api_version >= FLEXIBLE_REQUEST_FROM[api_key]
    hdr = KpRequestHeader(
        request_api_key=api_key,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    return bytes(hdr.encode(flexible=flexible))


def test_tables_match_kafka_notes() -> None:
    # KAFKA-NOTES.md "Flexible from" list.
    assert FLEXIBLE_REQUEST_FROM[0] == 9
    assert FLEXIBLE_REQUEST_FROM[3] == 9
    assert FLEXIBLE_REQUEST_FROM[10] == 3
    assert FLEXIBLE_REQUEST_FROM[18] == 3
    assert FLEXIBLE_REQUEST_FROM[36] == 2
    assert FLEXIBLE_REQUEST_FROM[22] == 2
    assert FLEXIBLE_REQUEST_FROM[60] == 0
    assert FLEXIBLE_REQUEST_FROM[48] == 1
    assert FLEXIBLE_REQUEST_FROM[49] == 1
    assert FLEXIBLE_REQUEST_FROM[17] == NEVER_FLEXIBLE
    assert KNOWN_API_VERSIONS[0] == (0, 13)
    assert KNOWN_API_VERSIONS[18] == (0, 4)
    assert set(FLEXIBLE_REQUEST_FROM) == set(KNOWN_API_VERSIONS)


@pytest.mark.parametrize("api_key", sorted(KNOWN_API_VERSIONS))
def test_round_trip_every_api_and_version(api_key: int) -> None:
    lo, hi = KNOWN_API_VERSIONS[api_key]
    for version in range(lo, hi + 1):
        for client_id in ("kafka-python", None, "ünïcode"):
            raw = kp_request_header(api_key, version, 1234, client_id) + b"BODY"
            hdr = parse_request_header(raw)
            assert (hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id) == (
                api_key,
                version,
                1234,
                client_id,
            )
            assert raw[hdr.header_bytes :] == b"BODY"


def test_flexible_header_with_tagged_fields_is_skipped() -> None:
    base = kp_request_header(0, 9, 7, "c")
    assert base.endswith(b"\x00")
    raw = base[:-1] + b"\x01\x05\x02ab" + b"BODY"  # one tagged field: tag 5, 2 bytes
    hdr = parse_request_header(memoryview(raw))
    assert raw[hdr.header_bytes :] == b"BODY"


def test_unknown_api_key_and_too_new_version() -> None:
    with pytest.raises(UnsupportedApiError, match="api key pidgate does not know") as info:
        parse_request_header(b"\x00\x47\x00\x00\x00\x00\x00\x02\xff\xff")
    assert info.value.correlation_id == 2
    raw = kp_request_header(18, 4, 9, "x")
    raw = raw[:2] + b"\x00\x05" + raw[4:]
    with pytest.raises(UnsupportedApiError, match="api key 18 version 5") as info2:
        parse_request_header(raw)
    assert (info2.value.api_key, info2.value.api_version, info2.value.correlation_id) == (18, 5, 9)


def test_truncation_is_malformed() -> None:
    raw = kp_request_header(0, 9, 7, "client")
    for cut in range(len(raw)):
        with pytest.raises(MalformedMessageError):
            parse_request_header(raw[:cut])


@given(st.binary(max_size=64))
def test_garbage_only_raises_protocol_errors(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_request_header(data)


def test_response_headers() -> None:
    assert response_header_is_flexible(18, 4) is False
    assert response_header_is_flexible(0, 9) is True
    assert response_header_is_flexible(0, 8) is False
    assert response_header_is_flexible(60, 0) is True
    for flexible in (False, True):
        ours = encode_response_header(42, flexible)
        theirs = bytes(KpResponseHeader(correlation_id=42).encode(flexible=flexible))
        assert ours == theirs
    assert parse_response_header(encode_response_header(42, True) + b"X", 0, 9) == (42, 5)
    assert parse_response_header(encode_response_header(42, False) + b"X", 18, 4) == (42, 4)
    with pytest.raises(MalformedMessageError):
        parse_response_header(b"\x00\x00", 0, 9)
    with pytest.raises(UnsupportedApiError):
        response_header_is_flexible(71, 0)
