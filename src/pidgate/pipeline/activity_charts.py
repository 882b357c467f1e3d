"""The activity report's two charts, from plain Python data (no Spark): distinct PIDs per
principal by what became of them, and new PIDs and rejections per time bucket.

Built with :class:`matplotlib.figure.Figure` (no pyplot state); axes come from
:func:`pidgate.pipeline.report.time_axis` so every report's time axis reads the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pidgate.pipeline.report import time_axis

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
    fig = Figure(figsize=(10, max(3.0, 0.45 * len(fates) + 2.0)))
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
    ax.set_title("Producer IDs per principal, by what became of them")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if fates:
        ax.set_xlim(0, max(f.pids for f in fates) * 1.35 or 1)
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
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
    fig = Figure(figsize=(10, 4.4))
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
