"""The event log boiled down to *facts* in one pass: each file split is parsed on the
executors and pre-aggregated there; what is left is merged by Spark (:func:`event_facts`) or,
in the activity job, shuffled once and merged in Arrow (:func:`merge_facts`).

Why: the activity job over 10M events spent its time in Spark's JSON reader and in an
aggregation with five exact distinct counts (each one an extra copy of every row). The lines
pidgate writes are read by a compiled reader (``_eventscan``, built by the normal install; 4-8x
pyarrow's JSON parser on them); any other shape goes to pyarrow's C++ JSON reader, and a buffer
with a bad line is read line by line, so the table is the same whichever reads it. The distinct
values each count needs (PIDs, request keys, client ids) are deduplicated per split before
anything is shuffled, so exact counts stay exact and cheap. ``PIDGATE_PURE_PYTHON=1`` skips
the compiled reader.

One fact row is one of (``kind``):

* :data:`STATS`: per (``bad``, ``principal``, ``hour_s``): ``events``, ``init_producer_ids``,
  ``throttle_ms_max``, ``first_ms``, ``last_ms``; the bad lines are one row with ``bad`` true;
* :data:`PID`: per (``principal``, ``hour_s``, ``pid``): ``is_new``, ``is_rejected``,
  ``is_would`` (``would_reject`` of observe mode) and the first time of each
  (``first_new_ms``, ``first_rejected_ms``, ``first_would_ms``);
* :data:`REJECTED_REQUEST` / :data:`WOULD_REQUEST`: per (``principal``, ``hour_s``, ``key`` =
  ``instance#request_id``), ``first_ms``;
* :data:`CLIENT`: per (``principal``, ``hour_s``, ``key`` = client id, ``""`` when missing).

Bad lines are what :func:`pidgate.pipeline.reading.events.read_events` drops, decided the same way
(a line that is not a JSON object, a field of the wrong type, a missing ``ts_ms`` / ``event`` /
``principal``); blank lines are skipped, as Spark does. Only the fields the facts need are
checked. Local files are read by the Python workers directly (split by byte ranges, ``.gz``
whole); other URIs go through Spark's text reader. Imports pyarrow and pyspark; must not
import a job, ``outputs``, ``spark`` or the proxy.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pyarrow.compute as pc  # type: ignore[import-untyped, unused-ignore]
import pyarrow.json as pj  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.reading.schemas import arrow_schema, spark_struct


def _compiled_reader() -> Any:
    """``_eventscan`` (compiled, optional: setup.py), or None when it is not built or
    ``PIDGATE_PURE_PYTHON`` asks for the pure path; the pyarrow reader then runs."""
    if os.environ.get("PIDGATE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from pidgate.pipeline.reading import _eventscan  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _eventscan


_eventscan = _compiled_reader()

__all__ = [
    "CLIENT",
    "DRIVER_BYTES",
    "FACT_KEYS",
    "FACT_SCHEMA",
    "MERGE_RULES",
    "PID",
    "REJECTED_REQUEST",
    "STATS",
    "WOULD_REJECT",
    "WOULD_REQUEST",
    "Packing",
    "event_facts",
    "event_facts_source",
    "facts_of_lines",
    "file_splits",
    "local_bytes",
    "merge_facts",
]

STATS, PID, REJECTED_REQUEST, WOULD_REQUEST, CLIENT = 0, 1, 2, 3, 4
ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID = "admitted_new", "rejected", "init_producer_id"
#: Observe mode: pidgate would have rejected this PID's request, and forwarded it.
WOULD_REJECT = "would_reject"
_COUNTED = (ADMITTED_NEW, REJECTED, INIT_PRODUCER_ID, WOULD_REJECT)
_PID_EVENTS = (ADMITTED_NEW, REJECTED, WOULD_REJECT)

#: The fields parsed (and so checked) per line.
LINE_SCHEMA = arrow_schema(
    "ts_ms bigint, event string, principal string, producer_id bigint, client_id string, "
    "instance string, request_id bigint, throttle_ms bigint"
)
_REQUIRED = ("ts_ms", "event", "principal")
_PARSE = pj.ParseOptions(explicit_schema=LINE_SCHEMA, unexpected_field_behavior="ignore")
_READ = pj.ReadOptions(use_threads=False, block_size=1 << 24)

_FACT_DDL = (
    "kind tinyint, bad boolean, principal string, hour_s bigint, pid bigint, key string, "
    "is_new boolean, is_rejected boolean, is_would boolean, first_new_ms bigint, "
    "first_rejected_ms bigint, first_would_ms bigint, events bigint, init_producer_ids bigint, "
    "throttle_ms_max bigint, first_ms bigint, last_ms bigint"
)
FACT_SCHEMA = arrow_schema(_FACT_DDL)
#: What identifies a fact: the facts of one key from different splits are merged into one.
FACT_KEYS = ("kind", "bad", "principal", "hour_s", "pid", "key")
#: How they are merged: each value column's rule (``max``, ``min`` or ``sum``), the same in
#: Spark (:func:`event_facts`) and in Arrow (:func:`merge_facts`).
MERGE_RULES: dict[str, str] = {
    "is_new": "max",
    "is_rejected": "max",
    "is_would": "max",
    "first_new_ms": "min",
    "first_rejected_ms": "min",
    "first_would_ms": "min",
    "events": "sum",
    "init_producer_ids": "sum",
    "throttle_ms_max": "max",
    "first_ms": "min",
    "last_ms": "max",
}
_SPARK_RULES: dict[str, Callable[[str], Column]] = {"max": F.max, "min": F.min, "sum": F.sum}
_SPLIT_BYTES = 32 << 20
#: Local logs up to this size are boiled down on the driver: no Python workers to start, which
#: is most of the fixed cost of a small (demo-sized) log.
DRIVER_BYTES = 32 << 20
_HOUR_MS = 3_600_000


# -- parsing ------------------------------------------------------------------------------


def _spark_value(value: Any, type_: pa.DataType) -> tuple[bool, Any]:
    """``(ok, value)`` as Spark's JSON reader takes ``value`` for a field of ``type_``: strings
    take any value (non-strings as their JSON text), integers only integers."""
    if value is None:
        return True, None
    if pa.types.is_string(type_):
        return True, value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**63, value
    return False, None


def _parse_slowly(lines: Sequence[bytes]) -> tuple[pa.Table, int]:
    """Line by line, as Spark would: the good lines as a table, and the bad ones counted."""
    rows: dict[str, list[Any]] = {name: [] for name in LINE_SCHEMA.names}
    bad = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(record, dict):
            bad += 1
            continue
        values = []
        for field in LINE_SCHEMA:
            ok, value = _spark_value(record.get(field.name), field.type)
            if not ok:
                break
            values.append(value)
        else:
            for name, value in zip(LINE_SCHEMA.names, values, strict=True):
                rows[name].append(value)
            continue
        bad += 1
    return pa.table(rows, schema=LINE_SCHEMA), bad


def _validity(valid: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def scan_lines(data: bytes | memoryview) -> pa.Table | None:
    """The compiled reader's table (:data:`LINE_SCHEMA`) of ``data``, or None when it is not
    built, is switched off, or met a line not of the shape pidgate writes (``_eventscan``)."""
    if _eventscan is None:
        return None
    scanned = _eventscan.scan_event_lines(data)
    if scanned is None:
        return None
    rows, ints, int_valid, offsets, string_valid, strings = scanned
    columns: dict[str, pa.Array] = {}
    for i, name in enumerate(_eventscan.INT_FIELDS):
        values = pa.py_buffer(np.ascontiguousarray(ints[i]))
        columns[name] = pa.Array.from_buffers(pa.int64(), rows, [_validity(int_valid[i]), values])
    for i, name in enumerate(_eventscan.STRING_FIELDS):
        buffers = [
            _validity(string_valid[i]),
            pa.py_buffer(np.ascontiguousarray(offsets[i])),
            pa.py_buffer(strings[i]),
        ]
        columns[name] = pa.Array.from_buffers(pa.string(), rows, buffers)
    return pa.table([columns[name] for name in LINE_SCHEMA.names], schema=LINE_SCHEMA)


def parse_lines(data: bytes | memoryview) -> tuple[pa.Table, int]:
    """Newline-delimited JSON -> (rows with every required field, bad lines). The compiled
    reader takes lines of the shape pidgate writes; otherwise pyarrow parses the whole buffer,
    and only when that fails (a bad line somewhere) it is read line by line."""
    scanned = scan_lines(data)
    if scanned is not None:
        table, bad = scanned, 0
    else:
        data = bytes(data)  # the line-by-line reader splits bytes (a copy, off the fast path)
        try:
            table = pj.read_json(pa.BufferReader(data), read_options=_READ, parse_options=_PARSE)
            bad = 0
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            table, bad = _parse_slowly(data.split(b"\n"))
    good = pc.and_kleene(
        pc.and_kleene(pc.is_valid(table["ts_ms"]), pc.is_valid(table["event"])),
        pc.is_valid(table["principal"]),
    )
    kept = table.filter(good)
    return kept, bad + table.num_rows - kept.num_rows


# -- pre-aggregation ------------------------------------------------------------------------


def _when(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, values, pa.scalar(None, values.type))


def _facts_table(parts: dict[str, Any], n: int) -> pa.Table:
    columns = []
    for field in FACT_SCHEMA:
        value = parts.get(field.name)
        if value is None:
            columns.append(pa.nulls(n, field.type))
        elif isinstance(value, pa.Array | pa.ChunkedArray):
            columns.append(value.cast(field.type))
        else:
            columns.append(pa.array([value] * n, field.type))
    return pa.Table.from_arrays(columns, schema=FACT_SCHEMA)


def facts_of_table(table: pa.Table, bad: int) -> pa.Table:
    """The facts (module doc) of parsed good lines plus ``bad`` bad lines."""
    table = table.filter(pc.is_in(table["event"], pa.array(_COUNTED)))
    out: list[pa.Table] = []
    if bad:
        out.append(_facts_table({"kind": STATS, "bad": True, "events": bad}, 1))
    if table.num_rows:
        ts = table["ts_ms"]
        hour = pa.array(np.floor_divide(ts.to_numpy(), _HOUR_MS) * 3600)
        event = table["event"]
        is_new, is_rej = pc.equal(event, ADMITTED_NEW), pc.equal(event, REJECTED)
        is_would, is_init = pc.equal(event, WOULD_REJECT), pc.equal(event, INIT_PRODUCER_ID)
        # Grouping by a dictionary index is cheaper than by the principal's string.
        principal = pc.dictionary_encode(table["principal"]).combine_chunks()
        t = pa.table(
            {
                "principal": principal.indices,
                "hour_s": hour,
                "pid": table["producer_id"],
                "ts": ts,
                "init": pc.cast(is_init, pa.int64()),
                "throttle": _when(is_rej, table["throttle_ms"]),
                "client": table["client_id"],
                "instance": table["instance"],
                "request_id": table["request_id"],
                "is_new": is_new,
                "is_rej": is_rej,
                "is_would": is_would,
                "new_ts": _when(is_new, ts),
                "rej_ts": _when(is_rej, ts),
                "would_ts": _when(is_would, ts),
            }
        )
        names = principal.dictionary
        keys = ["principal", "hour_s"]
        stats = t.group_by(keys, use_threads=False).aggregate(
            [("ts", "count"), ("init", "sum"), ("throttle", "max"), ("ts", "min"), ("ts", "max")]
        )
        out.append(
            _facts_table(
                {
                    "kind": STATS,
                    "bad": False,
                    "principal": pc.take(names, stats["principal"]),
                    "hour_s": stats["hour_s"],
                    "events": stats["ts_count"],
                    "init_producer_ids": stats["init_sum"],
                    "throttle_ms_max": stats["throttle_max"],
                    "first_ms": stats["ts_min"],
                    "last_ms": stats["ts_max"],
                },
                stats.num_rows,
            )
        )
        pids = t.filter(
            pc.and_kleene(pc.is_in(event, pa.array(_PID_EVENTS)), pc.is_valid(t["pid"]))
        )
        per_pid = pids.group_by([*keys, "pid"], use_threads=False).aggregate(
            [
                ("is_new", "max"),
                ("is_rej", "max"),
                ("is_would", "max"),
                ("new_ts", "min"),
                ("rej_ts", "min"),
                ("would_ts", "min"),
            ]
        )
        out.append(
            _facts_table(
                {
                    "kind": PID,
                    "bad": False,
                    "principal": pc.take(names, per_pid["principal"]),
                    "hour_s": per_pid["hour_s"],
                    "pid": per_pid["pid"],
                    "is_new": per_pid["is_new_max"],
                    "is_rejected": per_pid["is_rej_max"],
                    "is_would": per_pid["is_would_max"],
                    "first_new_ms": per_pid["new_ts_min"],
                    "first_rejected_ms": per_pid["rej_ts_min"],
                    "first_would_ms": per_pid["would_ts_min"],
                },
                per_pid.num_rows,
            )
        )
        for kind, mask in ((REJECTED_REQUEST, is_rej), (WOULD_REQUEST, is_would)):
            requests = t.filter(mask).group_by([*keys, "instance", "request_id"], use_threads=False)
            per_request = requests.aggregate([("ts", "min")])
            # concat_ws("#", instance or "", request_id), as hourly_with_clients keys requests
            request = pc.binary_join_element_wise(
                pc.fill_null(per_request["instance"], ""),
                pc.cast(per_request["request_id"], pa.string()),
                "#",
                null_handling="skip",
            )
            out.append(
                _facts_table(
                    {
                        "kind": kind,
                        "bad": False,
                        "principal": pc.take(names, per_request["principal"]),
                        "hour_s": per_request["hour_s"],
                        "key": request,
                        "first_ms": per_request["ts_min"],
                    },
                    per_request.num_rows,
                )
            )
        clients = t.group_by([*keys, "client"], use_threads=False).aggregate([])
        clients = clients.set_column(2, "client", pc.fill_null(clients["client"], ""))
        out.append(
            _facts_table(
                {
                    "kind": CLIENT,
                    "bad": False,
                    "principal": pc.take(names, clients["principal"]),
                    "hour_s": clients["hour_s"],
                    "key": clients["client"],
                },
                clients.num_rows,
            )
        )
    if not out:
        return FACT_SCHEMA.empty_table()
    return pa.concat_tables(out)


def facts_of_lines(
    data: bytes | memoryview, since_ms: int | None = None, until_ms: int | None = None
) -> pa.Table:
    """The facts of a buffer of newline-delimited JSON, events limited to [since, until)."""
    table, bad = parse_lines(data)
    if since_ms is not None:
        table = table.filter(pc.greater_equal(table["ts_ms"], since_ms))
    if until_ms is not None:
        table = table.filter(pc.less(table["ts_ms"], until_ms))
    return facts_of_table(table, bad)


# -- splits and the Spark side --------------------------------------------------------------


def file_splits(
    paths: Sequence[str], split_bytes: int = _SPLIT_BYTES
) -> list[tuple[str, int, int]]:
    """``(path, start, length)`` byte ranges of local files, about ``split_bytes`` each; a
    compressed file is one split (``length`` -1: the whole file)."""
    import os

    splits: list[tuple[str, int, int]] = []
    for path in paths:
        if path.endswith(".gz"):
            splits.append((path, 0, -1))
            continue
        size = os.path.getsize(path)
        count = max(1, math.ceil(size / split_bytes))
        step = math.ceil(size / count) if size else 0
        splits.extend(
            (path, start, min(step, size - start)) for start in range(0, max(size, 1), max(step, 1))
        )
    return splits


def _seek_split(file: BinaryIO, start: int, length: int) -> int:
    """``file`` moved to the first line that starts in ``[start, start + length)``; the bytes
    from there to the range's end (0 or less: no line starts in it)."""
    if start > 0:
        file.seek(start - 1)
        file.readline()  # the rest of a line that started before this split
    return start + length - file.tell()


def read_split(path: str, start: int, length: int) -> bytes:
    """The lines that *start* in ``[start, start + length)`` of ``path`` (the whole file,
    decompressed, for ``length`` -1)."""
    if length < 0:
        with pa.input_stream(path, compression="detect") as stream:
            return bytes(stream.read())
    with open(path, "rb") as file:
        wanted = _seek_split(file, start, length)
        if wanted <= 0:
            return b""
        data = file.read(wanted)
        if data and not data.endswith(b"\n"):
            data += file.readline()  # the line that starts here ends in the next split
    return data


#: Each thread's buffer for :func:`read_split_view`, kept between splits.
_split_buffers = threading.local()
#: Room kept past a split for the rest of its last line (a longer line is copied instead).
_TAIL_BYTES = 1 << 20


def _split_buffer(size: int) -> bytearray:
    buffer: bytearray | None = getattr(_split_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _split_buffers.buffer = bytearray(size)
    return buffer


def read_split_view(path: str, start: int, length: int) -> memoryview:
    """:func:`read_split`'s lines, read into a buffer this thread keeps: the view is valid
    until the thread's next call, and must be released (``view.release()``) before it.

    Why: a Python worker reads one 32 MB split after another, and a new bytes object per
    split meant fresh pages for the kernel to fault in and zero every time (in the workers,
    py-spy: 2.1 s of the 10M-event job's 14 s of split work; into a kept buffer, 0.5 s)."""
    if length < 0:
        return memoryview(read_split(path, start, length))
    with open(path, "rb") as file:
        wanted = _seek_split(file, start, length)
        if wanted <= 0:
            return memoryview(b"")
        buffer = _split_buffer(wanted + _TAIL_BYTES)
        view = memoryview(buffer)
        count = file.readinto(view[:wanted])
        if count and buffer[count - 1] != 0x0A:
            rest = file.readline()  # the line that starts here ends in the next split
            if count + len(rest) > len(buffer):
                return memoryview(bytes(view[:count]) + rest)
            buffer[count : count + len(rest)] = rest
            count += len(rest)
        return view[:count]


def _batches(table: pa.Table) -> Iterator[pa.RecordBatch]:
    yield from table.to_batches(max_chunksize=1 << 16)


#: What a split's facts become on the executors before Spark takes them: ``(ddl, function)``.
#: None: the facts themselves, as rows of :data:`FACT_SCHEMA`.
Packing = tuple[str, Callable[[pa.Table], pa.Table]] | None


def event_facts_source(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    local: bool,
    since_ms: int | None = None,
    until_ms: int | None = None,
    driver_bytes: int = DRIVER_BYTES,
    packing: Packing = None,
) -> pa.Table | DataFrame:
    """The facts of every line of ``paths`` (module doc), per split and not yet merged: an Arrow
    table when the driver read them (local files of at most ``driver_bytes``), else a DataFrame
    the Python workers fill, with each split's facts passed through ``packing`` when given.
    ``local``: ``paths`` are local files every executor can open (otherwise URIs for Spark's
    text reader)."""
    ddl, pack = packing if packing is not None else (_FACT_DDL, None)

    def emit(facts: pa.Table) -> Iterator[pa.RecordBatch]:
        yield from _batches(pack(facts) if pack is not None else facts)

    splits = file_splits(paths) if local else []

    def of_splits(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                data = read_split_view(*splits[index])
                try:
                    facts = facts_of_lines(data, since_ms, until_ms)
                finally:
                    data.release()
                yield from emit(facts)

    def of_lines(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: list[pa.Array] = []
        count = 0
        for batch in batches:
            pending.append(batch.column(0))
            count += batch.num_rows
            if count >= 1 << 17:
                yield from emit(facts_of_lines(_joined(pending), since_ms, until_ms))
                pending, count = [], 0
        if pending:
            yield from emit(facts_of_lines(_joined(pending), since_ms, until_ms))

    # The schema built here: a DDL string is parsed by the JVM (0.08 s per call, fresh JVM).
    schema = spark_struct(ddl)
    if local and local_bytes(paths) <= driver_bytes:
        tables = [facts_of_lines(read_split(*split), since_ms, until_ms) for split in splits]
        return pa.concat_tables(tables).cast(FACT_SCHEMA).combine_chunks()
    if local:
        # A task per split, numbered by the JVM: no Python job (and no shuffle) just to hand
        # the split list out; the tasks look their split up in the list they were sent with.
        count = max(1, len(splits))
        return spark.range(len(splits), numPartitions=count).mapInArrow(of_splits, schema)
    return spark.read.text(list(paths)).mapInArrow(of_lines, schema)


def event_facts(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    local: bool,
    since_ms: int | None = None,
    until_ms: int | None = None,
    driver_bytes: int = DRIVER_BYTES,
) -> DataFrame:
    """The facts of every line of ``paths`` (module doc), merged by Spark: one row per key.
    Arguments as :func:`event_facts_source`'s. The activity job merges in Arrow instead
    (:func:`merge_facts`, one shuffle); this is the reference its tests compare with."""
    source = event_facts_source(
        spark, paths, local=local, since_ms=since_ms, until_ms=until_ms, driver_bytes=driver_bytes
    )
    # Straight from Arrow: no pandas float detour for null-holding int64 columns (PIDs).
    raw = spark.createDataFrame(source) if isinstance(source, pa.Table) else source
    merged = (_SPARK_RULES[rule](name).alias(name) for name, rule in MERGE_RULES.items())
    return raw.groupBy(*FACT_KEYS).agg(*merged)


def merge_facts(facts: pa.Table) -> pa.Table:
    """``facts`` (:data:`FACT_SCHEMA`) with one row per key (:data:`FACT_KEYS`), merged by
    :data:`MERGE_RULES`: what :func:`event_facts` gives, computed in Arrow."""
    merged = facts.group_by(list(FACT_KEYS), use_threads=False).aggregate(list(MERGE_RULES.items()))
    return merged.rename_columns([*FACT_KEYS, *MERGE_RULES]).select(FACT_SCHEMA.names)


def local_bytes(paths: Sequence[str]) -> int:
    """The input size, a compressed file counted as ten times its size."""
    import os

    local = [p.removeprefix("file://").removeprefix("file:") for p in paths]
    return sum(os.path.getsize(p) * (10 if p.endswith(".gz") else 1) for p in local)


def _joined(lines: list[pa.Array]) -> bytes:
    strings = pa.concat_arrays(lines)
    one_list = pa.ListArray.from_arrays(pa.array([0, len(strings)], pa.int32()), strings)
    return bytes(pc.binary_join(one_list, "\n")[0].as_buffer())
