"""The footprint job: its per-partition fold and small tables on inline inputs (the distinct
counts by real Spark), the per-file parser, an end-to-end run over a generated log dir with one
corrupt file, and the errors raised when nothing could be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from pidgate.pipeline.jobs.footprint import (
    BROKERS_SCHEMA,
    ENTRY_BYTES,
    ERROR_SCHEMA,
    LAST_WRITES_SCHEMA,
    OPEN_TXN_BYTES,
    PARTITIONS_SCHEMA,
    broker_footprint,
    check_read,
    partition_footprint,
    run_footprint,
    top_partitions,
)
from pidgate.pipeline.jobs.footprint_scan import (
    SCAN_ARROW_SCHEMA,
    count_distinct_pids,
    keyed_by_pid,
    parse_segment,
    state_rows,
    summarize_partition,
)
from pidgate.pipeline.reading.inputs import InputError
from pidgate.pipeline.reading.logdirs import broker_name, generate_log_dirs
from pidgate.pipeline.reading.segments import (
    BatchSpec,
    SegmentError,
    read_segment_headers,
    write_segment,
)


def seg_row(
    pid: int,
    last_offset: int,
    last_ts: int,
    max_ts: int | None = None,
    *,
    partition: int = 0,
    broker: str = "b0",
    segment: str = "s0",
    epoch: int = 0,
    txn: bool = False,
    control: bool = False,
) -> tuple[Any, ...]:
    """A parse_segment PID row: one batch of 100 bytes."""
    max_ts = last_ts if max_ts is None else max_ts
    key = ("/d", broker, "t", partition, segment)
    return (*key, pid, epoch, 1, 100, max_ts, last_offset, last_ts, txn, control, None, None)


def tables(
    rows: list[tuple[Any, ...]], expiration_ms: int
) -> tuple[list[tuple[Any, ...]], pd.DataFrame, pd.DataFrame]:
    """What the job computes from PID rows: last writes (as plain tuples, with age and
    active), the partitions table and the brokers table."""
    by_partition: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in rows:
        by_partition.setdefault(row[:4], []).append(row)
    writes: list[tuple[Any, ...]] = []
    scanned: list[tuple[Any, ...]] = []
    for part_rows in by_partition.values():
        # files come in any order: reversed, a later file's rows come first
        part_writes, part_counts = summarize_partition(reversed(part_rows), expiration_ms)
        writes += [tuple(w) for w in part_writes]
        scanned += state_rows(part_writes, part_counts)
    # the distinct count, over the rows split in two tasks by PID as the shuffle does
    keyed = [keyed_by_pid(row) for row in scanned]
    tasks = [[k for k in keyed if (k[0] or 0) % 2 == n] for n in (0, 1)]
    counted = [row for task in tasks for row in count_distinct_pids(task)]
    small = pd.DataFrame(counted, columns=SCAN_ARROW_SCHEMA.names)
    partitions = partition_footprint(small[small["kind"] == "partition"])
    brokers = broker_footprint(partitions, small)
    return sorted(writes), partitions, brokers


def test_empty_input() -> None:
    assert summarize_partition([], 1_000) == ([], None)
    writes, partitions, brokers = tables([], 1_000)
    assert writes == [] and partitions.empty and brokers.empty
    assert list(partitions.columns) == [
        "log_dir",
        "broker",
        "topic",
        "partition",
        "active_pids",
        "estimated_entries",
        "open_transactions",
        "estimated_bytes",
        "snapshot_bytes",
    ]


def test_one_pid() -> None:
    writes, partitions, brokers = tables([seg_row(7, 41, 5_000)], 86_400_000)
    assert [w[:12] for w in writes] == [("/d", "b0", "t", 0, 7, 0, 41, 5_000, False, 1, 100, 5_000)]
    assert partitions.values.tolist() == [["/d", "b0", "t", 0, 1, 1, 0, ENTRY_BYTES, 10 + 46]]
    assert brokers.values.tolist() == [["b0", 1, 1, 1, 0, ENTRY_BYTES]]


def test_out_of_order_timestamps_and_the_expiration_boundary() -> None:
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
    writes, partitions, brokers = tables(rows, 11_000)  # PID 1 is 11_000 ms old
    assert [w[:12] for w in writes] == [
        ("/d", "b0", "t", 0, 1, 1, 20, 1_000, False, 2, 200, 12_000),
        ("/d", "b0", "t", 0, 2, 0, 15, 1_001, False, 1, 100, 12_000),
        ("/d", "b0", "t", 0, 3, 0, 5, 0, True, 1, 100, 12_000),
        ("/d", "b0", "t", 0, 4, 0, 6, 100, False, 1, 100, 12_000),
        ("/d", "b0", "t", 1, 9, 0, 3, 50, False, 1, 100, 50),
    ]
    # active: an age of exactly expiration_ms is expired, as in Kafka's isProducerExpired
    assert [(w[3], w[4], w[12]) for w in writes if w[13]] == [
        (0, 2, 10_999),
        (0, 3, 12_000),
        (1, 9, 0),
    ]
    assert partitions.values.tolist() == [
        ["/d", "b0", "t", 0, 2, 2, 1, 2 * ENTRY_BYTES + OPEN_TXN_BYTES, 10 + 2 * 46],
        ["/d", "b0", "t", 1, 1, 1, 0, ENTRY_BYTES, 10 + 46],
    ]
    top = top_partitions(partitions, 1)
    assert list(zip(top["partition"], top["active_pids"], strict=True)) == [(0, 2)]
    assert brokers[
        ["broker", "estimated_entries", "distinct_pids", "partitions"]
    ].values.tolist() == [["b0", 3, 3, 2]]
    writes, _, _ = tables(rows, 11_001)
    assert [w[13] for w in writes if w[4] == 1] == [True]


def test_brokers_count_a_pid_once_per_partition_and_once_in_distinct() -> None:
    rows = [
        seg_row(5, 1, 1_000, partition=0),
        seg_row(5, 1, 1_000, partition=1),  # the same PID in another partition of b0
        seg_row(6, 2, 1_000, partition=1),
        seg_row(5, 1, 8_000, partition=2, broker="b1"),  # and on another broker
        seg_row(7, 1, 0, partition=2, broker="b1"),
        seg_row(-1, 2, 9_000, partition=2, broker="b1"),  # PID 7 is 9_000 ms old: expired
    ]
    _, partitions, brokers = tables(rows, 5_000)
    assert brokers.values.tolist() == [
        ["b0", 3, 2, 2, 0, 3 * ENTRY_BYTES],
        ["b1", 1, 1, 1, 0, ENTRY_BYTES],
    ]
    assert partitions["active_pids"].tolist() == [1, 2, 1]


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


@pytest.mark.parametrize("executor_writes", [True, False], ids=["executor-writes", "spark-writes"])
def test_end_to_end_on_a_generated_log_dir(
    spark: SparkSession, tmp_path: Path, executor_writes: bool
) -> None:
    """Both ways of writing the big tables (the tasks with pyarrow, or Spark's writers from
    the cache) give the same tables."""
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
    (out / "last_writes.parquet").mkdir(parents=True)  # an earlier run's table is replaced
    (out / "last_writes.parquet" / "part-99999.parquet").write_bytes(b"stale")
    report = run_footprint(
        spark, generated.log_dirs, 86_400_000, str(out), executor_writes=executor_writes
    )
    assert report == out / "report.html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs", "out"]  # no staging left
    html = report.read_text()
    assert "Top partitions" in html and "data:image/png;base64," in html
    assert str(broken) in html  # the damaged file is named in the report
    for name in ("segment_pids", "last_writes", "active_pids", "partitions", "brokers", "errors"):
        assert (out / f"{name}.parquet").is_dir()
    errors = pq.read_table(out / "errors.parquet").to_pylist()
    assert [e["segment"] for e in errors] == [str(broken)]

    # Spark reads every table back with its declared types (the small ones come from pyarrow;
    # Spark reads any Parquet column as nullable)
    for name, schema in [
        ("partitions", PARTITIONS_SCHEMA),
        ("brokers", BROKERS_SCHEMA),
        ("errors", ERROR_SCHEMA),
        ("last_writes", LAST_WRITES_SCHEMA),
    ]:
        read = spark.read.parquet(str(out / f"{name}.parquet")).schema
        assert [(f.name, f.dataType) for f in read] == [(f.name, f.dataType) for f in schema]
    last_writes = spark.read.parquet(str(out / "last_writes.parquet"))

    # every partition is counted, the damaged file up to its damage: compare with a plain pass
    # over the headers
    expected: dict[tuple[str, int], int] = {}
    per_broker: dict[str, tuple[int, set[int]]] = {}
    pairs = 0
    for log_dir in generated.log_dirs:
        for folder in sorted(Path(log_dir).glob("topic-*")):
            last: dict[int, tuple[int, int, bool]] = {}
            newest = -1
            for segment in sorted(folder.glob("*.log")):
                try:
                    for h in read_segment_headers(segment):
                        newest = max(newest, h.max_timestamp)
                        if h.producer_id >= 0:
                            txn_open = h.is_transactional and not h.is_control
                            last[h.producer_id] = (h.max_timestamp, h.base_offset, txn_open)
                except SegmentError:
                    assert segment == broken
            topic, _, part = folder.name.rpartition("-")
            active = {p for p, (ts, _, open_) in last.items() if open_ or newest - ts < 86_400_000}
            pairs += len(last)
            if active:
                expected[(topic, int(part))] = len(active)
                entries, pids = per_broker.get(broker_name(log_dir), (0, set()))
                per_broker[broker_name(log_dir)] = (entries + len(active), pids | active)
    got = {
        (r["topic"], r["partition"]): r["active_pids"]
        for r in pq.read_table(out / "partitions.parquet").to_pylist()
    }
    assert got == expected
    brokers = {
        r["broker"]: (r["estimated_entries"], r["distinct_pids"])
        for r in pq.read_table(out / "brokers.parquet").to_pylist()
    }
    assert brokers == {b: (entries, len(pids)) for b, (entries, pids) in per_broker.items()}
    assert last_writes.count() == pairs
    assert spark.read.parquet(str(out / "active_pids.parquet")).count() == sum(expected.values())


def test_log_dirs_without_segment_files_are_an_error(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "logs" / "topic-0").mkdir(parents=True)
    (tmp_path / "logs" / "topic-0" / "00000000000000000000.index").write_bytes(b"")
    with pytest.raises(InputError, match=r"logs: no segment file .* in 1 partition folders"):
        run_footprint(spark, [str(tmp_path / "logs")], 86_400_000, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_no_readable_batch_is_an_error(spark: SparkSession, tmp_path: Path) -> None:
    generated = generate_log_dirs(
        str(tmp_path / "logs"), brokers=1, topics=1, partitions=2, segments_per_partition=2
    )
    for segment in Path(generated.log_dirs[0]).glob("*/*.log"):
        segment.write_bytes(segment.read_bytes()[:30])
    with pytest.raises(InputError) as raised:
        run_footprint(spark, generated.log_dirs, 86_400_000, str(tmp_path / "out"))
    message = str(raised.value)
    assert message.startswith(f"--log-dirs {generated.log_dirs[0]}: 4 segment files, none")
    assert "(0 unreadable, 4 damaged, 0 empty)" in message
    assert "truncated batch" in message
    assert not (tmp_path / "out").exists()


def test_files_the_executors_cannot_open_are_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "topic-0" / "00000000000000000000.log")
    rows = parse_segment(("/d", "b0", "topic", 0, missing))
    assert len(rows) == 1 and rows[0][5] is None and rows[0][14] is None
    assert rows[0][15].startswith("cannot read: ")
    columns = ["log_dir", "broker", "topic", "partition", "segment", "batches", "bytes"]
    files = pd.DataFrame(
        [rows[0][:5] + rows[0][7:9] + rows[0][14:]], columns=[*columns, "byte_position", "error"]
    )
    with pytest.raises(InputError) as raised:
        check_read(["/d"], files)
    message = str(raised.value)
    assert "1 segment files, none with a readable batch (1 unreadable, 0 damaged" in message
    assert missing in message and "every executor must see the log dirs" in message
