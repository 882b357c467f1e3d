"""Chart time buckets chosen from the period a report covers: seconds for a demo run, minutes
for a short run, hours for days, days for months.

Pure Python (no Spark): :func:`choose_bucket` is shared by the activity and backtest reports;
must not import pyspark or any other pipeline module.
"""

from __future__ import annotations

__all__ = ["BUCKETS", "MAX_BUCKETS", "choose_bucket"]

#: Candidate chart buckets (seconds) and their names; the smallest giving at most
#: :data:`MAX_BUCKETS` buckets over the period is used.
BUCKETS: tuple[tuple[int, str], ...] = (
    (1, "second"),
    (5, "5 seconds"),
    (10, "10 seconds"),
    (30, "30 seconds"),
    (60, "minute"),
    (300, "5 minutes"),
    (900, "15 minutes"),
    (3600, "hour"),
    (6 * 3600, "6 hours"),
    (86_400, "day"),
    (7 * 86_400, "week"),
)
MAX_BUCKETS = 150


def choose_bucket(first_ms: int, last_ms: int) -> tuple[int, str]:
    """The chart bucket (seconds, name) for a period: minutes for a short run, hours for
    days."""
    span_s = max(0.0, (last_ms - first_ms) / 1000)
    for seconds, name in BUCKETS:
        if span_s / seconds <= MAX_BUCKETS:
            return seconds, name
    return BUCKETS[-1]
