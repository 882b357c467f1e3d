"""``pidgate analyze activity``: who creates producer IDs, and what quota to give them. The
job's entry point (:func:`run_activity`) and its report (:func:`build_activity_report`).

The transforms are pure and live beside it: hourly counts in
:mod:`~pidgate.pipeline.jobs.activity_hourly`, recommendations in
:mod:`~pidgate.pipeline.jobs.activity_rates`, charts and texts in
:mod:`~pidgate.pipeline.jobs.activity_charts`. This module reads the event log, calls them,
and turns their results into the report's sections and the terminal's summary; it must not
import another job, nor ``pipeline.cli``.

The event log only holds PIDs that were new or rejected: a principal with no quota at all is not
tracked by the proxy, so its PIDs are logged only when it has a quota (set a generous default
quota to observe before enforcing).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TypedDict, Unpack

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.jobs.activity_charts import (
    PidFates,
    display_rates,
    duration,
    fates_figure,
    rate_columns_text,
    storm_reasons,
    timeline_figure,
    utc,
    window_name,
    yaml_snippet,
)
from pidgate.pipeline.jobs.activity_hourly import HOURLY_PARQUET, top_offenders
from pidgate.pipeline.jobs.activity_parts import (
    activity_parts,
    buckets_from_parts,
    fates_from_parts,
    hourly_from_parts,
    packing,
    shuffle_partitions,
)
from pidgate.pipeline.jobs.activity_rates import rate_rule, recommend_with_storms, storm_rule
from pidgate.pipeline.outputs.report import (
    Section,
    is_local_uri,
    warm_up_figures,
    write_report,
)
from pidgate.pipeline.outputs.timebuckets import choose_bucket
from pidgate.pipeline.reading.eventfacts import (
    DRIVER_BYTES,
    PID,
    event_facts_source,
    local_bytes,
)
from pidgate.pipeline.reading.events import BAD
from pidgate.pipeline.reading.inputs import EventFiles, InputError, event_files
from pidgate.pipeline.spark.progress import Progress, stage

__all__ = [
    "ActivityOptions",
    "ActivityReport",
    "PeriodTotals",
    "build_activity_report",
    "read_parts",
    "run_activity",
]


class ActivityOptions(TypedDict, total=False):
    """:func:`build_activity_report`'s keyword arguments, which :func:`run_activity` passes on."""

    top_n: int
    percentile: float
    headroom: float
    window_s: int
    since_ms: int | None
    until_ms: int | None
    progress: Progress | None


@dataclass(frozen=True)
class PeriodTotals:
    """The good events of the period, totalled (a count of nothing is 0), and the bad lines
    skipped."""

    bad_lines: int
    events: int
    first_ms: int
    last_ms: int
    principals: int
    new_pids: int
    rejected_pids: int
    rejected_requests: int
    init_producer_ids: int
    would_reject_pids: int
    would_reject_requests: int


#: Summed over every principal and hour of the period by :func:`period_totals`.
_SUMMED = (
    "events",
    "new_pids",
    "rejected_pids",
    "rejected_requests",
    "init_producer_ids",
    "would_reject_pids",
    "would_reject_requests",
)


def period_totals(
    hourly_all: DataFrame, files: EventFiles, since_ms: int | None, until_ms: int | None
) -> PeriodTotals:
    """:class:`PeriodTotals` of :func:`hourly_from_parts`' rows (bad lines included); raises
    :class:`InputError` when no good event is in the period."""
    counts = {
        bool(row[BAD]): row
        for row in hourly_all.groupBy(BAD)
        .agg(
            F.min("first_ts_ms").alias("first_ms"),
            F.max("last_ts_ms").alias("last_ms"),
            # The set of names rather than countDistinct: one aggregation instead of two
            # (countDistinct expands every row), so one Spark job fewer.
            F.size(F.collect_set("principal")).alias("principals"),
            *(F.sum(name).alias(name) for name in _SUMMED),
        )
        .collect()
    }
    bad_lines = int(counts[True]["events"]) if True in counts else 0
    good = counts.get(False)
    if good is None or not good["events"]:
        period = " in the period given" if since_ms or until_ms else ""
        raise InputError(
            f"--events {files.described}: no events{period} "
            f"({bad_lines} bad lines skipped); nothing to report"
        )
    named = (f.name for f in fields(PeriodTotals) if f.name != "bad_lines")
    return PeriodTotals(bad_lines, *(int(good[name] or 0) for name in named))


@dataclass
class ActivityReport:
    """What :func:`build_activity_report` computed: the report's sections, the DataFrames
    written as Parquet, a short summary for the terminal, and the chart bucket."""

    sections: list[Section]
    frames: dict[str, DataFrame]
    summary: list[str]
    bucket_s: int
    period: PeriodTotals
    cached: list[DataFrame] = field(default_factory=list)

    @property
    def first_ms(self) -> int:
        return self.period.first_ms

    @property
    def last_ms(self) -> int:
        return self.period.last_ms

    @property
    def events(self) -> int:
        return self.period.events

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def read_parts(
    spark: SparkSession,
    files: EventFiles,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> DataFrame:
    """The activity's parts (:mod:`~pidgate.pipeline.jobs.activity_parts`) of ``files``: local
    files are read by the Python workers (or, when small, by the driver), other URIs through
    Spark's text reader; the facts are shuffled once and reduced in Arrow."""
    local = all(is_local_uri(p) for p in files.paths)
    paths = [p.removeprefix("file://").removeprefix("file:") for p in files.paths]
    if local:
        paths = [str(Path(p)) for p in paths]
    partitions = shuffle_partitions(spark, local_bytes(paths) if local else None)
    source = event_facts_source(
        spark, paths, local=local, since_ms=since_ms, until_ms=until_ms, packing=packing(partitions)
    )
    return activity_parts(spark, source, partitions)


def build_activity_report(
    spark: SparkSession,
    events_path: str | EventFiles,
    *,
    top_n: int = 20,
    percentile: float = 0.99,
    headroom: float = 1.5,
    window_s: int = 3600,
    since_ms: int | None = None,
    until_ms: int | None = None,
    progress: Progress | None = None,
) -> ActivityReport:
    """Everything :func:`run_activity` writes, computed; raises :class:`InputError` when no
    event is in the log (or the period). Call :meth:`ActivityReport.release` afterwards."""
    files = event_files(events_path) if isinstance(events_path, str) else events_path
    stage(progress, f"reading the event log {files.described} ...")
    # One pass over the JSON (module eventfacts) and one shuffle of its facts, reduced to small
    # parts (module activity_parts); everything below reads the cached parts.
    parts = read_parts(spark, files, since_ms, until_ms).cache()
    hourly_all = hourly_from_parts(parts).cache()
    cached: list[DataFrame] = [parts, hourly_all]
    try:
        totals = period_totals(hourly_all, files, since_ms, until_ms)
        stage(progress, f"{totals.events:,} events read; ranking principals ...")
        hourly_clients = hourly_all.filter(~F.col(BAD)).drop(BAD)
        hourly = hourly_clients.select(*HOURLY_PARQUET)
        fates = fates_from_parts(parts)
        stage(progress, "ranking principals and telling restart storms from steady demand ...")
        # Two small, independent jobs: planned and run side by side (Spark takes jobs from
        # several threads), so that one's planning and scheduling overlap the other's. Both
        # are written as Parquet afterwards: cached, so the writes do not compute them again.
        with ThreadPoolExecutor(max_workers=3) as pool:
            # matplotlib imported meanwhile, for the charts below (its errors recur there)
            pool.submit(warm_up_figures)
            offenders_job = pool.submit(
                _cached_and_collected,
                lambda: (
                    top_offenders(hourly, top_n)
                    .join(fates, "principal", "left")
                    .orderBy(F.desc("new_pids"), F.asc("principal"))
                ),
            )
            rates_job = pool.submit(
                _cached_and_collected,
                lambda: recommend_with_storms(hourly_clients, percentile, headroom, window_s),
            )
            # Each frame joins the cached ones once its job is through, so a failure of the
            # other still releases it (below).
            cached += [job.result()[0] for job in (offenders_job, rates_job) if not job.exception()]
        (offenders, offenders_pd), (rates, rates_pd) = offenders_job.result(), rates_job.result()

        bucket_s, bucket_name = choose_bucket(totals.first_ms, totals.last_ms)
        stage(progress, f"charting new PIDs per {bucket_name} ...")
        timeline = _timeline_section(parts, offenders_pd, totals, bucket_s, bucket_name)
        storms = rates_pd[rates_pd["storm"]] if len(rates_pd) else rates_pd
        limited = since_ms is not None or until_ms is not None
        sections = [
            Section("Summary", _summary_text(files, totals, storms, window_s, limited)),
            _offenders_section(offenders_pd, top_n),
            timeline,
            _rates_section(rates_pd, percentile, headroom, window_s),
        ]
        if totals.would_reject_requests:
            sections.append(_observe_section(hourly, offenders_pd_all(fates)))
        frames = {"hourly": hourly, "top_offenders": offenders, "recommendations": rates}
        summary = _terminal_lines(totals, offenders_pd, storms, window_s)
        return ActivityReport(sections, frames, summary, bucket_s, totals, cached)
    except BaseException:
        for frame in cached:
            frame.unpersist()
        raise


def _cached_and_collected(frame_of: Callable[[], DataFrame]) -> tuple[DataFrame, pd.DataFrame]:
    """``frame_of()``, cached, and its rows in pandas."""
    frame = frame_of().cache()
    try:
        return frame, frame.toPandas()
    except BaseException:
        frame.unpersist()
        raise


def _summary_text(
    files: EventFiles, totals: PeriodTotals, storms: pd.DataFrame, window_s: int, limited: bool
) -> str:
    """The report's Summary section; ``limited``: the period was cut by --since/--until."""
    source = (
        f"{files.file_count} file(s) under {files.described}"
        if files.file_count is not None
        else files.described
    )
    if files.renamed:
        source += f" ({files.renamed} with ':' in the name, read through safe-named links)"
    span = duration((totals.last_ms - totals.first_ms) / 1000)
    storm_names = ", ".join(str(p) for p in storms["principal"].head(10))
    return (
        f"Event log: {source}\n"
        f"Bad lines skipped: {totals.bad_lines}\n"
        f"Period: {utc(totals.first_ms)} .. {utc(totals.last_ms)} ({span})"
        + ("; limited to --since/--until" if limited else "")
        + "\n"
        f"Events: {totals.events:,}\n"
        f"Principals: {totals.principals}\n"
        f"New producer IDs (sum of hourly exact distinct counts): {totals.new_pids:,}\n"
        f"Rejected PIDs: {totals.rejected_pids:,} in "
        f"{totals.rejected_requests:,} rejected Produce requests\n"
        f"Observe mode, would have been rejected: {totals.would_reject_pids:,} PIDs "
        f"in {totals.would_reject_requests:,} requests\n"
        f"InitProducerId answers: {totals.init_producer_ids:,}\n"
        f"Restart storms: {len(storms)} principal(s)"
        + (f": {storm_names}" if storm_names else "")
        + f"\nQuota window the recommendations are for: {window_s} s"
        + "\n\nOnly PIDs the proxy tracked appear in the log: principals without any quota "
        "are not tracked, so give them a generous default quota to observe them."
    )


def _offenders_section(offenders_pd: pd.DataFrame, top_n: int) -> Section:
    """The top principals by new PIDs: a table, and each one's distinct PIDs by fate."""
    fates_list = [
        PidFates(
            str(r.principal),
            int(r.admitted_at_once),
            int(r.admitted_after_rejection),
            int(r.never_admitted),
            int(r.rejected_requests),
        )
        for r in offenders_pd.fillna(0).itertuples(index=False)
    ]
    offender_table = pd.DataFrame(
        {
            "principal": offenders_pd["principal"],
            "distinct PIDs": [f.pids for f in fates_list],
            "admitted at first try": offenders_pd["admitted_at_once"],
            "admitted after waiting": offenders_pd["admitted_after_rejection"],
            "never admitted": offenders_pd["never_admitted"],
            "rejected requests": offenders_pd["rejected_requests"],
            "new_pids (sum of hourly)": offenders_pd["new_pids"],
            "peak new PIDs in an hour": offenders_pd["peak_hourly_new_pids"],
            "InitProducerId answers": offenders_pd["init_producer_ids"],
            "hours active": offenders_pd["active_hours"],
        }
    )
    return Section(
        f"Top {top_n} principals by new producer IDs",
        "Each distinct PID of the period is counted once, by what became of it: "
        "admitted at its first try, admitted after one or more rejections (it waited "
        "for a token), or never admitted. The three add up to the distinct PIDs that "
        "asked to be new. Rejected requests are a count of Produce requests, not of "
        "PIDs (a waiting producer retries), so they are written beside the bars, not "
        "stacked on them. new_pids sums the exact hourly distinct counts (a PID new "
        "in two hours counts twice); ordered by it.",
        offender_table,
        fates_figure(fates_list),
    )


def _timeline_section(
    parts: DataFrame,
    offenders_pd: pd.DataFrame,
    totals: PeriodTotals,
    bucket_s: int,
    bucket_name: str,
) -> Section:
    """New PIDs and rejected requests per ``bucket_s`` for the top 5 principals."""
    top5 = [str(p) for p in offenders_pd["principal"].head(5)]
    new_series: dict[str, dict[int, int]] = {p: {} for p in top5}
    rejected_series: dict[str, dict[int, int]] = {p: {} for p in top5}
    for row in buckets_from_parts(parts, bucket_s, top5).collect():
        series = new_series if row["kind"] == PID else rejected_series
        series[row["principal"]][int(row["bucket"])] = int(row["count"])
    start_s = totals.first_ms // 1000 // bucket_s * bucket_s
    end_s = (totals.last_ms // 1000 // bucket_s + 1) * bucket_s
    return Section(
        f"New producer IDs and rejections per {bucket_name}",
        f"Solid: new PIDs per {bucket_name}, each PID at its first admission in the "
        f"hour; dashed: rejected Produce requests per {bucket_name} ({bucket_s} s "
        f"buckets, chosen from the period), for the top {len(top5)} principal(s) by "
        "new PIDs; buckets without events are 0. Quota changes are not written to the "
        "event log, so the chart cannot show them.",
        None,
        timeline_figure(new_series, rejected_series, bucket_s, bucket_name, start_s, end_s),
    )


def _rates_section(
    rates_pd: pd.DataFrame, percentile: float, headroom: float, window_s: int
) -> Section:
    """The recommended ``producer_ids_rate`` per principal, the rules, and the config."""
    recommended = [
        (str(r.principal), int(r.recommended_producer_ids_rate))
        for r in rates_pd.itertuples(index=False)
    ]
    return Section(
        "Recommended producer_ids_rate per principal",
        "Restart storms first. Steady principals: "
        + rate_rule(percentile, headroom)
        + "\n\nStorms: "
        + storm_rule(percentile, headroom)
        + "\n\n"
        + rate_columns_text(percentile, headroom, window_s)
        + "\n\n"
        + storm_reasons(rates_pd)
        + "\n\nAs pidgate config:\n"
        + yaml_snippet(recommended, window_s),
        display_rates(rates_pd, percentile, window_s),
    )


def _observe_section(hourly: DataFrame, fates_pd: pd.DataFrame, limit: int = 48) -> Section:
    """What enforcement would have done, from observe mode's ``would_reject`` events."""
    per_hour: pd.DataFrame = (
        hourly.filter(F.col("would_reject_requests") > 0)
        .select(
            "principal",
            F.date_format("hour", "yyyy-MM-dd HH:mm").alias("hour (UTC)"),
            F.col("would_reject_requests").alias("would-be rejected requests"),
            F.col("would_reject_pids").alias("distinct PIDs they carried"),
            F.col("demanded_pids").alias("PIDs that asked to be new"),
        )
        .orderBy("hour (UTC)", "principal")
        .limit(limit + 1)
        .toPandas()
    )
    fates = fates_pd[fates_pd["would_reject_pids"] > 0]
    lines = [
        "In observe mode pidgate decides every Produce request as it would when enforcing, "
        "but forwards all of them; where it would have rejected one it logs a would_reject "
        "event per PID. Counted here like rejections (and so in the storm rule), they show "
        "what enforcement with the same quota would have done. The table lists them per "
        "principal and UTC hour; hourly.parquet has would_reject_requests and "
        "would_reject_pids for every hour."
    ]
    for row in fates.itertuples(index=False):
        lines.append(
            f"  {row.principal}: {int(row.would_reject_pids):,} PIDs would have been rejected "
            f"at least once; {int(row.would_wait_pids):,} of them were admitted later (would "
            f"have waited), {int(row.would_never_pids):,} never got a token in the period"
        )
    if len(per_hour) > limit:
        lines.append(f"(first {limit} hours shown; all of them in hourly.parquet)")
    return Section(
        "What enforcement would have done (observe mode)",
        "\n".join(lines),
        per_hour.head(limit),
    )


def _terminal_lines(
    totals: PeriodTotals, offenders_pd: pd.DataFrame, storms: pd.DataFrame, window_s: int
) -> list[str]:
    """The few lines the terminal shows once the report is written."""
    lines = [
        f"{totals.events:,} events ({totals.bad_lines} bad lines skipped), {totals.principals} "
        f"principals, {utc(totals.first_ms)} .. {utc(totals.last_ms)}",
        f"new PIDs: {totals.new_pids:,}; rejected Produce requests: {totals.rejected_requests:,}",
    ]
    if totals.would_reject_requests:
        lines.append(
            f"observe mode: {totals.would_reject_requests:,} requests "
            f"({totals.would_reject_pids:,} PIDs) would have been rejected"
        )
    for row in offenders_pd.head(3).itertuples(index=False):
        lines.append(f"  top: {row.principal}: {int(row.new_pids):,} new PIDs")
    window = window_name(window_s)
    for row in storms.head(5).itertuples(index=False):
        lines.append(
            f"  restart storm: {row.principal}: recommended producer_ids_rate "
            f"{int(row.recommended_producer_ids_rate)} per {window} window ({row.reason})"
        )
    return lines


def offenders_pd_all(fates: DataFrame) -> pd.DataFrame:
    """The observe-mode counts of :func:`fates_from_parts` for principals with would-be
    rejections."""
    result: pd.DataFrame = (
        fates.filter(F.col("would_reject_pids") > 0).orderBy(F.desc("would_reject_pids")).toPandas()
    )
    return result


def run_activity(
    spark: SparkSession,
    events_path: str | EventFiles,
    output: str,
    **options: Unpack[ActivityOptions],
) -> Path:
    """Read the event log at ``events_path`` (a path, or files from
    :func:`pidgate.pipeline.reading.inputs.event_files`), write ``hourly``, ``top_offenders`` and
    ``recommendations`` Parquet plus ``report.html`` under ``output``; return the HTML path.
    ``options`` are :func:`build_activity_report`'s (``window_s`` is the quota window the
    recommendations are for). Raises :class:`InputError` when there are no events."""
    files = event_files(events_path) if isinstance(events_path, str) else events_path
    progress = options.get("progress")
    # A small log makes small aggregates: one shuffle partition instead of the session's few
    # saves a task per partition in each of the job's dozen stages (restored afterwards).
    small = all(is_local_uri(p) for p in files.paths) and local_bytes(files.paths) <= DRIVER_BYTES
    partitions = spark.conf.get("spark.sql.shuffle.partitions") or "200"
    if small:
        spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        report = build_activity_report(spark, files, **options)
        try:
            stage(progress, f"writing Parquet and report.html to {output} ...")
            path = write_report(output, "pidgate activity report", report.sections, report.frames)
            if progress is not None:
                progress.summarize(*report.summary)
            return path
        finally:
            report.release()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
