"""Pure KIP-936 quota policy: Bloom filters, the time-layered PID cache, token buckets and the
manager that turns (principal, producer IDs, now_ms) into admit / reject(throttle_time_ms).

Time is always a parameter (``now_ms``); nothing here reads a clock.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or
``pidgate.protocol`` / ``pidgate.proxy`` / ``pidgate.config``.

Modules: ``bloom`` (shapes, positions, one filter), ``layered`` (time layers of one principal:
refresh rule, expiry and the bounds they give), ``layer_plan`` (how new layers are sized and
their share of the false-positive rate), ``bucket`` (exact token bucket), ``policy`` (validated
QuotaPolicy), ``grandfather`` (when enforcement begins), ``principal_table`` (tracked
principals: snapshots, expiry, memory caps, export/restore, policy changes), ``manager``
(admission) and the ``state`` package (the state and quota overrides as versioned bytes).
"""

from .bloom import BloomFilter, BloomShape, bloom_positions, universal_positions
from .bucket import TokenBucket
from .layer_plan import LayerPlan
from .layered import LayeredBloomFilter
from .manager import Admitted, Decision, QuotaManager, Rejected
from .policy import QuotaPolicy, user_name
from .principal_table import PrincipalRecord, PrincipalState
from .state.encode import dump_state
from .state.format import StateFormatError, UnsupportedStateVersion
from .state.load import LoadReport, load_state
from .state.run_time_overrides import QuotaOverrides

__all__ = [
    "Admitted",
    "BloomFilter",
    "BloomShape",
    "Decision",
    "LayerPlan",
    "LayeredBloomFilter",
    "LoadReport",
    "PrincipalRecord",
    "PrincipalState",
    "QuotaManager",
    "QuotaOverrides",
    "QuotaPolicy",
    "Rejected",
    "StateFormatError",
    "TokenBucket",
    "UnsupportedStateVersion",
    "bloom_positions",
    "dump_state",
    "load_state",
    "universal_positions",
    "user_name",
]
