"""Checking a job's inputs before Spark starts, and turning an event-log path into files Spark
can read.

Every ``pidgate analyze`` job calls these first, so that a mistake costs one line on stderr and
a non-zero exit, not a JVM start and a Java stack trace:

* :func:`event_files`: a file, a directory (searched recursively) or a glob on the local
  filesystem becomes the list of files to read; nothing there is an :class:`InputError`.
  Other Hadoop URIs (``hdfs://``, ``s3a://``) are passed to Spark unchanged and checked through
  the session's Hadoop FileSystem by :func:`check_remote_exists`.
* Event-log files written before pidgate named them Hadoop-safely carry a ``:`` (the default
  instance ``host:port``), which Hadoop rejects ("Relative path in absolute URI"). Local ones
  are read through symbolic links with safe names in a temporary directory
  (:class:`EventFiles`, removed by :meth:`EventFiles.cleanup`); on other filesystems rename
  them (``hadoop fs -mv``), replacing ``:`` by ``_``.
* :func:`parse_utc` / :func:`check_period`: ``--since`` / ``--until``.

Standard library only: must not import pyspark, nor another pipeline room.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = [
    "EventFiles",
    "InputError",
    "check_local_dirs",
    "check_period",
    "check_remote_exists",
    "event_files",
    "is_local_path",
    "parse_utc",
]

_GLOB_CHARS = "*?[{"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class InputError(ValueError):
    """A user-facing input mistake: the message is one line, printed as is."""


def is_local_path(path: str) -> bool:
    """True for plain paths and ``file:`` URIs."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1


def _local(path: str) -> Path:
    parsed = urlparse(path)
    return Path(parsed.path if parsed.scheme == "file" else path).expanduser()


def _hidden(name: str) -> bool:
    # What Spark's file listing skips as well (``_SUCCESS``, ``.crc`` files, ``_GENERATED``).
    return name.startswith((".", "_"))


def _files_under(directory: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        found.extend(Path(root) / name for name in sorted(files) if not _hidden(name))
    return found


@dataclass
class EventFiles:
    """What to hand Spark for an event-log path: ``paths`` (files, or the one remote URI) and
    ``described`` (for the report). ``links_dir`` holds the safe-named links to old files whose
    names Hadoop rejects; call :meth:`cleanup` when the job is done."""

    paths: list[str]
    described: str
    local: bool
    file_count: int | None = None
    links_dir: Path | None = None
    renamed: int = 0
    _cleaned: bool = field(default=False, repr=False)

    def cleanup(self) -> None:
        if self.links_dir is not None and not self._cleaned:
            shutil.rmtree(self.links_dir, ignore_errors=True)
            self._cleaned = True


def event_files(path: str, flag: str = "--events") -> EventFiles:
    """The event-log files at ``path`` (a file, a directory or a glob); raises
    :class:`InputError` when a local path matches nothing or holds no files."""
    if not path.strip():
        raise InputError(f"{flag}: empty path")
    if not is_local_path(path):
        return EventFiles(paths=[path], described=path, local=False)
    local = _local(path)
    text = str(local)
    if any(ch in text for ch in _GLOB_CHARS):
        matches = sorted(glob.glob(text, recursive=True))
        if not matches and "{" in text:
            # Hadoop's {a,b} alternatives, which Python's glob lacks: Spark expands them.
            return EventFiles(paths=[path], described=path, local=False)
        if not matches:
            raise InputError(f"{flag} {path}: no file matches this pattern")
        files: list[Path] = []
        for match in map(Path, matches):
            files.extend(_files_under(match) if match.is_dir() else [match])
    elif local.is_dir():
        files = _files_under(local)
    elif local.is_file():
        files = [local]
    elif local.exists():
        raise InputError(f"{flag} {path}: not a file or a directory")
    else:
        raise InputError(f"{flag} {path}: no such file or directory")
    files = [f for f in files if f.is_file()]
    if not files:
        raise InputError(f"{flag} {path}: no event-log files there (no events to analyse)")
    unreadable = [f for f in files if not os.access(f, os.R_OK)]
    if unreadable:
        raise InputError(f"{flag} {path}: cannot read {unreadable[0]}")
    result = EventFiles(paths=[], described=path, local=True, file_count=len(files))
    for index, file in enumerate(files):
        absolute = file.resolve()
        if ":" in str(absolute):
            if result.links_dir is None:
                result.links_dir = Path(tempfile.mkdtemp(prefix="pidgate-events-links-"))
            # The extension stays last: Spark picks the codec (.gz) from it.
            link = result.links_dir / f"{index:06d}-{_UNSAFE.sub('_', absolute.name)}"
            link.symlink_to(absolute)
            result.paths.append(str(link))
            result.renamed += 1
        else:
            result.paths.append(str(absolute))
    return result


def check_local_dirs(paths: list[str], flag: str) -> None:
    """Every local path of ``paths`` must be an existing directory (URIs are left to Spark)."""
    for path in paths:
        if not is_local_path(path):
            continue
        local = _local(path)
        if not local.exists():
            raise InputError(f"{flag} {path}: no such directory")
        if not local.is_dir():
            raise InputError(f"{flag} {path}: not a directory")


def check_remote_exists(spark: Any, path: str, flag: str) -> None:
    """For a non-local URI: raise :class:`InputError` unless something exists there (a glob
    must match), asked through the session's Hadoop FileSystem. No-op for local paths and
    without a JVM gateway."""
    if is_local_path(path):
        return
    jvm = getattr(spark, "_jvm", None)
    jsc = getattr(spark, "_jsc", None)
    if jvm is None or jsc is None:
        return
    try:
        hpath = jvm.org.apache.hadoop.fs.Path(path)
        fs = hpath.getFileSystem(jsc.hadoopConfiguration())
        if any(ch in path for ch in _GLOB_CHARS):
            statuses = fs.globStatus(hpath)
            found = statuses is not None and len(statuses) > 0
        else:
            found = bool(fs.exists(hpath))
    except Exception as error:  # py4j wraps the Java exception; its first line is the reason
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{flag} {path}: cannot be read ({first})") from None
    if not found:
        raise InputError(f"{flag} {path}: no such file or directory")


def parse_utc(text: str, flag: str) -> datetime:
    """``2026-11-23``, ``2026-11-23T14:00`` or with seconds / ``Z`` / an offset; naive times
    are UTC."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{flag} {text!r}: not a date or time (use e.g. 2026-11-23 or 2026-11-23T14:00Z)"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def check_period(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    """``--since`` / ``--until`` as epoch milliseconds (either may be None); ``since`` must be
    before ``until``."""
    since_ms = int(parse_utc(since, "--since").timestamp() * 1000) if since else None
    until_ms = int(parse_utc(until, "--until").timestamp() * 1000) if until else None
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise InputError(f"--since {since} is not before --until {until}")
    return since_ms, until_ms
