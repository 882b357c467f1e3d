"""Primitive Kafka wire readers/writers shared by the hand-written codecs.

Owns int/varint/string/tagged-field helpers over ``memoryview`` + offset. Readers return
``(value, new_offset)`` and raise ``MalformedMessageError`` when the bytes run out; callers still
wrap their walks to turn any stray ``struct.error``/``IndexError`` into ``MalformedMessageError``.
Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package.
"""

from __future__ import annotations

import struct

from pidgate.protocol.errors import MalformedMessageError

I8 = struct.Struct(">b")
I16 = struct.Struct(">h")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
U32 = struct.Struct(">I")


def need(buf: memoryview, pos: int, n: int, what: str) -> None:
    """Raise MalformedMessageError unless ``n`` bytes are available at ``pos``."""
    if n < 0 or pos + n > len(buf):
        raise MalformedMessageError(
            f"truncated {what}: need {n} bytes at offset {pos}, have {len(buf) - pos}"
        )


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    """Unsigned varint (protobuf style, at most 5 bytes for the int32 range Kafka uses)."""
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise MalformedMessageError(f"truncated unsigned varint at offset {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedMessageError(f"unsigned varint longer than 5 bytes ending at {pos}")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_nullable_string(buf: memoryview, pos: int, what: str) -> tuple[str | None, int]:
    """Classic int16-length string; -1 means null."""
    need(buf, pos, 2, what)
    n = I16.unpack_from(buf, pos)[0]
    pos += 2
    if n < 0:
        if n != -1:
            raise MalformedMessageError(f"invalid length {n} for {what} at offset {pos - 2}")
        return None, pos
    need(buf, pos, n, what)
    return _utf8(buf[pos : pos + n], what), pos + n


def read_compact_nullable_string(buf: memoryview, pos: int, what: str) -> tuple[str | None, int]:
    """Compact string: uvarint length + 1, 0 = null (flexible versions, KIP-482)."""
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    n -= 1
    need(buf, pos, n, what)
    return _utf8(buf[pos : pos + n], what), pos + n


def _utf8(raw: memoryview, what: str) -> str:
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedMessageError(f"{what} is not valid UTF-8: {exc}") from None


def read_array_len(buf: memoryview, pos: int, compact: bool, what: str) -> tuple[int, int]:
    """Array element count (null arrays count as 0); rejects counts the bytes cannot hold."""
    if compact:
        n, pos = read_uvarint(buf, pos)
        n -= 1  # -1 = null
    else:
        need(buf, pos, 4, what)
        n = I32.unpack_from(buf, pos)[0]
        pos += 4
    if n < -1:
        raise MalformedMessageError(f"invalid array length {n} for {what} at offset {pos}")
    if n > len(buf) - pos:
        # Every element takes at least one byte: a larger count is garbage, and trusting it
        # would let a few bytes make us loop (or allocate) a billion times.
        raise MalformedMessageError(
            f"array length {n} for {what} exceeds the {len(buf) - pos} bytes left"
        )
    return max(n, 0), pos


def skip_tagged_fields(buf: memoryview, pos: int) -> int:
    """Skip a tagged-field section (KIP-482): uvarint count, then (tag, size, bytes) each."""
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size, "tagged field")
        pos += size
    return pos


def read_tagged_fields(buf: memoryview, pos: int) -> tuple[list[tuple[int, memoryview]], int]:
    """Read a tagged-field section into [(tag, raw bytes)], in wire order."""
    count, pos = read_uvarint(buf, pos)
    fields: list[tuple[int, memoryview]] = []
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        need(buf, pos, size, "tagged field")
        fields.append((tag, buf[pos : pos + size]))
        pos += size
    return fields, pos


def encode_tagged_fields(fields: list[tuple[int, bytes]]) -> bytes:
    out = [write_uvarint(len(fields))]
    for tag, raw in fields:
        out.append(write_uvarint(tag))
        out.append(write_uvarint(len(raw)))
        out.append(raw)
    return b"".join(out)


def encode_compact_nullable_string(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return write_uvarint(len(raw) + 1) + raw


def encode_nullable_string(value: str | None) -> bytes:
    if value is None:
        return I16.pack(-1)
    raw = value.encode("utf-8")
    return I16.pack(len(raw)) + raw


def as_memoryview(data: bytes | bytearray | memoryview) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv
