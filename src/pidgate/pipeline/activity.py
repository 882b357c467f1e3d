"""``pidgate analyze activity``: who creates producer IDs, and what quota to give them.

Pure transforms (DataFrame -> DataFrame), then a thin entry point:

* :func:`hourly_activity`: per principal and UTC hour, exact distinct new PIDs
  (``countDistinct`` over ``admitted_new``), rejected PIDs and requests, InitProducerId answers,
  and the hour's *demand*: distinct PIDs that asked to be new, admitted or not.
* :func:`top_offenders`: principals ranked by new PIDs over the whole period.
* :func:`recommend_rates`: a ``producer_ids_rate`` per principal by the rule in
  :func:`rate_rule` (printed in the report).

The event log only holds PIDs that were new or rejected: a principal with no quota at all is not
tracked by the proxy, so its PIDs are logged only when it has a quota (set a generous default
quota to observe before enforcing).
"""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from matplotlib.figure import Figure
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.events import (
    ADMITTED_NEW,
    INIT_PRODUCER_ID,
    REJECTED,
    hour_of,
    read_events_checked,
)
from pidgate.pipeline.report import Section, write_report

__all__ = [
    "hourly_activity",
    "rate_rule",
    "recommend_rates",
    "run_activity",
    "top_offenders",
]


def hourly_activity(events: DataFrame) -> DataFrame:
    """Per ``principal`` and ``hour`` (UTC, timestamp) with any event: ``new_pids`` (exact
    distinct ``admitted_new`` PIDs), ``rejected_pids`` (distinct PIDs of rejected requests),
    ``rejected_requests`` (distinct ``(instance, request_id)``), ``demanded_pids`` (distinct PIDs
    admitted as new or rejected), ``init_producer_ids`` (events) and ``throttle_ms_max``."""
    event = F.col("event")
    pid = F.col("producer_id")
    is_new = event == ADMITTED_NEW
    is_rejected = event == REJECTED
    request = F.when(
        is_rejected,
        F.concat_ws("#", F.coalesce(F.col("instance"), F.lit("")), F.col("request_id")),
    )
    return (
        events.filter(event.isin(ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID))
        .withColumn("hour", hour_of(F.col("ts_ms")))
        .groupBy("principal", "hour")
        .agg(
            F.countDistinct(F.when(is_new, pid)).alias("new_pids"),
            F.countDistinct(F.when(is_rejected, pid)).alias("rejected_pids"),
            F.countDistinct(request).alias("rejected_requests"),
            F.countDistinct(F.when(is_new | is_rejected, pid)).alias("demanded_pids"),
            F.count(F.when(event == INIT_PRODUCER_ID, True)).alias("init_producer_ids"),
            F.max(F.when(is_rejected, F.col("throttle_ms"))).alias("throttle_ms_max"),
        )
    )


def top_offenders(hourly: DataFrame, n: int) -> DataFrame:
    """The ``n`` principals with the most new PIDs over the period (sum of hourly exact
    counts), ties by name: ``new_pids``, ``peak_hourly_new_pids``, ``rejected_pids``,
    ``rejected_requests``, ``init_producer_ids``, ``active_hours``."""
    return (
        hourly.groupBy("principal")
        .agg(
            F.sum("new_pids").alias("new_pids"),
            F.max("new_pids").alias("peak_hourly_new_pids"),
            F.sum("rejected_pids").alias("rejected_pids"),
            F.sum("rejected_requests").alias("rejected_requests"),
            F.sum("init_producer_ids").alias("init_producer_ids"),
            F.count(F.lit(1)).alias("active_hours"),
        )
        .orderBy(F.desc("new_pids"), F.asc("principal"))
        .limit(n)
    )


def rate_rule(percentile: float = 0.99, headroom: float = 1.5) -> str:
    """The recommendation rule in words, as printed in the report."""
    return (
        f"recommended producer_ids_rate = max(1, ceil(p{percentile * 100:g} of hourly demand "
        f"x {headroom:g})), where hourly demand is the number of distinct PIDs that asked to be "
        f"new in one UTC hour (admitted as new or rejected), the percentile is exact (linear "
        f"interpolation) over the hours in which the principal had any event, and the rate is "
        f"per 1-hour quota window (producer.id.quota.window.size.seconds = 3600, the default; "
        f"scale it for other windows)."
    )


def recommend_rates(
    hourly: DataFrame, percentile: float = 0.99, headroom: float = 1.5
) -> DataFrame:
    """Per principal: ``active_hours``, ``peak_hourly_demand``, ``pXX_hourly_demand`` (as
    ``percentile_hourly_demand``) and ``recommended_producer_ids_rate`` by :func:`rate_rule`,
    sorted by the recommendation (descending) then name."""
    if not 0.0 <= percentile <= 1.0:
        raise ValueError(f"percentile must be in [0, 1], got {percentile}")
    if headroom <= 0:
        raise ValueError(f"headroom must be > 0, got {headroom}")
    p = F.percentile(F.col("demanded_pids").cast("double"), F.lit(percentile))
    return (
        hourly.groupBy("principal")
        .agg(
            F.count(F.lit(1)).alias("active_hours"),
            F.max("demanded_pids").alias("peak_hourly_demand"),
            p.alias("percentile_hourly_demand"),
        )
        .withColumn(
            "recommended_producer_ids_rate",
            F.greatest(
                F.lit(1).cast("long"),
                F.ceil(F.col("percentile_hourly_demand") * F.lit(headroom)).cast("long"),
            ),
        )
        .orderBy(F.desc("recommended_producer_ids_rate"), F.asc("principal"))
    )


# -- entry point ---------------------------------------------------------------------------


def _offenders_figure(offenders: list[tuple[str, int]]) -> Figure:
    fig = Figure(figsize=(9, max(2.5, 0.35 * len(offenders) + 1)))
    ax = fig.add_subplot()
    names = [name for name, _ in reversed(offenders)]
    values = [value for _, value in reversed(offenders)]
    ax.barh(names, values, color="#c0504d")
    ax.set_xlabel("new producer IDs over the period")
    ax.set_title("Top principals by new producer IDs")
    fig.tight_layout()
    return fig


def _timeline_figure(series: dict[str, list[tuple[int, int]]]) -> Figure:
    fig = Figure(figsize=(10, 4))
    ax = fig.add_subplot()
    for principal, points in series.items():
        days = [h / 86_400 for h, _ in points]  # matplotlib dates: days since 1970 UTC
        ax.plot(days, [v for _, v in points], marker=".", label=principal)
    ax.xaxis_date(UTC)
    ax.set_ylabel("new producer IDs per hour")
    ax.set_title("Hourly new producer IDs, top principals (UTC)")
    if series:
        ax.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def _yaml_snippet(rates: list[tuple[str, int]]) -> str:
    lines = ["quota:", "  users:"]
    for principal, rate in rates:
        name = principal.removeprefix("User:")
        lines.append(f'    "{name}": {{producer_ids_rate: {rate}}}')
    return "\n".join(lines)


def run_activity(
    spark: SparkSession,
    events_path: str,
    output: str,
    *,
    top_n: int = 20,
    percentile: float = 0.99,
    headroom: float = 1.5,
) -> Path:
    """Read the event log at ``events_path``, write ``hourly``, ``top_offenders`` and
    ``recommendations`` Parquet plus ``report.html`` under ``output``; return the HTML path."""
    events, bad_lines = read_events_checked(spark, events_path)
    hourly = hourly_activity(events).cache()
    try:
        offenders = top_offenders(hourly, top_n)
        rates = recommend_rates(hourly, percentile, headroom)
        totals = hourly.agg(
            F.countDistinct("principal").alias("principals"),
            F.min("hour").alias("first_hour"),
            F.max("hour").alias("last_hour"),
            F.sum("new_pids").alias("new_pids"),
            F.sum("rejected_requests").alias("rejected_requests"),
            F.sum("init_producer_ids").alias("init_producer_ids"),
        ).collect()[0]
        offenders_pd: pd.DataFrame = offenders.toPandas()
        rates_pd: pd.DataFrame = rates.toPandas()
        top5 = [str(p) for p in offenders_pd["principal"].head(5)]
        timeline_rows = (
            hourly.filter(F.col("principal").isin(top5))
            .select("principal", F.col("hour").cast("long").alias("hour_s"), "new_pids")
            .orderBy("principal", "hour_s")
            .collect()
        )
        series: dict[str, list[tuple[int, int]]] = {p: [] for p in top5}
        for row in timeline_rows:
            series[row["principal"]].append((int(row["hour_s"]), int(row["new_pids"])))

        summary = (
            f"Event log: {events_path}\n"
            f"Bad lines skipped: {bad_lines}\n"
            f"Principals: {totals['principals']}\n"
            f"Period (UTC hours): {totals['first_hour']} .. {totals['last_hour']}\n"
            f"New producer IDs (sum of hourly exact distinct counts): {totals['new_pids'] or 0}\n"
            f"Rejected requests: {totals['rejected_requests'] or 0}\n"
            f"InitProducerId answers: {totals['init_producer_ids'] or 0}\n\n"
            "Only PIDs the proxy tracked appear in the log: principals without any quota are "
            "not tracked, so give them a generous default quota to observe them."
        )
        recommended = [
            (str(r.principal), int(r.recommended_producer_ids_rate))
            for r in rates_pd.itertuples(index=False)
        ]
        sections = [
            Section("Summary", summary),
            Section(
                f"Top {top_n} principals by new producer IDs",
                "new_pids sums the exact hourly distinct counts.",
                offenders_pd,
                _offenders_figure(
                    [
                        (str(p), int(v))
                        for p, v in zip(
                            offenders_pd["principal"], offenders_pd["new_pids"], strict=True
                        )
                    ]
                ),
            ),
            Section("Hourly new producer IDs", "", None, _timeline_figure(series)),
            Section(
                "Recommended producer_ids_rate per principal",
                "Rule: "
                + rate_rule(percentile, headroom)
                + "\n\nAs pidgate config:\n"
                + _yaml_snippet(recommended),
                rates_pd,
            ),
        ]
        return write_report(
            output,
            "pidgate activity report",
            sections,
            {"hourly": hourly, "top_offenders": offenders, "recommendations": rates},
        )
    finally:
        hourly.unpersist()
