"""activity transforms on small inline event logs (assertDataFrameEqual)."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from pidgate.pipeline.jobs.activity_hourly import (
    hourly_activity,
    hourly_from_facts,
    hourly_with_clients,
    top_offenders,
)
from pidgate.pipeline.jobs.activity_rates import rate_rule, recommend_rates
from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
from pidgate.pipeline.reading.eventfacts import event_facts, file_splits, read_split
from pidgate.pipeline.reading.events import EVENT_SCHEMA, read_events_marked

H0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000

HOURLY_SCHEMA = (
    "principal string, hour timestamp, new_pids bigint, rejected_pids bigint, "
    "rejected_requests bigint, demanded_pids bigint, init_producer_ids bigint, "
    "throttle_ms_max bigint"
)


def ev(
    ts_ms: int,
    event: str,
    principal: str,
    pid: int,
    request_id: int | None = None,
    *,
    partition: int = 0,
    instance: str = "p0",
    throttle_ms: int | None = None,
) -> tuple[Any, ...]:
    values: dict[str, Any] = {name: None for name in EVENT_SCHEMA.fieldNames()}
    values.update(
        ts_ms=ts_ms,
        event=event,
        principal=principal,
        producer_id=pid,
        producer_epoch=0,
        topic="t",
        partition=partition,
        instance=instance,
        request_id=request_id,
        throttle_ms=throttle_ms,
        transactional=False if event == "init_producer_id" else None,
    )
    return tuple(values[name] for name in EVENT_SCHEMA.fieldNames())


def events_df(spark: SparkSession, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, EVENT_SCHEMA)


def hour(n: int) -> datetime:
    return datetime.fromtimestamp((H0 + n * HOUR) / 1000, tz=UTC)


def test_hourly_activity(spark: SparkSession) -> None:
    rows = [
        # out of order on purpose; hour 1 first
        ev(H0 + HOUR + 5, "admitted_new", "User:a", 3, 10),
        ev(H0 + 10, "init_producer_id", "User:a", 1, 1),
        ev(H0 + 20, "admitted_new", "User:a", 1, 2, partition=0),
        ev(H0 + 20, "admitted_new", "User:a", 1, 2, partition=1),  # same PID, 2nd partition
        ev(H0 + 30, "rejected", "User:a", 2, 3, throttle_ms=900),
        ev(H0 + 40, "rejected", "User:a", 2, 4, throttle_ms=800),  # retry: new request
        ev(H0 + 50, "rejected", "User:a", 2, 4, instance="p1", throttle_ms=10),  # other proxy
        ev(H0 + 60, "admitted_new", "User:a", 2, 5),
        ev(H0 + 7, "admitted_new", "User:b", 9, 1),  # a principal with one event
        ev(H0 + 8, "something_else", "User:c", 9, 1),  # unknown event types are ignored
    ]
    expected = spark.createDataFrame(
        [
            ("User:a", hour(0), 2, 1, 3, 2, 1, 900),
            ("User:a", hour(1), 1, 0, 0, 1, 0, None),
            ("User:b", hour(0), 1, 0, 0, 1, 0, None),
        ],
        HOURLY_SCHEMA,
    )
    assertDataFrameEqual(hourly_activity(events_df(spark, rows)), expected)


def test_empty_input(spark: SparkSession) -> None:
    hourly = hourly_activity(events_df(spark, []))
    assertDataFrameEqual(hourly, spark.createDataFrame([], HOURLY_SCHEMA))
    assert top_offenders(hourly, 5).count() == 0
    assert recommend_rates(hourly).count() == 0


def test_top_offenders_and_recommendations(spark: SparkSession) -> None:
    hourly = spark.createDataFrame(
        [
            ("User:a", hour(0), 10, 0, 0, 10, 10, None),
            ("User:a", hour(1), 30, 5, 2, 40, 40, 100),
            ("User:a", hour(2), 20, 0, 0, 20, 20, None),
            ("User:b", hour(0), 0, 1, 1, 1, 0, 5),  # only rejections: demand 1
            ("User:c", hour(5), 2, 0, 0, 2, 2, None),  # one hour
        ],
        HOURLY_SCHEMA,
    )
    assertDataFrameEqual(
        top_offenders(hourly, 2),
        spark.createDataFrame(
            [("User:a", 60, 30, 5, 2, 70, 3), ("User:c", 2, 2, 0, 0, 2, 1)],
            "principal string, new_pids bigint, peak_hourly_new_pids bigint, "
            "rejected_pids bigint, rejected_requests bigint, init_producer_ids bigint, "
            "active_hours bigint",
        ),
        checkRowOrder=True,
    )
    # p50 of a's demand [10, 40, 20] = 20 -> 20 x 1.5 = 30; b: max(1, ceil(1 x 1.5)) = 2
    assertDataFrameEqual(
        recommend_rates(hourly, percentile=0.5, headroom=1.5),
        spark.createDataFrame(
            [("User:a", 3, 40, 20.0, 30), ("User:c", 1, 2, 2.0, 3), ("User:b", 1, 1, 1.0, 2)],
            "principal string, active_hours bigint, peak_hourly_demand bigint, "
            "percentile_hourly_demand double, recommended_producer_ids_rate bigint",
        ),
        checkRowOrder=True,
    )
    assert "p99" in rate_rule() and "1.5" in rate_rule()
    with pytest.raises(ValueError):
        recommend_rates(hourly, percentile=2.0)


# -- the job's fast path (eventfacts) against the reference transform ----------------------

ODD_LINES = [
    "",  # blank: skipped, as Spark skips it
    "   ",
    '{"ts_ms": 1767225600500, "event": "admitted_new", "principal": "User:odd", "client_id": 7}',
    '{"ts_ms": 1767225600.5, "event": "admitted_new", "principal": "User:odd"}',  # float ts: bad
    "[1, 2, 3]",  # not an object: bad
    '{"event": "admitted_new", "principal": "User:odd"}',  # no ts_ms: bad
    '{"ts_ms": "1767225600000", "event": "rejected", "principal": "User:odd"}',  # string ts: bad
    '{"ts_ms": 1767225600000, "event": "admitted_new", "principal": "User:odd", "x": {"y": 1}}',
    '{"ts_ms": 1767225600000, "event": "admitted_new", "principal": "trunc',  # truncated: bad
]


def write_odd_log(directory: Path) -> None:
    generate_events(directory, GeneratorConfig(events=6000, seed=3, bad_line_every=700))
    (directory / "odd.jsonl").write_text("\n".join(ODD_LINES) + "\n")
    observed = Path(__file__).parents[1] / "data" / "observe_events.jsonl"
    with gzip.open(directory / "observed.jsonl.gz", "wt") as out:
        out.write(observed.read_text())


def reference_hourly(spark: SparkSession, paths: list[str]) -> DataFrame:
    marked = read_events_marked(spark, paths)
    return hourly_with_clients(marked, keep_bad=True).select(*FACT_COLUMNS)


FACT_COLUMNS = (
    "bad",
    "principal",
    "hour",
    "new_pids",
    "rejected_pids",
    "rejected_requests",
    "demanded_pids",
    "init_producer_ids",
    "throttle_ms_max",
    "would_reject_pids",
    "would_reject_requests",
    "refused_pids",
    "clients",
    "events",
    "first_ts_ms",
    "last_ts_ms",
)


@pytest.mark.parametrize(
    ("local", "driver_bytes"),
    [(True, 1 << 30), (True, 0), (False, 0)],
    ids=["driver-reads-files", "python-workers-read-files", "spark-text"],
)
def test_the_fast_path_counts_what_the_reference_counts(
    spark: SparkSession, tmp_path: Path, local: bool, driver_bytes: int
) -> None:
    """Generated events with bad lines, odd lines (blank, wrong types, not an object, a number
    in a string field) and a gzip file of observe-mode events: the facts give exactly the
    hourly rows, bad-line count included, of Spark's JSON reader and countDistinct."""
    write_odd_log(tmp_path / "ev")
    paths = sorted(str(p) for p in (tmp_path / "ev").iterdir())
    facts = event_facts(spark, paths, local=local, driver_bytes=driver_bytes)
    fast = hourly_from_facts(facts).select(*FACT_COLUMNS)
    reference = reference_hourly(spark, paths)
    assertDataFrameEqual(fast.filter("not bad"), reference.filter("not bad"))
    [fast_bad] = fast.filter("bad").collect()
    [reference_bad] = reference.filter("bad").collect()
    assert fast_bad["events"] == reference_bad["events"] == 8 + 5  # 6000 / 700 + 5 odd ones


def test_a_small_split_size_changes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """Files cut into many byte ranges (lines across the cuts) count the same as whole."""
    write_odd_log(tmp_path / "ev")
    paths = sorted(str(p) for p in (tmp_path / "ev").iterdir())
    whole = b"".join(read_split(p, 0, -1) for p in paths)
    pieces = b"".join(read_split(*split) for split in file_splits(paths, split_bytes=997))
    assert sorted(whole.splitlines()) == sorted(pieces.splitlines())
