"""The schemas built in Python from the pipeline's DDL strings are the ones Spark's own parser
makes of them, and the pyarrow ones carry the same names and types."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from pidgate.pipeline.jobs.activity_parts import _PACKED_DDL, _PARTS_DDL
from pidgate.pipeline.reading.eventfacts import _FACT_DDL
from pidgate.pipeline.reading.schemas import arrow_schema, spark_struct

DDLS = {"facts": _FACT_DDL, "packed": _PACKED_DDL, "parts": _PARTS_DDL}


@pytest.mark.parametrize("ddl", DDLS.values(), ids=DDLS.keys())
def test_spark_struct_is_what_spark_parses(spark: SparkSession, ddl: str) -> None:
    parsed = spark.createDataFrame([], ddl).schema
    assert spark_struct(ddl) == parsed


@pytest.mark.parametrize("ddl", DDLS.values(), ids=DDLS.keys())
def test_arrow_schema_is_sparks_in_arrow(ddl: str) -> None:
    assert arrow_schema(ddl) == to_arrow_schema(spark_struct(ddl))


def test_binary_is_known_and_an_unknown_type_refused() -> None:
    with pytest.raises(KeyError):
        spark_struct("a decimal")
    assert pa.types.is_binary(arrow_schema("a binary").field("a").type)
