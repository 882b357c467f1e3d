"""The snapshots job: rebuilt snapshot files, read back with our reader, equal field by field a
plain replay written here independently (over the specs we wrote, or over kafka-python's decode
of generated segments); existing snapshots are never overwritten; a corrupt segment stops only
its own partition, past the damage."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

from kafka.record.memory_records import MemoryRecords
from pyspark.sql import SparkSession

from pidgate.pipeline.jobs.snapshots import run_snapshots
from pidgate.pipeline.reading.logdirs import discover_partitions, generate_log_dirs, list_segments
from pidgate.pipeline.reading.segments import (
    BatchSpec,
    ControlMarker,
    SnapshotEntry,
    read_snapshot,
    segment_file_name,
    snapshot_file_name,
    write_segment,
)

EXPIRATION_MS = 10_000

SEGMENTS: list[list[BatchSpec]] = [
    [  # base 0
        BatchSpec(0, 1_000, [b"a", b"b"], producer_id=100, producer_epoch=0, base_sequence=0),
        BatchSpec(
            2, 1_500, [b"t"], producer_id=200, producer_epoch=0, base_sequence=0, transactional=True
        ),  # opens a transaction at offset 2
        BatchSpec(3, 1_600, [b"plain"]),
        BatchSpec(4, 2_001, [b"c"], producer_id=300, producer_epoch=0, base_sequence=0),
    ],
    [  # base 5
        BatchSpec(
            5, 1_900, [b"t"], producer_id=200, producer_epoch=0, base_sequence=1, transactional=True
        ),
        BatchSpec(6, 2_000, producer_id=200, producer_epoch=0, marker=ControlMarker(True, 3)),
        # record timestamps out of order: max_timestamp 12_000 from the second record
        BatchSpec(
            7,
            3_000,
            [b"x", b"y", b"z"],
            [0, 9_000, 5],
            producer_id=100,
            producer_epoch=0,
            base_sequence=2,
        ),
        BatchSpec(
            10,
            4_000,
            [b"t"],
            producer_id=400,
            producer_epoch=2,
            base_sequence=0,
            transactional=True,
        ),  # left open to the end
    ],
    [  # base 11
        BatchSpec(
            11,
            13_000,
            [b"t"],
            producer_id=200,
            producer_epoch=0,
            base_sequence=2,
            transactional=True,
        ),
        # the abort comes with an epoch bump: the retained batch metadata is cleared
        BatchSpec(12, 13_100, producer_id=200, producer_epoch=1, marker=ControlMarker(False, 4)),
        BatchSpec(13, 2_500, [b"d"], producer_id=300, producer_epoch=0, base_sequence=1),
        BatchSpec(
            14, 16_999, [b"e"], producer_id=500, producer_epoch=0, base_sequence=2**31 - 1
        ),  # sequence wraps: last_sequence stays 2**31-1
    ],
    [  # base 15: the active segment (no snapshot expected for it)
        BatchSpec(15, 20_000, [b"f"], producer_id=100, producer_epoch=0, base_sequence=5),
    ],
]


def _spec_batch(spec: BatchSpec) -> dict[str, Any]:
    marker = spec.marker
    return {
        "base_offset": spec.base_offset,
        "delta": spec.last_offset_delta,
        "max_ts": spec.max_timestamp,
        "pid": spec.producer_id,
        "epoch": spec.producer_epoch,
        "seq": spec.base_sequence,
        "txn": spec.transactional or marker is not None,
        "marker": None if marker is None else (marker.coordinator_epoch, spec.base_timestamp),
    }


def _kafka_python_batches(path: str) -> list[dict[str, Any]]:
    out = []
    records = MemoryRecords(Path(path).read_bytes())
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        recs = list(batch)
        marker = None
        if batch.is_control_batch:
            _version, epoch = struct.unpack(">hi", recs[0].value)
            marker = (epoch, recs[0].timestamp)
        out.append(
            {
                "base_offset": batch.base_offset,
                "delta": recs[-1].offset - batch.base_offset,
                "max_ts": batch.max_timestamp,
                "pid": batch.producer_id,
                "epoch": batch.producer_epoch,
                "seq": batch.base_sequence,
                "txn": batch.is_transactional,
                "marker": marker,
            }
        )
    return out


def plain_replay(
    batches: list[dict[str, Any]], upto: int, expiration_ms: int
) -> list[SnapshotEntry]:
    """What a snapshot at ``upto`` should hold, by the rules of Kafka's ProducerAppendInfo."""
    state: dict[int, dict[str, int]] = {}
    now = -1
    for b in batches:
        if b["base_offset"] >= upto:
            break
        now = max(now, b["max_ts"])
        if b["pid"] < 0:
            continue
        s = state.setdefault(
            b["pid"],
            {"epoch": -1, "seq": -1, "off": -1, "delta": 0, "ts": -1, "coord": -1, "txn": -1},
        )
        if s["epoch"] != b["epoch"]:
            s.update(epoch=b["epoch"], seq=-1, off=-1, delta=0)
        if b["marker"] is not None:
            s.update(coord=b["marker"][0], ts=b["marker"][1], txn=-1)
            continue
        seq = b["seq"] + b["delta"]
        if seq > 2**31 - 1:
            seq -= 2**31
        s.update(seq=seq, off=b["base_offset"] + b["delta"], delta=b["delta"], ts=b["max_ts"])
        if b["txn"] and s["txn"] == -1:
            s["txn"] = b["base_offset"]
    return sorted(
        SnapshotEntry(
            pid, s["epoch"], s["seq"], s["off"], s["delta"], s["ts"], s["coord"], s["txn"]
        )
        for pid, s in state.items()
        if s["txn"] != -1 or now - s["ts"] < expiration_ms
    )


def _write_partition(folder: Path) -> None:
    folder.mkdir(parents=True)
    for specs in SEGMENTS:
        write_segment(folder / segment_file_name(specs[0].base_offset), specs)


def test_rebuilt_snapshots_match_a_plain_replay(spark: SparkSession, tmp_path: Path) -> None:
    log_dir = tmp_path / "broker-0"
    clean, corrupt, existing = (log_dir / f"t-{i}" for i in range(3))
    for folder in (clean, corrupt, existing):
        _write_partition(folder)
    # t-1: flip a byte inside segment 5's first record: snapshots 11 and 15 cannot be rebuilt
    seg = corrupt / segment_file_name(5)
    data = bytearray(seg.read_bytes())
    data[65] ^= 0xFF
    seg.write_bytes(bytes(data))
    # t-2: snapshot 11 exists already and must stay untouched
    (existing / snapshot_file_name(11)).write_bytes(b"kept as is")

    before = sorted(p.name for p in log_dir.rglob("*"))
    assert run_snapshots(spark, str(log_dir), EXPIRATION_MS, dry_run=True) == 3 + 1 + 2
    assert sorted(p.name for p in log_dir.rglob("*")) == before  # dry run writes nothing

    out = tmp_path / "report"
    assert run_snapshots(spark, str(log_dir), EXPIRATION_MS, False, output=str(out)) == 6
    assert (out / "report.html").is_file() and (out / "snapshots.parquet").is_dir()

    batches = [_spec_batch(spec) for specs in SEGMENTS for spec in specs]
    for offset in (5, 11, 15):
        expected = plain_replay(batches, offset, EXPIRATION_MS)
        assert read_snapshot(clean / snapshot_file_name(offset)) == expected
    # spot checks of the rules themselves
    at11 = {e.producer_id: e for e in read_snapshot(clean / snapshot_file_name(11))}
    assert 200 not in at11  # its last write (commit at 2_000) is exactly 10_000 ms old: expired
    assert at11[300].timestamp == 2_001  # 9_999 ms old: kept
    assert at11[400].current_txn_first_offset == 10
    at15 = {e.producer_id: e for e in read_snapshot(clean / snapshot_file_name(15))}
    assert at15[200] == SnapshotEntry(200, 1, -1, -1, 0, 13_100, 4, -1)  # abort + epoch bump
    assert at15[400].current_txn_first_offset == 10  # 12_999 ms old but open: never expires
    assert 300 not in at15  # its last batch carries an old timestamp (2_500)
    assert at15[500].last_sequence == 2**31 - 1

    assert read_snapshot(corrupt / snapshot_file_name(5)) == plain_replay(batches, 5, EXPIRATION_MS)
    assert not (corrupt / snapshot_file_name(11)).exists()
    assert not (corrupt / snapshot_file_name(15)).exists()
    assert (existing / snapshot_file_name(11)).read_bytes() == b"kept as is"
    assert read_snapshot(existing / snapshot_file_name(15)) == plain_replay(
        batches, 15, EXPIRATION_MS
    )
    # nothing left to do: a second run writes nothing
    assert run_snapshots(spark, str(log_dir), EXPIRATION_MS, False) == 0


def test_generated_log_dir_snapshots_match_kafka_python_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    generated = generate_log_dirs(
        str(tmp_path),
        brokers=1,
        topics=2,
        partitions=2,
        segments_per_partition=4,
        batches_per_segment=60,
        transactional_producers=10,
        seed=11,
    )
    expiration = 86_400_000
    written = run_snapshots(spark, generated.log_dirs[0], expiration, False)
    assert written == 4 * 3
    for part in discover_partitions(generated.log_dirs[0]):
        segments = list_segments(part.path)
        batches = [b for s in segments for b in _kafka_python_batches(s.path)]
        assert any(b["marker"] for b in batches)
        for segment in segments[1:]:
            snapshot = Path(part.path) / snapshot_file_name(segment.base_offset)
            expected = plain_replay(batches, segment.base_offset, expiration)
            assert read_snapshot(snapshot) == expected
    shutil.rmtree(tmp_path)
