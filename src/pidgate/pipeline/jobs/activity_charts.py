"""The activity report's charts and the words around them, from plain Python and pandas data
(no Spark): distinct PIDs per principal by what became of them, new PIDs and rejections per
time bucket, the recommendations table and the texts that explain it.

Built with :class:`matplotlib.figure.Figure` (no pyplot state); axes come from
:func:`pidgate.pipeline.outputs.report.time_axis` so every report's time axis reads the same.

Plain Python, pandas and matplotlib: must not import pyspark, nor the activity job's Spark
modules (``activity``, ``activity_hourly``, ``activity_rates``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]

from pidgate.pipeline.outputs.report import new_figure, time_axis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PidFates", "fates_figure", "fit_labels", "timeline_figure"]

_DAY_S = 86_400


@dataclass(frozen=True)
class PidFates:
    """One principal's distinct PIDs over the period, each counted once: admitted at its first
    try, admitted after one or more rejections, or never admitted; and its rejected Produce
    requests (a count of requests, not of PIDs)."""

    principal: str
    admitted_at_once: int
    admitted_after_rejection: int
    never_admitted: int
    rejected_requests: int

    @property
    def pids(self) -> int:
        return self.admitted_at_once + self.admitted_after_rejection + self.never_admitted


def fit_labels(names: list[str], width: int = 28) -> list[str]:
    return [n if len(n) <= width else n[: width - 1] + "…" for n in names]


def fates_figure(fates: list[PidFates]) -> Figure:
    """Horizontal stacked bars, most PIDs on top: one bar per principal whose length is its
    distinct PIDs, split by fate; the rejected requests written beside each bar."""
    fig = new_figure(figsize=(10, max(2.8, 0.4 * len(fates) + 1.8)))
    ax = fig.add_subplot()
    rows = list(reversed(fates))
    names = fit_labels([f.principal for f in rows])
    left = [0] * len(rows)
    parts = (
        ("admitted at first try", "#4f81bd", [f.admitted_at_once for f in rows]),
        (
            "admitted after waiting (rejected first)",
            "#f2b134",
            [f.admitted_after_rejection for f in rows],
        ),
        ("never admitted", "#c0504d", [f.never_admitted for f in rows]),
    )
    for label, color, values in parts:
        ax.barh(names, values, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, fate in enumerate(rows):
        if fate.rejected_requests:
            ax.annotate(
                f" {fate.rejected_requests:,} rejected requests",
                (fate.pids, y),
                va="center",
                fontsize="small",
                color="#555",
            )
    ax.set_xlabel("distinct producer IDs over the period (each PID counted once)")
    ax.set_ylabel("principal")
    ax.set_title("Producer IDs per principal, by what became of them", pad=26)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if fates:
        ax.set_xlim(0, max(f.pids for f in fates) * 1.35 or 1)
        ax.legend(fontsize="small", loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3)
    fig.tight_layout()
    return fig


def timeline_figure(
    new_pids: dict[str, dict[int, int]],
    rejected: dict[str, dict[int, int]],
    bucket_s: int,
    bucket_name: str,
    start_s: int,
    end_s: int,
) -> Figure:
    """New PIDs (solid) and rejected Produce requests (dashed, same colour) per bucket for each
    principal of ``new_pids`` (bucket start s -> count), zeros filled in, markers on every
    point, x from ``start_s`` to ``end_s`` (UTC)."""
    fig = new_figure(figsize=(10, 4.4))
    ax = fig.add_subplot()
    end_s = max(end_s, start_s + bucket_s)
    buckets = list(range(start_s, end_s, bucket_s))
    days = [b / _DAY_S for b in buckets]
    small = len(buckets) > 40
    for principal, points in new_pids.items():
        label = fit_labels([principal])[0]
        (line,) = ax.plot(
            days,
            [points.get(b, 0) for b in buckets],
            marker="o",
            markersize=3 if small else 5,
            linewidth=1.2,
            label=f"{label}: new PIDs",
        )
        refused = rejected.get(principal, {})
        if refused:
            ax.plot(
                days,
                [refused.get(b, 0) for b in buckets],
                marker="x",
                markersize=4 if small else 6,
                linewidth=1.0,
                linestyle="--",
                color=line.get_color(),
                label=f"{label}: rejected requests",
            )
    time_axis(ax, start_s, end_s, f"count per {bucket_name}")
    ax.set_ylabel(f"new producer IDs per {bucket_name}\n(dashed: rejected requests)")
    ax.set_title(f"New producer IDs and rejected requests per {bucket_name}, top principals")
    if new_pids:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def window_name(window_s: int) -> str:
    return "1-hour" if window_s == 3600 else f"{window_s} s"


def display_rates(rates: pd.DataFrame, percentile: float, window_s: int) -> pd.DataFrame:
    """The recommendations as the report shows them: short headers that wrap, storm/steady in
    words, one decimal, the reasons left to the text above (the Parquet keeps them)."""
    p = f"p{percentile * 100:g}"
    window = window_name(window_s)
    columns: dict[str, Any] = {
        "principal": rates["principal"],
        "demand": rates["storm"].map({True: "restart storm", False: "steady"}),
        f"recommended producer_ids_rate (per {window} window)": rates[
            "recommended_producer_ids_rate"
        ],
    }
    if window_s != 3600:
        columns["per hour, before scaling to the window"] = rates["recommended_per_hour"]
    columns |= {
        "baseline PIDs per hour (before headroom)": rates["baseline_hourly_demand"]
        .astype(float)
        .round(1),
        f"{p} PIDs per hour": rates["percentile_hourly_demand"].astype(float).round(1),
        "peak PIDs per hour": rates["peak_hourly_demand"],
        "storm hours / hours": [
            f"{s} / {a}" for s, a in zip(rates["storm_hours"], rates["active_hours"], strict=True)
        ],
        "peak PIDs per client and hour": rates["peak_pids_per_client"],
        "refused": [f"{share:.0%}" for share in rates["rejected_share"].astype(float)],
    }
    return pd.DataFrame(columns)


def rate_columns_text(percentile: float, headroom: float, window_s: int) -> str:
    p = f"p{percentile * 100:g}"
    window = window_name(window_s)
    scale = (
        "the quota window of this report is 1 hour (producer.id.quota.window.size.seconds = "
        "3600, pidgate's default), so the per-hour figures are the rates"
        if window_s == 3600
        else f"pidgate's quota is new PIDs per window (producer.id.quota.window.size.seconds); "
        f"this report was run for a {window_s} s window, so each rate is the per-hour figure "
        f"x {window_s}/3600, rounded up, at least 1 (the per-hour figure is shown beside it; "
        f"the token bucket holds one window's rate, so a burst of more new PIDs than that "
        f"within {window_s} s waits)"
    )
    return (
        "Columns: demand per hour is the number of distinct PIDs that asked to be new in one "
        "UTC hour (admitted as new or rejected). 'baseline PIDs per hour' is the hourly demand "
        f"the recommendation is built from, before the x {headroom:g} headroom: {p} of all "
        f"hours for a steady principal, {p} of its healthy (non-storm) hours for a storm, or, "
        "when every hour stormed, the smaller of its clients per hour and its PIDs per hour "
        f"admitted at first try / {headroom:g}. 'refused' is the share of the PIDs that asked "
        "which were rejected (or would have been, in observe mode) at least once. "
        f"Window: {scale}. The {window} window is what you set as "
        "producer.id.quota.window.size.seconds; run with the window you run."
    )


def storm_reasons(rates: pd.DataFrame, limit: int = 20) -> str:
    storms = rates[rates["storm"]] if len(rates) else rates
    if not len(storms):
        return "No restart storms: every recommendation follows the steady rule."
    lines = [f"  {r.principal}: {r.reason}" for r in storms.head(limit).itertuples(index=False)]
    if len(storms) > limit:
        lines.append(f"  ... and {len(storms) - limit} more (recommendations.parquet)")
    return "Why, per restart storm:\n" + "\n".join(lines)


def yaml_snippet(rates: list[tuple[str, int]], window_s: int) -> str:
    lines = ["quota:", f"  producer.id.quota.window.size.seconds: {window_s}", "  users:"]
    for principal, rate in rates:
        name = principal.removeprefix("User:")
        lines.append(f'    "{name}": {{producer_ids_rate: {rate}}}')
    return "\n".join(lines)


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * _DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / _DAY_S:.1f} days"
