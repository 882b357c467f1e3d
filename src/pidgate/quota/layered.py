"""The time-layered Bloom filter that remembers one principal's producer IDs for a window.

Owns KIP-936's "seen PIDs" cache of one principal: time layers (a new one every
``window_ms / window_num``, or earlier when the newest is saturated), each sized to what the
principal writes, the refresh rule that keeps active PIDs known, and expiry. Everything a
principal holds lives in two buffers (one bitarray with every layer's bits end to end, one
``array('q')`` with six integers per layer), because at 10k principals × ~15 layers even
~250 B of Python objects per layer would cost more than the bits (issue #12 "lean").

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter; the bounds below assume callers pass one
clock that does not run backwards (a clock that steps back delays expiry, never loses a PID).

Rules
-----

Let W = ``window_ms``, N = ``window_num``, S = W / N (a layer's span) and H the *fresh
horizon*: a layer is **fresh** at ``now`` while ``now - start_ms < W / 2`` (``< W`` when N = 1,
where a layer stays current a whole window), so H = ⌊(W − 1) / 2⌋ (W − 1 when N = 1) is the
latest age at which a layer is fresh. Since S <= W / 2 for N >= 2, every current layer is fresh.

* Only the newest layer is written. It is *current* while ``now - start_ms < S``; a write at a
  later time, or when it is saturated, starts a new layer at that write's time (lazily: an
  idle principal costs no layers). New layers are sized from the principal's recent writes
  (see :meth:`LayeredBloomFilter._next_shape`), with a bit count from a ladder of sizes that
  lets one hash of a PID serve every layer (:func:`pidgate.quota.bloom.universal_positions`).
* Every layer records ``last_write_ms``: the latest time a PID was added to it or *touched*
  in it. A layer is dead, ignored by lookups and dropped by :meth:`expire`, once
  ``last_write_ms + W <= now``. Dead layers may sit anywhere in the list, not only in front
  (touches, below, renew older layers), so lookups check every layer.
* When a PID is seen (admitted, or learnt from the fleet) at ``now``: if a fresh live layer
  holds it, the oldest such layer is *touched* (``last_write_ms = now``); otherwise it is
  *refreshed*: added to the newest layer (``refreshed_count``). A steady producer is thus
  re-added about once per half window, not once per layer span as before (KIP-936's sketch
  re-adds into every layer): each active PID has about three copies alive instead of
  ``window_num + 1``. The oldest fresh layer is the one touched so that the manager's location
  cache (:mod:`pidgate.quota.manager`) can skip the scan and still give the same answer.

Guarantees (tests/quota/test_layered.py checks both with random timings):

* **No false negatives inside the window.** A PID seen at ``t`` is found at every
  ``t' < t + W``. Proof: at ``t`` either a live layer L holding its bits was touched, so
  ``L.last_write_ms >= t`` and L lives until at least ``t + W``; or it was added to a layer
  whose ``last_write_ms`` became ``>= t``. Bits are never cleared while a layer lives, so that
  layer holds the PID at every ``t' < t + W``.
* **Forgotten within W + H after the last sighting.** A PID last seen at ``t_last`` is held by
  no live layer (only a false positive can find it) from ``t_last + W + H`` on: below W + W/2
  (below 2W when N = 1). Proof: a layer L that holds the PID got it at some time >= its
  ``start_ms``, so ``L.start_ms <= t_last``. L's ``last_write_ms`` only moves on an add (while
  L is current: ``now - start_ms < S``, so ``now <= start_ms + H``) or a touch (while L is
  fresh: ``now <= start_ms + H``); so ``L.last_write_ms <= start_ms + H <= t_last + H`` and L is
  dead from ``t_last + H + W`` on. The old bound was W + S; the extra W/2 − S is the price of
  re-adding active PIDs once per half window instead of once per span.

Memory: live layers started at most W + H before ``now`` by the proof above, so by time at most
about ``(W + H) / S + 1`` = 1.5·N + 1 layers are alive (18 at N = 11), plus layers rolled early
by saturation; but a steady producer has only ~3 copies among them, and quiet spans make no
layer.

False positives: each layer's share of the configured rate is :mod:`pidgate.quota.layer_plan`'s
(:class:`LayerPlan`).
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from bitarray import bitarray
from bitarray.util import zeros

from .bloom import (
    UNIVERSAL_MODULUS,
    BloomShape,
    bloom_positions,
    false_positive_rate_of,
    rate_at_capacity,
    universal_positions,
)
from .compiled import bloomspeed
from .layer_plan import EARLY_ROLL_DIVISOR, LayerPlan

__all__ = ["ABSENT", "STALE", "LayerState", "LayeredBloomFilter"]

# Results of LayeredBloomFilter.find() that are not a layer's serial number (those are >= 0).
ABSENT = -1  # no live layer holds the PID
STALE = -2  # only layers that are no longer fresh hold it: refresh it into the newest layer

# One row of LayeredBloomFilter._meta per layer, oldest first.
_START, _LAST, _INSERTED, _CAPACITY, _BITS, _HASHES = range(6)
_STRIDE = 6
#: _LAST of a dropped layer whose row is still in the middle of the list: dead at any time.
_GONE = -(2**62)
#: "Check expiry again at": never (no live layer) / at once (after a restore or reconfigure).
_NEVER = 2**62
_AT_ONCE = -(2**62)
#: Identity of a filter's current layers, for the manager's location cache.
_uids = itertools.count(1)
#: Headroom of a new layer over the most items a recent layer took (numerator / 4).
_HEADROOM_QUARTERS = 5


@dataclass(frozen=True, slots=True)
class LayerState:
    """One layer as plain data, for persistence: its shape, times, ``inserted_count`` and its
    bits in :meth:`pidgate.quota.bloom.BloomFilter.to_bytes` form."""

    shape: BloomShape
    start_ms: int
    last_write_ms: int
    inserted_count: int
    bits: bytes


class LayeredBloomFilter:
    """Seen-PID cache of one principal; see the module docstring for the exact rules.

    Layers are addressed by a *serial* number, increasing from oldest to newest and never
    reused by this filter; ``uid`` changes whenever the layers are replaced
    (:meth:`restore`) or their rules change (:meth:`reconfigure`), so a (``uid``, serial) pair
    names one layer for the filter's whole life.
    """

    __slots__ = (
        "_bits",
        "_first",
        "_max_hashes",
        "_meta",
        "_restored",
        "next_check_ms",
        "plan",
        "uid",
    )

    def __init__(self, plan: LayerPlan) -> None:
        self.plan = plan
        self.uid = next(_uids)
        # Every layer's bits, oldest first, end to end (a layer's offset is the sum of the
        # bit counts before it; dropped layers take no bits).
        self._bits = bitarray(0, endian="big")
        self._meta = array("q")  # _STRIDE integers per layer, oldest first
        self._first = 0  # serial of the first row of _meta
        # k of universal_positions(): enough for every layer on the ladder held.
        self._max_hashes = plan.hash_count
        # Whether a layer off the ladder was restored (find() then checks each layer's size).
        self._restored = False
        #: No layer can die before this time: admit() calls expire() only from then on.
        self.next_check_ms = _NEVER

    # -- queries ---------------------------------------------------------------------------

    @property
    def layer_count(self) -> int:
        """Layers held (dead ones that :meth:`expire` has not dropped yet included)."""
        meta = self._meta
        return sum(1 for base in range(0, len(meta), _STRIDE) if meta[base + _BITS])

    @property
    def total_bits(self) -> int:
        return len(self._bits)

    @property
    def is_empty(self) -> bool:
        return not self._bits

    def positions(self, producer_id: int) -> tuple[int, ...]:
        """The PID's universal positions (:func:`universal_positions`), long enough for every
        layer on the ladder this filter holds; :meth:`find` and :meth:`add` take them."""
        return universal_positions(producer_id, self._max_hashes)

    def _holds_restored(self, base: int, offset: int, producer_id: int) -> bool:
        """Whether a layer in a shape off the ladder (restored from a state saved before
        format 3, never written again) holds the PID."""
        meta = self._meta
        bits = self._bits
        shape = BloomShape(meta[base + _BITS], meta[base + _HASHES], meta[base + _CAPACITY])
        for i in bloom_positions(producer_id, shape):  # noqa: SIM110
            if not bits[offset + i]:
                return False
        return True

    def find(self, producer_id: int, positions: tuple[int, ...], now_ms: int) -> int:
        """Where the PID is: the serial of the *oldest fresh* live layer that holds it, else
        STALE if a live layer that is not fresh holds it, else ABSENT.

        ``positions``: :meth:`positions` of ``producer_id``. One pass, newest layer first: the
        fresh layers come first (an active PID lives there), and the scan stops at the first
        layer that is not fresh once a fresh one held the PID, or at the first older layer that
        holds it. Dead layers are ignored wherever they are, so the answer never depends on
        when :meth:`expire` last ran. Hot for new PIDs (every layer is tested): compiled where
        ``quota._bloomspeed`` is built, except over layers restored off the ladder.
        """
        if bloomspeed is not None and not self._restored:
            plan = self.plan
            found: int = bloomspeed.find(
                self._bits,
                self._meta,
                self._first,
                positions,
                now_ms,
                plan.window_ms,
                plan.fresh_divisor,
            )
            return found
        return self.find_pure(producer_id, positions, now_ms)

    def find_pure(self, producer_id: int, positions: tuple[int, ...], now_ms: int) -> int:
        """:meth:`find` in pure Python, whichever path runs (the compiled one's reference)."""
        meta = self._meta
        bits = self._bits
        plan = self.plan
        window_ms = plan.window_ms
        # Fresh while (now - start) * divisor < window, i.e. start > fresh_after.
        fresh_after = now_ms - -(-window_ms // plan.fresh_divisor)
        dead_before = now_ms - window_ms
        first = positions[0]
        all_hashes = len(positions)
        modulus = UNIVERSAL_MODULUS
        offset = len(bits)
        found = ABSENT
        fresh = True
        restored = self._restored
        # Row fields by literal offset (_START 0, _LAST 1, _BITS 4, _HASHES 5): this loop
        # runs once per layer for every PID that is not in the manager's location cache.
        base = len(meta) - _STRIDE
        while base >= 0:
            m = meta[base + 4]
            if not m:  # a dropped layer's row
                base -= 6
                continue
            offset -= m
            if fresh and meta[base] <= fresh_after:
                # Layers start in time order: this one and all older ones are not fresh.
                if found != ABSENT:
                    return found
                fresh = False
            # A fresh layer is never dead (its last write >= its start > now - window).
            if fresh or meta[base + 1] > dead_before:
                if restored and modulus % m:
                    if self._holds_restored(base, offset, producer_id):
                        if not fresh:
                            return STALE
                        found = self._first + base // 6
                # Most layers miss on the first bit: test it before anything else.
                elif bits[offset + first % m]:
                    k = meta[base + 5]
                    for u in positions if k == all_hashes else positions[:k]:
                        if not bits[offset + u % m]:
                            break
                    else:
                        if not fresh:
                            return STALE
                        found = self._first + base // 6
            base -= 6
        return found

    def contains(self, producer_id: int, now_ms: int) -> bool:
        """Whether a live layer holds the PID (for tests, ``is_known`` and the backtest)."""
        return self.find(producer_id, self.positions(producer_id), now_ms) != ABSENT

    def is_fresh(self, serial: int, now_ms: int) -> bool:
        """Whether the layer ``serial`` is held, live and fresh at ``now_ms``."""
        base = (serial - self._first) * _STRIDE
        meta = self._meta
        if base < 0 or base >= len(meta):
            return False
        plan = self.plan
        return (
            meta[base + _LAST] + plan.window_ms > now_ms
            and (now_ms - meta[base + _START]) * plan.fresh_divisor < plan.window_ms
        )

    @property
    def newest_serial(self) -> int:
        """Serial of the newest row (``first - 1`` when there is none)."""
        return self._first + len(self._meta) // _STRIDE - 1

    def estimated_false_positive_rate(self, now_ms: int | None = None) -> float:
        """Chance that a PID this principal never used is reported present by a layer, i.e.
        passes free: 1 − Π(1 − r_i) over the layers live at ``now_ms`` (every layer held when
        None), r_i from the layer's actual fill (:func:`false_positive_rate_of`), computed as
        −expm1(Σ log1p(−r_i)) so tiny rates do not cancel to 0.0. :meth:`find` tests every
        live layer, so this is what a new PID sees (tests/quota/test_false_positive_rate.py
        checks it against 100k+ lookups)."""
        meta = self._meta
        bits = self._bits
        log_miss = 0.0
        offset = 0
        dead_before = None if now_ms is None else now_ms - self.plan.window_ms
        for base in range(0, len(meta), _STRIDE):
            m = meta[base + _BITS]
            if not m:
                continue
            start = offset
            offset += m
            if dead_before is not None and meta[base + _LAST] <= dead_before:
                continue
            rate = false_positive_rate_of(
                bits.count(1, start, start + m), m, meta[base + _HASHES], meta[base + _INSERTED]
            )
            if rate >= 1.0:
                return 1.0  # every bit set (log1p(-1) would raise)
            log_miss += math.log1p(-rate)
        return max(0.0, -math.expm1(log_miss))

    # -- updates ---------------------------------------------------------------------------

    def touch(self, serial: int, now_ms: int) -> bool:
        """Renew layer ``serial`` until ``now_ms + window_ms`` if it is held, live and fresh
        (returns True); otherwise change nothing and return False. The manager calls it for a
        PID :meth:`find` placed in that layer: it keeps the PID known a full window after it
        was last seen without rewriting its bits."""
        base = (serial - self._first) * _STRIDE
        meta = self._meta
        if base < 0 or base >= len(meta):
            return False
        plan = self.plan
        last = meta[base + _LAST]
        if (
            last + plan.window_ms <= now_ms
            or (now_ms - meta[base + _START]) * plan.fresh_divisor >= plan.window_ms
        ):
            return False
        if now_ms > last:
            meta[base + _LAST] = now_ms
        return True

    def add(self, positions: tuple[int, ...], now_ms: int, pending: int = 1) -> int:
        """Record the PID with universal ``positions`` in the newest layer, starting a new one
        if there is none, or the newest is no longer current, saturated, dropped, or in a shape
        this plan would not build (restored from an older format or another false-positive
        rate: such layers are read and touched, never written); returns the serial of the
        layer written. Does not check whether the PID is already present. ``pending``: how
        many PIDs the caller is adding now, this one included (a hint for sizing a new
        layer)."""
        meta = self._meta
        plan = self.plan
        base = len(meta) - _STRIDE
        if (
            base < 0
            or meta[base + _INSERTED] >= meta[base + _CAPACITY]
            or (now_ms - meta[base + _START]) * plan.window_num >= plan.window_ms
            or meta[base + _LAST] + plan.window_ms <= now_ms  # dropped (or the clock jumped)
            or meta[base + _HASHES] != plan.hash_count  # restored from another rate: sealed
            or UNIVERSAL_MODULUS % meta[base + _BITS]  # off the ladder (or dropped): sealed
        ):
            base = self._start_layer(now_ms, pending)
        m = meta[base + _BITS]
        offset = len(self._bits) - m
        bits = self._bits
        if bloomspeed is not None:
            bloomspeed.set_positions(bits, offset, m, meta[base + _HASHES], positions)
        else:
            for i in range(meta[base + _HASHES]):
                bits[offset + positions[i] % m] = 1
        # Counts add() calls, not distinct items: callers only add PIDs no fresh layer holds,
        # so it tracks distinct inserts closely and errs towards rolling layers early.
        meta[base + _INSERTED] += 1
        if now_ms > meta[base + _LAST]:
            meta[base + _LAST] = now_ms
        return self._first + base // _STRIDE

    def _next_shape(self, now_ms: int, pending: int) -> BloomShape:
        """Size of a new layer started at ``now_ms``: what the principal needs, not a fixed
        minimum (issue #12).

        A new layer takes the PIDs activated in its span and the active PIDs refreshed in it:
        those whose copies stop being fresh during its span, i.e. that sit in layers started
        about H before it. So it is sized for the most items any live layer that started in
        (now − H − S, now + S − H] took, or for ``pending`` (the PIDs of the request being
        added), whichever is more, plus 25% headroom, clamped by the plan and rounded up to the
        ladder (:meth:`LayerPlan.shape_for`). If the newest layer saturated, at least twice its
        capacity, so a burst of new PIDs costs O(log n) rolls. A short guess only means an
        early roll on saturation, which keeps the false-positive rate at target. Depends only
        on what is persisted, so a restart sizes layers the same way.

        Its false-positive target: ``plan.layer_rate`` for a layer started on schedule; for an
        early roll (the newest is full but still current) a quarter of the newest's own target
        (read back from its shape, :func:`rate_at_capacity`), at least ``plan.min_layer_rate``:
        see "False positives" in :mod:`pidgate.quota.layer_plan`.
        """
        meta = self._meta
        plan = self.plan
        want = pending
        rate = plan.layer_rate
        if meta:
            newest = len(meta) - _STRIDE
            if meta[newest + _BITS] and meta[newest + _INSERTED] >= meta[newest + _CAPACITY]:
                want = max(want, 2 * meta[newest + _CAPACITY])
                current = (now_ms - meta[newest + _START]) * plan.window_num < plan.window_ms
                if current and meta[newest + _LAST] + plan.window_ms > now_ms:
                    shape = BloomShape(
                        meta[newest + _BITS], meta[newest + _HASHES], meta[newest + _CAPACITY]
                    )
                    rate = max(
                        plan.min_layer_rate,
                        min(rate, rate_at_capacity(shape)) / EARLY_ROLL_DIVISOR,
                    )
            span = -(-plan.window_ms // plan.window_num)
            due_after = now_ms - plan.fresh_horizon_ms - span
            due_until = now_ms - plan.fresh_horizon_ms + span
            dead_before = now_ms - plan.window_ms
            for base in range(0, len(meta), _STRIDE):
                if (
                    due_after < meta[base + _START] <= due_until
                    and meta[base + _LAST] > dead_before
                ):
                    want = max(want, meta[base + _INSERTED])
        return plan.shape_for(-(-want * _HEADROOM_QUARTERS // 4), rate)

    def _start_layer(self, now_ms: int, pending: int) -> int:
        shape = self._next_shape(now_ms, pending)
        self._bits += zeros(shape.bit_count, endian="big")
        meta = self._meta
        meta.extend((now_ms, now_ms, 0, shape.expected_items, shape.bit_count, shape.hash_count))
        if shape.hash_count > self._max_hashes:
            self._max_hashes = shape.hash_count
        if now_ms + self.plan.window_ms < self.next_check_ms:
            self.next_check_ms = now_ms + self.plan.window_ms
        return len(meta) - _STRIDE

    def refresh(self, producer_id: int, now_ms: int) -> bool:
        """Keep a PID known for another window (the fleet's ``learn``): touch the oldest fresh
        layer holding it, or else add it to the newest layer. Returns True if it was added."""
        positions = self.positions(producer_id)
        where = self.find(producer_id, positions, now_ms)
        if where >= 0:
            self.touch(where, now_ms)
            return False
        self.add(positions, now_ms)
        return True

    def expire(self, now_ms: int) -> int:
        """Drop every dead layer (wherever it is); returns how many were dropped. A dropped
        layer's row stays, marked gone and without bits, until the rows before it are gone too,
        so serials keep naming the same layers."""
        meta = self._meta
        window_ms = self.plan.window_ms
        dead_before = now_ms - window_ms
        dropped = 0
        next_check = _NEVER
        offset = len(self._bits)
        for base in range(len(meta) - _STRIDE, -1, -_STRIDE):
            m = meta[base + _BITS]
            offset -= m
            if not m:
                continue
            last = meta[base + _LAST]
            if last <= dead_before:
                del self._bits[offset : offset + m]
                meta[base + _BITS] = 0
                meta[base + _LAST] = _GONE
                dropped += 1
            elif last + window_ms < next_check:
                next_check = last + window_ms
        gone = 0
        while gone < len(meta) and not meta[gone + _BITS]:
            gone += _STRIDE
        if gone:
            del meta[:gone]
            self._first += gone // _STRIDE
        self.next_check_ms = next_check
        return dropped

    # -- persistence and run-time changes --------------------------------------------------

    def export_layers(self) -> tuple[LayerState, ...]:
        """Every layer held, oldest first, dead ones included (a copy)."""
        meta = self._meta
        bits = self._bits
        out = []
        offset = 0
        for base in range(0, len(meta), _STRIDE):
            m = meta[base + _BITS]
            if not m:
                continue
            shape = BloomShape(m, meta[base + _HASHES], meta[base + _CAPACITY])
            out.append(
                LayerState(
                    shape,
                    meta[base + _START],
                    meta[base + _LAST],
                    meta[base + _INSERTED],
                    bits[offset : offset + m].tobytes(),
                )
            )
            offset += m
        return tuple(out)

    def restore(self, layers: Iterable[LayerState]) -> None:
        """Replace every layer with ``layers`` (oldest first, as :meth:`export_layers` gives
        them, each in its own shape). Raises ValueError, changing nothing, if a layer's bits do
        not fit its shape, it starts after its last write, or its ``inserted_count`` is
        negative. Layers in a shape new layers would not have (an older format's) are read and
        touched but never written again."""
        bits = bitarray(0, endian="big")
        meta = array("q")
        max_hashes = self.plan.hash_count
        restored = False
        for state in layers:
            shape = state.shape
            if state.start_ms > state.last_write_ms:
                raise ValueError(
                    f"layer starts at {state.start_ms} after its last write {state.last_write_ms}"
                )
            if state.inserted_count < 0:
                raise ValueError(f"inserted_count must be >= 0, got {state.inserted_count}")
            if len(state.bits) != (shape.bit_count + 7) // 8:
                raise ValueError(
                    f"{len(state.bits)} bytes cannot hold the {shape.bit_count} bits of {shape!r}"
                )
            layer = bitarray(endian="big")
            layer.frombytes(state.bits)
            if layer.count(1, shape.bit_count):
                raise ValueError("bits beyond bit_count are set")
            del layer[shape.bit_count :]
            bits += layer
            meta.extend(
                (
                    state.start_ms,
                    state.last_write_ms,
                    state.inserted_count,
                    shape.expected_items,
                    shape.bit_count,
                    shape.hash_count,
                )
            )
            if not shape.is_universal:
                restored = True
            elif shape.hash_count > max_hashes:
                max_hashes = shape.hash_count
        self._bits = bits
        self._meta = meta
        self._first = 0
        self._max_hashes = max_hashes
        self._restored = restored
        self.uid = next(_uids)
        self.next_check_ms = _AT_ONCE

    def reconfigure(self, plan: LayerPlan) -> None:
        """Apply a new plan at run time (window, sizes, false-positive rate of new layers).
        Existing layers keep their bits, shapes and times; the new window governs when they
        expire, stay fresh and when the next layer starts."""
        if plan is self.plan:
            return
        self.plan = plan
        if plan.hash_count > self._max_hashes:
            self._max_hashes = plan.hash_count
        self.uid = next(_uids)  # freshness changed: the manager's cached locations are void
        self.next_check_ms = _AT_ONCE
