"""``pidgate analyze backtest``: what a candidate quota config would have throttled.

The event log is replayed per principal in time order through pidgate's own
:class:`~pidgate.quota.QuotaManager` (``groupBy(...).applyInPandas``), not a re-implementation.
The events of one Produce request (same ``instance`` and ``request_id``: its ``admitted_new``,
``admitted_grandfathered`` and ``rejected`` events) are regrouped into one ``admit()`` call at
the request's ``ts_ms``, which is the proxy's quota clock (wall-clock ms), so with the config
the proxy ran with, the replay makes the decisions the proxy made
(tests/pipeline/jobs/test_backtest.py).

PIDs the proxy grandfathered (``admitted_grandfathered``: the cluster allocated them before the
principal's enforcement began, a fact about the PID, not about the quota) are replayed the same
way: admitted without a token under any candidate config (``QuotaManager.admit``'s
``pre_enforcement``).

Alongside the manager an exact Python set of the PIDs each principal got admitted measures the
Bloom filter: a PID the manager treated as known that was never admitted before is a false
positive (it would have passed free).

Limitations, stated in the report:

* Known PIDs that keep producing are not in the log (only new and rejected PIDs are), so the
  replay sees each PID's first appearance and its retries, not its refreshes. A PID that stops
  appearing is forgotten after the window here even if it kept producing; with a window at
  least as long as the gaps between a PID's logged appearances this changes nothing.
* One manager per group (per principal, or per principal and instance with ``per_instance``):
  the policy's memory caps (``max_principals``, ``max_total_bits``) apply per group, and
  cross-principal eviction is not replayed. Several proxies each have their own manager:
  ``per_instance=True`` replays that; the default asks "one quota per principal".
* Clients' reactions are not simulated: a request a stricter candidate rejects is counted once,
  without the retries it would cause; a looser candidate admits the first attempt and the
  recorded retries then carry known PIDs.
* Each group is held in one executor's memory (pandas), plus the exact set.

Imports pidgate's quota and config code (the replay) and the ``reading``, ``outputs`` and
``spark`` rooms; must not import another job, nor ``pidgate.proxy``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType

from pidgate.config import DEFAULT_USER_ENTITY, QuotaSettings, load_settings
from pidgate.config.loader import read_config_file
from pidgate.pipeline.outputs.report import Section, new_figure, time_axis, write_report
from pidgate.pipeline.outputs.timebuckets import choose_bucket
from pidgate.pipeline.reading.events import (
    ADMITTED_GRANDFATHERED,
    ADMITTED_NEW,
    REJECTED,
    hour_of,
    read_events_checked,
)
from pidgate.pipeline.reading.inputs import EventFiles, InputError, event_files
from pidgate.pipeline.reading.schemas import spark_struct
from pidgate.pipeline.spark.progress import Progress, stage
from pidgate.quota import Admitted, QuotaManager, QuotaPolicy
from pidgate.quota.policy_from_rates import policy_from_rates

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DECISION_SCHEMA",
    "LIMITATIONS",
    "backtest_hourly",
    "bloom_accuracy",
    "load_policy",
    "policy_from_settings",
    "replay_requests",
    "run_backtest",
]

ADMITTED = "admitted"
REJECTED_DECISION = "rejected"
UNLIMITED = "unlimited"

#: One row per replayed Produce request.
DECISION_SCHEMA = spark_struct(
    "principal string, instance string, request_id bigint, ts_ms bigint, pids int, "
    "recorded string, recorded_new_pids int, recorded_throttle_ms bigint, replayed string, "
    "replayed_new_pids int, replayed_rejected_pids int, replayed_throttle_ms bigint, "
    "never_seen_lookups int, bloom_false_positives int"
)

LIMITATIONS = (
    "Known PIDs that keep producing are not in the event log (only new and rejected PIDs are), "
    "so the replay sees each PID's first appearance and its retries, not its refreshes; with a "
    "window at least as long as the gaps between a PID's logged appearances this matches the "
    "proxy. The quota manager is per group (principal, or principal and instance), so the "
    "policy's memory caps apply per group and cross-principal eviction is not replayed. "
    "Clients' reactions are not simulated: a request a stricter candidate rejects is counted "
    "once, without the retries it would cause."
)

_PLACEHOLDER_UPSTREAM = "127.0.0.1:9092"


# -- the candidate policy ------------------------------------------------------------------


def policy_from_settings(quota: QuotaSettings) -> QuotaPolicy:
    """The QuotaPolicy a proxy started with these quota settings enforces (no run-time
    overrides)."""
    rates = {
        user: q.producer_ids_rate
        for user, q in quota.users.items()
        if q.producer_ids_rate is not None
    }
    return policy_from_rates(quota, rates, default_user=DEFAULT_USER_ENTITY)


def load_policy(config_file: str | Path) -> QuotaPolicy:
    """Load a pidgate YAML config with :func:`pidgate.config.load_settings` (environment
    ignored) and return its quota policy. A file with only a ``quota`` section is accepted: the
    required ``proxy.upstream`` is filled with a placeholder, since only the quota is used."""
    path = Path(config_file)
    data = read_config_file(path)
    proxy = data.get("proxy")
    overrides: dict[str, Any] = {}
    if not (isinstance(proxy, dict) and proxy.get("upstream")):
        overrides = {"proxy": {"upstream": [_PLACEHOLDER_UPSTREAM]}}
    settings = load_settings(path, environ={}, cli_overrides=overrides)
    return policy_from_settings(settings.quota)


def _policy_fields(policy: QuotaPolicy) -> dict[str, Any]:
    # QuotaPolicy holds a MappingProxyType, which does not pickle: ship plain fields.
    fields = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
    fields["user_producer_ids_rates"] = dict(policy.user_producer_ids_rates)
    return fields


# -- the replay ----------------------------------------------------------------------------


def _replayer(policy_fields: dict[str, Any]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def replay(pdf: pd.DataFrame) -> pd.DataFrame:
        columns = DECISION_SCHEMA.fieldNames()
        if pdf.empty:
            return pd.DataFrame({name: [] for name in columns})
        manager = QuotaManager(QuotaPolicy(**policy_fields))
        pdf = pdf.reset_index(drop=True)
        instance = pdf["instance"].astype(object).where(pdf["instance"].notna(), "")
        request_id = pdf["request_id"].astype("float64")
        # An event without request_id is its own request: negative ids never clash with real ones.
        missing = request_id.isna().to_numpy()
        request_id = request_id.to_numpy().copy()
        request_id[missing] = -1.0 - np.arange(int(missing.sum()))
        work = pd.DataFrame(
            {
                "principal": pdf["principal"].astype(object),
                "instance": instance,
                "request_id": request_id.astype("int64"),
                "ts_ms": pdf["ts_ms"].astype("int64"),
                "event": pdf["event"].astype(object),
                "producer_id": pdf["producer_id"].astype("int64"),
                "throttle_ms": pdf["throttle_ms"].astype("float64"),
            }
        )
        work["req_ts"] = work.groupby(["instance", "request_id"])["ts_ms"].transform("min")
        work = work.sort_values(
            ["req_ts", "instance", "request_id", "producer_id"], kind="stable"
        ).reset_index(drop=True)

        principal_col = work["principal"].to_numpy()
        instance_col = work["instance"].to_numpy()
        rid_col = work["request_id"].to_numpy()
        ts_col = work["req_ts"].to_numpy()
        event_col = work["event"].to_numpy()
        pid_col = work["producer_id"].to_numpy()
        throttle_col = work["throttle_ms"].to_numpy()
        n = len(work)
        changed = (rid_col[1:] != rid_col[:-1]) | (instance_col[1:] != instance_col[:-1])
        starts = [0, *(np.flatnonzero(changed) + 1).tolist(), n]

        admitted_sets: dict[str, set[int]] = {}
        out: dict[str, list[Any]] = {name: [] for name in columns}
        for s, e in itertools.pairwise(starts):
            principal = str(principal_col[s])
            pids = list(dict.fromkeys(int(p) for p in pid_col[s:e]))
            events = event_col[s:e]
            rejected_rows = events == REJECTED
            recorded_rejected = bool(rejected_rows.any())
            recorded_new = len({int(p) for p in pid_col[s:e][events == ADMITTED_NEW]})
            throttles = throttle_col[s:e][rejected_rows]
            throttles = throttles[~np.isnan(throttles)]
            now = int(ts_col[s])

            grandfathered = {int(p) for p in pid_col[s:e][events == ADMITTED_GRANDFATHERED]}
            decision = manager.admit(principal, pids, now, pre_enforcement=grandfathered)
            exact = admitted_sets.setdefault(principal, set())
            if isinstance(decision, Admitted):
                if decision.tracked:
                    new = len(decision.new_producer_ids)
                    unknown = {*decision.new_producer_ids, *decision.grandfathered_producer_ids}
                    replayed, rej, throttle = ADMITTED, 0, None
                else:
                    unknown = set(pids)
                    replayed, new, rej, throttle = UNLIMITED, 0, 0, None
            else:
                unknown = set(decision.unknown_producer_ids)
                replayed, new, rej = REJECTED_DECISION, 0, len(unknown)
                throttle = decision.throttle_time_ms
            never_seen = [p for p in pids if p not in exact]
            false_positives = sum(1 for p in never_seen if p not in unknown)
            if replayed == ADMITTED:
                exact.update(pids)

            out["principal"].append(principal)
            out["instance"].append(str(instance_col[s]))
            out["request_id"].append(int(rid_col[s]))
            out["ts_ms"].append(now)
            out["pids"].append(len(pids))
            out["recorded"].append(REJECTED_DECISION if recorded_rejected else ADMITTED)
            out["recorded_new_pids"].append(recorded_new)
            out["recorded_throttle_ms"].append(int(throttles.max()) if len(throttles) else None)
            out["replayed"].append(replayed)
            out["replayed_new_pids"].append(new)
            out["replayed_rejected_pids"].append(rej)
            out["replayed_throttle_ms"].append(throttle)
            out["never_seen_lookups"].append(0 if replayed == UNLIMITED else len(never_seen))
            out["bloom_false_positives"].append(false_positives)
        result = pd.DataFrame(out)
        for name in ("recorded_throttle_ms", "replayed_throttle_ms"):
            result[name] = result[name].astype("Int64")
        return result

    return replay


def replay_requests(
    events: DataFrame, policy: QuotaPolicy, per_instance: bool = False
) -> DataFrame:
    """One row per Produce request (:data:`DECISION_SCHEMA`): what the proxy recorded and what
    ``policy`` decides when the requests are replayed per principal (per principal and
    instance with ``per_instance``) in time order through a QuotaManager."""
    requests = events.filter(
        F.col("event").isin(ADMITTED_NEW, ADMITTED_GRANDFATHERED, REJECTED)
    ).filter(F.col("producer_id").isNotNull())
    keys = ["principal", "instance"] if per_instance else ["principal"]
    return (
        requests.select(
            "principal", "instance", "request_id", "ts_ms", "event", "producer_id", "throttle_ms"
        )
        .groupBy(*keys)
        .applyInPandas(_replayer(_policy_fields(policy)), DECISION_SCHEMA)
    )


def backtest_hourly(decisions: DataFrame) -> DataFrame:
    """Per ``principal`` and UTC ``hour``: requests; recorded vs replayed rejected requests and
    new PIDs; requests where the replay agrees with the record; Bloom false positives."""
    replayed_rejected = F.col("replayed") == REJECTED_DECISION
    recorded_rejected = F.col("recorded") == REJECTED_DECISION
    return (
        decisions.withColumn("hour", hour_of(F.col("ts_ms")))
        .groupBy("principal", "hour")
        .agg(
            F.count(F.lit(1)).alias("requests"),
            F.count(F.when(recorded_rejected, True)).alias("recorded_rejected_requests"),
            F.count(F.when(replayed_rejected, True)).alias("replayed_rejected_requests"),
            F.sum("recorded_new_pids").cast("long").alias("recorded_new_pids"),
            F.sum("replayed_new_pids").cast("long").alias("replayed_new_pids"),
            F.sum("replayed_rejected_pids").cast("long").alias("replayed_rejected_pids"),
            F.count(F.when(recorded_rejected == replayed_rejected, True)).alias(
                "agreeing_requests"
            ),
            F.sum("never_seen_lookups").cast("long").alias("never_seen_lookups"),
            F.sum("bloom_false_positives").cast("long").alias("bloom_false_positives"),
        )
    )


def bloom_accuracy(decisions: DataFrame) -> DataFrame:
    """Per principal: lookups of PIDs never admitted before, how many of them the Bloom filter
    called known, and the observed false-positive rate (null without lookups)."""
    return (
        decisions.groupBy("principal")
        .agg(
            F.sum("never_seen_lookups").cast("long").alias("never_seen_lookups"),
            F.sum("bloom_false_positives").cast("long").alias("bloom_false_positives"),
        )
        .withColumn(
            "observed_false_positive_rate",
            F.when(
                F.col("never_seen_lookups") > 0,
                F.col("bloom_false_positives") / F.col("never_seen_lookups"),
            ).cast(DoubleType()),
        )
        .orderBy(F.desc("never_seen_lookups"), F.asc("principal"))
    )


# -- entry point ---------------------------------------------------------------------------


def _rate(rate: int | None) -> str:
    return "unlimited" if rate is None else str(rate)


def _describe_policy(policy: QuotaPolicy) -> str:
    users = ", ".join(f"{u}={_rate(r)}" for u, r in sorted(policy.user_producer_ids_rates.items()))
    return (
        f"window {policy.window_ms / 1000:g} s in {policy.window_num} layers, "
        f"false-positive rate {policy.false_positive_rate:g}, "
        f"default producer_ids_rate {_rate(policy.default_producer_ids_rate)}, "
        f"users: {users or 'none'}"
    )


#: The hourly figure's series, in the order of its rows' counts: label, marker, colour.
_HOURLY_SERIES = (
    ("replayed new PIDs admitted", "o", "#4f81bd"),
    ("replayed requests rejected", "s", "#c0504d"),
)


def _hourly_figure(
    rows: list[tuple[int, int, int]], bucket_s: int, bucket_name: str, start_s: int, end_s: int
) -> Figure:
    """Replayed admitted new PIDs and rejected requests per bucket (zeros filled in, markers
    on every point), x from ``start_s`` to ``end_s``."""
    fig = new_figure(figsize=(10, 4.2))
    ax = fig.add_subplot()
    end_s = max(end_s, start_s + bucket_s)
    buckets = list(range(start_s, end_s, bucket_s))
    by_bucket = {b: (a, r) for b, a, r in rows}
    days = [b / 86_400 for b in buckets]
    size = 3 if len(buckets) > 40 else 5
    for column, (label, marker, color) in enumerate(_HOURLY_SERIES):
        ax.plot(
            days,
            [by_bucket.get(b, (0, 0))[column] for b in buckets],
            marker=marker,
            markersize=size,
            label=label,
            color=color,
        )
    time_axis(ax, start_s, end_s, f"count per {bucket_name}")
    ax.set_title(f"Candidate quota, all principals, per {bucket_name}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


#: The hourly counts summed per principal, in the table's column order.
_PER_PRINCIPAL_SUMS = (
    "requests",
    "recorded_rejected_requests",
    "replayed_rejected_requests",
    "recorded_new_pids",
    "replayed_new_pids",
    "agreeing_requests",
)


def _per_principal(hourly: DataFrame) -> DataFrame:
    return (
        hourly.groupBy("principal")
        .agg(*(F.sum(name).alias(name) for name in _PER_PRINCIPAL_SUMS))
        .orderBy(F.desc("replayed_rejected_requests"), F.asc("principal"))
    )


def run_backtest(
    spark: SparkSession,
    events_path: str | EventFiles,
    quota_config: str,
    output: str,
    *,
    per_instance: bool = False,
    since_ms: int | None = None,
    until_ms: int | None = None,
    progress: Progress | None = None,
) -> Path:
    """Replay the log at ``events_path`` (a path, or files from
    :func:`pidgate.pipeline.reading.inputs.event_files`) under the quota of ``quota_config``; write
    ``decisions``, ``hourly`` and ``bloom`` Parquet and ``report.html`` under ``output``.
    Raises :class:`InputError` when there is no Produce event to replay."""
    policy = load_policy(quota_config)
    files = event_files(events_path) if isinstance(events_path, str) else events_path
    stage(progress, f"reading the event log {files.described} ...")
    events, bad_lines = read_events_checked(spark, files.paths)
    if since_ms is not None:
        events = events.filter(F.col("ts_ms") >= F.lit(since_ms))
    if until_ms is not None:
        events = events.filter(F.col("ts_ms") < F.lit(until_ms))
    stage(progress, "replaying the log through the candidate quota, per principal ...")
    decisions = replay_requests(events, policy, per_instance).cache()
    try:
        span = decisions.agg(
            F.count(F.lit(1)).alias("n"),
            F.min("ts_ms").alias("first"),
            F.max("ts_ms").alias("last"),
        ).collect()[0]
        if not span["n"]:
            period = " in the period given" if since_ms or until_ms else ""
            raise InputError(
                f"--events {files.described}: no Produce events{period} to replay "
                f"({bad_lines} bad lines skipped); nothing to report"
            )
        first_ms, last_ms = int(span["first"]), int(span["last"])
        bucket_s, bucket_name = choose_bucket(first_ms, last_ms)
        stage(progress, "summarising per principal and hour ...")
        hourly = backtest_hourly(decisions).cache()
        bloom = bloom_accuracy(decisions)
        principals_pd: pd.DataFrame = _per_principal(hourly).toPandas()
        bloom_pd: pd.DataFrame = bloom.toPandas()
        bucket = (F.floor(F.col("ts_ms") / (1000 * bucket_s)) * bucket_s).cast("long")
        series = [
            (int(r["bucket"]), int(r["new"] or 0), int(r["rej"] or 0))
            for r in decisions.groupBy(bucket.alias("bucket"))
            .agg(
                F.sum("replayed_new_pids").alias("new"),
                F.count(F.when(F.col("replayed") == REJECTED_DECISION, True)).alias("rej"),
            )
            .collect()
        ]
        start_s = first_ms // 1000 // bucket_s * bucket_s
        end_s = (last_ms // 1000 // bucket_s + 1) * bucket_s
        requests = int(principals_pd["requests"].sum()) if len(principals_pd) else 0
        agreeing = int(principals_pd["agreeing_requests"].sum()) if len(principals_pd) else 0
        lookups = int(bloom_pd["never_seen_lookups"].sum()) if len(bloom_pd) else 0
        fps = int(bloom_pd["bloom_false_positives"].sum()) if len(bloom_pd) else 0
        recorded_rej = (
            int(principals_pd["recorded_rejected_requests"].sum()) if len(principals_pd) else 0
        )
        replayed_rej = (
            int(principals_pd["replayed_rejected_requests"].sum()) if len(principals_pd) else 0
        )
        source = (
            f"{files.file_count} file(s) under {files.described}"
            if files.file_count is not None
            else files.described
        )
        summary = (
            f"Event log: {source} ({bad_lines} bad lines skipped)\n"
            f"Period: {_utc(first_ms)} .. {_utc(last_ms)}\n"
            f"Candidate quota config: {quota_config}\n"
            f"Candidate policy: {_describe_policy(policy)}\n"
            f"Replay grouped per {'principal and instance' if per_instance else 'principal'}.\n"
            f"Produce requests replayed: {requests}\n"
            f"Rejected requests: {recorded_rej} recorded, {replayed_rej} under the candidate\n"
            f"Requests decided as recorded (admitted vs rejected): {agreeing}"
            + (f" ({100.0 * agreeing / requests:.2f}%)" if requests else "")
            + "\n(100% is expected when the candidate is the config the proxy ran with.)\n"
            f"Bloom filter: {fps} false positives in {lookups} lookups of never-admitted PIDs"
            + (f" = {fps / lookups:.5f}" if lookups else "")
            + f" (configured {policy.false_positive_rate:g})"
        )
        sections = [
            Section("Summary", summary),
            Section("Limitations", LIMITATIONS),
            Section(
                "Per principal: recorded vs candidate",
                "recorded_* is what the proxy did; replayed_* what the candidate quota does. "
                "Ordered by requests the candidate rejects.",
                principals_pd,
                _hourly_figure(series, bucket_s, bucket_name, start_s, end_s),
            ),
            Section(
                "Bloom filter false positives vs exact sets",
                "A false positive: a PID the quota manager treated as known although it had "
                "never been admitted for that principal (it would pass without a token).",
                bloom_pd,
            ),
        ]
        stage(progress, f"writing Parquet and report.html to {output} ...")
        path = write_report(
            output,
            "pidgate backtest report",
            sections,
            {"decisions": decisions, "hourly": hourly, "bloom": bloom},
        )
        if progress is not None:
            progress.summarize(
                f"{requests:,} Produce requests replayed, {_utc(first_ms)} .. {_utc(last_ms)}",
                f"rejected requests: {recorded_rej:,} recorded, {replayed_rej:,} under the "
                f"candidate; {agreeing:,} decided as recorded",
                *(
                    f"  most rejected: {r.principal}: {int(r.replayed_rejected_requests):,}"
                    for r in principals_pd.head(3).itertuples(index=False)
                    if int(r.replayed_rejected_requests) > 0
                ),
            )
        return path
    finally:
        decisions.unpersist()


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
