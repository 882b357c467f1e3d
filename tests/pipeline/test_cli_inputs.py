"""``pidgate analyze`` on user mistakes: one clear line on stderr and exit code 2, found before
Spark starts (no JVM, no traceback), and an empty log is an error, not an empty report."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pidgate import cli

from .jobs.test_backtest import QUOTA_YAML


def fails(argv: list[str], capsys: pytest.CaptureFixture[str], spark_ran: bool = False) -> str:
    """Run ``pidgate <argv>`` in-process; assert exit 2 and that stderr holds one line (after
    the progress lines, when Spark ran), no traceback and nothing on stdout; return the line."""
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    if spark_ran:
        assert all(line.startswith("[") for line in lines[:-1]), captured.err  # progress
    else:
        assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
    return lines[-1]


def test_missing_events_path_is_one_line_without_starting_spark(tmp_path: Path) -> None:
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, "-m", "pidgate", "analyze", "activity", "--events", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        f"pidgate analyze activity: --events {tmp_path / 'x'}: no such file or directory"
    )
    assert time.monotonic() - started < 10  # Spark's JVM alone takes longer to start


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["activity", "--events", "{tmp}/missing"], "--events {tmp}/missing: no such file"),
        (["activity", "--events", "{tmp}/empty"], "no event-log files there"),
        (["activity", "--events", "{tmp}/*.nothing"], "no file matches this pattern"),
        (
            ["activity", "--events", "{tmp}/log", "--since", "2026-02-01", "--until", "2026-01-01"],
            "--since 2026-02-01 is not before --until 2026-01-01",
        ),
        (["activity", "--events", "{tmp}/log", "--since", "yesterday"], "not a date or time"),
        (
            ["activity", "--events", "{tmp}/log", "--window-seconds", "0"],
            "--window-seconds 0: must be a positive number",
        ),
        (
            ["activity", "--events", "{tmp}/log", "--output", "{tmp}/log/e.jsonl"],
            "exists and is not a directory",
        ),
        (
            ["backtest", "--events", "{tmp}/log", "--quota-config", "{tmp}/none.yaml"],
            "--quota-config {tmp}/none.yaml: no such file",
        ),
        (
            ["backtest", "--events", "{tmp}/log", "--quota-config", "{tmp}/bad.yaml"],
            "--quota-config {tmp}/bad.yaml:",
        ),
        (["footprint", "--log-dirs", "{tmp}/log", "{tmp}/gone"], "--log-dirs {tmp}/gone: no such"),
        (["footprint", "--log-dirs", "{tmp}/log/e.jsonl"], "not a directory"),
        (["snapshots", "--log-dir", "{tmp}/gone"], "--log-dir {tmp}/gone: no such directory"),
        (["snapshots", "--log-dir", "{tmp}/log", "--expiration-ms", "0"], "must be a positive"),
    ],
)
def test_input_mistakes(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "e.jsonl").write_text('{"ts_ms": 1, "event": "x", "principal": "p"}\n')
    (tmp_path / "bad.yaml").write_text("quota:\n  users:\n    alice: {producer_ids_rate: -3}\n")
    tmp = str(tmp_path)
    line = fails(["analyze", *(a.replace("{tmp}", tmp) for a in argv)], capsys)
    assert line.startswith(f"pidgate analyze {argv[0]}: ")
    assert expected.replace("{tmp}", tmp) in line


def test_a_good_quota_config_passes_the_check(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check does not reject what the job accepts (and the log here has no Produce events,
    which is its own one-line error after Spark read it)."""
    (tmp_path / "quota.yaml").write_text(QUOTA_YAML)
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "e.jsonl").write_text("not json\n")
    line = fails(
        [
            "analyze",
            "backtest",
            "--events",
            str(tmp_path / "log"),
            "--quota-config",
            str(tmp_path / "quota.yaml"),
            "--output",
            str(tmp_path / "out"),
        ],
        capsys,
        spark_ran=True,
    )
    assert line.endswith("no Produce events to replay (1 bad lines skipped); nothing to report")


def test_a_log_without_good_events_is_an_error_not_an_empty_report(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "e.jsonl").write_text('{"ts_ms": 1, "event": \n{"event": "x"}\n')
    out = tmp_path / "out"
    line = fails(
        ["analyze", "activity", "--events", str(tmp_path / "log"), "--output", str(out)],
        capsys,
        spark_ran=True,
    )
    assert line == (
        f"pidgate analyze activity: --events {tmp_path / 'log'}: no events "
        "(2 bad lines skipped); nothing to report"
    )
    assert not (out / "report.html").exists()
