"""What the PID event log puts on disk: its lines (fields, event kinds, JSON encoding) and its
files (names, the gzip layer). DESIGN.md "Event log and the Spark pipeline" is the contract; the
``pipeline`` jobs (activity, backtest) read these files, so field names, their order and the
bytes of a line must not change.

One line per event, fields always present in this order (null where not applicable)::

    ts_ms, event, principal, producer_id, producer_epoch, client_id, client_software, topic,
    partition, node_id, instance, throttle_ms, tokens, request_id, transactional

* ``admitted_new``: one per PID a Produce request activated (``Admitted.new_producer_ids``);
  ``throttle_ms`` null.
* ``admitted_grandfathered``: one per PID a Produce request got admitted without a token
  because the cluster allocated it before the principal's enforcement began
  (``Admitted.grandfathered_producer_ids``; docs/grandfathering.md); ``throttle_ms`` null. The
  backtest replays these as free admissions.
* ``rejected``: one per unknown PID of a rejected Produce request
  (``Rejected.unknown_producer_ids``), ``throttle_ms`` = the time until the quota had the tokens
  (the client is sent at most ``rejection.max_throttle_time_ms`` of it).
* ``would_reject``: observe mode (proxy/quota_control/observe.py): the request was forwarded, and
  enforcement would have written these ``rejected`` lines, fields alike. Nothing was recorded in
  the quota, so each later request of the PID is decided again until a token admits it
  (``admitted_new``).
* ``init_producer_id``: one per InitProducerId the cluster answered; topic, partition,
  throttle_ms and tokens null.

For Produce events ``topic``/``partition``/``producer_epoch``/``transactional`` come from the
PID's first batch in the request (``topic`` is null for Produce v13, which names topics by id);
``tokens`` is the principal's bucket after the decision; ``node_id`` is the broker node the
client connection fronts, read from ``context.node_id`` when the ``ProduceContext`` has one
(null otherwise, e.g. the bootstrap listener). ``request_id`` increases by one per logged call
(a Produce decision with events, or an InitProducerId answer); all events of one request share
it, so the backtest can regroup them, and a gap means a request whose events were dropped.

Files: ``pidgate-events-<instance>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` (``.jsonl.gz`` with
gzip), with every character of the instance outside ``[A-Za-z0-9._-]`` written as ``_`` (the
default instance ``127.0.0.1:29192`` becomes ``127.0.0.1_29192``: Hadoop filesystems, and so
Spark, reject a colon in a file name; the ``instance`` field inside the events is unchanged).

Owns: ``EVENT_FIELDS``, the event kinds, ``event_line`` (every line is one), the lines of a
Produce decision (``produce_event_lines``), ``event_file_name`` and ``OpenEventFile``.

Must not import: ``event_log`` (it writes what we format), threading, the connection or server
modules.
"""

from __future__ import annotations

import gzip as gzip_module
import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Final

from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.quota_control.admission import ProduceContext

__all__ = [
    "ADMITTED_GRANDFATHERED",
    "ADMITTED_NEW",
    "EVENT_FIELDS",
    "INIT_PRODUCER_ID",
    "REJECTED",
    "WOULD_REJECT",
    "OpenEventFile",
    "event_file_name",
    "event_line",
    "first_batches",
    "produce_event_lines",
]

EVENT_FIELDS = (
    "ts_ms",
    "event",
    "principal",
    "producer_id",
    "producer_epoch",
    "client_id",
    "client_software",
    "topic",
    "partition",
    "node_id",
    "instance",
    "throttle_ms",
    "tokens",
    "request_id",
    "transactional",
)
ADMITTED_NEW = "admitted_new"
ADMITTED_GRANDFATHERED = "admitted_grandfathered"
REJECTED = "rejected"
#: Observe mode: the request was forwarded; enforcement would have rejected it
#: (proxy/quota_control/observe.py).
WOULD_REJECT = "would_reject"
INIT_PRODUCER_ID = "init_producer_id"

_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode


def event_line(
    *,
    ts_ms: int,
    event: str,
    principal: str,
    producer_id: int,
    producer_epoch: int | None,
    client_id: str | None,
    client_software: str | None,
    topic: str | None,
    partition: int | None,
    node_id: int | None,
    instance: str,
    throttle_ms: int | None,
    tokens: float | None,
    request_id: int,
    transactional: bool | None,
) -> str:
    """One event as its JSON line (without the newline): ASCII, fields in ``EVENT_FIELDS``
    order."""
    return _dumps(
        {
            "ts_ms": ts_ms,
            "event": event,
            "principal": principal,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "client_id": client_id,
            "client_software": client_software,
            "topic": topic,
            "partition": partition,
            "node_id": node_id,
            "instance": instance,
            "throttle_ms": throttle_ms,
            "tokens": tokens,
            "request_id": request_id,
            "transactional": transactional,
        }
    )


#: Where a PID's first batch in a Produce request is.
FirstBatch = tuple[TopicProduce, PartitionProduce, BatchHeader]


def first_batches(
    request: ProduceRequestSummary, producer_ids: tuple[int, ...]
) -> dict[int, FirstBatch]:
    """The first batch of every one of ``producer_ids`` in ``request``, found in one walk
    (first_batch_for per PID would be O(PIDs x batches))."""
    wanted = set(producer_ids)
    first: dict[int, FirstBatch] = {}
    for topic, partition, batch in request.iter_batches():
        pid = batch.producer_id
        if pid in wanted and pid not in first:
            first[pid] = (topic, partition, batch)
            if len(first) == len(wanted):
                break
    return first


def produce_event_lines(
    context: ProduceContext,
    producer_ids: tuple[int, ...],
    events: Mapping[int, str],
    first: Mapping[int, FirstBatch],
    *,
    ts_ms: int,
    instance: str,
    throttle_ms: int | None,
    tokens: float | None,
    request_id: int,
) -> list[str]:
    """The lines of one Produce decision: one per PID of ``producer_ids``, its event kind from
    ``events``, its batch fields from ``first`` (null for a PID without a batch); ``tokens``
    null unless finite (JSON has no infinity: an unlimited principal's bucket)."""
    if tokens is not None and not math.isfinite(tokens):
        tokens = None
    node_id = getattr(context, "node_id", None)
    if not isinstance(node_id, int):
        node_id = None
    lines: list[str] = []
    for pid in producer_ids:
        topic_name = partition_index = epoch = transactional = None
        found = first.get(pid)
        if found is not None:
            topic, partition, batch = found
            topic_name, partition_index = topic.name, partition.index
            epoch, transactional = batch.producer_epoch, batch.is_transactional
        lines.append(
            event_line(
                ts_ms=ts_ms,
                event=events[pid],
                principal=context.principal,
                producer_id=pid,
                producer_epoch=epoch,
                client_id=context.client_id,
                client_software=context.client_software_name,
                topic=topic_name,
                partition=partition_index,
                node_id=node_id,
                instance=instance,
                throttle_ms=throttle_ms,
                tokens=tokens,
                request_id=request_id,
                transactional=transactional,
            )
        )
    return lines


_UNSAFE_IN_FILE_NAME: Final = re.compile(r"[^A-Za-z0-9._-]")


def event_file_name(instance: str, opened_at_s: float, seq: int, gzip: bool) -> str:
    """``pidgate-events-<instance>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl[.gz]``, the instance with
    every character outside ``[A-Za-z0-9._-]`` (``:`` of ``host:port``) replaced by ``_``, so
    that every Hadoop filesystem (local, HDFS, S3A) accepts the name."""
    stamp = datetime.fromtimestamp(opened_at_s, UTC).strftime("%Y%m%dT%H%M%S")
    safe = _UNSAFE_IN_FILE_NAME.sub("_", instance)
    return f"pidgate-events-{safe}-{stamp}-{seq}.jsonl" + (".gz" if gzip else "")


class OpenEventFile:
    """The file being written: its raw handle, the gzip layer if any, and its size/age."""

    __slots__ = ("compressor", "opened_at_s", "path", "raw", "stream", "uncompressed_bytes")

    def __init__(self, path: Path, raw: IO[bytes], gzip: bool, opened_at_s: float) -> None:
        self.path = path
        self.raw = raw
        self.compressor = gzip_module.GzipFile(fileobj=raw, mode="wb") if gzip else None
        self.stream: IO[bytes] | gzip_module.GzipFile = (
            self.compressor if self.compressor is not None else raw
        )
        self.opened_at_s = opened_at_s
        self.uncompressed_bytes = 0

    def flush(self) -> None:
        self.stream.flush()  # GzipFile.flush: a zlib sync flush, then flushes the raw file
        self.raw.flush()

    def close(self) -> None:
        try:
            if self.compressor is not None:
                self.compressor.close()  # writes the gzip trailer; leaves raw open
        finally:
            self.raw.close()
