"""A storm of identical decisions writes a bounded number of log lines."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import structlog

from pidgate.config import LoggingSettings
from pidgate.proxy.logs import RateLimitedLog, configure_logging


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """structlog's configuration is process-wide: a test here that configures it (level
    "error", or a capsys stream that is closed afterwards) must not leave it so for the tests
    that run after it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def test_storm_of_rejections_is_rate_limited_per_key(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(LoggingSettings(format="json"))
    log = RateLimitedLog(max_events=5, interval_ms=60_000)
    for pid in range(10_000):
        log.warning("pid_throttled", key="User:storm", producer_id=pid)
    log.warning("pid_throttled", key="User:other", producer_id=1)
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 6  # 5 for the storm's key, then another key is not starved
    assert [line["producer_id"] for line in lines] == [0, 1, 2, 3, 4, 1]
    assert all(line["event"] == "pid_throttled" and line["level"] == "warning" for line in lines)


def test_next_window_reports_how_many_were_suppressed(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(LoggingSettings(format="json"))
    log = RateLimitedLog(max_events=1, interval_ms=1)
    log.warning("pid_throttled", key="k")
    log.warning("pid_throttled", key="k")  # same 1 ms window: suppressed (or a new window)
    log.warning("pid_throttled", key="k")
    time.sleep(0.01)
    log.warning("pid_throttled", key="k")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    # Every call is either a line or counted in the next line's suppressed_since_last.
    assert len(lines) + sum(line.get("suppressed_since_last", 0) for line in lines) == 4


def test_key_table_is_bounded() -> None:
    log = RateLimitedLog(max_events=1, interval_ms=60_000, max_keys=100)
    configure_logging(LoggingSettings(format="json", level="error"))  # drop the output
    for key in range(10_000):
        log.warning("pid_throttled", key=str(key))
    assert len(log._windows) <= 100
