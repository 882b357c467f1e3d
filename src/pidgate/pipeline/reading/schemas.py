"""Flat schemas written once, as Spark DDL (``"name type, name type, ..."``), and turned into a
Spark :class:`~pyspark.sql.types.StructType` or a pyarrow schema without a running JVM (Spark's
own DDL parser needs one, and these schemas are module constants).

Only the flat column types the event log and the jobs' tables use are known: ``string``,
``boolean``, ``tinyint``, ``int``, ``bigint`` and ``double``; every field is nullable, as with
Spark's parser. Imports pyspark's types and pyarrow only; no other pipeline module.
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

__all__ = ["arrow_schema", "spark_struct"]

_SPARK_TYPES: dict[str, DataType] = {
    t.simpleString(): t
    for t in (
        StringType(),
        BinaryType(),
        BooleanType(),
        ByteType(),
        IntegerType(),
        LongType(),
        DoubleType(),
    )
}
_ARROW_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "double": pa.float64(),
}


def _columns(ddl: str) -> list[tuple[str, str]]:
    """``(name, type)`` per comma-separated ``name type`` of ``ddl``."""
    columns = []
    for column in ddl.split(","):
        name, type_name = column.split()
        columns.append((name, type_name.lower()))
    return columns


def spark_struct(ddl: str) -> StructType:
    """The Spark schema of ``ddl``, every field nullable."""
    return StructType([StructField(name, _SPARK_TYPES[t]) for name, t in _columns(ddl)])


def arrow_schema(ddl: str) -> pa.Schema:
    """The pyarrow schema of ``ddl``, every field nullable."""
    return pa.schema([(name, _ARROW_TYPES[t]) for name, t in _columns(ddl)])
