"""The activity job's one-shuffle Arrow reduce (activity_parts) gives exactly what the Spark
transforms give from merged facts: hourly rows, PID fates and chart buckets."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from pidgate.pipeline.jobs.activity_hourly import bucketed_counts, hourly_from_facts, pid_fates
from pidgate.pipeline.jobs.activity_parts import (
    FATES,
    HOURLY,
    POINTS,
    activity_parts,
    buckets_from_parts,
    fact_homes,
    fates_from_parts,
    hourly_from_parts,
    pack_facts,
    packing,
    reduce_facts,
)
from pidgate.pipeline.outputs.timebuckets import BUCKETS, choose_bucket
from pidgate.pipeline.reading.eventfacts import (
    FACT_KEYS,
    PID,
    REJECTED_REQUEST,
    event_facts,
    event_facts_source,
    facts_of_lines,
    merge_facts,
)
from tests.pipeline.jobs.test_activity import FACT_COLUMNS, write_odd_log


@pytest.mark.parametrize(
    ("local", "driver_bytes", "partitions"),
    [(True, 1 << 30, 1), (True, 0, 1), (True, 0, 7), (False, 0, 5)],
    ids=["driver-reduces", "one-task", "seven-tasks", "spark-text-five-tasks"],
)
def test_the_parts_give_what_the_merged_facts_give(
    spark: SparkSession, tmp_path: Path, local: bool, driver_bytes: int, partitions: int
) -> None:
    """Generated events with bad and odd lines plus observe mode's would-be rejections: the
    hourly rows, every principal's PID fates and the chart buckets (for the report's bucket
    and every coarser one) equal the reference transforms' over Spark-merged facts, however
    many tasks the facts are spread over."""
    write_odd_log(tmp_path / "ev")
    paths = sorted(str(p) for p in (tmp_path / "ev").iterdir())
    kwargs = {"local": local, "driver_bytes": driver_bytes}
    facts = event_facts(spark, paths, **kwargs).cache()
    source = event_facts_source(spark, paths, packing=packing(partitions), **kwargs)
    assert isinstance(source, pa.Table) == (driver_bytes > 0)
    parts = activity_parts(spark, source, partitions).cache()

    hourly = hourly_from_parts(parts).select(*FACT_COLUMNS)
    assertDataFrameEqual(hourly, hourly_from_facts(facts).select(*FACT_COLUMNS))
    [bad] = hourly.filter("bad").collect()
    assert bad["events"] == 8 + 5  # the odd log's bad lines: counted, not lost in the reduce

    fates = fates_from_parts(parts)
    assertDataFrameEqual(fates, pid_fates(facts))
    assert fates.filter("would_reject_pids > 0").count() > 0  # the observe-mode file counted
    assert fates.filter("admitted_after_rejection > 0").count() > 0

    first, last = hourly.filter("not bad").agg({"first_ts_ms": "min", "last_ts_ms": "max"}).first()
    report_bucket_s, _ = choose_bucket(first, last)
    principals = [r["principal"] for r in fates.select("principal").collect()]
    for bucket_s, _name in BUCKETS:
        if bucket_s < report_bucket_s:
            continue
        assertDataFrameEqual(
            buckets_from_parts(parts, bucket_s, principals),
            bucketed_counts(facts, bucket_s, principals),
        )
    parts.unpersist()
    facts.unpersist()


def _facts(lines: list[str]) -> pa.Table:
    return facts_of_lines(("\n".join(lines) + "\n").encode())


def test_one_task_merges_facts_of_one_key_from_two_splits() -> None:
    """A PID new in one split and rejected in the next (same principal and hour) is one fact:
    one demanded PID, admitted after waiting; a second split's stats add up."""
    base = (
        '{"ts_ms":%d,"event":"%s","principal":"User:a","producer_id":7,'
        '"instance":"i","request_id":%d%s}'
    )
    split_1 = _facts([base % (1_767_225_600_500, "rejected", 1, ',"throttle_ms":900')])
    split_2 = _facts([base % (1_767_225_601_000, "admitted_new", 2, "")])
    both = pa.concat_tables([split_1, split_2])
    assert merge_facts(both).num_rows < both.num_rows
    keys = merge_facts(both).select(list(FACT_KEYS)).to_pylist()
    assert len(keys) == len({tuple(k.values()) for k in keys})

    parts = reduce_facts(both).to_pylist()
    [hourly] = [p for p in parts if p["part"] == HOURLY]
    assert hourly["principal"] == "User:a" and hourly["hour_s"] == 1_767_225_600
    assert (hourly["new_pids"], hourly["rejected_pids"], hourly["demanded_pids"]) == (1, 1, 1)
    assert (hourly["rejected_requests"], hourly["events"], hourly["throttle_ms_max"]) == (1, 2, 900)
    [fates] = [p for p in parts if p["part"] == FATES]
    assert (fates["admitted_at_once"], fates["admitted_after_rejection"]) == (0, 1)
    points = sorted((p["bucket"], p["kind"], p["count"]) for p in parts if p["part"] == POINTS)
    # a 0.5 s period: 1 s buckets; the rejection in second 0, the new PID at .000 of second 1
    assert points == [(1_767_225_600, REJECTED_REQUEST, 1), (1_767_225_601, PID, 1)]


def test_a_task_without_facts_gives_no_parts() -> None:
    assert reduce_facts(_facts([])).num_rows == 0


def test_every_fact_of_a_key_gets_one_home_and_packing_loses_none(tmp_path: Path) -> None:
    """Facts of one (principal, PID), and other facts of one (principal, hour), share a home
    whatever split they come from; packed and unpacked, the facts are the same rows."""
    write_odd_log(tmp_path / "ev")
    data = b"".join(p.read_bytes() for p in sorted((tmp_path / "ev").glob("*.jsonl")))
    facts = facts_of_lines(data)
    homes = fact_homes(facts, 13)
    assert set(homes.tolist()) == set(range(13))  # spread over every home
    rows = facts.to_pylist()
    home_of: dict[tuple[object, ...], int] = {}
    for row, home in zip(rows, homes.tolist(), strict=True):
        key = (
            (row["principal"], row["pid"])
            if row["kind"] == PID
            else (row["principal"], row["hour_s"])
        )
        assert home_of.setdefault(key, home) == home
    halves = [facts.slice(0, facts.num_rows // 2), facts.slice(facts.num_rows // 2)]
    for half in halves:  # the same key in two splits: the same home
        for row, home in zip(half.to_pylist(), fact_homes(half, 13).tolist(), strict=True):
            key = (
                (row["principal"], row["pid"])
                if row["kind"] == PID
                else (row["principal"], row["hour_s"])
            )
            assert home_of[key] == home
    packed = pack_facts(13)(facts)
    assert sorted(packed["home"].to_pylist()) == sorted(set(homes.tolist()))
    unpacked = pa.concat_tables(
        pa.ipc.open_stream(blob.as_buffer()).read_all() for blob in packed["facts"]
    )
    key = [(name, "ascending") for name in ("kind", "principal", "hour_s", "pid", "key")]
    assert unpacked.sort_by(key).equals(facts.cast(unpacked.schema).sort_by(key))
