"""Grandfathering: a producer that existed before a principal's enforcement began is never
charged for it (DESIGN.md "When enforcement begins"; docs/grandfathering.md).

Owns :class:`Enforcement` (when a principal's enforcement began, the PID frontier fixed at that
moment, the grace period and the mode) and the rule :meth:`Enforcement.grandfathers`. The
manager (:mod:`pidgate.quota.manager`) decides *which* enforcement applies to a principal;
:mod:`pidgate.proxy.quota_control.pid_frontier` learns the frontier from the cluster.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter.

Why a frontier separates old producers from new ones
----------------------------------------------------

Kafka hands out producer IDs from blocks. Since Kafka 3.0 (KIP-730) the active controller
allocates blocks of 1000 consecutive IDs (``ProducerIdsBlock``; ``AllocateProducerIds`` RPC),
each block starting where the previous one ended, so a block allocated later lies entirely
above every block allocated earlier; before KIP-730 brokers took blocks the same way by a
conditional update of the ZooKeeper node ``/latest_producer_id_block``. Each broker's
``ProducerIdManager`` hands out its current block in increasing order, and moves to a block the
controller allocated later (possibly prefetched) when the current one is used up.

Ask every broker for one fresh PID (InitProducerId with a null transactional id: it allocates a
PID and creates no partition or transaction state) and call the smallest answer the frontier F.
Any PID x allocated after the probe is >= F:

* if broker b hands x out from the block it used when it answered p_b, then x > p_b >= F;
* otherwise x comes from a block allocated after b's probed block; every such block lies above
  b's block, so x > p_b >= F. (A block allocated before the probe but not yet in use -- a
  prefetched one -- was still allocated after the block b was using, so the same holds.)

So a PID below F was allocated before the probe. The converse does not hold: a PID from a broker
whose block is above the slowest broker's position may be older than the probe and still be
>= F; such a producer is charged (conservative). The wider the spread of the brokers' blocks
(a broker that rarely allocates keeps an old block for a long time), the more old producers
fall above F.

Limits, and what pidgate does about them:

* every broker must be probed (a broker left out may hold an older block, and its later PIDs
  would slip below F): if any broker cannot be probed, there is no frontier;
* a broker that does not allocate in order (not Apache Kafka's ProducerIdManager): pidgate
  asks each broker twice and requires the second PID to be larger; otherwise no frontier;
* Kafka accepts a Produce carrying a PID it never allocated (sequence 0 opens a new producer
  state), so a client can forge a PID below F. Grandfathering is therefore bounded in time: only
  during ``grace_ms`` after enforcement began. Active producers send within seconds and are
  learnt (recorded as known) in that time; after it, an unknown PID below F is charged;
* no frontier (probe failed, SASL upstream without credentials, a non-monotonic broker): the
  *learning* mode admits and records every unknown PID during the grace period (never rejects
  them), so a storm that starts inside that grace passes for its length. pidgate says so loudly.

The frontier is fixed when a principal's enforcement begins and never moves, so a PID that was
throttled as new can never become free later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FRONTIER",
    "LEARNING",
    "OFF",
    "PENDING",
    "Enforcement",
    "GrandfatherMode",
]

GrandfatherMode = Literal["frontier", "learning", "pending", "off"]
#: Unknown PIDs below the frontier are admitted free during the grace period.
FRONTIER: GrandfatherMode = "frontier"
#: No frontier could be learnt: every unknown PID is admitted free during the grace period.
LEARNING: GrandfatherMode = "learning"
#: The frontier probe has not answered yet: treated as learning until it does (milliseconds).
PENDING: GrandfatherMode = "pending"
#: No grandfathering (grace over, grace 0, or no enforcement beginning recorded).
OFF: GrandfatherMode = "off"


@dataclass(slots=True)
class Enforcement:
    """When one principal's (or one policy change's) enforcement began and how PIDs the cluster
    allocated before then are told apart. Shared by every principal whose enforcement began at
    the same moment; :meth:`resolve` fills in the frontier once, when the probe answers."""

    began_ms: int
    grace_ms: int
    mode: GrandfatherMode = PENDING
    frontier: int | None = None
    reason: str = "waiting for the PID frontier probe"

    def __post_init__(self) -> None:
        if self.grace_ms < 0:
            raise ValueError(f"grace_ms must be >= 0, got {self.grace_ms}")
        if self.mode == FRONTIER and self.frontier is None:
            raise ValueError("frontier mode needs a frontier")

    @property
    def grace_ends_ms(self) -> int:
        return self.began_ms + self.grace_ms

    def in_grace(self, now_ms: int) -> bool:
        return self.began_ms <= now_ms < self.began_ms + self.grace_ms

    def mode_at(self, now_ms: int) -> GrandfatherMode:
        """The mode in force at ``now_ms``: ``off`` once the grace period is over."""
        return self.mode if self.in_grace(now_ms) else OFF

    def grandfathers(self, producer_id: int, now_ms: int) -> bool:
        """Whether an *unknown* ``producer_id`` seen at ``now_ms`` is admitted without a token."""
        if not self.in_grace(now_ms):
            return False
        if self.mode == FRONTIER:
            assert self.frontier is not None
            return 0 <= producer_id < self.frontier
        return self.mode in (LEARNING, PENDING)

    def resolve(self, frontier: int | None, reason: str) -> None:
        """The probe answered: ``frontier`` (the smallest fresh PID of every broker), or None
        when none could be learnt (``reason`` says why) -- then learning mode. Once only: a
        resolved enforcement never changes, so a throttled PID never becomes free later."""
        if self.mode != PENDING:
            return
        if frontier is None:
            self.mode, self.frontier = LEARNING, None
        else:
            self.mode, self.frontier = FRONTIER, frontier
        self.reason = reason

    def disable(self, reason: str) -> None:
        """No grandfathering for this enforcement (grace 0, or nobody it could concern)."""
        if self.mode == PENDING:
            self.mode, self.frontier, self.reason = OFF, None, reason
