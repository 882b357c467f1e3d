"""Real Apache Kafka on loopback, started from a binary distribution folder: what pidgate's
users run, for the promises that depend on broker behaviour (PID allocation, grandfathering,
failover, producer state, SASL, quota APIs, Kafka 4 APIs).

Owns: ``kafka_home`` (which distribution a variable names), ``start_single``
(ZooKeeper-mode 3.x or KRaft 4.x, PLAINTEXT + SASL_PLAINTEXT), ``start_cluster`` (three
ZooKeeper-mode brokers, RF 3, min.insync.replicas 2) and ``KafkaRun`` (ports, PIDs, tools,
kill/restart of one broker). Imports nothing from pidgate, so benchmarks use it too.

Every process started here is started in its own session and stopped by its own PID (SIGTERM,
then SIGKILL after a bound); nothing is written inside the distribution folder; ports are the
OS's free ones; each run has its own directory, removed at stop.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pidgate.proxy.ports import free_port as free_port

#: Environment variables naming the distribution folders (holding bin/ and libs/).
KAFKA3_HOME_VAR = "PIDGATE_KAFKA3_HOME"  # a ZooKeeper-capable 3.x (3.1.0 in CI)
KAFKA4_HOME_VAR = "PIDGATE_KAFKA4_HOME"  # a KRaft 4.x (4.1.0 in CI)

#: SASL users every broker started here knows (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
SASL_USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}

_JAAS_PLAIN = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    + " ".join(f'user_{user}="{password}"' for user, password in SASL_USERS.items())
    + ";"
)
_JAAS_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def kafka_home(variable: str) -> Path | None:
    """The distribution folder ``variable`` names, or None when unset; a folder that is not a
    Kafka distribution is an error (a typo must not turn into a silent skip)."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    home = Path(value).expanduser().resolve()
    if not (home / "bin" / "kafka-server-start.sh").is_file() or not (home / "libs").is_dir():
        raise RuntimeError(f"{variable}={value} is not a Kafka distribution (no bin/, libs/)")
    return home


def kafka_version(home: Path) -> str:
    """The version of the distribution, from its kafka-clients jar's name."""
    for jar in (home / "libs").glob("kafka-clients-*.jar"):
        match = re.fullmatch(r"kafka-clients-(\d+\.\d+\.\d+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise RuntimeError(f"no kafka-clients jar in {home / 'libs'}")


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


@dataclass
class _Process:
    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    port: int
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            # Own session: a test run killed mid-way can still be cleaned up by process group,
            # and signals to the test runner do not reach the JVM.
            self.popen = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"{self.name} exited: {self.tail()}")
            if _listening(self.port):
                return
            time.sleep(0.25)
        raise RuntimeError(
            f"{self.name} did not listen on {self.port} in {timeout_s}s: {self.tail()}"
        )

    def tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def kill(self) -> None:
        """SIGKILL, as a crash: the broker gets no chance to hand over leadership."""
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class KafkaRun:
    """Running Kafka: one node (``plain``/``sasl`` listeners) or a cluster (``brokers``)."""

    home: Path
    version: str
    run_dir: Path
    #: node id -> PLAINTEXT port of that broker.
    broker_ports: dict[int, int]
    sasl_port: int | None = None
    mode: str = "zk"  # "zk" or "kraft"
    _processes: dict[str, _Process] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.broker_ports.values())

    @property
    def first_bootstrap(self) -> str:
        return f"127.0.0.1:{next(iter(self.broker_ports.values()))}"

    @property
    def sasl_bootstrap(self) -> str:
        assert self.sasl_port is not None, "this Kafka has no SASL listener"
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def tool(self, name: str) -> str:
        """Path of a tool in bin/ (``kafka-topics`` or ``kafka-topics.sh``)."""
        script = name if name.endswith(".sh") else f"{name}.sh"
        return str(self.home / "bin" / script)

    def tool_env(self) -> dict[str, str]:
        """Environment for the distribution's tools: small heap, logs inside the run dir."""
        env = _base_env(self.run_dir / "tool-logs")
        env["KAFKA_HEAP_OPTS"] = "-Xmx256m"
        return env

    def run_tool(
        self, name: str, *args: str, timeout_s: float = 120.0, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.tool(name), *args],
            env=self.tool_env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            check=False,
        )

    def broker_pid(self, node_id: int) -> int | None:
        process = self._processes.get(f"broker-{node_id}")
        return process.pid if process is not None else None

    def broker_log(self, node_id: int) -> Path:
        return self.run_dir / f"broker-{node_id}" / "logs"

    def kill_broker(self, node_id: int) -> None:
        self._processes[f"broker-{node_id}"].kill()

    def restart_broker(self, node_id: int, timeout_s: float = 120.0) -> None:
        process = self._processes[f"broker-{node_id}"]
        process.stop()
        process.start()
        process.wait_listening(timeout_s)

    def stop(self) -> None:
        # Brokers first (a clean shutdown needs ZooKeeper or the controller), ZooKeeper last.
        for name in sorted(self._processes, key=lambda n: n == "zookeeper"):
            self._processes[name].stop()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> KafkaRun:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _base_env(log_dir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("KAFKA_", "PIDGATE_")) and key not in ("CLASSPATH", "LOG_DIR")
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    env["LOG_DIR"] = str(log_dir)
    return env


def _write_properties(path: Path, properties: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))


def _sasl_properties(plain_port: int, sasl_port: int) -> dict[str, object]:
    return {
        "advertised.listeners": (
            f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
        ),
        "inter.broker.listener.name": "PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _JAAS_PLAIN,
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": _JAAS_SCRAM,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": _JAAS_SCRAM,
    }


_COMMON = {
    "num.partitions": 1,
    "group.initial.rebalance.delay.ms": 0,
    "num.network.threads": 2,
    "num.io.threads": 4,
}


def _new_run_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"pidgate-{prefix}-"))


def _start_zookeeper(home: Path, run_dir: Path, tick_ms: int = 2000) -> _Process:
    port = free_port()
    config = run_dir / "zk" / "zookeeper.properties"
    _write_properties(
        config,
        {
            "dataDir": run_dir / "zk" / "data",
            "clientPort": port,
            "clientPortAddress": "127.0.0.1",
            "tickTime": tick_ms,
            "maxClientCnxns": 0,
            "admin.enableServer": "false",
        },
    )
    env = _base_env(run_dir / "zk" / "logs")
    env["KAFKA_HEAP_OPTS"] = "-Xmx128m"
    process = _Process(
        "zookeeper",
        [str(home / "bin" / "zookeeper-server-start.sh"), str(config)],
        env,
        run_dir / "zk" / "logs" / "zookeeper.out",
        port,
    )
    process.start()
    process.wait_listening(60)
    return process


def _broker_process(home: Path, run_dir: Path, node_id: int, port: int, heap: str) -> _Process:
    env = _base_env(run_dir / f"broker-{node_id}" / "logs")
    env["KAFKA_HEAP_OPTS"] = f"-Xmx{heap} -Xms128m"
    return _Process(
        f"broker-{node_id}",
        [
            str(home / "bin" / "kafka-server-start.sh"),
            str(run_dir / f"broker-{node_id}" / "server.properties"),
        ],
        env,
        run_dir / f"broker-{node_id}" / "logs" / "kafka.out",
        port,
    )


def start_single(home: Path, *, extra: dict[str, object] | None = None) -> KafkaRun:
    """One broker with PLAINTEXT and SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256/512 users of
    ``SASL_USERS``): ZooKeeper mode for 3.x, a combined KRaft broker+controller for 4.x."""
    version = kafka_version(home)
    major = int(version.split(".")[0])
    run_dir = _new_run_dir(f"kafka{version}")
    plain_port, sasl_port = free_port(), free_port()
    run = KafkaRun(
        home,
        version,
        run_dir,
        {1: plain_port},
        sasl_port,
        mode="zk" if major < 4 else "kraft",
    )
    try:
        properties: dict[str, object] = {
            **_sasl_properties(plain_port, sasl_port),
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
            ),
            "log.dirs": run_dir / "broker-1" / "data",
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 4,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "transaction.state.log.num.partitions": 4,
            "auto.create.topics.enable": "true",
            **_COMMON,
        }
        if major < 4:
            zookeeper = _start_zookeeper(home, run_dir)
            run._processes["zookeeper"] = zookeeper
            properties |= {
                "broker.id": 1,
                "zookeeper.connect": f"127.0.0.1:{zookeeper.port}",
                "listeners": (
                    f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
                ),
            }
            config = run_dir / "broker-1" / "server.properties"
            _write_properties(config, properties | _extra(extra))
            _zookeeper_scram_users(home, zookeeper.port, run_dir)
        else:
            controller_port = free_port()
            properties |= {
                "process.roles": "broker,controller",
                "node.id": 1,
                "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
                "controller.listener.names": "CONTROLLER",
                "listeners": (
                    f"PLAINTEXT://127.0.0.1:{plain_port},CONTROLLER://127.0.0.1:{controller_port},"
                    f"SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
                ),
                "metadata.log.dir": run_dir / "broker-1" / "meta",
                "share.coordinator.state.topic.replication.factor": 1,
                "share.coordinator.state.topic.min.isr": 1,
            }
            config = run_dir / "broker-1" / "server.properties"
            _write_properties(config, properties | _extra(extra))
            _kraft_format(home, config, run_dir)
        broker = _broker_process(home, run_dir, 1, plain_port, "768m")
        run._processes["broker-1"] = broker
        broker.start()
        broker.wait_listening(120)
        _Process("sasl", [], {}, broker.log_path, sasl_port, broker.popen).wait_listening(20)
    except BaseException:
        run.stop()
        raise
    return run


def _extra(extra: dict[str, object] | None) -> dict[str, object]:
    return dict(extra or {})


def _zookeeper_scram_users(home: Path, zookeeper_port: int, run_dir: Path) -> None:
    env = _base_env(run_dir / "tool-logs")
    env["KAFKA_HEAP_OPTS"] = "-Xmx128m"
    for user, password in SASL_USERS.items():
        subprocess.run(
            [
                str(home / "bin" / "kafka-configs.sh"),
                "--zookeeper",
                f"127.0.0.1:{zookeeper_port}",
                "--alter",
                "--add-config",
                f"SCRAM-SHA-256=[iterations=4096,password={password}],"
                f"SCRAM-SHA-512=[password={password}]",
                "--entity-type",
                "users",
                "--entity-name",
                user,
            ],
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
        )


def _kraft_format(home: Path, config: Path, run_dir: Path) -> None:
    env = _base_env(run_dir / "tool-logs")
    env["KAFKA_HEAP_OPTS"] = "-Xmx128m"
    scram: list[str] = []
    for user, password in SASL_USERS.items():
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            scram += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    result = subprocess.run(
        [
            str(home / "bin" / "kafka-storage.sh"),
            "format",
            "-t",
            _cluster_id(),
            "-c",
            str(config),
            *scram,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"kafka-storage format failed: {result.stdout[-500:]}{result.stderr[-500:]}"
        )


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Uuid.randomUuid)."""
    import base64

    # Never one starting with "-": kafka-storage would read it as an option (Kafka's own
    # Uuid.randomUuid avoids those too).
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def start_cluster(home: Path, brokers: int = 3) -> KafkaRun:
    """Three ZooKeeper-mode brokers (3.x), PLAINTEXT only: RF 3, min.insync.replicas 2,
    unclean election off, short failure detection (a SIGKILLed broker's leaderships move in a
    few seconds, as ``zookeeper.session.timeout.ms`` = 6 s allows)."""
    version = kafka_version(home)
    run_dir = _new_run_dir(f"kafka{version}-cluster")
    ports = {node_id: free_port() for node_id in range(1, brokers + 1)}
    run = KafkaRun(home, version, run_dir, ports)
    try:
        zookeeper = _start_zookeeper(home, run_dir, tick_ms=500)
        run._processes["zookeeper"] = zookeeper
        for node_id, port in ports.items():
            _write_properties(
                run_dir / f"broker-{node_id}" / "server.properties",
                {
                    "broker.id": node_id,
                    "zookeeper.connect": f"127.0.0.1:{zookeeper.port}",
                    "zookeeper.connection.timeout.ms": 18000,
                    "zookeeper.session.timeout.ms": 6000,
                    "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                    "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                    "log.dirs": run_dir / f"broker-{node_id}" / "data",
                    "default.replication.factor": brokers,
                    "min.insync.replicas": 2,
                    "offsets.topic.replication.factor": brokers,
                    "offsets.topic.num.partitions": 6,
                    "transaction.state.log.replication.factor": brokers,
                    "transaction.state.log.min.isr": 2,
                    "transaction.state.log.num.partitions": 6,
                    "unclean.leader.election.enable": "false",
                    "auto.create.topics.enable": "false",
                    "replica.lag.time.max.ms": 10000,
                    "num.replica.fetchers": 1,
                    "background.threads": 4,
                    "log.cleaner.dedupe.buffer.size": 8388608,
                    **_COMMON,
                    "num.io.threads": 2,
                },
            )
            process = _broker_process(home, run_dir, node_id, port, "512m")
            run._processes[f"broker-{node_id}"] = process
            process.start()
        for node_id in ports:
            run._processes[f"broker-{node_id}"].wait_listening(120)
    except BaseException:
        run.stop()
        raise
    return run


@contextlib.contextmanager
def running(run: KafkaRun) -> Iterator[KafkaRun]:
    try:
        yield run
    finally:
        run.stop()
