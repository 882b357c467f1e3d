"""Shipping pidgate to a cluster's executors: one archive of pidgate and its runtime
dependencies as installed on the driver, built once and cached.

The archive holds the import packages of pidgate and of every distribution its executors
import (pidgate's own requirements, pandas, numpy, pyarrow and what they require), never
pyspark or py4j (each Spark installation brings its own), matplotlib (only the driver draws)
or the parts of pyarrow no executor loads; with the bytecode of every module, compiled here
(the executors unpack the archive afresh for every application, and would compile it all again).
:func:`executor_archive` returns its path under ``~/.cache/pidgate/spark-env/``
(``$XDG_CACHE_HOME`` respected), named by a digest of the Python version, the platform, every
shipped distribution's version and pidgate's own source, so a change to any of them builds a
new one. The session adds it (``SparkContext.addArchive``, see
:mod:`pidgate.pipeline.spark.session`), Spark unpacks it on each executor as ``./pidgate-env``
and the executors' ``PYTHONPATH`` points there; it works when the workers run the same Python minor
version on the same platform as the driver (compiled extensions inside).

After building a new archive it prunes the cache (:func:`prune_cache`): older archives beyond
the newest :data:`KEPT_ARCHIVES`, and partial builds abandoned by a killed process, so a host
does not pile up about 75 MB per pidgate version.

Must not import pyspark, a job or ``outputs``: this is plain file work, testable without a JVM.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import importlib.util
import io
import marshal
import os
import platform
import re
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import pidgate

__all__ = [
    "ARCHIVE_ALIAS",
    "KEPT_ARCHIVES",
    "cache_dir",
    "executor_archive",
    "prune_cache",
    "shipped_distributions",
    "stale_archives",
]

#: The directory name the archive unpacks to on every executor (``spark.archives`` ``#alias``).
ARCHIVE_ALIAS = "pidgate-env"

# What the executors import besides pidgate's own requirements: pandas UDFs and Arrow. Not
# matplotlib (with its fonts and Pillow, a third of the archive): only the driver draws, and
# no module whose functions run on executors imports it (tests/pipeline/spark/test_cluster.py
# runs every job on a worker whose Python has nothing else).
_EXECUTOR_EXTRAS = ("pandas", "numpy", "pyarrow")
# Never shipped: Spark's own Python side comes with the worker's Spark; uvloop is the proxy's.
_NOT_SHIPPED = frozenset({"pyspark", "py4j", "pidgate", "uvloop"})
# Inside shipped packages, what no import needs: tests, C headers, Cython sources, and the
# driver's own bytecode (the archive carries bytecode compiled for it, :func:`_bytecode`).
_SKIPPED_DIRS = frozenset({"__pycache__", "tests", "include"})
_SKIPPED_SUFFIXES = (".pyc", ".pyx", ".pxd", ".pxi", ".h", ".hpp", ".cc", ".cpp")
# pyarrow's libraries that nothing an executor imports loads (checked with readelf: no other
# library needs them): Flight (RPC) and pyarrow's own S3 client (Spark reads S3 through
# Hadoop), its C++ test module, and the link-time copies of libarrow_python* (the loader asks
# for the ``.so.<major>`` names only). Over 50 MB of the 150 MB pyarrow installs.
_SKIPPED_PYARROW = re.compile(
    r"^pyarrow/(?:_flight\.|libarrow_flight\.|libarrow_python_flight\.|libarrow_s3\."
    r"|_pyarrow_cpp_tests\.|libarrow_python(?:_parquet_encryption)?\.so(?:\.\d+\.\d+\.\d+)?$)"
)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")

#: Archives kept in the cache after a build: the new one and the most recent previous one. Two,
#: not one, so two installations on one host (a rolling upgrade, a checkout beside a release)
#: keep one archive each instead of deleting and rebuilding each other's on every run; more
#: would keep 75 MB per version for versions that rarely come back.
#: (A third installation on the host rebuilds its archive on its next run after a prune.)
KEPT_ARCHIVES = 2
# What pidgate names its archives (``pidgate-env-<tag>-<digest>.tar.gz``): the only files
# pruning removes besides partial builds.
_ARCHIVE_NAME = re.compile(r"^pidgate-env-py\d+-[A-Za-z0-9_.]+-[0-9a-f]{16}\.tar\.gz$")
# A build in progress: ``mkstemp`` names, this module's prefix, or ``tmp`` from versions before
# it had one.
_PARTIAL_PREFIX = "pidgate-env-"
_PARTIAL_SUFFIX = ".tar.gz.part"
_PARTIAL_NAME = re.compile(r"^(?:pidgate-env-|tmp)[a-z0-9_]{8}(?:\.tar\.gz)?\.part$")
# A builder writes its partial file continuously for tens of seconds, so one untouched for an
# hour belongs to a process that died (killed, host rebooted): safe to remove.
_ABANDONED_AFTER_S = 3600.0
# Part of every archive's name digest: a change to what an archive holds for the same
# packages (2: bytecode added) builds a new one instead of reusing an older build.
_ARCHIVE_FORMAT = 2
# PEP 552 flags: hash-based, not checked against the source (the archive never changes).
_UNCHECKED_HASH_FLAGS = 0b01


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    """The distributions ``dist`` requires outside of extras (markers beyond ``extra`` are left
    to what is installed: a requirement that is not installed is not shipped)."""
    names = []
    for requirement in dist.requires or []:
        if "extra ==" in requirement.replace('"', "'") or "extra==" in requirement:
            continue
        match = _NAME.match(requirement)
        if match:
            names.append(match.group(1))
    return names


def shipped_distributions() -> list[metadata.Distribution]:
    """pidgate's runtime requirements and the executors' extras, with everything they require,
    as installed here (sorted by name)."""
    pending = [*_requirement_names(metadata.distribution("pidgate")), *_EXECUTOR_EXTRAS]
    found: dict[str, metadata.Distribution] = {}
    while pending:
        name = _normal(pending.pop())
        if name in found or name in _NOT_SHIPPED:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        pending.extend(_requirement_names(dist))
    return [found[name] for name in sorted(found)]


def _skipped(relative: Path) -> bool:
    if relative.parts and relative.parts[0] == "..":
        return True  # console scripts and data outside site-packages
    return (
        bool(_SKIPPED_DIRS.intersection(relative.parts[1:-1]))
        or relative.name.endswith(_SKIPPED_SUFFIXES)
        or bool(_SKIPPED_PYARROW.match(relative.as_posix()))
    )


def _dist_files(dist: metadata.Distribution) -> list[tuple[Path, str]]:
    """(file on disk, name in the archive) for every shipped file of ``dist``."""
    out = []
    for entry in dist.files or []:
        relative = Path(str(entry))
        if _skipped(relative) or relative.parts[0] == "__pycache__":
            continue
        source = Path(str(dist.locate_file(entry)))
        if source.is_file():
            out.append((source, relative.as_posix()))
    return out


def _pidgate_files() -> list[tuple[Path, str]]:
    # pidgate itself from where it is imported (an editable install's RECORD lists no sources).
    root = Path(pidgate.__file__).parent
    out = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            path = Path(directory) / name
            if not name.endswith(".pyc"):
                out.append((path, (Path("pidgate") / path.relative_to(root)).as_posix()))
    return out


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pidgate/spark-env`` (default ``~/.cache/pidgate/spark-env``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pidgate" / "spark-env"


def _digest(dists: list[metadata.Distribution], pidgate_files: list[tuple[Path, str]]) -> str:
    digest = hashlib.sha256()
    digest.update(f"format {_ARCHIVE_FORMAT}\n".encode())
    digest.update(f"{sys.version_info[:2]} {sys.platform} {platform.machine()}\n".encode())
    for dist in dists:
        digest.update(f"{dist.metadata['Name']}=={dist.version}\n".encode())
    for path, name in pidgate_files:
        digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _bytecode(source: bytes, name: str) -> bytes | None:
    """The ``.pyc`` for the module ``name`` (its path in the archive) with ``source``: an
    unchecked hash-based pyc (PEP 552) for this interpreter, or None when it does not compile
    here (a file only another Python version imports).

    Why ship bytecode: an executor unpacks the archive afresh for every application, so
    without it each Python worker compiled pandas, pyarrow and pidgate from source on its
    first import: 1.5-1.6 s against 0.4-0.5 s for the executor check's imports, measured with
    the worker's bare python3.11 over an unpacked archive. Unchecked, since the archive is
    never edited in place, and its source mtimes need not survive unpacking."""
    try:
        code = compile(source, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    header = importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH_FLAGS.to_bytes(4, "little")
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def _add_with_bytecode(archive: tarfile.TarFile, source: Path, name: str) -> None:
    archive.add(source, arcname=name, recursive=False)
    if not name.endswith(".py"):
        return
    pyc = _bytecode(source.read_bytes(), name)
    if pyc is None:
        return
    info = tarfile.TarInfo(importlib.util.cache_from_source(name))
    info.size = len(pyc)
    info.mtime = int(source.stat().st_mtime)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(pyc))


def executor_archive() -> Path:
    """The cached archive for this installation, built now if there is none (tens of seconds,
    once); safe against concurrent builders (written aside, then renamed)."""
    dists = shipped_distributions()
    own = _pidgate_files()
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}"
    target = cache_dir() / f"pidgate-env-{tag}-{_digest(dists, own)}.tar.gz"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    members = own + [item for dist in dists for item in _dist_files(dist)]
    handle, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=_PARTIAL_PREFIX, suffix=_PARTIAL_SUFFIX
    )
    os.close(handle)
    try:
        # Level 1: a third of the size at a fraction of level 9's time (mostly .so files).
        with tarfile.open(temporary, "w:gz", compresslevel=1) as archive:
            for source, name in members:
                _add_with_bytecode(archive, source, name)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    prune_cache(target)
    return target


def stale_archives(mtimes_ns: Mapping[Path, int], keep: int, current: Path) -> list[Path]:
    """Of the files in ``mtimes_ns`` (path: modification time), pidgate's archives to remove:
    all but ``current`` and the ``keep - 1`` most recently built others. Files not named like
    an archive are never in the answer."""
    others = [path for path in mtimes_ns if path != current and _ARCHIVE_NAME.match(path.name)]
    others.sort(key=lambda path: (mtimes_ns[path], path.name), reverse=True)
    return others[max(keep - 1, 0) :]


def _abandoned_partials(mtimes_ns: Mapping[Path, int], now_ns: int) -> list[Path]:
    limit_ns = now_ns - int(_ABANDONED_AFTER_S * 1e9)
    return [
        path
        for path, mtime_ns in mtimes_ns.items()
        if _PARTIAL_NAME.match(path.name) and mtime_ns < limit_ns
    ]


def _regular_files(directory: Path) -> dict[Path, int]:
    """Regular files directly in ``directory`` with their mtimes (ns); a file that vanishes
    while listed is left out."""
    found = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    found[Path(entry.path)] = entry.stat(follow_symlinks=False).st_mtime_ns
            except FileNotFoundError:
                continue
    return found


def _shown(directory: Path) -> str:
    home = os.path.expanduser("~")
    text = str(directory)
    if home not in ("~", "/") and text.startswith(home + os.sep):
        return "~" + text[len(home) :]
    return text


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _pruned_line(archives: int, partials: int, size_bytes: int, failures: list[OSError]) -> str:
    """What pruning did, for one stderr line ("" when it did nothing)."""
    removed = [_count(archives, "older executor archive")] if archives else []
    removed += [_count(partials, "abandoned partial build")] if partials else []
    line = f"removed {' and '.join(removed)} ({size_bytes / 1e6:.0f} MB)" if removed else ""
    if failures:
        cause = failures[-1].strerror or type(failures[-1]).__name__
        line += (
            "; " if line else ""
        ) + f"could not remove {_count(len(failures), 'file')} ({cause})"
    return line


def prune_cache(current: Path) -> None:
    """Remove older archives beyond :data:`KEPT_ARCHIVES` and abandoned partial builds from
    ``current``'s directory, and say so in one line on stderr. Never raises for a file it
    cannot remove (the job goes on): another process may have removed it first, or it is not
    ours to remove."""
    directory = current.parent
    try:
        files = _regular_files(directory)
    except OSError as error:
        print(f"could not list {_shown(directory)} to prune it: {error}", file=sys.stderr)
        return
    archives = stale_archives(files, KEPT_ARCHIVES, current)
    partials = _abandoned_partials(files, time.time_ns())
    removed: list[Path] = []
    removed_bytes = 0
    failures: list[OSError] = []
    for path in archives + partials:
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            continue  # another builder pruned it first
        except OSError as error:
            failures.append(error)
            continue
        removed.append(path)
        removed_bytes += size
    removed_archives = sum(1 for path in removed if path in archives)
    line = _pruned_line(removed_archives, len(removed) - removed_archives, removed_bytes, failures)
    if line:
        print(f"{line} from {_shown(directory)}", file=sys.stderr, flush=True)
