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

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from matplotlib.figure import Figure
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.events import (
    ACTIVITY_COLUMNS,
    ADMITTED_NEW,
    BAD,
    INIT_PRODUCER_ID,
    REJECTED,
    hour_of,
    read_events_marked,
)
from pidgate.pipeline.inputs import EventFiles, InputError, event_files
from pidgate.pipeline.progress import Progress, stage
from pidgate.pipeline.report import Section, time_axis, write_report
from pidgate.pipeline.timebuckets import choose_bucket

__all__ = [
    "ActivityReport",
    "build_activity_report",
    "hourly_activity",
    "hourly_with_clients",
    "offenders_figure",
    "rate_rule",
    "recommend_rates",
    "recommend_with_storms",
    "run_activity",
    "storm_rule",
    "timeline_figure",
    "top_offenders",
]


def hourly_with_clients(events: DataFrame, keep_bad: bool = False) -> DataFrame:
    """:func:`hourly_activity` plus ``clients`` (distinct client ids; a missing one counts as
    one client), ``events``, ``first_ts_ms`` and ``last_ts_ms`` per principal and hour, in one
    aggregation (one pass over the input).

    With ``keep_bad``, ``events`` comes from :func:`~pidgate.pipeline.events.read_events_marked`
    and its ``bad`` column is a key too: the bad lines form one row (null principal and hour)
    whose ``events`` counts them."""
    event = F.col("event")
    pid = F.col("producer_id")
    is_new = event == ADMITTED_NEW
    is_rejected = event == REJECTED
    request = F.when(
        is_rejected,
        F.concat_ws("#", F.coalesce(F.col("instance"), F.lit("")), F.col("request_id")),
    )
    wanted = event.isin(ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID)
    keys = ["principal", "hour"]
    if keep_bad:
        wanted, keys = wanted | F.col(BAD), [BAD, *keys]
    return (
        events.filter(wanted)
        .withColumn("hour", hour_of(F.col("ts_ms")))
        .groupBy(*keys)
        .agg(
            F.countDistinct(F.when(is_new, pid)).alias("new_pids"),
            F.countDistinct(F.when(is_rejected, pid)).alias("rejected_pids"),
            F.countDistinct(request).alias("rejected_requests"),
            F.countDistinct(F.when(is_new | is_rejected, pid)).alias("demanded_pids"),
            F.count(F.when(event == INIT_PRODUCER_ID, True)).alias("init_producer_ids"),
            F.max(F.when(is_rejected, F.col("throttle_ms"))).alias("throttle_ms_max"),
            F.countDistinct(F.coalesce(F.col("client_id"), F.lit(""))).alias("clients"),
            F.count(F.lit(1)).alias("events"),
            F.min("ts_ms").alias("first_ts_ms"),
            F.max("ts_ms").alias("last_ts_ms"),
        )
    )


_HOURLY_COLUMNS = (
    "principal",
    "hour",
    "new_pids",
    "rejected_pids",
    "rejected_requests",
    "demanded_pids",
    "init_producer_ids",
    "throttle_ms_max",
)


def hourly_activity(events: DataFrame) -> DataFrame:
    """Per ``principal`` and ``hour`` (UTC, timestamp) with any event: ``new_pids`` (exact
    distinct ``admitted_new`` PIDs), ``rejected_pids`` (distinct PIDs of rejected requests),
    ``rejected_requests`` (distinct ``(instance, request_id)``), ``demanded_pids`` (distinct PIDs
    admitted as new or rejected), ``init_producer_ids`` (events) and ``throttle_ms_max``."""
    return hourly_with_clients(events).select(*_HOURLY_COLUMNS)


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


# -- storms -------------------------------------------------------------------------------

#: An hour is a storm hour for a principal when at least this many PIDs asked to be new ...
STORM_MIN_DEMAND = 10
#: ... and each of its clients asked for at least this many PIDs on average (restarts), ...
STORM_PIDS_PER_CLIENT = 3.0
#: ... or at least this share of the PIDs that asked was rejected.
STORM_REJECTED_SHARE = 0.5


def storm_rule(percentile: float = 0.99, headroom: float = 1.5) -> str:
    """How storms are told from steady demand, in words, as printed in the report."""
    return (
        f"An hour is a restart-storm hour for a principal when at least {STORM_MIN_DEMAND} PIDs "
        f"asked to be new and either each of its clients (client.id) asked for "
        f"{STORM_PIDS_PER_CLIENT:g} or more on average (producers restarting, or one producer "
        f"per batch: short-lived PIDs), or {STORM_REJECTED_SHARE:.0%} or more of them were "
        f"rejected. For a principal with storm hours the quota comes from its healthy "
        f"baseline, not from the storm: p{percentile * 100:g} of the demand of its other hours "
        f"x {headroom:g}, or, when every hour stormed, the smaller of p{percentile * 100:g} of "
        f"its clients per hour x {headroom:g} (one new PID per producer per hour) and "
        f"p{percentile * 100:g} of the new PIDs it was admitted per hour (what the current "
        f"quota let through: a storm never loosens its quota)."
    )


def recommend_with_storms(
    hourly: DataFrame, percentile: float = 0.99, headroom: float = 1.5
) -> DataFrame:
    """:func:`recommend_rates` with restart storms told apart (:func:`storm_rule`), from
    :func:`hourly_with_clients` (which has ``clients``). Per
    principal: ``storm`` (any storm hour), ``storm_hours``, ``peak_pids_per_client``,
    ``rejected_share``, ``baseline_hourly_demand``, ``recommended_producer_ids_rate`` and
    ``reason`` (one sentence). Storms first, then by recommendation, then name."""
    if not 0.0 <= percentile <= 1.0:
        raise ValueError(f"percentile must be in [0, 1], got {percentile}")
    if headroom <= 0:
        raise ValueError(f"headroom must be > 0, got {headroom}")
    demand = F.col("demanded_pids")
    per_client = demand / F.greatest(F.col("clients"), F.lit(1))
    rejected_share = F.when(demand > 0, F.col("rejected_pids") / demand).otherwise(0.0)
    stormy = (demand >= STORM_MIN_DEMAND) & (
        (per_client >= STORM_PIDS_PER_CLIENT) | (rejected_share >= STORM_REJECTED_SHARE)
    )
    hours = (
        hourly.withColumn("clients", F.greatest(F.col("clients"), F.lit(1)))
        .withColumn("per_client", per_client)
        .withColumn("stormy", stormy)
    )
    p_all = F.percentile(demand.cast("double"), F.lit(percentile))
    p_healthy = F.percentile(F.when(~F.col("stormy"), demand.cast("double")), F.lit(percentile))
    p_clients = F.percentile(F.col("clients").cast("double"), F.lit(percentile))
    p_admitted = F.percentile(F.col("new_pids").cast("double"), F.lit(percentile))
    agg = hours.groupBy("principal").agg(
        F.count(F.lit(1)).alias("active_hours"),
        F.max(demand).alias("peak_hourly_demand"),
        p_all.alias("percentile_hourly_demand"),
        F.count(F.when(F.col("stormy"), True)).alias("storm_hours"),
        F.round(F.max("per_client"), 1).alias("peak_pids_per_client"),
        F.round(F.sum("rejected_pids") / F.greatest(F.sum(demand), F.lit(1)), 3).alias(
            "rejected_share"
        ),
        p_healthy.alias("healthy"),
        p_clients.alias("clients_p"),
        p_admitted.alias("admitted_p"),
        F.max("clients").alias("peak_clients"),
    )
    storm = F.col("storm_hours") > 0
    # Every hour stormed: per client, or what the quota admitted, whichever is smaller (the
    # baseline is then stated before headroom, like the others).
    all_storm = F.least(F.col("clients_p"), F.col("admitted_p") / F.lit(headroom))
    baseline = (
        F.when(~storm, F.col("percentile_hourly_demand"))
        .when(F.col("healthy").isNotNull(), F.col("healthy"))
        .otherwise(all_storm)
    )
    # Rounded first, so that admitted / headroom x headroom stays a whole number.
    scaled = F.round(baseline * F.lit(headroom), 6)
    rate = F.greatest(F.lit(1).cast("long"), F.ceil(scaled).cast("long"))
    p = f"p{percentile * 100:g}"
    reason = (
        F.when(
            ~storm,
            F.format_string(f"steady: {p} of hourly demand %.0f x {headroom:g}", baseline),
        )
        .when(
            F.col("healthy").isNotNull(),
            F.format_string(
                f"restart storm in %d of %d hours (peak %d PIDs/h, %.1f per client, %.0f%% "
                f"rejected); from its healthy hours: {p} %.0f x {headroom:g}",
                F.col("storm_hours"),
                F.col("active_hours"),
                F.col("peak_hourly_demand"),
                F.col("peak_pids_per_client"),
                F.col("rejected_share") * 100,
                baseline,
            ),
        )
        .otherwise(
            F.format_string(
                f"restart storm in every hour (peak %d PIDs/h, %.1f per client, %.0f%% "
                f"rejected); the smaller of {p} %.0f clients/h x {headroom:g} and {p} %.0f "
                f"PIDs/h admitted",
                F.col("peak_hourly_demand"),
                F.col("peak_pids_per_client"),
                F.col("rejected_share") * 100,
                F.col("clients_p"),
                F.col("admitted_p"),
            )
        )
    )
    return (
        agg.withColumn("storm", storm)
        .withColumn("baseline_hourly_demand", baseline)
        .withColumn("recommended_producer_ids_rate", rate)
        .withColumn("reason", reason)
        .select(
            "principal",
            "storm",
            "recommended_producer_ids_rate",
            "active_hours",
            "storm_hours",
            "peak_hourly_demand",
            "percentile_hourly_demand",
            "baseline_hourly_demand",
            "peak_pids_per_client",
            "rejected_share",
            "reason",
        )
        .orderBy(F.desc("storm"), F.desc("recommended_producer_ids_rate"), F.asc("principal"))
    )


# -- time buckets and figures --------------------------------------------------------------


def bucketed_new_pids(events: DataFrame, bucket_s: int, principals: list[str]) -> DataFrame:
    """Per principal of ``principals`` and ``bucket_s`` bucket (``bucket`` = epoch seconds of
    its start): exact distinct new PIDs (for buckets shorter than an hour; longer ones are
    summed from the hourly counts instead, without another pass)."""
    bucket = (F.floor(F.col("ts_ms") / (1000 * bucket_s)) * bucket_s).cast("long")
    return (
        events.filter((F.col("event") == ADMITTED_NEW) & F.col("principal").isin(principals))
        .select("principal", bucket.alias("bucket"), "producer_id")
        .groupBy("principal", "bucket")
        .agg(F.countDistinct("producer_id").alias("new_pids"))
    )


_DAY_S = 86_400


def _fit_labels(names: list[str], width: int = 28) -> list[str]:
    return [n if len(n) <= width else n[: width - 1] + "…" for n in names]


def offenders_figure(offenders: list[tuple[str, int, int]]) -> Figure:
    """Horizontal bars, most new PIDs on top: (principal, new PIDs, rejected PIDs)."""
    fig = Figure(figsize=(10, max(2.5, 0.4 * len(offenders) + 1.2)))
    ax = fig.add_subplot()
    rows = list(reversed(offenders))
    names = _fit_labels([name for name, _, _ in rows])
    ax.barh(names, [v for _, v, _ in rows], color="#c0504d", label="new PIDs admitted")
    ax.barh(
        names,
        [r for _, _, r in rows],
        left=[v for _, v, _ in rows],
        color="#f2b134",
        label="PIDs rejected",
    )
    ax.set_xlabel("producer IDs over the period")
    ax.set_ylabel("principal")
    ax.set_title("Top principals by new producer IDs")
    if offenders:
        ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    return fig


def timeline_figure(
    series: dict[str, dict[int, int]], bucket_s: int, bucket_name: str, start_s: int, end_s: int
) -> Figure:
    """New PIDs per bucket for each principal of ``series`` (bucket start s -> count), zeros
    filled in, markers on every point, x from ``start_s`` to ``end_s`` (UTC)."""
    fig = Figure(figsize=(10, 4.2))
    ax = fig.add_subplot()
    buckets = list(range(start_s, max(end_s, start_s + bucket_s), bucket_s))
    for principal, points in series.items():
        days = [b / _DAY_S for b in buckets]
        ax.plot(
            days,
            [points.get(b, 0) for b in buckets],
            marker="o",
            markersize=3 if len(buckets) > 40 else 5,
            linewidth=1.2,
            label=_fit_labels([principal])[0],
        )
    time_axis(ax, start_s, max(end_s, start_s + bucket_s), f"new producer IDs per {bucket_name}")
    ax.set_title(f"New producer IDs per {bucket_name}, top principals")
    if series:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def _display_rates(rates: pd.DataFrame, percentile: float) -> pd.DataFrame:
    """The recommendations as the report shows them: short headers that wrap, storm/steady in
    words, one decimal, the reasons left to the text above (the Parquet keeps them)."""
    p = f"p{percentile * 100:g}"
    shown = pd.DataFrame(
        {
            "principal": rates["principal"],
            "demand": rates["storm"].map({True: "restart storm", False: "steady"}),
            "recommended producer_ids_rate": rates["recommended_producer_ids_rate"],
            "baseline per hour": rates["baseline_hourly_demand"].astype(float).round(1),
            f"{p} PIDs per hour": rates["percentile_hourly_demand"].astype(float).round(1),
            "peak PIDs per hour": rates["peak_hourly_demand"],
            "storm hours / hours": [
                f"{s} / {a}"
                for s, a in zip(rates["storm_hours"], rates["active_hours"], strict=True)
            ],
            "peak PIDs per client and hour": rates["peak_pids_per_client"],
            "rejected": [f"{share:.0%}" for share in rates["rejected_share"].astype(float)],
        }
    )
    return shown


def _storm_reasons(rates: pd.DataFrame, limit: int = 20) -> str:
    storms = rates[rates["storm"]] if len(rates) else rates
    if not len(storms):
        return "No restart storms: every recommendation follows the steady rule."
    lines = [f"  {r.principal}: {r.reason}" for r in storms.head(limit).itertuples(index=False)]
    if len(storms) > limit:
        lines.append(f"  ... and {len(storms) - limit} more (recommendations.parquet)")
    return "Why, per restart storm:\n" + "\n".join(lines)


def _yaml_snippet(rates: list[tuple[str, int]]) -> str:
    lines = ["quota:", "  users:"]
    for principal, rate in rates:
        name = principal.removeprefix("User:")
        lines.append(f'    "{name}": {{producer_ids_rate: {rate}}}')
    return "\n".join(lines)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * _DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / _DAY_S:.1f} days"


@dataclass
class ActivityReport:
    """What :func:`build_activity_report` computed: the report's sections, the DataFrames
    written as Parquet, a short summary for the terminal, and the chart bucket."""

    sections: list[Section]
    frames: dict[str, DataFrame]
    summary: list[str]
    bucket_s: int
    first_ms: int
    last_ms: int
    events: int
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def build_activity_report(
    spark: SparkSession,
    events_path: str | EventFiles,
    *,
    top_n: int = 20,
    percentile: float = 0.99,
    headroom: float = 1.5,
    since_ms: int | None = None,
    until_ms: int | None = None,
    progress: Progress | None = None,
) -> ActivityReport:
    """Everything :func:`run_activity` writes, computed; raises :class:`InputError` when no
    event is in the log (or the period). Call :meth:`ActivityReport.release` afterwards."""
    files = event_files(events_path) if isinstance(events_path, str) else events_path
    stage(progress, f"reading the event log {files.described} ...")
    marked = read_events_marked(spark, files.paths, ACTIVITY_COLUMNS)
    keep = F.lit(True)
    if since_ms is not None:
        keep = keep & (F.col("ts_ms") >= F.lit(since_ms))
    if until_ms is not None:
        keep = keep & (F.col("ts_ms") < F.lit(until_ms))
    # One pass over the JSON: bad lines counted and good ones aggregated per principal and
    # hour; everything but a sub-hour chart reads this small, cached aggregate.
    hourly_all = hourly_with_clients(marked.filter(F.col(BAD) | keep), keep_bad=True).cache()
    cached: list[DataFrame] = [hourly_all]
    try:
        counts = {
            bool(row[BAD]): row
            for row in hourly_all.groupBy(BAD)
            .agg(
                F.sum("events").alias("events"),
                F.min("first_ts_ms").alias("first"),
                F.max("last_ts_ms").alias("last"),
            )
            .collect()
        }
        bad_lines = int(counts[True]["events"]) if True in counts else 0
        span = counts.get(False)
        total = int(span["events"]) if span is not None else 0
        if span is None or total == 0:
            period = " in the period given" if since_ms or until_ms else ""
            raise InputError(
                f"--events {files.described}: no events{period} "
                f"({bad_lines} bad lines skipped); nothing to report"
            )
        first_ms, last_ms = int(span["first"]), int(span["last"])
        stage(progress, f"{total:,} events read; ranking principals ...")
        hourly_clients = hourly_all.filter(~F.col(BAD)).drop(BAD)
        hourly = hourly_clients.select(*_HOURLY_COLUMNS)
        offenders = top_offenders(hourly, top_n)
        stage(progress, "telling restart storms from steady demand ...")
        rates = recommend_with_storms(hourly_clients, percentile, headroom)
        totals = hourly.agg(
            F.countDistinct("principal").alias("principals"),
            F.sum("new_pids").alias("new_pids"),
            F.sum("rejected_pids").alias("rejected_pids"),
            F.sum("rejected_requests").alias("rejected_requests"),
            F.sum("init_producer_ids").alias("init_producer_ids"),
        ).collect()[0]
        offenders_pd: pd.DataFrame = offenders.toPandas()
        rates_pd: pd.DataFrame = rates.toPandas()

        bucket_s, bucket_name = choose_bucket(first_ms, last_ms)
        stage(progress, f"charting new PIDs per {bucket_name} ...")
        top5 = [str(p) for p in offenders_pd["principal"].head(5)]
        series: dict[str, dict[int, int]] = {p: {} for p in top5}
        if bucket_s < 3600:
            # Sub-hour buckets need the events again (only admitted_new of the top principals).
            good = marked.filter(~F.col(BAD) & keep)
            rows = bucketed_new_pids(good, bucket_s, top5).collect()
        else:
            bucket = (F.floor(F.col("hour").cast("long") / bucket_s) * bucket_s).cast("long")
            rows = (
                hourly.filter(F.col("principal").isin(top5))
                .groupBy("principal", bucket.alias("bucket"))
                .agg(F.sum("new_pids").alias("new_pids"))
                .collect()
            )
        for row in rows:
            series[row["principal"]][int(row["bucket"])] = int(row["new_pids"])
        start_s = first_ms // 1000 // bucket_s * bucket_s
        end_s = (last_ms // 1000 // bucket_s + 1) * bucket_s

        storms = rates_pd[rates_pd["storm"]] if len(rates_pd) else rates_pd
        source = (
            f"{files.file_count} file(s) under {files.described}"
            if files.file_count is not None
            else files.described
        )
        if files.renamed:
            source += f" ({files.renamed} with ':' in the name, read through safe-named links)"
        duration = _duration((last_ms - first_ms) / 1000)
        storm_names = ", ".join(str(p) for p in storms["principal"].head(10))
        summary = (
            f"Event log: {source}\n"
            f"Bad lines skipped: {bad_lines}\n"
            f"Period: {_utc(first_ms)} .. {_utc(last_ms)} ({duration})"
            + (
                "; limited to --since/--until"
                if since_ms is not None or until_ms is not None
                else ""
            )
            + "\n"
            f"Events: {total:,}\n"
            f"Principals: {totals['principals']}\n"
            f"New producer IDs (sum of hourly exact distinct counts): {totals['new_pids'] or 0:,}\n"
            f"Rejected PIDs: {totals['rejected_pids'] or 0:,} in "
            f"{totals['rejected_requests'] or 0:,} rejected Produce requests\n"
            f"InitProducerId answers: {totals['init_producer_ids'] or 0:,}\n"
            f"Restart storms: {len(storms)} principal(s)"
            + (f": {storm_names}" if storm_names else "")
            + "\n\nOnly PIDs the proxy tracked appear in the log: principals without any quota "
            "are not tracked, so give them a generous default quota to observe them."
        )
        recommended = [
            (str(r.principal), int(r.recommended_producer_ids_rate))
            for r in rates_pd.itertuples(index=False)
        ]
        offender_table = offenders_pd.rename(columns={"active_hours": "hours_active"})
        sections = [
            Section("Summary", summary),
            Section(
                f"Top {top_n} principals by new producer IDs",
                "new_pids sums the exact hourly distinct counts; ordered by new_pids.",
                offender_table,
                offenders_figure(
                    [
                        (str(p), int(v), int(r))
                        for p, v, r in zip(
                            offenders_pd["principal"],
                            offenders_pd["new_pids"],
                            offenders_pd["rejected_pids"],
                            strict=True,
                        )
                    ]
                ),
            ),
            Section(
                f"New producer IDs per {bucket_name}",
                (
                    f"Exact distinct new PIDs per {bucket_name}"
                    if bucket_s <= 3600
                    else f"New PIDs per {bucket_name} (the sum of its hours' exact distinct counts)"
                )
                + f" ({bucket_s} s buckets, chosen from the period), the top {len(top5)} "
                f"principal(s) by new PIDs; buckets without events are 0.",
                None,
                timeline_figure(series, bucket_s, bucket_name, start_s, end_s),
            ),
            Section(
                "Recommended producer_ids_rate per principal",
                "Restart storms first. Steady principals: "
                + rate_rule(percentile, headroom)
                + "\n\nStorms: "
                + storm_rule(percentile, headroom)
                + "\n\n"
                + _storm_reasons(rates_pd)
                + "\n\nAs pidgate config:\n"
                + _yaml_snippet(recommended),
                _display_rates(rates_pd, percentile),
            ),
        ]
        lines = [
            f"{total:,} events ({bad_lines} bad lines skipped), {totals['principals']} "
            f"principals, {_utc(first_ms)} .. {_utc(last_ms)}",
            f"new PIDs: {totals['new_pids'] or 0:,}; rejected Produce requests: "
            f"{totals['rejected_requests'] or 0:,}",
        ]
        for row in offenders_pd.head(3).itertuples(index=False):
            lines.append(f"  top: {row.principal}: {int(row.new_pids):,} new PIDs")
        for row in storms.head(5).itertuples(index=False):
            lines.append(
                f"  restart storm: {row.principal}: recommended producer_ids_rate "
                f"{int(row.recommended_producer_ids_rate)} ({row.reason})"
            )
        return ActivityReport(
            sections=sections,
            frames={"hourly": hourly, "top_offenders": offenders, "recommendations": rates},
            summary=lines,
            bucket_s=bucket_s,
            first_ms=first_ms,
            last_ms=last_ms,
            events=total,
            cached=cached,
        )
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise


def run_activity(
    spark: SparkSession,
    events_path: str | EventFiles,
    output: str,
    *,
    top_n: int = 20,
    percentile: float = 0.99,
    headroom: float = 1.5,
    since_ms: int | None = None,
    until_ms: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """Read the event log at ``events_path`` (a path, or files from
    :func:`pidgate.pipeline.inputs.event_files`), write ``hourly``, ``top_offenders`` and
    ``recommendations`` Parquet plus ``report.html`` under ``output``; return the HTML path.
    Raises :class:`InputError` when there are no events."""
    report = build_activity_report(
        spark,
        events_path,
        top_n=top_n,
        percentile=percentile,
        headroom=headroom,
        since_ms=since_ms,
        until_ms=until_ms,
        progress=progress,
    )
    try:
        stage(progress, f"writing Parquet and report.html to {output} ...")
        path = write_report(output, "pidgate activity report", report.sections, report.frames)
        if progress is not None:
            progress.summarize(*report.summary)
        return path
    finally:
        report.release()
