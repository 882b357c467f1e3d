"""An operator's first hour (issue #26), done the way a new user does it after the quick start:
``pidgate demo`` started as ``./scripts/demo`` starts it (the venv's ``pidgate`` script, from the
clone's root), then every command of its closing "Next steps" run as printed by ``bash -c`` in
a plain environment -- no activated venv: PATH holds only the system directories, so a bare
``pidgate`` would fail with 127 there. The test broker step goes on by hand: the ``pidgate
serve`` line it prints, a real producer through that pidgate, the ``pidgate quotas`` line, and
both stopped with the signals a user sends.

One liberty, said here: ``pidgate serve`` gets its ports from ``PIDGATE_PROXY_LISTEN`` /
``PIDGATE_ADMIN_LISTEN`` / ``PIDGATE_PROXY_BROKER_PORT_BASE`` (free ports, so a Kafka on 9092
or a parallel run cannot collide), and the printed client lines get the same address in place
of serve's default ``127.0.0.1:9092``. The printed serve line sets no port, so it runs
unchanged."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from confluent_kafka import Producer

from pidgate.demo.broker import TANSU_NODE_ID, free_port
from pidgate.demo.next_steps import SERVE_LISTEN, TEST_BROKER_PORT
from tests.integration.helpers import http_get, wait_until
from tests.integration.test_demo import parse_summary, process_gone

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The venv's console script, as ./scripts/demo runs it ("$root/.venv/bin/pidgate").
PIDGATE_SCRIPT = Path(sys.executable).parent / "pidgate"


def plain_environment() -> dict[str, str]:
    """A login shell's environment without an activated venv: system PATH, HOME, locale; and
    what a development checkout needs to run this tree's code (PYTHONPATH) and Java."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    for name in ("LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def in_plain_shell(
    command: str, env: dict[str, str] | None = None, stderr: int | IO[str] | None = None
) -> subprocess.Popen[str]:
    """``command`` exactly as printed, through bash, in the clone's root, stdout piped; ``exec``
    so that signals reach pidgate itself."""
    return subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=ROOT,
        env=env or plain_environment(),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def ready(admin: str, serve: subprocess.Popen[str], log: Path) -> bool:
    assert serve.poll() is None, log.read_text()[-3000:]
    try:
        return http_get(admin, "/readyz")[0] == 200
    except OSError:  # not listening yet
        return False


def next_steps(stdout: str) -> tuple[list[str], str]:
    """The commands (lines indented by 7 spaces) and the report's file URL under "Next steps"."""
    block = stdout.split("Next steps", 1)[1]
    commands = re.findall(r"^ {7}(\S.*)$", block, flags=re.MULTILINE)
    (url,) = re.findall(r"in a browser: (file://\S+)$", block, flags=re.MULTILINE)
    return commands, url


class Lines:
    """A child's stdout, line by line, readable with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def until(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.seen))


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes this test started, killed by PID if a failed assertion left them running."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_the_demos_next_steps_run_as_printed_in_a_plain_shell(
    started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    assert PIDGATE_SCRIPT.is_file(), f"no console script next to {sys.executable}"
    plain_path = plain_environment()["PATH"]
    assert shutil.which("pidgate", path=plain_path) is None, "pidgate is on the system PATH"

    demo = subprocess.run(
        [str(PIDGATE_SCRIPT), "demo", "--duration", "20"],
        cwd=ROOT,
        env=plain_environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    summary = parse_summary(demo.stdout)
    run_dir = Path(summary["event_log"]).parent
    try:
        commands, report_url = next_steps(demo.stdout)
        # From the clone's root with .venv not on PATH: named by its path, which works here.
        try:
            expected = str(PIDGATE_SCRIPT.relative_to(ROOT))  # .venv/bin/pidgate
        except ValueError:
            expected = str(PIDGATE_SCRIPT)  # a venv outside the clone (a dev checkout)
        analyze, test_broker = commands
        assert shlex.split(analyze)[:3] == [expected, "analyze", "activity"]
        assert shlex.split(test_broker) == [expected, "test-broker"]

        # 1. Analyse the event log, as printed.
        analysis = subprocess.run(
            ["bash", "-c", analyze],
            cwd=ROOT,
            env=plain_environment(),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert analysis.returncode == 0, analysis.stderr[-3000:]
        admitted = int(summary["new_producer_ids_admitted"])
        assert f"new PIDs: {admitted:,};" in analysis.stdout, analysis.stdout
        # 2. The report the demo pointed at is the one analyze wrote.
        report = Path(report_url.removeprefix("file://"))
        assert f"report: {report}" in analysis.stdout
        assert "User:ANONYMOUS" in report.read_text()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)

    # 3. The test broker, as printed; then the serve line it prints, as printed.
    broker = in_plain_shell(test_broker, stderr=subprocess.STDOUT)
    started.append(broker)
    broker_out = Lines(broker)
    broker_pid = int(broker_out.until(r"broker_pid=(\d+)", 30).group(1))
    broker_log = Path(broker_out.until(r"^  log  (\S+) \(removed when it stops\)$", 10).group(1))
    serve_line = broker_out.until(r"^  (\S+ serve --upstream .*)$", 10).group(1)
    assert shlex.split(serve_line)[0] == expected
    describe_line = broker_out.until(r"^  (\S+ quotas describe .*)$", 10).group(1)
    broker_out.until(r"^Ctrl-C stops the broker", 10)
    assert broker_log.is_file()

    listen = f"127.0.0.1:{free_port()}"
    admin = f"127.0.0.1:{free_port()}"
    ports = {
        "PIDGATE_PROXY_LISTEN": listen,
        "PIDGATE_ADMIN_LISTEN": admin,
        "PIDGATE_PROXY_BROKER_PORT_BASE": str(free_port() - TANSU_NODE_ID),
    }
    serve_log = tmp_path / "serve.log"
    with serve_log.open("w") as log_file:
        serve = in_plain_shell(serve_line, env={**plain_environment(), **ports}, stderr=log_file)
    started.append(serve)
    wait_until(lambda: ready(admin, serve, serve_log), 60, "pidgate serve ready")

    # A real client through that pidgate: an idempotent producer (one new PID of the 5).
    delivered: list[object] = []
    producer = Producer({"bootstrap.servers": listen, "enable.idempotence": True})
    for i in range(10):
        producer.produce(
            "first-hour", f"record {i}".encode(), on_delivery=lambda e, _: delivered.append(e)
        )
    assert producer.flush(30) == 0
    assert delivered == [None] * 10

    quotas = subprocess.run(
        ["bash", "-c", describe_line.replace(SERVE_LISTEN, listen)],
        cwd=ROOT,
        env=plain_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert quotas.returncode == 0, quotas.stderr
    assert quotas.stdout == "Quota configs for user-principal 'ANONYMOUS' are producer_ids_rate=5\n"
    # pidgate counted the producer: one new PID for User:ANONYMOUS, nothing rejected.
    metrics = http_get(admin, "/metrics")[1]
    labels = '{principal="User:ANONYMOUS",user="ANONYMOUS"}'
    assert f"pidgate_producer_ids_new_total{labels} 1.0" in metrics
    assert f"pidgate_produce_requests_rejected_total{labels} 0.0" in metrics

    # Stopped as a user stops them: SIGTERM to pidgate, Ctrl-C to the test broker.
    serve.send_signal(signal.SIGTERM)
    assert serve.wait(30) == 0
    assert "Traceback" not in serve_log.read_text()
    broker.send_signal(signal.SIGINT)
    assert broker.wait(30) == 0
    broker_out.until(r"^pidgate test-broker: stopped \(SIGINT received\)$", 10)
    assert process_gone(broker_pid), f"tansu (pid {broker_pid}) still running"
    assert not broker_log.exists()


def test_test_broker_names_a_taken_port_and_otherwise_finds_a_free_one(
    started: list[subprocess.Popen[str]],
) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        refused = subprocess.run(
            [str(PIDGATE_SCRIPT), "test-broker", "--port", str(taken)],
            env=plain_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert refused.returncode == 1
    assert refused.stderr == (
        f"pidgate test-broker: port {taken} is in use: stop what listens there, or choose "
        "another with --port N (--port 0: any free port)\n"
    )
    # The default port taken (by this test, unless something else has it already): another
    # port, named in every line it prints.
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(OSError):
            default = stack.enter_context(socket.socket())
            default.bind(("127.0.0.1", TEST_BROKER_PORT))
            default.listen()
        broker = in_plain_shell(f"{PIDGATE_SCRIPT} test-broker", stderr=subprocess.STDOUT)
        started.append(broker)
        lines = Lines(broker)
        port = int(lines.until(r"listening on 127\.0\.0\.1:(\d+) ", 30).group(1))
        assert port != TEST_BROKER_PORT
        lines.until(rf"serve --upstream 127\.0\.0\.1:{port} ", 10)
        broker.send_signal(signal.SIGINT)
        assert broker.wait(30) == 0
