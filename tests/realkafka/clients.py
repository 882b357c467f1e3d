"""Real Kafka clients as a user runs them, each behind one function: produce keyed records
through a bootstrap (pidgate's or a broker's) and say what was acknowledged, what failed and
when; and read a topic back from the broker to the end.

Owns: ``Record``/``keyed_records`` (the records a test sends: unique values, repeating keys),
``ProduceResult``, one runner per client (``produce_confluent`` for librdkafka,
``produce_kafka_python``, ``produce_aiokafka``, ``produce_java`` for the distribution's Java
producer through ``java/ThrottledProducer.java``, ``produce_console`` for
``kafka-console-producer``), ``read_back``, ``create_topic`` and ``warm_up``.

Every runner takes the same arguments: ``bootstrap``, ``topic``, ``records``, ``config`` (the
client's own setting names, on top of an idempotent producer's; SASL goes there too),
``timeout_s`` (a bound on the whole run; records unresolved by then count as failed) and
``on_ready`` (called once the client runs, before its first record is sent: a test spends the
principal's token there so that this client has to wait). Nothing here asserts: tests do.
"""

from __future__ import annotations

import asyncio
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.realkafka.java import compile_java, java_command
from tests.realkafka.kafka import KafkaRun


@dataclass(frozen=True)
class Record:
    key: str
    value: str


def keyed_records(name: str, count: int, keys: int = 7) -> list[Record]:
    """``count`` records of producer ``name``: unique values (so a duplicate is visible) and
    ``keys`` distinct keys (so the records spread over partitions)."""
    return [Record(f"{name}-k{i % keys}", f"{name}-{i:05d}") for i in range(count)]


@dataclass
class ProduceResult:
    """What one producer reported. Times are ``time.time()`` (comparable across processes)."""

    client: str
    sent: int
    delivered: list[Record] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started_at: float = 0.0
    first_ack_at: float | None = None
    finished_at: float = 0.0

    @property
    def delivered_count(self) -> int:
        return len(self.delivered)

    @property
    def failed_count(self) -> int:
        """Records not acknowledged: failed, or unresolved when the run ended."""
        return self.sent - len(self.delivered)

    def acked(self, record: Record) -> None:
        if self.first_ack_at is None:
            self.first_ack_at = time.time()
        self.delivered.append(record)

    def summary(self) -> str:
        return (
            f"{self.client}: {self.delivered_count}/{self.sent} acknowledged in "
            f"{self.finished_at - self.started_at:.1f}s, errors {self.errors[:3]}"
        )


OnReady = Callable[[], None] | None


def _ready(on_ready: OnReady) -> None:
    if on_ready is not None:
        on_ready()


# -- librdkafka ---------------------------------------------------------------------------------


def produce_confluent(
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    config: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    on_ready: OnReady = None,
) -> ProduceResult:
    """confluent-kafka (librdkafka): idempotent, otherwise its defaults and ``config``."""
    result = ProduceResult("confluent-kafka", len(records), started_at=time.time())
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "error_cb": lambda error: result.errors.append(f"error_cb: {error}"),
            **(config or {}),
        }
    )
    try:
        producer.list_topics(topic, timeout=min(timeout_s, 30))
    except confluent_kafka.KafkaException as error:
        result.errors.append(f"metadata: {error}")
    _ready(on_ready)
    deadline = time.monotonic() + timeout_s

    def on_delivery(error: Any, _message: Any, *, record: Record) -> None:
        if error is None:
            result.acked(record)
        else:
            result.errors.append(f"{record.value}: {error}")

    for record in records:
        try:
            producer.produce(
                topic,
                value=record.value.encode(),
                key=record.key.encode(),
                on_delivery=partial(on_delivery, record=record),
            )
        except (BufferError, confluent_kafka.KafkaException) as error:
            result.errors.append(f"{record.value}: produce: {error}")
        producer.poll(0)
    unresolved = producer.flush(max(0.0, deadline - time.monotonic()))
    if unresolved:
        result.errors.append(f"{unresolved} records unresolved after {timeout_s}s")
    result.finished_at = time.time()
    return result


# -- kafka-python -------------------------------------------------------------------------------


def produce_kafka_python(
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    config: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    on_ready: OnReady = None,
) -> ProduceResult:
    """kafka-python: idempotent (acks=all, as it requires), otherwise its defaults and
    ``config``."""
    result = ProduceResult("kafka-python", len(records), started_at=time.time())
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", **(config or {})
    )
    try:
        producer.partitions_for(topic)
        _ready(on_ready)
        deadline = time.monotonic() + timeout_s
        futures = [
            (record, producer.send(topic, value=record.value.encode(), key=record.key.encode()))
            for record in records
        ]
        for record, future in futures:
            try:
                future.get(timeout=max(0.1, deadline - time.monotonic()))
                result.acked(record)
            except Exception as error:  # any failure of this record is the record's outcome
                result.errors.append(f"{record.value}: {error!r}")
    finally:
        try:
            producer.close(timeout=10)
        except Exception as error:  # kafka-python's close raises what flush could not finish
            result.errors.append(f"close: {error!r}")
    result.finished_at = time.time()
    return result


# -- aiokafka -----------------------------------------------------------------------------------


def produce_aiokafka(
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    config: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
    on_ready: OnReady = None,
) -> ProduceResult:
    """aiokafka: idempotent (it sends InitProducerId v0), otherwise its defaults and
    ``config``; on an event loop of its own."""
    from aiokafka import AIOKafkaProducer

    result = ProduceResult("aiokafka", len(records), started_at=time.time())

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=True, **(config or {})
        )
        await producer.start()
        try:
            await producer.partitions_for(topic)
            _ready(on_ready)

            async def one(record: Record) -> None:
                try:
                    future = await producer.send(
                        topic, value=record.value.encode(), key=record.key.encode()
                    )
                    await future
                    result.acked(record)
                except Exception as error:  # the record's outcome
                    result.errors.append(f"{record.value}: {error!r}")

            try:
                await asyncio.wait_for(
                    asyncio.gather(*(one(record) for record in records)), timeout_s
                )
            except TimeoutError:
                result.errors.append(f"unresolved after {timeout_s}s")
        finally:
            await producer.stop()

    asyncio.run(run())
    result.finished_at = time.time()
    return result


# -- the Java producer (kafka-clients of the distribution) ----------------------------------------


def produce_java(
    kafka: KafkaRun,
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    config: dict[str, Any] | None = None,
    timeout_s: float = 90.0,
    on_ready: OnReady = None,
) -> ProduceResult:
    """The distribution's own Java producer (``java/ThrottledProducer.java``): idempotent,
    otherwise the client's defaults and ``config``; one ACK/FAIL line per record."""
    classes = compile_java(kafka.home, "ThrottledProducer.java")
    settings = [f"{key}={value}" for key, value in (config or {}).items()]
    command = java_command(kafka.home, classes, "ThrottledProducer", bootstrap, topic, *settings)
    result = ProduceResult(f"java {kafka.version}", len(records), started_at=time.time())
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        assert process.stdin is not None
        stdout, stderr = _drain(process.stdout), _drain(process.stderr)
        try:
            # Log lines may come before READY (4.x's log4j2 prints to stdout when
            # java_command's log4j 1 setting does not apply): only the protocol lines count.
            if not _wait_for_line(stdout, "READY", deadline, process):
                result.errors.append(f"not ready: {stdout[-3:]} {''.join(stderr)[-1500:]}")
            else:
                _ready(on_ready)
                process.stdin.write("".join(f"{r.key}\t{r.value}\n" for r in records))
                process.stdin.close()
                if not _wait_for_line(stdout, "DONE", deadline, process):
                    result.errors.append(f"no DONE in {timeout_s}s: {''.join(stderr)[-1500:]}")
        finally:
            _stop(process)
    lines = list(stdout)
    for line in lines:
        kind, _, rest = line.strip().partition(" ")
        if kind == "ACK":
            index, _partition, _offset, epoch_ms = rest.split()
            result.delivered.append(records[int(index)])
            at = int(epoch_ms) / 1000
            first = result.first_ack_at
            result.first_ack_at = at if first is None else min(first, at)
        elif kind == "FAIL":
            result.errors.append(rest)
    result.finished_at = time.time()
    return result


# -- kafka-console-producer -----------------------------------------------------------------------


def produce_console(
    kafka: KafkaRun,
    bootstrap: str,
    topic: str,
    records: Sequence[Record],
    *,
    config: dict[str, Any] | None = None,
    timeout_s: float = 90.0,
    on_ready: OnReady = None,
) -> ProduceResult:
    """``kafka-console-producer`` of the distribution, keyed records from stdin, idempotent
    with acks=all (3.1's tool defaults to acks=1, which idempotence refuses) and its own
    defaults otherwise (3.1: ``retries=3``). Settings go through ``--producer.config``, which
    3.1 and 4.1 both take.

    The tool reports no acknowledgements: a record counts as delivered when the tool exited 0
    without logging an error for it (it closes its producer, waiting for every send, before it
    exits); ``read_back`` is the real check. ``on_ready`` is called once the JVM is started,
    which the tool does not signal: callers wait for its connection themselves."""
    result = ProduceResult(f"console-producer {kafka.version}", len(records))
    properties = {"enable.idempotence": "true", "acks": "all", **(config or {})}
    with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as file:
        file.write("".join(f"{key}={value}\n" for key, value in properties.items()))
        config_path = Path(file.name)
    command = [
        kafka.tool("kafka-console-producer"),
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--producer.config",
        str(config_path),
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=\t",
    ]
    result.started_at = time.time()
    try:
        with subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=kafka.tool_env(),
            start_new_session=True,
        ) as process:
            assert process.stdin is not None
            stdout, stderr = _drain(process.stdout), _drain(process.stderr)
            try:
                _ready(on_ready)
                process.stdin.write("".join(f"{r.key}\t{r.value}\n" for r in records))
                process.stdin.close()
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                result.errors.append(f"still running after {timeout_s}s")
            finally:
                _stop(process)
    finally:
        config_path.unlink(missing_ok=True)
    output = "".join(stdout) + "".join(stderr)
    failures = [line for line in output.splitlines() if "Error when sending message" in line]
    result.errors += failures
    if process.returncode != 0:
        result.errors.append(f"exit {process.returncode}: {output[-1500:]}")
    elif not failures:
        result.delivered = list(records)
        result.first_ack_at = None  # not reported by the tool
    result.finished_at = time.time()
    return result


def _wait_for_line(
    lines: list[str], marker: str, deadline: float, process: subprocess.Popen[str]
) -> bool:
    """Whether the line ``marker`` shows up in ``lines`` (filled by ``_drain``) before the
    deadline or the process's end."""
    while time.monotonic() < deadline:
        exited = process.poll() is not None
        if any(line.strip() == marker for line in list(lines)):
            return True
        if exited:  # its last lines may still be on their way
            time.sleep(0.2)
            return any(line.strip() == marker for line in list(lines))
        time.sleep(0.05)
    return False


def _drain(stream: Any) -> list[str]:
    """Read ``stream`` to its end in a thread (a full pipe must not block the child); the
    list grows line by line as they come."""
    lines: list[str] = []

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _stop(process: subprocess.Popen[str]) -> None:
    """Stop a child this module started, by its PID, whatever state it is in."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


# -- topics, read-back, warm-up -------------------------------------------------------------------


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(60)


def read_back(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Record]:
    """Every record of ``topic``, read from ``bootstrap`` up to the end offsets of the moment
    (read_uncommitted): what the broker stored, whatever the producers reported."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(_partitions(consumer, topic))]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(p) < end[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end in {timeout_s}s")
            for batch in consumer.poll(timeout_ms=500).values():
                records += [Record(m.key.decode(), m.value.decode()) for m in batch]
        return records
    finally:
        consumer.close()


def _partitions(consumer: KafkaConsumer, topic: str, timeout_s: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = consumer.partitions_for_topic(topic)
        if found:
            return set(found)
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: no metadata in {timeout_s}s")


_warmed: set[str] = set()


def warm_up(kafka: KafkaRun) -> None:
    """One idempotent producer straight to a broker, alone, before any test's producers:
    a fresh 3.1 broker stalls when several InitProducerId requests race for its first PID block,
    and a fresh 4.1 broker answers the first with a retriable error (shared/kafka README)."""
    if kafka.bootstrap in _warmed:
        return
    result = produce_confluent(
        kafka.bootstrap, "warm-up", keyed_records("warm-up", 1), config={"acks": "all"}
    )
    if result.delivered_count != 1:
        raise RuntimeError(f"warm-up producer failed: {result.summary()}")
    _warmed.add(kafka.bootstrap)
