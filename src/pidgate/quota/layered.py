"""The time-layered Bloom filter that remembers one principal's producer IDs for a window.

Owns KIP-936's "seen PIDs" cache: ``window_num`` time layers spanning ``window_ms``, new layers
started by time or by saturation, old layers dropped, active PIDs refreshed into the newest
layer. All layers share one :class:`BloomShape`, so a PID's positions are computed once and
tested against every layer.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter.

Rules (and the guarantee they give):

* The *newest* layer is the only one written. It is *current* while
  ``now_ms - start_ms < window_ms / window_num``; a write at a later time, or a write when the
  newest layer is saturated, starts a new layer whose ``start_ms`` is that write's time.
  Layers are started lazily, so an idle principal costs no new layers.
* Every layer records ``last_write_ms``: the latest time a PID was added to it, or found in it
  while it was current (a *touch*, see :meth:`LayeredBloomFilter.touch`).
* A layer is dropped when ``last_write_ms + window_ms <= now_ms``. We key expiry on the last
  write, not on ``start_ms`` as KIP-936's sketch does, because ``start_ms + window_ms`` would drop
  a PID added late in a layer's span before its window is over. With this rule a PID added or
  refreshed at ``t`` is found at every ``t' < t + window_ms`` (no false negatives inside the
  window), and one that stops producing is forgotten between ``t_last + window_ms`` and
  ``t_last + window_ms + window_ms/window_num``. At most about ``window_num + 1`` layers are alive
  by time, more only while saturation rolls layers early.
* ``last_write_ms`` is non-decreasing from oldest to newest layer (a layer is written only while
  newest), so expiry pops from the front and lookups, newest first, stop at the first dead layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .bloom import BloomFilter, BloomShape

__all__ = ["ABSENT", "IN_CURRENT", "IN_OLDER", "LayerState", "LayeredBloomFilter"]

# Results of LayeredBloomFilter.lookup().
ABSENT = -1
IN_CURRENT = 0  # present in the newest layer, which is still current: a touch refreshes it
IN_OLDER = 1  # present only in an older (or no longer current) layer: refresh must re-add


@dataclass(frozen=True, slots=True)
class LayerState:
    """One layer as plain data, for persistence: its times, ``inserted_count`` and its bits in
    :meth:`BloomFilter.to_bytes` form."""

    start_ms: int
    last_write_ms: int
    inserted_count: int
    bits: bytes


class _Layer:
    __slots__ = ("bloom", "last_write_ms", "start_ms")

    def __init__(self, shape: BloomShape, now_ms: int) -> None:
        self.bloom = BloomFilter(shape)
        self.start_ms = now_ms
        self.last_write_ms = now_ms


class LayeredBloomFilter:
    """Seen-PID cache of one principal; see the module docstring for the exact rules."""

    __slots__ = ("_layers", "shape", "window_ms", "window_num")

    def __init__(self, shape: BloomShape, window_ms: int, window_num: int) -> None:
        if window_num < 1:
            raise ValueError(f"window_num must be >= 1, got {window_num}")
        if window_ms < window_num:
            raise ValueError(f"window_ms ({window_ms}) must be >= window_num ({window_num})")
        self.shape = shape
        self.window_ms = window_ms
        self.window_num = window_num
        self._layers: list[_Layer] = []  # oldest first

    # -- queries ---------------------------------------------------------------------------

    @property
    def layer_count(self) -> int:
        return len(self._layers)

    @property
    def total_bits(self) -> int:
        return len(self._layers) * self.shape.bit_count

    @property
    def is_empty(self) -> bool:
        return not self._layers

    def _is_current(self, layer: _Layer, now_ms: int) -> bool:
        # now - start < window / num, in integers: (now - start) * num < window.
        return (now_ms - layer.start_ms) * self.window_num < self.window_ms

    def lookup(self, positions: tuple[int, ...], now_ms: int) -> int:
        """Where the PID with ``positions`` lives: ABSENT, IN_CURRENT or IN_OLDER.

        Newest layer first (active producers hit it at once); dead layers that expire() has not
        removed yet are ignored, so the answer never depends on when expire() last ran.
        """
        layers = self._layers
        if not layers:
            return ABSENT
        newest = layers[-1]
        if newest.last_write_ms + self.window_ms <= now_ms:
            return ABSENT  # every layer is dead
        if newest.bloom.contains(positions):
            return IN_CURRENT if self._is_current(newest, now_ms) else IN_OLDER
        dead_before = now_ms - self.window_ms
        for idx in range(len(layers) - 2, -1, -1):
            layer = layers[idx]
            if layer.last_write_ms <= dead_before:
                break  # this and every older layer is dead
            if layer.bloom.contains(positions):
                return IN_OLDER
        return ABSENT

    def newest_start_holding(self, positions: tuple[int, ...], now_ms: int) -> int | None:
        """When the newest live layer that holds the PID started (None: no live layer does).
        Off the hot path: the fleet asks it once per refreshed PID, to re-announce a PID at most
        once per half window."""
        dead_before = now_ms - self.window_ms
        for layer in reversed(self._layers):
            if layer.last_write_ms <= dead_before:
                return None
            if layer.bloom.contains(positions):
                return layer.start_ms
        return None

    def contains(self, positions: tuple[int, ...], now_ms: int) -> bool:
        return self.lookup(positions, now_ms) != ABSENT

    def estimated_false_positive_rate(self) -> float:
        """Chance that an unseen PID is reported present by any layer: 1 − Π(1 − fpr_i),
        computed as −expm1(Σ log1p(−fpr_i)) so tiny rates do not cancel to 0.0."""
        log_miss = 0.0
        for layer in self._layers:
            rate = layer.bloom.estimated_false_positive_rate()
            if rate >= 1.0:
                return 1.0  # every bit set (log1p(-1) would raise)
            log_miss += math.log1p(-rate)
        return -math.expm1(log_miss)

    # -- updates ---------------------------------------------------------------------------

    def add(self, positions: tuple[int, ...], now_ms: int) -> None:
        """Record the PID in the newest layer, starting a new one if the newest is no longer
        current or is saturated. Does not check whether the PID is already present."""
        layers = self._layers
        if not layers:
            layer = _Layer(self.shape, now_ms)
            layers.append(layer)
        else:
            layer = layers[-1]
            if layer.bloom.is_saturated or not self._is_current(layer, now_ms):
                previous = layer
                layer = _Layer(self.shape, now_ms)
                # Keep last_write_ms non-decreasing along the list even if a caller's clock
                # steps back, so expire() may pop from the front.
                layer.last_write_ms = max(now_ms, previous.last_write_ms)
                layers.append(layer)
        layer.bloom.add(positions)
        if now_ms > layer.last_write_ms:
            layer.last_write_ms = now_ms

    def touch(self, now_ms: int) -> None:
        """Mark the newest layer written at ``now_ms`` if it is current (no-op otherwise).

        Called when a PID found IN_CURRENT produces: keeping that layer alive until
        ``now_ms + window_ms`` is what keeps the PID known for a full window after it was last
        seen, without rewriting its bits.
        """
        if self._layers:
            layer = self._layers[-1]
            if self._is_current(layer, now_ms) and now_ms > layer.last_write_ms:
                layer.last_write_ms = now_ms

    def refresh(self, positions: tuple[int, ...], now_ms: int) -> bool:
        """Keep a known PID known for another window: touch the newest layer if it holds the PID
        and is current, otherwise add the PID to the newest layer (rolling one if needed).
        Returns True if the PID was re-added."""
        if self._layers:
            layer = self._layers[-1]
            # A current layer is always alive: last_write >= start > now - window/num.
            if self._is_current(layer, now_ms) and layer.bloom.contains(positions):
                if now_ms > layer.last_write_ms:
                    layer.last_write_ms = now_ms
                return False
        self.add(positions, now_ms)
        return True

    def expire(self, now_ms: int) -> int:
        """Drop layers whose last write is a full window old; returns how many were dropped."""
        layers = self._layers
        window_ms = self.window_ms
        dropped = 0
        while dropped < len(layers) and layers[dropped].last_write_ms + window_ms <= now_ms:
            dropped += 1
        if dropped:
            del layers[:dropped]
        return dropped

    def export_layers(self) -> tuple[LayerState, ...]:
        """Every layer, oldest first, dead ones included (a copy: later writes do not show)."""
        return tuple(
            LayerState(
                layer.start_ms,
                layer.last_write_ms,
                layer.bloom.inserted_count,
                layer.bloom.to_bytes(),
            )
            for layer in self._layers
        )

    def restore(self, layers: Iterable[LayerState]) -> None:
        """Replace every layer with ``layers`` (oldest first, as :meth:`export_layers` gives
        them, in this filter's shape). Raises ValueError, changing nothing, if a layer's bits do
        not fit the shape or the times break the invariants (``start_ms <= last_write_ms``,
        ``last_write_ms`` non-decreasing from oldest to newest)."""
        restored: list[_Layer] = []
        previous_write: int | None = None
        for state in layers:
            if state.start_ms > state.last_write_ms:
                raise ValueError(
                    f"layer starts at {state.start_ms} after its last write {state.last_write_ms}"
                )
            if previous_write is not None and state.last_write_ms < previous_write:
                raise ValueError("layers' last_write_ms must not decrease from oldest to newest")
            previous_write = state.last_write_ms
            layer = _Layer.__new__(_Layer)
            layer.bloom = BloomFilter.from_bytes(self.shape, state.bits, state.inserted_count)
            layer.start_ms = state.start_ms
            layer.last_write_ms = state.last_write_ms
            restored.append(layer)
        self._layers = restored

    def reconfigure(self, window_ms: int, window_num: int) -> None:
        """Apply a new window at run time. Existing layers keep their bits and times; the new
        window governs when they expire and when the next layer starts."""
        if window_num < 1:
            raise ValueError(f"window_num must be >= 1, got {window_num}")
        if window_ms < window_num:
            raise ValueError(f"window_ms ({window_ms}) must be >= window_num ({window_num})")
        self.window_ms = window_ms
        self.window_num = window_num
