"""The activity report's figures and recommendations, checked structurally for a short real
run and a multi-day generated log: buckets chosen from the period, labelled axes, markers on
every series, an x-range that is the period, and storms told apart from steady demand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from pyspark.sql import SparkSession

from pidgate.pipeline.activity import (
    ActivityReport,
    build_activity_report,
    hourly_with_clients,
    recommend_with_storms,
)
from pidgate.pipeline.generate import GeneratorConfig, generate_events
from pidgate.pipeline.timebuckets import choose_bucket

from .test_activity import H0, HOUR, ev, events_df

RECORDED = Path(__file__).parent / "data" / "recorded_events.jsonl"
DAY_S = 86_400


def test_buckets_follow_the_period() -> None:
    assert choose_bucket(H0, H0 + 45_000) == (1, "second")
    assert choose_bucket(H0, H0 + 20 * 60_000) == (10, "10 seconds")
    assert choose_bucket(H0, H0 + 3 * HOUR) == (300, "5 minutes")
    assert choose_bucket(H0, H0 + 2 * 24 * HOUR) == (3600, "hour")
    assert choose_bucket(H0, H0 + 12 * 24 * HOUR) == (6 * 3600, "6 hours")
    assert choose_bucket(H0, H0 + 90 * 24 * HOUR) == (86_400, "day")
    assert choose_bucket(H0, H0) == (1, "second")


def axes_of(report: ActivityReport, title_start: str) -> Axes:
    [section] = [s for s in report.sections if s.title.startswith(title_start)]
    assert section.figure is not None
    [ax] = section.figure.axes
    return ax


def check_timeline(report: ActivityReport) -> Axes:
    ax = axes_of(report, "New producer IDs per")
    assert ax.get_xlabel() == "time (UTC)"
    assert ax.get_ylabel().startswith("new producer IDs per ")
    lines = ax.get_lines()
    assert lines, "no series"
    for line in lines:
        assert line.get_marker() not in (None, "", "None")  # a sparse series stays visible
    # The x-range is the period, rounded out to whole buckets (matplotlib dates are days).
    left, right = ax.get_xlim()
    first_s, last_s = report.first_ms / 1000, report.last_ms / 1000
    assert left * DAY_S <= first_s < left * DAY_S + report.bucket_s
    assert right * DAY_S - report.bucket_s <= last_s < right * DAY_S + 1e-3
    # Zero-filled: one point per bucket of the period.
    assert len(lines[0].get_xdata()) == round((right - left) * DAY_S / report.bucket_s)
    return ax


def check_offenders(report: ActivityReport) -> None:
    ax = axes_of(report, "Top ")
    assert ax.get_xlabel() == "producer IDs over the period"
    assert ax.get_ylabel() == "principal"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels and all(len(label) <= 28 for label in labels)


def build(spark: SparkSession, path: Path, **kwargs: Any) -> ActivityReport:
    report = build_activity_report(spark, str(path), **kwargs)
    report.release()
    return report


def test_a_short_real_run_is_charted_per_second(spark: SparkSession) -> None:
    report = build(spark, RECORDED)
    assert report.bucket_s == 1  # an 8.5 s run
    ax = check_timeline(report)
    assert ax.get_ylabel() == "new producer IDs per second"
    assert sum(sum(line.get_ydata()) for line in ax.get_lines()) == 6  # six producers
    check_offenders(report)
    summary = report.sections[0].text
    assert "(8 s)" in summary
    assert "None" not in summary


def test_sparse_days_are_charted_per_hour(spark: SparkSession, tmp_path: Path) -> None:
    """Five days with a few PIDs every six hours: hourly buckets, zeros between the points."""
    lines = []
    for i in range(20):
        ts = H0 + i * 6 * HOUR
        lines.append(
            json.dumps(
                {"ts_ms": ts, "event": "admitted_new", "principal": "User:app", "producer_id": i}
            )
        )
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "e.jsonl").write_text("\n".join(lines) + "\n")
    report = build(spark, tmp_path / "ev")
    assert (report.bucket_s, report.first_ms, report.last_ms) == (3600, H0, H0 + 114 * HOUR)
    ax = check_timeline(report)
    assert ax.get_ylabel() == "new producer IDs per hour"
    [line] = ax.get_lines()
    assert list(line.get_ydata()).count(1) == 20 and len(line.get_ydata()) == 115
    assert "(4.8 days)" in report.sections[0].text


def test_a_generated_two_hour_log(spark: SparkSession, tmp_path: Path) -> None:
    stats = generate_events(tmp_path / "ev", GeneratorConfig(events=20_000, seed=9))
    report = build(spark, tmp_path / "ev")
    assert report.bucket_s == 60  # about two hours
    assert (report.first_ms, report.last_ms) == (stats.first_ts_ms, stats.last_ts_ms)
    check_timeline(report)
    check_offenders(report)
    # Storms first in the recommendations, each with its reason.
    [rates] = [s.table for s in report.sections if s.title.startswith("Recommended")]
    assert rates is not None
    demand = list(rates["demand"])
    assert demand == sorted(demand, key=lambda d: d != "restart storm")
    storms = rates[rates["demand"] == "restart storm"]
    assert {p for p in storms["principal"] if p.startswith(("User:storm-", "User:batchy-"))} == {
        "User:storm-0",
        "User:storm-1",
        "User:storm-2",
        "User:batchy-0",
        "User:batchy-1",
    }
    assert not any(str(p).startswith("User:app-") for p in storms["principal"])


def storm_log() -> list[tuple[Any, ...]]:
    rows = []
    pid = 0
    # steady: 3 clients, 3 new PIDs an hour for 6 hours, never rejected
    for h in range(6):
        for c in range(3):
            pid += 1
            rows.append(ev(H0 + h * HOUR + c, "admitted_new", "User:steady", pid, pid))
    rows = [(*r[:5], f"steady-{i % 3}", *r[6:]) for i, r in enumerate(rows)]
    # storm: 2 healthy hours with 4 PIDs from 2 clients, then 2 hours of 300 PIDs from the same
    # 2 clients (restart loops), most rejected
    storm: list[tuple[Any, ...]] = []
    for h in range(4):
        count = 4 if h < 2 else 300
        for i in range(count):
            pid += 1
            admitted = h < 2 or i < 20
            kind = "admitted_new" if admitted else "rejected"
            row = ev(H0 + h * HOUR + i, kind, "User:storm", pid, pid, throttle_ms=None)
            storm.append((*row[:5], f"storm-{i % 2}", *row[6:]))
    return rows + storm


def test_a_storm_gets_its_healthy_baseline_not_its_storm(spark: SparkSession) -> None:
    hourly = hourly_with_clients(events_df(spark, storm_log()))
    rates = {r.principal: r for r in recommend_with_storms(hourly).collect()}
    storm, steady = rates["User:storm"], rates["User:steady"]
    assert (storm.storm, storm.storm_hours, storm.peak_hourly_demand) == (True, 2, 300)
    # p99 of the storm's demand would give ceil(300 x 1.5) = 450; its healthy hours give 6.
    assert storm.recommended_producer_ids_rate == 6
    assert storm.peak_pids_per_client == 150.0
    assert "restart storm in 2 of 4 hours" in storm.reason
    assert "from its healthy hours" in storm.reason
    assert (steady.storm, steady.recommended_producer_ids_rate) == (False, 5)
    assert steady.reason.startswith("steady:")
    first = recommend_with_storms(hourly).first()
    assert first is not None and first.principal == "User:storm"  # storms first


@pytest.mark.parametrize("percentile", [-0.1, 1.5])
def test_bad_percentiles_are_refused(spark: SparkSession, percentile: float) -> None:
    hourly = hourly_with_clients(events_df(spark, storm_log()))
    with pytest.raises(ValueError):
        recommend_with_storms(hourly, percentile=percentile)
