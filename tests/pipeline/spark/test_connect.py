"""``pidgate analyze --remote sc://...`` on a real Spark Connect server, started once for the
module from pyspark's own ``sbin/start-connect-server.sh`` (``SPARK_HOME`` = the pyspark
package directory) on 127.0.0.1 and a free port, with its log and PID directories under the
test's tmp directory, and stopped by its PID at the end.

The server runs ``local[2]`` with this interpreter as its Python workers and this tree on their
``PYTHONPATH``: the backtest's pandas UDF runs there and imports pidgate. ``activity`` and
``backtest`` on the server equal a local run's; ``footprint`` and ``snapshots`` (RDD API) are
refused before anything connects; an unreachable server, ``--master`` with ``--remote`` and a
local path with a server on another host are one line each, exit code 2.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pidgate.proxy.ports import free_port

from .spark_cluster import SPARK_HOME
from .test_cluster import DATA, SRC, analyze, analyze_here, assert_same_tables, ok

pytestmark = pytest.mark.timeout(600)

CONNECT_JAR = "spark-connect_*.jar"


def _unavailable() -> str | None:
    if not shutil.which("java"):
        return "needs Java (17) on the PATH"
    if not list((SPARK_HOME / "jars").glob(CONNECT_JAR)):
        return f"pyspark has no {CONNECT_JAR} under {SPARK_HOME / 'jars'}"
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as error:
        return f"the Spark Connect client is not installed ({error})"
    return None


def _server_env(work: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(work / "log"),
        "SPARK_PID_DIR": str(work / "pid"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # The server's Python workers: this interpreter, importing this tree's pidgate.
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(SRC),
    }
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS"):
        env.pop(name, None)
    return env


def _log_tail(work: Path, lines: int = 40) -> str:
    return "\n".join(
        "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        for log in sorted((work / "log").glob("*.out"))
    )


def _wait_port(port: int, timeout_s: float, work: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.3)
    raise RuntimeError(
        f"no Spark Connect server on port {port} after {timeout_s:.0f} s\n" + _log_tail(work)
    )


def _stop(work: Path, env: dict[str, str]) -> None:
    """stop-connect-server.sh, then SIGKILL whatever PID it left (only the server's own)."""
    pids = [int(p.read_text().strip()) for p in (work / "pid").glob("*.pid")]
    subprocess.run(
        [str(SPARK_HOME / "sbin" / "stop-connect-server.sh")],
        env=env, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a running Spark Connect server."""
    reason = _unavailable()
    if reason:
        pytest.skip(f"no Spark Connect server: {reason}")
    work = tmp_path_factory.mktemp("spark-connect")
    env = _server_env(work)
    port = free_port()
    try:
        subprocess.run(
            [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}",
             "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false"],
            env=env, capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        _wait_port(port, 120, work)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(work, env)


def on(remote: str) -> list[str]:
    """``--remote`` and, as in the cluster tests, fewer shuffle partitions than the server's
    200 (a runtime setting: Spark Connect passes it to the session)."""
    return ["--remote", remote, "--conf", "spark.sql.shuffle.partitions=4"]


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events

    out = tmp_path_factory.mktemp("events")
    generate_events(out, GeneratorConfig(events=3000, seed=5, bad_line_every=500))
    return out


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def test_activity_on_spark_connect_equals_local(
    remote: str, spark: SparkSession, events: Path, tmp_path: Path
) -> None:
    args = ["activity", "--events", str(events)]
    stderr = ok(analyze(*args, "--output", str(tmp_path / "c"), *on(remote)))
    assert f"connecting to Spark Connect ({remote})" in stderr
    assert analyze_here(*args, "--output", str(tmp_path / "l")) == 0
    assert_same_tables(tmp_path / "c", tmp_path / "l")


def test_backtest_on_spark_connect_from_spark_remote_equals_local(
    remote: str, spark: SparkSession, events: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SPARK_REMOTE instead of --remote, as pyspark honours it.
    monkeypatch.setenv("SPARK_REMOTE", remote)
    args = [
        "backtest",
        "--events",
        str(events),
        "--quota-config",
        str(DATA / "recorded_quota.yaml"),
    ]
    conf = ["--conf", "spark.sql.shuffle.partitions=4"]
    stderr = ok(analyze(*args, "--output", str(tmp_path / "c"), *conf))
    assert f"connecting to Spark Connect ({remote})" in stderr
    monkeypatch.delenv("SPARK_REMOTE")
    assert analyze_here(*args, "--output", str(tmp_path / "l")) == 0
    assert_same_tables(tmp_path / "c", tmp_path / "l")


@pytest.mark.parametrize(
    ("job", "flags"),
    [("footprint", ["--log-dirs", str(DATA)]), ("snapshots", ["--log-dir", str(DATA)])],
)
def test_rdd_jobs_are_refused_up_front(job: str, flags: list[str]) -> None:
    # A port nothing listens on: the refusal comes before any connection.
    done = analyze(job, *flags, "--remote", f"sc://127.0.0.1:{free_port()}", timeout_s=60)
    assert done.stderr.strip() == (
        f"pidgate analyze {job}: cannot run on Spark Connect: it reads segment files with the "
        "RDD API; use --master"
    )
    assert done.returncode == 2


def test_an_unreachable_server_is_one_line_within_seconds() -> None:
    port = free_port()
    started = time.monotonic()
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--remote",
        f"sc://127.0.0.1:{port}", timeout_s=60,
    )  # fmt: skip
    elapsed_s = time.monotonic() - started
    assert last_line(done) == (
        f"pidgate analyze activity: --remote sc://127.0.0.1:{port}: no Spark Connect server "
        f"answers at 127.0.0.1:{port} (Connection refused); is the server running, and is the "
        "host and port right?"
    )
    assert not any("Exception" in line for line in done.stderr.splitlines()), done.stderr
    assert elapsed_s < 10


def test_master_and_remote_exclude_each_other() -> None:
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--master", "local[2]",
        "--remote", "sc://127.0.0.1:15002", timeout_s=60,
    )  # fmt: skip
    assert last_line(done) == (
        "pidgate analyze activity: --master local[2] and --remote sc://127.0.0.1:15002 exclude "
        "each other: a Spark Connect server runs on its own master"
    )


def test_a_local_path_with_a_server_on_another_host_is_refused(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this host; nothing is contacted.
    events = str(DATA / "recorded_events.jsonl")
    done = analyze(
        "activity", "--events", events, "--output", str(tmp_path / "out"),
        "--remote", "sc://192.0.2.1:15002", timeout_s=60,
    )  # fmt: skip
    assert last_line(done) == (
        f"pidgate analyze activity: --events {events}: a local path, but the Spark Connect "
        "server sc://192.0.2.1:15002 is on another host and reads and writes on its side; use "
        "a Hadoop URI (hdfs://, s3a://) or run pidgate on the server's host"
    )
    assert not (tmp_path / "out").exists()


def test_master_with_spark_remote_set_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # pyspark would connect to SPARK_REMOTE whatever --master says: say so instead.
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15002")
    done = analyze(
        "activity", "--events", str(DATA / "recorded_events.jsonl"), "--master", "local[2]",
        timeout_s=60,
    )  # fmt: skip
    assert last_line(done) == (
        "pidgate analyze activity: --master local[2]: SPARK_REMOTE=sc://127.0.0.1:15002 is set "
        "too, and pyspark would connect there; unset SPARK_REMOTE to use --master"
    )
