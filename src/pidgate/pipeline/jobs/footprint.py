"""``pidgate analyze footprint``: how many producer-state entries each partition and broker holds.

The driver only lists segment files, grouped by partition; the executors read whole partitions
in one pass (:mod:`pidgate.pipeline.jobs.footprint_scan`: record batch headers only, every CRC-32C
checked) and send back, per file, one row per producer id and one row for the file, and per
partition, one row per producer id (its last write, and whether Kafka still holds it) and the
partition's counts. A corrupt or truncated file is reported (the good batches before the damage
still count) and the other files are processed normally; when no batch at all could be read,
the job raises :class:`~pidgate.pipeline.reading.inputs.InputError` naming the log dirs and what was
found, and writes nothing.

Few Spark jobs, since each costs a fixed 0.3-2 s on a small machine. With a local output and a
local master, ONE (RDDs, no SQL): the tasks parse and write the big tables (``segment_pids``,
``last_writes``, ``active_pids``) themselves, then the rows are hash-partitioned by PID to
count distinct PIDs per broker (:func:`small_rows`, the only shuffle) and the small rows come
back. Otherwise (an ``hdfs://``/``s3a://`` output, a cluster) the parse is cached, that job
collects the small rows, and Spark's writers write the big tables, three jobs at once. The
small tables are computed on the driver with pandas (:func:`partition_footprint`,
:func:`broker_footprint`, :func:`top_partitions`) and written without a job on local paths
(:mod:`pidgate.pipeline.outputs.parquet_tables`).

Kafka's rules (KIP-854): an entry expires when ``now - timestamp >=
producer.id.expiration.ms`` (default 86400000), ``timestamp`` being the max_timestamp of the
PID's last batch, unless a transaction is open; "now" is the partition's newest timestamp.

Memory estimate per ``ProducerStateEntry`` (JDK 17, 64-bit, compressed oops, 8-byte alignment),
counted from the fields of Kafka's ``ProducerStateManager``/``ProducerStateEntry``:
HashMap node 32 + boxed Long key 24 + table slot ~8 + ProducerStateEntry 48 + its ArrayDeque
24 + the deque's Object[17] 88 = 224 bytes, plus one BatchMetadata (40 bytes) per retained
batch, up to ``NUM_BATCHES_TO_RETAIN`` = 5: 264 bytes for an entry just loaded from a snapshot,
424 bytes for a producer that kept writing. We use :data:`ENTRY_BYTES` = 424 (steady state).
An open transaction adds :data:`OPEN_TXN_BYTES` = 152 (an OptionalLong 24, and in
``ongoingTxns`` a TreeMap entry 40, a Long 24, TxnMetadata 32, LogOffsetMetadata 32).
These are estimates of live heap, not measurements.

Must not import another job than its executor-side scan
(:mod:`~pidgate.pipeline.jobs.footprint_scan`), nor ``pidgate.proxy``.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark import RDD, StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pidgate.pipeline.jobs.footprint_scan import (
    BIG_TABLES,
    SCAN_ARROW_SCHEMA,
    SegmentTask,
    count_distinct_pids,
    is_not_segment,
    keyed_by_pid,
    parse_segment,
    scan_slices,
    table_rows,
)
from pidgate.pipeline.outputs.parquet_tables import publish, staging_dir, write_tables
from pidgate.pipeline.outputs.report import Section, is_local_uri, new_figure, write_report
from pidgate.pipeline.reading.inputs import InputError
from pidgate.pipeline.reading.logdirs import discover_partitions, list_segments
from pidgate.pipeline.reading.segments import SNAPSHOT_ENTRY_BYTES, SNAPSHOT_HEADER_BYTES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ACTIVE_PIDS_SCHEMA",
    "BROKERS_SCHEMA",
    "DEFAULT_EXPIRATION_MS",
    "ENTRY_BYTES",
    "ERROR_SCHEMA",
    "LAST_WRITES_SCHEMA",
    "OPEN_TXN_BYTES",
    "PARTITIONS_SCHEMA",
    "SEGMENT_PIDS_SCHEMA",
    "big_tables",
    "broker_footprint",
    "parse_segment",
    "partition_footprint",
    "run_footprint",
    "scan",
    "segment_tasks",
    "small_rows",
    "top_partitions",
]

log = logging.getLogger(__name__)

DEFAULT_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms default (KIP-854)
ENTRY_BYTES = 424
ENTRY_BYTES_MIN = 264
OPEN_TXN_BYTES = 152
SLICE_BYTES = 256 * 1024 * 1024  # ~70 ms of fixed cost per task against ~1 s of parsing

PARTITION_KEYS = ["log_dir", "broker", "topic", "partition"]
_KEYS = [
    StructField("log_dir", StringType(), False),
    StructField("broker", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
]


def _longs(*names: str) -> list[StructField]:
    return [StructField(name, LongType(), False) for name in names]


SEGMENT_PIDS_SCHEMA = StructType(
    [
        *_KEYS,
        StructField("segment", StringType(), False),
        StructField("producer_id", LongType(), False),  # -1: batches without a PID
        StructField("producer_epoch", IntegerType(), False),  # of the PID's last batch here
        *_longs("batches", "bytes"),
        StructField("max_timestamp", LongType(), False),  # max over the PID's batches here
        StructField("last_offset", LongType(), False),  # last offset of its last batch
        StructField("last_timestamp", LongType(), False),  # max_timestamp of its last batch
        StructField("is_transactional", BooleanType(), False),  # of its last batch
        StructField("is_control", BooleanType(), False),  # of its last batch
    ]
)
"""One row per (segment file, producer id): the ``segment_pids`` output."""

LAST_WRITES_SCHEMA = StructType(
    [
        *_KEYS,
        StructField("producer_id", LongType(), False),
        StructField("producer_epoch", IntegerType(), False),
        *_longs("last_offset", "last_timestamp"),
        StructField("txn_open", BooleanType(), False),
        *_longs("batches", "bytes", "partition_newest_timestamp"),
    ]
)
"""One row per (partition, producer id), its last write: the ``last_writes`` output."""

ACTIVE_PIDS_SCHEMA = StructType(
    [*LAST_WRITES_SCHEMA.fields, StructField("age_ms", LongType(), False)]
)
"""The ``last_writes`` rows Kafka still holds, with their age: the ``active_pids`` output."""

ERROR_SCHEMA = StructType(
    [
        *_KEYS,
        StructField("segment", StringType(), False),
        StructField("byte_position", LongType(), True),  # null: the file could not be opened
        StructField("error", StringType(), False),
    ]
)
"""One row per segment file not read to the end: the ``errors`` output."""

PARTITIONS_SCHEMA = StructType(
    [
        *_KEYS,
        *_longs(
            "active_pids",
            "estimated_entries",
            "open_transactions",
            "estimated_bytes",
            "snapshot_bytes",
        ),
    ]
)
"""One row per partition holding active PIDs: the ``partitions`` output."""

BROKERS_SCHEMA = StructType(
    [
        StructField("broker", StringType(), False),
        *_longs(
            "estimated_entries",
            "distinct_pids",
            "partitions",
            "open_transactions",
            "estimated_bytes",
        ),
    ]
)
"""One row per broker holding active PIDs: the ``brokers`` output."""


# ---------------------------------------------------------------------------------------------
# Reading: the driver lists, the executors parse


def segment_tasks(log_dirs: Sequence[str]) -> list[list[SegmentTask]]:
    """The segment files under ``log_dirs``, grouped by partition (in offset order), largest
    partition first (driver side: a directory listing, no file is opened)."""
    sized: list[tuple[int, list[SegmentTask]]] = []
    for log_dir in log_dirs:
        for part in discover_partitions(log_dir):
            segments = list_segments(part.path)
            if segments:
                key = (part.log_dir, part.broker, part.topic, part.partition)
                files = [(*key, s.path) for s in segments]
                sized.append((sum(s.size for s in segments), files))
    sized.sort(key=lambda t: -t[0])
    return [files for _, files in sized]


def _slices(partitions: list[list[SegmentTask]], sizes: list[int], count: int) -> list[list[Any]]:
    """``partitions`` (largest first) spread over ``count`` slices, each to the lightest."""
    slices: list[list[Any]] = [[] for _ in range(count)]
    loads = [0] * count
    for files, size in zip(partitions, sizes, strict=True):
        lightest = loads.index(min(loads))
        slices[lightest].append(files)
        loads[lightest] += size
    return slices


def scan(
    spark: SparkSession,
    partitions: list[list[SegmentTask]],
    expiration_ms: int = DEFAULT_EXPIRATION_MS,
    verify_crc: bool = True,
    write_dir: str | None = None,
) -> RDD[tuple[Any, ...]]:
    """Parse the partitions on the executors: an RDD of rows in
    :data:`~pidgate.pipeline.jobs.footprint_scan.SCAN_ARROW_SCHEMA` order, ``segment``/``file``
    per file, ``pid``/``partition`` per partition (no shuffle). With ``write_dir`` the tasks
    write the big tables there and leave out the ``segment`` rows.

    Spark tasks: one per ``SLICE_BYTES`` of input, at least two per core, at most one per
    partition; partitions go largest first to the lightest slice. Each task gets only its
    slice number; the slices travel in the function's closure.
    """
    sc = spark.sparkContext
    sizes = [sum(Path(f[4]).stat().st_size for f in files) for files in partitions]
    by_size = -(-sum(sizes) // SLICE_BYTES)
    count = max(1, min(len(partitions), max(2 * sc.defaultParallelism, by_size), 10_000))
    slices = _slices(partitions, sizes, count)
    parse = scan_slices(slices, expiration_ms, verify_crc, write_dir)
    return sc.parallelize(range(count), count).mapPartitions(parse)


def small_rows(spark: SparkSession, scanned: RDD[tuple[Any, ...]]) -> pd.DataFrame:
    """What the driver collects: the ``file`` and ``partition`` rows, and the distinct PIDs
    (``broker`` and ``overall`` rows, to be summed), counted over the ``pid`` rows
    hash-partitioned by producer id (one shuffle)."""
    keyed = scanned.filter(is_not_segment).map(keyed_by_pid)
    parts = max(1, spark.sparkContext.defaultParallelism)
    rows = keyed.partitionBy(parts).mapPartitions(count_distinct_pids).collect()
    return pd.DataFrame(rows, columns=SCAN_ARROW_SCHEMA.names)


def big_tables(spark: SparkSession, scanned: RDD[tuple[Any, ...]]) -> dict[str, DataFrame]:
    """The big tables from the scan's rows, for Spark's writer."""
    schemas = {
        "segment_pids": SEGMENT_PIDS_SCHEMA,
        "last_writes": LAST_WRITES_SCHEMA,
        "active_pids": ACTIVE_PIDS_SCHEMA,
    }
    return {
        name: spark.createDataFrame(scanned.flatMap(table_rows(name)), schemas[name])
        for name in BIG_TABLES
    }


def check_read(log_dirs: Sequence[str], files: pd.DataFrame) -> None:
    """Raise :class:`InputError` unless at least one batch was read."""
    if int(files["batches"].sum()) > 0:
        return
    failed = files[files["error"].notna()]
    unreadable = int(failed["byte_position"].isna().sum())
    found = (
        f"{len(files)} segment files, none with a readable batch ({unreadable} unreadable, "
        f"{len(failed) - unreadable} damaged, {len(files) - len(failed)} empty)"
    )
    first = failed.iloc[0] if len(failed) else None
    example = f"; first: {first['segment']}: {first['error']}" if first is not None else ""
    hint = "; on a cluster every executor must see the log dirs under the same path"
    raise InputError(
        f"--log-dirs {' '.join(log_dirs)}: {found}{example}; nothing to report"
        + (hint if unreadable else "")
    )


# ---------------------------------------------------------------------------------------------
# Driver side, pandas: the small tables


def partition_footprint(counts: pd.DataFrame) -> pd.DataFrame:
    """Per partition holding active PIDs (from the ``partition`` rows): active PIDs
    (= ProducerStateManager entries), open transactions, estimated heap bytes and the size a
    snapshot of them takes."""
    rows = counts[counts["active_pids"] > 0]
    active = rows["active_pids"].astype("int64")
    txns = rows["open_transactions"].astype("int64")
    table = pd.DataFrame(
        {
            "log_dir": rows["log_dir"],
            "broker": rows["broker"],
            "topic": rows["topic"],
            "partition": rows["partition"].astype("int32"),
            "active_pids": active,
            "estimated_entries": active,
            "open_transactions": txns,
            "estimated_bytes": active * ENTRY_BYTES + txns * OPEN_TXN_BYTES,
            "snapshot_bytes": SNAPSHOT_HEADER_BYTES + active * SNAPSHOT_ENTRY_BYTES,
        }
    )
    return table.sort_values(["log_dir", "topic", "partition"]).reset_index(drop=True)


def broker_footprint(partitions: pd.DataFrame, small: pd.DataFrame) -> pd.DataFrame:
    """Per broker: entries over all its partitions (each PID counts once per partition it
    wrote to, as the broker holds one entry per partition), distinct active PIDs (the
    ``broker`` rows of :func:`small_rows`), partitions holding any, open transactions,
    estimated heap bytes; most entries first."""
    table = partitions.groupby("broker", as_index=False).agg(
        estimated_entries=("estimated_entries", "sum"),
        partitions=("partition", "size"),
        open_transactions=("open_transactions", "sum"),
    )
    per_broker = (
        small[small["kind"] == "broker"]
        .groupby("broker", as_index=False)
        .agg(distinct_pids=("distinct_active_pids", "sum"))
    )
    table = table.merge(per_broker, on="broker")
    table["estimated_bytes"] = (
        table["estimated_entries"] * ENTRY_BYTES + table["open_transactions"] * OPEN_TXN_BYTES
    )
    names = BROKERS_SCHEMA.fieldNames()
    table = table.astype({name: "int64" for name in names[1:]})
    table = table.sort_values(["estimated_entries", "broker"], ascending=[False, True])
    return table[names].reset_index(drop=True)


def top_partitions(partitions: pd.DataFrame, n: int = 20) -> pd.DataFrame:
    """The ``n`` partitions with the most active PIDs."""
    ranked = partitions.sort_values(
        ["active_pids", "topic", "partition", "log_dir"], ascending=[False, True, True, True]
    )
    return ranked.head(n).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Entry point


def _bar(labels: list[str], values: list[float], title: str, xlabel: str) -> Figure:
    fig = new_figure(figsize=(8, max(2.0, 0.3 * len(labels) + 1)))
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
    executor_writes: bool | None = None,
) -> Path:
    """Parse ``log_dirs`` on the executors, write ``segment_pids``, ``last_writes``,
    ``active_pids``, ``partitions``, ``brokers`` and ``errors`` as Parquet under ``output`` and
    a report; return the report's path. Raises :class:`InputError`, writing nothing, when the
    log dirs hold no segment file or no batch could be read from any.

    ``executor_writes`` (default: when ``output`` is local and the master is ``local``): the
    tasks write the big tables themselves with pyarrow during the parse, into a directory
    beside ``output`` moved into place at the end; otherwise the parse is cached and Spark's
    writers write them (any Hadoop URI), three jobs at once."""
    partitions = segment_tasks(log_dirs)
    if not partitions:
        folders = sum(len(discover_partitions(d)) for d in log_dirs)
        raise InputError(
            f"--log-dirs {' '.join(log_dirs)}: no segment file (<20-digit offset>.log) in "
            f"{folders} partition folders; nothing to report"
        )
    if executor_writes is None:
        master = spark.sparkContext.master or ""
        executor_writes = is_local_uri(output) and master.startswith("local")
    staging = staging_dir(output) if executor_writes else None
    write_dir = str(staging) if staging is not None else None
    scanned = scan(spark, partitions, expiration_ms, verify_crc, write_dir)
    if staging is None:  # the Spark writers read the big tables from the cache
        scanned = scanned.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # One job parses every file (and, with executor writes, writes the big tables); only
        # the file and partition rows and the distinct counts come back.
        small = small_rows(spark, scanned)
        files = small[small["kind"] == "file"].astype({"byte_position": "Int64"})
        check_read(log_dirs, files)
        errors = files[files["error"].notna()][ERROR_SCHEMA.fieldNames()]
        for row in errors.head(1000).itertuples(index=False):
            log.warning(
                "unreadable segment %s at byte %s: %s", row.segment, row.byte_position, row.error
            )
        table = partition_footprint(small[small["kind"] == "partition"])
        brokers = broker_footprint(table, small)
        written = write_tables(
            spark,
            output,
            {
                "partitions": (table, PARTITIONS_SCHEMA),
                "brokers": (brokers, BROKERS_SCHEMA),
                "errors": (errors, ERROR_SCHEMA),
            },
            {} if staging else big_tables(spark, scanned),
        )
        if staging is not None:
            written += publish(staging, output, [f"{name}.parquet" for name in BIG_TABLES])
        sections = _sections(
            log_dirs,
            expiration_ms,
            files,
            int(small["pid_partitions"].sum()),
            int(small["distinct_pids"].sum()),
            int(table["estimated_entries"].sum()),
            brokers,
            top_partitions(table, top_n),
            errors,
        )
        sections.append(Section("Outputs", "Parquet, next to this report: " + ", ".join(written)))
        title = "pidgate footprint: producer-state entries per partition and broker"
        return write_report(output, title, sections, {})
    finally:
        if staging is None:
            scanned.unpersist()
        else:
            shutil.rmtree(staging, ignore_errors=True)


def _sections(
    log_dirs: list[str],
    expiration_ms: int,
    files: pd.DataFrame,
    pid_partitions: int,
    pids: int,
    active_total: int,
    brokers_pd: pd.DataFrame,
    top_pd: pd.DataFrame,
    errors_pd: pd.DataFrame,
) -> list[Section]:
    unreadable = int(errors_pd["byte_position"].isna().sum())
    summary = (
        f"Log dirs: {', '.join(log_dirs)}\n"
        f"Segment files: {len(files)} ({int(files['bytes'].sum()) / 1e6:.1f} MB in "
        f"{int(files['batches'].sum())} batches read), every batch CRC-checked.\n"
        f"Producer ids seen: {pids} distinct, {pid_partitions} (PID, partition) pairs.\n"
        f"Active entries (last write within producer.id.expiration.ms = {expiration_ms} ms of "
        f"the partition's newest timestamp, or transaction open): {active_total}.\n"
        f"Estimated ProducerStateManager heap: {active_total * ENTRY_BYTES / 1e6:.2f} MB "
        f"(+ open transactions), at {ENTRY_BYTES} bytes per entry.\n"
        f"Segment files not read to the end: {len(errors_pd)} ({len(errors_pd) - unreadable} "
        f"damaged, {unreadable} unreadable)."
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
