"""The activity report's figures and recommendations, checked structurally for a short real
run and a multi-day generated log: buckets chosen from the period, labelled axes, markers on
every series, an x-range that is the period, and storms told apart from steady demand."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from pyspark.sql import SparkSession

from pidgate.pipeline.jobs.activity import ActivityReport, build_activity_report, run_activity
from pidgate.pipeline.jobs.activity_hourly import hourly_with_clients
from pidgate.pipeline.jobs.activity_rates import recommend_with_storms
from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
from pidgate.pipeline.outputs.timebuckets import choose_bucket

from .test_activity import H0, HOUR, ev, events_df

RECORDED = Path(__file__).parents[1] / "data" / "recorded_events.jsonl"
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
    ax = axes_of(report, "New producer IDs and rejections per")
    assert ax.get_xlabel().startswith(("time (UTC", "date (UTC)"))
    assert ax.get_ylabel().startswith("new producer IDs per ")
    # One tick format on the whole axis: all times, or all dates (never a mix).
    ax.figure.canvas.draw()  # type: ignore[attr-defined]
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and len({len(t) for t in ticks}) == 1, ticks
    lines = new_pid_lines(ax)
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


def new_pid_lines(ax: Axes) -> list[Any]:
    return [line for line in ax.get_lines() if str(line.get_label()).endswith(": new PIDs")]


def check_offenders(report: ActivityReport) -> None:
    ax = axes_of(report, "Top ")
    assert ax.get_xlabel().startswith("distinct producer IDs over the period")
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
    assert ax.get_ylabel().startswith("new producer IDs per second")
    assert sum(sum(line.get_ydata()) for line in new_pid_lines(ax)) == 6  # six producers
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
    assert ax.get_ylabel().startswith("new producer IDs per hour")
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


# -- the numbers of a real demo log and of observe mode, against the log itself ------------

DEMO = Path(__file__).parents[1] / "data" / "demo_events.jsonl"
OBSERVED = Path(__file__).parents[1] / "data" / "observe_events.jsonl"
DEMO_WINDOW_S = 10  # the demo's quota: 5 new PIDs per 10 s window
DEMO_RATE = 5


def log_fates(path: Path) -> dict[str, int]:
    """Each distinct PID of the log by fate, and the rejected requests, counted in Python."""
    first_new: dict[int, int] = {}
    first_rejected: dict[int, int] = {}
    requests = set()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        pid, ts = event["producer_id"], event["ts_ms"]
        if event["event"] == "admitted_new":
            first_new[pid] = min(ts, first_new.get(pid, ts))
        elif event["event"] == "rejected":
            first_rejected[pid] = min(ts, first_rejected.get(pid, ts))
            requests.add((event["instance"], event["request_id"]))
    waited = {p for p, t in first_new.items() if first_rejected.get(p, t) < t}
    return {
        "pids": len(first_new.keys() | first_rejected.keys()),
        "admitted_at_once": len(first_new) - len(waited),
        "admitted_after_rejection": len(waited),
        "never_admitted": len(first_rejected.keys() - first_new.keys()),
        "rejected_requests": len(requests),
    }


def report_text(path: Path) -> str:
    document = path.read_text(encoding="utf-8").replace("<wbr>", "")
    return html.unescape(re.sub(r"<[^>]+>", " ", document))


def test_the_demo_report_adds_up_to_its_event_log(spark: SparkSession, tmp_path: Path) -> None:
    """A recorded ``pidgate demo`` log (a steady producer, then a storm of 20 producers each
    with its own client.id): each PID counted once by fate, the fates adding up to the distinct
    PIDs of the log, the storm classed as a storm, and a rate per the demo's 10 s window that
    is neither the storm's demand nor looser than the quota that held it."""
    expected = log_fates(DEMO)
    report = run_activity(spark, str(DEMO), str(tmp_path / "out"), window_s=DEMO_WINDOW_S)
    [row] = spark.read.parquet(str(tmp_path / "out" / "top_offenders.parquet")).collect()
    fates = {name: row[name] for name in expected if name != "pids"}
    assert fates == {k: v for k, v in expected.items() if k != "pids"}
    assert sum(v for k, v in fates.items() if k != "rejected_requests") == expected["pids"] == 21
    assert expected["admitted_after_rejection"] > 0  # the old bar counted these twice

    [rate] = spark.read.parquet(str(tmp_path / "out" / "recommendations.parquet")).collect()
    assert rate.storm and rate.window_s == DEMO_WINDOW_S
    assert rate.recommended_per_hour < expected["pids"]  # not the storm's own demand
    assert 1 <= rate.recommended_producer_ids_rate <= DEMO_RATE

    text = report_text(report)
    assert "Restart storms: 1 principal(s): User:ANONYMOUS" in text
    assert "baseline PIDs per hour" in text and "before the x 1.5 headroom" in text
    assert f"recommended producer_ids_rate (per {DEMO_WINDOW_S} s window)" in text
    assert f"producer.id.quota.window.size.seconds: {DEMO_WINDOW_S}" in text
    assert "Quota changes are not written to the event log" in text
    assert "What enforcement would have done" not in text  # no observe mode in this log


def test_the_charts_show_the_rejections(spark: SparkSession) -> None:
    report = build(spark, DEMO)
    requests = log_fates(DEMO)["rejected_requests"]
    bars = axes_of(report, "Top ")
    assert [t.get_text().strip() for t in bars.texts] == [f"{requests} rejected requests"]
    ax = axes_of(report, "New producer IDs and rejections per")
    dashed = [
        line for line in ax.get_lines() if str(line.get_label()).endswith("rejected requests")
    ]
    assert [sum(line.get_ydata()) for line in dashed] == [requests]


def test_observe_mode_reports_what_enforcement_would_have_done(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Hand-written observe-mode log (the proxy's would_reject contract): 14 producers of
    User:observed with their own client.id, 10 would have been rejected (two requests each, two
    partitions each), 8 of those admitted later, 2 never; User:calm untouched."""
    report = run_activity(spark, str(OBSERVED), str(tmp_path / "out"))
    hourly = {
        r.principal: r
        for r in spark.read.parquet(str(tmp_path / "out" / "hourly.parquet")).collect()
    }
    observed, calm = hourly["User:observed"], hourly["User:calm"]
    assert (observed.would_reject_requests, observed.would_reject_pids) == (20, 10)
    assert (observed.new_pids, observed.demanded_pids, observed.rejected_requests) == (12, 14, 0)
    assert (calm.would_reject_requests, calm.would_reject_pids) == (0, 0)
    rates = {
        r.principal: r
        for r in spark.read.parquet(str(tmp_path / "out" / "recommendations.parquet")).collect()
    }
    assert rates["User:observed"].storm and not rates["User:calm"].storm  # would_reject counts

    text = report_text(report)
    assert "What enforcement would have done (observe mode)" in text
    assert "Observe mode, would have been rejected: 10 PIDs in 20 requests" in text
    assert (
        "User:observed: 10 PIDs would have been rejected at least once; 8 of them were "
        "admitted later (would have waited), 2 never got a token in the period"
    ) in text


def test_a_failed_recommendation_fails_the_report_and_leaves_nothing_cached(
    spark: SparkSession,
) -> None:
    """The offenders and the recommendations are computed side by side: when one fails, the
    report fails with its error, and the other's cached frame is released with the rest."""
    cache_manager = spark._jsparkSession.sharedState().cacheManager()
    spark.catalog.clearCache()
    with pytest.raises(ValueError, match="percentile must be in"):
        build_activity_report(spark, str(DEMO), percentile=1.5)
    assert cache_manager.isEmpty()
