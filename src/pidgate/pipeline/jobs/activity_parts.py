"""The activity job's counts from the event facts in one shuffle, reduced in Arrow.

Why: the facts of a real log are nearly all distinct (10M generated events: 4.0M facts from
the splits, 4.0M after merging), so caching them for the job's several aggregations cost more
than computing them (18 s of a 78 s run). Instead the facts are shuffled once, so that every
fact of one (principal, hour), and every fact of one (principal, PID), meets in one task, and
each task reduces its share in Arrow to *parts*, which are small:

* :data:`HOURLY`: per (``bad``, ``principal``, ``hour_s``), the task's share of
  :func:`~pidgate.pipeline.jobs.activity_hourly.hourly_from_facts`' counts. A (principal,
  hour)'s requests, clients and stats are all in one task; its PIDs are spread over tasks by
  PID, each counted in exactly one, so summing the shares gives the exact counts;
* :data:`FATES`: per ``principal``, :func:`~pidgate.pipeline.jobs.activity_hourly.pid_fates`'
  counts of the PIDs of this task (every fact of a PID is in its task);
* :data:`POINTS`: per (``principal``, ``kind``, ``bucket``): the new PIDs (kind PID) and
  rejected requests (kind REJECTED_REQUEST) of
  :func:`~pidgate.pipeline.jobs.activity_hourly.bucketed_counts`, counted per chart bucket of
  the task's own period. That bucket divides the report's (a task's period lies within the
  report's, and the candidate buckets nest), so re-bucketing is exact.

``*_from_parts`` turn the parts into what the ``activity_hourly`` functions give from facts
(the tests compare them). Pure Arrow in :func:`reduce_facts`; Spark only in
:func:`activity_parts` and the ``*_from_parts`` transforms. Must not import the report, the
job module or pandas.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import mmh3
import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.outputs.timebuckets import choose_bucket
from pidgate.pipeline.reading.eventfacts import (
    CLIENT,
    FACT_SCHEMA,
    PID,
    REJECTED_REQUEST,
    WOULD_REQUEST,
    Packing,
    merge_facts,
)
from pidgate.pipeline.reading.schemas import arrow_schema, spark_struct

__all__ = [
    "FATES",
    "HOURLY",
    "POINTS",
    "activity_parts",
    "buckets_from_parts",
    "fact_homes",
    "fates_from_parts",
    "hourly_from_parts",
    "pack_facts",
    "packing",
    "reduce_facts",
    "shuffle_partitions",
]

HOURLY, FATES, POINTS = 0, 1, 2
#: Counted per hour: summed over the tasks' shares.
_HOURLY_COUNTS = (
    "new_pids",
    "rejected_pids",
    "rejected_requests",
    "demanded_pids",
    "would_reject_pids",
    "would_reject_requests",
    "refused_pids",
    "clients",
)
#: Per hour, combined by their own rule.
_HOURLY_RULES = {
    "init_producer_ids": "sum",
    "throttle_ms_max": "max",
    "events": "sum",
    "first_ts_ms": "min",
    "last_ts_ms": "max",
}
#: pid_fates' counts (``would_reject_pids`` shares the hourly column of that name).
_FATE_COUNTS = (
    "admitted_at_once",
    "admitted_after_rejection",
    "never_admitted",
    "would_reject_pids",
    "would_wait_pids",
    "would_never_pids",
)
_VALUE_COLUMNS = tuple(dict.fromkeys((*_HOURLY_COUNTS, *_HOURLY_RULES, *_FATE_COUNTS, "count")))
_PARTS_DDL = "part tinyint, bad boolean, principal string, hour_s bigint, kind tinyint, " + (
    "bucket bigint, " + ", ".join(f"{name} bigint" for name in _VALUE_COLUMNS)
)
PARTS_SCHEMA = arrow_schema(_PARTS_DDL)
#: Built here rather than parsed by the JVM from the DDL (0.08 s per call, fresh JVM).
_PARTS_STRUCT = spark_struct(_PARTS_DDL)
#: One reduce task per this much JSON input (its facts are held in memory while reduced).
_INPUT_BYTES_PER_PARTITION = 256 << 20


# -- one task's reduce, in Arrow ----------------------------------------------------------


def _count(mask: pa.Array) -> pa.Array:
    """1 where ``mask`` holds, else 0 (null counts as not holding, as Spark's count(when))."""
    return pc.cast(pc.fill_null(mask, False), pa.int64())


def _parts(part: int, columns: dict[str, Any], rows: int) -> pa.Table:
    arrays = []
    for field in PARTS_SCHEMA:
        if field.name == "part":
            arrays.append(pa.array(np.full(rows, part, np.int8)))
        elif field.name in columns:
            arrays.append(pc.cast(columns[field.name], field.type))
        else:
            arrays.append(pa.nulls(rows, field.type))
    return pa.Table.from_arrays(arrays, schema=PARTS_SCHEMA)


def _hourly(merged: pa.Table) -> pa.Table:
    kind = merged["kind"]
    pid = pc.equal(kind, PID)
    new, rejected, would = (
        pc.fill_null(merged[c], False) for c in ("is_new", "is_rejected", "is_would")
    )
    and_, or_ = pc.and_kleene, pc.or_kleene
    counts = {
        "new_pids": _count(and_(pid, new)),
        "rejected_pids": _count(and_(pid, rejected)),
        "rejected_requests": _count(pc.equal(kind, REJECTED_REQUEST)),
        "demanded_pids": _count(and_(pid, or_(or_(new, rejected), would))),
        "would_reject_pids": _count(and_(pid, would)),
        "would_reject_requests": _count(pc.equal(kind, WOULD_REQUEST)),
        "refused_pids": _count(and_(pid, or_(rejected, would))),
        "clients": _count(pc.equal(kind, CLIENT)),
    }
    values = {
        "init_producer_ids": merged["init_producer_ids"],
        "throttle_ms_max": merged["throttle_ms_max"],
        "events": merged["events"],
        "first_ts_ms": merged["first_ms"],
        "last_ts_ms": merged["last_ms"],
    }
    keys = {name: merged[name] for name in ("bad", "principal", "hour_s")}
    per_hour = pa.table({**keys, **counts, **values}).group_by(list(keys), use_threads=False)
    aggregated = per_hour.aggregate(
        [(name, "sum") for name in counts] + list(_HOURLY_RULES.items())
    )
    names = [*keys, *counts, *_HOURLY_RULES]
    aggregated = aggregated.rename_columns(names)
    return _parts(HOURLY, {name: aggregated[name] for name in names}, aggregated.num_rows)


def _fates(merged: pa.Table) -> pa.Table:
    pids = merged.filter(pc.equal(merged["kind"], PID))
    per_pid = pids.group_by(["principal", "pid"], use_threads=False).aggregate(
        [("first_new_ms", "min"), ("first_rejected_ms", "min"), ("first_would_ms", "min")]
    )
    n, r, w = (per_pid[f"first_{c}_ms_min"] for c in ("new", "rejected", "would"))
    and_, or_ = pc.and_kleene, pc.or_kleene
    n_seen, r_seen, w_seen = pc.is_valid(n), pc.is_valid(r), pc.is_valid(w)
    fates = {
        "admitted_at_once": _count(and_(n_seen, or_(pc.is_null(r), pc.greater_equal(r, n)))),
        "admitted_after_rejection": _count(and_(n_seen, pc.less(r, n))),
        "never_admitted": _count(and_(pc.is_null(n), r_seen)),
        "would_reject_pids": _count(w_seen),
        "would_wait_pids": _count(and_(w_seen, pc.greater(n, w))),
        "would_never_pids": _count(and_(w_seen, pc.is_null(n))),
    }
    per_principal = pa.table({"principal": per_pid["principal"], **fates})
    summed = per_principal.group_by(["principal"], use_threads=False).aggregate(
        [(name, "sum") for name in fates]
    )
    summed = summed.rename_columns(["principal", *fates])
    return _parts(FATES, {name: summed[name] for name in summed.column_names}, summed.num_rows)


def _points(merged: pa.Table) -> pa.Table:
    kind = merged["kind"]
    wanted = pc.or_kleene(
        pc.and_kleene(pc.equal(kind, PID), pc.fill_null(merged["is_new"], False)),
        pc.equal(kind, REJECTED_REQUEST),
    )
    points = merged.filter(wanted)
    if not points.num_rows:
        return PARTS_SCHEMA.empty_table()
    first_ms = pc.coalesce(points["first_new_ms"], points["first_ms"]).to_numpy()
    bucket_s, _ = choose_bucket(int(first_ms.min()), int(first_ms.max()))
    bucket = np.floor_divide(first_ms, 1000 * bucket_s) * bucket_s
    table = pa.table({"principal": points["principal"], "kind": points["kind"], "bucket": bucket})
    counted = table.group_by(["principal", "kind", "bucket"], use_threads=False).aggregate(
        [("bucket", "count")]
    )
    counted = counted.rename_columns(["principal", "kind", "bucket", "count"])
    return _parts(POINTS, {name: counted[name] for name in counted.column_names}, counted.num_rows)


def reduce_facts(facts: pa.Table) -> pa.Table:
    """One task's facts (every fact of each of its (principal, hour) and (principal, PID)
    keys) merged and reduced to its parts (module doc)."""
    merged = merge_facts(facts)
    return pa.concat_tables([_hourly(merged), _fates(merged), _points(merged)])


# -- Spark: one shuffle, then the parts ----------------------------------------------------


def shuffle_partitions(spark: SparkSession, input_bytes: int | None) -> int:
    """Reduce tasks: the session's shuffle partitions, more for a big input so that each task
    holds about :data:`_INPUT_BYTES_PER_PARTITION` of JSON's facts at most."""
    configured = int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
    if input_bytes is None:
        return configured
    return max(configured, math.ceil(input_bytes / _INPUT_BYTES_PER_PARTITION))


#: Packed facts: each row holds the facts of one split bound for one home, as Arrow IPC.
_PACKED_DDL = "home int, facts binary"
#: Homes per reduce task: Spark hashes each home to a task, so several even the load out.
_HOMES_PER_PARTITION = 8
_MIX = np.uint64(0x9E3779B97F4A7C15)


def fact_homes(facts: pa.Table, homes: int) -> np.ndarray:
    """Each fact's home in ``[0, homes)``: the same for every fact of one (principal, PID) and
    for every other fact of one (principal, hour), in every process (mmh3 of the principal,
    not Python's salted ``hash``)."""
    principal = pc.dictionary_encode(facts["principal"]).combine_chunks()
    names = principal.dictionary.to_pylist()
    name_hashes = np.array(
        [mmh3.hash64(name.encode(), signed=False)[0] for name in names] or [0], np.uint64
    )
    indices = pc.fill_null(principal.indices, 0).to_numpy(zero_copy_only=False)
    named = pc.is_valid(principal.indices).to_numpy(zero_copy_only=False)
    principal_hash = np.where(named, name_hashes[indices], np.uint64(0))
    is_pid = pc.equal(facts["kind"], PID).to_numpy(zero_copy_only=False)
    pid = pc.fill_null(facts["pid"], 0).to_numpy(zero_copy_only=False)
    hour_s = pc.fill_null(facts["hour_s"], 0).to_numpy(zero_copy_only=False)
    key = np.where(is_pid, pid, hour_s).astype(np.uint64)
    mixed = principal_hash ^ (key * _MIX)
    mixed ^= mixed >> np.uint64(29)
    home: np.ndarray = (mixed % np.uint64(homes)).astype(np.int32)
    return home


def pack_facts(homes: int) -> Callable[[pa.Table], pa.Table]:
    """A split's facts -> ``_PACKED_DDL`` rows, one per home they go to. The facts cross into
    the JVM as a few Arrow buffers instead of millions of rows (which took most of the job's
    time), and Spark shuffles them by home."""

    def pack(facts: pa.Table) -> pa.Table:
        if not facts.num_rows:
            return pa.table({"home": pa.array([], pa.int32()), "facts": pa.array([], pa.binary())})
        home = fact_homes(facts, homes)
        order = np.argsort(home, kind="stable")
        ordered = facts.cast(FACT_SCHEMA).take(pa.array(order))
        counts = np.bincount(home, minlength=homes)
        packed_homes, blobs, start = [], [], 0
        for target, count in enumerate(counts.tolist()):
            if count:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, FACT_SCHEMA) as writer:
                    writer.write_table(ordered.slice(start, count))
                packed_homes.append(target)
                blobs.append(sink.getvalue().to_pybytes())
                start += count
        return pa.table(
            {"home": pa.array(packed_homes, pa.int32()), "facts": pa.array(blobs, pa.binary())}
        )

    return pack


def _reduce_packed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    tables = [
        pa.ipc.open_stream(blob.as_buffer()).read_all()
        for batch in batches
        for blob in batch.column(1)
    ]
    if not tables:
        return
    yield from reduce_facts(pa.concat_tables(tables)).to_batches(max_chunksize=1 << 16)


def packing(partitions: int) -> Packing:
    """What the executors do to each split's facts for :func:`activity_parts` (``partitions``
    reduce tasks): pack them by home."""
    return _PACKED_DDL, pack_facts(partitions * _HOMES_PER_PARTITION)


def activity_parts(spark: SparkSession, source: pa.Table | DataFrame, partitions: int) -> DataFrame:
    """The parts (module doc) of the facts ``source``
    (:func:`~pidgate.pipeline.reading.eventfacts.event_facts_source`, given
    :func:`packing` of the same ``partitions``): reduced here when the driver read them, else
    shuffled by home into ``partitions`` tasks that reduce their share."""
    if isinstance(source, pa.Table):
        return spark.createDataFrame(reduce_facts(source))
    return source.repartition(partitions, "home").mapInArrow(_reduce_packed, _PARTS_STRUCT)


def hourly_from_parts(parts: DataFrame) -> DataFrame:
    """:func:`~pidgate.pipeline.jobs.activity_hourly.hourly_from_facts`' rows, from parts."""
    rules = {"sum": F.sum, "max": F.max, "min": F.min}
    zero_if_none = {"init_producer_ids", "events"}
    values = [F.sum(name).alias(name) for name in _HOURLY_COUNTS]
    for name, rule in _HOURLY_RULES.items():
        value = rules[rule](name)
        values.append((F.coalesce(value, F.lit(0)) if name in zero_if_none else value).alias(name))
    return (
        parts.filter(F.col("part") == HOURLY)
        .groupBy("bad", "principal", "hour_s")
        .agg(*values)
        .withColumn("hour", F.timestamp_seconds(F.col("hour_s")))
        .drop("hour_s")
    )


def fates_from_parts(parts: DataFrame) -> DataFrame:
    """:func:`~pidgate.pipeline.jobs.activity_hourly.pid_fates`' rows, from parts."""
    return (
        parts.filter(F.col("part") == FATES)
        .groupBy("principal")
        .agg(*(F.sum(name).alias(name) for name in _FATE_COUNTS))
    )


def buckets_from_parts(parts: DataFrame, bucket_s: int, principals: list[str]) -> DataFrame:
    """:func:`~pidgate.pipeline.jobs.activity_hourly.bucketed_counts`' rows, from parts; exact
    for the report's ``bucket_s`` (module doc)."""
    bucket = (F.floor(F.col("bucket") / bucket_s) * bucket_s).cast("long")
    return (
        parts.filter((F.col("part") == POINTS) & F.col("principal").isin(principals))
        .groupBy("principal", "kind", bucket.alias("bucket"))
        .agg(F.sum("count").alias("count"))
    )
