"""Transactional producers through pidgate on real Kafka (3.x ZooKeeper, 4.x KRaft): a quota
that throttles new PIDs delays a transaction, never breaks it. Transactions committed and
aborted on purpose, concurrently, by more producers than the quota admits at once; a
read_committed consumer then reads exactly the committed records, once each, and none of the
aborted ones, which the log still holds (so the abort was real, not a no-op).

librdkafka (confluent_kafka), kafka-python and the Java producer of the distribution under test
(java/TransactionalProducer.java) run transactions here; pidgate answers each with the error code
it retries (19, 89 for kafka-python; DESIGN.md "Rejection that every client survives").
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from kafka import KafkaProducer

from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import fetch_batch_headers
from tests.realkafka.cluster_tools import create_topic, first_producer_id, read_committed_values
from tests.realkafka.gate import GateStarter
from tests.realkafka.java import compile_java, java_command
from tests.realkafka.kafka import KafkaRun

#: Four transactional producers start together against a quota of two new PIDs per 12 s: two
#: of them wait for a token (6 s, then 12 s), inside their first transaction.
QUOTA = {
    "producer.id.quota.window.size.seconds": 12,
    "users": {"ANONYMOUS": {"producer_ids_rate": 2}},
}
TRANSACTIONS = 6  # per producer
RECORDS_PER_TRANSACTION = 5


def aborted(transaction: int) -> bool:
    return transaction % 3 == 1  # 2 of 6 aborted on purpose


@dataclass
class Transactor:
    """One transactional producer's run: what it committed and aborted."""

    name: str
    begin: Callable[[], None] = lambda: None
    send: Callable[[bytes], None] = lambda _value: None
    commit: Callable[[], None] = lambda: None
    abort: Callable[[], None] = lambda: None
    committed: list[bytes] = field(default_factory=list)
    aborted: list[bytes] = field(default_factory=list)
    error: str | None = None

    def run(self, start: threading.Barrier) -> None:
        try:
            start.wait(120)
            for transaction in range(TRANSACTIONS):
                values = [
                    b"%s-t%d-r%d" % (self.name.encode(), transaction, record)
                    for record in range(RECORDS_PER_TRANSACTION)
                ]
                self.begin()
                for value in values:
                    self.send(value)
                if aborted(transaction):
                    self.abort()
                    self.aborted += values
                else:
                    self.commit()
                    self.committed += values
        except BaseException as error:  # reported by the test
            self.error = repr(error)[:500]


def rdkafka_transactor(name: str, bootstrap: str, topic: str) -> Transactor:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
            "client.id": name,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(60)

    def abort() -> None:
        # librdkafka purges records it has not sent yet on abort: flush first, so the
        # records reach the log and the abort marker is what discards them.
        producer.flush(60)
        producer.abort_transaction(60)

    return Transactor(
        name,
        begin=producer.begin_transaction,
        send=lambda value: producer.produce(topic, value, b"k"),
        commit=lambda: producer.commit_transaction(60),
        abort=abort,
    )


def kafka_python_transactor(name: str, bootstrap: str, topic: str) -> Transactor:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"{name}-{uuid.uuid4().hex[:8]}",
        client_id=name,
        linger_ms=5,
        request_timeout_ms=15_000,
    )
    producer.init_transactions()

    def abort() -> None:
        producer.flush(60)  # the records reach the log, then the abort marker discards them
        producer.abort_transaction()

    return Transactor(
        name,
        begin=producer.begin_transaction,
        send=lambda value: producer.send(topic, value=value, key=b"k") and None,
        commit=producer.commit_transaction,
        abort=abort,
    )


class JavaTransactor(Transactor):
    """The Java producer (java/TransactionalProducer.java): started and through
    initTransactions before the race, then told to go on stdin; its stdout says which
    transactions it committed and aborted."""

    def __init__(self, kafka: KafkaRun, bootstrap: str, topic: str) -> None:
        super().__init__("java")
        classes = compile_java(kafka.home, "TransactionalProducer.java")
        command = java_command(
            kafka.home,
            classes,
            "TransactionalProducer",
            bootstrap,
            topic,
            f"java-{uuid.uuid4().hex[:8]}",
            str(TRANSACTIONS),
            str(RECORDS_PER_TRANSACTION),
        )
        with (kafka.run_dir / f"{topic}-java.log").open("w") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.log = kafka.run_dir / f"{topic}-java.log"
        # Other lines may come first: Kafka 4's log4j2 complains about the tools' log4j 1
        # configuration on stdout.
        deadline = time.monotonic() + 120
        while (line := self._next_line(max(0.0, deadline - time.monotonic()))) != "ready":
            if line is None or line.startswith("error"):
                self.kill()
                raise AssertionError(f"the Java producer did not initTransactions: {line}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def _next_line(self, timeout_s: float) -> str | None:
        try:
            return self.lines.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def run(self, start: threading.Barrier) -> None:
        try:
            start.wait(120)
            assert self.process.stdin is not None
            self.process.stdin.write("go\n")
            self.process.stdin.flush()
            deadline = time.monotonic() + 150
            while (line := self._next_line(max(0.0, deadline - time.monotonic()))) is not None:
                verb, _, argument = line.partition(" ")
                if verb in ("committed", "aborted"):
                    values = [
                        b"java-t%s-r%d" % (argument.encode(), record)
                        for record in range(RECORDS_PER_TRANSACTION)
                    ]
                    (self.committed if verb == "committed" else self.aborted).extend(values)
                elif verb == "error":
                    self.error = line
                elif verb == "done":
                    return
            self.error = self.error or "the Java producer stopped before it was done"
        except BaseException as error:
            self.error = repr(error)[:500]
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def counters_of(gate: BackgroundProxy) -> Any:
    return gate.call_and_wait(lambda: gate.server.counters)


def test_transactions_through_a_throttling_quota_read_back_exactly(
    any_kafka: KafkaRun, start_gate: GateStarter
) -> None:
    # Before pidgate learns its frontier, so the quota is enforced from the start (pidgate's
    # own retry of COORDINATOR_LOAD_IN_PROGRESS is issue 21 item 2; this test is about
    # transactions).
    first_producer_id(any_kafka.first_bootstrap)
    gate = start_gate(any_kafka, quota=QUOTA)
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create_topic(any_kafka.bootstrap, topic)
    # The first initTransactions after a broker start takes seconds: before the clock matters.
    transactors = [
        rdkafka_transactor("rdkafka-a", gate.bootstrap, topic),
        rdkafka_transactor("rdkafka-b", gate.bootstrap, topic),
        kafka_python_transactor("kafkapython", gate.bootstrap, topic),
        JavaTransactor(any_kafka, gate.bootstrap, topic),
    ]
    start = threading.Barrier(len(transactors))
    threads = [threading.Thread(target=t.run, args=(start,), daemon=True) for t in transactors]
    began = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
    finally:
        for transactor in transactors:
            if isinstance(transactor, JavaTransactor):
                transactor.kill()
    elapsed = time.monotonic() - began
    assert not any(thread.is_alive() for thread in threads), "a transaction hung"
    assert [t.error for t in transactors] == [None] * len(transactors)

    counters = counters_of(gate)
    # The quota bit: four new PIDs against two tokens, two held back and admitted later.
    assert counters.produce_requests_rejected > 0
    assert counters.new_producer_ids_admitted == len(transactors)

    committed = [value for t in transactors for value in t.committed]
    discarded = [value for t in transactors for value in t.aborted]
    assert len(committed) == len(transactors) * 4 * RECORDS_PER_TRANSACTION
    values = read_committed_values(any_kafka.bootstrap, topic, expected=len(committed))
    assert Counter(values) == Counter(committed)  # each committed record once, nothing else
    assert not set(values) & set(discarded)
    # The aborted records did reach the log: read_committed filtered them out.
    headers = fetch_batch_headers(any_kafka.first_bootstrap, topic, [0])
    data_records = sum(h.records_count for h in headers if not h.attributes & 0x20)
    assert data_records == len(committed) + len(discarded)
    print(  # The figures the README quotes (pytest -s shows them).
        f"transactions on Kafka {any_kafka.version}: {len(committed)} committed, "
        f"{len(discarded)} aborted, {counters.produce_requests_rejected} Produce rejected "
        f"({dict(counters.rejections_by_client_software)}), {elapsed:.1f} s"
    )
