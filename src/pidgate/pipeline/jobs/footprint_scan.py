"""The executor side of ``pidgate analyze footprint``: one pass over whole partitions.

Each Spark task gets a few Kafka partitions (every segment file of each) and, per partition:

1. walks each segment file with :func:`pidgate.pipeline.reading.segments.iter_segment` (batch
headers
   only, every CRC-32C checked), pre-aggregated per producer id (:func:`parse_segment`: one
   ``segment`` row per PID seen in the file, -1 for batches without one, and one ``file`` row
   with the file's batches, bytes, newest timestamp and, if it could not be read to the end,
   where and why; the good batches before the damage still count);
2. folds those rows into the partition's producer state (:func:`summarize_partition`): per PID
   its last batch (highest offset) and whether Kafka still holds it, and the partition's counts.

Everything comes back as tuples in :data:`SCAN_ARROW_SCHEMA` order, told apart by ``kind``
(plain RDDs: the JVM warms up far less for them than for DataFrames). When the output is a
local directory and the master is local, the tasks also write the big tables themselves
(:data:`BIG_TABLES`, one Parquet file per task) and send back only what the driver needs. A
partition is parsed by one task: the largest partition bounds the job's time, and no shuffle is
needed but for the distinct PIDs per broker (:func:`count_distinct_pids`, over the rows
hash-partitioned by PID).

Light on purpose: every Python worker imports this module, so it must not import pandas,
matplotlib, pyspark.sql or the driver-side :mod:`pidgate.pipeline.jobs.footprint`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pidgate.pipeline.reading.segments import SegmentError, iter_segment

__all__ = [
    "BIG_TABLES",
    "SCAN_ARROW_SCHEMA",
    "LastWrite",
    "PartitionCounts",
    "SegmentTask",
    "arrow_batch",
    "count_distinct_pids",
    "is_not_segment",
    "keyed_by_pid",
    "parse_segment",
    "scan_slices",
    "state_rows",
    "summarize_partition",
    "table_rows",
]

SegmentTask = tuple[str, str, str, int, str]
"""(log_dir, broker, topic, partition, segment path)."""

_LOG_OVERHEAD_BYTES = 12  # base_offset + batch_length: a batch occupies 12 + batch_length

SCAN_ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),  # segment | file | pid | partition | broker | overall
        ("log_dir", pa.string()),
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("segment", pa.string()),  # segment, file
        # segment: per (file, PID); pid: per (partition, PID), of its last batch
        ("producer_id", pa.int64()),  # -1: batches without a PID
        ("producer_epoch", pa.int32()),
        ("batches", pa.int64()),  # segment, file, pid
        ("bytes", pa.int64()),  # segment, file, pid
        ("max_timestamp", pa.int64()),  # segment: over the PID's batches; file: all batches
        ("last_offset", pa.int64()),
        ("last_timestamp", pa.int64()),  # max_timestamp of the PID's last batch
        ("is_transactional", pa.bool_()),  # segment: of the PID's last batch
        ("is_control", pa.bool_()),  # segment: of the PID's last batch
        ("byte_position", pa.int64()),  # file: where the damage starts (null: unreadable)
        ("error", pa.string()),  # file: why it could not be read to the end
        ("txn_open", pa.bool_()),  # pid
        ("partition_newest_timestamp", pa.int64()),  # pid, partition
        ("age_ms", pa.int64()),  # pid
        ("active", pa.bool_()),  # pid: Kafka still holds its entry
        ("active_pids", pa.int64()),  # partition
        ("open_transactions", pa.int64()),  # partition: of the active PIDs
        ("pid_partitions", pa.int64()),  # partition: PIDs seen
        ("distinct_active_pids", pa.int64()),  # broker: of the PIDs hashed to one task
        ("distinct_pids", pa.int64()),  # overall: of the PIDs hashed to one task
    ]
)
"""The rows the executors send back, one schema for every ``kind``; see the module docstring."""

_WIDTH = len(SCAN_ARROW_SCHEMA)
_INDEX = {name: i for i, name in enumerate(SCAN_ARROW_SCHEMA.names)}
_PRODUCER_ID, _BROKER, _ACTIVE = _INDEX["producer_id"], _INDEX["broker"], _INDEX["active"]

_LAST_WRITE_COLUMNS = (
    "log_dir", "broker", "topic", "partition", "producer_id", "producer_epoch", "last_offset",
    "last_timestamp", "txn_open", "batches", "bytes", "partition_newest_timestamp",
)  # fmt: skip
BIG_TABLES: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "segment_pids": ("segment", SCAN_ARROW_SCHEMA.names[1:15], False),
    "last_writes": ("pid", _LAST_WRITE_COLUMNS, False),
    "active_pids": ("pid", (*_LAST_WRITE_COLUMNS, "age_ms"), True),
}
"""The tables as big as the input: name -> (row kind, columns, active rows only)."""
_FILE_FIELDS = 16  # parse_segment's rows: log_dir .. error


class LastWrite(NamedTuple):
    """A PID's last write to a partition (the ``last_writes`` output, plus age and state)."""

    log_dir: str
    broker: str
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    last_offset: int
    last_timestamp: int
    txn_open: bool
    batches: int
    bytes: int
    partition_newest_timestamp: int
    age_ms: int
    active: bool


class PartitionCounts(NamedTuple):
    """What one partition holds (``partition`` rows)."""

    log_dir: str
    broker: str
    topic: str
    partition: int
    partition_newest_timestamp: int
    active_pids: int
    open_transactions: int
    pid_partitions: int


def parse_segment(task: SegmentTask, verify_crc: bool = True) -> list[tuple[Any, ...]]:
    """Rows for one segment file (fields ``log_dir`` .. ``error`` of
    :data:`SCAN_ARROW_SCHEMA`): one per producer id seen (-1 for batches without one), then the
    file's own row (``producer_id`` null)."""
    log_dir, broker, topic, partition, path = task
    # pid -> [epoch, batches, bytes, max_ts, last_offset, last_ts, txn, control]
    per_pid: dict[int, list[Any]] = {}
    batches = 0
    size_bytes = 0
    newest: int | None = None
    error: tuple[int | None, str | None] = (None, None)
    try:
        for batch in iter_segment(path, verify_crc=verify_crc, markers=False):
            h = batch.header
            last_offset = h.base_offset + h.last_offset_delta
            size = h.batch_length + _LOG_OVERHEAD_BYTES
            batches += 1
            size_bytes += size
            if newest is None or h.max_timestamp > newest:
                newest = h.max_timestamp
            row = per_pid.get(h.producer_id)
            if row is None:
                per_pid[h.producer_id] = [
                    h.producer_epoch,
                    1,
                    size,
                    h.max_timestamp,
                    last_offset,
                    h.max_timestamp,
                    h.is_transactional,
                    h.is_control,
                ]
                continue
            row[1] += 1
            row[2] += size
            if h.max_timestamp > row[3]:
                row[3] = h.max_timestamp
            if last_offset >= row[4]:
                row[0] = h.producer_epoch
                row[4] = last_offset
                row[5] = h.max_timestamp
                row[6] = h.is_transactional
                row[7] = h.is_control
    except SegmentError as exc:
        error = (exc.offset, exc.reason)
    except OSError as exc:
        error = (None, f"cannot read: {exc}")
    key = (log_dir, broker, topic, partition, path)
    out: list[tuple[Any, ...]] = [
        (*key, pid, *values, None, None) for pid, values in per_pid.items()
    ]
    out.append((*key, None, None, batches, size_bytes, newest, None, None, None, None, *error))
    return out


def summarize_partition(
    segment_rows: Iterable[tuple[Any, ...]], expiration_ms: int
) -> tuple[list[LastWrite], PartitionCounts | None]:
    """Fold one partition's :func:`parse_segment` PID rows (any file order) into its producer
    state: per PID its last batch (highest offset; Kafka keys expiry on that batch's
    max_timestamp) and whether Kafka still holds it (``newest - last_timestamp <
    expiration_ms``, KIP-854, or a transaction still open: Kafka never expires those, its
    ``isProducerExpired``), the reference "now" being the partition's newest timestamp over all
    its batches, with or without PID (batch timestamps may be out of order). ``None`` counts
    when the partition has no batch."""
    newest: int | None = None
    # pid -> (last_offset, last_ts, epoch, txn, control) of the last batch, batches, bytes
    last: dict[int, list[Any]] = {}
    key: tuple[str, str, str, int] = ("", "", "", 0)
    for row in segment_rows:
        key = (row[0], row[1], row[2], row[3])
        pid, epoch, batches, size, max_ts, last_offset, last_ts, txn, control = row[5:14]
        if newest is None or max_ts > newest:
            newest = max_ts
        if pid < 0:
            continue
        position = (last_offset, last_ts, epoch, txn, control)
        seen = last.get(pid)
        if seen is None:
            last[pid] = [position, batches, size]
            continue
        if position > seen[0]:  # the order Spark's max(struct(...)) gave before: offset first
            seen[0] = position
        seen[1] += batches
        seen[2] += size
    if newest is None:
        return [], None
    writes: list[LastWrite] = []
    active_pids = 0
    open_txns = 0
    for pid, ((last_offset, last_ts, epoch, txn, control), batches, size) in last.items():
        txn_open = bool(txn and not control)
        age_ms = newest - last_ts
        active = txn_open or age_ms < expiration_ms
        active_pids += active
        open_txns += active and txn_open
        writes.append(
            LastWrite(
                *key,
                pid,
                epoch,
                last_offset,
                last_ts,
                txn_open,
                batches,
                size,
                newest,
                age_ms,
                active,
            )
        )
    counts = PartitionCounts(*key, newest, active_pids, open_txns, len(last))
    return writes, counts


def _row(kind: str, **values: Any) -> tuple[Any, ...]:
    """A :data:`SCAN_ARROW_SCHEMA` row of ``kind`` with ``values``, null elsewhere."""
    row: list[Any] = [None] * _WIDTH
    row[0] = kind
    for name, value in values.items():
        row[_INDEX[name]] = value
    return tuple(row)


def state_rows(
    writes: Sequence[LastWrite], counts: PartitionCounts | None
) -> list[tuple[Any, ...]]:
    """:func:`summarize_partition`'s result as :data:`SCAN_ARROW_SCHEMA` rows (``pid`` and
    ``partition``)."""
    rows = [_row("pid", **w._asdict()) for w in writes]
    if counts is not None:
        rows.append(_row("partition", **counts._asdict()))
    return rows


def _partition_rows(
    files: Sequence[SegmentTask], expiration_ms: int, verify_crc: bool
) -> list[tuple[Any, ...]]:
    """Every :data:`SCAN_ARROW_SCHEMA` row of one partition (its segment files)."""
    pad_file = (None,) * (_WIDTH - 1 - _FILE_FIELDS)
    pid_rows: list[tuple[Any, ...]] = []
    out: list[tuple[Any, ...]] = []
    for task in files:
        rows = parse_segment(task, verify_crc)
        pid_rows.extend(rows[:-1])
        out.extend(("segment", *row, *pad_file) for row in rows[:-1])
        out.append(("file", *rows[-1], *pad_file))
    return out + state_rows(*summarize_partition(pid_rows, expiration_ms))


def arrow_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    """``rows`` (tuples in :data:`SCAN_ARROW_SCHEMA` order) as one Arrow batch."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * _WIDTH
    arrays = [pa.array(c, f.type) for c, f in zip(columns, SCAN_ARROW_SCHEMA, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=SCAN_ARROW_SCHEMA)


def _write_slice(table: pa.Table, write_dir: str, slice_id: int) -> None:
    """This slice's part of every :data:`BIG_TABLES` table: ``<write_dir>/<name>.parquet/
    part-<slice>.parquet``, written under a hidden name and renamed (a retried task rewrites
    the same file with the same rows)."""
    for name, (kind, columns, only_active) in BIG_TABLES.items():
        mask = pc.equal(table["kind"], kind)
        if only_active:
            mask = pc.and_(mask, pc.fill_null(table["active"], False))
        directory = os.path.join(write_dir, f"{name}.parquet")
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, f"part-{slice_id:05d}.parquet")
        staging = os.path.join(directory, f".part-{slice_id:05d}.{os.getpid()}.tmp")
        pq.write_table(table.filter(mask).select(list(columns)), staging)
        os.replace(staging, target)


def scan_slices(
    slices: Sequence[Sequence[Sequence[SegmentTask]]],
    expiration_ms: int,
    verify_crc: bool,
    write_dir: str | None = None,
) -> Callable[[Iterable[int]], Iterator[tuple[Any, ...]]]:
    """The function ``mapPartitions`` runs over ``parallelize(range(len(slices)))``: each input
    number names a slice (partitions, each a list of its segment files). Without ``write_dir``
    every row comes back; with it (a local directory every task can write to), the tasks write
    the :data:`BIG_TABLES` themselves (:func:`_write_slice`) and send back all but the
    ``segment`` rows."""

    def scan(slice_ids: Iterable[int]) -> Iterator[tuple[Any, ...]]:
        for slice_id in slice_ids:
            rows = [
                row
                for files in slices[slice_id]
                for row in _partition_rows(files, expiration_ms, verify_crc)
            ]
            if write_dir is None:
                yield from rows
                continue
            _write_slice(pa.Table.from_batches([arrow_batch(rows)]), write_dir, slice_id)
            yield from (row for row in rows if row[0] != "segment")

    return scan


def keyed_by_pid(row: tuple[Any, ...]) -> tuple[int | None, tuple[Any, ...]]:
    """``(producer_id, row)`` for a ``pid`` row, ``(None, row)`` for the others: the key the
    rows are hash-partitioned by before :func:`count_distinct_pids`."""
    return (row[_PRODUCER_ID] if row[0] == "pid" else None, row)


def is_not_segment(row: tuple[Any, ...]) -> bool:
    return bool(row[0] != "segment")


def table_rows(name: str) -> Callable[[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """For ``flatMap``: a scan row as a row of the big table ``name`` (:data:`BIG_TABLES`),
    or nothing."""
    kind, columns, only_active = BIG_TABLES[name]
    indexes = [_INDEX[c] for c in columns]
    active = _INDEX["active"]

    def project(row: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if row[0] != kind or (only_active and not row[active]):
            return []
        return [tuple(row[i] for i in indexes)]

    return project


def count_distinct_pids(
    keyed_rows: Iterable[tuple[int | None, tuple[Any, ...]]],
) -> Iterator[tuple[Any, ...]]:
    """The function ``mapPartitions`` runs over :func:`keyed_by_pid` rows hash-partitioned by
    their key, so that every PID's rows are in one task: per broker, the distinct PIDs active
    there (``broker`` rows) and all distinct PIDs seen (one ``overall`` row), which the driver
    sums over tasks. The other rows pass through."""
    active: dict[str, set[int]] = {}
    seen: set[int] = set()
    for _, row in keyed_rows:
        if row[0] != "pid":
            yield row
            continue
        pid = row[_PRODUCER_ID]
        seen.add(pid)
        per_broker = active.setdefault(row[_BROKER], set())
        if row[_ACTIVE]:
            per_broker.add(pid)
    for broker, pids in active.items():
        yield _row("broker", broker=broker, distinct_active_pids=len(pids))
    yield _row("overall", distinct_pids=len(seen))
