"""Before a job runs on a cluster: are there executors, can they run pidgate, and do they see
the local paths the driver was given?

:func:`check_executors` waits (``wait_s``) for the first executor to register, then runs one
small Spark job with a task per executor core. Each task reports its host, its Python and
what it can import, and for each :class:`LocalPath`, whether it sees the files the driver sees
and, for an output directory, the token file the driver wrote there and whether
it can write beside it. Any difference is an :class:`InputError` naming the executor's host,
the path and the next step, instead of a job that hangs, fails deep in a Python worker, or
exits 0 having written its output where the driver never looks.

The probe runs as the kind of Python task the job runs (``mapInArrow`` for the DataFrame jobs,
an RDD task for the segment jobs), so the job's first tasks find Python workers started and
their imports done; where Arrow cannot run at all, the RDD probe says why.

The task function is nested so that cloudpickle ships it by value: it runs on executors that
have no pidgate, which is one of the things it finds out.

Must not import a job or ``outputs``.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidgate.pipeline.reading.inputs import InputError

__all__ = ["LocalPath", "check_executors", "sample_files"]

_EXECUTOR_IMPORTS = ("pidgate", "pandas", "pyarrow", "numpy", "mmh3", "bitarray", "crc32c")
_SHARED_STORAGE = (
    "put it on storage every worker mounts at the same path (NFS, ...), or use a Hadoop URI "
    "(hdfs://, s3a://)"
)


@dataclass(frozen=True)
class LocalPath:
    """A local path a job reads (``files``: a sample of the files there, which the executors
    must see) or writes (``output``: a directory; the driver writes a token there)."""

    flag: str
    path: str
    files: tuple[str, ...] = ()
    output: bool = False


def sample_files(paths: list[str], limit: int = 3) -> tuple[str, ...]:
    """Up to ``limit`` regular files under ``paths`` (files or directories), resolved."""
    found: list[str] = []
    for path in paths:
        local = Path(path.removeprefix("file://").removeprefix("file:")).expanduser()
        candidates = [local] if local.is_file() else []
        if local.is_dir():
            for root, dirs, files in os.walk(local):
                dirs.sort()
                candidates.extend(Path(root) / name for name in sorted(files)[:limit])
                if len(candidates) >= limit:
                    break
        for candidate in candidates:
            if candidate.is_file() and len(found) < limit:
                found.append(str(candidate.resolve()))
    return tuple(found)


def _wait_for_executors(spark: Any, master: str, wait_s: float) -> int:
    tracker = spark.sparkContext._jsc.sc()
    deadline = time.monotonic() + wait_s
    while True:
        # getExecutorMemoryStatus lists the driver too.
        count = int(tracker.getExecutorMemoryStatus().size()) - 1
        if count > 0 or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if count <= 0:
        host = spark.sparkContext.getConf().get("spark.driver.host", "?")
        raise InputError(
            f"--master {master}: no executor started within {wait_s:g} s: the cluster has no "
            f"worker with free cores and memory, or the workers cannot connect back to the "
            f"driver at {host} (set --driver-host to an address they reach)"
        )
    return count


def _probe_task(tokens: dict[str, str], checks: list[LocalPath], imports: tuple[str, ...]) -> Any:
    # Plain tuples: the executors may not be able to import LocalPath's module.
    plain = [(c.flag, c.path, c.files, c.output) for c in checks]

    def probe(_: Any) -> Any:
        import importlib
        import os
        import platform
        import socket
        import sys
        import time

        time.sleep(0.3)  # hold the core, so that the other tasks go to other executors
        failed = {}
        for name in imports:
            try:
                importlib.import_module(name)
            except Exception as error:
                failed[name] = f"{type(error).__name__}: {error}"
        problems = []
        for flag, root, files, output in plain:
            # Existence, not size: an event log or a live log dir grows while we look.
            missing = [path for path in files if not os.path.exists(path)]
            if missing:
                problems.append((flag, root, f"cannot see {missing[0]}"))
            if output:
                token = os.path.join(root, tokens[root])
                try:
                    with open(token) as handle:
                        mine = handle.read() == tokens[root]
                except OSError:
                    mine = False
                if not mine:
                    problems.append((flag, root, "does not see the driver's files there"))
                    continue
                beside = f"{token}.{socket.gethostname()}.{os.getpid()}"
                try:
                    with open(beside, "w") as handle:
                        handle.write("x")
                    os.unlink(beside)
                except OSError as error:
                    problems.append((flag, root, f"cannot write there ({error.strerror})"))
        version = ".".join(map(str, sys.version_info[:3]))
        yield (socket.gethostname(), sys.executable, version, platform.machine(), failed, problems)

    return probe


def _probe_through_arrow(spark: Any, slots: int, probe: Any) -> list[Any]:
    """Run ``probe`` once per slot as a ``mapInArrow`` task, the kind the jobs run.

    Why not an RDD task: Spark keeps one pool of Python workers per environment, and its SQL
    runners add a variable of their own, so an RDD probe's workers never serve a job's
    ``mapInArrow`` or pandas UDF tasks (checked with the workers' process ids). Probing
    through Arrow leaves the job Python workers that are started and have imported pidgate,
    pandas and pyarrow, instead of a second daemon and workers booting at its first stage
    (0.9 s boot and 0.7 s imports per worker in an executor's log). Raises whatever Spark
    raises when Arrow cannot run on the executors."""

    def through_arrow(batches: Any) -> Any:
        import json

        import pyarrow

        for _ in batches:
            pass
        for report in probe(None):
            yield pyarrow.RecordBatch.from_pydict({"report": [json.dumps(report)]})

    frame = spark.range(0, slots, 1, slots).mapInArrow(through_arrow, "report string")
    return [json.loads(row.report) for row in frame.collect()]


def check_executors(
    spark: Any,
    master: str,
    checks: list[LocalPath],
    *,
    shipped: bool,
    through_arrow: bool = True,
    wait_s: float = 60.0,
) -> list[str]:
    """Raise :class:`InputError` unless executors start, import pidgate and see ``checks``;
    return the executors' hosts. ``through_arrow``: probe with the kind of Python task the job
    runs (DataFrame ones; False: RDD ones), whose workers the job then reuses."""
    count = _wait_for_executors(spark, master, wait_s)
    tokens: dict[str, str] = {}
    created: list[Path] = []
    try:
        for check in checks:
            if check.output:
                directory = Path(check.path)
                missing = [p for p in [directory, *directory.parents] if not p.exists()]
                directory.mkdir(parents=True, exist_ok=True)
                created.extend(missing)
                name = f".pidgate-probe-{secrets.token_hex(8)}"
                (directory / name).write_text(name)
                tokens[check.path] = name
        sc = spark.sparkContext
        slots = max(count, sc.defaultParallelism)
        probe = _probe_task(tokens, checks, _EXECUTOR_IMPORTS)
        results = None
        if through_arrow:
            # Where Arrow cannot run at all (no pyarrow, ...), the plain probe says why.
            with suppress(Exception):
                results = _probe_through_arrow(spark, slots, probe)
        if results is None:
            results = sc.parallelize(range(slots), slots).mapPartitions(probe).collect()
    finally:
        for check in checks:
            if check.path in tokens:
                (Path(check.path) / tokens[check.path]).unlink(missing_ok=True)
        for directory in created:  # deepest first; only if still empty
            try:
                directory.rmdir()
            except OSError:
                break
    driver_version = ".".join(map(str, sys.version_info[:2]))
    for host, python, version, _machine, failed, problems in results:
        if shipped and not version.startswith(driver_version + "."):
            raise InputError(
                f"executors on {host} run Python {version} ({python}); the shipped packages "
                f"need {driver_version}: set --executor-python to a Python {driver_version} "
                "there, or ship your own environment (--no-ship, --conf spark.archives=...)"
            )
        if failed:
            name, reason = next(iter(failed.items()))
            step = (
                "the shipped archive does not fit their Python or platform: ship your own "
                "environment (--no-ship, --conf spark.archives=...)"
                if shipped
                else "install pidgate[analyze] there, or let pidgate ship it (drop --no-ship)"
            )
            raise InputError(
                f"executors on {host} ({python}) cannot import {name}: {reason}; {step}"
            )
        for flag, path, what in problems:
            raise InputError(
                f"{flag} {path}: a local path the executors on {host} do not share (the executor "
                f"{what}); {_SHARED_STORAGE}"
            )
    return sorted({host for host, *_ in results})
