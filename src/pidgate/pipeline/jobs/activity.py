"""``pidgate analyze activity``: who creates producer IDs, and what quota to give them.

Pure transforms (DataFrame -> DataFrame), then a thin entry point:

* :func:`hourly_with_clients` / :func:`hourly_activity`: per principal and UTC hour, exact
  distinct new PIDs, rejected PIDs and requests, observe mode's would-be rejections,
  InitProducerId answers, and the hour's *demand*: distinct PIDs that asked to be new. The job
  computes the same numbers faster from :mod:`pidgate.pipeline.reading.eventfacts`
  (:func:`hourly_from_facts`); these two are the reference, on parsed events.
* :func:`pid_fates`: each distinct PID once, by what became of it (admitted at once, after
  waiting, never).
* :func:`top_offenders`: principals ranked by new PIDs over the whole period.
* :func:`recommend_with_storms`: a ``producer_ids_rate`` per principal and quota window, with
  restart storms told apart (:func:`storm_rule`); :func:`recommend_rates` is the plain rule.

The event log only holds PIDs that were new or rejected: a principal with no quota at all is not
tracked by the proxy, so its PIDs are logged only when it has a quota (set a generous default
quota to observe before enforcing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import Column, DataFrame, SparkSession
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
from pidgate.pipeline.outputs.report import Section, is_local_uri, write_report
from pidgate.pipeline.outputs.timebuckets import choose_bucket
from pidgate.pipeline.reading.eventfacts import (
    CLIENT,
    DRIVER_BYTES,
    PID,
    REJECTED_REQUEST,
    WOULD_REJECT,
    WOULD_REQUEST,
    event_facts,
    local_bytes,
)
from pidgate.pipeline.reading.events import ADMITTED_NEW, BAD, INIT_PRODUCER_ID, REJECTED, hour_of
from pidgate.pipeline.reading.inputs import EventFiles, InputError, event_files
from pidgate.pipeline.spark.progress import Progress, stage

__all__ = [
    "ActivityReport",
    "build_activity_report",
    "hourly_activity",
    "hourly_from_facts",
    "hourly_with_clients",
    "pid_fates",
    "rate_rule",
    "read_facts",
    "recommend_rates",
    "recommend_with_storms",
    "run_activity",
    "storm_rule",
    "top_offenders",
]


def hourly_with_clients(events: DataFrame, keep_bad: bool = False) -> DataFrame:
    """:func:`hourly_activity` plus ``clients`` (distinct client ids; a missing one counts as
    one client), ``events``, ``first_ts_ms`` and ``last_ts_ms`` per principal and hour, in one
    aggregation (one pass over the input).

    With ``keep_bad``, ``events`` comes from
    :func:`~pidgate.pipeline.reading.events.read_events_marked`
    and its ``bad`` column is a key too: the bad lines form one row (null principal and hour)
    whose ``events`` counts them."""
    event = F.col("event")
    pid = F.col("producer_id")
    is_new = event == ADMITTED_NEW
    is_rejected = event == REJECTED
    is_would = event == WOULD_REJECT
    request_key = F.concat_ws("#", F.coalesce(F.col("instance"), F.lit("")), F.col("request_id"))
    wanted = event.isin(ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID, WOULD_REJECT)
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
            F.countDistinct(F.when(is_rejected, request_key)).alias("rejected_requests"),
            F.countDistinct(F.when(is_new | is_rejected | is_would, pid)).alias("demanded_pids"),
            F.count(F.when(event == INIT_PRODUCER_ID, True)).alias("init_producer_ids"),
            F.max(F.when(is_rejected, F.col("throttle_ms"))).alias("throttle_ms_max"),
            F.countDistinct(F.when(is_would, pid)).alias("would_reject_pids"),
            F.countDistinct(F.when(is_would, request_key)).alias("would_reject_requests"),
            F.countDistinct(F.when(is_rejected | is_would, pid)).alias("refused_pids"),
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
#: What ``hourly.parquet`` holds: the above plus observe mode's would-be rejections.
_HOURLY_PARQUET = (*_HOURLY_COLUMNS, "would_reject_pids", "would_reject_requests")


def hourly_from_facts(facts: DataFrame) -> DataFrame:
    """:func:`hourly_with_clients` (``keep_bad``) from
    :func:`~pidgate.pipeline.reading.eventfacts.event_facts`: the same columns and values, counted
    from
    facts that are already distinct per key."""
    kind = F.col("kind")
    pid = kind == PID

    def count(condition: Column) -> Column:
        return F.count(F.when(condition, True))

    is_new, is_rejected, is_would = F.col("is_new"), F.col("is_rejected"), F.col("is_would")
    return (
        facts.groupBy(BAD, "principal", "hour_s")
        .agg(
            count(pid & is_new).alias("new_pids"),
            count(pid & is_rejected).alias("rejected_pids"),
            count(kind == REJECTED_REQUEST).alias("rejected_requests"),
            count(pid & (is_new | is_rejected | is_would)).alias("demanded_pids"),
            F.coalesce(F.sum("init_producer_ids"), F.lit(0)).alias("init_producer_ids"),
            F.max("throttle_ms_max").alias("throttle_ms_max"),
            count(pid & is_would).alias("would_reject_pids"),
            count(kind == WOULD_REQUEST).alias("would_reject_requests"),
            count(pid & (is_rejected | is_would)).alias("refused_pids"),
            count(kind == CLIENT).alias("clients"),
            F.coalesce(F.sum("events"), F.lit(0)).alias("events"),
            F.min("first_ms").alias("first_ts_ms"),
            F.max("last_ms").alias("last_ts_ms"),
        )
        .withColumn("hour", F.timestamp_seconds(F.col("hour_s")))
        .drop("hour_s")
    )


def pid_fates(facts: DataFrame) -> DataFrame:
    """Per principal, each distinct PID of the period counted once: ``admitted_at_once``
    (admitted as new, never rejected before), ``admitted_after_rejection``,
    ``never_admitted`` (only rejected), and for observe mode ``would_reject_pids``,
    ``would_wait_pids`` (would-be rejected, admitted later) and ``would_never_pids``."""
    per_pid = (
        facts.filter(F.col("kind") == PID)
        .groupBy("principal", "pid")
        .agg(
            F.min("first_new_ms").alias("n"),
            F.min("first_rejected_ms").alias("r"),
            F.min("first_would_ms").alias("w"),
        )
    )
    n, r, w = F.col("n"), F.col("r"), F.col("w")

    def count(condition: Column) -> Column:
        return F.count(F.when(condition, True))

    return per_pid.groupBy("principal").agg(
        count(n.isNotNull() & (r.isNull() | (r >= n))).alias("admitted_at_once"),
        count(n.isNotNull() & (r < n)).alias("admitted_after_rejection"),
        count(n.isNull() & r.isNotNull()).alias("never_admitted"),
        count(w.isNotNull()).alias("would_reject_pids"),
        count(w.isNotNull() & (n > w)).alias("would_wait_pids"),
        count(w.isNotNull() & n.isNull()).alias("would_never_pids"),
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
        f"x {headroom:g})) per hour, scaled to the quota window (see Columns), where hourly "
        f"demand is the number of distinct PIDs that asked to be "
        f"new in one UTC hour (admitted as new or rejected), and the percentile is exact "
        f"(linear interpolation) over the hours in which the principal had any event."
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
#: ... or at least this share of the PIDs that asked was refused (rejected, or would have been
#: in observe mode): more PIDs wanted than the quota gives, whatever the client ids.
STORM_REFUSED_SHARE = 0.25


def storm_rule(percentile: float = 0.99, headroom: float = 1.5) -> str:
    """How storms are told from steady demand, in words, as printed in the report."""
    return (
        f"An hour is a restart-storm hour for a principal when at least {STORM_MIN_DEMAND} PIDs "
        f"asked to be new and either each of its clients (client.id) asked for "
        f"{STORM_PIDS_PER_CLIENT:g} or more on average (producers restarting, or one producer "
        f"per batch: short-lived PIDs), or {STORM_REFUSED_SHARE:.0%} or more of them were "
        f"rejected (or would have been, in observe mode) at least once: more PIDs asked than "
        f"the quota gives, which is what a storm of short-lived producers looks like even when "
        f"each has its own client.id. For a principal with storm hours the quota comes from "
        f"its healthy baseline, not from the storm: p{percentile * 100:g} of the demand of its "
        f"other hours x {headroom:g}, or, when every hour stormed, the smaller of "
        f"p{percentile * 100:g} of its clients per hour x {headroom:g} (one new PID per "
        f"producer per hour) and p{percentile * 100:g} of its PIDs per hour that were admitted "
        f"without being refused (what the current quota let through at once, not the storm "
        f"that waited for tokens: a storm never loosens its quota)."
    )


def recommend_with_storms(
    hourly: DataFrame, percentile: float = 0.99, headroom: float = 1.5, window_s: int = 3600
) -> DataFrame:
    """:func:`recommend_rates` with restart storms told apart (:func:`storm_rule`), from
    :func:`hourly_with_clients` (which has ``clients``). Per principal: ``storm`` (any storm
    hour), ``storm_hours``, ``peak_pids_per_client``, ``rejected_share`` (of the PIDs that
    asked, those refused), ``baseline_hourly_demand``, ``recommended_per_hour``, ``window_s``,
    ``recommended_producer_ids_rate`` (per ``window_s`` window: the per-hour figure scaled,
    at least 1) and ``reason`` (one sentence). Storms first, then by recommendation, name."""
    if not 0.0 <= percentile <= 1.0:
        raise ValueError(f"percentile must be in [0, 1], got {percentile}")
    if headroom <= 0:
        raise ValueError(f"headroom must be > 0, got {headroom}")
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    demand = F.col("demanded_pids")
    refused = F.col("refused_pids") if "refused_pids" in hourly.columns else F.col("rejected_pids")
    per_client = demand / F.greatest(F.col("clients"), F.lit(1))
    refused_share = F.when(demand > 0, refused / demand).otherwise(0.0)
    stormy = (demand >= STORM_MIN_DEMAND) & (
        (per_client >= STORM_PIDS_PER_CLIENT) | (refused_share >= STORM_REFUSED_SHARE)
    )
    hours = (
        hourly.withColumn("refused", refused)
        .withColumn("clients", F.greatest(F.col("clients"), F.lit(1)))
        .withColumn("per_client", per_client)
        .withColumn("stormy", stormy)
    )
    p_all = F.percentile(demand.cast("double"), F.lit(percentile))
    p_healthy = F.percentile(F.when(~F.col("stormy"), demand.cast("double")), F.lit(percentile))
    p_clients = F.percentile(F.col("clients").cast("double"), F.lit(percentile))
    # PIDs admitted and never refused in the hour (demand = new | refused): what the quota let
    # through at once, not the storm that waited for tokens.
    p_admitted = F.percentile((demand - F.col("refused")).cast("double"), F.lit(percentile))
    agg = hours.groupBy("principal").agg(
        F.count(F.lit(1)).alias("active_hours"),
        F.max(demand).alias("peak_hourly_demand"),
        p_all.alias("percentile_hourly_demand"),
        F.count(F.when(F.col("stormy"), True)).alias("storm_hours"),
        F.round(F.max("per_client"), 1).alias("peak_pids_per_client"),
        F.round(F.sum("refused") / F.greatest(F.sum(demand), F.lit(1)), 3).alias("rejected_share"),
        p_healthy.alias("healthy"),
        p_clients.alias("clients_p"),
        p_admitted.alias("admitted_p"),
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

    def rate(scale: float) -> Column:
        # Rounded first, so that admitted / headroom x headroom stays a whole number.
        scaled = F.round(baseline * F.lit(headroom * scale), 6)
        return F.greatest(F.lit(1).cast("long"), F.ceil(scaled).cast("long"))

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
                f"refused); from its healthy hours: {p} %.0f x {headroom:g}",
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
                f"refused); the smaller of {p} %.0f clients/h x {headroom:g} and {p} %.0f "
                f"PIDs/h admitted at first try",
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
        .withColumn("recommended_producer_ids_rate", rate(window_s / 3600))
        .withColumn("recommended_per_hour", rate(1.0))
        .withColumn("window_s", F.lit(window_s).cast("long"))
        .withColumn("reason", reason)
        .select(
            "principal",
            "storm",
            "recommended_producer_ids_rate",
            "window_s",
            "recommended_per_hour",
            "active_hours",
            "storm_hours",
            "peak_hourly_demand",
            "percentile_hourly_demand",
            "baseline_hourly_demand",
            "peak_pids_per_client",
            "rejected_share",
            "reason",
        )
        .orderBy(F.desc("storm"), F.desc("recommended_per_hour"), F.asc("principal"))
    )


# -- the report ------------------------------------------------------------------------------


def bucketed_counts(facts: DataFrame, bucket_s: int, principals: list[str]) -> DataFrame:
    """Per principal of ``principals``, ``kind`` (PID: new PIDs, at their first admission in
    each hour; REJECTED_REQUEST: rejected requests, at their first event) and ``bucket``
    (epoch seconds of its start): ``count``."""
    first = F.coalesce(F.col("first_new_ms"), F.col("first_ms"))
    bucket = (F.floor(first / (1000 * bucket_s)) * bucket_s).cast("long")
    wanted = ((F.col("kind") == PID) & F.col("is_new")) | (F.col("kind") == REJECTED_REQUEST)
    return (
        facts.filter(wanted & F.col("principal").isin(principals))
        .groupBy("principal", "kind", bucket.alias("bucket"))
        .agg(F.count(F.lit(1)).alias("count"))
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


def read_facts(
    spark: SparkSession,
    files: EventFiles,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> DataFrame:
    """:func:`~pidgate.pipeline.reading.eventfacts.event_facts` of ``files``: local files are read
    by
    the Python workers, other URIs through Spark's text reader."""
    local = all(is_local_uri(p) for p in files.paths)
    paths = [p.removeprefix("file://").removeprefix("file:") for p in files.paths]
    if local:
        paths = [str(Path(p)) for p in paths]
    return event_facts(spark, paths, local=local, since_ms=since_ms, until_ms=until_ms)


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
    # One pass over the JSON (module eventfacts): bad lines counted, good ones boiled down to
    # distinct facts per principal and hour; everything below reads the cached facts.
    facts = read_facts(spark, files, since_ms, until_ms).cache()
    hourly_all = hourly_from_facts(facts).cache()
    cached: list[DataFrame] = [facts, hourly_all]
    try:
        counts = {
            bool(row[BAD]): row
            for row in hourly_all.groupBy(BAD)
            .agg(
                F.sum("events").alias("events"),
                F.min("first_ts_ms").alias("first"),
                F.max("last_ts_ms").alias("last"),
                F.countDistinct("principal").alias("principals"),
                F.sum("new_pids").alias("new_pids"),
                F.sum("rejected_pids").alias("rejected_pids"),
                F.sum("rejected_requests").alias("rejected_requests"),
                F.sum("init_producer_ids").alias("init_producer_ids"),
                F.sum("would_reject_pids").alias("would_reject_pids"),
                F.sum("would_reject_requests").alias("would_reject_requests"),
            )
            .collect()
        }
        bad_lines = int(counts[True]["events"]) if True in counts else 0
        totals = counts.get(False)
        total = int(totals["events"]) if totals is not None else 0
        if totals is None or total == 0:
            period = " in the period given" if since_ms or until_ms else ""
            raise InputError(
                f"--events {files.described}: no events{period} "
                f"({bad_lines} bad lines skipped); nothing to report"
            )
        first_ms, last_ms = int(totals["first"]), int(totals["last"])
        stage(progress, f"{total:,} events read; ranking principals ...")
        hourly_clients = hourly_all.filter(~F.col(BAD)).drop(BAD)
        hourly = hourly_clients.select(*_HOURLY_PARQUET)
        fates = pid_fates(facts)
        offenders = (
            top_offenders(hourly, top_n)
            .join(fates, "principal", "left")
            .orderBy(F.desc("new_pids"), F.asc("principal"))
        )
        stage(progress, "telling restart storms from steady demand ...")
        rates = recommend_with_storms(hourly_clients, percentile, headroom, window_s)
        offenders_pd: pd.DataFrame = offenders.toPandas()
        rates_pd: pd.DataFrame = rates.toPandas()

        bucket_s, bucket_name = choose_bucket(first_ms, last_ms)
        stage(progress, f"charting new PIDs per {bucket_name} ...")
        top5 = [str(p) for p in offenders_pd["principal"].head(5)]
        new_series: dict[str, dict[int, int]] = {p: {} for p in top5}
        rejected_series: dict[str, dict[int, int]] = {p: {} for p in top5}
        for row in bucketed_counts(facts, bucket_s, top5).collect():
            series = new_series if row["kind"] == PID else rejected_series
            series[row["principal"]][int(row["bucket"])] = int(row["count"])
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
        span = duration((last_ms - first_ms) / 1000)
        storm_names = ", ".join(str(p) for p in storms["principal"].head(10))
        would_requests = int(totals["would_reject_requests"] or 0)
        summary = (
            f"Event log: {source}\n"
            f"Bad lines skipped: {bad_lines}\n"
            f"Period: {utc(first_ms)} .. {utc(last_ms)} ({span})"
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
            f"Observe mode, would have been rejected: {totals['would_reject_pids'] or 0:,} PIDs "
            f"in {would_requests:,} requests\n"
            f"InitProducerId answers: {totals['init_producer_ids'] or 0:,}\n"
            f"Restart storms: {len(storms)} principal(s)"
            + (f": {storm_names}" if storm_names else "")
            + f"\nQuota window the recommendations are for: {window_s} s"
            + "\n\nOnly PIDs the proxy tracked appear in the log: principals without any quota "
            "are not tracked, so give them a generous default quota to observe them."
        )
        recommended = [
            (str(r.principal), int(r.recommended_producer_ids_rate))
            for r in rates_pd.itertuples(index=False)
        ]
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
        sections = [
            Section("Summary", summary),
            Section(
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
            ),
            Section(
                f"New producer IDs and rejections per {bucket_name}",
                f"Solid: new PIDs per {bucket_name}, each PID at its first admission in the "
                f"hour; dashed: rejected Produce requests per {bucket_name} ({bucket_s} s "
                f"buckets, chosen from the period), for the top {len(top5)} principal(s) by "
                "new PIDs; buckets without events are 0. Quota changes are not written to the "
                "event log, so the chart cannot show them.",
                None,
                timeline_figure(new_series, rejected_series, bucket_s, bucket_name, start_s, end_s),
            ),
            Section(
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
            ),
        ]
        if would_requests:
            sections.append(_observe_section(hourly, offenders_pd_all(fates)))
        lines = [
            f"{total:,} events ({bad_lines} bad lines skipped), {totals['principals']} "
            f"principals, {utc(first_ms)} .. {utc(last_ms)}",
            f"new PIDs: {totals['new_pids'] or 0:,}; rejected Produce requests: "
            f"{totals['rejected_requests'] or 0:,}",
        ]
        if would_requests:
            lines.append(
                f"observe mode: {would_requests:,} requests ({totals['would_reject_pids']:,} "
                "PIDs) would have been rejected"
            )
        for row in offenders_pd.head(3).itertuples(index=False):
            lines.append(f"  top: {row.principal}: {int(row.new_pids):,} new PIDs")
        window = window_name(window_s)
        for row in storms.head(5).itertuples(index=False):
            lines.append(
                f"  restart storm: {row.principal}: recommended producer_ids_rate "
                f"{int(row.recommended_producer_ids_rate)} per {window} window ({row.reason})"
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


def offenders_pd_all(fates: DataFrame) -> pd.DataFrame:
    """The observe-mode counts of :func:`pid_fates` for principals with would-be rejections."""
    result: pd.DataFrame = (
        fates.filter(F.col("would_reject_pids") > 0).orderBy(F.desc("would_reject_pids")).toPandas()
    )
    return result


def run_activity(
    spark: SparkSession,
    events_path: str | EventFiles,
    output: str,
    *,
    top_n: int = 20,
    percentile: float = 0.99,
    headroom: float = 1.5,
    window_s: int = 3600,
    since_ms: int | None = None,
    until_ms: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """Read the event log at ``events_path`` (a path, or files from
    :func:`pidgate.pipeline.reading.inputs.event_files`), write ``hourly``, ``top_offenders`` and
    ``recommendations`` Parquet plus ``report.html`` under ``output``; return the HTML path.
    ``window_s`` is the quota window the recommendations are for. Raises
    :class:`InputError` when there are no events."""
    files = event_files(events_path) if isinstance(events_path, str) else events_path
    # A small log makes small aggregates: one shuffle partition instead of the session's few
    # saves a task per partition in each of the job's dozen stages (restored afterwards).
    small = all(is_local_uri(p) for p in files.paths) and local_bytes(files.paths) <= DRIVER_BYTES
    partitions = spark.conf.get("spark.sql.shuffle.partitions") or "200"
    if small:
        spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        report = build_activity_report(
            spark,
            files,
            top_n=top_n,
            percentile=percentile,
            headroom=headroom,
            window_s=window_s,
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
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
