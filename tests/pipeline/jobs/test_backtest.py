"""The backtest replays the event log through pidgate's own QuotaManager.

Parity: on a log recorded from a throttling run, replaying with the same quota config reproduces
every decision (admitted vs rejected per request). The logs here are recorded by
:mod:`pidgate.pipeline.jobs.generate`, which drives the real QuotaManager the way the proxy does; a
log recorded from the real proxy is checked the same way when the lead drops it in
``tests/pipeline/data/recorded_events.jsonl`` (with the config it ran under in
``tests/pipeline/data/recorded_quota.yaml``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from pidgate.pipeline.jobs.backtest import (
    DECISION_SCHEMA,
    backtest_hourly,
    bloom_accuracy,
    load_policy,
    replay_requests,
)
from pidgate.pipeline.jobs.generate import GeneratorConfig, default_policy, generate_events
from pidgate.pipeline.reading.events import read_events
from pidgate.quota import QuotaPolicy

from .test_activity import H0, ev, events_df

DATA = Path(__file__).parents[1] / "data"
RECORDED_LOG = DATA / "recorded_events.jsonl"
RECORDED_QUOTA = DATA / "recorded_quota.yaml"

QUOTA_YAML = """\
quota:
  users:
    "<default>": {producer_ids_rate: 200}
    app-00: {producer_ids_rate: 1000}
    app-01: {producer_ids_rate: 500}
"""


def assert_parity(
    spark: SparkSession, events_path: str, policy: QuotaPolicy, per_instance: bool
) -> int:
    """Every request is decided as recorded; returns how many rejected requests were checked."""
    decisions = replay_requests(read_events(spark, events_path), policy, per_instance).cache()
    mismatches = decisions.filter(F.col("recorded") != F.col("replayed")).limit(5).collect()
    assert not mismatches, f"replay differs from the record: {mismatches}"
    # Rejections carry the same throttle time as the proxy answered with.
    throttles = decisions.filter(
        (F.col("recorded") == "rejected")
        & (F.col("recorded_throttle_ms") != F.col("replayed_throttle_ms"))
    ).count()
    assert throttles == 0
    # Admitted requests activate exactly the PIDs the proxy logged as new.
    assert decisions.filter(F.col("recorded_new_pids") != F.col("replayed_new_pids")).count() == 0
    rejected = decisions.filter(F.col("recorded") == "rejected").count()
    decisions.unpersist()
    return rejected


@pytest.fixture(scope="module")
def quota_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quota") / "quota.yaml"
    path.write_text(QUOTA_YAML)
    return path


def test_load_policy_from_a_pidgate_config(quota_file: Path) -> None:
    assert load_policy(quota_file) == default_policy()


def test_parity_with_a_recorded_throttling_run(
    spark: SparkSession, tmp_path: Path, quota_file: Path
) -> None:
    # One proxy, three clock-skewed proxies replayed per instance; gzip and rotation included.
    single = tmp_path / "single"
    generate_events(single, GeneratorConfig(events=4000, seed=7, instances=1, rotate_lines=1500))
    multi = tmp_path / "multi"
    generate_events(multi, GeneratorConfig(events=4000, seed=8, instances=3, gzip=True))
    policy = load_policy(quota_file)
    assert assert_parity(spark, str(single), policy, per_instance=False) > 50
    assert assert_parity(spark, str(multi), policy, per_instance=True) > 50


@pytest.mark.skipif(
    not (RECORDED_LOG.exists() and RECORDED_QUOTA.exists()),
    reason="no event log recorded from a real pidgate run in tests/pipeline/data/",
)
def test_parity_with_the_real_proxy(spark: SparkSession) -> None:
    rejected = assert_parity(
        spark, str(RECORDED_LOG), load_policy(RECORDED_QUOTA), per_instance=True
    )
    assert rejected > 0, "the recorded run should include throttled requests"


DECISION_COLUMNS = [
    "principal",
    "request_id",
    "pids",
    "recorded",
    "replayed",
    "replayed_new_pids",
    "replayed_rejected_pids",
]


def test_replay_regroups_requests_in_time_order(spark: SparkSession) -> None:
    policy = QuotaPolicy(default_producer_ids_rate=2)
    rows = [
        # given out of order; request 3 carries two PIDs on two partitions each
        ev(H0 + 3000, "rejected", "User:a", 4, 4, throttle_ms=1),
        ev(H0 + 2000, "admitted_new", "User:a", 2, 3, partition=0),
        ev(H0 + 2000, "admitted_new", "User:a", 3, 3, partition=0),
        ev(H0 + 2000, "admitted_new", "User:a", 2, 3, partition=1),
        ev(H0 + 1000, "admitted_new", "User:a", 1, 2),
        ev(H0 + 500, "init_producer_id", "User:a", 1, 1),  # not a Produce request: ignored
        ev(H0 + 9000, "admitted_new", "User:solo", 7, 1),  # a principal with one event
    ]
    decisions = replay_requests(events_df(spark, rows), policy)
    expected = spark.createDataFrame(
        [
            ("User:a", 2, 1, "admitted", "admitted", 1, 0),
            # two new PIDs but one token left: the whole request is rejected
            ("User:a", 3, 2, "admitted", "rejected", 0, 2),
            ("User:a", 4, 1, "rejected", "admitted", 1, 0),
            ("User:solo", 1, 1, "admitted", "admitted", 1, 0),
        ],
        "principal string, request_id bigint, pids int, recorded string, replayed string, "
        "replayed_new_pids int, replayed_rejected_pids int",
    )
    assertDataFrameEqual(decisions.select(*DECISION_COLUMNS), expected)

    hourly = backtest_hourly(decisions).filter(F.col("principal") == "User:a")
    row = hourly.collect()[0]
    assert (row.requests, row.recorded_rejected_requests, row.replayed_rejected_requests) == (
        3,
        1,
        1,
    )
    assert (row.recorded_new_pids, row.replayed_new_pids, row.agreeing_requests) == (3, 2, 1)


def test_empty_log_and_bloom_false_positives(spark: SparkSession) -> None:
    empty = replay_requests(events_df(spark, []), QuotaPolicy(default_producer_ids_rate=1))
    assertDataFrameEqual(empty, spark.createDataFrame([], DECISION_SCHEMA))

    # A deliberately bad Bloom filter (tiny layers, p = 0.5) must show false positives, measured
    # against the exact set: PIDs treated as known that were never admitted before.
    sloppy = QuotaPolicy(
        default_producer_ids_rate=1_000_000,
        false_positive_rate=0.5,
        min_layer_items=1,
        max_layer_items=1,
    )
    rows = [ev(H0 + i, "admitted_new", "User:x", 1000 + i, i) for i in range(300)]
    bloom = bloom_accuracy(replay_requests(events_df(spark, rows), sloppy)).collect()[0]
    assert bloom.never_seen_lookups == 300
    assert 0 < bloom.bloom_false_positives < 300
    assert bloom.observed_false_positive_rate == bloom.bloom_false_positives / 300


def test_grandfathered_pids_replay_free_under_any_candidate(spark: SparkSession) -> None:
    """Issue 11: ``admitted_grandfathered`` PIDs were allocated before enforcement began; the
    replay admits them without a token (so they are neither charged nor Bloom false positives),
    while new PIDs are held to the candidate quota."""
    rows = [
        ev(H0 + 1000, "admitted_grandfathered", "User:a", 10, 1),
        ev(H0 + 1001, "admitted_grandfathered", "User:a", 11, 2),
        ev(H0 + 1002, "admitted_grandfathered", "User:a", 12, 3),
        ev(H0 + 2000, "admitted_new", "User:a", 500, 4),
        ev(H0 + 2001, "admitted_new", "User:a", 501, 5),
    ]
    decisions = replay_requests(events_df(spark, rows), QuotaPolicy(default_producer_ids_rate=1))
    got = sorted(
        (r.request_id, r.replayed, r.replayed_new_pids, r.bloom_false_positives)
        for r in decisions.collect()
    )
    assert got == [
        (1, "admitted", 0, 0),
        (2, "admitted", 0, 0),
        (3, "admitted", 0, 0),
        (4, "admitted", 1, 0),  # the candidate's single token
        (5, "rejected", 0, 0),
    ]
