"""The footprint job: its transforms on small inline inputs (assertDataFrameEqual), the
per-file parser, and an end-to-end run over a generated log dir with one corrupt file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from pidgate.pipeline.footprint import (
    ENTRY_BYTES,
    OPEN_TXN_BYTES,
    SEGMENT_PIDS_SCHEMA,
    active_pids,
    broker_footprint,
    last_write_per_pid,
    parse_segment,
    partition_footprint,
    run_footprint,
    top_partitions,
)
from pidgate.pipeline.logdirs import generate_log_dirs
from pidgate.pipeline.segments import BatchSpec, read_segment_headers, write_segment

LAST_WRITES_DDL = (
    "log_dir string, broker string, topic string, partition int, producer_id long, "
    "producer_epoch int, last_offset long, last_timestamp long, txn_open boolean, "
    "batches long, bytes long, partition_newest_timestamp long"
)
PARTITIONS_DDL = (
    "log_dir string, broker string, topic string, partition int, active_pids long, "
    "estimated_entries long, open_transactions long, estimated_bytes long, snapshot_bytes long"
)


def seg_row(
    pid: int,
    last_offset: int,
    last_ts: int,
    max_ts: int | None = None,
    *,
    partition: int = 0,
    segment: str = "s0",
    epoch: int = 0,
    txn: bool = False,
    control: bool = False,
) -> tuple[Any, ...]:
    max_ts = last_ts if max_ts is None else max_ts
    return (
        "/d",
        "b0",
        "t",
        partition,
        segment,
        pid,
        epoch,
        1,
        100,
        max_ts,
        last_offset,
        last_ts,
        txn,
        control,
    )


def frame(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, SEGMENT_PIDS_SCHEMA)


def test_empty_input(spark: SparkSession) -> None:
    last = last_write_per_pid(frame(spark, []))
    assertDataFrameEqual(last, spark.createDataFrame([], LAST_WRITES_DDL))
    parts = partition_footprint(active_pids(last, 1_000))
    assertDataFrameEqual(parts, spark.createDataFrame([], PARTITIONS_DDL))
    assert broker_footprint(active_pids(last, 1_000)).count() == 0


def test_one_pid(spark: SparkSession) -> None:
    last = last_write_per_pid(frame(spark, [seg_row(7, 41, 5_000)]))
    assertDataFrameEqual(
        last,
        spark.createDataFrame(
            [("/d", "b0", "t", 0, 7, 0, 41, 5_000, False, 1, 100, 5_000)], LAST_WRITES_DDL
        ),
    )
    parts = partition_footprint(active_pids(last, 86_400_000))
    assertDataFrameEqual(
        parts,
        spark.createDataFrame(
            [("/d", "b0", "t", 0, 1, 1, 0, ENTRY_BYTES, 10 + 46)], PARTITIONS_DDL
        ),
    )


def test_out_of_order_timestamps_and_the_expiration_boundary(spark: SparkSession) -> None:
    rows = [
        # PID 1: an earlier segment holds its highest timestamp, its LAST batch (offset 20) an
        # older one; Kafka keys expiry on the last batch's timestamp: 1_000.
        seg_row(1, 10, 5_000, 9_000, segment="s0"),
        seg_row(1, 20, 1_000, 1_000, segment="s1", epoch=1),
        seg_row(2, 15, 1_001, segment="s1"),  # age 10_999: active
        seg_row(3, 5, 0, segment="s0", txn=True),  # transaction open: never expires
        seg_row(4, 6, 100, segment="s0", txn=True, control=True),  # committed, old: expired
        seg_row(-1, 30, 12_000, segment="s1"),  # no PID, but it sets the partition's newest
        seg_row(9, 3, 50, partition=1),  # another partition, its own clock: active
    ]
    last = last_write_per_pid(frame(spark, rows))
    assertDataFrameEqual(
        last,
        spark.createDataFrame(
            [
                ("/d", "b0", "t", 0, 1, 1, 20, 1_000, False, 2, 200, 12_000),
                ("/d", "b0", "t", 0, 2, 0, 15, 1_001, False, 1, 100, 12_000),
                ("/d", "b0", "t", 0, 3, 0, 5, 0, True, 1, 100, 12_000),
                ("/d", "b0", "t", 0, 4, 0, 6, 100, False, 1, 100, 12_000),
                ("/d", "b0", "t", 1, 9, 0, 3, 50, False, 1, 100, 50),
            ],
            LAST_WRITES_DDL,
        ),
    )
    active = active_pids(last, 11_000)  # PID 1 is exactly 11_000 ms old: expired
    assert sorted((r.partition, r.producer_id, r.age_ms) for r in active.collect()) == [
        (0, 2, 10_999),
        (0, 3, 12_000),
        (1, 9, 0),
    ]
    parts = partition_footprint(active)
    assertDataFrameEqual(
        parts,
        spark.createDataFrame(
            [
                ("/d", "b0", "t", 0, 2, 2, 1, 2 * ENTRY_BYTES + OPEN_TXN_BYTES, 10 + 2 * 46),
                ("/d", "b0", "t", 1, 1, 1, 0, ENTRY_BYTES, 10 + 46),
            ],
            PARTITIONS_DDL,
        ),
    )
    top = top_partitions(parts, 1).collect()
    assert [(r.partition, r.active_pids) for r in top] == [(0, 2)]
    brokers = broker_footprint(active).collect()
    assert [(r.broker, r.estimated_entries, r.distinct_pids, r.partitions) for r in brokers] == [
        ("b0", 3, 3, 2)
    ]
    assert active_pids(last, 11_001).where("producer_id = 1").count() == 1


def test_parse_segment_reports_a_damaged_file_and_keeps_its_good_batches(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    write_segment(
        path,
        [
            BatchSpec(0, 1_000, [b"a"], producer_id=5, producer_epoch=0, base_sequence=0),
            BatchSpec(1, 3_000, [b"b"], producer_id=5, producer_epoch=0, base_sequence=1),
            BatchSpec(2, 2_000, [b"c"]),
        ],
    )
    path.write_bytes(path.read_bytes()[:-3])  # truncate the last batch
    rows = parse_segment(("/d", "b0", "t", 0, str(path)))
    assert rows[0][:14] == (
        "/d",
        "b0",
        "t",
        0,
        str(path),
        5,
        0,
        2,
        138,
        3_000,
        1,
        3_000,
        False,
        False,
    )
    error = rows[-1]
    assert error[5] is None and error[14] == 138
    assert "truncated batch at base offset 2" in error[15]


def test_end_to_end_on_a_generated_log_dir(spark: SparkSession, tmp_path: Path) -> None:
    generated = generate_log_dirs(
        str(tmp_path / "logs"),
        brokers=2,
        topics=2,
        partitions=2,
        segments_per_partition=2,
        batches_per_segment=40,
        seed=5,
    )
    broken = sorted((Path(generated.log_dirs[1]) / "topic-0-1").glob("*.log"))[-1]
    broken.write_bytes(broken.read_bytes()[:-10])
    out = tmp_path / "out"
    report = run_footprint(spark, generated.log_dirs, 86_400_000, str(out))
    assert report == out / "report.html"
    html = report.read_text()
    assert "Top partitions" in html and "data:image/png;base64," in html
    assert str(broken) in html  # the damaged file is named in the report
    for name in ("segment_pids", "last_writes", "active_pids", "partitions", "brokers", "errors"):
        assert (out / f"{name}.parquet").is_dir()
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert [e["segment"] for e in errors] == [str(broken)]

    # the other partitions are counted in full: compare with a plain pass over the headers
    expected: dict[tuple[str, int], int] = {}
    for log_dir in generated.log_dirs:
        for folder in sorted(Path(log_dir).glob("topic-*")):
            last: dict[int, tuple[int, int, bool]] = {}
            newest = -1
            for segment in sorted(folder.glob("*.log")):
                if segment == broken:
                    continue
                for h in read_segment_headers(segment):
                    newest = max(newest, h.max_timestamp)
                    if h.producer_id >= 0:
                        txn_open = h.is_transactional and not h.is_control
                        last[h.producer_id] = (h.max_timestamp, h.base_offset, txn_open)
            topic, _, part = folder.name.rpartition("-")
            n = sum(1 for ts, _, open_ in last.values() if open_ or newest - ts < 86_400_000)
            if n and folder != broken.parent:
                expected[(topic, int(part))] = n
    got = {
        (r["topic"], r["partition"]): r["active_pids"]
        for r in pq.read_table(out / "partitions.parquet").to_pylist()
        if (r["topic"], r["partition"]) != ("topic-0", 1)
    }
    assert got == expected
