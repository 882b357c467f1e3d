"""``pidgate analyze footprint``: how many producer-state entries each partition and broker holds.

Reads broker log directories, distributing the parsing across executors BY FILE: the driver only
lists segment files; an RDD of file paths is parsed on the executors with
:func:`pidgate.pipeline.segments.iter_segment` (record batch headers only, every CRC-32C
checked) and each file comes back pre-aggregated as one row per producer id seen in it (plus one
row for batches without a PID), never as raw batches. A corrupt or truncated file yields an
error row naming it (the good batches before the damage still count) and the other files are
processed normally.

Pure transforms (DataFrame -> DataFrame):

- :func:`last_write_per_pid`: per partition and PID, the PID's last batch (highest offset):
  epoch, offset, timestamp, and whether it leaves a transaction open; plus the partition's
  newest timestamp (max over all its batches, with or without PID; batch timestamps may be out
  of order);
- :func:`active_pids`: PIDs the broker would still hold: ``newest - last_timestamp <
  expiration_ms`` (Kafka expires an entry when ``now - timestamp >= producer.id.expiration.ms``,
  KIP-854, default 86400000), or a transaction still open (Kafka never expires those); the
  reference "now" is the partition's newest timestamp;
- :func:`partition_footprint`, :func:`broker_footprint`, :func:`top_partitions`.

Memory estimate per ``ProducerStateEntry`` (JDK 17, 64-bit, compressed oops, 8-byte alignment),
counted from the fields of Kafka's ``ProducerStateManager``/``ProducerStateEntry``:
HashMap node 32 + boxed Long key 24 + table slot ~8 + ProducerStateEntry 48 + its ArrayDeque
24 + the deque's Object[17] 88 = 224 bytes, plus one BatchMetadata (40 bytes) per retained
batch, up to ``NUM_BATCHES_TO_RETAIN`` = 5: 264 bytes for an entry just loaded from a snapshot,
424 bytes for a producer that kept writing. We use :data:`ENTRY_BYTES` = 424 (steady state).
An open transaction adds :data:`OPEN_TXN_BYTES` = 152 (an OptionalLong 24, and in
``ongoingTxns`` a TreeMap entry 40, a Long 24, TxnMetadata 32, LogOffsetMetadata 32).
These are estimates of live heap, not measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from matplotlib.figure import Figure
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pidgate.pipeline.logdirs import discover_partitions, list_segments
from pidgate.pipeline.report import Section, write_report
from pidgate.pipeline.segments import (
    SNAPSHOT_ENTRY_BYTES,
    SNAPSHOT_HEADER_BYTES,
    SegmentError,
    iter_segment,
)

__all__ = [
    "DEFAULT_EXPIRATION_MS",
    "ENTRY_BYTES",
    "ERROR_SCHEMA",
    "OPEN_TXN_BYTES",
    "SEGMENT_PIDS_SCHEMA",
    "active_pids",
    "broker_footprint",
    "last_write_per_pid",
    "parse_segment",
    "parse_segments",
    "partition_footprint",
    "run_footprint",
    "segment_tasks",
    "top_partitions",
]

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms default (KIP-854)
ENTRY_BYTES = 424
ENTRY_BYTES_MIN = 264
OPEN_TXN_BYTES = 152
SLICE_BYTES = 64 * 1024 * 1024

PARTITION_KEYS = ["log_dir", "broker", "topic", "partition"]

SEGMENT_PIDS_SCHEMA = StructType(
    [
        StructField("log_dir", StringType(), False),
        StructField("broker", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("segment", StringType(), False),
        StructField("producer_id", LongType(), False),  # -1: batches without a PID
        StructField("producer_epoch", IntegerType(), False),  # of the PID's last batch here
        StructField("batches", LongType(), False),
        StructField("bytes", LongType(), False),
        StructField("max_timestamp", LongType(), False),  # max over the PID's batches here
        StructField("last_offset", LongType(), False),  # last offset of its last batch
        StructField("last_timestamp", LongType(), False),  # max_timestamp of its last batch
        StructField("is_transactional", BooleanType(), False),  # of its last batch
        StructField("is_control", BooleanType(), False),  # of its last batch
    ]
)
"""One row per (segment file, producer id): what the executors send back."""

ERROR_SCHEMA = StructType(
    [
        StructField("log_dir", StringType(), False),
        StructField("broker", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("segment", StringType(), False),
        StructField("byte_position", LongType(), True),
        StructField("error", StringType(), False),
    ]
)

_PARSED_SCHEMA = StructType(
    [
        *SEGMENT_PIDS_SCHEMA.fields[:5],
        *[StructField(f.name, f.dataType, True) for f in SEGMENT_PIDS_SCHEMA.fields[5:]],
        StructField("byte_position", LongType(), True),
        StructField("error", StringType(), True),
    ]
)

SegmentTask = tuple[str, str, str, int, str]
"""(log_dir, broker, topic, partition, segment path)."""


# ---------------------------------------------------------------------------------------------
# Executor side: one segment file -> rows


def parse_segment(task: SegmentTask, verify_crc: bool = True) -> list[tuple[Any, ...]]:
    """Rows (in ``_PARSED_SCHEMA`` order) for one segment file: one per producer id seen (and
    ``producer_id`` -1 for batches without one), then an error row if the file is damaged."""
    log_dir, broker, topic, partition, path = task
    # pid -> [epoch, batches, bytes, max_ts, last_offset, last_ts, txn, control]
    per_pid: dict[int, list[Any]] = {}
    error: tuple[int | None, str] | None = None
    try:
        for batch in iter_segment(path, verify_crc=verify_crc, markers=False):
            h = batch.header
            last_offset = h.base_offset + h.last_offset_delta
            size = h.batch_length + 12
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
    out: list[tuple[Any, ...]] = [
        (log_dir, broker, topic, partition, path, pid, *values, None, None)
        for pid, values in per_pid.items()
    ]
    if error is not None:
        out.append((log_dir, broker, topic, partition, path, *([None] * 9), error[0], error[1]))
    return out


def segment_tasks(log_dirs: Sequence[str]) -> list[tuple[SegmentTask, int]]:
    """Every segment file under ``log_dirs`` with its size, largest first (driver side: a
    directory listing, no file is opened)."""
    tasks: list[tuple[SegmentTask, int]] = []
    for log_dir in log_dirs:
        for part in discover_partitions(log_dir):
            for segment in list_segments(part.path):
                task = (part.log_dir, part.broker, part.topic, part.partition, segment.path)
                tasks.append((task, segment.size))
    tasks.sort(key=lambda t: -t[1])
    return tasks


def parse_segments(
    spark: SparkSession,
    tasks: Sequence[SegmentTask],
    verify_crc: bool = True,
    total_bytes: int | None = None,
) -> DataFrame:
    """Parse the files on the executors: a DataFrame of ``SEGMENT_PIDS_SCHEMA`` columns plus
    nullable ``byte_position``/``error``.

    Spark partitions: one per ``SLICE_BYTES`` of input, at least two per core, at most one
    per file; ``tasks`` (largest first) are dealt round-robin so every slice gets a similar
    mix of big and small files.
    """
    if not tasks:
        return spark.createDataFrame([], _PARSED_SCHEMA)
    sc = spark.sparkContext
    by_size = -(-(total_bytes or 0) // SLICE_BYTES)
    slices = max(1, min(len(tasks), max(2 * sc.defaultParallelism, by_size), 10_000))
    dealt = [task for k in range(slices) for task in tasks[k::slices]]
    rdd = sc.parallelize(dealt, slices)

    def parse_all(part: Iterable[SegmentTask]) -> Iterator[tuple[Any, ...]]:
        for task in part:
            yield from parse_segment(task, verify_crc)

    return spark.createDataFrame(rdd.mapPartitions(parse_all), _PARSED_SCHEMA)


def split_parsed(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(segment_pids, errors) from :func:`parse_segments`' output."""
    ok = parsed.where(F.col("error").isNull()).select(*SEGMENT_PIDS_SCHEMA.fieldNames())
    errors = parsed.where(F.col("error").isNotNull()).select(*ERROR_SCHEMA.fieldNames())
    return ok, errors


# ---------------------------------------------------------------------------------------------
# Pure transforms


def last_write_per_pid(segment_pids: DataFrame) -> DataFrame:
    """Per partition and producer id: its last batch (highest offset) and the partition's newest
    timestamp. Columns: log_dir, broker, topic, partition, producer_id, producer_epoch,
    last_offset, last_timestamp, txn_open, batches, bytes, partition_newest_timestamp."""
    newest = segment_pids.groupBy(*PARTITION_KEYS).agg(
        F.max("max_timestamp").alias("partition_newest_timestamp")
    )
    last = (
        segment_pids.where(F.col("producer_id") >= 0)
        .groupBy(*PARTITION_KEYS, "producer_id")
        .agg(
            F.max(
                F.struct(
                    "last_offset",
                    "last_timestamp",
                    "producer_epoch",
                    "is_transactional",
                    "is_control",
                )
            ).alias("last"),
            F.sum("batches").alias("batches"),
            F.sum("bytes").alias("bytes"),
        )
    )
    return last.join(newest, PARTITION_KEYS).select(
        *PARTITION_KEYS,
        "producer_id",
        F.col("last.producer_epoch").alias("producer_epoch"),
        F.col("last.last_offset").alias("last_offset"),
        F.col("last.last_timestamp").alias("last_timestamp"),
        (F.col("last.is_transactional") & ~F.col("last.is_control")).alias("txn_open"),
        "batches",
        "bytes",
        "partition_newest_timestamp",
    )


def active_pids(last_writes: DataFrame, expiration_ms: int = DEFAULT_EXPIRATION_MS) -> DataFrame:
    """The entries a broker keeps: ``age_ms = partition_newest_timestamp - last_timestamp <
    expiration_ms`` (an age of exactly ``expiration_ms`` is expired, as in Kafka's
    ``isProducerExpired``) or an open transaction. Adds ``age_ms``."""
    age = F.col("partition_newest_timestamp") - F.col("last_timestamp")
    return last_writes.withColumn("age_ms", age).where(
        F.col("txn_open") | (F.col("age_ms") < F.lit(expiration_ms))
    )


def partition_footprint(active: DataFrame) -> DataFrame:
    """Per partition: active PIDs (= ProducerStateManager entries), open transactions, estimated
    heap bytes and the size a snapshot of them takes."""
    entries = F.count(F.lit(1))
    open_txns = F.sum(F.col("txn_open").cast("long"))
    return (
        active.groupBy(*PARTITION_KEYS)
        .agg(entries.alias("active_pids"), open_txns.alias("open_transactions"))
        .select(
            *PARTITION_KEYS,
            "active_pids",
            F.col("active_pids").alias("estimated_entries"),
            "open_transactions",
            (
                F.col("active_pids") * F.lit(ENTRY_BYTES)
                + F.col("open_transactions") * F.lit(OPEN_TXN_BYTES)
            ).alias("estimated_bytes"),
            (F.lit(SNAPSHOT_HEADER_BYTES) + F.col("active_pids") * SNAPSHOT_ENTRY_BYTES).alias(
                "snapshot_bytes"
            ),
        )
    )


def broker_footprint(active: DataFrame) -> DataFrame:
    """Per broker: entries over all its partitions (each PID counts once per partition it
    wrote to, as the broker holds one entry per partition), distinct PIDs, partitions holding
    any, open transactions, estimated heap bytes."""
    partitions = F.countDistinct("log_dir", "topic", "partition")
    return (
        active.groupBy("broker")
        .agg(
            F.count(F.lit(1)).alias("estimated_entries"),
            F.countDistinct("producer_id").alias("distinct_pids"),
            partitions.alias("partitions"),
            F.sum(F.col("txn_open").cast("long")).alias("open_transactions"),
        )
        .withColumn(
            "estimated_bytes",
            F.col("estimated_entries") * F.lit(ENTRY_BYTES)
            + F.col("open_transactions") * F.lit(OPEN_TXN_BYTES),
        )
        .orderBy(F.desc("estimated_entries"), "broker")
    )


def top_partitions(partitions: DataFrame, n: int = 20) -> DataFrame:
    """The ``n`` partitions with the most active PIDs."""
    return partitions.orderBy(F.desc("active_pids"), "topic", "partition", "log_dir").limit(n)


# ---------------------------------------------------------------------------------------------
# Entry point


def _bar(labels: list[str], values: list[float], title: str, xlabel: str) -> Figure:
    fig = Figure(figsize=(8, max(2.0, 0.3 * len(labels) + 1)))
    ax = fig.add_subplot(1, 1, 1)
    ax.barh(labels[::-1], values[::-1], color="#4a7ab5")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    return fig


def run_footprint(
    spark: SparkSession,
    log_dirs: list[str],
    expiration_ms: int = DEFAULT_EXPIRATION_MS,
    output: str = "footprint-output",
    *,
    verify_crc: bool = True,
    top_n: int = 20,
) -> Path:
    """Parse ``log_dirs`` on the executors, write ``segment_pids``, ``last_writes``,
    ``active_pids``, ``partitions``, ``brokers`` and ``errors`` as Parquet under ``output`` and
    a report; return the report's path."""
    listed = segment_tasks(log_dirs)
    total_bytes = sum(size for _, size in listed)
    parsed = parse_segments(spark, [task for task, _ in listed], verify_crc, total_bytes)
    parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    segment_pids, errors = split_parsed(parsed)
    last_writes = last_write_per_pid(segment_pids).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        active = active_pids(last_writes, expiration_ms)
        partitions = partition_footprint(active)
        brokers = broker_footprint(active)
        top = top_partitions(partitions, top_n)

        brokers_pd: pd.DataFrame = brokers.toPandas()
        top_pd: pd.DataFrame = top.toPandas()
        errors_pd: pd.DataFrame = errors.limit(1000).toPandas()
        for row in errors_pd.itertuples(index=False):
            log.warning(
                "unreadable segment %s at byte %s: %s", row.segment, row.byte_position, row.error
            )
        totals = last_writes.agg(
            F.count(F.lit(1)).alias("pid_partitions"),
            F.countDistinct("producer_id").alias("pids"),
        ).first()
        active_total = int(brokers_pd["estimated_entries"].sum()) if len(brokers_pd) else 0
        sections = _sections(
            log_dirs,
            expiration_ms,
            len(listed),
            total_bytes,
            int(totals["pid_partitions"]) if totals else 0,
            int(totals["pids"]) if totals else 0,
            active_total,
            brokers_pd,
            top_pd,
            errors_pd,
        )
        return write_report(
            output,
            "pidgate footprint: producer-state entries per partition and broker",
            sections,
            {
                "segment_pids": segment_pids,
                "last_writes": last_writes,
                "active_pids": active,
                "partitions": partitions,
                "brokers": brokers,
                "errors": errors,
            },
        )
    finally:
        parsed.unpersist()
        last_writes.unpersist()


def _sections(
    log_dirs: list[str],
    expiration_ms: int,
    files: int,
    total_bytes: int,
    pid_partitions: int,
    pids: int,
    active_total: int,
    brokers_pd: pd.DataFrame,
    top_pd: pd.DataFrame,
    errors_pd: pd.DataFrame,
) -> list[Section]:
    summary = (
        f"Log dirs: {', '.join(log_dirs)}\n"
        f"Segment files: {files} ({total_bytes / 1e6:.1f} MB), every batch CRC-checked.\n"
        f"Producer ids seen: {pids} distinct, {pid_partitions} (PID, partition) pairs.\n"
        f"Active entries (last write within producer.id.expiration.ms = {expiration_ms} ms of "
        f"the partition's newest timestamp, or transaction open): {active_total}.\n"
        f"Estimated ProducerStateManager heap: {active_total * ENTRY_BYTES / 1e6:.2f} MB "
        f"(+ open transactions), at {ENTRY_BYTES} bytes per entry.\n"
        f"Unreadable segment files: {len(errors_pd)}."
    )
    method = (
        "Reference time: a partition's newest batch max_timestamp (not the wall clock), so the "
        "result does not depend on when the job runs. Kafka's rule: an entry expires when "
        "now - timestamp >= producer.id.expiration.ms, where timestamp is the max_timestamp of "
        "the PID's last batch, unless it has an open transaction.\n"
        f"Per-entry heap estimate: {ENTRY_BYTES_MIN} bytes with one retained batch, "
        f"{ENTRY_BYTES} with the 5 Kafka retains (JDK 17, compressed oops: HashMap node 32, "
        "Long key 24, table slot ~8, ProducerStateEntry 48, ArrayDeque 24 + Object[17] 88, "
        f"BatchMetadata 40 each); open transaction +{OPEN_TXN_BYTES}. Snapshot on disk: "
        f"{SNAPSHOT_HEADER_BYTES} + {SNAPSHOT_ENTRY_BYTES} bytes per entry."
    )
    sections = [Section("Summary", summary)]
    broker_fig = None
    if not brokers_pd.empty:
        broker_fig = _bar(
            [str(b) for b in brokers_pd["broker"]],
            [float(v) / 1e6 for v in brokers_pd["estimated_bytes"]],
            "Estimated producer-state heap per broker",
            "MB",
        )
    sections.append(Section("Brokers", "", brokers_pd, broker_fig))
    top_fig = None
    if not top_pd.empty:
        top_fig = _bar(
            [f"{t}-{p}" for t, p in zip(top_pd["topic"], top_pd["partition"], strict=True)],
            [float(v) for v in top_pd["active_pids"]],
            "Partitions with the most active producer ids",
            "active PIDs",
        )
    sections.append(Section("Top partitions", "", top_pd, top_fig))
    error_text = (
        "Files that could not be read to the end. Batches before the damage are counted; the "
        "other files were processed normally."
        if not errors_pd.empty
        else "Every segment file was read to the end with valid CRCs."
    )
    sections.append(Section("Unreadable segment files", error_text, errors_pd))
    sections.append(Section("Method", method))
    return sections
