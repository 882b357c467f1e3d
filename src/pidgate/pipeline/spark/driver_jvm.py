"""The driver JVM's start, made cheap for the short runs pidgate's jobs are.

A ``pidgate analyze`` run is a fresh JVM that lives for seconds to minutes. Most of a small
run went to warming that JVM up, not to the job: the same activity job over 1M events took
23.6 s in a fresh JVM and 8.8 s run again in the same one. Two standard HotSpot options take
most of that away, for every driver pidgate launches itself (not under spark-submit, which
chose its own JVM):

* ``-XX:TieredStopAtLevel=1``: only the quick C1 compiler. The C2 compiler's work pays off in
  long-lived JVMs; in a run of seconds it competes for the same cores as the job.
* **class-data sharing** (JEP 350, dynamic CDS; Java 13+, and pyspark 4 needs 17): the first
  run records the ~18,000 classes Spark loaded into an archive when its JVM exits
  (``-XX:ArchiveClassesAtExit``: about 190 MB and 15-20 s, once per installation); every later
  run maps them (``-XX:SharedArchiveFile``) instead of reading and verifying them from jars.
  The archive sits under ``~/.cache/pidgate/spark-jvm/`` (``$XDG_CACHE_HOME`` respected), named
  by a digest of the JVM and pyspark it was made with. The JVM checks it on every start and
  ignores one that does not match (JVM, class path); its CDS log lines are silenced, since they
  say nothing a user can act on.

Measured on the 2-core VM, 1M events, start + job, alternating: 33-36 s as before, 24-25 s
with either option, 18-19 s with both.

Both go in ``spark.driver.defaultJavaOptions``, which Spark puts before the user's
``spark.driver.extraJavaOptions`` (so a user's ``-Xmx`` does not turn them off), and before an
administrator's value of it in ``spark-defaults.conf`` (:mod:`~pidgate.pipeline.spark.jvm_options`);
a ``--conf spark.driver.defaultJavaOptions=...`` of the user's replaces them, as every ``--conf``
wins. The archive is the driver's alone: executors on other hosts cannot map it (they get C1
only, :mod:`~pidgate.pipeline.spark.jvm_options`).

Recording ends in :func:`finish_recording`, called by ``stop_session`` (and at exit): it ends
the JVM, waits for its archive (written aside, renamed when complete) and lets the next session
in this process start a new JVM. One process records at a time (its partial file, named by its
process id, is the claim); meanwhile others start with the JIT option alone. Nothing here
prints: ``pidgate analyze`` says why its first run takes longer to end
(:func:`recording_pending`). Must not import a job or ``outputs``.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidgate.pipeline.spark.jvm_options import C1_ONLY

__all__ = [
    "Recording",
    "archive_path",
    "cache_dir",
    "driver_java_options",
    "finish_recording",
    "recording_pending",
    "start_recording",
]

# CDS reports classes it skips and archives that do not match as warnings on stderr.
_QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_ARCHIVE_SUFFIX = ".jsa"
_PARTIAL_SUFFIX = ".jsa.part"
#: A partial archive older than this was left by a JVM that died while writing it.
_ABANDONED_AFTER_S = 3600.0
#: How long a recording JVM is given to write its archive (15-20 s measured on 2 busy cores).
_RECORDING_WAIT_S = 120.0


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pidgate/spark-jvm`` (default ``~/.cache/pidgate/spark-jvm``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pidgate" / "spark-jvm"


def _java() -> Path | None:
    """The java spark-submit runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.path.isfile(found):
        return None
    return Path(found).resolve()


def archive_path() -> Path | None:
    """Where the class archive for this JVM and pyspark lives (None: no java found). Named by
    a digest of the JVM's files and pyspark's version and jars, so an upgrade of either gets a
    new archive rather than one the JVM would reject."""
    java = _java()
    if java is None:
        return None
    import pyspark

    digest = hashlib.sha256()
    for path in (java, *sorted(java.parent.parent.glob("lib/server/libjvm.*"))):
        stat = path.stat()
        digest.update(f"{path} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    jars = Path(pyspark.__file__).parent / "jars"
    digest.update(f"{pyspark.__version__} {jars}\n".encode())
    if jars.is_dir():
        digest.update("\n".join(sorted(p.name for p in jars.iterdir())).encode())
    return cache_dir() / f"spark-classes-{digest.hexdigest()[:16]}{_ARCHIVE_SUFFIX}"


@dataclass(frozen=True)
class Recording:
    """A JVM started to record its classes: ``partial`` is renamed to ``target`` once the JVM
    has exited having written it."""

    partial: Path
    target: Path


def driver_java_options() -> tuple[str, Recording | None]:
    """The options for a driver JVM pidgate is about to start, and the recording they start
    (None when the archive exists, another live process is recording it, or the cache cannot
    be written: the JIT option alone then)."""
    target = archive_path()
    if target is None:
        return C1_ONLY, None
    if target.is_file():
        return f"{C1_ONLY} -XX:SharedArchiveFile={target} {_QUIET_CDS}", None
    if _failed_marker(target).exists():
        return C1_ONLY, None  # this JVM could not record (no base CDS archive, ...): not again
    partial = target.parent / f"{target.stem}.{os.getpid()}{_PARTIAL_SUFFIX}"
    # The path goes into a space-separated option string: a cache path with a space in it
    # cannot be passed, so such a run records nothing.
    if " " in str(partial):
        return C1_ONLY, None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if _someone_records(target):
            return C1_ONLY, None
        # Claimed now, written by the JVM when it exits (it replaces the file).
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError:
        return C1_ONLY, None
    return f"{C1_ONLY} -XX:ArchiveClassesAtExit={partial} {_QUIET_CDS}", Recording(partial, target)


def _recorder_pid(path: Path) -> int | None:
    """The process id in a partial archive's name (``spark-classes-<digest>.<pid>.jsa.part``)."""
    pid = path.name.removesuffix(_PARTIAL_SUFFIX).rpartition(".")[2]
    return int(pid) if pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _someone_records(target: Path) -> bool:
    """Whether another live process is recording ``target`` (one at a time: each recording
    costs its run 15-20 s); removes the partial archives their recorder left behind (it
    died, or over an hour ago on another host) and all but the newest archive of other JVMs or
    pyspark versions."""
    now = time.time()
    recording = False
    others: list[tuple[int, Path]] = []
    for path in target.parent.iterdir():
        name = path.name
        if not name.startswith("spark-classes-") or path == target:
            continue
        try:
            if name.endswith(_PARTIAL_SUFFIX):
                pid = _recorder_pid(path)
                fresh = now - path.stat().st_mtime < _ABANDONED_AFTER_S
                if pid is None or not fresh or not _alive(pid):
                    path.unlink()
                elif path.name.startswith(target.stem + "."):
                    recording = True
            elif name.endswith(_ARCHIVE_SUFFIX):
                others.append((path.stat().st_mtime_ns, path))
        except FileNotFoundError:
            continue  # another run removed it first
    # Another installation (its own JVM or pyspark) may share this cache: its newest archive
    # is kept, so two of them do not record in turns.
    for _, path in sorted(others, reverse=True)[1:]:
        path.unlink(missing_ok=True)
    return recording


_pending: tuple[Recording, Any] | None = None


def start_recording(recording: Recording, gateway: Any) -> None:
    """Note that the JVM behind ``gateway`` (py4j's, with pyspark's ``proc``) records
    ``recording``: :func:`finish_recording` completes it, at the latest when Python exits."""
    global _pending
    _pending = (recording, gateway)


def recording_pending() -> bool:
    """Whether this process's JVM is recording its classes (its run ends 15-20 s later)."""
    return _pending is not None


def finish_recording(wait_s: float = _RECORDING_WAIT_S) -> Path | None:
    """End the recording JVM (its SparkContext already stopped), wait up to ``wait_s`` for its
    archive and put it in place; the archive's path, or None (nothing was recording, or the
    JVM did not write it in time: the partial file is removed, and the next run records
    again). The next SparkSession of this process starts a new JVM."""
    global _pending
    if _pending is None:
        return None
    (recording, gateway), _pending = _pending, None
    from pyspark import SparkContext

    proc = gateway.proc
    # py4j's own shutdown errors do not matter: the JVM still exits when its stdin ends.
    with contextlib.suppress(Exception):
        gateway.shutdown()
    # The gateway JVM exits when its stdin ends (pyspark's java_gateway), writing the archive.
    if proc.stdin is not None:
        proc.stdin.close()
    if SparkContext._gateway is gateway:  # the next session launches a JVM of its own
        SparkContext._gateway = None
        SparkContext._jvm = None
    written = exited = False
    try:
        exited = proc.wait(timeout=wait_s) == 0
        # The claim was an empty file; the JVM replaced it with the archive.
        written = exited and recording.partial.stat().st_size > 0
    except OSError:
        pass
    except Exception:  # TimeoutExpired: the partial is removed below
        proc.kill()
    with contextlib.suppress(OSError):
        if written:
            os.replace(recording.partial, recording.target)
            return recording.target
        recording.partial.unlink(missing_ok=True)
        if exited:
            # The JVM ended well and wrote nothing: it cannot record (a JDK without its base
            # CDS archive, ...), so later runs do not try again, nor say they do.
            _failed_marker(recording.target).touch()
    return None


def _failed_marker(target: Path) -> Path:
    return target.with_suffix(".failed")


atexit.register(finish_recording)
