"""Shared fixtures for the pipeline tests: one local[2] SparkSession for the whole run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pidgate.pipeline.spark.session import spark_session, stop_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", app_name="pidgate-tests")
    # Test inputs are tiny: fewer shuffle tasks than the local default of 4 saves seconds.
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    stop_session()
