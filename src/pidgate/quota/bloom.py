"""One Bloom filter layer: its shape, the bit positions of a producer ID, and the bits.

Owns the Bloom arithmetic that KIP-936's PID cache is built from: the shape formulas
(m bits, k hashes) for an expected item count and false-positive rate, the mapping from a
producer ID to its k bit positions (Murmur3-128 + enhanced double hashing), and a single
bitarray-backed filter.

Layers of one principal may have different sizes (:mod:`pidgate.quota.layered` sizes each to
what the principal needs), so a PID has different positions in each. To hash a PID once and
still test every layer, new layers take their bit count from a ladder of sizes that all divide
``UNIVERSAL_MODULUS`` = 105·2**32 (:meth:`BloomShape.for_layer`): then
:func:`universal_positions` (the same double hashing mod 105·2**32) reduced mod the layer's size
*is* :func:`bloom_positions` for that shape, exactly (see :func:`universal_positions`).

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Pure and deterministic: the positions of a PID are part of the persisted
format (state files, the Spark backtest rebuilding filters), so they must never change.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import mmh3
from bitarray import bitarray

from .compiled import bloomspeed

__all__ = [
    "MAX_BIT_COUNT",
    "UNIVERSAL_MODULUS",
    "BloomFilter",
    "BloomShape",
    "bits_per_item",
    "bits_per_item_at",
    "bloom_positions",
    "false_positive_rate_of",
    "hash_count_for",
    "pure_universal_positions",
    "rate_at_capacity",
    "rate_of_shape",
    "universal_positions",
]

_LN2_SQUARED = math.log(2) ** 2
#: The largest layer (the state format refuses larger ones): 2**32 bits = 512 MiB.
MAX_BIT_COUNT = 2**32
#: :func:`universal_positions` works mod 105·2**32 = 3·5·7·2**32, so it serves every bit count
#: that divides it: c·2**j for c in 1, 3, 5, 7, 15, 21, 35, 105. :meth:`BloomShape.for_layer`
#: uses the sizes 1, 2, 3 and 4·2**j, 5·2**j, 6·2**j, 7·2**j (steps of at most 25%).
UNIVERSAL_MODULUS = 105 * 2**32


def bits_per_item(false_positive_rate: float) -> float:
    """Bits per item of an optimally sized filter: −ln p / (ln 2)² (≈ 14.38 at p = 0.001)."""
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
    return -math.log(false_positive_rate) / _LN2_SQUARED


def bits_per_item_at(false_positive_rate: float, hash_count: int) -> float:
    """Bits per item of a filter with a *given* k that reaches ``false_positive_rate`` when
    full: m/n = −k / ln(1 − p^(1/k)) (the fill at which k set bits in a row occur with
    probability p is f = p^(1/k), and n items set f = 1 − e^(−kn/m)). Equals
    :func:`bits_per_item` at the optimal k; layers of one principal share k (one hash of a PID
    serves them all) but not their target rate (:mod:`pidgate.quota.layered`), hence this."""
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
    if hash_count < 1:
        raise ValueError(f"hash_count must be >= 1, got {hash_count}")
    fill = false_positive_rate ** (1.0 / hash_count)
    return -hash_count / math.log1p(-fill)


def rate_of_shape(bit_count: int, hash_count: int, items: int) -> float:
    """The false-positive rate of ``bit_count`` bits holding ``items`` with k = ``hash_count``:
    (1 − e^(−kn/m))^k, the chance that k bits are set (the inverse of :func:`bits_per_item_at`),
    plus n/m², the *duplicate-index floor*: the positions of a PID in an m-bit layer depend on
    (h1 mod m, h2 mod m) only (:func:`bloom_positions`), m² patterns in all, so a PID whose pair
    is one of the n pairs held hits for sure. Negligible in big layers; at 384 bits and 18 PIDs
    it is 1.2e-4, three times the fill term at the rates layers are built for."""
    k = hash_count
    fill_term = float(-math.expm1(-k * items / bit_count)) ** k
    return fill_term + items / (bit_count * bit_count)


def rate_at_capacity(shape: BloomShape) -> float:
    """The false-positive rate ``shape`` reaches once it holds ``expected_items``
    (:func:`rate_of_shape`)."""
    return rate_of_shape(shape.bit_count, shape.hash_count, shape.expected_items)


def _ladder_at_least(needed: int) -> int:
    """The least of 1, 2, 3, 4·2**j, 5·2**j, 6·2**j, 7·2**j that is >= ``needed``."""
    if needed <= 4:
        return max(1, needed)
    step = 1 << ((needed - 1).bit_length() - 3)  # 4·step <= needed - 1 < 8·step
    return -(-needed // step) * step  # 5·step, 6·step, 7·step or 8·step


def _capacity(bit_count: int, hash_count: int, rate: float, per_item: float) -> int:
    """The most items ``bit_count`` bits hold with :func:`rate_of_shape` <= ``rate``
    (0 if none): a binary search below m / ``per_item``, where the fill term alone is at
    ``rate``."""
    lo, hi = 0, math.floor(bit_count / per_item)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if rate_of_shape(bit_count, hash_count, mid) <= rate:
            lo = mid
        else:
            hi = mid - 1
    return lo


#: Layers up to this many bits get the exact distribution of distinct positions per lookup
#: (O(m·k) once per shape); larger ones a pairwise correction (O(k²)), off by < 1%.
_EXACT_COLLISIONS_MAX_BITS = 4096


def false_positive_rate_of(set_bits: int, bit_count: int, hash_count: int, items: int = 0) -> float:
    """The chance that a PID the filter never held hits ``hash_count`` set bits, given that
    ``set_bits`` of its ``bit_count`` bits are set (fill f = set_bits / m).

    Not simply f^k: the k positions of :func:`bloom_positions` are x + i·y + (i³ − i)/6 mod m
    (the closed form of the enhanced double hashing), so for some y two of them coincide and
    the lookup tests fewer distinct bits, each set with probability f. With D(y) distinct
    positions the rate is E_y[f^D(y)], y uniform mod m. For a 300-bit layer (16 PIDs) with
    k = 15 about a third of all y collide and f^k understates the rate by ~30%; at 10k bits and
    more the difference is below 1%. Exact over every y up to 4096 bits (cached per shape);
    above, f^k · (1 + Σ_pairs P(pair coincides) · (1/f − 1)), P from the congruence
    (j − i)·y ≡ −c (mod m) (a solution count of gcd(j − i, m) or none). ``items``: how many
    PIDs the filter holds, for the duplicate-index floor n/m² (see :func:`rate_of_shape`).
    """
    if bit_count < 1 or hash_count < 1:
        raise ValueError(f"need bit_count >= 1 and hash_count >= 1, got {bit_count}, {hash_count}")
    if set_bits <= 0:
        return 0.0
    if set_bits >= bit_count:
        return 1.0
    fill = set_bits / bit_count
    if bit_count <= _EXACT_COLLISIONS_MAX_BITS:
        rate = sum(share * fill**d for d, share in _distinct_shares(bit_count, hash_count))
    else:
        pairs = _pair_collision_sum(bit_count, hash_count)
        rate = fill**hash_count * (1.0 + pairs * (1.0 / fill - 1.0))
    # The floor and the fill term overlap a little (a duplicate pair also hits set bits):
    # combined as independent events, which is what the measurements show.
    floor = min(1.0, max(0, items) / (bit_count * bit_count))
    return float(rate + floor - rate * floor)  # 1 − (1 − rate)(1 − floor), without cancelling


@functools.lru_cache(maxsize=256)
def _distinct_shares(bit_count: int, hash_count: int) -> tuple[tuple[int, float], ...]:
    """(D, share of y mod m whose k positions are D distinct bits), for D that occur."""
    offsets = [(i * i * i - i) // 6 for i in range(hash_count)]
    counts: dict[int, int] = {}
    for y in range(bit_count):
        distinct = len({(i * y + c) % bit_count for i, c in enumerate(offsets)})
        counts[distinct] = counts.get(distinct, 0) + 1
    return tuple((d, n / bit_count) for d, n in sorted(counts.items()))


@functools.lru_cache(maxsize=256)
def _pair_collision_sum(bit_count: int, hash_count: int) -> float:
    """Σ over position pairs i < j of P_y(x_i ≡ x_j mod m)."""
    total = 0.0
    for i in range(hash_count):
        for j in range(i + 1, hash_count):
            d = j - i
            c = ((j**3 - j) - (i**3 - i)) // 6
            g = math.gcd(d, bit_count)
            if c % g == 0:
                total += g / bit_count
    return total


def hash_count_for(false_positive_rate: float) -> int:
    """k of an optimally sized filter: (m/n)·ln 2 = −log2 p, rounded, at least 1 (10 at
    p = 0.001). Power-of-two layers use it whatever their size, so one set of universal
    positions serves all of them."""
    return max(1, round(bits_per_item(false_positive_rate) * math.log(2)))


@dataclass(frozen=True, slots=True)
class BloomShape:
    """Size of one filter: ``bit_count`` (m) bits, ``hash_count`` (k) positions per item,
    sized for ``expected_items`` (n) at the false-positive rate it was built for."""

    bit_count: int
    hash_count: int
    expected_items: int

    def __post_init__(self) -> None:
        if self.bit_count < 1 or self.hash_count < 1 or self.expected_items < 1:
            raise ValueError(f"BloomShape fields must all be >= 1, got {self!r}")

    @classmethod
    def for_capacity(cls, expected_items: int, false_positive_rate: float) -> BloomShape:
        """The optimal shape for ``expected_items`` at ``false_positive_rate``:
        m = ceil(-n·ln p / (ln 2)²), k = round(m/n · ln 2), at least 1 (KIP-936's cache sizing)."""
        if expected_items < 1:
            raise ValueError(f"expected_items must be >= 1, got {expected_items}")
        if not 0.0 < false_positive_rate < 1.0:
            raise ValueError(f"false_positive_rate must be in (0, 1), got {false_positive_rate}")
        bits = math.ceil(-expected_items * math.log(false_positive_rate) / _LN2_SQUARED)
        hashes = max(1, round(bits / expected_items * math.log(2)))
        return cls(bit_count=bits, hash_count=hashes, expected_items=expected_items)

    @classmethod
    def for_layer(
        cls,
        items: int,
        false_positive_rate: float,
        max_items: int | None = None,
        hash_count: int | None = None,
    ) -> BloomShape:
        """The smallest shape on the layer ladder that holds ``items`` at
        ``false_positive_rate``: m = the least of 1, 2, 3, 4·2**j, 5·2**j, 6·2**j, 7·2**j that
        is >= n·(−ln p / (ln 2)²); k = :func:`hash_count_for`; as expected items, what m bits
        hold at that rate (>= ``items``: the rounding up is headroom), capped at ``max_items``.
        Every such m divides ``UNIVERSAL_MODULUS``, so these layers share
        :func:`universal_positions`; the rounding costs at most 25% more bits than optimal.
        ``hash_count``: k to use instead of the optimal one (bits per item then from
        :func:`bits_per_item_at`)."""
        if items < 1:
            raise ValueError(f"items must be >= 1, got {items}")
        if hash_count is not None:
            return cls._for_layer_with_k(items, false_positive_rate, max_items, hash_count)
        hash_count = hash_count_for(false_positive_rate)
        per_item = bits_per_item(false_positive_rate)
        bits = _ladder_at_least(math.ceil(items * per_item))
        if bits > MAX_BIT_COUNT:
            raise ValueError(f"{items} items need more than 2**32 bits")
        holds = max(items, math.floor(bits / per_item))
        if max_items is not None:
            holds = max(items, min(holds, max_items))
        return cls(bit_count=bits, hash_count=hash_count, expected_items=holds)

    @classmethod
    def _for_layer_with_k(
        cls, items: int, false_positive_rate: float, max_items: int | None, hash_count: int
    ) -> BloomShape:
        """:meth:`for_layer` with a given k, counting the duplicate-index floor n/m² too
        (:func:`rate_of_shape`): the least ladder m whose capacity at ``false_positive_rate``
        is >= ``items``; small layers need more bits per item than the fill alone asks."""
        per_item = bits_per_item_at(false_positive_rate, hash_count)
        bits = _ladder_at_least(math.ceil(items * per_item))
        while True:
            if bits > MAX_BIT_COUNT:
                raise ValueError(f"{items} items need more than 2**32 bits")
            holds = _capacity(bits, hash_count, false_positive_rate, per_item)
            if holds >= items:
                break
            bits = _ladder_at_least(bits + 1)
        if max_items is not None:
            holds = max(items, min(holds, max_items))
        return cls(bit_count=bits, hash_count=hash_count, expected_items=holds)

    @property
    def is_universal(self) -> bool:
        """Whether :func:`universal_positions` serves this shape: m divides
        ``UNIVERSAL_MODULUS`` (every shape :meth:`for_layer` makes does)."""
        return self.bit_count <= MAX_BIT_COUNT and UNIVERSAL_MODULUS % self.bit_count == 0


def bloom_positions(producer_id: int, shape: BloomShape) -> tuple[int, ...]:
    """The ``shape.hash_count`` bit positions of ``producer_id`` in a filter of ``shape``.

    Key: the PID as 8-byte big-endian *signed* int (its Kafka wire form, so -1 and other
    negatives hash like the broker's bytes). Hash: Murmur3 x64 128-bit, seed 0, split into its
    two unsigned 64-bit halves h1, h2 (the ``utupledigest`` form; with mmh3 5.x positional flags
    would silently pick the x86/signed variants, so we call the explicit function).
    Indexes: enhanced double hashing exactly as Dillinger & Manolios (2004) state it, with all
    arithmetic mod m: x = h1 mod m, y = h2 mod m; emit x; then for i = 1..k-1:
    x = (x + y) mod m, y = (y + i) mod m, emit x. The growing ``y`` avoids the degenerate
    cycles plain double hashing has when y ≡ 0 mod m.

    Hashing dominates the cost: compute positions once per PID. Layers of one shape share
    them; layers of different power-of-two sizes share :func:`universal_positions`.
    """
    m = shape.bit_count
    h1, h2 = mmh3.mmh3_x64_128_utupledigest(producer_id.to_bytes(8, "big", signed=True), 0)
    x = h1 % m
    y = h2 % m
    out = [x]
    for i in range(1, shape.hash_count):
        x = (x + y) % m
        y = (y + i) % m
        out.append(x)
    return tuple(out)


def pure_universal_positions(producer_id: int, hash_count: int) -> tuple[int, ...]:
    """The first ``hash_count`` positions of ``producer_id`` in a filter of
    ``UNIVERSAL_MODULUS`` (105·2**32) bits: the double hashing of :func:`bloom_positions`
    with m = 105·2**32.

    Why: every step of :func:`bloom_positions` is arithmetic mod m, and for any m that divides
    105·2**32, reducing mod 105·2**32 first and mod m afterwards gives the same residues. So
    for any shape with ``shape.is_universal`` and ``shape.hash_count <= hash_count``::

        universal = universal_positions(pid, hash_count)[: shape.hash_count]
        bloom_positions(pid, shape) == tuple(u % shape.bit_count for u in universal)

    (tests pin it). One Murmur3 hash and one k-step loop per PID then serve every layer of a
    principal, whatever their sizes; each layer only reduces. Positions of a prefix do not
    depend on ``hash_count``, so the longest k a principal's layers need serves them all.
    """
    h1, h2 = mmh3.mmh3_x64_128_utupledigest(producer_id.to_bytes(8, "big", signed=True), 0)
    modulus = UNIVERSAL_MODULUS
    x = h1 % modulus
    y = h2 % modulus
    out = [x]
    for i in range(1, hash_count):
        x = (x + y) % modulus
        y = (y + i) % modulus
        out.append(x)
    return tuple(out)


#: :func:`pure_universal_positions`, compiled where ``quota._bloomspeed`` is built (the same
#: tuples: tests/quota/test_compiled.py). Hashing and the k-step loop on Python integers were
#: ~9 µs of a new PID's ~18 µs in the quota (issue #25).
universal_positions: Callable[[int, int], tuple[int, ...]] = (
    bloomspeed.universal_positions if bloomspeed is not None else pure_universal_positions
)


class BloomFilter:
    """A fixed-shape Bloom filter over precomputed positions (see :func:`bloom_positions`)."""

    __slots__ = ("_bits", "inserted_count", "shape")

    def __init__(self, shape: BloomShape) -> None:
        self.shape = shape
        # Explicit endianness: to_bytes() is part of the persisted format.
        self._bits = bitarray(shape.bit_count, endian="big")
        self._bits.setall(0)
        # Counts add() calls, not distinct items: callers only add PIDs the filter does not
        # hold, so it tracks distinct inserts closely and errs towards rolling layers early.
        self.inserted_count = 0

    @property
    def bit_count(self) -> int:
        return self.shape.bit_count

    @property
    def is_saturated(self) -> bool:
        """True once the filter holds the items it was sized for; beyond that the
        false-positive rate climbs above the target, so the layered filter starts a new layer."""
        return self.inserted_count >= self.shape.expected_items

    def add(self, positions: tuple[int, ...]) -> None:
        bits = self._bits
        for i in positions:
            bits[i] = 1
        self.inserted_count += 1

    def contains(self, positions: tuple[int, ...]) -> bool:
        bits = self._bits
        # An explicit loop, not all(<genexpr>): ~2x faster, and a miss (the common case when
        # scanning older layers) usually stops after one or two bits.
        for i in positions:  # noqa: SIM110
            if not bits[i]:
                return False
        return True

    def to_bytes(self) -> bytes:
        """The bits, most significant bit first (bit ``i`` is bit ``7 - i % 8`` of byte
        ``i // 8``), ``ceil(bit_count / 8)`` bytes, unused trailing bits 0. Part of the persisted
        format (see :mod:`pidgate.quota.state`); :meth:`from_bytes` reverses it."""
        return self._bits.tobytes()

    @classmethod
    def from_bytes(cls, shape: BloomShape, data: bytes, inserted_count: int) -> BloomFilter:
        """A filter of ``shape`` holding the bits of :meth:`to_bytes`. Raises ValueError if
        ``data`` has the wrong length or sets a bit beyond ``bit_count``."""
        if len(data) != (shape.bit_count + 7) // 8:
            raise ValueError(
                f"{len(data)} bytes cannot hold the {shape.bit_count} bits of {shape!r}"
            )
        if inserted_count < 0:
            raise ValueError(f"inserted_count must be >= 0, got {inserted_count}")
        bits = bitarray(endian="big")
        bits.frombytes(data)
        if bits.count(1, shape.bit_count):
            raise ValueError("bits beyond bit_count are set")
        del bits[shape.bit_count :]
        bloom = cls.__new__(cls)
        bloom.shape = shape
        bloom._bits = bits
        bloom.inserted_count = inserted_count
        return bloom

    @property
    def set_bit_count(self) -> int:
        return int(self._bits.count(1))

    def estimated_false_positive_rate(self) -> float:
        """The chance that a PID never added hits k set bits: :func:`false_positive_rate_of`
        (≈ (set bits / m)^k, corrected for positions that coincide in small filters)."""
        return false_positive_rate_of(
            self.set_bit_count, self.shape.bit_count, self.shape.hash_count
        )
