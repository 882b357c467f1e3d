"""From ``pidgate serve --event-log DIR`` to ``pidgate analyze activity``, as a user runs it:
a real ``pidgate serve`` subprocess (default settings but a quota, so PIDs are tracked) in front
of the real tansu broker, real confluent-kafka producers through it, then the ``analyze`` CLI
over the files that ``serve`` wrote, through a directory, a glob and an explicit file, and over
a copy under the old name with a colon (which Hadoop rejects)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from pyspark.sql import SparkSession

from pidgate import cli
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from tests.integration.helpers import PidgateProcess, create_topic, unique_name

pytestmark = pytest.mark.integration

PRODUCERS = 12
RATE = 3
WINDOW_S = 3


@pytest.fixture(scope="module")
def served_events(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The event-log directory of a real ``pidgate serve`` run with a storm through it."""
    directory = tmp_path_factory.mktemp("served") / "events"
    with EmbeddedBroker() as broker:
        proxy = PidgateProcess(
            broker.bootstrap,
            free_port(),
            broker_port_base=free_port() - TANSU_NODE_ID,
            extra_args=(
                "--event-log",
                str(directory),
                "--producer-ids-rate",
                f"ANONYMOUS={RATE}",
                "--quota-window-seconds",
                str(WINDOW_S),
            ),
        )
        try:
            proxy.wait_listening()
            topic = unique_name("served")
            create_topic(proxy.bootstrap, topic)
            errors = produce_storm(proxy.bootstrap, topic)
            assert errors == [], errors
            assert proxy.terminate() == 0  # closes the event log: every line on disk
        finally:
            proxy.close()
            proxy.log_path.unlink(missing_ok=True)
    yield directory


def produce_storm(bootstrap: str, topic: str) -> list[str]:
    """PRODUCERS idempotent producers at once, 2 records each; their delivery errors."""
    errors: list[str] = []

    def one(index: int) -> None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "client.id": f"served-{index}",
                "message.timeout.ms": 60_000,
            }
        )
        for record in range(2):
            producer.produce(
                topic,
                f"{index}-{record}".encode(),
                on_delivery=lambda e, _m: errors.append(str(e)) if e else None,
            )
        producer.flush(60)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads), "producers still running after 90 s"
    return errors


def analyze(events: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    code = cli.main(["analyze", "activity", "--events", events, "--output", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out, captured.err


def test_serve_writes_names_hadoop_accepts(served_events: Path) -> None:
    files = sorted(served_events.iterdir())
    assert files, "serve wrote no event log"
    for path in files:
        assert ":" not in path.name
        assert path.name.startswith("pidgate-events-127.0.0.1_")
    first = json.loads(files[0].read_text().splitlines()[0])
    assert first["instance"].startswith("127.0.0.1:")  # the events keep the real instance


def test_analyze_reads_what_serve_wrote(
    spark: SparkSession,
    served_events: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    by_dir, progress = analyze(str(served_events), tmp_path / "dir", capsys)
    # While Spark ran: stage lines on stderr; at the end a summary and the report's path.
    assert "reading the event log" in progress and "writing Parquet" in progress
    assert f"report: {tmp_path / 'dir' / 'report.html'}" in by_dir
    assert "restart storm: User:ANONYMOUS" in by_dir

    hourly = spark.read.parquet(str(tmp_path / "dir" / "hourly.parquet"))
    totals = hourly.groupBy().sum("new_pids", "init_producer_ids", "rejected_pids").first()
    assert totals is not None
    # Every producer got one PID, each admitted as new once; the burst left most waiting.
    assert (totals[0], totals[1]) == (PRODUCERS, PRODUCERS)
    assert totals[2] >= PRODUCERS - RATE - 1
    rates = spark.read.parquet(str(tmp_path / "dir" / "recommendations.parquet")).collect()
    assert [(r.principal, r.storm) for r in rates] == [("User:ANONYMOUS", True)]

    # A glob, and one explicit file, read the same events.
    by_glob, _ = analyze(str(served_events / "pidgate-events-*.jsonl"), tmp_path / "glob", capsys)
    assert by_glob.replace("glob", "dir") == by_dir
    [one_file] = sorted(served_events.iterdir())[:1]
    single = spark.read.parquet(str(tmp_path / "dir" / "hourly.parquet")).count()
    analyze(str(one_file), tmp_path / "file", capsys)
    assert spark.read.parquet(str(tmp_path / "file" / "hourly.parquet")).count() <= single


def test_old_names_with_a_colon_are_still_read(
    spark: SparkSession,
    served_events: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    for path in served_events.iterdir():
        shutil.copy(path, old / path.name.replace("127.0.0.1_", "127.0.0.1:"))
    assert all(":" in p.name for p in old.iterdir())
    out, _ = analyze(str(old), tmp_path / "report", capsys)
    assert "report:" in out
    hourly = spark.read.parquet(str(tmp_path / "report" / "hourly.parquet"))
    assert hourly.groupBy().sum("new_pids").first() == (PRODUCERS,)
    assert "read through safe-named links" in (tmp_path / "report" / "report.html").read_text()
