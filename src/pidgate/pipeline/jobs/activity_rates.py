"""The activity job's recommendations: a ``producer_ids_rate`` per principal and quota window
from its hourly demand (pure DataFrame -> DataFrame transforms), and the rules in words.

* :func:`recommend_with_storms`: restart storms told apart (:func:`storm_rule`), the job's rule;
* :func:`recommend_rates`: the plain rule (:func:`rate_rule`).

Reads :func:`~pidgate.pipeline.jobs.activity_hourly.hourly_with_clients`' columns by name; must
not import the report (``pidgate.pipeline.outputs``), pandas or the rest of the job.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = [
    "STORM_MIN_DEMAND",
    "STORM_PIDS_PER_CLIENT",
    "STORM_REFUSED_SHARE",
    "rate_rule",
    "recommend_rates",
    "recommend_with_storms",
    "storm_rule",
]


def _check_rule(percentile: float, headroom: float) -> None:
    if not 0.0 <= percentile <= 1.0:
        raise ValueError(f"percentile must be in [0, 1], got {percentile}")
    if headroom <= 0:
        raise ValueError(f"headroom must be > 0, got {headroom}")


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
    _check_rule(percentile, headroom)
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


# -- storms ---------------------------------------------------------------------------------

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
    _check_rule(percentile, headroom)
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
