"""The tracked principals of a quota manager: their state, and its bookkeeping.

Owns :class:`PrincipalTable`, the base of :class:`pidgate.quota.manager.QuotaManager` that holds
per-principal state (a layered Bloom filter of seen PIDs, a token bucket and the enforcement
that began for it) and keeps it: when enforcement begins (grandfathering), read-only views and
snapshots, expiry of idle principals, the global memory caps with idlest-first eviction, export
and restore for persistence, and run-time policy changes. The admission rule itself lives in
:mod:`pidgate.quota.manager`.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, any other pidgate
package, or :mod:`pidgate.quota.manager` (which builds on this module). Time is the ``now_ms``
parameter.

Grandfathering (:mod:`pidgate.quota.grandfather`): a principal's enforcement begins when the
proxy starts without state for it (``begin_enforcement``), when a policy change makes it limited
(``update_policy`` returns the new :class:`Enforcement`), or when its state is evicted. An
evicted principal keeps its frontier (it never moves) with a fresh grace period; one that had no
frontier gets no grandfathering after eviction.

Memory: a principal's state exists only after it activated a PID. ``expire(now_ms)`` drops dead
layers and forgets principals with no live layer and a full bucket (forgetting those is exact:
a new state would be identical). When ``max_principals`` or ``max_total_bits`` is exceeded the
least recently active principal is evicted (``evicted_principal_count``): its PIDs look new again
(conservative: they need tokens) but its bucket restarts full (lenient by at most one burst).
Under sustained cap pressure an evicted principal can therefore activate more than its rate;
size the caps so eviction is rare and alert on the eviction counter.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass

from .bucket import TokenBucket
from .grandfather import FRONTIER, OFF, Enforcement, GrandfatherMode
from .layer_plan import LayerPlan
from .layered import LayeredBloomFilter, LayerState
from .policy import QuotaPolicy

__all__ = ["PrincipalRecord", "PrincipalState", "PrincipalTable", "TrackedPrincipal"]


@dataclass(frozen=True, slots=True)
class PrincipalState:
    """One tracked principal, for metrics and the read-only ``/state`` endpoint."""

    principal: str
    producer_ids_rate: int
    tokens: float
    layer_count: int
    bits: int
    estimated_false_positive_rate: float
    #: Grandfathering in force at the snapshot's time (``off`` after the grace period).
    grandfather_mode: GrandfatherMode = OFF
    #: The frontier fixed when its enforcement began (None: none learnt, or not recorded).
    frontier: int | None = None
    enforcement_began_ms: int | None = None
    grandfather_reason: str | None = None
    #: Observe mode: Produce requests, and PIDs in them, enforcement would have rejected (since
    #: the principal was last tracked; not persisted).
    would_reject_requests: int = 0
    would_reject_producer_ids: int = 0


@dataclass(frozen=True, slots=True)
class PrincipalRecord:
    """The complete state of one tracked principal as plain data, for persistence
    (:meth:`QuotaManager.export` / :meth:`QuotaManager.restore`)."""

    principal: str
    bucket: TokenBucket
    #: Oldest first; each layer has its own shape.
    layers: tuple[LayerState, ...]
    enforcement: Enforcement | None = None


#: Policy changes remembered for principals that have no state yet (newest last); older ones
#: are dropped first (their principals then get no grandfathering: conservative).
_MAX_ACTIVATIONS = 64


class TrackedPrincipal:
    """The mutable state of one tracked principal (a copy leaves only as a record or state)."""

    __slots__ = ("bucket", "enforcement", "seen", "would_reject_ids", "would_reject_requests")

    def __init__(
        self, seen: LayeredBloomFilter, bucket: TokenBucket, enforcement: Enforcement | None
    ) -> None:
        self.seen = seen
        self.bucket = bucket
        self.enforcement = enforcement
        #: Observe mode: requests, and PIDs in them, enforcement would have rejected.
        self.would_reject_requests = 0
        self.would_reject_ids = 0


def _principal_state(name: str, state: TrackedPrincipal, now_ms: int) -> PrincipalState:
    enforcement = state.enforcement
    return PrincipalState(
        principal=name,
        producer_ids_rate=state.bucket.rate,
        tokens=state.bucket.tokens(now_ms),
        layer_count=state.seen.layer_count,
        bits=state.seen.total_bits,
        estimated_false_positive_rate=state.seen.estimated_false_positive_rate(now_ms),
        grandfather_mode=enforcement.mode_at(now_ms) if enforcement is not None else OFF,
        frontier=enforcement.frontier if enforcement is not None else None,
        enforcement_began_ms=enforcement.began_ms if enforcement is not None else None,
        grandfather_reason=enforcement.reason if enforcement is not None else None,
        would_reject_requests=state.would_reject_requests,
        would_reject_producer_ids=state.would_reject_ids,
    )


class PrincipalTable:
    """The tracked principals, least recently active first, and their bookkeeping (see the
    module docstring); :class:`pidgate.quota.manager.QuotaManager` adds the admission rule.
    Not thread-safe: one event loop owns it."""

    def __init__(self, policy: QuotaPolicy) -> None:
        self._policy = policy
        # Least recently active first: admit() moves a principal to the end, eviction pops the
        # front, both O(1).
        self._principals: OrderedDict[str, TrackedPrincipal] = OrderedDict()
        self._plan = self._plan_for(policy)
        self._total_bits = 0
        self._evicted = 0
        # When enforcement began for principals that have no state: at start (applies to all),
        # at policy changes (to those unlimited before), at eviction (per principal).
        self._baseline: Enforcement | None = None
        self._activations: list[tuple[QuotaPolicy, Enforcement]] = []
        self._evicted_enforcement: OrderedDict[str, Enforcement] = OrderedDict()

    @staticmethod
    def _plan_for(policy: QuotaPolicy) -> LayerPlan:
        return LayerPlan(
            policy.window_ms,
            policy.window_num,
            policy.false_positive_rate,
            policy.min_layer_items,
            policy.max_layer_items,
        )

    # -- the policy in force ---------------------------------------------------------------

    @property
    def policy(self) -> QuotaPolicy:
        return self._policy

    # -- when enforcement begins -----------------------------------------------------------

    def begin_enforcement(self, now_ms: int) -> Enforcement:
        """Enforcement begins now for every principal without state (the proxy starts, or
        started without a state file): returns the pending :class:`Enforcement`, which the
        caller resolves with the frontier (:meth:`Enforcement.resolve`)."""
        self._baseline = Enforcement(now_ms, self._policy.grace_ms)
        return self._baseline

    def _enforcement_for_new(self, principal: str, now_ms: int) -> Enforcement | None:
        """The enforcement of a limited principal that has no state: the latest moment it
        became limited (eviction, a policy change it was unlimited before, or the start)."""
        latest = self._baseline
        for previous, enforcement in reversed(self._activations):
            if previous.rate_for(principal) is None:
                latest = enforcement
                break
        evicted = self._evicted_enforcement.get(principal)
        if evicted is not None and (latest is None or evicted.began_ms >= latest.began_ms):
            return evicted
        return latest

    def enforcements(self) -> tuple[Enforcement, ...]:
        """Every enforcement moment still remembered (for the proxy's resolve/probe loop)."""
        found = [e for _, e in reversed(self._activations)]  # newest first
        if self._baseline is not None:
            found.append(self._baseline)
        return tuple(found)

    # -- read-only views -------------------------------------------------------------------

    @property
    def principal_count(self) -> int:
        return len(self._principals)

    def snapshot(self, now_ms: int) -> tuple[PrincipalState, ...]:
        """State of every tracked principal at ``now_ms``, idlest first. Changes nothing
        (layers not yet expired are still counted)."""
        return tuple(
            _principal_state(name, state, now_ms) for name, state in self._principals.items()
        )

    def principal_names(self) -> list[str]:
        """The tracked principals, idlest first."""
        return list(self._principals)

    def snapshot_in_steps(
        self, now_ms: int, step_principals: int, names: list[str] | None = None
    ) -> Iterator[tuple[PrincipalState, ...]]:
        """``snapshot`` a step of at most ``step_principals`` principals at a time, so a caller
        on the event loop can let requests through between steps (a /metrics scrape over 100k
        principals took ~0.7 s in one go). The principals are those tracked when it starts,
        idlest first (or those of ``names`` still tracked, in that order); one evicted before
        its step is left out, one added meanwhile waits for the next snapshot."""
        for step in self._in_steps(step_principals, names):
            yield tuple(_principal_state(name, state, now_ms) for name, state in step)

    def _in_steps(
        self, step_principals: int, names: list[str] | None = None
    ) -> Iterator[list[tuple[str, TrackedPrincipal]]]:
        """The tracked principals (those of ``names`` still tracked, else all, idlest first), a
        step of at most ``step_principals`` at a time, for the passes over every principal
        (``*_in_steps``). A step is read when it is reached: a principal evicted or forgotten
        before it is left out, one added since the pass began waits for the next pass."""
        if step_principals < 1:
            raise ValueError(f"step_principals must be >= 1, got {step_principals}")
        if names is None:
            names = list(self._principals)
        for start in range(0, len(names), step_principals):
            principals = self._principals  # restore() may have replaced it
            yield [
                (name, state)
                for name in names[start : start + step_principals]
                if (state := principals.get(name)) is not None
            ]

    def time_until_refilled_ms(self, principal: str, n: int, now_ms: int) -> int:
        """Milliseconds until ``principal``'s bucket has refilled ``n`` more tokens than it
        holds, each taken as it comes (the wait of a request with ``n - 1`` tokens' worth of
        requests ahead of it); 0 when it is not tracked (unlimited)."""
        state = self._principals.get(principal)
        return 0 if state is None else state.bucket.time_until_refilled_ms(n, now_ms)

    def tokens(self, principal: str, now_ms: int) -> float | None:
        """Tokens in ``principal``'s bucket at ``now_ms`` (None when it is not tracked): cheap,
        for per-event use (the event log), unlike ``snapshot``."""
        state = self._principals.get(principal)
        return None if state is None else state.bucket.tokens(now_ms)

    def is_known(self, principal: str, producer_id: int, now_ms: int) -> bool:
        """Whether ``producer_id`` counts as seen for ``principal`` at ``now_ms``, without
        changing anything (for tests, ``/state`` and the backtest). Untracked → False."""
        state = self._principals.get(principal)
        if state is None:
            return False
        return state.seen.contains(producer_id, now_ms)

    # -- memory ----------------------------------------------------------------------------

    @property
    def total_bits(self) -> int:
        return self._total_bits

    def _total_bits_recount(self) -> int:
        return sum(state.seen.total_bits for state in self._principals.values())

    @property
    def evicted_principal_count(self) -> int:
        return self._evicted

    def _enforce_caps(self, now_ms: int | None = None) -> None:
        """Evict least recently active principals until both caps hold. The principal just
        admitted is the most recent, so it goes last, and only if it alone breaks a cap.

        With ``now_ms``, an evicted principal that had a frontier gets a new enforcement with
        that same frontier and a grace period from now (its producers' PIDs look unknown
        again); remembered for the grace period, at most ``max_principals`` of them."""
        policy = self._policy
        principals = self._principals
        while principals and (
            len(principals) > policy.max_principals or self._total_bits > policy.max_total_bits
        ):
            name, state = principals.popitem(last=False)
            self._total_bits -= state.seen.total_bits
            self._evicted += 1
            old = state.enforcement
            if now_ms is not None and old is not None and old.mode == FRONTIER:
                self._remember_eviction(name, old, now_ms)

    def _remember_eviction(self, name: str, old: Enforcement, now_ms: int) -> None:
        evicted = self._evicted_enforcement
        evicted.pop(name, None)
        evicted[name] = Enforcement(
            now_ms, self._policy.grace_ms, FRONTIER, old.frontier, "state evicted"
        )
        while evicted:
            oldest_name, oldest = next(iter(evicted.items()))
            if len(evicted) <= self._policy.max_principals and oldest.in_grace(now_ms):
                break
            del evicted[oldest_name]

    def expire(self, now_ms: int) -> int:
        """Drop dead layers everywhere and forget principals with no live layer and a full
        bucket; returns how many principals were forgotten. O(principals): call it from a
        periodic cleanup (KIP-936's ``producer.id.quota.cache.cleanup.scheduler.interval.ms``)."""
        forgotten: list[str] = []
        for name, state in self._principals.items():
            state.seen.expire(now_ms)
            if state.seen.is_empty and state.bucket.is_full(now_ms):
                forgotten.append(name)
        for name in forgotten:
            del self._principals[name]
        self._total_bits = self._total_bits_recount()
        return len(forgotten)

    def expire_in_steps(self, now_ms: int, step_principals: int) -> Generator[None, None, int]:
        """``expire`` a step of at most ``step_principals`` principals at a time (yielding
        between steps), for the periodic cleanup on the event loop: 100k principals in one go
        took ~90 ms. Returns how many principals were forgotten. A principal is expired as its
        step finds it: one evicted or forgotten before its step is skipped, one added meanwhile
        waits for the next cleanup (it has live state anyway)."""
        forgotten = 0
        for step in self._in_steps(step_principals):
            for name, state in step:
                seen = state.seen
                bits_before = seen.total_bits
                seen.expire(now_ms)
                self._total_bits -= bits_before - seen.total_bits
                if seen.is_empty and state.bucket.is_full(now_ms):
                    del self._principals[name]
                    forgotten += 1
            yield
        return forgotten

    # -- persistence -----------------------------------------------------------------------

    def export(self) -> tuple[PrincipalRecord, ...]:
        """Every tracked principal, idlest first, exactly as held (dead layers included, buckets
        not refilled); a copy. :mod:`pidgate.quota.state` serializes it."""
        return tuple(
            PrincipalRecord(name, state.bucket, state.seen.export_layers(), state.enforcement)
            for name, state in self._principals.items()
        )

    def export_in_steps(self, step_principals: int) -> Iterator[tuple[PrincipalRecord, ...]]:
        """``export`` a step of at most ``step_principals`` principals at a time, so a caller
        on the event loop can let requests through between steps (saving 100k principals in
        one go held the loop ~0.6 s). Each principal is copied whole within its step, as that
        step finds it; one evicted before its step is left out, one added meanwhile waits for
        the next export (a restart restores each principal on its own, so this fuzzy copy is
        all it needs)."""
        for step in self._in_steps(step_principals):
            yield tuple(
                PrincipalRecord(name, state.bucket, state.seen.export_layers(), state.enforcement)
                for name, state in step
            )

    def restore(self, records: Iterable[PrincipalRecord]) -> int:
        """Replace all principal state with ``records`` (idlest first), taken as they are: the
        caller has already fitted them to this manager's policy (see
        :func:`pidgate.quota.state.load.load_state`). Layers expire under the policy's window.
        Then enforces the caps; returns how many principals that evicted. Raises ValueError,
        changing nothing, on a duplicate principal or a layer that does not fit its shape."""
        principals: OrderedDict[str, TrackedPrincipal] = OrderedDict()
        for record in records:
            if record.principal in principals:
                raise ValueError(f"principal {record.principal!r} appears twice")
            seen = LayeredBloomFilter(self._plan)
            seen.restore(record.layers)
            principals[record.principal] = TrackedPrincipal(seen, record.bucket, record.enforcement)
        self._principals = principals
        self._total_bits = self._total_bits_recount()
        evicted_before = self._evicted
        self._enforce_caps()
        return self._evicted - evicted_before

    # -- run-time changes ------------------------------------------------------------------

    def update_policy(self, policy: QuotaPolicy, now_ms: int | None = None) -> Enforcement | None:
        """Apply a new policy to every tracked principal at once.

        Rates and window apply to existing buckets immediately (tokens kept, clamped to the new
        capacity; with ``now_ms`` the buckets are first refilled under the old rate up to then).
        A principal that becomes unlimited is forgotten (untracked, see module docstring); one
        that becomes limited has no state yet and so starts with a full bucket. The new window
        governs existing layers' expiry and freshness; existing layers keep their shapes (their
        positions must not change), new layers of every principal get the new false-positive
        rate and sizes. Caps are enforced at once.

        With ``now_ms``: when the change makes a principal limited that was unlimited, its
        enforcement begins now. Returns that (pending) :class:`Enforcement`, shared by every
        principal it concerns, for the caller to resolve with the frontier; None otherwise.
        """
        previous = self._policy
        self._policy = policy
        plan = self._plan_for(policy)
        if plan == self._plan:
            plan = self._plan
        self._plan = plan
        began: Enforcement | None = None
        if now_ms is not None and policy.activates_any(previous):
            began = Enforcement(now_ms, policy.grace_ms)
            self._activations.append((previous, began))
            del self._activations[:-_MAX_ACTIVATIONS]
        for name in list(self._principals):
            state = self._principals[name]
            rate = policy.rate_for(name)
            if rate is None:
                del self._principals[name]
                continue
            state.bucket = state.bucket.with_rate(rate, policy.window_ms, now_ms)
            state.seen.reconfigure(plan)
        self._total_bits = self._total_bits_recount()
        self._enforce_caps(now_ms)
        return began
