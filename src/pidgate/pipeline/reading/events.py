"""The PID event log as a Spark DataFrame: its schema and a tolerant reader.

The proxy appends one JSON object per line (DESIGN.md "Event log and the Spark pipeline"):
``admitted_new`` (a PID activated by a Produce request), ``rejected`` (a PID of a throttled
request) and ``init_producer_id`` (the cluster handed a PID to a principal). Events of one
Produce request share ``(instance, request_id)``. Files may be gzip (``.gz``, detected by Spark
from the extension) and rotated; a path may be a file, a directory (read recursively) or a glob,
on any Hadoop filesystem, or an explicit list of files (what :mod:`pidgate.pipeline.reading.inputs`
makes of a local path).

Reading never fails on data: unknown fields are ignored, and a line that is not JSON, has a field
of the wrong type or lacks ``ts_ms`` / ``event`` / ``principal`` is dropped and counted
(:func:`read_events_checked`).

Must not import a job, ``outputs`` or ``spark``: every other pipeline room imports ``reading``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pidgate.pipeline.reading.schemas import spark_struct

__all__ = [
    "ACTIVITY_COLUMNS",
    "ADMITTED_GRANDFATHERED",
    "ADMITTED_NEW",
    "BAD",
    "EVENT_SCHEMA",
    "EVENT_TYPES",
    "INIT_PRODUCER_ID",
    "REJECTED",
    "hour_of",
    "read_events",
    "read_events_checked",
    "read_events_marked",
]

ADMITTED_NEW = "admitted_new"
#: Admitted without a token: allocated before the principal's enforcement began (grandfathered).
ADMITTED_GRANDFATHERED = "admitted_grandfathered"
REJECTED = "rejected"
INIT_PRODUCER_ID = "init_producer_id"
EVENT_TYPES = (ADMITTED_NEW, ADMITTED_GRANDFATHERED, REJECTED, INIT_PRODUCER_ID)

#: Every field the proxy writes. Absent fields are null (``throttle_ms`` only on ``rejected``,
#: ``transactional`` only on ``init_producer_id``).
EVENT_SCHEMA = spark_struct(
    "ts_ms bigint, event string, principal string, producer_id bigint, producer_epoch int, "
    "client_id string, client_software string, topic string, partition int, node_id int, "
    "instance string, throttle_ms bigint, tokens double, request_id bigint, "
    "transactional boolean"
)

_CORRUPT = "_corrupt_record"
_REQUIRED = ("ts_ms", "event", "principal")


def hour_of(ts_ms: Column) -> Column:
    """The UTC hour (a timestamp) an epoch-millisecond column falls in."""
    return F.date_trunc("hour", F.timestamp_millis(ts_ms))


def _read_raw(
    spark: SparkSession, path: str | Sequence[str], columns: Sequence[str] | None = None
) -> DataFrame:
    fields = [f for f in EVENT_SCHEMA.fields if columns is None or f.name in columns]
    schema = StructType([*fields, StructField(_CORRUPT, StringType())])
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


#: The columns the activity job reads (parsing fewer fields of each line is faster).
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


BAD = "bad"


def read_events_marked(
    spark: SparkSession, path: str | Sequence[str], columns: Sequence[str] = ACTIVITY_COLUMNS
) -> DataFrame:
    """Every line under ``path`` with ``columns`` (only those fields are parsed) and a boolean
    :data:`BAD` column, true for a line :func:`read_events` would drop (its other columns are
    then null), so one pass can both count bad lines and use the good ones."""
    for name in _REQUIRED:
        if name not in columns:
            raise ValueError(f"columns must include {name!r}")
    raw = _read_raw(spark, path, columns)
    bad = ~_is_good()
    return raw.select(bad.alias(BAD), *[F.when(~F.col(BAD), F.col(c)).alias(c) for c in columns])
