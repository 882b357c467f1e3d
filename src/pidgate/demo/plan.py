"""The demo scenario's numbers and names: the quota, the steady producer's rate, the storm's
timing, topics and client ids.

With 5 new PIDs per 10 s (a token every 2 s, burst 5) and a new producer every 0.75 s, the
storm outruns the quota after ~5 s, and the producers it leaves waiting all get through well
before the default 45 s are up.

Owns: these constants and ``storm_end_s``. Plain data: imports nothing from pidgate or any
client library, so every other demo module may import it.
"""

from __future__ import annotations

WINDOW_SECONDS = 10
PRODUCER_IDS_RATE = 5
STEADY_MSGS_PER_S = 200
STORM_START_S = 2.0
STORM_INTERVAL_S = 0.75
STORM_RECORDS = 5
MAX_STORM_PRODUCERS = 60
STEADY_TOPIC = "pidgate-demo-steady"
STORM_TOPIC = "pidgate-demo-storm"
STEADY_CLIENT_ID = "demo-steady"
STORM_CLIENT_PREFIX = "demo-storm-"


def storm_end_s(duration_s: float) -> float:
    """When (seconds into the run) the storm stops starting producers: after a third of it."""
    return STORM_START_S + duration_s / 3
