"""Tests for pidgate.protocol.api_versions."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from pidgate.protocol.api_versions import (
    ClientSoftware,
    narrow_api_versions_response,
    parse_api_versions_request,
    proxy_api_version_limits,
)
from pidgate.protocol.errors import MalformedMessageError, ProtocolError, UnsupportedApiError
from pidgate.protocol.headers import KNOWN_API_VERSIONS

R = ApiVersionsResponse


def broker_response(version: int, error_code: int = 0) -> bytes:
    kwargs = {}
    if version >= 3:
        kwargs = {
            "supported_features": [
                R.SupportedFeatureKey(name="metadata.version", min_version=1, max_version=20)
            ],
            "finalized_features_epoch": 42,
            "finalized_features": [
                R.FinalizedFeatureKey(
                    name="metadata.version", max_version_level=20, min_version_level=20
                )
            ],
        }
    resp = R(
        version=version,
        error_code=error_code,
        api_keys=[
            R.ApiVersion(api_key=0, min_version=0, max_version=11),
            R.ApiVersion(api_key=1, min_version=4, max_version=17),
            R.ApiVersion(api_key=3, min_version=0, max_version=12),
            R.ApiVersion(api_key=18, min_version=0, max_version=4),
            R.ApiVersion(api_key=71, min_version=0, max_version=0),  # unknown to pidgate
            R.ApiVersion(api_key=55, min_version=2, max_version=2),  # empty intersection
        ],
        throttle_time_ms=3,
        **kwargs,
    )
    return bytes(resp.encode(version=version))


@pytest.mark.parametrize("version", range(0, 5))
def test_narrow(version: int) -> None:
    limits = proxy_api_version_limits()
    body = broker_response(version)
    narrowed = narrow_api_versions_response(body, version, limits)
    got = R.decode(narrowed, version=version)
    assert [(k.api_key, k.min_version, k.max_version) for k in got.api_keys] == [
        (0, 3, 11),
        (1, 4, 15),
        (3, 0, 12),
        (18, 0, 4),
    ]
    orig = R.decode(body, version=version)
    assert got.error_code == 0
    if version >= 1:
        assert got.throttle_time_ms == 3
    if version >= 3:
        assert got.supported_features == orig.supported_features
        assert got.finalized_features_epoch == 42
        assert got.finalized_features == orig.finalized_features


def test_error_response_returned_unchanged() -> None:
    # On UNSUPPORTED_VERSION the broker encodes the body as v0 whatever was asked (KIP-511).
    body = broker_response(0, error_code=35)
    assert narrow_api_versions_response(body, 4, proxy_api_version_limits()) == body


def test_narrow_truncated_is_malformed() -> None:
    body = broker_response(3)
    for cut in range(len(body)):
        with pytest.raises(MalformedMessageError):
            narrow_api_versions_response(body[:cut], 3, proxy_api_version_limits())


@given(st.binary(max_size=80), st.integers(0, 4))
def test_garbage_only_protocol_errors(data: bytes, version: int) -> None:
    with contextlib.suppress(ProtocolError):
        narrow_api_versions_response(data, version, proxy_api_version_limits())
    with contextlib.suppress(ProtocolError):
        parse_api_versions_request(data, version)


def test_limits() -> None:
    limits = proxy_api_version_limits()
    assert limits[0] == (3, 13)
    assert limits[1][1] == 15
    assert limits[55][1] == 1
    assert limits[3][1] == 13 and limits[10][1] == 6 and limits[60][1] == 2
    assert set(limits) == set(KNOWN_API_VERSIONS)


@pytest.mark.parametrize("version", range(0, 5))
def test_parse_request(version: int) -> None:
    req = ApiVersionsRequest(
        version=version, client_software_name="pidgate-test", client_software_version="1.2.3"
    )
    body = bytes(req.encode(version=version))
    expected = (
        ClientSoftware("pidgate-test", "1.2.3") if version >= 3 else ClientSoftware(None, None)
    )
    assert parse_api_versions_request(body, version) == expected


def test_parse_request_errors() -> None:
    with pytest.raises(UnsupportedApiError):
        parse_api_versions_request(b"", 5)
    with pytest.raises(MalformedMessageError):
        parse_api_versions_request(b"\x05ab", 3)


def test_unsupported_version_answer_decodes_as_v0_with_error_35() -> None:
    from kafka.protocol.metadata.api_versions import ApiVersionsResponse

    from pidgate.protocol.api_versions import encode_api_versions_unsupported

    framed = encode_api_versions_unsupported(correlation_id=77, supported=(0, 4))
    assert int.from_bytes(framed[:4], "big") == len(framed) - 4
    response = ApiVersionsResponse.decode(framed[4:], version=0, header=True)
    assert response.header.correlation_id == 77
    assert response.error_code == 35
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 4)]


def test_keys_answered_locally_are_added_or_intersected() -> None:
    from kafka.protocol.metadata.api_versions import ApiVersionsResponse

    from pidgate.protocol.api_versions import broker_api_versions, narrow_api_versions_response

    for version in (0, 1, 2, 3):
        keys = [(0, 0, 11), (48, 0, 0)]  # broker: Produce 0-11, DescribeClientQuotas 0 only
        response = ApiVersionsResponse(
            version=version,
            error_code=0,
            api_keys=[
                ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, lo, hi in keys
            ],
            throttle_time_ms=0,
        )
        body = response.encode(version=version)
        assert broker_api_versions(body, version) == {0: (0, 11), 48: (0, 0)}
        narrowed = narrow_api_versions_response(
            body, version, {0: (3, 13), 48: (0, 1), 49: (0, 1)}, {48: (0, 1), 49: (0, 1)}
        )
        decoded = ApiVersionsResponse.decode(narrowed, version=version)
        got = {k.api_key: (k.min_version, k.max_version) for k in decoded.api_keys}
        # Produce clamped; 48 intersected with the broker's (mixed requests are forwarded);
        # 49 added although the broker lacks it: pidgate answers it.
        assert got == {0: (3, 11), 48: (0, 0), 49: (0, 1)}
