"""One Bloom filter layer: its shape, the bit positions of a producer ID, and the bits.

Owns the Bloom arithmetic that KIP-936's PID cache is built from: the shape formula
(m bits, k hashes) for an expected item count and false-positive rate, the mapping from a
producer ID to its k bit positions (Murmur3-128 + enhanced double hashing), and a single
bitarray-backed filter.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Pure and deterministic: the positions of a PID are part of the persisted
format (state files, the Spark backtest rebuilding filters), so they must never change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mmh3
from bitarray import bitarray

__all__ = ["BloomFilter", "BloomShape", "bloom_positions"]

_LN2_SQUARED = math.log(2) ** 2


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

    Compute this once per PID and test every layer with it: hashing dominates the cost.
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
