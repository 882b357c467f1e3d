"""``pidgate analyze --master spark://...`` on a real standalone cluster: a Master here and a
Worker in a network namespace (its own address, standing in for another host) whose executors
run the system's bare Python 3 (no pandas, no pidgate), started once for the module
(:mod:`tests.pipeline.spark.spark_cluster`).

Each job's results on the cluster equal a local run's; a local path the executors do not share
is refused before the job runs; a worker without pidgate, an unreachable master and YARN
without its configuration are one line each. The CLI runs as a user runs it, in a subprocess,
with ``SPARK_LOCAL_IP=127.0.0.1`` exported as scripts/test does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

import pidgate
from pidgate.pipeline.cli import add_analyze_parser, run_analyze
from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
from pidgate.pipeline.reading.logdirs import generate_log_dirs

from .spark_cluster import StandaloneCluster, standalone_cluster, unavailable

pytestmark = pytest.mark.timeout(600)

DATA = Path(__file__).parents[1] / "data"
SRC = Path(pidgate.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    reason = unavailable()
    if reason:
        pytest.skip(f"no namespace cluster: {reason}")
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as running:
        yield running


def analyze(*argv: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    """``pidgate analyze ARGV`` in a subprocess, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_PYTHON", None)
    return subprocess.run(
        [sys.executable, "-m", "pidgate", "analyze", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )


def on(cluster: StandaloneCluster) -> list[str]:
    """``--master`` and, as a user of a 2-core cluster would, fewer shuffle partitions than
    Spark's 200 (tiny inputs: saves minutes of empty tasks)."""
    return ["--master", cluster.master_url, "--conf", "spark.sql.shuffle.partitions=4"]


def analyze_here(*argv: str) -> int:
    """The same job in this process, on the shared local[2] session."""
    root = argparse.ArgumentParser(prog="pidgate")
    add_analyze_parser(root.add_subparsers(dest="command", required=True))
    return run_analyze(root.parse_args(["analyze", *argv]))


def tables(output: Path) -> dict[str, pd.DataFrame]:
    """Every Parquet table under ``output``, rows in a canonical order."""
    out = {}
    for table in sorted(output.glob("*.parquet")):
        frame = pq.read_table(table).to_pandas()
        columns = list(frame.columns)
        frame = frame.astype({c: "string" for c in columns if frame[c].dtype == object})
        out[table.name] = frame.sort_values(columns).reset_index(drop=True)
    return out


def assert_same_tables(cluster_out: Path, local_out: Path) -> None:
    got, want = tables(cluster_out), tables(local_out)
    assert sorted(got) == sorted(want) and want
    for name, frame in want.items():
        pd.testing.assert_frame_equal(got[name], frame, obj=name)


def executor_command(cluster: StandaloneCluster) -> str:
    """The command line of the last executor the worker started (the first line of its
    stderr, as standalone workers write it)."""
    logs = sorted(
        (cluster.work_dir / "worker").glob("app-*/*/stderr"), key=lambda p: p.stat().st_mtime
    )
    assert logs, "the worker started no executor"
    command = logs[-1].read_text(errors="replace").splitlines()[0]
    assert command.startswith("Spark Executor Command:"), command
    return command


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("events")
    generate_events(out, GeneratorConfig(events=3000, seed=5, bad_line_every=500))
    return out


def test_activity_on_the_cluster_equals_local(
    cluster: StandaloneCluster, spark: SparkSession, events: Path, tmp_path: Path
) -> None:
    done = analyze(
        "activity", "--events", str(events), "--output", str(tmp_path / "c"),
        *on(cluster),
    )  # fmt: skip
    stderr = ok(done)
    # The progress line names the real master; the executors are the worker's bare Python.
    assert f"starting Spark ({cluster.master_url})" in stderr
    assert "executors ready on" in stderr
    # Its executor JVM ran C1 only (jvm_options): the worker logs the command it started.
    assert "-XX:TieredStopAtLevel=1" in executor_command(cluster)
    assert analyze_here("activity", "--events", str(events), "--output", str(tmp_path / "l")) == 0
    assert_same_tables(tmp_path / "c", tmp_path / "l")


def test_backtest_on_the_cluster_equals_local(
    cluster: StandaloneCluster, spark: SparkSession, events: Path, tmp_path: Path
) -> None:
    quota = DATA / "recorded_quota.yaml"
    args = ["backtest", "--events", str(events), "--quota-config", str(quota)]
    ok(analyze(*args, "--output", str(tmp_path / "c"), *on(cluster)))
    assert analyze_here(*args, "--output", str(tmp_path / "l")) == 0
    assert_same_tables(tmp_path / "c", tmp_path / "l")


def test_footprint_on_the_cluster_equals_local(
    cluster: StandaloneCluster, spark: SparkSession, tmp_path: Path
) -> None:
    logs = generate_log_dirs(
        str(tmp_path / "logs"), brokers=2, topics=2, partitions=2, segments_per_partition=2,
        batches_per_segment=30, seed=7,
    )  # fmt: skip
    args = ["footprint", "--log-dirs", *logs.log_dirs]
    ok(analyze(*args, "--output", str(tmp_path / "c"), *on(cluster)))
    assert analyze_here(*args, "--output", str(tmp_path / "l")) == 0
    assert_same_tables(tmp_path / "c", tmp_path / "l")
    assert len(tables(tmp_path / "c")["segment_pids.parquet"]) > 0


def snapshot_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.snapshot"))}


def test_snapshots_on_the_cluster_equal_local(
    cluster: StandaloneCluster, spark: SparkSession, tmp_path: Path
) -> None:
    logs = generate_log_dirs(
        str(tmp_path / "logs"), brokers=1, topics=2, partitions=2, segments_per_partition=3,
        batches_per_segment=20, seed=3,
    )  # fmt: skip
    log_dir = Path(logs.log_dirs[0])
    shutil.copytree(log_dir, tmp_path / "copy")
    done = analyze("snapshots", "--log-dir", str(log_dir), *on(cluster))
    ok(done)
    assert analyze_here("snapshots", "--log-dir", str(tmp_path / "copy")) == 0
    written = snapshot_files(log_dir)
    assert written and written == snapshot_files(tmp_path / "copy")
    assert f"wrote {len(written)} producer snapshot(s)" in done.stdout


def test_an_output_path_the_executors_do_not_share_is_refused(
    cluster: StandaloneCluster, tmp_path: Path
) -> None:
    # hidden_dir is an empty tmpfs in the worker's mount namespace: the driver writes there,
    # the executors would write somewhere else.
    output = cluster.hidden_dir / "report"
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--output", str(output),
        "--master", cluster.master_url,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pidgate analyze activity: --output {output}: a local path the")
    assert "do not share" in last and "hdfs://" in last
    assert not output.exists()  # nothing written, nothing left behind


def test_executors_without_pidgate_are_one_line(cluster: StandaloneCluster) -> None:
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--master",
        cluster.master_url, "--no-ship",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot import pidgate: ModuleNotFoundError: No module named 'pidgate'" in last
    assert "drop --no-ship" in last


def test_an_unreachable_master_is_one_line_before_any_jvm(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--master",
        f"spark://127.0.0.1:{port}", timeout_s=60,
    )  # fmt: skip
    elapsed_s = time.monotonic() - started
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"pidgate analyze activity: --master spark://127.0.0.1:{port}: no Spark master answers "
        "there (Connection refused); is the master running, and is the host and port right?"
    )
    assert not any("log4j" in line or "Exception" in line for line in lines), lines
    assert elapsed_s < 60


def test_yarn_without_its_configuration_is_one_line(tmp_path: Path) -> None:
    env_free = {
        k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")
    }
    done = subprocess.run(
        [sys.executable, "-m", "pidgate", "analyze", "activity", "--events",
         str(DATA / "recorded_events.jsonl"), "--master", "yarn"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**env_free, "PYTHONPATH": str(SRC)},
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        "pidgate analyze activity: --master yarn: set HADOOP_CONF_DIR or YARN_CONF_DIR to the "
        "directory holding the cluster's yarn-site.xml and core-site.xml"
    )
    # Before it only pidgate's own progress lines ("[  0.0s] ..."): no JVM started, no Java text.
    assert all(line.startswith("[") for line in lines[:-1]), done.stderr
