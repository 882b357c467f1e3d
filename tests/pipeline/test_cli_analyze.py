"""``pidgate analyze`` through pipeline.cli (parsed args, the shared session)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pidgate.pipeline.cli import add_analyze_parser, run_analyze
from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events

from .jobs.test_backtest import QUOTA_YAML
from .outputs.test_report import check_self_contained


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="pidgate")
    add_analyze_parser(root.add_subparsers(dest="command", required=True))
    return root


def test_parser_matches_the_design() -> None:
    args = parser().parse_args(["analyze", "footprint", "--log-dirs", "a", "b"])
    assert (args.job, args.log_dirs, args.expiration_ms, args.output) == (
        "footprint",
        ["a", "b"],
        86_400_000,
        None,
    )
    args = parser().parse_args(["analyze", "snapshots", "--log-dir", "d", "--dry-run"])
    assert (args.dry_run, args.master) == (True, None)
    with pytest.raises(SystemExit):
        parser().parse_args(["analyze", "backtest", "--events", "e"])  # --quota-config missing


def test_pidgate_cli_wiring() -> None:
    """When the lead has wired ``pidgate analyze`` into pidgate.cli, it parses the same way."""
    from pidgate import cli

    try:
        args = cli.build_parser().parse_args(["analyze", "activity", "--events", "x"])
    except SystemExit:
        pytest.skip("pidgate analyze is not wired into pidgate.cli yet")
    assert (args.job, args.events) == ("activity", "x")


def test_activity_and_backtest_jobs(spark: SparkSession, tmp_path: Path) -> None:
    events = tmp_path / "events"
    generate_events(events, GeneratorConfig(events=3000, seed=5, bad_line_every=500))
    quota = tmp_path / "quota.yaml"
    quota.write_text(QUOTA_YAML)

    out = tmp_path / "activity"
    args = parser().parse_args(
        ["analyze", "activity", "--events", str(events), "--output", str(out)]
    )
    assert run_analyze(args) == 0
    doc = check_self_contained(out / "report.html", tables=2, images=2)
    assert "Bad lines skipped: 6" in "".join(doc.text)
    assert "recommended producer_ids_rate = max(1, ceil(p99" in "".join(doc.text)
    rates = spark.read.parquet(str(out / "recommendations.parquet"))
    assert rates.count() > 20 and rates.filter("recommended_producer_ids_rate < 1").count() == 0

    out = tmp_path / "backtest"
    args = parser().parse_args(
        [
            "analyze",
            "backtest",
            "--events",
            str(events),
            "--quota-config",
            str(quota),
            "--per-instance",
            "--output",
            str(out),
        ]
    )
    assert run_analyze(args) == 0
    doc = check_self_contained(out / "report.html", tables=2, images=1)
    assert "(100.00%)" in "".join(doc.text)  # same config as the recording: every decision
    assert spark.read.parquet(str(out / "decisions.parquet")).count() > 0

    bad = parser().parse_args(
        [
            "analyze",
            "backtest",
            "--events",
            str(events),
            "--quota-config",
            str(tmp_path / "missing.yaml"),
        ]
    )
    assert run_analyze(bad) == 2
    assert SparkSession.getActiveSession() is not None  # the shared session was left running


def test_a_footprint_that_read_nothing_fails(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    partition = tmp_path / "logs" / "orders-0"
    partition.mkdir(parents=True)
    (partition / "00000000000000000000.log").write_bytes(b"not a record batch")
    args = parser().parse_args(
        ["analyze", "footprint", "--log-dirs", str(tmp_path / "logs"), "--output",
         str(tmp_path / "out")]
    )  # fmt: skip
    assert run_analyze(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"pidgate analyze footprint: --log-dirs {tmp_path / 'logs'}: ")
    assert "none with a readable batch" in last and "1 damaged" in last
    assert "00000000000000000000.log" in last
    assert not (tmp_path / "out" / "segment_pids.parquet").exists()  # nothing half-written


def test_a_log_dir_without_files_is_refused_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    args = parser().parse_args(["analyze", "snapshots", "--log-dir", str(tmp_path / "empty")])
    assert run_analyze(args) == 2
    assert capsys.readouterr().err.strip() == (
        f"pidgate analyze snapshots: --log-dir {tmp_path / 'empty'}: no files there "
        "(nothing to read)"
    )
