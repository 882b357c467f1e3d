"""The PID event log as a Spark DataFrame: its schema and a tolerant reader.

The proxy appends one JSON object per line (DESIGN.md "Event log and the Spark pipeline"):
``admitted_new`` (a PID activated by a Produce request), ``rejected`` (a PID of a throttled
request) and ``init_producer_id`` (the cluster handed a PID to a principal). Events of one
Produce request share ``(instance, request_id)``. Files may be gzip (``.gz``, detected by Spark
from the extension) and rotated; a path may be a file, a directory (read recursively) or a glob,
on any Hadoop filesystem, or an explicit list of files (what :mod:`pidgate.pipeline.inputs`
makes of a local path).

Reading never fails on data: unknown fields are ignored, and a line that is not JSON, has a field
of the wrong type or lacks ``ts_ms`` / ``event`` / ``principal`` is dropped and counted
(:func:`read_events_checked`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

__all__ = [
    "ADMITTED_NEW",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "INIT_PRODUCER_ID",
    "REJECTED",
    "hour_of",
    "read_events",
    "read_events_cached",
    "read_events_checked",
]

ADMITTED_NEW = "admitted_new"
REJECTED = "rejected"
INIT_PRODUCER_ID = "init_producer_id"
EVENT_TYPES = (ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID)

#: Every field the proxy writes. Absent fields are null (``throttle_ms`` only on ``rejected``,
#: ``transactional`` only on ``init_producer_id``).
EVENT_SCHEMA = StructType(
    [
        StructField("ts_ms", LongType()),
        StructField("event", StringType()),
        StructField("principal", StringType()),
        StructField("producer_id", LongType()),
        StructField("producer_epoch", IntegerType()),
        StructField("client_id", StringType()),
        StructField("client_software", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("node_id", IntegerType()),
        StructField("instance", StringType()),
        StructField("throttle_ms", LongType()),
        StructField("tokens", DoubleType()),
        StructField("request_id", LongType()),
        StructField("transactional", BooleanType()),
    ]
)

_CORRUPT = "_corrupt_record"
_REQUIRED = ("ts_ms", "event", "principal")


def hour_of(ts_ms: Column) -> Column:
    """The UTC hour (a timestamp) an epoch-millisecond column falls in."""
    return F.date_trunc("hour", F.timestamp_millis(ts_ms))


def _read_raw(spark: SparkSession, path: str | Sequence[str]) -> DataFrame:
    schema = StructType([*EVENT_SCHEMA.fields, StructField(_CORRUPT, StringType())])
    reader = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", _CORRUPT)
    )
    if not isinstance(path, str):
        # Explicit files (pipeline.inputs.event_files listed them): nothing to expand.
        return reader.json(list(path))
    if not any(ch in path for ch in "*?[{"):
        # A directory of rotated files, maybe in per-instance subdirectories. (With a glob,
        # Spark expands it itself and recursion would only get in the way.)
        reader = reader.option("recursiveFileLookup", "true")
    return reader.json(path)


def _is_good() -> Column:
    good = F.col(_CORRUPT).isNull()
    for name in _REQUIRED:
        good = good & F.col(name).isNotNull()
    return good


def read_events(spark: SparkSession, path: str | Sequence[str]) -> DataFrame:
    """The well-formed events under ``path`` with :data:`EVENT_SCHEMA`'s columns; bad lines are
    dropped (use :func:`read_events_checked` to count them)."""
    raw = _read_raw(spark, path)
    return raw.filter(_is_good()).select(*EVENT_SCHEMA.fieldNames())


def read_events_checked(spark: SparkSession, path: str | Sequence[str]) -> tuple[DataFrame, int]:
    """Like :func:`read_events`, plus the number of bad lines (one extra pass over the input,
    reading only the fields the check needs)."""
    raw = _read_raw(spark, path)
    # Spark refuses queries that reference only the corrupt-record column of raw JSON, so the
    # count references the required fields as well.
    bad = raw.filter(~_is_good()).count()
    return raw.filter(_is_good()).select(*EVENT_SCHEMA.fieldNames()), bad


#: The columns the activity job needs (the slimmer the cache, the faster every later pass).
ACTIVITY_COLUMNS = (
    "ts_ms",
    "event",
    "principal",
    "producer_id",
    "client_id",
    "instance",
    "request_id",
    "throttle_ms",
)


def read_events_cached(
    spark: SparkSession,
    path: str | Sequence[str],
    since_ms: int | None = None,
    until_ms: int | None = None,
    columns: Sequence[str] = ACTIVITY_COLUMNS,
) -> tuple[DataFrame, int, int, DataFrame]:
    """Parse the JSON once: the well-formed events in ``[since_ms, until_ms)`` with only
    ``columns`` (read from a cache, memory spilling to disk, for the caller's later passes),
    the number of bad lines, the number of events kept, and the cached DataFrame, which the
    caller unpersists when done."""
    raw = _read_raw(spark, path)
    ts = F.col("ts_ms")
    keep = F.lit(True)
    if since_ms is not None:
        keep = keep & (ts >= F.lit(since_ms))
    if until_ms is not None:
        keep = keep & (ts < F.lit(until_ms))
    marked = raw.select(
        _is_good().alias("_good"), keep.alias("_keep"), *[F.col(c) for c in columns]
    ).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        counts = (
            marked.groupBy()
            .agg(
                F.count(F.when(~F.col("_good"), True)).alias("bad"),
                F.count(F.when(F.col("_good") & F.col("_keep"), True)).alias("kept"),
            )
            .collect()[0]
        )
    except BaseException:
        marked.unpersist()
        raise
    events = marked.filter(F.col("_good") & F.col("_keep")).select(*columns)
    return events, int(counts["bad"] or 0), int(counts["kept"] or 0), marked
