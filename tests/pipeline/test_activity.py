"""activity transforms on small inline event logs (assertDataFrameEqual)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from pidgate.pipeline.activity import hourly_activity, rate_rule, recommend_rates, top_offenders
from pidgate.pipeline.events import EVENT_SCHEMA

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
