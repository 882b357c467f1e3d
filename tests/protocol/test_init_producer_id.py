"""Tests for pidgate.protocol.init_producer_id (InitProducerId v0-v6, api key 22).

Bodies are built with kafka-python's message classes (the reference encoding); the hand-written
walk must read back every field for every version, and refuse garbage with
``MalformedMessageError``.
"""

from __future__ import annotations

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.init_producer_id import (
    INIT_PRODUCER_ID_KEY,
    SUPPORTED_INIT_PRODUCER_ID_VERSIONS,
    InitProducerIdRequestSummary,
    InitProducerIdResponseSummary,
    parse_init_producer_id_request,
    parse_init_producer_id_response,
)

VERSIONS = list(SUPPORTED_INIT_PRODUCER_ID_VERSIONS)


def _request(version: int, transactional_id: str | None, **fields: object) -> bytes:
    message = InitProducerIdRequest(
        transactional_id=transactional_id,
        transaction_timeout_ms=fields.get("transaction_timeout_ms", 60_000),
        producer_id=fields.get("producer_id", -1),
        producer_epoch=fields.get("producer_epoch", -1),
        enable2_pc=fields.get("enable_2pc", False),
        keep_prepared_txn=fields.get("keep_prepared_txn", False),
    )
    return bytes(message.encode(version=version))


def _response(version: int, **fields: int) -> bytes:
    message = InitProducerIdResponse(
        throttle_time_ms=fields.get("throttle_time_ms", 0),
        error_code=fields.get("error_code", 0),
        producer_id=fields.get("producer_id", 4242),
        producer_epoch=fields.get("producer_epoch", 0),
        ongoing_txn_producer_id=fields.get("ongoing_txn_producer_id", -1),
        ongoing_txn_producer_epoch=fields.get("ongoing_txn_producer_epoch", -1),
    )
    return bytes(message.encode(version=version))


def test_versions_match_kafka_pythons_schemas() -> None:
    assert InitProducerIdRequest.API_KEY == INIT_PRODUCER_ID_KEY
    assert (InitProducerIdRequest.min_version, InitProducerIdRequest.max_version) == (0, 6)
    assert (InitProducerIdResponse.min_version, InitProducerIdResponse.max_version) == (0, 6)
    assert VERSIONS == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "", "orders-tx-1", "tx-ü-✓"])
def test_request_transactional_id_every_version(version: int, transactional_id: str | None) -> None:
    body = _request(version, transactional_id, transaction_timeout_ms=90_000)
    parsed = parse_init_producer_id_request(body, version)
    assert parsed.transactional_id == transactional_id
    assert parsed.transaction_timeout_ms == 90_000
    assert parsed.is_transactional is (transactional_id is not None)


@pytest.mark.parametrize("version", VERSIONS)
def test_request_resume_and_2pc_fields_by_version(version: int) -> None:
    body = _request(
        version,
        "tx",
        producer_id=77,
        producer_epoch=3,
        enable_2pc=True,
        keep_prepared_txn=True,
    )
    parsed = parse_init_producer_id_request(body, version)
    resumes = version >= 3
    two_pc = version >= 6
    assert parsed == InitProducerIdRequestSummary(
        transactional_id="tx",
        transaction_timeout_ms=60_000,
        producer_id=77 if resumes else -1,
        producer_epoch=3 if resumes else -1,
        enable_2pc=two_pc,
        keep_prepared_txn=two_pc,
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("error_code", "producer_id", "producer_epoch"),
    [(0, 4242, 0), (0, (1 << 63) - 1, 32767), (47, -1, -1), (90, -1, -1)],
)
def test_response_every_version(
    version: int, error_code: int, producer_id: int, producer_epoch: int
) -> None:
    body = _response(
        version,
        throttle_time_ms=12,
        error_code=error_code,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        ongoing_txn_producer_id=99,
        ongoing_txn_producer_epoch=4,
    )
    parsed = parse_init_producer_id_response(body, version)
    assert parsed == InitProducerIdResponseSummary(
        throttle_time_ms=12,
        error_code=error_code,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        ongoing_txn_producer_id=99 if version >= 6 else -1,
        ongoing_txn_producer_epoch=4 if version >= 6 else -1,
    )


@pytest.mark.parametrize("version", [2, 3, 6])
def test_flexible_bodies_with_unknown_tagged_fields(version: int) -> None:
    request = _request(version, "tx")
    response = _response(version, producer_id=5)
    # Replace the empty tagged-field section (a single 0 byte) with one unknown tag.
    tagged = bytes([1, 9, 2]) + b"\xab\xcd"
    assert request[-1] == 0 and response[-1] == 0
    assert parse_init_producer_id_request(request[:-1] + tagged, version).transactional_id == "tx"
    assert parse_init_producer_id_response(response[:-1] + tagged, version).producer_id == 5


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_malformed(version: int) -> None:
    request = _request(version, "some-transactional-id", producer_id=1, producer_epoch=1)
    response = _response(version)
    for cut in range(len(request)):
        with pytest.raises(MalformedMessageError):
            parse_init_producer_id_request(request[:cut], version)
    for cut in range(len(response)):
        with pytest.raises(MalformedMessageError):
            parse_init_producer_id_response(response[:cut], version)


@pytest.mark.parametrize("version", VERSIONS)
def test_trailing_bytes_are_malformed(version: int) -> None:
    with pytest.raises(MalformedMessageError, match="trailing"):
        parse_init_producer_id_request(_request(version, None) + b"\x00", version)
    with pytest.raises(MalformedMessageError, match="trailing"):
        parse_init_producer_id_response(_response(version) + b"\x00", version)


@pytest.mark.parametrize(
    ("body", "version"),
    [
        (b"\xff\xfe" + b"\x00" * 4, 0),  # string length -2
        (b"\x00\x05ab", 1),  # string longer than the body
        (b"\x00\x02\xff\xfe" + b"\x00" * 4, 0),  # invalid UTF-8
        (b"\x03\xc3\x28" + b"\x00" * 5, 2),  # invalid UTF-8, compact
        (b"\xff\xff\xff\xff\xff\xff", 2),  # varint longer than 5 bytes
        (b"\x00" + b"\x00" * 4 + b"\x00" * 10 + b"\x02\x00" + b"\x00", 6),  # bool 2
        (b"\x00" + b"\x00" * 4 + b"\x00" * 10 + b"\x00\x00" + b"\x05\x01", 6),  # tag runs off
        (b"", 0),
    ],
)
def test_garbage_requests_are_malformed(body: bytes, version: int) -> None:
    with pytest.raises(MalformedMessageError, match=f"InitProducerId v{version} request"):
        parse_init_producer_id_request(body, version)


@pytest.mark.parametrize("version", [-1, 7, 100])
def test_unknown_versions_are_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedApiError) as info:
        parse_init_producer_id_request(b"", version)
    assert (info.value.api_key, info.value.api_version) == (INIT_PRODUCER_ID_KEY, version)
    with pytest.raises(UnsupportedApiError):
        parse_init_producer_id_response(b"", version)


def test_accepts_memoryview_and_bytearray() -> None:
    body = _request(4, "tx")
    assert parse_init_producer_id_request(memoryview(body), 4).transactional_id == "tx"
    assert parse_init_producer_id_request(bytearray(body), 4).transactional_id == "tx"
