"""Tests for pidgate.protocol.produce: the hand-written walk agrees with kafka-python's decode."""

from __future__ import annotations

import contextlib
import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer.produce import ProduceResponse

from pidgate.protocol.errors import MalformedMessageError, ProtocolError, UnsupportedApiError
from pidgate.protocol.headers import parse_response_header
from pidgate.protocol.produce import (
    SUPPORTED_PRODUCE_VERSIONS,
    PartitionProduce,
    ProduceRequestSummary,
    TopicProduce,
    encode_produce_rejection,
    parse_produce_request,
    produce_acks_and_producer_ids,
)
from pidgate.protocol.record_batches import BatchHeader, iter_batch_headers

from .kafka_builders import (
    BatchSpec,
    build_records,
    produce_request_body,
    reference_produce,
    summary_as_reference,
)

VERSIONS = list(SUPPORTED_PRODUCE_VERSIONS)

batch_specs = st.builds(
    BatchSpec,
    magic=st.sampled_from([2, 2, 2, 1, 0]),
    compression_type=st.sampled_from([0, 1]),  # none, gzip
    producer_id=st.one_of(st.just(-1), st.integers(0, 2**63 - 1)),
    producer_epoch=st.integers(0, 2**15 - 1),
    base_sequence=st.integers(0, 2**31 - 1),
    transactional=st.booleans(),
    record_count=st.integers(1, 3),
)
records_st = st.one_of(
    st.none(),
    st.just(b""),
    st.lists(batch_specs, min_size=1, max_size=3).map(build_records),
)
topics_st = st.lists(
    st.tuples(
        st.text(min_size=1, max_size=12),
        st.binary(min_size=16, max_size=16),
        st.lists(st.tuples(st.integers(0, 2**31 - 1), records_st), max_size=3),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    transactional_id=st.one_of(st.none(), st.text(max_size=10)),
    acks=st.sampled_from([-1, 0, 1]),
    timeout_ms=st.integers(0, 2**31 - 1),
    topics=topics_st,
)
def test_parse_agrees_with_kafka_python(
    version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topics: list[tuple[str, bytes, list[tuple[int, bytes | None]]]],
) -> None:
    body = produce_request_body(version, transactional_id, acks, timeout_ms, topics)
    summary = parse_produce_request(body, version)
    assert summary_as_reference(summary) == reference_produce(body, version)
    expected_pids = {b.producer_id for _t, _p, b in summary.iter_batches() if b.producer_id != -1}
    assert summary.producer_ids() == expected_pids
    for pid in expected_pids:
        first = summary.first_batch_for(pid)
        assert first is not None and first.producer_id == pid
    # Also from a memoryview slice inside a bigger buffer (as the proxy hands it over).
    framed = b"HEADER" + body
    assert parse_produce_request(memoryview(framed)[6:], version) == summary


def test_the_lean_walk_reads_long_arrays_and_records() -> None:
    # The walk reads one-byte array lengths and one- or two-byte records lengths inline: 130
    # topics of 130 partitions (two-byte compact lengths) and records of 0, ~170 and 10,000+
    # bytes' worth (one-, two- and three-byte varints: empty, a batch, 60 batches) go through
    # the shared readers.
    small = build_records([BatchSpec(2, 0, 11, 0, 0, False, 1)])
    big = build_records([BatchSpec(2, 0, 12, 0, 0, False, 3)] * 60)
    assert 0x7F < len(small) < 0x3FFF < len(big)
    many_partitions = [(index, small) for index in range(130)]
    for version in VERSIONS:
        body = produce_request_body(
            version,
            None,
            -1,
            1000,
            [(f"t{i}", bytes(16), many_partitions) for i in range(130)]
            + [("big", b"b" * 16, [(0, big), (1, None), (2, b"")])],
        )
        summary = parse_produce_request(body, version)
        expected = (-1, _batch_order_pids(summary))
        assert expected[1].count(11) == 130 * 130 and expected[1].count(12) == 60
        assert produce_acks_and_producer_ids(body, version) == expected


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=topics_st, data=st.data())
def test_truncated_or_corrupted_only_raises_protocol_errors(
    version: int,
    topics: list[tuple[str, bytes, list[tuple[int, bytes | None]]]],
    data: st.DataObject,
) -> None:
    body = produce_request_body(version, None, -1, 1000, topics)
    cut = data.draw(st.integers(0, max(len(body) - 1, 0)))
    # The counts and lengths fix the structure, so every strict prefix is incomplete.
    with pytest.raises(MalformedMessageError):
        parse_produce_request(body[:cut], version)
    flip_at = data.draw(st.integers(0, max(len(body) - 1, 0)))
    if body:
        mutated = bytearray(body)
        mutated[flip_at] ^= data.draw(st.integers(1, 255))
        with contextlib.suppress(ProtocolError):
            parse_produce_request(bytes(mutated), version)


def _batch_order_pids(summary: ProduceRequestSummary) -> tuple[int, ...]:
    return tuple(b.producer_id for _t, _p, b in summary.iter_batches() if b.producer_id != -1)


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    transactional_id=st.one_of(st.none(), st.text(max_size=200)),
    acks=st.sampled_from([-1, 0, 1]),
    topics=topics_st,
)
def test_the_lean_walk_reads_the_same_acks_and_pids_as_the_full_walk(
    version: int,
    transactional_id: str | None,
    acks: int,
    topics: list[tuple[str, bytes, list[tuple[int, bytes | None]]]],
) -> None:
    body = produce_request_body(version, transactional_id, acks, 1000, topics)
    summary = parse_produce_request(body, version)
    assert produce_acks_and_producer_ids(body, version) == (acks, _batch_order_pids(summary))
    assert produce_acks_and_producer_ids(memoryview(b"HEAD" + body)[4:], version) == (
        acks,
        _batch_order_pids(summary),
    )


def test_the_lean_walk_reads_long_names_and_ids() -> None:
    # Names and transactional ids past one varint byte (>= 127 bytes) and a PID in every batch.
    name = "t" * 300
    records = build_records(
        [BatchSpec(2, 0, pid, 0, 0, False, 1) for pid in (7, -1)]
        + [BatchSpec(1, 0, -1, 0, 0, False, 1)]
    )
    for version in VERSIONS:
        body = produce_request_body(
            version, "x" * 200, 1, 1000, [(name, b"i" * 16, [(3, records)])]
        )
        assert produce_acks_and_producer_ids(body, version) == (1, (7,))


@settings(max_examples=300, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=topics_st, data=st.data())
def test_the_lean_walk_is_never_looser_about_structure_than_the_full_walk(
    version: int,
    topics: list[tuple[str, bytes, list[tuple[int, bytes | None]]]],
    data: st.DataObject,
) -> None:
    """Every strict prefix raises in both; a corrupted body the full walk reads gives the same
    PIDs in both. The lean walk may accept a body the full walk refuses only for a topic name
    or transactional id that is not UTF-8 (it does not decode them; the broker does)."""
    body = produce_request_body(version, None, -1, 1000, topics)
    cut = data.draw(st.integers(0, max(len(body) - 1, 0)))
    with pytest.raises(MalformedMessageError):
        produce_acks_and_producer_ids(body[:cut], version)
    if not body:
        return
    mutated = bytearray(body)
    mutated[data.draw(st.integers(0, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        full = parse_produce_request(bytes(mutated), version)
    except ProtocolError as error:
        with contextlib.suppress(ProtocolError):
            produce_acks_and_producer_ids(bytes(mutated), version)
            assert "codec can't decode" in str(error), error
        return
    assert produce_acks_and_producer_ids(bytes(mutated), version) == (
        full.acks,
        _batch_order_pids(full),
    )


@settings(max_examples=500, deadline=None)
@given(version=st.sampled_from(VERSIONS), data=st.binary(max_size=200))
def test_garbage_only_raises_protocol_errors(version: int, data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_produce_request(data, version)
    with contextlib.suppress(ProtocolError):
        produce_acks_and_producer_ids(data, version)
    with contextlib.suppress(ProtocolError):
        list(iter_batch_headers(data))


def test_unsupported_versions() -> None:
    for version in (0, 1, 2, 14, -1):
        with pytest.raises(UnsupportedApiError, match=f"version {version} is not supported"):
            parse_produce_request(b"", version)


def test_batch_header_fields_and_flags() -> None:
    records = build_records([BatchSpec(2, 1, 4242, 7, 99, True, 3)])
    (batch,) = iter_batch_headers(records)
    assert batch.producer_id == 4242
    assert batch.producer_epoch == 7
    assert batch.base_sequence == 99
    assert batch.records_count == 3
    assert batch.last_offset_delta == 2
    assert batch.is_transactional and not batch.is_control
    assert batch.compression_type == 1
    assert batch.batch_length == len(records) - 12


def test_legacy_message_sets_have_no_pid() -> None:
    records = build_records([BatchSpec(1, 0, -1, -1, -1, False, 2)])
    batches = list(iter_batch_headers(records))
    assert [b.magic for b in batches] == [1, 1]
    assert all(b.producer_id == -1 and b.producer_epoch == -1 for b in batches)
    assert batches[0].base_timestamp == 1_700_000_000_000
    assert not batches[0].is_transactional


def test_partial_tail() -> None:
    records = build_records([BatchSpec(2, 0, 1, 0, 0, False, 1)] * 2)
    for cut in range(1, len(records) // 2):
        truncated = records[: len(records) // 2 + cut]
        assert len(list(iter_batch_headers(truncated, allow_partial_tail=True))) == 1
        with pytest.raises(MalformedMessageError, match="truncated record batch"):
            list(iter_batch_headers(truncated))


def test_bad_magic_and_short_batch_length() -> None:
    records = bytearray(build_records([BatchSpec(2, 0, 1, 0, 0, False, 1)]))
    bad_magic = bytes(records[:16]) + b"\x07" + bytes(records[17:])
    with pytest.raises(MalformedMessageError, match="magic 7"):
        list(iter_batch_headers(bad_magic))
    short = bytes(records[:8]) + struct.pack(">i", 10) + bytes(records[12:])
    with pytest.raises(MalformedMessageError, match="batch_length 10"):
        list(iter_batch_headers(short))


def test_huge_array_count_is_rejected_fast() -> None:
    body = b"\xff\xff" + b"\xff\xff" + b"\x00\x00\x03\xe8" + b"\x7f\xff\xff\xff"
    with pytest.raises(MalformedMessageError, match="array length"):
        parse_produce_request(body, 3)


def _summary(version: int) -> ProduceRequestSummary:
    def topic(name: str, tid: bytes, indexes: list[int]) -> TopicProduce:
        batches: tuple[BatchHeader, ...] = ()
        return TopicProduce(
            None if version >= 13 else name,
            tid if version >= 13 else None,
            tuple(PartitionProduce(i, batches) for i in indexes),
        )

    return ProduceRequestSummary(
        None,
        -1,
        30000,
        (topic("orders", b"\x01" * 16, [0, 5, 2]), topic("ünï", b"\x02" * 16, [1])),
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_rejection_decodes_with_kafka_python(version: int) -> None:
    request = _summary(version)
    framed = encode_produce_rejection(version, 777, request, 89, 1500)
    assert struct.unpack(">i", framed[:4])[0] == len(framed) - 4
    correlation_id, offset = parse_response_header(framed[4:], 0, version)
    assert correlation_id == 777
    resp = ProduceResponse.decode(framed[4 + offset :], version=version)
    assert resp.throttle_time_ms == 1500
    got = []
    for t in resp.responses:
        key = t.topic_id.bytes if version >= 13 else t.name
        for p in t.partition_responses:
            got.append((key, p.index, p.error_code, p.base_offset))
            assert p.log_append_time_ms == -1
            if version >= 5:
                assert p.log_start_offset == -1
            if version >= 8:
                assert p.record_errors == [] and p.error_message is None
    expected = [
        (t.topic_id if version >= 13 else t.name, p.index, 89, -1)
        for t in request.topics
        for p in t.partitions
    ]
    assert got == expected
    # Byte-identical to kafka-python's own encoding of the same response.
    T = ProduceResponse.TopicProduceResponse
    P = T.PartitionProduceResponse
    ref = ProduceResponse(
        version=version,
        responses=[
            T(
                **(
                    {"topic_id": uuid.UUID(bytes=t.topic_id or b"")}
                    if version >= 13
                    else {"name": t.name}
                ),
                partition_responses=[
                    P(index=p.index, error_code=89, base_offset=-1) for p in t.partitions
                ],
            )
            for t in request.topics
        ],
        throttle_time_ms=1500,
    )
    assert framed[4 + offset :] == bytes(ref.encode(version=version))


def test_rejection_rejects_unsupported_version() -> None:
    with pytest.raises(UnsupportedApiError):
        encode_produce_rejection(2, 1, _summary(3), 89, 0)
