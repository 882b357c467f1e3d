"""Record batches as the proxy sees them: the header of every batch in a records blob.

Owns the RecordBatch v2 (KIP-98) and legacy message-set (magic 0/1) header layouts,
:class:`BatchHeader`, ``iter_batch_headers`` and ``batch_headers`` (the plain loop the Produce
walk calls), and the errors a bad batch gives. Headers are read with ``struct.unpack_from`` over
a ``memoryview``: records are never copied or decompressed. Must not import: asyncio, socket,
time, logging, structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pidgate.protocol._wire import I32, I64, as_memoryview
from pidgate.protocol.errors import MalformedMessageError

__all__ = [
    "BATCH_V2_HEADER_BYTES",
    "BATCH_V2_PRODUCER_ID_OFFSET",
    "LOG_OVERHEAD_BYTES",
    "MAGIC_OFFSET",
    "MIN_BATCH_V2_LENGTH",
    "BatchHeader",
    "batch_headers",
    "batch_too_short",
    "batch_truncated",
    "iter_batch_headers",
]

# RecordBatch v2 header (KIP-98), offsets from the batch start: base_offset 0, batch_length 8,
# partition_leader_epoch 12, magic 16, crc 17, attributes 21, last_offset_delta 23,
# base_timestamp 27, max_timestamp 35, producer_id 43, producer_epoch 51, base_sequence 53,
# records_count 57, records 61.
_BATCH_V2 = struct.Struct(">qiibIhiqqqhii")
BATCH_V2_HEADER_BYTES = _BATCH_V2.size  # 61
# Legacy message set entry (magic 0/1): offset int64, message_size int32, crc uint32, magic int8,
# attributes int8, then (magic 1 only) timestamp int64.
_LEGACY = struct.Struct(">qiIbb")
LOG_OVERHEAD_BYTES = 12  # base_offset + batch_length: every batch occupies 12 + batch_length
MAGIC_OFFSET = 16
BATCH_V2_PRODUCER_ID_OFFSET = 43
# Smallest legal batch_length per magic: a v2 header without records (61 - 12); a legacy message
# with null key and value: crc 4 + magic 1 + attributes 1 (+ timestamp 8) + key 4 + value 4.
MIN_BATCH_V2_LENGTH = BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES
_MIN_BATCH_LENGTH = {0: 14, 1: 22, 2: MIN_BATCH_V2_LENGTH}

_TRANSACTIONAL_FLAG = 0x10
_CONTROL_FLAG = 0x20


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """Header fields of one record batch. For magic 0/1 message sets the v2-only fields are
    -1 (producer_id, producer_epoch, base_sequence, records_count: unknown without
    decompressing) or 0 (last_offset_delta); timestamps are the message's (v1) or -1 (v0)."""

    base_offset: int
    batch_length: int
    magic: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & _TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & _CONTROL_FLAG)

    @property
    def compression_type(self) -> int:
        return self.attributes & 0x07


def batch_too_short(pos: int, batch_length: int, magic: int) -> MalformedMessageError:
    """The error for a batch at ``pos`` whose batch_length is below its magic's minimum."""
    return MalformedMessageError(
        f"record batch at offset {pos} has batch_length {batch_length}, "
        f"below the minimum {_MIN_BATCH_LENGTH[magic]} for magic {magic}"
    )


def batch_truncated(pos: int, total: int, remaining: int) -> MalformedMessageError:
    """The error for a batch at ``pos`` needing ``total`` bytes where ``remaining`` are left."""
    return MalformedMessageError(
        f"truncated record batch at offset {pos}: batch needs {total} bytes, {remaining} left"
    )


def iter_batch_headers(
    records: bytes | bytearray | memoryview, *, allow_partial_tail: bool = False
) -> Iterator[BatchHeader]:
    """Yield the header of every batch in a records blob (batches back to back).

    A trailing partial batch (brokers may cut one off in fetch responses) ends the walk silently
    when ``allow_partial_tail`` is set, otherwise raises MalformedMessageError.
    """
    buf = as_memoryview(records)
    try:
        batches = batch_headers(buf, 0, len(buf), allow_partial_tail)
    except (struct.error, IndexError) as exc:
        raise MalformedMessageError(f"malformed record batches: {exc}") from None
    return iter(batches)


def batch_headers(
    buf: memoryview, pos: int, end: int, allow_partial_tail: bool
) -> tuple[BatchHeader, ...]:
    """Batch headers of buf[pos:end]; a plain loop (no generator) since this is the hot path."""
    out: list[BatchHeader] = []
    unpack_v2 = _BATCH_V2.unpack_from
    while pos < end:
        remaining = end - pos
        if remaining < MAGIC_OFFSET + 1:
            if allow_partial_tail:
                break
            raise MalformedMessageError(
                f"truncated record batch header at offset {pos}: {remaining} bytes left"
            )
        magic = buf[pos + MAGIC_OFFSET]
        if magic == 2 and remaining >= BATCH_V2_HEADER_BYTES:
            fields = unpack_v2(buf, pos)
            batch_length = fields[1]
            if batch_length < MIN_BATCH_V2_LENGTH:
                raise batch_too_short(pos, batch_length, 2)
            total = LOG_OVERHEAD_BYTES + batch_length
            if total > remaining:
                if allow_partial_tail:
                    break
                raise batch_truncated(pos, total, remaining)
            # fields: base_offset, batch_length, leader_epoch, magic, crc, attributes,
            # last_offset_delta, base_timestamp, max_timestamp, pid, epoch, sequence, count
            out.append(_batch_v2(fields))
            pos += total
            continue
        batch_length = I32.unpack_from(buf, pos + 8)[0]
        min_length = _MIN_BATCH_LENGTH.get(magic)
        if min_length is None:
            raise MalformedMessageError(f"unknown record batch magic {magic} at offset {pos}")
        if batch_length < min_length:
            raise batch_too_short(pos, batch_length, magic)
        total = LOG_OVERHEAD_BYTES + batch_length
        if total > remaining:
            if allow_partial_tail:
                break
            raise batch_truncated(pos, total, remaining)
        base_offset, _, _crc, _, attributes = _LEGACY.unpack_from(buf, pos)
        timestamp = I64.unpack_from(buf, pos + _LEGACY.size)[0] if magic == 1 else -1
        out.append(
            BatchHeader(
                base_offset,
                batch_length,
                magic,
                attributes,
                0,
                timestamp,
                timestamp,
                -1,
                -1,
                -1,
                -1,
            )
        )
        pos += total
    return tuple(out)


# A frozen dataclass's __init__ sets every field through object.__setattr__ (one generic call
# per field); writing the slots through their member descriptors builds an identical, equally
# frozen instance at about half the cost. Used only by the walk above; equality, hashing, repr
# and immutability are the dataclass's own.
_new_batch = BatchHeader.__new__
(
    _b_base_offset,
    _b_batch_length,
    _b_magic,
    _b_attributes,
    _b_last_offset_delta,
    _b_base_timestamp,
    _b_max_timestamp,
    _b_producer_id,
    _b_producer_epoch,
    _b_base_sequence,
    _b_records_count,
) = (
    BatchHeader.__dict__[name].__set__
    for name in (
        "base_offset",
        "batch_length",
        "magic",
        "attributes",
        "last_offset_delta",
        "base_timestamp",
        "max_timestamp",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "records_count",
    )
)


def _batch_v2(fields: tuple[int, ...]) -> BatchHeader:
    """BatchHeader of an unpacked ``_BATCH_V2`` tuple (same instance the dataclass would make)."""
    b = _new_batch(BatchHeader)
    _b_base_offset(b, fields[0])
    _b_batch_length(b, fields[1])
    _b_magic(b, 2)
    _b_attributes(b, fields[5])
    _b_last_offset_delta(b, fields[6])
    _b_base_timestamp(b, fields[7])
    _b_max_timestamp(b, fields[8])
    _b_producer_id(b, fields[9])
    _b_producer_epoch(b, fields[10])
    _b_base_sequence(b, fields[11])
    _b_records_count(b, fields[12])
    return b
