"""pyspark's worker daemon, started with pyspark imported from its installed package instead of
the ``pyspark.zip`` Spark puts first on the Python workers' path. Local masters run it
(``spark.python.daemon.module``, set by :mod:`pidgate.pipeline.spark.session`).

Why: a pip-installed pyspark carries its own sources a second time, in
``pyspark/python/lib/pyspark.zip``, and Spark starts every Python worker with that zip first on
``PYTHONPATH``. zipimport keeps no bytecode, so the daemon and then each worker it forks
compile pyspark's modules from source again: measured on the 2-core VM, importing
``pyspark.daemon`` and ``pyspark.worker`` took 1.39-1.42 s from the zip against 0.31-0.35 s
from the package, once in the daemon and again in each worker (which imports the worker module
after the fork). The zip and the package are one distribution, so the modules are the same.

Only a zip inside the installed package is dropped from the path (``<package>/python/lib/
pyspark.zip``); any other pyspark on the path (a Spark distribution's) is left as Spark put it.
This module is imported before pyspark, so it and its packages import nothing but the standard
library; must not import pyspark at import time, a job, or the rest of pidgate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

__all__ = ["main", "without_bundled_pyspark"]

_ZIP_NAME = "pyspark.zip"


def without_bundled_pyspark(
    path: Sequence[str],
    find_spec: Callable[[str, list[str]], ModuleSpec | None] = PathFinder.find_spec,
) -> list[str]:
    """``path`` without the ``pyspark.zip`` entries that lie inside the pyspark package the
    rest of ``path`` finds; unchanged when there is none, or the package is elsewhere."""
    zips = [entry for entry in path if Path(entry).name == _ZIP_NAME]
    rest = [entry for entry in path if entry not in zips]
    if not zips:
        return list(path)
    spec = find_spec("pyspark", rest)
    if spec is None or spec.origin is None:
        return list(path)
    package = Path(spec.origin).resolve().parent
    bundled = {entry for entry in zips if package in Path(entry).resolve().parents[2:3]}
    return [entry for entry in path if entry not in bundled]


def main() -> None:
    """Run pyspark's daemon (``python -m`` this module, as Spark runs the daemon module)."""
    sys.path[:] = without_bundled_pyspark(sys.path)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
