"""The activity job's hourly counts: pure DataFrame -> DataFrame transforms.

* :func:`hourly_with_clients` / :func:`hourly_activity`: per principal and UTC hour, exact
  distinct new PIDs, rejected PIDs and requests, observe mode's would-be rejections,
  InitProducerId answers, and the hour's *demand*: distinct PIDs that asked to be new. The job
  computes the same numbers faster from :mod:`pidgate.pipeline.reading.eventfacts`
  (:func:`hourly_from_facts`); these two are the reference, on parsed events.
* :func:`pid_fates`: each distinct PID once, by what became of it (admitted at once, after
  waiting, never).
* :func:`top_offenders`: principals ranked by new PIDs over the whole period.
* :func:`bucketed_counts`: new PIDs and rejected requests per chart bucket.

Must not import the report (``pidgate.pipeline.outputs``), pandas, or the rest of the job: the
recommendations are :mod:`~pidgate.pipeline.jobs.activity_rates`', the report
:mod:`~pidgate.pipeline.jobs.activity`'s.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pidgate.pipeline.reading.eventfacts import (
    CLIENT,
    PID,
    REJECTED_REQUEST,
    WOULD_REJECT,
    WOULD_REQUEST,
)
from pidgate.pipeline.reading.events import ADMITTED_NEW, BAD, INIT_PRODUCER_ID, REJECTED, hour_of

__all__ = [
    "HOURLY_PARQUET",
    "bucketed_counts",
    "hourly_activity",
    "hourly_from_facts",
    "hourly_with_clients",
    "pid_fates",
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
HOURLY_PARQUET = (*_HOURLY_COLUMNS, "would_reject_pids", "would_reject_requests")


def _count(condition: Column) -> Column:
    """The rows of a group for which ``condition`` holds."""
    return F.count(F.when(condition, True))


def hourly_from_facts(facts: DataFrame) -> DataFrame:
    """:func:`hourly_with_clients` (``keep_bad``) from
    :func:`~pidgate.pipeline.reading.eventfacts.event_facts`: the same columns and values,
    counted from facts that are already distinct per key."""
    kind = F.col("kind")
    pid = kind == PID
    is_new, is_rejected, is_would = F.col("is_new"), F.col("is_rejected"), F.col("is_would")
    return (
        facts.groupBy(BAD, "principal", "hour_s")
        .agg(
            _count(pid & is_new).alias("new_pids"),
            _count(pid & is_rejected).alias("rejected_pids"),
            _count(kind == REJECTED_REQUEST).alias("rejected_requests"),
            _count(pid & (is_new | is_rejected | is_would)).alias("demanded_pids"),
            F.coalesce(F.sum("init_producer_ids"), F.lit(0)).alias("init_producer_ids"),
            F.max("throttle_ms_max").alias("throttle_ms_max"),
            _count(pid & is_would).alias("would_reject_pids"),
            _count(kind == WOULD_REQUEST).alias("would_reject_requests"),
            _count(pid & (is_rejected | is_would)).alias("refused_pids"),
            _count(kind == CLIENT).alias("clients"),
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
    return per_pid.groupBy("principal").agg(
        _count(n.isNotNull() & (r.isNull() | (r >= n))).alias("admitted_at_once"),
        _count(n.isNotNull() & (r < n)).alias("admitted_after_rejection"),
        _count(n.isNull() & r.isNotNull()).alias("never_admitted"),
        _count(w.isNotNull()).alias("would_reject_pids"),
        _count(w.isNotNull() & (n > w)).alias("would_wait_pids"),
        _count(w.isNotNull() & n.isNull()).alias("would_never_pids"),
    )


def hourly_activity(events: DataFrame) -> DataFrame:
    """Per ``principal`` and ``hour`` (UTC, timestamp) with any event: ``new_pids`` (exact
    distinct ``admitted_new`` PIDs), ``rejected_pids`` (distinct PIDs of rejected requests),
    ``rejected_requests`` (distinct ``(instance, request_id)``), ``demanded_pids`` (distinct PIDs
    admitted as new or rejected), ``init_producer_ids`` (events) and ``throttle_ms_max``."""
    return hourly_with_clients(events).select(*_HOURLY_COLUMNS)


#: Summed over the period per principal by :func:`top_offenders`, besides ``new_pids``.
_OFFENDER_SUMS = ("rejected_pids", "rejected_requests", "init_producer_ids")


def top_offenders(hourly: DataFrame, n: int) -> DataFrame:
    """The ``n`` principals with the most new PIDs over the period (sum of hourly exact
    counts), ties by name: ``new_pids``, ``peak_hourly_new_pids``, ``rejected_pids``,
    ``rejected_requests``, ``init_producer_ids``, ``active_hours``."""
    return (
        hourly.groupBy("principal")
        .agg(
            F.sum("new_pids").alias("new_pids"),
            F.max("new_pids").alias("peak_hourly_new_pids"),
            *(F.sum(name).alias(name) for name in _OFFENDER_SUMS),
            F.count(F.lit(1)).alias("active_hours"),
        )
        .orderBy(F.desc("new_pids"), F.asc("principal"))
        .limit(n)
    )


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
