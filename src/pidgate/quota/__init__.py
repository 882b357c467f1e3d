"""Pure KIP-936 quota policy: Bloom filters, the time-layered PID cache, token buckets and the
manager that turns (principal, producer IDs, now_ms) into admit / reject(throttle_time_ms).

Time is always a parameter (``now_ms``); nothing here reads a clock.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or
``pidgate.protocol`` / ``pidgate.proxy`` / ``pidgate.config``.

Modules: ``bloom`` (shapes, positions, one filter), ``layered`` (time layers of one principal:
refresh rule, sizing, expiry and the bounds they give),
``bucket`` (exact token bucket), ``policy`` (validated QuotaPolicy), ``manager`` (admission),
``persistence`` (the state and quota overrides as versioned bytes).
"""

from .bloom import BloomFilter, BloomShape, bloom_positions, universal_positions
from .bucket import TokenBucket
from .layered import LayeredBloomFilter, LayerPlan
from .manager import Admitted, Decision, PrincipalRecord, PrincipalState, QuotaManager, Rejected
from .persistence import (
    LoadReport,
    QuotaOverrides,
    StateFormatError,
    UnsupportedStateVersion,
    dump_state,
    load_state,
)
from .policy import QuotaPolicy, user_name

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
