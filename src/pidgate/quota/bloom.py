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

import math
from dataclasses import dataclass

import mmh3
from bitarray import bitarray

__all__ = [
    "MAX_BIT_COUNT",
    "UNIVERSAL_MODULUS",
    "BloomFilter",
    "BloomShape",
    "bits_per_item",
    "bloom_positions",
    "hash_count_for",
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
        cls, items: int, false_positive_rate: float, max_items: int | None = None
    ) -> BloomShape:
        """The smallest shape on the layer ladder that holds ``items`` at
        ``false_positive_rate``: m = the least of 1, 2, 3, 4·2**j, 5·2**j, 6·2**j, 7·2**j that
        is >= n·(−ln p / (ln 2)²); k = :func:`hash_count_for`; as expected items, what m bits
        hold at that rate (>= ``items``: the rounding up is headroom), capped at ``max_items``.
        Every such m divides ``UNIVERSAL_MODULUS``, so these layers share
        :func:`universal_positions`; the rounding costs at most 25% more bits than optimal."""
        if items < 1:
            raise ValueError(f"items must be >= 1, got {items}")
        per_item = bits_per_item(false_positive_rate)
        needed = math.ceil(items * per_item)
        if needed <= 4:
            bits = needed
        else:
            step = 1 << ((needed - 1).bit_length() - 3)  # 4·step <= needed - 1 < 8·step
            bits = -(-needed // step) * step  # 5·step, 6·step, 7·step or 8·step
        if bits > MAX_BIT_COUNT:
            raise ValueError(f"{items} items need more than 2**32 bits")
        holds = max(items, math.floor(bits / per_item))
        if max_items is not None:
            holds = max(items, min(holds, max_items))
        return cls(
            bit_count=bits,
            hash_count=hash_count_for(false_positive_rate),
            expected_items=holds,
        )

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


def universal_positions(producer_id: int, hash_count: int) -> tuple[int, ...]:
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
        format (see :mod:`pidgate.quota.persistence`); :meth:`from_bytes` reverses it."""
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
        """(set bits / m)^k: the chance that k independent positions all hit set bits."""
        return float((self.set_bit_count / self.shape.bit_count) ** self.shape.hash_count)
