"""The cluster pieces that need no cluster: what is shipped, what a master URL needs, the
driver's address, the user's --conf over pidgate's settings, and the root cause of an error
raised by a real Python worker (on the shared local session)."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pidgate.pipeline.reading.inputs import InputError
from pidgate.pipeline.spark.errors import one_line, root_cause
from pidgate.pipeline.spark.masters import check_master, driver_host_for, spark_master_addresses
from pidgate.pipeline.spark.session import ClusterOptions, spark_session
from pidgate.pipeline.spark.shipping import executor_archive, shipped_distributions


def test_what_is_shipped_to_executors() -> None:
    names = {dist.metadata["Name"].lower().replace("_", "-") for dist in shipped_distributions()}
    assert {"pandas", "numpy", "pyarrow", "mmh3", "bitarray", "crc32c", "pyyaml"} <= names
    assert {"pydantic", "pydantic-core", "python-dateutil", "tzdata"} <= names
    assert not names & {"pyspark", "py4j", "pidgate", "uvloop"}
    # Only the driver draws: matplotlib and what it alone needs stay home.
    assert not names & {"matplotlib", "pillow", "fonttools", "kiwisolver", "contourpy"}


def test_no_module_an_executor_imports_needs_matplotlib() -> None:
    # Executors import the job modules whose functions they run; matplotlib is not shipped.
    modules = [
        "pidgate.pipeline.cli",
        *(f"pidgate.pipeline.jobs.{name}" for name in ("activity", "backtest", "footprint")),
        "pidgate.pipeline.jobs.snapshots",
    ]
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules)
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'PIL')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_archive_is_built_once_and_holds_pidgate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    archive = executor_archive()
    assert archive.parent == tmp_path / "pidgate" / "spark-env"
    built_at = archive.stat().st_mtime_ns
    assert executor_archive() == archive and archive.stat().st_mtime_ns == built_at
    with tarfile.open(archive) as opened:
        names = set(opened.getnames())
    assert {"pidgate/pipeline/jobs/footprint.py", "mmh3.cpython-311-x86_64-linux-gnu.so"} & names
    assert "pidgate/pipeline/jobs/footprint.py" in names and "pandas/__init__.py" in names
    assert not any(n.startswith(("pyspark/", "py4j/")) for n in names)
    assert not any("/tests/" in n for n in names)
    # Bytecode for this interpreter beside each shipped module, none the driver had lying about.
    tag = sys.implementation.cache_tag
    assert f"pandas/__pycache__/__init__.{tag}.pyc" in names
    assert f"pidgate/pipeline/jobs/__pycache__/footprint.{tag}.pyc" in names
    compiled = [n for n in names if n.endswith(".pyc")]
    assert all(importlib.util.source_from_cache(n) in names for n in compiled)
    # pyarrow without what no executor loads, with what every import of it needs.
    assert any(re.fullmatch(r"pyarrow/libarrow_python\.so\.\d+", n) for n in names)
    assert not any(re.fullmatch(r"pyarrow/libarrow_python\.so(\.\d+){3}", n) for n in names)
    assert not any(n.startswith(("pyarrow/libarrow_flight", "pyarrow/_flight")) for n in names)
    assert not any(n.startswith(("matplotlib/", "PIL/", "fontTools/")) for n in names)


def test_master_urls() -> None:
    assert spark_master_addresses("spark://a:7000,b") == [("a", 7000), ("b", 7077)]
    with pytest.raises(InputError, match=r"spark\.kubernetes\.container\.image"):
        check_master("k8s://https://api:6443", {}, {})
    check_master("k8s://https://api:6443", {"spark.kubernetes.container.image": "img"}, {})
    with pytest.raises(InputError, match="HADOOP_CONF_DIR or YARN_CONF_DIR"):
        check_master("yarn", {}, {})
    check_master("yarn", {}, {"YARN_CONF_DIR": "/etc/hadoop"})


def test_a_listening_master_passes_and_the_driver_host_routes_to_it() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        url = f"spark://127.0.0.1:{server.getsockname()[1]}"
        check_master(url, {}, {})
    assert driver_host_for(url) == "127.0.0.1"
    assert driver_host_for("yarn") is None


def test_the_users_conf_wins_over_the_local_defaults(spark: SparkSession) -> None:
    key = "spark.sql.shuffle.partitions"
    try:
        session = spark_session("local[2]", options=ClusterOptions(conf={key: "3"}))
        assert session.conf.get(key) == "3"
        assert spark_session("local[2]").conf.get(key) == "4"  # pidgate's local default
    finally:
        spark.conf.set(key, "2")


@pytest.mark.filterwarnings("ignore:Cannot infer the eval type")
def test_a_missing_module_on_the_executors_is_named(spark: SparkSession) -> None:
    @F.udf("string")
    def needs_a_module(value: str) -> str:
        import pidgate_not_installed_anywhere  # type: ignore[import-not-found]  # noqa: F401

        return value

    with pytest.raises(Exception) as caught:
        spark.range(1).select(needs_a_module(F.col("id").cast("string"))).collect()
    assert "PythonException" in type(caught.value).__name__
    line = one_line(caught.value)
    assert line.startswith("ModuleNotFoundError: No module named 'pidgate_not_installed_anywhere'")
    assert "install pidgate[analyze] on the workers" in line
    assert "\n" not in line
    # On Spark Connect pidgate ships nothing: the server's own Python must have the module.
    remote = one_line(caught.value, remote=True)
    assert "the Spark Connect server's Python lacks pidgate_not_installed_anywhere" in remote
    assert "--no-ship" not in remote


def test_root_cause_of_java_text() -> None:
    text = (
        "An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
        ": java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n"
        "\tat org.apache.spark.SparkContext.assertNotStopped(SparkContext.scala:120)\n"
        "Caused by: java.net.ConnectException: Connection refused\n"
    )
    assert root_cause(text) == "ConnectException: Connection refused"
