"""Segment and producer-snapshot files: the writer checked against kafka-python's decoder, the
reader's CRC/truncation errors, and Kafka's snapshot layout byte by byte. No Spark."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from kafka.record.memory_records import MemoryRecords

from pidgate.pipeline.reading.logdirs import (
    discover_partitions,
    generate_log_dirs,
    list_segments,
    parse_partition_dir_name,
)
from pidgate.pipeline.reading.segments import (
    BatchSpec,
    ControlMarker,
    SegmentError,
    SnapshotEntry,
    SnapshotError,
    encode_snapshot,
    iter_segment,
    last_sequence,
    read_segment_headers,
    read_snapshot,
    segment_file_name,
    snapshot_file_name,
    write_segment,
    write_snapshot,
)

SPECS = [
    BatchSpec(
        0,
        1_000,
        [b"a" * 10, b"bb", None],
        [0, 7, 3],
        producer_id=7,
        producer_epoch=1,
        base_sequence=0,
    ),
    BatchSpec(
        3, 2_000, [b"x"], producer_id=8, producer_epoch=0, base_sequence=0, transactional=True
    ),
    BatchSpec(4, 2_100, producer_id=8, producer_epoch=0, marker=ControlMarker(False, 5)),
    BatchSpec(5, 2_200, [b"plain" * 100]),
]


def _write(tmp_path: Path, specs: list[BatchSpec] = SPECS) -> Path:
    path = tmp_path / segment_file_name(specs[0].base_offset)
    write_segment(path, specs)
    return path


def test_writer_output_decodes_with_kafka_python(tmp_path: Path) -> None:
    path = _write(tmp_path)
    records = MemoryRecords(path.read_bytes())
    seen = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        seen.append(
            (
                batch.base_offset,
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.is_transactional,
                batch.is_control_batch,
                batch.max_timestamp,
                [(r.offset, r.timestamp, r.key, r.value) for r in batch],
            )
        )
    assert seen == [
        (
            0,
            7,
            1,
            0,
            False,
            False,
            1_007,
            [(0, 1_000, None, b"a" * 10), (1, 1_007, None, b"bb"), (2, 1_003, None, None)],
        ),
        (3, 8, 0, 0, True, False, 2_000, [(3, 2_000, None, b"x")]),
        # EndTransactionMarker: key (version 0, type ABORT=0), value (version 0, epoch 5)
        (
            4,
            8,
            0,
            -1,
            True,
            True,
            2_100,
            [(4, 2_100, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x05")],
        ),
        (5, -1, -1, -1, False, False, 2_200, [(5, 2_200, None, b"plain" * 100)]),
    ]


def test_reader_headers_and_markers(tmp_path: Path) -> None:
    path = _write(tmp_path)
    batches = list(iter_segment(path))
    headers = [b.header for b in batches]
    assert [h.base_offset for h in headers] == [0, 3, 4, 5]
    assert [h.base_offset + h.last_offset_delta for h in headers] == [s.last_offset for s in SPECS]
    assert [h.max_timestamp for h in headers] == [1_007, 2_000, 2_100, 2_200]
    assert [(h.is_transactional, h.is_control) for h in headers] == [
        (False, False),
        (True, False),
        (True, True),
        (False, False),
    ]
    assert batches[2].marker == ControlMarker(False, 5, 2_100)
    assert [b.marker for b in batches if b.header.producer_id != 8] == [None, None]
    assert list(read_segment_headers(path)) == headers


def test_crc_mismatch_names_the_file_and_keeps_earlier_batches(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    second = 12 + struct.unpack_from(">i", data, 8)[0]  # byte position of batch 2
    data[second + 61] ^= 0xFF  # a record byte of batch 2 (CRC-covered)
    path.write_bytes(bytes(data))
    seen = []
    with pytest.raises(SegmentError) as err:
        for header in read_segment_headers(path):
            seen.append(header.base_offset)
    assert seen == [0]
    assert err.value.path == str(path)
    assert err.value.offset == second
    assert "CRC mismatch" in err.value.reason
    assert str(path) in str(err.value)


def test_truncated_segment_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(SegmentError, match="truncated batch at base offset 5"):
        list(read_segment_headers(path))
    path.write_bytes(data + b"\x00" * 5)  # a tail too short for a batch header
    with pytest.raises(SegmentError, match="truncated batch"):
        list(read_segment_headers(path))


def test_offsets_going_backwards_are_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path)
    data = bytearray(path.read_bytes())
    second = 12 + struct.unpack_from(">i", data, 8)[0]
    data[second] ^= 0xFF  # base_offset is not covered by the CRC
    path.write_bytes(bytes(data))
    with pytest.raises(SegmentError, match="offsets must increase") as err:
        list(read_segment_headers(path))
    assert err.value.offset == second
    # a first batch below the segment's base offset (from the file name) is caught too
    misnamed = tmp_path / segment_file_name(100)
    write_segment(misnamed, SPECS)
    with pytest.raises(SegmentError, match="below 100"):
        list(read_segment_headers(misnamed))


def test_empty_segment_has_no_batches(tmp_path: Path) -> None:
    path = tmp_path / segment_file_name(0)
    path.write_bytes(b"")
    assert list(read_segment_headers(path)) == []


def test_last_sequence_wraps_like_kafka() -> None:
    assert last_sequence(5, 3) == 8
    assert last_sequence(-1, 3) == -1
    assert last_sequence(2**31 - 2, 3) == 1  # DefaultRecordBatch.incrementSequence


ENTRIES = [
    SnapshotEntry(2000, 3, 41, 977, 4, 1_700_000_000_123, -1, -1),
    SnapshotEntry(1000, 0, -1, -1, 0, 1_700_000_000_000, 7, 555),
]


def test_snapshot_layout_matches_kafka_schema(tmp_path: Path) -> None:
    path = tmp_path / snapshot_file_name(1234)
    assert path.name == "00000000000000001234.snapshot"
    size = write_snapshot(path, ENTRIES)
    data = path.read_bytes()
    assert size == len(data) == 10 + 2 * 46
    version, crc, count = struct.unpack_from(">hIi", data, 0)
    assert (version, count) == (1, 2)
    assert crc == crc32c.crc32c(data[6:])  # CRC-32C of everything after the crc field
    # entries sorted by producer id, fields in PRODUCER_SNAPSHOT_ENTRY_SCHEMA order
    assert struct.unpack_from(">qhiqiqiq", data, 10) == (
        1000,
        0,
        -1,
        -1,
        0,
        1_700_000_000_000,
        7,
        555,
    )
    assert read_snapshot(path) == sorted(ENTRIES)


def test_snapshot_crc_mismatch_and_truncation_are_detected(tmp_path: Path) -> None:
    data = bytearray(encode_snapshot(ENTRIES))
    bad = tmp_path / "bad.snapshot"
    data[20] ^= 0x01
    bad.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match="CRC mismatch"):
        read_snapshot(bad)
    short = tmp_path / "short.snapshot"
    short.write_bytes(encode_snapshot(ENTRIES)[:-1])
    with pytest.raises(SnapshotError):
        read_snapshot(short)
    version = tmp_path / "version.snapshot"
    version.write_bytes(b"\x00\x02" + encode_snapshot(ENTRIES)[2:])
    with pytest.raises(SnapshotError, match="version 2"):
        read_snapshot(version)


def test_write_snapshot_never_overwrites(tmp_path: Path) -> None:
    path = tmp_path / snapshot_file_name(10)
    path.write_bytes(b"original")
    with pytest.raises(FileExistsError):
        write_snapshot(path, ENTRIES)
    assert path.read_bytes() == b"original"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left


def test_generated_log_dirs_are_valid(tmp_path: Path) -> None:
    generated = generate_log_dirs(
        str(tmp_path),
        brokers=2,
        topics=1,
        partitions=2,
        segments_per_partition=2,
        batches_per_segment=30,
        seed=3,
    )
    assert parse_partition_dir_name("my-topic-12") == ("my-topic", 12)
    assert parse_partition_dir_name("t-0.abc-delete") is None
    parts = [p for d in generated.log_dirs for p in discover_partitions(d)]
    assert sorted((p.broker, p.topic, p.partition) for p in parts) == [
        ("0", "topic-0", 0),
        ("1", "topic-0", 1),
    ]
    # a single partition folder is accepted too
    assert discover_partitions(parts[0].path) == [parts[0]]
    kinds = set()
    batches = 0
    for part in parts:
        segments = list_segments(part.path)
        assert len(segments) == 2
        next_offset = 0
        for segment in segments:
            assert segment.base_offset == next_offset
            for batch in iter_segment(segment.path):
                h = batch.header
                assert h.base_offset == next_offset
                next_offset = h.base_offset + h.last_offset_delta + 1
                kinds.add((h.producer_id >= 0, h.is_transactional, h.is_control))
                batches += 1
    assert batches == generated.batches == 120
    assert (True, False, False) in kinds  # idempotent
    assert (True, True, False) in kinds  # transactional data
