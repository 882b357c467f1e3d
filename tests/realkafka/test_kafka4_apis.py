"""Kafka 4 client protocols through pidgate in front of a real Kafka 4.1 broker.

* KIP-848: two Java consumers with ``group.protocol=consumer`` (``java/Kip848Consumer.java``)
  share a 4-partition topic through pidgate: ConsumerGroupHeartbeat (API 68) instead of
  JoinGroup/SyncGroup, the broker's assignor, every record read exactly once across the members,
  and ``kafka-consumer-groups --describe`` through pidgate shows the consumer-protocol group.
* KIP-714: a Java producer with ``enable.metrics.push=true`` sends GetTelemetrySubscriptions (71)
  and PushTelemetry (72) through pidgate and the broker's telemetry receiver gets its metrics.
  A stock 4.1 broker does not offer these APIs at all (ApiVersions lists them UNSUPPORTED unless
  a ``metric.reporters`` class implements ``ClientTelemetry``; Kafka ships none), and clients
  then stay silent: the KIP-848 test shows that on the shared broker. The telemetry test starts a
  broker of its own with ``java/TelemetrySink.java`` as its reporter, as an operator who collects
  client metrics would.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

import tests.realkafka.kafka as kafka_module
from pidgate.proxy.background import BackgroundProxy
from tests.realkafka.gate import GateStarter
from tests.realkafka.java import compile_java
from tests.realkafka.javaprog import java_program, run_java
from tests.realkafka.kafka import KafkaRun

pytestmark = pytest.mark.realkafka

PARTITIONS = 4
RECORDS = 200


def requests_by_api(gate: BackgroundProxy) -> dict[str, float]:
    """pidgate's ``pidgate_requests_total`` by api name (``ConsumerGroupHeartbeat``, ...)."""
    text = gate.call_and_wait(lambda: gate.server.metrics.render().decode())
    return {
        name: float(value)
        for name, value in re.findall(
            r'^pidgate_requests_total\{api_key="([^"]+)"\} (\S+)$', text, re.MULTILINE
        )
    }


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


class Member:
    """One ``Kip848Consumer`` process; its stdout lines collected by a thread of its own."""

    def __init__(self, command: list[str]) -> None:
        # stderr to a file: an undrained pipe could fill and stall the JVM.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close())
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def assignment(self) -> set[int] | None:
        """The latest assignment it printed (None before the first)."""
        for line in reversed(list(self.lines)):
            if line.startswith("ASSIGNED"):
                return {int(p) for p in line.removeprefix("ASSIGNED").strip().split(",") if p}
        return None

    @property
    def records(self) -> list[tuple[int, int, str]]:
        """(partition, offset, value) of every record it consumed."""
        out = []
        for line in list(self.lines):
            if line.startswith("RECORD "):
                partition, offset, value = line.split(" ", 3)[1:]
                out.append((int(partition), int(offset), value))
        return out

    def stop(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """Close its stdin (it commits, leaves the group and exits); exit code and stderr."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            code = self.process.wait(timeout_s)
        finally:
            self.kill()
        self._reader.join(10)
        self._stderr.seek(0)
        return code, self._stderr.read()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def close(self) -> None:
        self.kill()
        self._stderr.close()


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in started:
        member.close()


def test_kip848_consumer_group_shares_a_topic_through_pidgate(
    kafka4: KafkaRun, start_gate: GateStarter, members: list[Member]
) -> None:
    gate = start_gate(kafka4)
    topic, group = f"kip848-{uuid.uuid4().hex[:8]}", f"kip848-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=gate.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        admin.close()

    command = java_program(kafka4.home, "Kip848Consumer.java", gate.bootstrap, topic, group)
    members.extend(Member(command) for _ in range(2))

    # The broker's assignor splits the partitions between both members (KIP-848: reconciled
    # through heartbeats, no JoinGroup/SyncGroup round).
    def split() -> bool:
        first, second = (member.assignment or set() for member in members)
        return bool(first) and bool(second) and not first & second

    wait_for(split, 120, "both members to hold partitions")
    first, second = (member.assignment or set() for member in members)
    assert first | second == set(range(PARTITIONS))

    # Only once the assignment is stable: so no rebalance can hand a record to both.
    producer = KafkaProducer(bootstrap_servers=gate.bootstrap, acks="all")
    try:
        for n in range(RECORDS):
            producer.send(topic, key=str(n).encode(), value=f"record-{n}".encode())
        producer.flush(60)
    finally:
        producer.close(10)
    wait_for(
        lambda: sum(len(member.records) for member in members) >= RECORDS,
        60,
        f"{RECORDS} records consumed",
    )

    describe = ["--bootstrap-server", gate.bootstrap, "--describe", "--group", group, "--verbose"]
    with ThreadPoolExecutor(2) as pool:
        state_run = pool.submit(kafka4.run_tool, "kafka-consumer-groups", *describe, "--state")
        members_run = pool.submit(kafka4.run_tool, "kafka-consumer-groups", *describe, "--members")
        state, described = state_run.result(), members_run.result()

    stopped = [member.stop() for member in members]
    for code, stderr in stopped:
        assert code == 0, stderr[-3000:]
    for member in members:
        assert member.lines[-1] == "CLOSED"

    # Every record exactly once across the members, each from its own partitions.
    values = Counter(value for member in members for _, _, value in member.records)
    assert values == Counter(f"record-{n}" for n in range(RECORDS))
    for member, assignment in zip(members, (first, second), strict=True):
        assert member.records, "a member consumed nothing"
        assert {partition for partition, _, _ in member.records} <= assignment

    # The consumer protocol through pidgate: heartbeats forwarded, the classic protocol unused.
    counts = requests_by_api(gate)
    assert counts.get("ConsumerGroupHeartbeat", 0) > 0
    assert counts.get("ConsumerGroupDescribe", 0) > 0
    assert counts.get("JoinGroup", 0) == counts.get("SyncGroup", 0) == 0
    # Both Java 4.1 consumers have enable.metrics.push on (the 4.x default); this stock broker
    # offers no telemetry APIs, so they never ask: what a user sees without a receiver.
    assert counts.get("GetTelemetrySubscriptions", 0) == counts.get("PushTelemetry", 0) == 0

    # kafka-consumer-groups through pidgate: a consumer-protocol group (server-side "uniform"
    # assignor, group epochs), both members with the assignment each one reported.
    assert state.returncode == 0, state.stderr[-2000:]
    state_row = [line.split() for line in state.stdout.splitlines() if line.startswith(group)]
    assert "GROUP-EPOCH" in state.stdout
    assert len(state_row) == 1
    assert state_row[0][-1] == "2"  # #MEMBERS (2 until they left, after this ran)
    assert {"uniform", "Stable"} <= set(state_row[0])
    assert described.returncode == 0, described.stderr[-2000:]
    assert "TARGET-ASSIGNMENT" in described.stdout
    reported = sorted(
        re.findall(rf"{re.escape(topic)}:([\d,]+)", line)[0]
        for line in described.stdout.splitlines()
        if line.startswith(group)
    )
    assert reported == sorted(",".join(map(str, sorted(a))) for a in (first, second))


@pytest.fixture
def telemetry_kafka(
    kafka4_home: Path,
    start_kafka: Callable[..., KafkaRun],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> tuple[KafkaRun, Path]:
    """A 4.x broker of this test's own whose ``metric.reporters`` is ``TelemetrySink``: it
    offers the KIP-714 APIs and writes one line per push it receives into the returned file."""
    classes = compile_java(kafka4_home, "TelemetrySink.java")
    sink = tmp_path / "pushes.txt"
    original = kafka_module._broker_process

    def with_sink(*args: object, **kwargs: object) -> kafka_module._Process:
        process = original(*args, **kwargs)  # type: ignore[arg-type]
        process.env["CLASSPATH"] = str(classes)  # kafka-run-class.sh prepends it
        return process

    monkeypatch.setattr(kafka_module, "_broker_process", with_sink)
    run = start_kafka(
        kafka4_home,
        extra={"metric.reporters": "TelemetrySink", "pidgate.telemetry.sink.file": sink},
    )
    return run, sink


def test_kip714_telemetry_pushes_reach_the_broker_through_pidgate(
    telemetry_kafka: tuple[KafkaRun, Path], start_gate: GateStarter
) -> None:
    kafka, sink = telemetry_kafka
    gate = start_gate(kafka)
    # The operator's subscription, made through pidgate: every org.apache.kafka. metric, 1 s.
    subscribe = kafka.run_tool(
        "kafka-client-metrics",
        "--bootstrap-server",
        gate.bootstrap,
        "--alter",
        "--generate-name",
        "--metrics",
        "org.apache.kafka.",
        "--interval",
        "1000",
    )
    assert subscribe.returncode == 0, subscribe.stderr[-2000:]
    assert "Altered client metrics config" in subscribe.stdout

    topic = f"kip714-{uuid.uuid4().hex[:8]}"
    client = run_java(kafka.home, "TelemetryClient.java", gate.bootstrap, topic, "2500")
    assert client.returncode == 0, client.stdout + client.stderr[-3000:]
    instance = re.search(r"^INSTANCE (\S+)$", client.stdout, re.MULTILINE)
    assert instance is not None, client.stdout
    assert "CLOSED" in client.stdout.splitlines()
    # The client logs WARN and above (tools-log4j2.yaml): nothing about telemetry.
    assert [line for line in client.stderr.splitlines() if "elemetry" in line] == []

    counts = requests_by_api(gate)
    assert counts.get("GetTelemetrySubscriptions", 0) > 0
    pushes_forwarded = counts.get("PushTelemetry", 0)
    assert pushes_forwarded > 0

    # What the broker's receiver got, from this client: OTLP metrics it could parse.
    received = [line.split() for line in sink.read_text().splitlines()]
    ours = [fields for fields in received if fields[0] == instance.group(1)]
    assert 1 <= len(ours) <= pushes_forwarded, received
    for _, _terminating, content_type, size, metrics, principal in ours:
        assert content_type == "OTLP" and int(size) > 0 and int(metrics) > 0
        assert principal == "User:ANONYMOUS"
