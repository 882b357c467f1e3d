"""Writing the quota state: a manager's principals and the run-time overrides as the bytes
:mod:`pidgate.quota.state.format` describes.

Owns ``snapshot_state`` / ``dump_state`` and the encoders a saver may call a step at a time
(``encode_principals``, ``assemble_state``). Must not import: asyncio, socket, time, logging,
structlog, prometheus_client, or any pidgate package outside ``pidgate.quota``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

from bitarray import bitarray

from ..manager import QuotaManager
from ..principal_table import PrincipalRecord
from .format import (
    CRC,
    ENFORCEMENT_MODES,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MODE_TAGS,
    RAW,
    SPARSE16,
    SPARSE32,
    StateSnapshot,
)
from .run_time_overrides import QuotaOverrides

__all__ = [
    "assemble_state",
    "dump_state",
    "encode_principals",
    "encode_state",
    "snapshot_state",
]


def snapshot_state(
    manager: QuotaManager, now_ms: int, overrides: QuotaOverrides | None = None
) -> StateSnapshot:
    """A copy of ``manager``'s state (the fast half of :func:`dump_state`: call it on the event
    loop, then :func:`encode_state` may run in a worker thread)."""
    return StateSnapshot(
        now_ms, QuotaOverrides() if overrides is None else overrides, manager.export()
    )


def dump_state(
    manager: QuotaManager, now_ms: int, overrides: QuotaOverrides | None = None
) -> bytes:
    """The state of ``manager`` and the run-time ``overrides`` at ``now_ms``, as bytes."""
    return encode_state(snapshot_state(manager, now_ms, overrides))


class _Writer:
    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out = bytearray()

    def uv(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"cannot encode {value} as unsigned")
        out = self._out
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)

    def sv(self, value: int) -> None:
        self.uv(value * 2 if value >= 0 else -value * 2 - 1)

    def text(self, value: str) -> None:
        data = value.encode("utf-8", "surrogatepass")
        self.uv(len(data))
        self._out += data

    def raw(self, data: bytes) -> None:
        self._out += data

    def getvalue(self) -> bytes:
        return bytes(self._out)


def _write_bits(w: _Writer, bit_count: int, data: bytes) -> None:
    bits = bitarray(endian="big")
    bits.frombytes(data)
    set_count = bits.count(1)
    width = 2 if bit_count <= 0x10000 else 4
    if set_count * width + 3 >= len(data):
        w.uv(RAW)
        w.raw(data)
        return
    indexes = list(bits.search(1))
    gaps = [b - a for a, b in zip([0, *indexes], indexes, strict=False)]
    w.uv(SPARSE16 if width == 2 else SPARSE32)
    w.uv(len(gaps))
    w.raw(struct.pack(f"<{len(gaps)}{'H' if width == 2 else 'I'}", *gaps))


def encode_state(snapshot: StateSnapshot) -> bytes:
    """``snapshot`` in the format described in the module docstring."""
    return assemble_state(
        snapshot.dumped_at_ms,
        snapshot.overrides,
        len(snapshot.principals),
        encode_principals(snapshot.principals),
    )


def encode_principals(records: Iterable[PrincipalRecord]) -> bytes:
    """``records`` as they follow their count in a state body. A saver may encode its
    principals a step at a time and join the parts (``assemble_state``): the steps' records are
    then garbage at once instead of all held until the end."""
    w = _Writer()
    for record in records:
        bucket = record.bucket
        w.text(record.principal)
        w.uv(bucket.rate)
        w.uv(bucket.window_ms)
        w.uv(max(0, bucket.level))  # a fleet debt (bucket.debit) is kept as empty
        w.sv(bucket.updated_ms)
        w.uv(len(record.layers))
        for layer in record.layers:
            shape = layer.shape
            w.uv(shape.bit_count)
            w.uv(shape.hash_count)
            w.uv(shape.expected_items)
            w.sv(layer.start_ms)
            w.uv(layer.last_write_ms - layer.start_ms)
            w.uv(layer.inserted_count)
            _write_bits(w, shape.bit_count, layer.bits)
        enforcement = record.enforcement
        if enforcement is None:
            w.uv(0)
        else:
            w.uv(ENFORCEMENT_MODES.index(enforcement.mode))
            w.sv(enforcement.began_ms)
            w.uv(enforcement.grace_ms)
            w.sv(-1 if enforcement.frontier is None else enforcement.frontier)
            w.text(enforcement.reason)
    return w.getvalue()


def assemble_state(
    dumped_at_ms: int, overrides: QuotaOverrides, principal_count: int, principals: bytes
) -> bytes:
    """A whole state from its parts: ``principals`` is ``principal_count`` records as
    ``encode_principals`` wrote them (one call's output, or several joined)."""
    w = _Writer()
    w.sv(dumped_at_ms)
    w.uv(len(overrides))
    for user in sorted(overrides):
        rate = overrides[user]
        w.text(user)
        if rate is None:
            w.uv(0)
        else:
            w.uv(1)
            w.uv(rate)
    w.uv(len(overrides.modes))
    for user in sorted(overrides.modes):
        w.text(user)
        w.uv(MODE_TAGS.index(overrides.modes[user]))
    w.uv(principal_count)
    w.raw(principals)
    body = w.getvalue()
    compressed = zlib.compress(body, 6)
    head = HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), len(compressed)) + compressed
    return head + CRC.pack(zlib.crc32(head))
