"""``pidgate demo`` end to end: the real CLI in a subprocess, with its embedded tansu broker,
pidgate and confluent-kafka producers. Reads the demo's ``key=value`` summary. Its closing next
steps are run as printed by test_first_hour.py."""

from __future__ import annotations

import queue
import re
import shutil
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
    """The demo keeps its directory (log, event log) for the user; a test does not need it."""
    match = re.search(r"pidgate's log: (\S+)", stdout)
    if match and Path(match.group(1)).parent.name.startswith("pidgate-demo-"):
        shutil.rmtree(Path(match.group(1)).parent, ignore_errors=True)


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


def test_demo_event_log_goes_where_asked_and_the_next_steps_say_how_to_analyse_it(
    tmp_path: Path,
) -> None:
    """``pidgate demo --event-log DIR``: the event log is in DIR and the closing next steps
    analyse exactly DIR into a report beside it (test_first_hour.py runs them as printed)."""
    events = tmp_path / "events"
    completed = subprocess.run(
        [*demo_command(15), "--event-log", str(events)],
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
    assert sorted(p.suffix for p in events.iterdir()) == [".jsonl"]
    report_dir = tmp_path / "pidgate-demo-report"
    steps = output.split("Next steps", 1)[1]
    assert re.search(
        rf"^ {{7}}\S+ analyze activity --events {events} --output {report_dir} "
        r"--window-seconds 10$",
        steps,
        re.M,
    ), steps
    assert f"in a browser: file://{report_dir}/report.html" in steps
    assert re.search(r"^ {7}\S+ test-broker$", steps, re.M), steps
