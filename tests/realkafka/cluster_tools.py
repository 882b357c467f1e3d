"""Helpers for the failover and transaction tests on real Kafka: topics and partition leaders
read straight from the cluster, sidecar-fleet settings, steady producers (librdkafka and
kafka-python) that record what was delivered when, and read-back of what the broker holds
(values through a read_committed consumer, producer id and epoch from the batch headers).

Owns: ``create_topic``, ``leader_of``, ``wait_for_full_isr``, ``first_producer_id``,
``warm_up_pid_blocks``, ``sidecar_fleet``, ``SteadyProducer`` and its two clients,
``read_committed_values``, ``batch_producers``.
Every loop here is bounded in count and time; nothing here starts a broker.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from pidgate.config import load_settings
from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import (
    NOT_LEADER_OR_FOLLOWER,
    FetchError,
    fetch_batch_headers,
)
from tests.integration.helpers import KafkaSocket, decode_response, encode_request
from tests.realkafka.kafka import KafkaRun, free_port


def create_topic(bootstrap: str, topic: str, partitions: int = 1, replicas: int = -1) -> None:
    """Create ``topic`` (replication: the cluster's default) and wait until every partition has
    a leader and a full ISR, so a SIGKILL of one replica leaves min.insync.replicas behind."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replicas)],
        operation_timeout=30,
    )
    futures[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=10).topics[topic]
        parts = metadata.partitions.values()
        if (
            metadata.error is None
            and len(parts) == partitions
            and all(p.leader >= 0 and len(p.isrs) == len(p.replicas) for p in parts)
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} did not get leaders and a full ISR in 60 s")


def leader_of(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The node id leading ``topic``-``partition``, asked of the cluster itself."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    leader: int = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
    return leader


def isr_of(bootstrap: str, topic: str, partition: int = 0) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    isrs: list[int] = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].isrs
    return sorted(isrs)


def wait_for_full_isr(kafka: KafkaRun, timeout_s: float = 120.0) -> None:
    """After a broker restart: wait until every broker is registered and in the ISR of every
    partition (so the next SIGKILL leaves min.insync.replicas in place)."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    deadline = time.monotonic() + timeout_s
    lagging: list[str] = []
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=10)
        lagging = [
            f"{name}-{p.id}"
            for name, topic in metadata.topics.items()
            for p in topic.partitions.values()
            if len(p.isrs) < len(p.replicas) or p.leader < 0
        ]
        if not lagging and len(metadata.brokers) == len(kafka.broker_ports):
            return
        time.sleep(0.5)
    raise AssertionError(f"ISR not full {timeout_s} s after the restart: {lagging[:10]}")


#: InitProducerId errors a broker answers while it cannot allocate yet (retriable):
#: COORDINATOR_LOAD_IN_PROGRESS (Kafka 4 fetching its first PID block), COORDINATOR_NOT_AVAILABLE,
#: NOT_COORDINATOR.
_NOT_YET = (14, 15, 16)


def first_producer_id(address: str, timeout_s: float = 90.0) -> int:
    """One InitProducerId, asked of a broker directly, waiting (bounded) for its first PID
    block: a fresh 3.1 broker in ZooKeeper mode fetches it synchronously and stalls its request
    handlers when several InitProducerIds arrive before it exists (../shared/kafka/README.md,
    "Quirks"), so one request waits long rather than several short ones; Kafka 4 answers
    retriable COORDINATOR_LOAD_IN_PROGRESS until it has it."""
    deadline = time.monotonic() + timeout_s
    request = InitProducerIdRequest(
        version=4,
        transactional_id=None,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    for attempt in range(1, 1000):
        with KafkaSocket(address, timeout_s=max(1.0, deadline - time.monotonic())) as conn:
            conn.sendall(encode_request(request, 4, attempt))
            response = decode_response(InitProducerIdResponse, conn.recv_frame(), 4)
        if response.error_code == 0:
            producer_id: int = response.producer_id
            return producer_id
        if response.error_code not in _NOT_YET or time.monotonic() > deadline:
            raise AssertionError(f"InitProducerId to {address}: error {response.error_code}")
        time.sleep(0.5)
    raise AssertionError(f"InitProducerId to {address}: no PID")


def warm_up_pid_blocks(kafka: KafkaRun) -> None:
    """``first_producer_id`` from each broker, one at a time."""
    for port in kafka.broker_ports.values():
        first_producer_id(f"127.0.0.1:{port}")


def sidecar_fleet(
    kafka: KafkaRun, fleet_id: str, quota: dict[str, Any]
) -> dict[int, BackgroundProxy]:
    """One sidecar pidgate per broker (``proxy.mode: sidecar``, upstream = that broker), every
    one mapping each broker's endpoint to its sidecar, all in fleet ``fleet_id``."""
    listens = {node: f"127.0.0.1:{free_port()}" for node in kafka.broker_ports}
    endpoints = {f"127.0.0.1:{port}": listens[node] for node, port in kafka.broker_ports.items()}
    sidecars: dict[int, BackgroundProxy] = {}
    try:
        for node, port in kafka.broker_ports.items():
            settings = load_settings(
                cli_overrides={
                    "proxy": {
                        "mode": "sidecar",
                        "upstream": [f"127.0.0.1:{port}"],
                        "listen": listens[node],
                        "advertised_endpoints": endpoints,
                    },
                    "quota": quota,
                    "fleet": {"id": fleet_id, "flush_interval_ms": 50},
                    "logging": {"format": "json"},
                    "admin": {"listen": f"127.0.0.1:{free_port()}"},
                }
            )
            sidecars[node] = BackgroundProxy(settings).start(timeout_s=90)
    except BaseException:
        for sidecar in sidecars.values():
            sidecar.stop()
        raise
    return sidecars


# -- steady producers -------------------------------------------------------------------------


@dataclass
class SteadyProducer:
    """One idempotent acks=all producer sending keyed records at a steady pace from a thread;
    records each acknowledgement's time and each error."""

    name: str
    topic: str
    interval_s: float = 0.02
    max_records: int = 20_000
    sent: list[bytes] = field(default_factory=list)
    acked: list[bytes] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- what a client does --
    def _send(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def _poll(self) -> None:
        raise NotImplementedError

    def _flush(self, timeout_s: float) -> None:
        raise NotImplementedError

    def _on_ack(self, value: bytes) -> None:
        with self._lock:
            self.acked.append(value)
            self.ack_times.append(time.monotonic())

    def _on_error(self, error: object) -> None:
        with self._lock:
            self.errors.append(str(error)[:300])

    def start(self) -> SteadyProducer:
        self._thread = threading.Thread(target=self._run, name=f"steady-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set() and len(self.sent) < self.max_records:
                value = b"%s-%06d" % (self.name.encode(), len(self.sent))
                self.sent.append(value)
                self._send(b"key-%d" % (len(self.sent) % 7), value)
                self._poll()
                self._stop.wait(self.interval_s)
        except BaseException as error:  # reported through ``errors``
            self._on_error(f"producer thread: {error!r}")

    def stop(self, flush_timeout_s: float = 60.0) -> None:
        """Stop sending, then wait (bounded) for every record sent to be acknowledged."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self._flush(flush_timeout_s)

    def acks_after(self, moment: float) -> int:
        with self._lock:
            return sum(1 for t in self.ack_times if t > moment)

    def longest_stall_after(self, moment: float) -> float:
        """The longest time without an acknowledgement from ``moment`` to the last one."""
        with self._lock:
            times = [moment] + [t for t in self.ack_times if t > moment]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def close(self) -> None:
        pass


class RdkafkaSteady(SteadyProducer):
    """librdkafka (confluent_kafka): enable.idempotence, acks=all (its defaults with it)."""

    def __init__(self, name: str, topic: str, bootstrap: str, **config: Any) -> None:
        super().__init__(name, topic)
        self.client = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "client.id": name,
                **config,
            }
        )

    def _send(self, key: bytes, value: bytes) -> None:
        def report(error: Any, message: Any) -> None:
            if error is not None:
                self._on_error(error)
            else:
                self._on_ack(message.value())

        self.client.produce(self.topic, value, key, on_delivery=report)

    def _poll(self) -> None:
        self.client.poll(0)

    def _flush(self, timeout_s: float) -> None:
        self.client.flush(timeout_s)


class KafkaPythonSteady(SteadyProducer):
    """kafka-python: enable_idempotence, acks=all."""

    def __init__(self, name: str, topic: str, bootstrap: str) -> None:
        super().__init__(name, topic)
        self.client = KafkaProducer(
            bootstrap_servers=bootstrap.split(","),
            enable_idempotence=True,
            acks="all",
            linger_ms=5,
            client_id=name,
            request_timeout_ms=15_000,
            delivery_timeout_ms=120_000,
        )

    def _send(self, key: bytes, value: bytes) -> None:
        future = self.client.send(self.topic, value=value, key=key)
        future.add_callback(lambda _metadata: self._on_ack(value))
        future.add_errback(self._on_error)

    def _poll(self) -> None:
        pass

    def _flush(self, timeout_s: float) -> None:
        self.client.flush(timeout_s)

    def close(self) -> None:
        self.client.close(timeout=5)


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# -- reading back -----------------------------------------------------------------------------


def read_committed_values(
    bootstrap: str, topic: str, expected: int, partitions: int = 1, timeout_s: float = 60.0
) -> list[bytes]:
    """Every record value of ``topic`` a read_committed consumer sees (from the cluster
    itself, not through pidgate), reading until the partitions' end or ``timeout_s``."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"readback-{topic}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                if len(at_end) == partitions and len(values) >= expected:
                    break
                continue
            error = message.error()
            if error is not None:
                if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    if len(at_end) == partitions and len(values) >= expected:
                        break
                    continue
                raise AssertionError(f"read-back error: {error}")
            at_end.discard(message.partition())
            values.append(message.value())
    finally:
        consumer.close()
    return values


def batch_producers(kafka: KafkaRun, topic: str, partition: int = 0) -> Counter[tuple[int, int]]:
    """(producer_id, producer_epoch) -> records the partition's leader holds from it, from
    the record-batch headers (Fetch v4, read_uncommitted, bypassing pidgate)."""
    counts: Counter[tuple[int, int]] = Counter()
    deadline = time.monotonic() + 60
    while True:
        leader = leader_of(kafka.bootstrap, topic, partition)
        try:
            headers = fetch_batch_headers(
                f"127.0.0.1:{kafka.broker_ports[leader]}", topic, [partition]
            )
            break
        except FetchError as error:
            # The leadership moved between the metadata's answer and the Fetch: a restarted
            # broker takes its preferred partitions back (auto.leader.rebalance.enable). Ask
            # again; any other error, or one that lasts, fails the test.
            if error.error_code != NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    for header in headers:
        if header.attributes & 0x20:  # control batch (transaction marker): no user record
            continue
        counts[(header.producer_id, header.producer_epoch)] += header.records_count
    return counts
