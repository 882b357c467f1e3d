"""Local masters' Python workers import pyspark from its installed package, not from the
``pyspark.zip`` Spark puts first on their path (``pipeline/spark/python_daemon.py``).

The path rule on a built tree of files, then the real thing: a local[2] session's Python
worker reports where its pyspark came from and what its path holds.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from pidgate.pipeline.spark.python_daemon import without_bundled_pyspark


def _package(root: Path) -> tuple[str, str]:
    """A pyspark package under ``root`` with its bundled zip: (the package's parent, the zip)."""
    package = root / "site-packages" / "pyspark"
    (package / "python" / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    bundled = package / "python" / "lib" / "pyspark.zip"
    with zipfile.ZipFile(bundled, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    return str(root / "site-packages"), str(bundled)


def test_the_zip_inside_the_installed_package_leaves_the_path(tmp_path: Path) -> None:
    site, bundled = _package(tmp_path)
    py4j = str(tmp_path / "py4j-0.10.9.9-src.zip")
    assert without_bundled_pyspark([bundled, py4j, site]) == [py4j, site]


def test_a_distributions_zip_stays(tmp_path: Path) -> None:
    """SPARK_HOME of a Spark distribution: its zip is the only pyspark, or another one than
    the package on the path; either way Spark's path is kept as it is."""
    site, _ = _package(tmp_path / "venv")
    distribution = tmp_path / "spark-4.0.1" / "python" / "lib"
    distribution.mkdir(parents=True)
    (distribution / "pyspark.zip").write_bytes(b"")
    other = str(distribution / "pyspark.zip")
    assert without_bundled_pyspark([other, site]) == [other, site]
    assert without_bundled_pyspark([other]) == [other]
    assert without_bundled_pyspark(["", "/nowhere"]) == ["", "/nowhere"]


def _where_pyspark_comes_from(_: object) -> list[tuple[str, bool, bool]]:
    import os
    import sys

    import pyspark as worker_pyspark

    on_path = any(entry.endswith("pyspark.zip") for entry in sys.path)
    given = "pyspark.zip" in os.environ.get("PYTHONPATH", "")
    return [(str(worker_pyspark.__file__), on_path, given)]


def test_a_local_sessions_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "pidgate.pipeline.spark.python_daemon"
    reports = set(
        spark.sparkContext.parallelize(range(4), 2)
        .mapPartitions(_where_pyspark_comes_from)
        .collect()
    )
    # Spark gave the workers the zip first on PYTHONPATH; the daemon took it off sys.path.
    assert reports == {(str(pyspark.__file__), False, True)}
