"""Zero loss under a rejection storm: a soak of over one million records through pidgate.

Several idempotent producers (three librdkafka, one kafka-python) write 1,000,000 numbered
records through pidgate to a 4-partition topic on tansu, while a storm of short-lived idempotent
producers (a new PID each) is throttled by a small ANONYMOUS quota. Everything is then read back
from the broker itself, not through pidgate, and checked:

* every record a steady producer had acknowledged is in the log exactly once, and each
  producer's records are in the order it sent them within every partition;
* the steady producers saw no error at all (their PIDs are known after their first batch, and
  known PIDs are always forwarded, KIP-936);
* the storm really was throttled (pidgate rejected Produce requests while the soak ran), and a
  storm record that was acknowledged is present exactly once, one that was not at most once;
* a raw idempotent client pipelining five batches per connection, with a new PID each round,
  competes with the storm for tokens: its first batch is often rejected with four behind it and
  a token may free before they are judged (issue "order"). The broker never answers it with a
  sequence error, and its acknowledged batches are in the log once each, in sequence order.

Bounded: the steady producers stop at their record count, the storm at a producer count or when
the soak ends, and every wait has a deadline.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import confluent_kafka
import pytest
from kafka import KafkaProducer

from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.decisions import Decisions
from tests.integration.figures import record_figures
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    KafkaSocket,
    create_topic,
    decode_produce,
    encode_request,
    init_producer_id,
    produce_request,
    record_batch,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
#: Records per steady producer: three librdkafka producers and one (slower) kafka-python one.
LIBRDKAFKA_RECORDS = 300_000
KAFKA_PYTHON_RECORDS = 100_000
TOTAL_STEADY_RECORDS = 3 * LIBRDKAFKA_RECORDS + KAFKA_PYTHON_RECORDS
#: Storm: at most this many short-lived producers, one new PID each.
MAX_STORM_PRODUCERS = 400
#: 8 new PIDs per 10 s: the four steady producers fit in the first burst, the storm does not.
RATE = 8
WINDOW_S = 10
SOAK_DEADLINE_S = 300.0
CONSUME_DEADLINE_S = 240.0
#: After the acknowledged ends are read: stop when nothing more arrived for this long.
QUIET_S = 2.0


@dataclass
class Acks:
    """What one producer was told: acknowledged sequence numbers and errors."""

    name: str
    acked: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Highest offset the broker acknowledged for this producer, per partition.
    last_offsets: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, sequence: int, partition: int, offset: int) -> None:
        with self.lock:
            self.acked.append(sequence)
            self.last_offsets[partition] = max(offset, self.last_offsets.get(partition, -1))

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)


def value_of(name: str, sequence: int) -> bytes:
    return f"{name}:{sequence}".encode()


def librdkafka_steady(
    bootstrap: str, topic: str, acks: Acks, records: int, go: threading.Event
) -> None:
    """Sends record 0, waits for ``go``, then the rest, round-robin over the partitions."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 10,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 200_000,
            # Far beyond the soak: a steady producer never gives up on a record.
            "message.timeout.ms": int(SOAK_DEADLINE_S * 1000),
        }
    )

    def on_delivery(error: object, message: confluent_kafka.Message) -> None:
        sequence = int(message.value().split(b":")[1])  # type: ignore[union-attr]
        if error is None:
            acks.ack(sequence, message.partition(), message.offset())  # type: ignore[arg-type]
        else:
            acks.error(str(error))

    deadline = time.monotonic() + SOAK_DEADLINE_S
    producer.produce(topic, value_of(acks.name, 0), partition=0, on_delivery=on_delivery)
    producer.flush(60)
    go.wait(60)
    sequence = 1
    while sequence < records and time.monotonic() < deadline:
        try:
            producer.produce(
                topic,
                value_of(acks.name, sequence),
                partition=sequence % PARTITIONS,
                on_delivery=on_delivery,
            )
            sequence += 1
        except BufferError:  # local queue full: let deliveries drain it
            producer.poll(0.05)
        if sequence % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    if remaining:
        acks.error(f"{remaining} records still queued at the deadline")


def kafka_python_steady(
    bootstrap: str, topic: str, acks: Acks, records: int, go: threading.Event
) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=10,
        batch_size=256 * 1024,
        max_block_ms=60_000,
        delivery_timeout_ms=int(SOAK_DEADLINE_S * 1000),
        request_timeout_ms=30_000,
    )
    deadline = time.monotonic() + SOAK_DEADLINE_S
    try:
        for sequence in range(records):
            if sequence == 1:
                producer.flush(60)
                go.wait(60)
            if time.monotonic() > deadline:
                break
            future = producer.send(
                topic, value_of(acks.name, sequence), partition=sequence % PARTITIONS
            )
            future.add_callback(lambda meta, s=sequence: acks.ack(s, meta.partition, meta.offset))
            future.add_errback(lambda exc: acks.error(repr(exc)))
        producer.flush(max(1.0, deadline - time.monotonic()))
    finally:
        producer.close(timeout=10)


@dataclass
class Storm:
    """Short-lived librdkafka producers, one record and one new PID each, in a few threads,
    until stopped or ``MAX_STORM_PRODUCERS`` were made."""

    bootstrap: str
    topic: str
    threads: int = 4
    stop: threading.Event = field(default_factory=threading.Event)
    acked: set[bytes] = field(default_factory=set)
    sent: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _running: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self._running = [
            threading.Thread(target=self._run, args=(first,)) for first in range(self.threads)
        ]
        for thread in self._running:
            thread.start()

    def finish(self, timeout_s: float) -> bool:
        """Stops the storm; True when every storm thread ended within ``timeout_s``."""
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._running:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._running)

    def _run(self, first: int) -> None:
        for index in range(first, MAX_STORM_PRODUCERS, self.threads):
            if self.stop.is_set():
                return
            value = value_of("storm", index)
            producer = confluent_kafka.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    # Gives up quickly, so the storm keeps making new PIDs.
                    "message.timeout.ms": 2000,
                }
            )

            def on_delivery(error: object, _message: object, value: bytes = value) -> None:
                if error is None:
                    with self.lock:
                        self.acked.add(value)

            with self.lock:
                self.sent.add(value)
            producer.produce(
                self.topic, value, partition=index % PARTITIONS, on_delivery=on_delivery
            )
            producer.flush(3)


#: Rounds of the pipelining client (one new PID and five batches each), at most.
MAX_PIPELINE_ROUNDS = 200
PIPELINE_DEPTH = 5


@dataclass
class Pipeliner:
    """A raw idempotent client: per round a new PID and five batches pipelined on one
    connection to partition 0; what is rejected is resent in order after the throttle, as a
    client with max.in.flight 5 does, until acknowledged or the round's deadline."""

    bootstrap: str
    topic: str
    stop: threading.Event = field(default_factory=threading.Event)
    #: pid -> sequences acknowledged, in the order the acknowledgements arrived.
    acked: dict[int, list[int]] = field(default_factory=dict)
    error_codes: Counter[int] = field(default_factory=Counter)
    out_of_order: list[str] = field(default_factory=list)
    last_offset: int = -1
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def finish(self, timeout_s: float) -> bool:
        self.stop.set()
        assert self._thread is not None
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        for _ in range(MAX_PIPELINE_ROUNDS):
            if self.stop.is_set():
                return
            self._round(*init_producer_id(self.bootstrap))

    def _round(self, pid: int, epoch: int) -> None:
        pending = list(range(PIPELINE_DEPTH))
        correlation_id = 0
        deadline = time.monotonic() + 20
        with KafkaSocket(self.bootstrap, timeout_s=30) as conn:
            while pending and not self.stop.is_set() and time.monotonic() < deadline:
                frames = []
                for sequence in pending:
                    correlation_id += 1
                    batch = record_batch(
                        pid, epoch, sequence, value_prefix=b"pipe-%d-%d-" % (pid, sequence)
                    )
                    frames.append(
                        encode_request(produce_request(8, self.topic, batch), 8, correlation_id)
                    )
                conn.sendall(b"".join(frames))
                failed: list[int] = []
                throttle_ms = 0
                for sequence in pending:
                    response = decode_produce(conn.recv_frame(), 8)
                    answer = response.responses[0].partition_responses[0]
                    self.error_codes[answer.error_code] += 1
                    if answer.error_code != 0:
                        failed.append(sequence)
                        throttle_ms = max(throttle_ms, response.throttle_time_ms)
                        continue
                    if failed:
                        self.out_of_order.append(f"PID {pid}: {sequence} acked after {failed}")
                    self.acked.setdefault(pid, []).append(sequence)
                    self.last_offset = max(self.last_offset, answer.base_offset)
                pending = failed
                if pending:
                    time.sleep(min(throttle_ms, 1000) / 1000 + 0.01)


@pytest.fixture
def soak_proxy(broker: EmbeddedBroker) -> Iterator[tuple[BackgroundProxy, Decisions]]:
    decisions = Decisions()
    settings = proxy_settings(
        broker,
        quota=anonymous_quota(RATE, WINDOW_S),
        # Answered at once with short mutes: the storm keeps churning through new PIDs (held
        # ones would wait in line instead; tests/integration/test_holding.py covers holding).
        rejection={"max_throttle_time_ms": 500, "max_hold_ms": 0},
    )
    running = BackgroundProxy(settings, observers=(decisions,)).start()
    try:
        yield running, decisions
    finally:
        running.stop()


def read_back(bootstrap: str, topic: str, acked_ends: dict[int, int]) -> dict[int, list[bytes]]:
    """Every record value of ``topic``, per partition in offset order, read from the broker:
    at least up to ``acked_ends`` (one past the highest acknowledged offset per partition),
    then until nothing more arrives for a while (records written but never acknowledged).

    Not up to the broker's high watermark: tansu 0.6.0 can report one below offsets it has
    already acknowledged (seen: 245,186 while offsets up to 250,000 were acknowledged and
    readable), which would make present records look lost. And from offset 0 itself, not
    "the beginning": once, asked for the beginning, the consumer's first record of a partition
    was offset 1,625 (not reproduced in 2 runs since); from 0, a record really missing at the
    start still fails the density check below.
    """
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("soak-reader"),
            "enable.auto.commit": False,
            "fetch.max.bytes": 32 * 1024 * 1024,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        next_offset = dict.fromkeys(range(PARTITIONS), 0)
        deadline = time.monotonic() + CONSUME_DEADLINE_S
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            reached = all(next_offset[p] >= acked_ends.get(p, 0) for p in range(PARTITIONS))
            if reached and time.monotonic() - quiet_since > QUIET_S:
                break
            messages = consumer.consume(num_messages=10_000, timeout=0.5)
            if messages:
                quiet_since = time.monotonic()
            for message in messages:
                if message.error() is not None:
                    continue
                partition, value, offset = message.partition(), message.value(), message.offset()
                assert partition is not None and value is not None and offset is not None
                # Offsets are dense (no compaction, no transactions): a gap is a lost record.
                assert offset == next_offset[partition], (partition, offset, next_offset)
                values[partition].append(value)
                next_offset[partition] = offset + 1
        assert all(next_offset[p] >= acked_ends.get(p, 0) for p in range(PARTITIONS)), (
            next_offset,
            acked_ends,
        )
        return values
    finally:
        consumer.close()


def test_a_million_acknowledged_records_survive_a_rejection_storm_exactly_once_in_order(
    broker: EmbeddedBroker, soak_proxy: tuple[BackgroundProxy, Decisions]
) -> None:
    proxy, decisions = soak_proxy
    topic = unique_name("soak")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)

    steady = [Acks(f"rd{index}") for index in range(3)] + [Acks("kp0")]
    go = threading.Event()
    workers = [
        threading.Thread(
            target=librdkafka_steady, args=(proxy.bootstrap, topic, acks, LIBRDKAFKA_RECORDS, go)
        )
        for acks in steady[:3]
    ] + [
        threading.Thread(
            target=kafka_python_steady,
            args=(proxy.bootstrap, topic, steady[3], KAFKA_PYTHON_RECORDS, go),
        )
    ]
    storm = Storm(proxy.bootstrap, topic)
    pipeliner = Pipeliner(proxy.bootstrap, topic)

    def rejection_count() -> int:
        return sum(1 for _, admitted, _ in decisions.events if not admitted)

    started = time.monotonic()
    try:
        for worker in workers:
            worker.start()
        # Each steady producer first gets its PID admitted (its record 0 acknowledged); then
        # the storm starts, and the bulk is sent only once the storm is being rejected.
        wait_until(lambda: all(acks.acked for acks in steady), 60, "every first ack")
        storm.start()
        pipeliner.start()
        wait_until(lambda: rejection_count() > 0, 60, "the storm to be throttled")
        rejections_before_bulk = rejection_count()
        go.set()
        for worker in workers:
            worker.join(SOAK_DEADLINE_S + 30)
        rejections_during_bulk = rejection_count() - rejections_before_bulk
    finally:
        go.set()
        storm_stopped = storm.finish(30)
        pipeliner_stopped = pipeliner.finish(60)
    produce_seconds = time.monotonic() - started
    assert not any(worker.is_alive() for worker in workers), "a steady producer hung"
    assert storm_stopped, "the storm did not stop"
    assert pipeliner_stopped, "the pipelining client did not stop"

    for acks in steady:
        assert acks.errors == [], (acks.name, acks.errors[:5])
    assert sum(len(acks.acked) for acks in steady) == TOTAL_STEADY_RECORDS

    # The storm was throttled while the million records went through, not just before, and
    # never got more new PIDs in than the quota allows: one burst plus the refill.
    assert rejections_during_bulk > 0
    admitted_new_pids = decisions.admitted("User:ANONYMOUS")
    assert len(admitted_new_pids) <= RATE + RATE * (produce_seconds + 1) / WINDOW_S
    rejections = [event for event in decisions.events if not event[1]]

    read_started = time.monotonic()
    acked_ends = {
        partition: max(acks.last_offsets.get(partition, -1) for acks in steady) + 1
        for partition in range(PARTITIONS)
    }
    acked_ends[0] = max(acked_ends[0], pipeliner.last_offset + 1)
    log = read_back(broker.bootstrap, topic, acked_ends)
    read_seconds = time.monotonic() - read_started

    occurrences: Counter[bytes] = Counter()
    sequences: dict[tuple[int, str], list[int]] = defaultdict(list)
    pipelined: dict[int, list[int]] = defaultdict(list)  # pid -> sequences in log order
    for partition, values in log.items():
        for value in values:
            occurrences[value] += 1
            if value.startswith(b"pipe-"):
                _, pid, sequence, _ = value.split(b"-")
                pipelined[int(pid)].append(int(sequence))
                continue
            name, _, sequence = value.decode().partition(":")
            sequences[(partition, name)].append(int(sequence))

    for acks in steady:
        expected = {value_of(acks.name, s) for s in acks.acked}
        missing = [v for v in expected if occurrences[v] == 0]
        duplicated = [v for v in expected if occurrences[v] > 1]
        assert not missing, (acks.name, len(missing), missing[:5])
        assert not duplicated, (acks.name, len(duplicated), duplicated[:5])
        for partition in range(PARTITIONS):
            in_log = sequences[(partition, acks.name)]
            assert in_log == sorted(in_log), f"{acks.name} out of order on partition {partition}"
            assert len(in_log) == len(acks.acked) // PARTITIONS + (
                partition < len(acks.acked) % PARTITIONS
            )

    # The pipelining client: only pidgate's rejection code and successes, never a sequence error
    # from the broker; what was acknowledged is in the log once, in sequence order.
    assert set(pipeliner.error_codes) <= {0, REJECTED_DEFAULT}, pipeliner.error_codes
    assert pipeliner.out_of_order == []
    assert pipeliner.error_codes[REJECTED_DEFAULT] > 0  # it was throttled, with batches behind
    assert all(sequences == sorted(sequences) for sequences in pipelined.values())
    assert {pid: sorted(seqs) for pid, seqs in pipelined.items()} == {
        pid: sorted(seqs) for pid, seqs in pipeliner.acked.items()
    }

    storm_in_log = {value for value in occurrences if value.startswith(b"storm:")}
    assert storm.acked <= storm_in_log, "an acknowledged storm record is missing"
    assert all(occurrences[value] == 1 for value in storm_in_log)
    assert storm_in_log <= storm.sent
    # Nothing in the log that nobody sent.
    steady_names = {acks.name for acks in steady}
    assert {name for _, name in sequences} <= steady_names | {"storm"}

    record_figures(
        "soak",
        steady_records=TOTAL_STEADY_RECORDS,
        records_in_log=sum(occurrences.values()),
        produce_seconds=round(produce_seconds, 1),
        steady_records_per_second=round(TOTAL_STEADY_RECORDS / produce_seconds),
        read_back_seconds=round(read_seconds, 1),
        storm_producers=len(storm.sent),
        storm_acked=len(storm.acked),
        storm_in_log=len(storm_in_log),
        rejected_produce_requests=len(rejections),
        rejected_during_bulk=rejections_during_bulk,
        admitted_new_pids=len(admitted_new_pids),
        pipelined_rounds_acked=len(pipeliner.acked),
        pipelined_rejections=pipeliner.error_codes[REJECTED_DEFAULT],
        held_for_order=proxy.call_and_wait(lambda: proxy.server.metrics.produce_held_count),
        rejected_new_pids=len({pid for event in rejections for pid in event[2]}),
    )
