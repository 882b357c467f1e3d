"""The PID event log: JSON Lines of admitted-new / rejected PIDs and InitProducerId answers,
written by a background thread so that the request path never waits for a disk.

Owns ``EventLog`` (a ``DecisionObserver``), the event field list ``EVENT_FIELDS`` and the file
naming ``event_file_name``. DESIGN.md "Event log and the Spark pipeline" is the contract; the
``pipeline`` jobs (activity, backtest) read these files.

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
enforcement
  would have written these ``rejected`` lines, fields alike. Nothing was recorded in the quota,
  so each later request of the PID is decided again until a token admits it (``admitted_new``).
* ``init_producer_id``: one per InitProducerId the cluster answered (``record_init_producer_id``);
  topic, partition, throttle_ms and tokens null.

For Produce events ``topic``/``partition``/``producer_epoch``/``transactional`` come from the
PID's first batch in the request (``topic`` is null for Produce v13, which names topics by id);
``tokens`` is the principal's bucket after the decision; ``node_id`` is the broker node the
client connection fronts, read from ``context.node_id`` when the ``ProduceContext`` has one
(null otherwise, e.g. the bootstrap listener). ``request_id`` increases by one per logged call
(a Produce decision with events, or an InitProducerId answer); all events of one request share
it, so the backtest can regroup them, and a gap means a request whose events were dropped.

Never blocking: ``on_decision`` / ``record_init_producer_id`` serialize the lines (json.dumps)
and append them to a bounded in-memory queue under a short lock. When the queue cannot hold all
of a request's events, all of them are dropped and counted (``dropped_events``) — a request is
logged whole or not at all, so the backtest never sees half a request. Memory is bounded by
``max_queued_events`` lines plus one writer chunk (``_CHUNK_EVENTS``).

A daemon thread drains the queue into ``directory``:
``pidgate-events-<instance>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl`` (``.jsonl.gz`` with gzip), with
every character of the instance outside ``[A-Za-z0-9._-]`` written as ``_`` (the default
instance ``127.0.0.1:29192`` becomes ``127.0.0.1_29192``: Hadoop filesystems, and so Spark,
reject a colon in a file name; the ``instance`` field inside the events is unchanged), the
time being when the file was opened and ``seq`` counting files opened by this EventLog (the next
free one is taken if a name exists; files are never overwritten). A file is closed and the next
one started when it would exceed ``rotate_bytes`` (uncompressed JSON Lines bytes; a single line
larger than that still gets written) or has been open ``rotate_interval_s``; an idle file is
closed when its interval ends, so finished hours are complete files for the pipeline. Data is
flushed to the OS at least every ``flush_interval_ms`` (for gzip a sync flush: the file reads
back up to that point). Disk errors never reach the proxy: the events being written are dropped
and counted, ``write_errors`` counts failures, a warning is logged at most once per
``error_log_interval_s``, and the next chunk tries a fresh file.
"""

from __future__ import annotations

import contextlib
import gzip as gzip_module
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.logs import get_logger
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.quota.manager import Admitted, Decision, Rejected

__all__ = [
    "DEFAULT_MAX_QUEUED_EVENTS",
    "DEFAULT_ROTATE_BYTES",
    "DEFAULT_ROTATE_INTERVAL_S",
    "EVENT_FIELDS",
    "WOULD_REJECT",
    "EventLog",
    "EventLogStats",
    "event_file_name",
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

DEFAULT_ROTATE_BYTES = 128 * 1024 * 1024
DEFAULT_ROTATE_INTERVAL_S = 3600.0
DEFAULT_MAX_QUEUED_EVENTS = 100_000
DEFAULT_FLUSH_INTERVAL_MS = 1000
DEFAULT_ERROR_LOG_INTERVAL_S = 60.0
_CHUNK_EVENTS = 1024
"""Lines the writer takes from the queue at a time (bounds its own share of memory)."""

_dumps = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode


_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9._-]")


def event_file_name(instance: str, opened_at_s: float, seq: int, gzip: bool) -> str:
    """``pidgate-events-<instance>-<UTC yyyymmddTHHMMSS>-<seq>.jsonl[.gz]``, the instance with
    every character outside ``[A-Za-z0-9._-]`` (``:`` of ``host:port``) replaced by ``_``, so
    that every Hadoop filesystem (local, HDFS, S3A) accepts the name."""
    stamp = datetime.fromtimestamp(opened_at_s, UTC).strftime("%Y%m%dT%H%M%S")
    safe = _UNSAFE_IN_FILE_NAME.sub("_", instance)
    return f"pidgate-events-{safe}-{stamp}-{seq}.jsonl" + (".gz" if gzip else "")


@dataclass(frozen=True, slots=True)
class EventLogStats:
    """Counters for metrics and /state. ``queued_events``: lines waiting now;
    ``peak_queued_events``: the most ever waiting (never above ``max_queued_events``)."""

    written_events: int
    dropped_events: int
    files_rotated: int
    write_errors: int
    queued_events: int
    peak_queued_events: int


class _OpenFile:
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


class EventLog:
    """Appends PID events as JSON Lines without ever blocking the caller (see module doc).

    ``now_ms`` is the quota clock (``admission.quota_clock_ms``): it stamps ``ts_ms``.
    ``tokens_for(principal, now_ms)`` gives the principal's bucket tokens (None: untracked or
    unknown); omitted → ``tokens`` is always null. ``clock_s`` (wall seconds) names files and
    drives time rotation; tests inject one. Call ``close`` on shutdown.

    Thread-safety: ``on_decision`` and ``record_init_producer_id`` may be called from any thread
    (the proxy calls them from its event loop); the writer thread is private.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        instance: str,
        now_ms: Callable[[], int],
        tokens_for: Callable[[str, int], float | None] | None = None,
        gzip: bool = False,
        rotate_bytes: int = DEFAULT_ROTATE_BYTES,
        rotate_interval_s: float = DEFAULT_ROTATE_INTERVAL_S,
        max_queued_events: int = DEFAULT_MAX_QUEUED_EVENTS,
        flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS,
        error_log_interval_s: float = DEFAULT_ERROR_LOG_INTERVAL_S,
        clock_s: Callable[[], float] = time.time,
        logger: Any = None,
    ) -> None:
        if rotate_bytes <= 0:
            raise ValueError(f"rotate_bytes must be positive, not {rotate_bytes}")
        if rotate_interval_s <= 0:
            raise ValueError(f"rotate_interval_s must be positive, not {rotate_interval_s}")
        if max_queued_events <= 0:
            raise ValueError(f"max_queued_events must be positive, not {max_queued_events}")
        if flush_interval_ms <= 0:
            raise ValueError(f"flush_interval_ms must be positive, not {flush_interval_ms}")
        if not instance or "/" in instance or "\\" in instance:
            raise ValueError(
                f"instance must be a non-empty name usable in a file name: {instance!r}"
            )
        self.directory = Path(directory)
        self.instance = instance
        self.gzip = gzip
        self.rotate_bytes = rotate_bytes
        self.rotate_interval_s = rotate_interval_s
        self.max_queued_events = max_queued_events
        self.flush_interval_ms = flush_interval_ms
        self.error_log_interval_s = error_log_interval_s
        self._now_ms = now_ms
        self._tokens_for = tokens_for
        self._clock_s = clock_s
        self._log = logger

        # Shared between callers and the writer, under _lock.
        self._lock = threading.Lock()
        self._queue: deque[str] = deque()
        self._request_id = 0
        self._dropped = 0
        self._peak_queued = 0
        self._closing = False
        self._wakeup = threading.Event()

        # Written only by the writer thread (read anywhere: ints are atomic to read).
        self._written = 0
        self._files_rotated = 0
        self._write_errors = 0
        self._file: _OpenFile | None = None
        self._seq = 0
        self._last_error_log_s: float | None = None
        self._suppressed_errors = 0
        self._retry_after_s = 0.0

        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(
            target=self._run, name=f"pidgate-event-log-{instance}", daemon=True
        )
        self._thread.start()

    # --- counters -------------------------------------------------------------------------------

    @property
    def written_events(self) -> int:
        """Lines handed to the file (flushed at least every ``flush_interval_ms``)."""
        return self._written

    @property
    def dropped_events(self) -> int:
        """Events lost: queue full, a disk error while writing them, or logged after close."""
        return self._dropped

    @property
    def files_rotated(self) -> int:
        """Files closed because of size or age (not the last one closed by ``close``)."""
        return self._files_rotated

    @property
    def write_errors(self) -> int:
        """Failed open / write / flush / close operations."""
        return self._write_errors

    @property
    def queued_events(self) -> int:
        return len(self._queue)

    @property
    def current_path(self) -> Path | None:
        """The file being written, if one is open."""
        current = self._file
        return None if current is None else current.path

    def stats(self) -> EventLogStats:
        with self._lock:
            return EventLogStats(
                written_events=self._written,
                dropped_events=self._dropped,
                files_rotated=self._files_rotated,
                write_errors=self._write_errors,
                queued_events=len(self._queue),
                peak_queued_events=self._peak_queued,
            )

    # --- the request path -----------------------------------------------------------------------

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        """Queue one line per PID admitted as new or rejected (DecisionObserver)."""
        events: dict[int, str] = {}
        if isinstance(decision, Rejected):
            producer_ids, throttle_ms = decision.unknown_producer_ids, decision.throttle_time_ms
            events = dict.fromkeys(producer_ids, REJECTED)
        elif isinstance(decision, Admitted):
            throttle_ms = None
            events = dict.fromkeys(decision.new_producer_ids, ADMITTED_NEW)
            events.update(
                dict.fromkeys(decision.grandfathered_producer_ids, ADMITTED_GRANDFATHERED)
            )
            producer_ids = tuple(events)
        else:  # pragma: no cover - Decision is exactly these two
            return
        self._queue_events(context, request, producer_ids, events, throttle_ms)

    def on_would_reject(
        self, context: ProduceContext, request: ProduceRequestSummary, rejected: Rejected
    ) -> None:
        """Observe mode: one ``would_reject`` line per PID of a request enforcement would have
        rejected, with the fields of a ``rejected`` line (WouldRejectObserver)."""
        producer_ids = rejected.unknown_producer_ids
        events = dict.fromkeys(producer_ids, WOULD_REJECT)
        self._queue_events(context, request, producer_ids, events, rejected.throttle_time_ms)

    def _queue_events(
        self,
        context: ProduceContext,
        request: ProduceRequestSummary,
        producer_ids: tuple[int, ...],
        events: dict[int, str],
        throttle_ms: int | None,
    ) -> None:
        if not producer_ids:
            return
        now_ms = self._now_ms()
        tokens = None if self._tokens_for is None else self._tokens_for(context.principal, now_ms)
        if tokens is not None and not math.isfinite(tokens):
            tokens = None
        node_id = getattr(context, "node_id", None)
        if not isinstance(node_id, int):
            node_id = None
        # The first batch of every PID in one walk (first_batch_for per PID: O(PIDs x batches)).
        wanted = set(producer_ids)
        first: dict[int, tuple[TopicProduce, PartitionProduce, BatchHeader]] = {}
        for topic, partition, batch in request.iter_batches():
            pid = batch.producer_id
            if pid in wanted and pid not in first:
                first[pid] = (topic, partition, batch)
                if len(first) == len(wanted):
                    break
        request_id = self._next_request_id()
        lines: list[str] = []
        for pid in producer_ids:
            topic_name = partition_index = epoch = transactional = None
            found = first.get(pid)
            if found is not None:
                topic, partition, batch = found
                topic_name, partition_index = topic.name, partition.index
                epoch, transactional = batch.producer_epoch, batch.is_transactional
            lines.append(
                _dumps(
                    {
                        "ts_ms": now_ms,
                        "event": events[pid],
                        "principal": context.principal,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "client_id": context.client_id,
                        "client_software": context.client_software_name,
                        "topic": topic_name,
                        "partition": partition_index,
                        "node_id": node_id,
                        "instance": self.instance,
                        "throttle_ms": throttle_ms,
                        "tokens": tokens,
                        "request_id": request_id,
                        "transactional": transactional,
                    }
                )
            )
        self._enqueue(lines)

    def record_init_producer_id(
        self,
        principal: str,
        client_id: str | None,
        client_software: str | None,
        producer_id: int,
        producer_epoch: int,
        transactional: bool,
        ts_ms: int | None = None,
        *,
        node_id: int | None = None,
    ) -> None:
        """Queue an ``init_producer_id`` line: the cluster handed ``producer_id`` (epoch
        ``producer_epoch``) to ``principal``; ``transactional``: the request named a
        transactional id. ``ts_ms`` defaults to ``now_ms()``; ``node_id``: the broker that
        answered, when known."""
        line = _dumps(
            {
                "ts_ms": self._now_ms() if ts_ms is None else ts_ms,
                "event": INIT_PRODUCER_ID,
                "principal": principal,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "client_id": client_id,
                "client_software": client_software,
                "topic": None,
                "partition": None,
                "node_id": node_id,
                "instance": self.instance,
                "throttle_ms": None,
                "tokens": None,
                "request_id": self._next_request_id(),
                "transactional": transactional,
            }
        )
        self._enqueue([line])

    def _next_request_id(self) -> int:
        with self._lock:
            self._request_id += 1
            return self._request_id

    def _enqueue(self, lines: list[str]) -> None:
        wake = False
        with self._lock:
            queue = self._queue
            if self._closing or len(queue) + len(lines) > self.max_queued_events:
                self._dropped += len(lines)
                return
            wake = not queue
            queue.extend(lines)
            if len(queue) > self._peak_queued:
                self._peak_queued = len(queue)
        if wake:
            self._wakeup.set()

    # --- shutdown -------------------------------------------------------------------------------

    def close(self, timeout_s: float = 5.0) -> bool:
        """Stop taking events, write what is queued, close the file. Waits at most
        ``timeout_s``; True when everything was written and closed in time. Events still queued
        when the time is up are counted as dropped (the daemon thread may still finish them)."""
        with self._lock:
            self._closing = True
        self._wakeup.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._lock:
                self._dropped += len(self._queue)
                self._queue.clear()
            return False
        return True

    # --- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        flush_s = self.flush_interval_ms / 1000
        next_flush = time.monotonic() + flush_s
        dirty = False
        while True:
            self._wakeup.wait(max(0.0, next_flush - time.monotonic()) if dirty else flush_s)
            self._wakeup.clear()
            while True:
                with self._lock:
                    queue = self._queue
                    count = min(len(queue), _CHUNK_EVENTS)
                    chunk = [queue.popleft() for _ in range(count)]
                    closing = self._closing
                if chunk:
                    self._write_lines(chunk)
                    dirty = True
                if dirty and time.monotonic() >= next_flush:  # also while the queue stays busy
                    self._flush()
                    dirty = False
                    next_flush = time.monotonic() + flush_s
                if not chunk:
                    break
            current = self._file
            if current is not None and self._clock_s() - current.opened_at_s >= (
                self.rotate_interval_s
            ):
                self._close_file(rotated=True)  # an idle file whose interval ended
                dirty = False
            if closing:
                self._close_file(rotated=False)
                return

    def _write_lines(self, lines: list[str]) -> None:
        """Write ``lines``, rotating by size/age between lines; lines lost to a disk error are
        counted as dropped (the file is abandoned and a new one tried after a pause)."""
        pending: list[str] = []
        pending_bytes = 0
        now_s = self._clock_s()
        for line in lines:
            size = len(line) + 1  # ASCII (ensure_ascii) + newline
            current = self._file
            if current is not None:
                used = current.uncompressed_bytes + pending_bytes
                too_big = used > 0 and used + size > self.rotate_bytes
                if too_big or now_s - current.opened_at_s >= self.rotate_interval_s:
                    if self._write_pending(pending, pending_bytes):
                        self._close_file(rotated=True)
                    pending, pending_bytes = [], 0
            if self._file is None and not self._open_file():
                self._count_dropped(1)
                continue
            pending.append(line)
            pending_bytes += size
        self._write_pending(pending, pending_bytes)

    def _write_pending(self, pending: list[str], pending_bytes: int) -> bool:
        """Write ``pending`` to the open file; False (lines counted as dropped) on failure."""
        current = self._file
        if not pending:
            return current is not None
        if current is None:
            self._count_dropped(len(pending))
            return False
        try:
            self._write(current, ("\n".join(pending) + "\n").encode("ascii"))
        except OSError as error:
            self._disk_error("write", current.path, error)
            self._abandon_file()
            self._count_dropped(len(pending))
            return False
        current.uncompressed_bytes += pending_bytes
        self._written += len(pending)
        return True

    def _write(self, current: _OpenFile, data: bytes) -> None:
        """The one place bytes go to disk (tests replace it to simulate a slow disk)."""
        current.stream.write(data)

    def _open_file(self) -> bool:
        if time.monotonic() < self._retry_after_s:
            return False  # pausing after a disk error: one attempt per flush interval
        try:
            self.directory.mkdir(parents=True, exist_ok=True)  # recreated if someone removed it
        except OSError as error:
            self._disk_error("open", self.directory, error)
            self._pause_after_error()
            return False
        now_s = self._clock_s()
        for _ in range(10_000):
            path = self.directory / event_file_name(self.instance, now_s, self._seq, self.gzip)
            self._seq += 1
            try:
                raw = open(path, "xb")  # noqa: SIM115 - closed by _close_file
            except FileExistsError:
                continue
            except OSError as error:
                self._disk_error("open", path, error)
                self._pause_after_error()
                return False
            try:
                self._file = _OpenFile(path, raw, self.gzip, now_s)
            except OSError as error:
                with contextlib.suppress(OSError):
                    raw.close()
                self._disk_error("open", path, error)
                self._pause_after_error()
                return False
            return True
        self._disk_error("open", self.directory, OSError("no free event log file name"))
        self._pause_after_error()
        return False

    def _flush(self) -> None:
        current = self._file
        if current is None:
            return
        try:
            current.flush()
        except OSError as error:
            self._disk_error("flush", current.path, error)
            self._abandon_file()

    def _close_file(self, rotated: bool) -> None:
        current = self._file
        if current is None:
            return
        self._file = None
        try:
            current.close()
        except OSError as error:
            self._disk_error("close", current.path, error)
            return
        if rotated:
            self._files_rotated += 1

    def _abandon_file(self) -> None:
        """After an error: let go of the file (best effort) so the next chunk starts afresh."""
        current = self._file
        self._file = None
        if current is not None:
            with contextlib.suppress(OSError):
                current.raw.close()
        self._pause_after_error()

    def _pause_after_error(self) -> None:
        self._retry_after_s = time.monotonic() + self.flush_interval_ms / 1000

    def _count_dropped(self, count: int) -> None:
        with self._lock:
            self._dropped += count

    def _disk_error(self, operation: str, path: Path, error: OSError) -> None:
        self._write_errors += 1
        now_s = time.monotonic()
        last = self._last_error_log_s
        if last is not None and now_s - last < self.error_log_interval_s:
            self._suppressed_errors += 1
            return
        self._last_error_log_s = now_s
        suppressed, self._suppressed_errors = self._suppressed_errors, 0
        try:
            log = self._log if self._log is not None else get_logger()
            log.warning(
                "event_log_write_failed",
                operation=operation,
                path=str(path),
                error=str(error),
                write_errors=self._write_errors,
                dropped_events=self._dropped,
                suppressed_since_last=suppressed,
            )
        except Exception:  # logging must not kill the writer thread
            pass
