"""How a principal's Bloom layers are sized and how much of the false-positive rate each gets.

Owns :class:`LayerPlan`: the window, the sizing bounds of new layers and the false-positive
share of a layer started on schedule or by an early roll (the rule below). The layers themselves
(rotation, refresh, expiry) are :mod:`pidgate.quota.layered`'s; W, N, S, H and "fresh" are
defined in its docstring.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, any other
pidgate package, or :mod:`pidgate.quota.layered` (which builds on this module).

False positives (issue #21)
---------------------------

A PID never seen is tested against *every* live layer, so the rate it passes at is the union
1 − Π(1 − r_i) over the live layers, not one layer's rate. To keep that union at or below the
configured p (``producer.id.quota.cache.false.positive.rate``, KIP-936), each layer gets a share
of p (:class:`LayerPlan`):

* Group layers into *chains*: a layer started on schedule (the newest was no longer current)
  heads a chain; a layer started because the newest filled up while still current (an early
  roll) joins the newest's chain. Heads start at least S apart, a live layer started in
  (now − W − H, now], so at most C = ⌊(W + H − 1)·N / W⌋ + 2 chains are live (18 at N = 11:
  the heads in that interval plus the chain of the head just before it).
* A chain's head is built for r₀ = p·(1 − q)/C and its d-th early roll for r₀·q^d
  (q = 1/4), so a chain stays under r₀/(1 − q) and all live layers under C·r₀/(1 − q) = p.
  A layer rolls when it holds its capacity, so none exceeds its own target. Depth stops at 4
  (r₀/256): deeper targets would cost bits without end once layers stop growing at
  ``max_layer_items`` (and the n/m² floor below makes small ones grow as 2^d); so a chain
  with more than 4 early rolls adds r₀/256 per extra layer (a principal admitting more than
  1 + 2.5 + 6 + 16 + 40 times its recent layer size within one span).
* Every layer of a plan uses one k, the optimal k for r₀, so one hash of a PID serves them all;
  the lower targets of early rolls come from more bits per item (:func:`bits_per_item_at`).
  Cost at p = 0.001, N = 11: 21.0 bits per PID per layer instead of 14.4 (+46%), k 15 instead
  of 10.
* Small layers also pay for the duplicate-index floor n/m²
  (:func:`pidgate.quota.bloom.rate_of_shape`): the smallest layer is 640 bits instead of 256
  (17 PIDs either way).

Layers restored from a state saved under the old sizing (k = 10, one layer at p) are read and
touched but never written again; until they expire (within W + H) the union can exceed p, and
:meth:`pidgate.quota.layered.LayeredBloomFilter.estimated_false_positive_rate` says by how
much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .bloom import MAX_BIT_COUNT, BloomShape, bits_per_item_at, hash_count_for

__all__ = ["EARLY_ROLL_DIVISOR", "LayerPlan"]

#: An early roll is built for 1/EARLY_ROLL_DIVISOR of the rate of the layer it follows, so a
#: chain of early rolls sums to at most 4/3 of its head's rate (see the module docstring).
EARLY_ROLL_DIVISOR = 4
#: Early rolls deeper than this keep the rate of this depth (r₀/256; see the module docstring).
_MAX_EARLY_DEPTH = 4


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """What a principal's layers follow: the window and how new layers are sized. One plan is
    shared by every principal of a manager (a per-principal copy would cost memory)."""

    window_ms: int
    window_num: int
    false_positive_rate: float = 0.001
    #: Smallest capacity of a new layer, in items.
    min_layer_items: int = 16
    #: Largest capacity of a new layer, in items; a principal that writes more rolls early.
    max_layer_items: int = 1_000_000
    #: k of new layers: the optimal k for ``layer_rate``.
    hash_count: int = field(init=False)
    #: Fresh while (now - start) * fresh_divisor < window_ms: 2 (half a window), 1 if N = 1.
    fresh_divisor: int = field(init=False)
    #: C: the most chains of layers alive at once (see the module docstring).
    max_live_chains: int = field(init=False)
    #: r₀: the rate a layer started on schedule is built for, p·(1 − q)/C, so that the union
    #: over every live layer stays at or below ``false_positive_rate``.
    layer_rate: float = field(init=False)

    def __post_init__(self) -> None:
        if self.window_num < 1:
            raise ValueError(f"window_num must be >= 1, got {self.window_num}")
        if self.window_ms < self.window_num:
            raise ValueError(
                f"window_ms ({self.window_ms}) must be >= window_num ({self.window_num})"
            )
        if self.min_layer_items < 1 or self.max_layer_items < self.min_layer_items:
            raise ValueError(
                f"need 1 <= min_layer_items ({self.min_layer_items}) <= "
                f"max_layer_items ({self.max_layer_items})"
            )
        if not 0.0 < self.false_positive_rate < 1.0:
            raise ValueError(
                f"false_positive_rate must be in (0, 1), got {self.false_positive_rate}"
            )
        fresh_divisor = min(2, self.window_num)
        object.__setattr__(self, "fresh_divisor", fresh_divisor)
        horizon = (self.window_ms - 1) // fresh_divisor
        chains = (self.window_ms + horizon - 1) * self.window_num // self.window_ms + 2
        object.__setattr__(self, "max_live_chains", chains)
        rate = self.false_positive_rate * (1 - 1 / EARLY_ROLL_DIVISOR) / chains
        object.__setattr__(self, "layer_rate", rate)
        object.__setattr__(self, "hash_count", hash_count_for(rate))

    @property
    def fresh_horizon_ms(self) -> int:
        """H: the latest age (ms since its start) at which a layer is still fresh."""
        return (self.window_ms - 1) // self.fresh_divisor

    @property
    def min_layer_rate(self) -> float:
        """The rate of the deepest early roll: r₀·q^4 = r₀/256."""
        return float(self.layer_rate / EARLY_ROLL_DIVISOR**_MAX_EARLY_DEPTH)

    def shape_for(self, items: int, rate: float | None = None) -> BloomShape:
        """The shape of a new layer meant to hold ``items`` (clamped to [min_layer_items,
        max_layer_items], and to 2**32 bits) at false-positive ``rate`` (default
        ``layer_rate``) with this plan's k: :meth:`BloomShape.for_layer`."""
        if rate is None:
            rate = self.layer_rate
        items = min(self.max_layer_items, max(self.min_layer_items, items))
        # 1% below the 2**32-bit limit, so the n/m² floor never pushes the ladder past it.
        per_item = bits_per_item_at(rate, self.hash_count) * 1.01
        items = max(1, min(items, math.floor(MAX_BIT_COUNT / per_item)))
        return BloomShape.for_layer(items, rate, self.max_layer_items, self.hash_count)
