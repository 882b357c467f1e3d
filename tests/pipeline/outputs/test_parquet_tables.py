"""Small tables written by pyarrow (local paths) and by Spark (any other URI) read back alike,
and a table written earlier is replaced."""

from __future__ import annotations

from pathlib import Path

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from pidgate.pipeline.outputs.parquet_tables import _write_spark, write_tables

SCHEMA = StructType(
    [
        StructField("broker", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("entries", LongType(), True),
    ]
)


def test_pyarrow_and_spark_write_the_same_table(spark: SparkSession, tmp_path: Path) -> None:
    frame = pd.DataFrame({"broker": ["b0", "b1"], "partition": [3, 4], "entries": [7, None]})
    (tmp_path / "out" / "t.parquet").mkdir(parents=True)
    (tmp_path / "out" / "t.parquet" / "part-00007.parquet").write_bytes(b"stale")
    names = write_tables(spark, str(tmp_path / "out"), {"t": (frame, SCHEMA)}, {})
    assert names == ["t.parquet"]
    assert sorted(p.name for p in (tmp_path / "out" / "t.parquet").iterdir()) == [
        "_SUCCESS",
        "part-00000.parquet",
    ]
    _write_spark(spark, frame, SCHEMA, str(tmp_path / "spark.parquet"))
    by_pyarrow = spark.read.parquet(str(tmp_path / "out" / "t.parquet"))
    by_spark = spark.read.parquet(str(tmp_path / "spark.parquet"))
    assert (
        by_pyarrow.dtypes
        == by_spark.dtypes
        == [
            ("broker", "string"),
            ("partition", "int"),
            ("entries", "bigint"),
        ]
    )
    assert sorted(by_pyarrow.collect()) == sorted(by_spark.collect())
    assert sorted(tuple(r) for r in by_spark.collect()) == [("b0", 3, 7), ("b1", 4, None)]
