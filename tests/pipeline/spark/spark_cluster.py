"""A real Spark standalone cluster for tests and benchmarks: a Master on this host and a Worker
in a network namespace with its own address, standing in for a second host.

Owns: the namespace (``ip netns add``, a veth pair ``10.213.N.1/30`` here and ``.2`` inside),
the Master and Worker processes (pyspark's bundled ``bin/spark-class``, ``SPARK_HOME`` = the
pyspark package directory) and their removal by process group and name, even after a failure.
The Worker runs with a bare environment (``PATH=/usr/bin:/bin``), so its executors' ``python3``
is the system's Python without pandas or pidgate, and in a mount namespace of its own where
``hidden_dir`` is an empty tmpfs: a local directory the driver sees and the executors do not.

Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip`` and ``unshare``: :func:`unavailable`
says why not, in one line, for a skip. Must not import pidgate's job modules.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

__all__ = ["SPARK_HOME", "StandaloneCluster", "standalone_cluster", "unavailable"]

SPARK_HOME = Path(pyspark.__file__).parent
MASTER_PORT = 7077
WORKER_PATH = "/usr/bin:/bin"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def unavailable() -> str | None:
    """Why a namespace cluster cannot run here (None: it can)."""
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2's ip and util-linux's unshare"
    if not shutil.which("java"):
        return "needs Java (17) on the PATH"
    if not Path("/usr/bin/python3").exists():
        return "needs /usr/bin/python3 for the worker"
    probe = f"pgprobe{secrets.token_hex(3)}"
    done = _run("ip", "netns", "add", probe)
    if done.returncode != 0:
        return f"network namespaces not permitted here ({done.stderr.strip() or 'ip netns add'})"
    _run("ip", "netns", "del", probe)
    return None


@dataclass
class StandaloneCluster:
    """A running Master (``master_url``) and one Worker (``worker_address``)."""

    namespace: str
    host_address: str
    worker_address: str
    hidden_dir: Path
    work_dir: Path
    master_url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the Master's and Worker's logs, for a failing test's message."""
        out = []
        for name in ("master.log", "worker.log"):
            path = self.work_dir / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(out)


def _free_subnet() -> int:
    used = _run("ip", "-o", "addr").stdout
    for _ in range(50):
        n = secrets.randbelow(250) + 1
        if f"10.213.{n}." not in used:
            return n
    raise RuntimeError("no free 10.213.N.0/30 subnet")


def _wait_port(host: str, port: int, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Spark process exited with {process.returncode}")
        with suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s")


def _log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _wait_log(
    path: Path, text: str, timeout_s: float, process: subprocess.Popen[bytes], offset: int
) -> None:
    """Wait for ``text`` in what ``process`` appended to ``path`` after ``offset`` (a reused
    work directory's log holds the lines of earlier clusters)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            with path.open("rb") as log:
                log.seek(offset)
                if text in log.read().decode(errors="replace"):
                    return
        if process.poll() is not None:
            raise RuntimeError(f"the Spark process exited with {process.returncode}")
        time.sleep(0.2)
    raise RuntimeError(f"{path.name} never said {text!r} within {timeout_s:.0f} s")


def _spark(
    argv: list[str], log: Path, env: dict[str, str], prefix: list[str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # A session of its own: the process group is removed as a whole (the Worker's executor
        # JVMs and their Python workers included).
        return subprocess.Popen(
            [*(prefix or []), *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _setup_namespace(cluster: StandaloneCluster, n: int) -> None:
    ns = cluster.namespace
    host_if, ns_if = f"pgh{n}x{ns[-4:]}"[:15], f"pgn{n}x{ns[-4:]}"[:15]
    steps = [
        ("ip", "netns", "add", ns),
        ("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if),
        ("ip", "link", "set", ns_if, "netns", ns),
        ("ip", "addr", "add", f"{cluster.host_address}/30", "dev", host_if),
        ("ip", "link", "set", host_if, "up"),
        (
            "ip",
            "netns",
            "exec",
            ns,
            "ip",
            "addr",
            "add",
            f"{cluster.worker_address}/30",
            "dev",
            ns_if,
        ),
        ("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up"),
        ("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"),
    ]
    for step in steps:
        done = _run(*step)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)}: {done.stderr.strip()}")


def _stop(cluster: StandaloneCluster) -> None:
    for process in reversed(cluster.processes):
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    for process in reversed(cluster.processes):
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    # Deleting the namespace removes the veth pair with it.
    _run("ip", "netns", "del", cluster.namespace)


@contextmanager
def standalone_cluster(
    work_dir: Path, cores: int = 2, memory: str = "2g"
) -> Iterator[StandaloneCluster]:
    """Start a Master and a Worker (``cores``, ``memory``) under ``work_dir``; stop both and
    remove the namespace on exit, whatever happened."""
    n = _free_subnet()
    work_dir.mkdir(parents=True, exist_ok=True)
    cluster = StandaloneCluster(
        namespace=f"pidgate-spark-{secrets.token_hex(3)}",
        host_address=f"10.213.{n}.1",
        worker_address=f"10.213.{n}.2",
        hidden_dir=work_dir / "driver-only",
        work_dir=work_dir,
    )
    cluster.master_url = f"spark://{cluster.host_address}:{MASTER_PORT}"
    cluster.hidden_dir.mkdir(exist_ok=True)
    base_env = {
        "PATH": WORKER_PATH,
        "HOME": str(work_dir),
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(work_dir),
        "SPARK_NO_DAEMONIZE": "1",
    }
    if os.environ.get("JAVA_HOME"):
        base_env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    try:
        _setup_namespace(cluster, n)
        # SPARK_LOCAL_IP: the web UIs bind there too, not on every interface.
        master_env = {**base_env, "SPARK_LOCAL_IP": cluster.host_address}
        master = _spark(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                cluster.host_address,
                "--port",
                str(MASTER_PORT),
                "--webui-port",
                "0",
            ],
            work_dir / "master.log",
            master_env,
        )
        cluster.processes.append(master)
        _wait_port(cluster.host_address, MASTER_PORT, 60, master)
        worker_env = {**base_env, "SPARK_LOCAL_IP": cluster.worker_address}
        worker_dir = work_dir / "worker"
        worker_dir.mkdir(exist_ok=True)
        worker_log_offset = _log_size(work_dir / "worker.log")
        start = (
            f"mount -t tmpfs pidgate-hidden {cluster.hidden_dir} && exec {spark_class} "
            f"org.apache.spark.deploy.worker.Worker --host {cluster.worker_address} "
            f"--cores {cores} --memory {memory} --work-dir {worker_dir} --webui-port 0 "
            f"{cluster.master_url}"
        )
        worker = _spark(
            ["sh", "-c", start],
            work_dir / "worker.log",
            worker_env,
            prefix=[
                "ip",
                "netns",
                "exec",
                cluster.namespace,
                "unshare",
                "--mount",
                "--propagation",
                "private",
            ],
        )
        cluster.processes.append(worker)
        _wait_log(
            work_dir / "worker.log",
            "Successfully registered with master",
            90,
            worker,
            worker_log_offset,
        )
        yield cluster
    finally:
        _stop(cluster)
