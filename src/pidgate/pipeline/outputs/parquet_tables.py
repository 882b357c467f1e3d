"""Writing a job's outputs as Parquet: small tables already on the driver without a Spark job
where the filesystem allows, big ones through Spark, several at once.

A Spark write costs a job (0.3-2 s on a small machine) however small the table. A table the
driver already holds in pandas goes to a local path (or ``file:`` URI) through pyarrow, in the
layout Spark writes (a ``<name>.parquet`` directory holding one part file and ``_SUCCESS``, so
``spark.read.parquet`` and ``pyarrow.parquet.read_table`` read both alike), and to any other
Hadoop URI (``hdfs://``, ``s3a://``) through Spark from one ``createDataFrame``: one job. Jobs
are submitted from a few threads, so their fixed costs overlap. Tables the tasks write
themselves go to a :func:`staging_dir` beside the output and are moved into place by
:func:`publish` once the job succeeded.

No Spark job is started here other than the writes themselves.

Must not import a job, ``reading`` or ``spark``: ``outputs`` imports no other pipeline room.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from urllib.parse import urlparse

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType
from pyspark.util import inheritable_thread_target

from pidgate.pipeline.outputs.report import is_local_uri, join_uri

__all__ = ["SmallTable", "local_path", "publish", "staging_dir", "write_tables"]

SmallTable = tuple[pd.DataFrame, StructType]
"""A pandas table and the Spark schema its Parquet file gets."""

_PART_FILE = "part-00000.parquet"
_MAX_CONCURRENT_JOBS = 4


def local_path(uri: str) -> Path:
    """The directory a local path or ``file:`` URI names."""
    parsed = urlparse(uri)
    return Path(parsed.path if parsed.scheme == "file" else uri)


def _write_local(frame: pd.DataFrame, schema: StructType, uri: str) -> None:
    """``uri`` replaced by a directory with one Parquet file, swapped in by rename."""
    target = local_path(uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    arrow_schema = to_arrow_schema(schema)
    table = pa.Table.from_pandas(frame[schema.fieldNames()], arrow_schema, preserve_index=False)
    pq.write_table(table, staging / _PART_FILE)
    (staging / "_SUCCESS").touch()
    if target.is_dir():
        shutil.rmtree(target)
    elif target.exists():
        target.unlink()
    staging.rename(target)


def _write_spark(spark: SparkSession, frame: pd.DataFrame, schema: StructType, uri: str) -> None:
    rows = frame[schema.fieldNames()]
    spark.createDataFrame(rows, schema).coalesce(1).write.mode("overwrite").parquet(uri)


def write_tables(
    spark: SparkSession,
    output_dir: str,
    small: Mapping[str, SmallTable],
    big: Mapping[str, DataFrame],
) -> list[str]:
    """Write ``<output_dir>/<name>.parquet`` for every table (overwriting): ``small`` pandas
    tables through pyarrow when ``output_dir`` is local, else through Spark; ``big`` DataFrames
    through Spark's writer. The Spark jobs run concurrently. Returns the file names written."""
    jobs: list[Callable[[], None]] = []
    local = is_local_uri(output_dir)
    for name, (frame, schema) in small.items():
        uri = join_uri(output_dir, f"{name}.parquet")
        if local:
            _write_local(frame, schema, uri)
        else:
            jobs.append(partial(_write_spark, spark, frame, schema, uri))
    for name, data in big.items():
        uri = join_uri(output_dir, f"{name}.parquet")
        jobs.append(partial(data.write.mode("overwrite").parquet, uri))
    if jobs:
        with ThreadPoolExecutor(min(len(jobs), _MAX_CONCURRENT_JOBS)) as pool:
            for future in [pool.submit(inheritable_thread_target(spark)(job)) for job in jobs]:
                future.result()
    return [f"{name}.parquet" for name in (*small, *big)]


def staging_dir(output_dir: str) -> Path:
    """A new empty directory beside ``output_dir`` (local) where tasks write tables that
    :func:`publish` moves into place once the job succeeded."""
    target = local_path(output_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))


def publish(staging: Path, output_dir: str, names: Sequence[str]) -> list[str]:
    """Move the table directories ``names`` from ``staging`` into ``output_dir`` (replacing
    earlier ones), each marked with ``_SUCCESS`` as Spark's writer does; return ``names``."""
    target = local_path(output_dir)
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = staging / name
        (source / "_SUCCESS").touch()
        destination = target / name
        if destination.is_dir():
            shutil.rmtree(destination)
        elif destination.exists():
            destination.unlink()
        source.rename(destination)
    return list(names)
