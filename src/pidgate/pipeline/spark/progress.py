"""What ``pidgate analyze`` tells the user while Spark works: stage lines and task progress on
stderr, and the closing summary.

:class:`Progress` prints ``[  12.3s] <stage>`` when a job moves on to a new stage of its own
work (jobs call :meth:`Progress.stage`), and while Spark runs tasks a watcher thread polls the
session's status tracker and prints ``[  14.1s]   spark: 37/120 tasks (stage 4)`` at most every
``every_s`` seconds (a line only when something changed), so a long job is never silent. Jobs
add closing lines with :meth:`Progress.summarize`; the CLI prints them at the end.

Standard library only: must not import pyspark, a job or ``outputs``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Progress", "stage"]


class Progress:
    """Stage lines, a Spark task watcher and the summary, all to ``stream`` (stderr)."""

    def __init__(
        self, stream: TextIO | None = None, every_s: float = 2.0, poll_s: float = 0.5
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.poll_s = poll_s
        self.summary: list[str] = []
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _print(self, text: str) -> None:
        with self._lock:
            print(f"[{time.monotonic() - self._t0:6.1f}s] {text}", file=self.stream, flush=True)

    def stage(self, text: str) -> None:
        self._print(text)

    def summarize(self, *lines: str) -> None:
        self.summary.extend(lines)

    def watch(self, spark: Any) -> None:
        """Start printing Spark task progress of ``spark`` (a SparkSession); :meth:`close`
        stops it. Without a SparkContext (Spark Connect) only stage lines are printed."""
        try:
            tracker = spark.sparkContext.statusTracker()
        except Exception:
            return
        self._thread = threading.Thread(
            target=self._watch, args=(tracker,), name="pidgate-analyze-progress", daemon=True
        )
        self._thread.start()

    def _watch(self, tracker: Any) -> None:
        last_line = ""
        last_at = 0.0
        while not self._stop.wait(self.poll_s):
            try:
                done = total = 0
                stage_ids = sorted(tracker.getActiveStageIds())
                for stage_id in stage_ids:
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
            except Exception:  # the context went away: nothing more to watch
                return
            if not stage_ids or total == 0:
                continue
            now = time.monotonic()
            label = "stage" if len(stage_ids) == 1 else "stages"
            line = f"  spark: {done}/{total} tasks ({label} {', '.join(map(str, stage_ids))})"
            if line != last_line and now - last_at >= self.every_s:
                self._print(line)
                last_line, last_at = line, now

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None


def stage(progress: Progress | None, text: str) -> None:
    """``progress.stage(text)`` when there is a Progress."""
    if progress is not None:
        progress.stage(text)
