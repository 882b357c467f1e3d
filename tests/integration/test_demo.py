"""``pidgate demo`` end to end: the real CLI in a subprocess, with its embedded tansu broker,
pidgate and confluent-kafka producers. Reads the demo's ``key=value`` summary."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SUMMARY_MARKER = "summary (key=value):"


def demo_command(duration_s: float) -> list[str]:
    return [sys.executable, "-m", "pidgate", "demo", "--duration", str(duration_s)]


def parse_summary(stdout: str) -> dict[str, str]:
    assert SUMMARY_MARKER in stdout, stdout
    block = stdout.split(SUMMARY_MARKER, 1)[1]
    return dict(re.findall(r"^\s+(\w+)=(\S+)\s*$", block, flags=re.MULTILINE))


def broker_pid(stdout: str) -> int:
    match = re.search(r"broker_pid=(\d+)", stdout)
    assert match, stdout
    return int(match.group(1))


def remove_demo_log(stdout: str) -> None:
    """The demo keeps its log file for the user; a test does not need it."""
    match = re.search(r"pidgate's log: (\S+)", stdout)
    if match and Path(match.group(1)).name.startswith("pidgate-demo-"):
        Path(match.group(1)).unlink(missing_ok=True)


def process_gone(pid: int) -> bool:
    """True when no live process has ``pid`` (a zombie awaiting its parent counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status or "tansu" not in Path(f"/proc/{pid}/cmdline").read_text()


def test_demo_throttles_the_storm_and_never_the_steady_producer() -> None:
    completed = subprocess.run(
        demo_command(30),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = completed.stdout
    remove_demo_log(output)
    assert completed.returncode == 0, output + completed.stderr
    summary = parse_summary(output)

    assert summary["result"] == "ok"
    # Throttling happened ...
    assert int(summary["produce_requests_rejected"]) > 0
    assert int(summary["storm_throttled"]) > 0
    # ... never to the producer whose PID was already known ...
    assert int(summary["steady_errors"]) == 0
    assert int(summary["steady_delivered"]) > 1000
    # ... and the throttled producers got through once tokens refilled (recovery).
    assert int(summary["storm_delivered_after_throttle"]) >= 1
    assert int(summary["storm_failed"]) == 0
    # The quota held: at most the burst plus the refill over the run became new PIDs.
    elapsed = float(summary["elapsed_s"])
    rate, window = int(summary["producer_ids_rate"]), int(summary["window_s"])
    assert int(summary["new_producer_ids_admitted"]) <= rate + rate * elapsed / window + 1
    # The live view printed about one line per second.
    assert len(re.findall(r"^\s+\d+s \|", output, flags=re.MULTILINE)) >= 25
    assert process_gone(broker_pid(output))


def test_ctrl_c_stops_everything_within_a_bounded_time() -> None:
    process = subprocess.Popen(
        demo_command(120),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        # Interrupt while the storm is being throttled (muted connections, pending messages).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            match = re.match(r"^\s+(\d+)s \|\s+\d+\s+(\d+)", line)
            if match and int(match.group(1)) >= 8 and int(match.group(2)) > 0:
                break
        else:
            pytest.fail("the demo never showed a rejection:\n" + "".join(seen))
        pid = broker_pid("".join(seen))
        assert not process_gone(pid)

        interrupted_at = time.monotonic()
        process.send_signal(signal.SIGINT)
        returncode = process.wait(timeout=30)
        took = time.monotonic() - interrupted_at
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    reader.join(10)
    while not lines.empty():
        rest = lines.get_nowait()
        if rest is not None:
            seen.append(rest)
    output = "".join(seen)
    stderr = process.stderr.read() if process.stderr else ""
    remove_demo_log(output)

    assert returncode == 128 + signal.SIGINT, output + stderr
    assert took < 30
    summary = parse_summary(output)
    assert summary["result"] == "interrupted"
    assert int(summary["steady_errors"]) == 0
    assert process_gone(pid), f"tansu (pid {pid}) still running"
    assert "Traceback" not in stderr, stderr


def test_demo_event_log_to_an_activity_report(tmp_path: Path) -> None:
    """``pidgate demo --event-log DIR``, then the ``pidgate analyze activity`` command the
    demo's summary prints, run as printed: the report counts the PIDs the demo admitted."""
    events = tmp_path / "events"
    completed = subprocess.run(
        [*demo_command(20), "--event-log", str(events)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = completed.stdout
    remove_demo_log(output)
    assert completed.returncode == 0, output + completed.stderr
    summary = parse_summary(output)
    assert summary["event_log"] == str(events)
    [command] = re.findall(
        r"^\s+(pidgate analyze activity --events \S+ --output \S+)$", output, re.M
    )
    assert sorted(p.suffix for p in events.iterdir()) == [".jsonl"]

    argv = command.split()
    report_dir = Path(argv[argv.index("--output") + 1])
    assert report_dir == tmp_path / "pidgate-demo-report"
    analysis = subprocess.run(
        [sys.executable, "-m", "pidgate", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    # Progress while Spark ran, then the summary and where the report is.
    assert "reading the event log" in analysis.stderr
    assert f"report: {report_dir / 'report.html'}" in analysis.stdout
    admitted = int(summary["new_producer_ids_admitted"])
    assert f"new PIDs: {admitted:,};" in analysis.stdout, analysis.stdout
    assert "User:ANONYMOUS" in (report_dir / "report.html").read_text()
    assert "Traceback" not in analysis.stderr
