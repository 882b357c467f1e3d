"""The processes a benchmark starts and measures, each stopped by PID: ``pidgate serve``,
``tansu proxy``, tansu brokers and the floor (``forwarder.py``, or another script of its
command line), with their CPU time from /proc, and the whole machine's busy share.

Imports pidgate's demo broker helpers and the standard library; must not import a benchmark
script (``bench.py``, ``small_requests.py``, ...), which all import this.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pidgate.demo.broker import TANSU_NODE_ID, broker_binary, free_port

#: pidgate's switch to its pure-Python data path (``pidgate.protocol.native``; spelled here so
#: the benchmark's own process need not import that module).
PURE_PYTHON_ENV = "PIDGATE_PURE_PYTHON"
#: The compiled twin of the per-request primitives, as it appears in /proc/<pid>/maps.
SPEEDUPS_MODULE = "pidgate/protocol/_speedups."
#: The benchmark scripts' folder: ``forwarder.py`` and ``minimal_gate.py`` are run from it.
SCRIPTS = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def exit_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, a CI limit, ``kill``) end the benchmark through its ``finally``
    blocks, which stop every broker, forwarder and pidgate it started: by default SIGTERM ends
    the process at once and leaves them running."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def wait_listening(
    port: int, process: subprocess.Popen[bytes], what: str, timeout_s: float = 20.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in {timeout_s}s")


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@dataclass
class Cpu:
    """CPU time of one process: /proc/<pid>/task/*/schedstat (ns, all threads) and
    /proc/<pid>/stat utime+stime (clock ticks, a cross-check)."""

    pid: int

    def schedstat_ns(self) -> int:
        total = 0
        for task in os.listdir(f"/proc/{self.pid}/task"):
            with contextlib.suppress(OSError):
                total += int(Path(f"/proc/{self.pid}/task/{task}/schedstat").read_text().split()[0])
        return total

    def stat_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)

    def sample(self) -> tuple[int, float]:
        return self.schedstat_ns(), self.stat_s()


class Served:
    """One server process started here: its log, its CPU, and a stop by PID. If it does not
    listen on every port in ``ports`` in time it is stopped at once, never left behind."""

    def __init__(
        self,
        command: list[str],
        log_dir: Path,
        name: str,
        ports: list[int],
        env: dict[str, str] | None = None,
        listen_timeout_s: float = 20.0,
    ) -> None:
        self._log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        try:
            for port in ports:
                wait_listening(port, self.process, name, listen_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.cpu = Cpu(self.process.pid)

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


class Pidgate(Served):
    """``pidgate serve`` in its own process (its own GIL, like tansu proxy is its own process).

    ``path``: ``"compiled"`` starts it without ``PIDGATE_PURE_PYTHON`` (so it takes the compiled
    primitives where they are built), ``"pure"`` with ``PIDGATE_PURE_PYTHON=1``, ``None`` with
    the environment
    as it is (a baseline tree may predate the switch). Which path the process
    really runs is read from its memory map (``data_path``), not trusted from the variable."""

    def __init__(
        self,
        upstream: str,
        log_dir: Path,
        src: str | None = None,
        name: str = "pidgate",
        rate: int = 1000,
        path: str | None = None,
        grandfather_grace_ms: int | None = None,
    ) -> None:
        self.port = free_port()
        self.broker_port = free_port()
        self.http_port = free_port()
        env = dict(os.environ)
        if src is not None:  # another source tree of pidgate (e.g. a baseline to compare with)
            env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        if path == "compiled":
            env.pop(PURE_PYTHON_ENV, None)
        elif path == "pure":
            env[PURE_PYTHON_ENV] = "1"
        elif path is not None:
            raise ValueError(f"path must be 'compiled', 'pure' or None, not {path!r}")
        if grandfather_grace_ms is not None:  # quota.grandfather_grace_ms (None: the default)
            env["PIDGATE_QUOTA_GRANDFATHER_GRACE_MS"] = str(grandfather_grace_ms)
        command = [
            sys.executable,
            "-m",
            "pidgate",
            "serve",
            "--upstream",
            upstream,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--broker-port-base",
            str(self.broker_port - TANSU_NODE_ID),
            "--default-producer-ids-rate",
            str(rate),
            "--http",
            f"127.0.0.1:{self.http_port}",
            "--log-level",
            "warning",
        ]
        super().__init__(command, log_dir, name, [self.port, self.http_port], env)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def data_path(self) -> tuple[str, str | None]:
        """(``"compiled"``, the shared object's file) when the running process has
        ``pidgate.protocol._speedups`` mapped, else (``"pure"``, None). ``pidgate serve``
        imports ``pidgate.protocol.native``, which loads the module or not, before it listens,
        and logs nothing about it: the map is the process's own word."""
        for line in Path(f"/proc/{self.process.pid}/maps").read_text().splitlines():
            if SPEEDUPS_MODULE in line:
                return "compiled", line.split(maxsplit=5)[-1]
        return "pure", None

    def check_data_path(self, expected: str) -> str:
        """A one-line description of the path this process runs; raises when it is not
        ``expected`` (a "compiled" target whose module is not built would be pure)."""
        path, shared_object = self.data_path()
        if path != expected:
            self.stop()
            raise RuntimeError(
                f"pidgate pid {self.process.pid} runs the {path} path, not the {expected} one "
                "(the compiled module pidgate/protocol/_speedups*.so is not built in the tree "
                "on PYTHONPATH? build it, or pass --paths pure)"
            )
        return f"{path} ({shared_object or 'no _speedups module mapped'})"

    def produce_requests(self) -> tuple[int, int]:
        """(Produce requests, Produce request bytes) from pidgate's /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return _metric(text, "pidgate_requests_total"), _metric(text, "pidgate_request_bytes_total")


def _metric(text: str, name: str) -> int:
    match = re.search(rf'^{name}{{api_key="Produce"}} ([0-9.e+]+)$', text, re.M)
    if match is None:
        raise RuntimeError(f'{name}{{api_key="Produce"}} not in pidgate\'s /metrics')
    return int(float(match.group(1)))


class TansuProxy(Served):
    def __init__(self, origin: str, log_dir: Path) -> None:
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        command = [
            broker_binary(),
            "proxy",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--origin-url",
            f"tcp://{origin}",
        ]
        super().__init__(command, log_dir, "tansu-proxy", [self.port])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


class Broker(Served):
    """A tansu broker (in memory). The floor's broker advertises the floor's port, so a client
    bootstrapping through the forwarder comes back through it (pidgate rewrites endpoints
    itself, the forwarder cannot); pidgate's broker advertises itself, or pidgate's upstream
    connections would go through the forwarder. Two brokers of one binary and one config."""

    def __init__(self, log_dir: Path, name: str, advertised_port: int | None = None) -> None:
        self.port = free_port()
        command = [
            broker_binary(),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{self.port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised_port or self.port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        super().__init__(command, log_dir, name, [self.port])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class Forwarder(Served):
    """``forwarder.py`` (the floor), or another script of the same command line."""

    def __init__(
        self,
        port: int,
        upstream: str,
        log_dir: Path,
        script: str = "forwarder.py",
        *options: str,
        name: str | None = None,
    ) -> None:
        self.port = port
        command = [sys.executable, str(SCRIPTS / script), str(port), upstream, *options]
        super().__init__(command, log_dir, name or Path(script).stem, [port])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"
