"""Kafka log segment (``.log``) and producer snapshot (``.snapshot``) files, in pure Python.

Owns the on-disk formats the ``footprint`` and ``snapshots`` jobs read and write:

- a segment WRITER (:func:`write_segment`, :func:`encode_batch`) for tests and generators:
  RecordBatch v2 (magic 2) with a valid CRC-32C over ``attributes..end``, records encoded like
  Kafka's ``DefaultRecord`` (varints), idempotent and transactional batches and COMMIT/ABORT
  control batches (``EndTransactionMarker``: key ``version int16, type int16``; value
  ``version int16, coordinator_epoch int32``);
- a segment READER (:func:`iter_segment`, :func:`read_segment_headers`) that walks a file batch
  by batch over an ``mmap`` (only header pages are touched unless the CRC is verified), reuses
  :func:`pidgate.protocol.record_batches.iter_batch_headers` for the header fields, checks every CRC
  and raises :class:`SegmentError` naming the file and byte position on corruption/truncation;
- producer snapshot files in Kafka's exact format (``ProducerStateManager``'s
  ``PID_SNAPSHOT_MAP_SCHEMA``): ``version int16 = 1``, ``crc uint32`` (CRC-32C of every byte
  after the crc field), ``producer_entries`` as a classic ``ArrayOf``: ``int32`` count, then per
  entry ``producer_id int64, epoch int16, last_sequence int32, last_offset int64,
  offset_delta int32, timestamp int64, coordinator_epoch int32,
  current_txn_first_offset int64`` (46 bytes). Written atomically, never over an existing file.

No Spark here: everything is plain functions usable on executors and in tests.

Every executor's Python worker imports it (through ``footprint_scan``): must not import pyspark,
pandas, matplotlib or another pipeline module.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from pidgate.protocol.errors import MalformedMessageError
from pidgate.protocol.record_batches import (
    BATCH_V2_HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    iter_batch_headers,
)

__all__ = [
    "SNAPSHOT_ENTRY_BYTES",
    "SNAPSHOT_HEADER_BYTES",
    "SNAPSHOT_VERSION",
    "BatchSpec",
    "ControlMarker",
    "SegmentBatch",
    "SegmentError",
    "SnapshotEntry",
    "SnapshotError",
    "decode_snapshot",
    "encode_batch",
    "encode_snapshot",
    "iter_segment",
    "last_sequence",
    "offset_from_file_name",
    "read_segment_headers",
    "read_snapshot",
    "segment_file_name",
    "snapshot_file_name",
    "write_segment",
    "write_snapshot",
]

# ---------------------------------------------------------------------------------------------
# RecordBatch v2 layout (DefaultRecordBatch.java): crc at 17 covers bytes 21..end.
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_MAGIC_OFFSET = 16
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_LOG_APPEND_TIME = 0x08
# base_offset, batch_length, partition_leader_epoch, magic, crc (the part before attributes)
_PREFIX = struct.Struct(">qiibI")
# attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
# base_sequence, records_count: the CRC-covered header part (40 bytes)
_COVERED = struct.Struct(">hiqqqhii")
_LENGTH = struct.Struct(">qi")
_V2_HEADER = struct.Struct(_PREFIX.format + _COVERED.format[1:])  # the 61 bytes before records
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_CONTROL_KEY = struct.Struct(">hh")  # version, type (ControlRecordType: ABORT 0, COMMIT 1)
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator_epoch (EndTransactionMarker v0)
_CONTROL_ABORT = 0
_CONTROL_COMMIT = 1
_INT32_MAX = 2**31 - 1


def segment_file_name(base_offset: int) -> str:
    """``<base offset, 20 digits>.log`` (Kafka's ``LogFileUtils.logFile``)."""
    return f"{base_offset:020d}.log"


def snapshot_file_name(offset: int) -> str:
    """``<offset, 20 digits>.snapshot`` (Kafka's ``LogFileUtils.producerSnapshotFile``)."""
    return f"{offset:020d}.snapshot"


def offset_from_file_name(name: str) -> int:
    """The offset prefix of a segment/snapshot/index file name (``00000000000000001234.log``)."""
    return int(name.split(".", 1)[0])


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """``DefaultRecordBatch.lastSequence``: base + delta, wrapping past Integer.MAX_VALUE;
    -1 (NO_SEQUENCE) stays -1."""
    if base_sequence == -1:
        return -1
    if base_sequence > _INT32_MAX - last_offset_delta:
        return last_offset_delta - (_INT32_MAX - base_sequence) - 1
    return base_sequence + last_offset_delta


# ---------------------------------------------------------------------------------------------
# Varints (zigzag, as in Kafka's ByteUtils.writeVarint/writeVarlong)


def _zigzag_varint(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _read_zigzag(buf: memoryview | bytes, pos: int, end: int) -> tuple[int, int]:
    raw = 0
    shift = 0
    while True:
        if pos >= end:
            raise MalformedMessageError(f"truncated varint at byte {pos}")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise MalformedMessageError(f"varint longer than 10 bytes ending at byte {pos}")
    return (raw >> 1) ^ -(raw & 1), pos


def _encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
) -> list[bytes]:
    """One DefaultRecord as a list of parts (the value is never copied)."""
    head = bytearray(b"\x00")  # attributes (unused, 0)
    head += _zigzag_varint(timestamp_delta)
    head += _zigzag_varint(offset_delta)
    if key is None:
        head += _zigzag_varint(-1)
    else:
        head += _zigzag_varint(len(key))
        head += key
    head += _zigzag_varint(-1 if value is None else len(value))
    tail = _zigzag_varint(0)  # headers count
    body_len = len(head) + (0 if value is None else len(value)) + len(tail)
    parts = [_zigzag_varint(body_len), bytes(head)]
    if value is not None:
        parts.append(value)
    parts.append(tail)
    return parts


# ---------------------------------------------------------------------------------------------
# Writer


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """An end-transaction marker (the single record of a control batch)."""

    commit: bool
    coordinator_epoch: int
    timestamp: int = -1
    """The control record's timestamp (filled in by the reader; ignored by the writer, which
    uses the batch's base_timestamp)."""


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """One RecordBatch v2 to write.

    ``values`` are the record values (one record each; a control batch ignores them and holds
    the marker record). ``timestamp_deltas`` (per record, relative to ``base_timestamp``)
    default to 0; max_timestamp is base + the largest delta. ``producer_id`` -1 means a plain
    (non-idempotent) batch.
    """

    base_offset: int
    base_timestamp: int
    values: Sequence[bytes | None] = (b"",)
    timestamp_deltas: Sequence[int] | None = None
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    marker: ControlMarker | None = None
    partition_leader_epoch: int = 0
    key: bytes | None = None

    @property
    def record_count(self) -> int:
        return 1 if self.marker is not None else len(self.values)

    @property
    def last_offset_delta(self) -> int:
        return self.record_count - 1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def max_timestamp(self) -> int:
        if self.marker is not None or not self.timestamp_deltas:
            return self.base_timestamp
        return self.base_timestamp + max(self.timestamp_deltas)

    @property
    def attributes(self) -> int:
        attributes = 0
        if self.transactional or self.marker is not None:
            attributes |= _TRANSACTIONAL  # markers are written as transactional control batches
        if self.marker is not None:
            attributes |= _CONTROL
        return attributes


def _batch_parts(spec: BatchSpec) -> list[bytes]:
    """The bytes of one batch as parts: header (with CRC) first, then the record parts."""
    records: list[bytes] = []
    if spec.marker is not None:
        key = _CONTROL_KEY.pack(0, _CONTROL_COMMIT if spec.marker.commit else _CONTROL_ABORT)
        value = _CONTROL_VALUE.pack(0, spec.marker.coordinator_epoch)
        records.extend(_encode_record(0, 0, key, value))
    else:
        if not spec.values:
            raise ValueError("a data batch needs at least one record")
        deltas = spec.timestamp_deltas or [0] * len(spec.values)
        if len(deltas) != len(spec.values):
            raise ValueError("timestamp_deltas must have one entry per record")
        for i, (record_value, delta) in enumerate(zip(spec.values, deltas, strict=True)):
            records.extend(_encode_record(i, delta, spec.key, record_value))
    covered = _COVERED.pack(
        spec.attributes,
        spec.last_offset_delta,
        spec.base_timestamp,
        spec.max_timestamp,
        spec.producer_id,
        spec.producer_epoch,
        spec.base_sequence,
        spec.record_count,
    )
    crc = crc32c.crc32c(covered)
    size = len(covered)
    for part in records:
        crc = crc32c.crc32c(part, crc)
        size += len(part)
    batch_length = size + (_PREFIX.size - LOG_OVERHEAD_BYTES)  # + leader epoch, magic, crc
    prefix = _PREFIX.pack(spec.base_offset, batch_length, spec.partition_leader_epoch, 2, crc)
    return [prefix, covered, *records]


def encode_batch(spec: BatchSpec) -> bytes:
    """One RecordBatch v2 (magic 2) as bytes, CRC-32C included."""
    return b"".join(_batch_parts(spec))


def write_segment(path: str | os.PathLike[str], batches: Iterable[BatchSpec]) -> int:
    """Write ``batches`` back to back to a segment file; return the bytes written.

    Offsets are taken from the specs as given (the caller keeps them increasing; a segment's
    file name is its first batch's base offset, see :func:`segment_file_name`).
    """
    written = 0
    with open(path, "wb") as out:
        for spec in batches:
            parts = _batch_parts(spec)
            out.writelines(parts)
            written += sum(len(p) for p in parts)
    return written


# ---------------------------------------------------------------------------------------------
# Reader


class SegmentError(Exception):
    """A segment file that cannot be read past ``offset`` (a byte position in the file)."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: {reason} (at byte {offset})")
        self.path = path
        self.offset = offset
        self.reason = reason

    def __reduce__(self) -> tuple[type[SegmentError], tuple[str, int, str]]:
        return (SegmentError, (self.path, self.offset, self.reason))


@dataclass(frozen=True, slots=True)
class SegmentBatch:
    """One batch of a segment: its header, its byte position in the file and, for control
    batches holding an end-transaction marker, the marker."""

    header: BatchHeader
    position: int
    marker: ControlMarker | None


def _read_marker(
    path: str, buf: memoryview, pos: int, total: int, header: BatchHeader
) -> ControlMarker | None:
    """The EndTransactionMarker of a control batch (its first record), or None if the batch is
    empty or holds another control type (e.g. KRaft's LEADER_CHANGE)."""
    if header.records_count <= 0:
        return None  # Kafka: an empty control batch means the transaction was cleaned away
    if header.compression_type != 0:
        raise SegmentError(path, pos, "compressed control batch (Kafka never writes one)")
    end = pos + total
    try:
        p = pos + BATCH_V2_HEADER_BYTES
        _length, p = _read_zigzag(buf, p, end)
        p += 1  # record attributes
        ts_delta, p = _read_zigzag(buf, p, end)
        _offset_delta, p = _read_zigzag(buf, p, end)
        key_len, p = _read_zigzag(buf, p, end)
        if key_len < _CONTROL_KEY.size or p + key_len > end:
            raise SegmentError(path, pos, f"control record key of {key_len} bytes")
        _key_version, control_type = _CONTROL_KEY.unpack_from(buf, p)
        p += key_len
        if control_type not in (_CONTROL_ABORT, _CONTROL_COMMIT):
            return None
        value_len, p = _read_zigzag(buf, p, end)
        if value_len < _CONTROL_VALUE.size or p + value_len > end:
            raise SegmentError(path, pos, f"end transaction marker value of {value_len} bytes")
        _value_version, coordinator_epoch = _CONTROL_VALUE.unpack_from(buf, p)
    except MalformedMessageError as exc:
        raise SegmentError(path, pos, f"malformed control record: {exc}") from None
    log_append = header.attributes & _LOG_APPEND_TIME
    timestamp = header.max_timestamp if log_append else header.base_timestamp + ts_delta
    return ControlMarker(control_type == _CONTROL_COMMIT, coordinator_epoch, timestamp)


def iter_segment(
    path: str | os.PathLike[str], *, verify_crc: bool = True, markers: bool = True
) -> Iterator[SegmentBatch]:
    """Walk a segment file batch by batch.

    Every v2 batch's CRC-32C (bytes 21..end) is checked when ``verify_crc`` (legacy magic 0/1
    entries: CRC-32 from the magic byte on). Raises :class:`SegmentError` naming the file and
    byte position at the first corrupt or truncated batch, after yielding every good batch
    before it. ``markers`` decodes the end-transaction marker of control batches.
    """
    name = os.fspath(path)
    with open(name, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        # Not closed explicitly: a SegmentError's traceback may still reference slices of the
        # map, and closing an exported map raises BufferError. It is unmapped when collected.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if verify_crc and hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    try:
        min_offset = offset_from_file_name(os.path.basename(name))
    except ValueError:
        min_offset = 0
    yield from _walk(name, memoryview(mm), size, verify_crc, markers, min_offset)


def _walk(
    path: str, buf: memoryview, size: int, verify_crc: bool, markers: bool, min_offset: int
) -> Iterator[SegmentBatch]:
    """Batches of ``buf``; base offsets must increase and start at or above ``min_offset`` (the
    segment's base offset from its file name): base_offset is not covered by the CRC."""
    pos = 0
    while pos < size:
        remaining = size - pos
        if remaining < _MAGIC_OFFSET + 1:
            raise SegmentError(path, pos, f"truncated batch: {remaining} bytes left in the file")
        base_offset, batch_length = _LENGTH.unpack_from(buf, pos)
        magic = buf[pos + _MAGIC_OFFSET]
        total = LOG_OVERHEAD_BYTES + batch_length
        if magic not in (0, 1, 2):
            raise SegmentError(path, pos, f"unknown magic {magic} (base offset {base_offset})")
        if batch_length < 0 or total > remaining:
            raise SegmentError(
                path,
                pos,
                f"truncated batch at base offset {base_offset}: needs {total} bytes, "
                f"{remaining} left in the file",
            )
        if verify_crc:
            if magic == 2:
                if total < BATCH_V2_HEADER_BYTES:
                    raise SegmentError(path, pos, f"batch_length {batch_length} below minimum")
                stored = _U32.unpack_from(buf, pos + _CRC_OFFSET)[0]
                computed = crc32c.crc32c(buf[pos + _ATTRIBUTES_OFFSET : pos + total])
            else:
                stored = _U32.unpack_from(buf, pos + LOG_OVERHEAD_BYTES)[0]
                computed = zlib.crc32(buf[pos + _MAGIC_OFFSET : pos + total])
            if stored != computed:
                raise SegmentError(
                    path,
                    pos,
                    f"CRC mismatch in batch at base offset {base_offset}: stored {stored:#010x},"
                    f" computed {computed:#010x}",
                )
        if magic == 2 and total >= BATCH_V2_HEADER_BYTES:
            # The common case read in place: one unpack, no slice (a few µs per batch saved).
            f = _V2_HEADER.unpack_from(buf, pos)
            header = BatchHeader(f[0], f[1], 2, f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12])
        else:
            try:
                header = next(iter_batch_headers(buf[pos : pos + total]))
            except (MalformedMessageError, StopIteration) as exc:
                raise SegmentError(path, pos, f"malformed batch header: {exc}") from None
        if header.base_offset < min_offset:
            raise SegmentError(
                path,
                pos,
                f"base offset {header.base_offset} below {min_offset} (offsets must increase; "
                "base_offset is not covered by the CRC)",
            )
        min_offset = header.base_offset + header.last_offset_delta + 1
        marker = None
        if markers and header.is_control:
            marker = _read_marker(path, buf, pos, total, header)
        yield SegmentBatch(header, pos, marker)
        pos += total


def read_segment_headers(
    path: str | os.PathLike[str], *, verify_crc: bool = True
) -> Iterator[BatchHeader]:
    """The header of every batch of a segment file, CRC-checked (see :func:`iter_segment`)."""
    for batch in iter_segment(path, verify_crc=verify_crc, markers=False):
        yield batch.header


# ---------------------------------------------------------------------------------------------
# Producer snapshots

SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">hIi")  # version, crc, producer_entries count
SNAPSHOT_HEADER_BYTES = _SNAPSHOT_HEAD.size  # 10
_ENTRIES_OFFSET = 6  # ProducerStateManager.PRODUCER_ENTRIES_OFFSET: the CRC covers 6..end
_ENTRY = struct.Struct(">qhiqiqiq")
SNAPSHOT_ENTRY_BYTES = _ENTRY.size  # 46


class SnapshotError(Exception):
    """A producer snapshot file that does not decode (Kafka: CorruptSnapshotException)."""


@dataclass(frozen=True, slots=True, order=True)
class SnapshotEntry:
    """One producer entry of a snapshot, fields in file order."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int  # -1: no open transaction


def encode_snapshot(entries: Iterable[SnapshotEntry]) -> bytes:
    """A snapshot file's bytes (entries in the order given)."""
    body = bytearray(_SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, 0, 0))
    count = 0
    for e in entries:
        body += _ENTRY.pack(
            e.producer_id,
            e.epoch,
            e.last_sequence,
            e.last_offset,
            e.offset_delta,
            e.timestamp,
            e.coordinator_epoch,
            e.current_txn_first_offset,
        )
        count += 1
    struct.pack_into(">i", body, _ENTRIES_OFFSET, count)
    crc = crc32c.crc32c(bytes(body[_ENTRIES_OFFSET:]))
    _U32.pack_into(body, 2, crc)
    return bytes(body)


def decode_snapshot(data: bytes, name: str = "<snapshot>") -> list[SnapshotEntry]:
    """Decode and CRC-check a snapshot's bytes; raises :class:`SnapshotError`."""
    if len(data) < SNAPSHOT_HEADER_BYTES:
        raise SnapshotError(f"{name}: {len(data)} bytes, shorter than the 10-byte header")
    version, stored, count = _SNAPSHOT_HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise SnapshotError(f"{name}: unknown snapshot version {version}")
    computed = crc32c.crc32c(data[_ENTRIES_OFFSET:])
    if stored != computed:
        raise SnapshotError(
            f"{name}: CRC mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )
    expected = SNAPSHOT_HEADER_BYTES + count * SNAPSHOT_ENTRY_BYTES
    if count < 0 or len(data) != expected:
        raise SnapshotError(f"{name}: {count} entries need {expected} bytes, file has {len(data)}")
    return [
        SnapshotEntry(*_ENTRY.unpack_from(data, SNAPSHOT_HEADER_BYTES + i * SNAPSHOT_ENTRY_BYTES))
        for i in range(count)
    ]


def read_snapshot(path: str | os.PathLike[str]) -> list[SnapshotEntry]:
    """Read a ``.snapshot`` file (CRC checked); raises :class:`SnapshotError`."""
    return decode_snapshot(Path(path).read_bytes(), os.fspath(path))


def write_snapshot(path: str | os.PathLike[str], entries: Iterable[SnapshotEntry]) -> int:
    """Write a snapshot atomically and never over an existing file; return its size.

    The bytes go to a temporary file in the same directory (fsynced), which is then hard-linked
    to ``path`` (``link`` fails if ``path`` exists: no overwrite, even in a race) and removed;
    on filesystems without hard links, ``os.replace`` after an existence check. Entries are
    written sorted by producer id. Raises FileExistsError if ``path`` exists.
    """
    target = Path(path)
    data = encode_snapshot(sorted(entries))
    if target.exists():
        raise FileExistsError(f"{target}: a producer snapshot already exists; not overwriting")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    try:
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise FileExistsError(
                f"{target}: a producer snapshot already exists; not overwriting"
            ) from None
        except OSError:
            if target.exists():
                raise FileExistsError(f"{target}: already exists; not overwriting") from None
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(target.parent)
    return len(data)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
