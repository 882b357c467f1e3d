"""The quota manager: (principal, producer IDs, now_ms) → Admitted | Rejected(throttle_time_ms).

Owns the KIP-936 admission rule (``admit``), what a fleet member learns from its peers
(``learn``) and the location cache below. The per-principal state it decides on, and its
bookkeeping (expiry, memory caps and eviction, export/restore, run-time policy changes), are
:class:`pidgate.quota.principal_table.PrincipalTable`'s, which :class:`QuotaManager` extends.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter; callers use one monotonic millisecond clock.

Admission of one Produce request (DESIGN.md "Quota semantics"):

* no PIDs → admitted; an unlimited principal → admitted and *not tracked* (``tracked=False``):
  remembering PIDs nobody limits would spend memory, which is the resource we are protecting.
* every PID known → admitted; each is touched in the layer that holds it, or re-added to the
  newest layer once its copies are more than half a window old (``refreshed_count``; the rule
  and its bounds are in :mod:`pidgate.quota.layered`), so producers that keep producing never
  look new.
* otherwise, if the bucket holds a token per unknown PID → take them, record the PIDs, admit;
  else reject the whole request and record nothing (no tokens, no PIDs, no refresh), with
  ``throttle_time_ms`` = ms until the bucket holds the tokens needed (≥ 1). A request needing
  more tokens than the capacity can never pass; it gets the time until the bucket is full.
* a Bloom false positive admits a new PID free (fails open with probability ≈ p).

Grandfathering (:mod:`pidgate.quota.grandfather`): a principal's enforcement begins when the
proxy starts without state for it (``begin_enforcement``), when a policy change makes it limited
(``update_policy`` returns the new :class:`Enforcement`), or when its state is evicted. During the
grace period after that moment an *unknown* PID the enforcement grandfathers (below the frontier;
any, in learning mode) is admitted without a token and recorded as known
(``Admitted.grandfathered_producer_ids``); the rest of the rule is unchanged. A rejected request
records nothing, grandfathered PIDs included. An evicted principal keeps its frontier (it never
moves) with a fresh grace period; one that had no frontier gets no grandfathering after eviction.

Hot path: a known PID of a busy producer costs a dict lookup and one touch. A small cache
remembers, per recently seen PID, the layer it was last found in (filter ``uid``, layer serial);
it is only used while that layer is live and fresh, which is exactly when a full scan would
name the same layer (the scan returns the *oldest* fresh layer holding the PID, and layers
older than a cached one never gain bits), so the cache never changes a decision. Where
``quota._bloomspeed`` is built, that check (``admit_known``, asked first by the Gatekeeper) and
the miss path's common case for one PID (``admit_single``: found uncached, or new with a token
and room in the newest layer) run compiled; each either decides as the general path would, with
the same changes, or changes nothing and leaves the decision to it (issue #25).

Memory, expiry and eviction: :mod:`pidgate.quota.principal_table`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from .bucket import TokenBucket
from .compiled import bloomspeed
from .layered import ABSENT, LayeredBloomFilter
from .policy import QuotaPolicy
from .principal_table import PrincipalTable, TrackedPrincipal

__all__ = [
    "Admitted",
    "Decision",
    "QuotaManager",
    "QuotaPolicy",
    "Rejected",
]


@dataclass(frozen=True, slots=True)
class Admitted:
    """Forward the request. ``new_producer_ids``: PIDs activated by it (tokens taken);
    ``refreshed_count``: known PIDs re-added to the newest layer; ``tracked``: False when the
    principal is unlimited and PIDs were not looked at (so "new" is unknown);
    ``grandfathered_producer_ids``: unknown PIDs admitted without a token because the cluster
    allocated them before the principal's enforcement began (recorded as known)."""

    new_producer_ids: tuple[int, ...]
    refreshed_count: int
    tracked: bool = True
    grandfathered_producer_ids: tuple[int, ...] = ()
    #: Known PIDs refreshed by this request, for a fleet to re-announce (only filled in when
    #: ``QuotaManager.announce_refreshes`` is set). A PID is refreshed when every copy of it
    #: started at least half a window ago, so each is announced about once per half window
    #: (never twice within W/2 − W/N), and peers that learn it keep it known in between.
    announced_producer_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Rejected:
    """Answer the request with a throttling error; nothing was recorded."""

    throttle_time_ms: int
    unknown_producer_ids: tuple[int, ...]


Decision = Admitted | Rejected

_ADMITTED_EMPTY = Admitted((), 0)
_ADMITTED_UNTRACKED = Admitted((), 0, tracked=False)
#: Where recently known PIDs were found: pid -> (filter uid, layer serial, ms cached), so a
#: producer's every request neither re-hashes its PID (Murmur3 + k steps, ~1 µs) nor scans
#: layers. Bounded: cleared when full.
_POSITIONS_CACHE_SIZE = 4096


class QuotaManager(PrincipalTable):
    """Per-principal KIP-936 producer-ID quota: the admission rule over the principals that
    :class:`PrincipalTable` keeps. Not thread-safe: one event loop owns it."""

    #: Entries of the location cache before it is cleared (read by the compiled path too).
    positions_cache_size = _POSITIONS_CACHE_SIZE

    def __init__(self, policy: QuotaPolicy) -> None:
        super().__init__(policy)
        #: Set by a fleet member: ``Admitted.announced_producer_ids`` is then filled in.
        self.announce_refreshes = False
        # pid -> (filter uid, layer serial, ms cached): see the module docstring.
        self._positions_cache: dict[int, tuple[int, int, int]] = {}
        self._grandfathered = 0

    @property
    def grandfathered_count(self) -> int:
        """PIDs admitted without a token as grandfathered, since this manager was made."""
        return self._grandfathered

    # -- decisions -------------------------------------------------------------------------

    def note_would_reject(self, principal: str, producer_id_count: int) -> None:
        """Observe mode: a request of ``principal`` that ``admit`` rejected was forwarded
        anyway; counted for ``/state`` (nothing else changes: the PIDs stay unknown)."""
        state = self._principals.get(principal)
        if state is not None:
            state.would_reject_requests += 1
            state.would_reject_ids += producer_id_count

    def admit_known_pure(self, principal: str, producer_ids: Collection[int], now_ms: int) -> bool:
        """The known-PID check every Produce of a busy producer ends in: True when each of
        ``producer_ids`` is where the location cache says, in a fresh layer of ``principal``'s
        filter; those layers are then touched and the principal marked recently used, exactly
        what :meth:`admit` does for such a request before it returns ``Admitted((), 0)``.
        Otherwise False, having changed nothing: :meth:`admit` decides (also when expiry is
        due, or when a PID is not cached: it scans). :meth:`admit_known` is this, compiled
        where ``quota._bloomspeed`` is built (the same answer and the same changes)."""
        state = self._principals.get(principal)
        if state is None or not producer_ids:
            return False
        seen = state.seen
        if now_ms >= seen.next_check_ms:
            return False
        cache = self._positions_cache
        uid = seen.uid
        serials = []
        for pid in producer_ids:
            cached = cache.get(pid)
            if (
                cached is None
                or cached[0] != uid
                or now_ms < cached[2]
                or not seen.is_fresh(cached[1], now_ms)
            ):
                return False
            serials.append(cached[1])
        for serial in serials:
            seen.touch(serial, now_ms)
        self._principals.move_to_end(principal)
        return True

    #: :meth:`admit_known_pure`, compiled where it runs: the Gatekeeper asks it first, so a
    #: known PID's Produce runs no interpreted frame in the quota (issue #25).
    admit_known = bloomspeed.admit_known if bloomspeed is not None else admit_known_pure

    def admit_single_pure(
        self, principal: str, producer_ids: Collection[int], now_ms: int
    ) -> tuple[int, ...] | None:
        """The pure path has no shortcut for one PID that is not cached: None, :meth:`admit`'s
        general path decides. :meth:`admit_single` is the compiled shortcut where
        ``quota._bloomspeed`` is built: for one PID of a principal with state, either the
        decision ``admit`` would make (``()``: known, touched; ``(pid,)``: admitted as new, its
        token taken and its bits written without a layer roll), with the same changes, or None
        having changed nothing (tests/quota/test_compiled.py runs both through ``admit``)."""
        return None

    admit_single = bloomspeed.admit_single if bloomspeed is not None else admit_single_pure

    def admit(
        self,
        principal: str,
        producer_ids: Collection[int],
        now_ms: int,
        *,
        pre_enforcement: Collection[int] = (),
    ) -> Decision:
        """Decide one Produce request of ``principal`` carrying ``producer_ids`` (duplicates
        allowed, -1 "no PID" must already be filtered out by the caller).

        ``pre_enforcement``: PIDs the caller knows were grandfathered (the backtest replays the
        event log's ``admitted_grandfathered`` events through it); unknown ones are admitted
        free like those the principal's own enforcement grandfathers."""
        if not producer_ids or self.admit_known(principal, producer_ids, now_ms):
            return _ADMITTED_EMPTY
        if not pre_enforcement:
            single = self.admit_single(principal, producer_ids, now_ms)
            if single is not None:
                return Admitted(single, 0) if single else _ADMITTED_EMPTY
        state = self._principals.get(principal)
        if state is None:
            rate = self._policy.rate_for(principal)
            if rate is None:
                return _ADMITTED_UNTRACKED
            return self._admit_first(principal, rate, producer_ids, now_ms, pre_enforcement)

        seen = state.seen
        if now_ms >= seen.next_check_ms:
            bits_before = seen.total_bits
            if seen.expire(now_ms):
                self._total_bits -= bits_before - seen.total_bits
        cache = self._positions_cache
        uid = seen.uid
        # Where each distinct PID is; nothing changes until the request is admitted.
        fresh: set[int] = set()  # serials of the layers to touch (a batch shares a few)
        stale: list[tuple[int, tuple[int, ...]]] = []
        unknown: list[tuple[int, tuple[int, ...]]] = []
        if len(producer_ids) == 1:
            # The hot path: one PID of a busy producer, found where it was last time; else one
            # scan, and a known PID's layer is touched at once (nothing can reject it).
            for pid in producer_ids:
                cached = cache.get(pid)
                if (
                    cached is not None
                    and cached[0] == uid
                    and now_ms >= cached[2]
                    and seen.touch(cached[1], now_ms)
                ):
                    self._principals.move_to_end(principal)
                    return _ADMITTED_EMPTY
                positions = seen.positions(pid)
                where = seen.find(pid, positions, now_ms)
                if where >= 0:
                    seen.touch(where, now_ms)
                    self._remember_location(pid, uid, where, now_ms)
                    self._principals.move_to_end(principal)
                    return _ADMITTED_EMPTY
                (unknown if where == ABSENT else stale).append((pid, positions))
        else:
            for pid in dict.fromkeys(producer_ids):
                cached = cache.get(pid)
                if (
                    cached is not None
                    and cached[0] == uid
                    and now_ms >= cached[2]
                    and seen.is_fresh(cached[1], now_ms)
                ):
                    fresh.add(cached[1])
                    continue
                positions = seen.positions(pid)
                where = seen.find(pid, positions, now_ms)
                if where >= 0:
                    fresh.add(where)
                    self._remember_location(pid, uid, where, now_ms)
                elif where == ABSENT:
                    unknown.append((pid, positions))
                else:
                    stale.append((pid, positions))

        if not unknown and not stale:
            # Only active PIDs, each in a fresh layer: touch those layers, no bits change.
            for serial in fresh:
                seen.touch(serial, now_ms)
            self._principals.move_to_end(principal)
            return _ADMITTED_EMPTY

        grandfathered: tuple[int, ...] = ()
        if unknown:
            enforcement = state.enforcement
            if pre_enforcement or (enforcement is not None and enforcement.in_grace(now_ms)):
                grandfathered = tuple(
                    pid
                    for pid, _ in unknown
                    if pid in pre_enforcement
                    or (enforcement is not None and enforcement.grandfathers(pid, now_ms))
                )
            charged = len(unknown) - len(grandfathered)
            if charged:
                bucket = state.bucket.try_take(charged, now_ms)
                if bucket is None:
                    wait = state.bucket.time_until_available_ms(charged, now_ms)
                    free = set(grandfathered)
                    return Rejected(
                        max(1, wait), tuple(pid for pid, _ in unknown if pid not in free)
                    )
                state.bucket = bucket

        self._principals.move_to_end(principal)
        # Every layer holding a stale PID started at least half a window ago, so in an earlier
        # half-window than now: announcing each refresh keeps the fleet's traffic at about one
        # announcement per active PID per half window (issue "fleet").
        announced = tuple(pid for pid, _ in stale) if stale and self.announce_refreshes else ()
        for serial in fresh:
            seen.touch(serial, now_ms)
        bits_before = seen.total_bits
        newest = seen.newest_serial
        pending = len(stale) + len(unknown)
        for pid, positions in (*stale, *unknown):
            serial = seen.add(positions, now_ms, pending)
            pending -= 1
            # Cacheable only if no layer rolled before this add: then no layer older than the
            # one written changed since find() saw no fresh layer holding the PID.
            if serial == newest:
                self._remember_location(pid, uid, serial, now_ms)
        grown = seen.total_bits - bits_before
        if grown:
            self._total_bits += grown
            self._enforce_caps(now_ms)
        if grandfathered:
            self._grandfathered += len(grandfathered)
            free = set(grandfathered)
            return Admitted(
                tuple(pid for pid, _ in unknown if pid not in free),
                len(stale),
                grandfathered_producer_ids=grandfathered,
                announced_producer_ids=announced,
            )
        return Admitted(
            tuple(pid for pid, _ in unknown), len(stale), announced_producer_ids=announced
        )

    def learn(
        self,
        principal: str,
        known_producer_ids: Collection[int],
        taken_tokens: int,
        now_ms: int,
    ) -> bool:
        """Apply what another fleet member admitted: ``known_producer_ids`` become known here
        too (touched or refreshed, as if seen now), and ``taken_tokens`` are debited from this
        principal's bucket (0 in ``instance`` scope). An unlimited principal is not tracked, so
        nothing is learnt for it. Returns whether anything was applied."""
        state = self._principals.get(principal)
        if state is None:
            rate = self._policy.rate_for(principal)
            if rate is None:
                return False
            state = TrackedPrincipal(
                LayeredBloomFilter(self._plan),
                TokenBucket.full(rate, self._policy.window_ms, now_ms),
                self._enforcement_for_new(principal, now_ms),
            )
            self._principals[principal] = state
        seen = state.seen
        bits_before = seen.total_bits
        for pid in dict.fromkeys(known_producer_ids):
            seen.refresh(pid, now_ms)
        if taken_tokens > 0:
            state.bucket = state.bucket.debit(taken_tokens, now_ms)
        self._principals.move_to_end(principal)
        self._total_bits += seen.total_bits - bits_before
        self._enforce_caps(now_ms)
        return True

    def _remember_location(self, pid: int, uid: int, serial: int, now_ms: int) -> None:
        """Cache where a known PID is (found, or just admitted). Rejected PIDs are never
        cached, so a storm of new PIDs cannot push out the producers that pass."""
        cache = self._positions_cache
        if len(cache) >= self.positions_cache_size:
            cache.clear()
        cache[pid] = (uid, serial, now_ms)

    def _admit_first(
        self,
        principal: str,
        rate: int,
        producer_ids: Collection[int],
        now_ms: int,
        pre_enforcement: Collection[int],
    ) -> Decision:
        """A limited principal with no state: every PID is unknown and the bucket is full."""
        policy = self._policy
        ids = tuple(dict.fromkeys(producer_ids))
        enforcement = self._enforcement_for_new(principal, now_ms)
        grandfathered = tuple(
            pid
            for pid in ids
            if pid in pre_enforcement
            or (enforcement is not None and enforcement.grandfathers(pid, now_ms))
        )
        free = set(grandfathered)
        new_ids = tuple(pid for pid in ids if pid not in free)
        bucket = TokenBucket.full(rate, policy.window_ms, now_ms)
        taken = bucket.try_take(len(new_ids), now_ms) if new_ids else bucket
        if taken is None:
            # Not stored: a principal with no layers and a full bucket is indistinguishable
            # from a forgotten one.
            wait = bucket.time_until_available_ms(len(new_ids), now_ms)
            return Rejected(max(1, wait), new_ids)
        seen = LayeredBloomFilter(self._plan)
        pending = len(ids)
        for pid in ids:
            seen.add(seen.positions(pid), now_ms, pending)
            pending -= 1
        self._principals[principal] = TrackedPrincipal(seen, taken, enforcement)
        self._total_bits += seen.total_bits
        self._grandfathered += len(grandfathered)
        self._enforce_caps(now_ms)
        return Admitted(new_ids, 0, grandfathered_producer_ids=grandfathered)
