"""The quota manager: (principal, producer IDs, now_ms) → Admitted | Rejected(throttle_time_ms).

Owns per-principal state (a layered Bloom filter of seen PIDs and a token bucket), the KIP-936
admission rule, run-time policy changes, expiry of idle principals and the global memory caps
with idlest-first eviction.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter; callers use one monotonic millisecond clock.

Admission of one Produce request (DESIGN.md "Quota semantics"):

* no PIDs → admitted; an unlimited principal → admitted and *not tracked* (``tracked=False``):
  remembering PIDs nobody limits would spend memory, which is the resource we are protecting.
* every PID known → admitted; those missing from the newest layer are re-added there
  (``refreshed_count``), so producers that keep producing never look new.
* otherwise, if the bucket holds a token per unknown PID → take them, record the PIDs, admit;
  else reject the whole request and record nothing (no tokens, no PIDs, no refresh), with
  ``throttle_time_ms`` = ms until the bucket holds the tokens needed (≥ 1). A request needing
  more tokens than the capacity can never pass; it gets the time until the bucket is full.
* a Bloom false positive admits a new PID free (fails open with probability ≈ p).

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
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .bloom import BloomShape, bloom_positions
from .bucket import TokenBucket
from .layered import ABSENT, IN_CURRENT, LayeredBloomFilter, LayerState
from .policy import QuotaPolicy

__all__ = [
    "Admitted",
    "Decision",
    "PrincipalRecord",
    "PrincipalState",
    "QuotaManager",
    "QuotaPolicy",
    "Rejected",
]


@dataclass(frozen=True, slots=True)
class Admitted:
    """Forward the request. ``new_producer_ids``: PIDs activated by it (tokens taken);
    ``refreshed_count``: known PIDs re-added to the newest layer; ``tracked``: False when the
    principal is unlimited and PIDs were not looked at (so "new" is unknown)."""

    new_producer_ids: tuple[int, ...]
    refreshed_count: int
    tracked: bool = True


@dataclass(frozen=True, slots=True)
class Rejected:
    """Answer the request with a throttling error; nothing was recorded."""

    throttle_time_ms: int
    unknown_producer_ids: tuple[int, ...]


Decision = Admitted | Rejected


@dataclass(frozen=True, slots=True)
class PrincipalState:
    """One tracked principal, for metrics and the read-only ``/state`` endpoint."""

    principal: str
    producer_ids_rate: int
    tokens: float
    layer_count: int
    bits: int
    estimated_false_positive_rate: float


@dataclass(frozen=True, slots=True)
class PrincipalRecord:
    """The complete state of one tracked principal as plain data, for persistence
    (:meth:`QuotaManager.export` / :meth:`QuotaManager.restore`)."""

    principal: str
    bucket: TokenBucket
    shape: BloomShape
    layers: tuple[LayerState, ...]


_ADMITTED_EMPTY = Admitted((), 0)
_ADMITTED_UNTRACKED = Admitted((), 0, tracked=False)
#: Bloom positions of recently known PIDs, so a producer's every request does not re-hash its
#: PID (Murmur3 + k modular steps, ~1 µs; a dict hit ~0.1 µs). Bounded: cleared when full.
_POSITIONS_CACHE_SIZE = 4096


class _Principal:
    __slots__ = ("bucket", "seen")

    def __init__(self, seen: LayeredBloomFilter, bucket: TokenBucket) -> None:
        self.seen = seen
        self.bucket = bucket


class QuotaManager:
    """Per-principal KIP-936 producer-ID quota. Not thread-safe: one event loop owns it."""

    def __init__(self, policy: QuotaPolicy) -> None:
        self._policy = policy
        # Least recently active first: admit() moves a principal to the end, eviction pops the
        # front, both O(1).
        self._principals: OrderedDict[str, _Principal] = OrderedDict()
        self._total_bits = 0
        self._evicted = 0
        # pid -> (shape, positions); a hit needs the very same shape object (see admit).
        self._positions_cache: dict[int, tuple[BloomShape, tuple[int, ...]]] = {}

    # -- read-only views -------------------------------------------------------------------

    @property
    def policy(self) -> QuotaPolicy:
        return self._policy

    @property
    def evicted_principal_count(self) -> int:
        return self._evicted

    @property
    def principal_count(self) -> int:
        return len(self._principals)

    @property
    def total_bits(self) -> int:
        return self._total_bits

    def snapshot(self, now_ms: int) -> tuple[PrincipalState, ...]:
        """State of every tracked principal at ``now_ms``, idlest first. Changes nothing
        (layers not yet expired are still counted)."""
        return tuple(
            PrincipalState(
                principal=name,
                producer_ids_rate=state.bucket.rate,
                tokens=state.bucket.tokens(now_ms),
                layer_count=state.seen.layer_count,
                bits=state.seen.total_bits,
                estimated_false_positive_rate=state.seen.estimated_false_positive_rate(),
            )
            for name, state in self._principals.items()
        )

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
        return state.seen.contains(bloom_positions(producer_id, state.seen.shape), now_ms)

    # -- decisions -------------------------------------------------------------------------

    def admit(self, principal: str, producer_ids: Collection[int], now_ms: int) -> Decision:
        """Decide one Produce request of ``principal`` carrying ``producer_ids`` (duplicates
        allowed, -1 "no PID" must already be filtered out by the caller)."""
        if not producer_ids:
            return _ADMITTED_EMPTY
        state = self._principals.get(principal)
        if state is None:
            rate = self._policy.rate_for(principal)
            if rate is None:
                return _ADMITTED_UNTRACKED
            return self._admit_first(principal, rate, producer_ids, now_ms)

        seen = state.seen
        shape = seen.shape
        dropped = seen.expire(now_ms)
        if dropped:
            self._total_bits -= dropped * shape.bit_count
        # Positions once per distinct PID; every layer is tested with the same tuple.
        in_current = False
        stale: list[tuple[int, ...]] = []
        unknown: list[tuple[int, tuple[int, ...]]] = []
        unique = producer_ids if len(producer_ids) == 1 else dict.fromkeys(producer_ids)
        cache = self._positions_cache
        for pid in unique:
            cached = cache.get(pid)
            if cached is not None and cached[0] is shape:
                positions = cached[1]
            else:
                positions = bloom_positions(pid, shape)
            where = seen.lookup(positions, now_ms)
            if where == IN_CURRENT:
                in_current = True
            elif where == ABSENT:
                unknown.append((pid, positions))
                continue
            else:
                stale.append(positions)
            if cached is None:
                self._remember_positions(pid, shape, positions)

        if not unknown and not stale:
            # The common case: only active PIDs, all in the current layer. No bits change.
            seen.touch(now_ms)
            self._principals.move_to_end(principal)
            return _ADMITTED_EMPTY

        if unknown:
            bucket = state.bucket.try_take(len(unknown), now_ms)
            if bucket is None:
                wait = state.bucket.time_until_available_ms(len(unknown), now_ms)
                return Rejected(max(1, wait), tuple(pid for pid, _ in unknown))
            state.bucket = bucket

        self._principals.move_to_end(principal)
        bits_before = seen.total_bits
        # Touch first: adds below may roll a new layer, and the PIDs found in the (then
        # previous) current layer must stay alive a full window from now.
        if in_current:
            seen.touch(now_ms)
        for positions in stale:
            seen.add(positions, now_ms)
        for pid, positions in unknown:
            seen.add(positions, now_ms)
            self._remember_positions(pid, shape, positions)
        grown = seen.total_bits - bits_before
        if grown:
            self._total_bits += grown
            self._enforce_caps()
        return Admitted(tuple(pid for pid, _ in unknown), len(stale))

    def _remember_positions(self, pid: int, shape: BloomShape, positions: tuple[int, ...]) -> None:
        """Cache the positions of a PID that is known (found, or just admitted). Rejected PIDs
        are never cached, so a storm of new PIDs cannot push out the producers that pass."""
        cache = self._positions_cache
        if len(cache) >= _POSITIONS_CACHE_SIZE:
            cache.clear()
        cache[pid] = (shape, positions)

    def _admit_first(
        self, principal: str, rate: int, producer_ids: Collection[int], now_ms: int
    ) -> Decision:
        """A limited principal with no state: every PID is unknown and the bucket is full."""
        policy = self._policy
        new_ids = tuple(dict.fromkeys(producer_ids))
        bucket = TokenBucket.full(rate, policy.window_ms, now_ms)
        taken = bucket.try_take(len(new_ids), now_ms)
        if taken is None:
            # Not stored: a principal with no layers and a full bucket is indistinguishable
            # from a forgotten one.
            wait = bucket.time_until_available_ms(len(new_ids), now_ms)
            return Rejected(max(1, wait), new_ids)
        shape = BloomShape.for_capacity(policy.layer_items_for(rate), policy.false_positive_rate)
        seen = LayeredBloomFilter(shape, policy.window_ms, policy.window_num)
        for pid in new_ids:
            seen.add(bloom_positions(pid, shape), now_ms)
        self._principals[principal] = _Principal(seen, taken)
        self._total_bits += seen.total_bits
        self._enforce_caps()
        return Admitted(new_ids, 0)

    # -- memory ----------------------------------------------------------------------------

    def _total_bits_recount(self) -> int:
        return sum(state.seen.total_bits for state in self._principals.values())

    def _enforce_caps(self) -> None:
        """Evict least recently active principals until both caps hold. The principal just
        admitted is the most recent, so it goes last, and only if it alone breaks a cap."""
        policy = self._policy
        principals = self._principals
        while principals and (
            len(principals) > policy.max_principals or self._total_bits > policy.max_total_bits
        ):
            _, state = principals.popitem(last=False)
            self._total_bits -= state.seen.total_bits
            self._evicted += 1

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

    # -- persistence -----------------------------------------------------------------------

    def export(self) -> tuple[PrincipalRecord, ...]:
        """Every tracked principal, idlest first, exactly as held (dead layers included, buckets
        not refilled); a copy. :mod:`pidgate.quota.persistence` serializes it."""
        return tuple(
            PrincipalRecord(name, state.bucket, state.seen.shape, state.seen.export_layers())
            for name, state in self._principals.items()
        )

    def restore(self, records: Iterable[PrincipalRecord]) -> int:
        """Replace all principal state with ``records`` (idlest first), taken as they are: the
        caller has already fitted them to this manager's policy (see
        :func:`pidgate.quota.persistence.load_state`). Layers expire under the policy's window.
        Then enforces the caps; returns how many principals that evicted. Raises ValueError,
        changing nothing, on a duplicate principal or a layer that does not fit its shape."""
        policy = self._policy
        principals: OrderedDict[str, _Principal] = OrderedDict()
        for record in records:
            if record.principal in principals:
                raise ValueError(f"principal {record.principal!r} appears twice")
            seen = LayeredBloomFilter(record.shape, policy.window_ms, policy.window_num)
            seen.restore(record.layers)
            principals[record.principal] = _Principal(seen, record.bucket)
        self._principals = principals
        self._total_bits = self._total_bits_recount()
        evicted_before = self._evicted
        self._enforce_caps()
        return self._evicted - evicted_before

    # -- run-time changes ------------------------------------------------------------------

    def update_policy(self, policy: QuotaPolicy, now_ms: int | None = None) -> None:
        """Apply a new policy to every tracked principal at once.

        Rates and window apply to existing buckets immediately (tokens kept, clamped to the new
        capacity; with ``now_ms`` the buckets are first refilled under the old rate up to then).
        A principal that becomes unlimited is forgotten (untracked, see module docstring); one
        that becomes limited has no state yet and so starts with a full bucket. The new window
        governs existing layers' expiry; the Bloom shape of existing principals is kept (their
        positions must not change), new principals get the new false-positive rate and sizes.
        Caps are enforced at once.
        """
        self._policy = policy
        for name in list(self._principals):
            state = self._principals[name]
            rate = policy.rate_for(name)
            if rate is None:
                del self._principals[name]
                continue
            state.bucket = state.bucket.with_rate(rate, policy.window_ms, now_ms)
            state.seen.reconfigure(policy.window_ms, policy.window_num)
        self._total_bits = self._total_bits_recount()
        self._enforce_caps()
