"""The Produce hot path: a hand-written walk of ProduceRequest bodies and locally built rejections.

Owns ``parse_produce_request`` (topics, partitions and the *header* of every record batch, read
by :mod:`pidgate.protocol.record_batches`: records are never copied or decompressed),
``produce_acks_and_producer_ids`` (the per-request walk: ``pure_produce_acks_and_producer_ids``
or its compiled twin in ``_speedups``, as ``native`` chose) and ``encode_produce_rejection``.
kafka-python is deliberately not used here (its full decode costs 12-100 µs per request; this
walk about 2 µs); it is the reference in the parity tests. Must not import: asyncio, socket,
time, logging, structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from pidgate.protocol import native
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
from pidgate.protocol.errors import MalformedMessageError, unsupported_version
from pidgate.protocol.framing import frame
from pidgate.protocol.headers import encode_response_header
from pidgate.protocol.record_batches import (
    BATCH_V2_HEADER_BYTES,
    BATCH_V2_PRODUCER_ID_OFFSET,
    LOG_OVERHEAD_BYTES,
    MAGIC_OFFSET,
    MIN_BATCH_V2_LENGTH,
    BatchHeader,
    batch_headers,
    batch_too_short,
    batch_truncated,
)

PRODUCE_KEY = 0
SUPPORTED_PRODUCE_VERSIONS = range(3, 14)
"""v3 is the first with transactional_id and RecordBatch v2 (KIP-98); v13 (topic ids, KIP-516)
is the newest in Kafka's schemas. Kafka 4.0 removed v0-v2 (KIP-896)."""
FIRST_FLEXIBLE_PRODUCE_VERSION = 9  # KIP-482 compact encoding + tagged fields
FIRST_TOPIC_ID_PRODUCE_VERSION = 13  # KIP-516: topic_id (uuid) replaces the topic name


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
# Built as record_batches builds BatchHeader: the slots written through their member descriptors.
_new_partition = PartitionProduce.__new__
_p_index = PartitionProduce.__dict__["index"].__set__
_p_batches = PartitionProduce.__dict__["batches"].__set__
_new_topic = TopicProduce.__new__
_t_name = TopicProduce.__dict__["name"].__set__
_t_topic_id = TopicProduce.__dict__["topic_id"].__set__
_t_partitions = TopicProduce.__dict__["partitions"].__set__


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
        raise unsupported_version("Produce", PRODUCE_KEY, api_version, SUPPORTED_PRODUCE_VERSIONS)


def _malformed_request(api_version: int, buf: memoryview, exc: Exception) -> MalformedMessageError:
    return MalformedMessageError(
        f"malformed Produce v{api_version} request ({len(buf)} bytes): {exc}"
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
        raise _malformed_request(api_version, buf, exc) from None


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
                batches = batch_headers(buf, pos, pos + size, False)
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
        raise _malformed_request(api_version, buf, exc) from None


def _walk_producer_ids(buf: memoryview, api_version: int) -> tuple[int, tuple[int, ...]]:
    flexible = api_version >= FIRST_FLEXIBLE_PRODUCE_VERSION
    end = len(buf)
    unpack_i32 = I32.unpack_from
    unpack_i64 = I64.unpack_from
    if flexible:
        size = buf[0]
        if size == 0:
            pos = 1
        elif size < 0x80:
            pos = size  # one byte holding length + 1, then the string
        else:
            size, pos = read_uvarint(buf, 0)
            pos += size - 1 if size else 0  # 0 is null, also as a padded varint (0x80 0x00)
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
                pos += size - 1 if size else 0  # null as a padded varint
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
                    if remaining < BATCH_V2_HEADER_BYTES or buf[pos + MAGIC_OFFSET] != 2:
                        # Short or legacy batches: the full walk has every rule for them.
                        for batch in batch_headers(buf, pos, stop, False):
                            if batch.producer_id != -1:
                                producer_ids.append(batch.producer_id)
                        break
                    batch_length = unpack_i32(buf, pos + 8)[0]
                    if batch_length < MIN_BATCH_V2_LENGTH:
                        raise batch_too_short(pos, batch_length, 2)
                    total = LOG_OVERHEAD_BYTES + batch_length
                    if total > remaining:
                        raise batch_truncated(pos, total, remaining)
                    producer_id = unpack_i64(buf, pos + BATCH_V2_PRODUCER_ID_OFFSET)[0]
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


#: The pure walk, whichever runs (the compiled one hands it what it does not take).
pure_produce_acks_and_producer_ids = produce_acks_and_producer_ids
if native.compiled is not None:
    produce_acks_and_producer_ids = native.compiled.produce_acks_and_producer_ids


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
