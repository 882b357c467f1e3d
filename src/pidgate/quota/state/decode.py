"""Reading the quota state: bytes in the format :mod:`pidgate.quota.state.format` describes back
to the :class:`StateSnapshot` that was saved, every check on the way.

Owns ``decode_state``. Must not import: asyncio, socket, time, logging, structlog,
prometheus_client, or any pidgate package outside ``pidgate.quota``.
"""

from __future__ import annotations

import struct
import zlib
from itertools import accumulate

from bitarray import bitarray

from ..bloom import BloomShape
from ..bucket import TokenBucket
from ..grandfather import FRONTIER, LEARNING, PENDING, Enforcement
from ..layered import LayerState
from ..principal_table import PrincipalRecord
from .format import (
    CRC,
    ENFORCEMENT_MODES,
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    MAX_BIT_COUNT,
    MODE_TAGS,
    RAW,
    SHARED_SHAPE_VERSIONS,
    SPARSE16,
    SPARSE32,
    StateFormatError,
    StateSnapshot,
    UnsupportedStateVersion,
)
from .run_time_overrides import QuotaOverrides

__all__ = ["decode_state"]


class _Reader:
    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def uv(self) -> int:
        data, pos = self._data, self._pos
        value = shift = 0
        while True:
            if pos >= len(data):
                raise StateFormatError("body ends inside a number")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 70:
                raise StateFormatError("number longer than 10 bytes")
        self._pos = pos
        return value

    def sv(self) -> int:
        value = self.uv()
        return value >> 1 if not value & 1 else -((value + 1) >> 1)

    def raw(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._data):
            raise StateFormatError(f"body ends inside a {n}-byte field")
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def text(self) -> str:
        try:
            return self.raw(self.uv()).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise StateFormatError(f"a name is not valid UTF-8: {exc}") from None

    @property
    def at_end(self) -> bool:
        return self._pos == len(self._data)


def _read_bits(r: _Reader, bit_count: int) -> bytes:
    encoding = r.uv()
    if encoding == RAW:
        return r.raw((bit_count + 7) // 8)
    if encoding not in (SPARSE16, SPARSE32):
        raise StateFormatError(f"unknown layer encoding {encoding}")
    count = r.uv()
    width, code = (2, "H") if encoding == SPARSE16 else (4, "I")
    gaps = struct.unpack(f"<{count}{code}", r.raw(count * width))
    if any(gap == 0 for gap in gaps[1:]):
        raise StateFormatError("sparse layer repeats a bit index")
    indexes = list(accumulate(gaps))
    if indexes and indexes[-1] >= bit_count:
        raise StateFormatError(f"sparse layer sets bit {indexes[-1]} of {bit_count}")
    bits = bitarray(bit_count, endian="big")
    bits.setall(0)
    bits[indexes] = 1
    return bits.tobytes()


def _unwrap(data: bytes) -> tuple[int, bytes]:
    """The format version and body of a state, after checking magic, version, lengths and
    CRC."""
    if data[: len(MAGIC)] != MAGIC:
        if data and MAGIC.startswith(data):
            raise StateFormatError(f"truncated: {len(data)} bytes is shorter than the header")
        raise StateFormatError("not a pidgate state (bad magic)")
    if len(data) < HEADER.size + CRC.size:
        raise StateFormatError(f"truncated: {len(data)} bytes is shorter than the header")
    _, version, flags, raw_len, zlen = HEADER.unpack_from(data)
    if version > FORMAT_VERSION:
        raise UnsupportedStateVersion(version)
    if version < 1 or flags != 0:
        raise StateFormatError(f"corrupt header: version {version}, flags {flags:#x}")
    expected = HEADER.size + zlen + CRC.size
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes"
        raise StateFormatError(f"{what}: {len(data)} bytes, the header says {expected}")
    (crc,) = CRC.unpack_from(data, expected - CRC.size)
    if zlib.crc32(data[: expected - CRC.size]) != crc:
        raise StateFormatError("checksum mismatch: the state is corrupt")
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data[HEADER.size : expected - CRC.size], raw_len)
    except zlib.error as exc:
        raise StateFormatError(f"body does not decompress: {exc}") from None
    if len(body) != raw_len or inflater.unconsumed_tail or not inflater.eof:
        raise StateFormatError(f"body decompresses to other than the {raw_len} bytes declared")
    return version, body


def _read_enforcement(r: _Reader, name: str) -> Enforcement | None:
    tag = r.uv()
    if tag >= len(ENFORCEMENT_MODES):
        raise StateFormatError(f"principal {name!r} has unknown enforcement mode {tag}")
    mode = ENFORCEMENT_MODES[tag]
    if mode is None:
        return None
    began_ms, grace_ms, frontier, reason = r.sv(), r.uv(), r.sv(), r.text()
    if mode == PENDING:
        mode, frontier, reason = LEARNING, -1, "restarted before the frontier probe answered"
    if mode == FRONTIER and frontier < 0:
        raise StateFormatError(f"principal {name!r} has frontier mode without a frontier")
    return Enforcement(began_ms, grace_ms, mode, None if frontier < 0 else frontier, reason)


def _read_shape(r: _Reader, name: str) -> BloomShape:
    shape = BloomShape(bit_count=r.uv(), hash_count=r.uv(), expected_items=r.uv())
    if shape.bit_count > MAX_BIT_COUNT:
        raise StateFormatError(f"principal {name!r} has a layer of {shape.bit_count} bits")
    return shape


def decode_state(data: bytes) -> StateSnapshot:
    """The state in ``data``, exactly as saved. Raises :class:`StateFormatError` (or its
    subclass :class:`UnsupportedStateVersion`) if ``data`` is not a complete, intact state."""
    version, body = _unwrap(data)
    r = _Reader(body)
    try:
        dumped_at_ms = r.sv()
        overrides: dict[str, int | None] = {}
        for _ in range(r.uv()):
            user = r.text()
            tag = r.uv()
            if tag not in (0, 1):
                raise StateFormatError(f"override of {user!r} has unknown tag {tag}")
            overrides[user] = r.uv() if tag else None
        modes: dict[str, bool | None] = {}
        for _ in range(r.uv() if version >= 4 else 0):
            user = r.text()
            tag = r.uv()
            if tag >= len(MODE_TAGS):
                raise StateFormatError(f"mode override of {user!r} has unknown tag {tag}")
            modes[user] = MODE_TAGS[tag]
        principals: list[PrincipalRecord] = []
        for _ in range(r.uv()):
            name = r.text()
            bucket = TokenBucket(rate=r.uv(), window_ms=r.uv(), level=r.uv(), updated_ms=r.sv())
            shared = _read_shape(r, name) if version in SHARED_SHAPE_VERSIONS else None
            layers: list[LayerState] = []
            for _ in range(r.uv()):
                shape = shared if shared is not None else _read_shape(r, name)
                start_ms = r.sv()
                last_write_ms = start_ms + r.uv()
                inserted = r.uv()
                bits = _read_bits(r, shape.bit_count)
                layers.append(LayerState(shape, start_ms, last_write_ms, inserted, bits))
            enforcement = _read_enforcement(r, name) if version >= 2 else None
            principals.append(PrincipalRecord(name, bucket, tuple(layers), enforcement))
        if not r.at_end:
            raise StateFormatError("trailing bytes after the last principal")
        return StateSnapshot(dumped_at_ms, QuotaOverrides(overrides, modes), tuple(principals))
    except StateFormatError:
        raise
    except (ValueError, struct.error) as exc:
        raise StateFormatError(f"inconsistent state: {exc}") from None
