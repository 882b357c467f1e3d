"""The one place pipeline jobs get a SparkSession from.

``local[*]`` by default (embedded Spark, nothing to set up); any cluster through ``master`` or
spark-submit. For local masters the settings that matter on small machines are applied
(DESIGN.md perf notes): loopback bind address, 4 shuffle partitions instead of 200, no UI,
and Python workers run this interpreter (``PYSPARK_PYTHON``, if unset).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

__all__ = ["spark_session", "stop_session"]

_LOCAL_SHUFFLE_PARTITIONS = 4


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-")


def spark_session(master: str | None = None, app_name: str = "pidgate") -> SparkSession:
    """Return the active SparkSession, creating it if needed.

    ``master`` defaults to ``local[*]`` unless spark-submit already set ``spark.master``.
    Arrow transfer is enabled (the backtest uses applyInPandas), the UI is disabled and the log
    level is WARN.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    # Under spark-submit (or the pyspark shell) the launcher already chose the master.
    launched = "PYSPARK_GATEWAY_PORT" in os.environ or "PYSPARK_SUBMIT_ARGS" in os.environ
    effective = master or ("" if launched else "local[*]")
    if effective:
        builder = builder.master(effective)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if not effective or _is_local(effective):
        builder = builder.config("spark.sql.shuffle.partitions", str(_LOCAL_SHUFFLE_PARTITIONS))
    if effective and _is_local(effective):
        # Python workers must be this interpreter (the venv with pandas, pyarrow and pidgate),
        # not whatever "python3" is first on PATH. Clusters configure their own.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = builder.getOrCreate()
    if _is_local(session.sparkContext.master or ""):
        session.conf.set("spark.sql.shuffle.partitions", str(_LOCAL_SHUFFLE_PARTITIONS))
    session.sparkContext.setLogLevel("WARN")
    return session


def stop_session() -> None:
    """Stop the active SparkSession, if there is one."""
    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
