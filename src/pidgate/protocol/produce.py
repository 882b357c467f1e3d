"""The Produce hot path: a hand-written walk of ProduceRequest bodies and locally built rejections.

Owns ``parse_produce_request`` (topics, partitions and the *header* of every record batch, read
with ``struct.unpack_from`` over a ``memoryview``: records are never copied or decompressed),
``iter_batch_headers`` and ``encode_produce_rejection``. kafka-python is deliberately not used
here (its full decode costs 12-100 µs per request; this walk about 2 µs); it is the reference in
the parity tests. Must not import: asyncio, socket, time, logging, structlog, prometheus_client,
or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pidgate.protocol._wire import (
    I16,
    I32,
    I64,
    as_memoryview,
    encode_compact_nullable_string,
    encode_nullable_string,
    read_array_len,
    read_compact_nullable_string,
    read_nullable_string,
    read_uvarint,
    skip_tagged_fields,
    write_uvarint,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.framing import frame
from pidgate.protocol.headers import encode_response_header

PRODUCE_KEY = 0
SUPPORTED_PRODUCE_VERSIONS = range(3, 14)
"""v3 is the first with transactional_id and RecordBatch v2 (KIP-98); v13 (topic ids, KIP-516)
is the newest in Kafka's schemas. Kafka 4.0 removed v0-v2 (KIP-896)."""
FIRST_FLEXIBLE_PRODUCE_VERSION = 9  # KIP-482 compact encoding + tagged fields
FIRST_TOPIC_ID_PRODUCE_VERSION = 13  # KIP-516: topic_id (uuid) replaces the topic name

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
_MAGIC_OFFSET = 16
# Smallest legal batch_length per magic: a v2 header without records (61 - 12); a legacy message
# with null key and value: crc 4 + magic 1 + attributes 1 (+ timestamp 8) + key 4 + value 4.
_MIN_BATCH_LENGTH = {0: 14, 1: 22, 2: BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES}

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


def iter_batch_headers(
    records: bytes | bytearray | memoryview, *, allow_partial_tail: bool = False
) -> Iterator[BatchHeader]:
    """Yield the header of every batch in a records blob (batches back to back).

    A trailing partial batch (brokers may cut one off in fetch responses) ends the walk silently
    when ``allow_partial_tail`` is set, otherwise raises MalformedMessageError.
    """
    buf = as_memoryview(records)
    try:
        batches = _batch_headers(buf, 0, len(buf), allow_partial_tail)
    except (struct.error, IndexError) as exc:
        raise MalformedMessageError(f"malformed record batches: {exc}") from None
    return iter(batches)


def _batch_headers(
    buf: memoryview, pos: int, end: int, allow_partial_tail: bool
) -> tuple[BatchHeader, ...]:
    """Batch headers of buf[pos:end]; a plain loop (no generator) since this is the hot path."""
    out: list[BatchHeader] = []
    unpack_v2 = _BATCH_V2.unpack_from
    while pos < end:
        remaining = end - pos
        if remaining < _MAGIC_OFFSET + 1:
            if allow_partial_tail:
                break
            raise MalformedMessageError(
                f"truncated record batch header at offset {pos}: {remaining} bytes left"
            )
        magic = buf[pos + _MAGIC_OFFSET]
        if magic == 2 and remaining >= BATCH_V2_HEADER_BYTES:
            fields = unpack_v2(buf, pos)
            batch_length = fields[1]
            if batch_length < BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES:
                raise MalformedMessageError(
                    f"record batch at offset {pos} has batch_length {batch_length}, "
                    f"below the minimum {BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES} for magic 2"
                )
            total = LOG_OVERHEAD_BYTES + batch_length
            if total > remaining:
                if allow_partial_tail:
                    break
                raise MalformedMessageError(
                    f"truncated record batch at offset {pos}: batch needs {total} bytes, "
                    f"{remaining} left"
                )
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
            raise MalformedMessageError(
                f"record batch at offset {pos} has batch_length {batch_length}, "
                f"below the minimum {min_length} for magic {magic}"
            )
        total = LOG_OVERHEAD_BYTES + batch_length
        if total > remaining:
            if allow_partial_tail:
                break
            raise MalformedMessageError(
                f"truncated record batch at offset {pos}: batch needs {total} bytes, "
                f"{remaining} left"
            )
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


@dataclass(frozen=True, slots=True)
class PartitionProduce:
    index: int
    batches: tuple[BatchHeader, ...]


@dataclass(frozen=True, slots=True)
class TopicProduce:
    name: str | None
    """Topic name (v3-v12); None in v13, which addresses topics by id."""
    topic_id: bytes | None
    """16-byte topic id (v13+, KIP-516); None before."""
    partitions: tuple[PartitionProduce, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequestSummary:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[TopicProduce, ...]

    def iter_batches(self) -> Iterator[tuple[TopicProduce, PartitionProduce, BatchHeader]]:
        for topic in self.topics:
            for partition in topic.partitions:
                for batch in partition.batches:
                    yield topic, partition, batch

    def producer_ids(self) -> frozenset[int]:
        """Every producer id in the request's batches, without -1 (no PID)."""
        return frozenset(
            batch.producer_id
            for topic in self.topics
            for partition in topic.partitions
            for batch in partition.batches
            if batch.producer_id != -1
        )

    def first_batch_for(self, producer_id: int) -> BatchHeader | None:
        """The first batch carrying ``producer_id`` (for its epoch, sequence, flags)."""
        for _topic, _partition, batch in self.iter_batches():
            if batch.producer_id == producer_id:
                return batch
        return None

    @property
    def partition_count(self) -> int:
        return sum(len(topic.partitions) for topic in self.topics)


# -- fast constructors for the hot path -------------------------------------------------------
# A frozen dataclass's __init__ sets every field through object.__setattr__ (one generic call
# per field); writing the slots through their member descriptors builds an identical, equally
# frozen instance at about half the cost. Used only by the walk below; equality, hashing, repr
# and immutability are the dataclasses' own.
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
_new_partition = PartitionProduce.__new__
_p_index = PartitionProduce.__dict__["index"].__set__
_p_batches = PartitionProduce.__dict__["batches"].__set__
_new_topic = TopicProduce.__new__
_t_name = TopicProduce.__dict__["name"].__set__
_t_topic_id = TopicProduce.__dict__["topic_id"].__set__
_t_partitions = TopicProduce.__dict__["partitions"].__set__


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


def _partition(index: int, batches: tuple[BatchHeader, ...]) -> PartitionProduce:
    p = _new_partition(PartitionProduce)
    _p_index(p, index)
    _p_batches(p, batches)
    return p


def _topic(
    name: str | None, topic_id: bytes | None, partitions: tuple[PartitionProduce, ...]
) -> TopicProduce:
    t = _new_topic(TopicProduce)
    _t_name(t, name)
    _t_topic_id(t, topic_id)
    _t_partitions(t, partitions)
    return t


def _check_version(api_version: int) -> None:
    if api_version not in SUPPORTED_PRODUCE_VERSIONS:
        raise UnsupportedApiError(
            f"Produce (api key 0) version {api_version} is not supported; pidgate handles "
            f"v{SUPPORTED_PRODUCE_VERSIONS.start}..v{SUPPORTED_PRODUCE_VERSIONS.stop - 1}",
            api_key=PRODUCE_KEY,
            api_version=api_version,
        )


def parse_produce_request(
    body: bytes | bytearray | memoryview, api_version: int
) -> ProduceRequestSummary:
    """Walk a ProduceRequest body (the payload after the request header)."""
    _check_version(api_version)
    buf = as_memoryview(body)
    try:
        return _parse_produce(buf, api_version)
    except (struct.error, IndexError, ValueError) as exc:
        raise MalformedMessageError(
            f"malformed Produce v{api_version} request ({len(buf)} bytes): {exc}"
        ) from None


def _parse_produce(buf: memoryview, api_version: int) -> ProduceRequestSummary:
    # The hot path: one-byte varints (every array and records length below 127 in flexible
    # versions, and empty tagged-field sections) are read inline; longer ones, strings and
    # non-empty tagged fields go through the _wire helpers. Same checks, same errors.
    flexible = api_version >= FIRST_FLEXIBLE_PRODUCE_VERSION
    by_id = api_version >= FIRST_TOPIC_ID_PRODUCE_VERSION
    end = len(buf)
    unpack_i32 = I32.unpack_from
    if flexible:
        if buf[0] == 0:
            transactional_id, pos = None, 1
        else:
            transactional_id, pos = read_compact_nullable_string(buf, 0, "transactional_id")
    else:
        transactional_id, pos = read_nullable_string(buf, 0, "transactional_id")
    if pos + 6 > end:
        raise MalformedMessageError(f"truncated Produce v{api_version} request: acks/timeout_ms")
    acks = I16.unpack_from(buf, pos)[0]
    timeout_ms = unpack_i32(buf, pos + 2)[0]
    pos += 6
    topic_count, pos = _array_len(buf, pos, flexible, "topic_data")
    topics: list[TopicProduce] = []
    for _ in range(topic_count):
        name: str | None = None
        topic_id: bytes | None = None
        if by_id:
            if pos + 16 > end:
                raise MalformedMessageError("truncated Produce request: topic_id")
            topic_id = bytes(buf[pos : pos + 16])
            pos += 16
        elif flexible:
            name, pos = read_compact_nullable_string(buf, pos, "topic name")
        else:
            name, pos = read_nullable_string(buf, pos, "topic name")
        partition_count, pos = _array_len(buf, pos, flexible, "partition_data")
        partitions: list[PartitionProduce] = []
        for _ in range(partition_count):
            if pos + 4 > end:
                raise MalformedMessageError("truncated Produce request: partition index")
            index = unpack_i32(buf, pos)[0]
            size, pos = _records_length(buf, pos + 4, flexible)
            if size < 0:
                batches: tuple[BatchHeader, ...] = ()
            else:
                if pos + size > end:
                    raise MalformedMessageError(
                        f"truncated Produce request: records of partition {index} need {size} "
                        f"bytes at offset {pos}, {end - pos} left"
                    )
                batches = _batch_headers(buf, pos, pos + size, False)
                pos += size
            if flexible:
                # Fast path: an empty tagged-field section is a single 0 byte.
                pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
            partitions.append(_partition(index, batches))
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        topics.append(_topic(name, topic_id, tuple(partitions)))
    if flexible:
        pos = skip_tagged_fields(buf, pos)
    return ProduceRequestSummary(transactional_id, acks, timeout_ms, tuple(topics))


def produce_acks_and_producer_ids(
    body: bytes | bytearray | memoryview, api_version: int
) -> tuple[int, tuple[int, ...]]:
    """(acks, producer ids) of a ProduceRequest body: the walk of :func:`parse_produce_request`
    with the same bounds checks on every length, array and batch header, but building no
    objects, and reading topic names by their length only (the broker validates them).

    The per-request path of ``proxy.connection``: the quota needs only the PIDs, and the full
    summary is built only when something needs it (a rejection, the event log, the order
    guard). PIDs are in batch order, duplicates kept, -1 (no PID) left out; a legacy (magic
    0/1) batch carries none.
    """
    if api_version not in SUPPORTED_PRODUCE_VERSIONS:
        _check_version(api_version)
    # Calls are what the per-request path pays for most (issue "lean"): a byte view as the
    # connection hands it over is used as is.
    buf = body if type(body) is memoryview and body.format == "B" else as_memoryview(body)
    try:
        return _walk_producer_ids(buf, api_version)
    except (struct.error, IndexError, ValueError) as exc:
        raise MalformedMessageError(
            f"malformed Produce v{api_version} request ({len(buf)} bytes): {exc}"
        ) from None


_PRODUCER_ID_AT = 43  # RecordBatch v2


def _walk_producer_ids(buf: memoryview, api_version: int) -> tuple[int, tuple[int, ...]]:
    flexible = api_version >= FIRST_FLEXIBLE_PRODUCE_VERSION
    end = len(buf)
    unpack_i32 = I32.unpack_from
    unpack_i64 = I64.unpack_from
    if flexible:
        size = buf[0]
        if size == 0:
            pos = 1
        else:
            if size >= 0x80:
                size, pos = read_uvarint(buf, 0)
            else:
                pos = 1
            pos += size - 1
    else:
        size = I16.unpack_from(buf, 0)[0]
        pos = 2 + (size if size > 0 else 0)
        if size < -1:
            raise MalformedMessageError(f"invalid transactional_id length {size}")
    if pos + 6 > end:
        raise MalformedMessageError(f"truncated Produce v{api_version} request: acks/timeout_ms")
    acks = I16.unpack_from(buf, pos)[0]
    pos += 6
    producer_ids: list[int] = []
    # Array lengths, records lengths and tagged-field sections take their one-byte (and for
    # records, two-byte) forms inline; anything longer goes through the shared readers.
    topic_count = buf[pos] - 1 if flexible else -1
    if 0 <= topic_count < 0x7F and topic_count < end - pos:
        pos += 1
    else:
        topic_count, pos = _array_len(buf, pos, flexible, "topic_data")
    for _ in range(topic_count):
        if api_version >= FIRST_TOPIC_ID_PRODUCE_VERSION:
            pos += 16
        elif flexible:
            size = buf[pos]
            if size < 0x80:
                pos += size if size else 1  # compact string: length + 1 in the varint byte
            else:
                size, pos = read_uvarint(buf, pos)
                pos += size - 1
        else:
            size = I16.unpack_from(buf, pos)[0]
            if size < -1:
                raise MalformedMessageError(f"invalid topic name length {size}")
            pos += 2 + (size if size > 0 else 0)
        if pos > end:
            raise MalformedMessageError("truncated Produce request: topic")
        partition_count = buf[pos] - 1 if flexible else -1
        if 0 <= partition_count < 0x7F and partition_count < end - pos:
            pos += 1
        else:
            partition_count, pos = _array_len(buf, pos, flexible, "partition_data")
        for _ in range(partition_count):
            if pos + 4 > end:
                raise MalformedMessageError("truncated Produce request: partition index")
            pos += 4
            size = buf[pos] if flexible else 0x80
            if size < 0x80:
                size -= 1  # compact nullable bytes: 0 = null
                pos += 1
            elif flexible and buf[pos + 1] < 0x80:
                size = (size & 0x7F | buf[pos + 1] << 7) - 1
                pos += 2
            else:
                size, pos = _records_length(buf, pos, flexible)
            if size >= 0:
                stop = pos + size
                if stop > end:
                    raise MalformedMessageError(
                        f"truncated Produce request: records need {size} bytes at offset {pos}, "
                        f"{end - pos} left"
                    )
                while pos < stop:
                    remaining = stop - pos
                    if remaining < BATCH_V2_HEADER_BYTES or buf[pos + _MAGIC_OFFSET] != 2:
                        # Short or legacy batches: the full walk has every rule for them.
                        for batch in _batch_headers(buf, pos, stop, False):
                            if batch.producer_id != -1:
                                producer_ids.append(batch.producer_id)
                        break
                    batch_length = unpack_i32(buf, pos + 8)[0]
                    if batch_length < BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES:
                        raise MalformedMessageError(
                            f"record batch at offset {pos} has batch_length {batch_length}, "
                            f"below the minimum {BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES} for "
                            "magic 2"
                        )
                    total = LOG_OVERHEAD_BYTES + batch_length
                    if total > remaining:
                        raise MalformedMessageError(
                            f"truncated record batch at offset {pos}: batch needs {total} bytes, "
                            f"{remaining} left"
                        )
                    producer_id = unpack_i64(buf, pos + _PRODUCER_ID_AT)[0]
                    if producer_id != -1:
                        producer_ids.append(producer_id)
                    pos += total
                pos = stop
            if flexible:
                pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
    if flexible and buf[pos] != 0:
        skip_tagged_fields(buf, pos)
    return acks, tuple(producer_ids)


def _records_length(buf: memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """(length, offset after it) of a partition's records field: -1 for null, else >= 0."""
    if flexible:
        size = buf[pos]
        if size < 0x80:
            pos += 1
        else:
            size, pos = read_uvarint(buf, pos)
        size -= 1  # compact nullable bytes: 0 = null
    else:
        if pos + 4 > len(buf):
            raise MalformedMessageError("truncated Produce request: records length")
        size = I32.unpack_from(buf, pos)[0]
        pos += 4
    if size < -1:
        raise MalformedMessageError(f"invalid records length {size} at offset {pos}")
    return size, pos


def _array_len(buf: memoryview, pos: int, flexible: bool, what: str) -> tuple[int, int]:
    """``read_array_len`` with the one-byte compact length read inline."""
    if flexible:
        n = buf[pos]
        if n < 0x80:
            n -= 1
            pos += 1
            if n > len(buf) - pos:
                raise MalformedMessageError(
                    f"array length {n} for {what} exceeds the {len(buf) - pos} bytes left"
                )
            return (n if n > 0 else 0), pos
    return read_array_len(buf, pos, flexible, what)


_PARTITION_FIXED = struct.Struct(">ihq")  # index, error_code, base_offset


def encode_produce_rejection(
    api_version: int,
    correlation_id: int,
    request: ProduceRequestSummary,
    error_code: int,
    throttle_time_ms: int,
) -> bytes:
    """A complete framed ProduceResponse rejecting every partition of ``request``.

    Built in the request's own version so every client can read it: base_offset,
    log_append_time_ms (v2+) and log_start_offset (v5+) are -1, record_errors empty and
    error_message null (v8+, KIP-467), throttle_time_ms set (clients honour it for v6+, KIP-219).
    """
    _check_version(api_version)
    flexible = api_version >= FIRST_FLEXIBLE_PRODUCE_VERSION
    by_id = api_version >= FIRST_TOPIC_ID_PRODUCE_VERSION
    out: list[bytes] = [encode_response_header(correlation_id, flexible)]

    def array_len(n: int) -> bytes:
        return write_uvarint(n + 1) if flexible else I32.pack(n)

    # Per-partition tail after (index, error_code, base_offset): log_append_time_ms (v2+),
    # log_start_offset (v5+), then v8+ record_errors [] and error_message null, then (v9+) an
    # empty tagged-field section.
    tail = I64.pack(-1)  # log_append_time_ms (v2+; we only build v3+)
    if api_version >= 5:
        tail += I64.pack(-1)  # log_start_offset (KIP-107)
    if api_version >= 8:
        tail += (b"\x01" + b"\x00") if flexible else (I32.pack(0) + I16.pack(-1))
    if flexible:
        tail += b"\x00"
    out.append(array_len(len(request.topics)))
    for topic in request.topics:
        if by_id:
            if topic.topic_id is None or len(topic.topic_id) != 16:
                raise ValueError("Produce v13+ responses need a 16-byte topic_id per topic")
            out.append(topic.topic_id)
        elif flexible:
            out.append(encode_compact_nullable_string(topic.name))
        else:
            out.append(encode_nullable_string(topic.name))
        out.append(array_len(len(topic.partitions)))
        for partition in topic.partitions:
            out.append(_PARTITION_FIXED.pack(partition.index, error_code, -1))
            out.append(tail)
        if flexible:
            out.append(b"\x00")
    out.append(I32.pack(throttle_time_ms))
    if flexible:
        out.append(b"\x00")
    return frame(b"".join(out))
