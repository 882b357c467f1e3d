"""The PID event log: JSON Lines of admitted-new / rejected PIDs and InitProducerId answers,
written by a background thread so that the request path never waits for a disk.

Owns ``EventLog`` (a ``DecisionObserver``) and its counters ``EventLogStats``; what a line and a
file look like is ``event_format``'s (field list, event kinds, file names).

Never blocking: ``on_decision`` / ``record_init_producer_id`` serialize the lines (json.dumps)
and append them to a bounded in-memory queue under a short lock. When the queue cannot hold all
of a request's events, all of them are dropped and counted (``dropped_events``) — a request is
logged whole or not at all, so the backtest never sees half a request. Memory is bounded by
``max_queued_events`` lines plus one writer chunk (``_CHUNK_EVENTS``).

A daemon thread drains the queue into files in ``directory`` (``event_file_name``), the time in
the name being when the file was opened and ``seq`` counting files opened by this EventLog (the
next free one is taken if a name exists; files are never overwritten). A file is closed and the
next one started when it would exceed ``rotate_bytes`` (uncompressed JSON Lines bytes; a single
line larger than that still gets written) or has been open ``rotate_interval_s``; an idle file
is closed when its interval ends, so finished hours are complete files for the pipeline. Data is
flushed to the OS at least every ``flush_interval_ms`` (for gzip a sync flush: the file reads
back up to that point). Disk errors never reach the proxy: the events being written are dropped
and counted, ``write_errors`` counts failures, a warning is logged at most once per
``error_log_interval_s``, and the next chunk tries a fresh file.

Must not import: the connection or server modules (they call us), asyncio (the writer is a
thread: the event loop is never asked to wait for it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.logs import get_logger
from pidgate.proxy.operations.event_format import (
    ADMITTED_GRANDFATHERED,
    ADMITTED_NEW,
    INIT_PRODUCER_ID,
    REJECTED,
    WOULD_REJECT,
    OpenEventFile,
    event_file_name,
    event_line,
    first_batches,
    produce_event_lines,
)
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.quota.manager import Admitted, Decision, Rejected

__all__ = [
    "DEFAULT_MAX_QUEUED_EVENTS",
    "DEFAULT_ROTATE_BYTES",
    "DEFAULT_ROTATE_INTERVAL_S",
    "EventLog",
    "EventLogStats",
]

DEFAULT_ROTATE_BYTES = 128 * 1024 * 1024
DEFAULT_ROTATE_INTERVAL_S = 3600.0
DEFAULT_MAX_QUEUED_EVENTS = 100_000
DEFAULT_FLUSH_INTERVAL_MS = 1000
DEFAULT_ERROR_LOG_INTERVAL_S = 60.0
_CHUNK_EVENTS = 1024
"""Lines the writer takes from the queue at a time (bounds its own share of memory)."""


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
        for name, value in (
            ("rotate_bytes", rotate_bytes),
            ("rotate_interval_s", rotate_interval_s),
            ("max_queued_events", max_queued_events),
            ("flush_interval_ms", flush_interval_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
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
        #: Events lost: queue full, a disk error while writing them, or logged after close.
        self.dropped_events = 0
        self._peak_queued = 0
        self._closing = False
        self._wakeup = threading.Event()

        # Written only by the writer thread (read anywhere: ints are atomic to read).
        #: Lines handed to the file (flushed at least every ``flush_interval_ms``).
        self.written_events = 0
        #: Files closed because of size or age (not the last one closed by ``close``).
        self.files_rotated = 0
        #: Failed open / write / flush / close operations.
        self.write_errors = 0
        self._file: OpenEventFile | None = None
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
                written_events=self.written_events,
                dropped_events=self.dropped_events,
                files_rotated=self.files_rotated,
                write_errors=self.write_errors,
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
        first = first_batches(request, producer_ids)
        lines = produce_event_lines(
            context,
            producer_ids,
            events,
            first,
            ts_ms=now_ms,
            instance=self.instance,
            throttle_ms=throttle_ms,
            tokens=tokens,
            request_id=self._next_request_id(),
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
        line = event_line(
            ts_ms=self._now_ms() if ts_ms is None else ts_ms,
            event=INIT_PRODUCER_ID,
            principal=principal,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            client_id=client_id,
            client_software=client_software,
            topic=None,
            partition=None,
            node_id=node_id,
            instance=self.instance,
            throttle_ms=None,
            tokens=None,
            request_id=self._next_request_id(),
            transactional=transactional,
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
                self.dropped_events += len(lines)
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
                self.dropped_events += len(self._queue)
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
        self.written_events += len(pending)
        return True

    def _write(self, current: OpenEventFile, data: bytes) -> None:
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
                self._file = OpenEventFile(path, raw, self.gzip, now_s)
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
            self.files_rotated += 1

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
            self.dropped_events += count

    def _disk_error(self, operation: str, path: Path, error: OSError) -> None:
        self.write_errors += 1
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
                write_errors=self.write_errors,
                dropped_events=self.dropped_events,
                suppressed_since_last=suppressed,
            )
        except Exception:  # logging must not kill the writer thread
            pass
