"""``pidgate analyze snapshots``: rebuild missing producer snapshots from the segments.

Which snapshots should exist: since Kafka 2.8 a broker takes a producer snapshot every time it
rolls a segment, named by the offset the state covers up to (exclusive), which is the NEW
segment's base offset (``UnifiedLog.roll``: ``producerStateManager.updateMapEndOffset(newOffset);
producerStateManager.takeSnapshot()``). So every rolled segment ``i`` (all but the last, active
one) should have ``<base offset of segment i+1>.snapshot``. Logs written by older brokers lack
them, which tiered storage (KIP-405) trips over: it uploads each rolled segment with the
snapshot named by the next segment's base offset. The active segment gets a snapshot only on a
clean shutdown; it is not rebuilt here.

How a snapshot at offset ``S`` is rebuilt (per partition, on an executor; the driver only
receives one small result row per snapshot): the partition's segments are replayed in offset
order through :class:`ProducerStateReplay`, which applies Kafka's own rules
(``ProducerAppendInfo``/``ProducerStateEntry``): a data batch sets epoch (clearing the retained
batch metadata when the epoch changes), ``last_sequence = base_sequence + last_offset_delta``
(wrapping), ``last_offset = base_offset + last_offset_delta``, ``offset_delta =
last_offset_delta``, ``timestamp = max_timestamp``, and opens a transaction
(``current_txn_first_offset = base_offset``) if it is transactional and none is open; a
COMMIT/ABORT control batch sets epoch (same clearing rule), ``coordinator_epoch`` from the
marker, closes the transaction and sets ``timestamp`` to the marker record's timestamp. The
snapshot holds the state after every batch below ``S``, minus the expired entries: ``now -
timestamp >= expiration_ms`` with ``now`` the partition's newest batch timestamp below ``S``,
entries with an open transaction never expire (Kafka's ``isProducerExpired``). So it contains
exactly the producers whose last write is no older than ``producer.id.expiration.ms``.

The replay starts at the oldest segment on disk rather than at the first segment inside the
expiration window: a transaction opened before the window and still open, or a marker whose
epoch/sequence state comes from an older batch, would otherwise be rebuilt wrong; reading the
older segments costs I/O only (headers are parsed, CRCs checked). Snapshots are written in
Kafka's exact format (see :mod:`pidgate.pipeline.reading.segments`), atomically, never over an
existing
file. A damaged segment stops that partition's replay at the damage: snapshots at or below the
damaged segment's base offset are still written, later ones are reported as errors; other
partitions are unaffected.

Must not import another job than :mod:`~pidgate.pipeline.jobs.footprint` (its default
expiration), nor ``pidgate.proxy``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from pidgate.pipeline.jobs.footprint import DEFAULT_EXPIRATION_MS
from pidgate.pipeline.outputs.report import Section, write_report
from pidgate.pipeline.reading.logdirs import (
    PartitionDir,
    discover_partitions,
    list_segments,
    list_snapshots,
)
from pidgate.pipeline.reading.segments import (
    SegmentBatch,
    SegmentError,
    SnapshotEntry,
    iter_segment,
    last_sequence,
    snapshot_file_name,
    write_snapshot,
)

__all__ = [
    "RESULT_SCHEMA",
    "ProducerStateReplay",
    "missing_snapshot_offsets",
    "rebuild_partition",
    "run_snapshots",
]

log = logging.getLogger(__name__)

RESULT_SCHEMA = StructType(
    [
        StructField("log_dir", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("snapshot", StringType(), False),
        StructField("offset", LongType(), False),
        StructField("entries", LongType(), True),
        StructField("open_transactions", LongType(), True),
        StructField("action", StringType(), False),  # written | would_write | exists | error
        StructField("detail", StringType(), True),
    ]
)


@dataclass(slots=True)
class _State:
    epoch: int = -1
    last_sequence: int = -1  # -1 / -1 / 0: no retained batch (ProducerStateEntry.isEmpty)
    last_offset: int = -1
    offset_delta: int = 0
    timestamp: int = -1
    coordinator_epoch: int = -1
    txn_first_offset: int = -1


class ProducerStateReplay:
    """Kafka's producer-state rules applied to batches in offset order."""

    def __init__(self) -> None:
        self.states: dict[int, _State] = {}
        self.newest_timestamp: int | None = None

    def apply(self, batch: SegmentBatch) -> None:
        h = batch.header
        if self.newest_timestamp is None or h.max_timestamp > self.newest_timestamp:
            self.newest_timestamp = h.max_timestamp
        if h.producer_id < 0:
            return
        if h.is_control:
            marker = batch.marker
            if marker is None:  # empty control batch (cleaned) or not an end-txn marker
                return
            state = self.states.setdefault(h.producer_id, _State())
            self._set_epoch(state, h.producer_epoch)
            state.coordinator_epoch = marker.coordinator_epoch
            state.txn_first_offset = -1
            state.timestamp = marker.timestamp
            return
        state = self.states.setdefault(h.producer_id, _State())
        self._set_epoch(state, h.producer_epoch)
        state.last_sequence = last_sequence(h.base_sequence, h.last_offset_delta)
        state.last_offset = h.base_offset + h.last_offset_delta
        state.offset_delta = h.last_offset_delta
        state.timestamp = h.max_timestamp
        if h.is_transactional and state.txn_first_offset < 0:
            state.txn_first_offset = h.base_offset

    @staticmethod
    def _set_epoch(state: _State, epoch: int) -> None:
        if state.epoch != epoch:  # ProducerStateEntry.maybeUpdateProducerEpoch
            state.epoch = epoch
            state.last_sequence = -1
            state.last_offset = -1
            state.offset_delta = 0

    def snapshot(self, expiration_ms: int) -> list[SnapshotEntry]:
        """Unexpired entries relative to the newest timestamp seen, sorted by producer id."""
        now = self.newest_timestamp
        out: list[SnapshotEntry] = []
        for pid, s in self.states.items():
            if s.txn_first_offset < 0 and now is not None and now - s.timestamp >= expiration_ms:
                continue
            out.append(
                SnapshotEntry(
                    pid,
                    s.epoch,
                    s.last_sequence,
                    s.last_offset,
                    s.offset_delta,
                    s.timestamp,
                    s.coordinator_epoch,
                    s.txn_first_offset,
                )
            )
        out.sort()
        return out


def missing_snapshot_offsets(partition_path: str) -> list[int]:
    """Offsets of the snapshots a 2.8+ broker would have written for the rolled segments of a
    partition folder (next segment's base offset) and that are not on disk."""
    segments = list_segments(partition_path)
    existing = list_snapshots(partition_path)
    return [s.base_offset for s in segments[1:] if s.base_offset not in existing]


PartitionTask = tuple[str, str, str, int, str]


def rebuild_partition(
    task: PartitionTask, expiration_ms: int, dry_run: bool
) -> list[tuple[Any, ...]]:
    """Rebuild (or, dry run, describe) the missing snapshots of one partition folder; result
    rows in ``RESULT_SCHEMA`` order."""
    log_dir, _broker, topic, partition, path = task
    segments = list_segments(path)
    missing = set(missing_snapshot_offsets(path))
    results: list[tuple[Any, ...]] = []
    if not missing:
        return results

    def row(
        offset: int, entries: int | None, txns: int | None, action: str, detail: str | None
    ) -> tuple[Any, ...]:
        target = os.path.join(path, snapshot_file_name(offset))
        return (log_dir, topic, partition, target, offset, entries, txns, action, detail)

    replay = ProducerStateReplay()
    last_needed = max(missing)
    for i, segment in enumerate(segments[:-1]):
        boundary = segments[i + 1].base_offset
        if segment.base_offset >= last_needed:
            break
        try:
            for batch in iter_segment(segment.path):
                replay.apply(batch)
        except (SegmentError, OSError) as exc:
            for offset in sorted(o for o in missing if o >= boundary):
                results.append(row(offset, None, None, "error", f"replay stopped: {exc}"))
            return results
        if boundary not in missing:
            continue
        entries = replay.snapshot(expiration_ms)
        txns = sum(1 for e in entries if e.current_txn_first_offset >= 0)
        target = os.path.join(path, snapshot_file_name(boundary))
        if dry_run:
            results.append(row(boundary, len(entries), txns, "would_write", None))
            continue
        try:
            write_snapshot(target, entries)
        except FileExistsError as exc:
            results.append(row(boundary, len(entries), txns, "exists", str(exc)))
        except OSError as exc:
            results.append(row(boundary, len(entries), txns, "error", f"write failed: {exc}"))
        else:
            results.append(row(boundary, len(entries), txns, "written", None))
    return results


def _partition_tasks(log_dir: str) -> list[PartitionTask]:
    parts: list[PartitionDir] = discover_partitions(log_dir)
    return [(p.log_dir, p.broker, p.topic, p.partition, p.path) for p in parts]


def run_snapshots(
    spark: SparkSession,
    log_dir: str,
    expiration_ms: int = DEFAULT_EXPIRATION_MS,
    dry_run: bool = False,
    *,
    output: str | None = None,
) -> int:
    """Rebuild every missing producer snapshot under ``log_dir`` (a log dir or one partition
    folder), one Spark task per partition; return how many were written (dry run: how many
    would be). Each result is logged; with ``output``, also Parquet + an HTML report."""
    tasks = _partition_tasks(log_dir)
    results: list[tuple[Any, ...]] = []
    if tasks:
        rdd = spark.sparkContext.parallelize(tasks, len(tasks))

        def rebuild_all(part: Iterable[PartitionTask]) -> Iterator[tuple[Any, ...]]:
            for task in part:
                yield from rebuild_partition(task, expiration_ms, dry_run)

        results = rdd.mapPartitions(rebuild_all).collect()
    done = "would_write" if dry_run else "written"
    count = 0
    for r in results:
        action, snapshot, entries, detail = r[7], r[3], r[5], r[8]
        if action == done:
            count += 1
            log.info("%s %s (%s entries)", action.replace("_", " "), snapshot, entries)
        else:
            log.warning("%s %s: %s", action, snapshot, detail)
    if output is not None:
        frame = spark.createDataFrame(results, RESULT_SCHEMA)
        table = pd.DataFrame(results, columns=RESULT_SCHEMA.fieldNames())
        counts = table["action"].value_counts().to_dict() if len(table) else {}
        text = (
            f"Log dir: {log_dir}; partitions: {len(tasks)}; producer.id.expiration.ms: "
            f"{expiration_ms}; {'dry run' if dry_run else 'written'}.\n"
            f"Results: {counts or 'no snapshot missing'}."
        )
        write_report(
            output,
            "pidgate snapshots: rebuilt producer snapshots",
            [Section("Summary", text), Section("Snapshots", "", table)],
            {"snapshots": frame},
        )
    return count
