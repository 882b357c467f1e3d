"""Throttled, and still every record exactly once: each real client through pidgate on real
Apache Kafka (3.1 ZooKeeper, 4.1 KRaft), with a quota that makes it wait.

The quota is 1 new producer ID per ``WINDOW_S`` for ``User:ANONYMOUS`` (KIP-936's
``producer_ids_rate`` over ``producer.id.quota.window.size.seconds``). A one-record librdkafka
"primer" producer spends the token just before the client under test sends its first record,
so that client's new PID must wait about ``WINDOW_S`` for the bucket to refill. Each test
shows, as a user would see it:

- every record the client sent is acknowledged (where the client reports acknowledgements)
  and stored exactly once: the topic read back from the broker holds exactly the multiset of
  (key, value) sent, primer included;
- the throttling really happened: pidgate counts the client's PID as throttled, and no record
  was acknowledged before the token could have come back.

Nothing here depends on how the wait is served (rejections with a capped throttle today, or
requests held until the token comes, issue 22): only the outcome and the wait are asserted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest

from pidgate.proxy.background import BackgroundProxy
from tests.realkafka import clients
from tests.realkafka.clients import ProduceResult, Record
from tests.realkafka.gate_watch import observed_gate, open_connections, quota_for
from tests.realkafka.gate_watch import user_metric as metric
from tests.realkafka.kafka import KafkaRun

pytestmark = pytest.mark.realkafka

#: The token comes back this long after the primer took it: a wait of ~5 s, inside what a
#: client with 3 retries survives at the 3 s rejection cap, and short for the tier's budget.
WINDOW_S = 5
RECORDS = 200
#: Clock granularity between pidgate's quota clock (ms) and the clients' timestamps.
CLOCK_SLACK_S = 0.25

Runner = Callable[..., ProduceResult]
#: (bootstrap, topic, records, on_ready) -> the client's result.
Run = Callable[[str, str, list[Record], Callable[[], None]], ProduceResult]


@dataclass
class Throttled:
    primed: ProduceResult
    result: ProduceResult
    #: The topic read back from the broker.
    stored: list[Record]


def primer(gate: BackgroundProxy, topic: str) -> ProduceResult:
    """One idempotent librdkafka record: a new PID that spends ANONYMOUS's only token."""
    result = clients.produce_confluent(
        gate.bootstrap, topic, clients.keyed_records("primer", 1), config={"acks": "all"}
    )
    assert result.delivered_count == 1, result.summary()
    return result


def throttled_run(kafka: KafkaRun, run: Run, *, wait_for_connection: bool = False) -> Throttled:
    """pidgate at 1 new PID per WINDOW_S in front of ``kafka``; the primer spends the token in
    the client's ``on_ready``; then the client sends RECORDS records."""
    clients.warm_up(kafka)
    topic = clients.unique_topic("throttled")
    clients.create_topic(kafka.bootstrap, topic)
    records = clients.keyed_records("client", RECORDS)
    primed: list[ProduceResult] = []
    with observed_gate(kafka, quota=quota_for({"ANONYMOUS": 1}, WINDOW_S)) as (gate, log):

        def spend_the_token() -> None:
            if wait_for_connection:  # the tool cannot say it runs: wait until it connects
                deadline = time.monotonic() + 60
                while open_connections(gate) == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
            primed.append(primer(gate, topic))

        result = run(gate.bootstrap, topic, records, spend_the_token)
        assert len(primed) == 1, f"the client never became ready: {result.summary()}"
        throttled_ids = metric(gate, "pidgate_producer_ids_throttled_total", "ANONYMOUS")
        new_ids = metric(gate, "pidgate_producer_ids_new_total", "ANONYMOUS")
        stored = clients.read_back(kafka.bootstrap, topic)
        print(
            f"\n{result.summary()}; pidgate: {new_ids:.0f} new PIDs, {throttled_ids:.0f} "
            f"throttled, {len(log.rejections())} rejections, codes "
            f"{sorted(Counter(r.error_code for r in log.rejections()).items())}, "
            f"software {sorted({str(r.client_software_name) for r in log.rejections()})}"
        )
        # The client's PID waited for the token: pidgate names it throttled (distinct PIDs, not
        # retries), and admitted it in the end (the primer's + the client's).
        assert throttled_ids >= 1, "the client was never throttled: the test proves nothing"
        assert new_ids == 2
    return Throttled(primed[0], result, stored)


def assert_exactly_once(run: Throttled) -> None:
    """The broker holds exactly the records sent, each once: nothing lost, nothing doubled."""
    result, stored = run.result, run.stored
    sent = clients.keyed_records("primer", 1) + clients.keyed_records("client", RECORDS)
    missing = Counter(sent) - Counter(stored)
    extra = Counter(stored) - Counter(sent)
    assert not missing and not extra, (
        f"lost {sum(missing.values())} (e.g. {list(missing)[:3]}), "
        f"duplicated/unexpected {sum(extra.values())} (e.g. {list(extra)[:3]}); {result.summary()}"
    )


def assert_waited_for_the_token(primed: ProduceResult, at: float | None) -> None:
    """The token the primer spent comes back WINDOW_S after it was taken, which is after the
    primer started: nothing of the client's can be acknowledged before that."""
    assert at is not None
    assert at - primed.started_at >= WINDOW_S - CLOCK_SLACK_S, at - primed.started_at


# -- Python clients ------------------------------------------------------------------------------


PYTHON_CLIENTS: dict[str, Runner] = {
    "librdkafka": clients.produce_confluent,
    "kafka-python": clients.produce_kafka_python,
    "aiokafka": clients.produce_aiokafka,
}


@pytest.mark.parametrize("client", list(PYTHON_CLIENTS))
def test_python_client_throttled_delivers_every_record_once(
    any_kafka: KafkaRun, client: str
) -> None:
    runner = PYTHON_CLIENTS[client]

    def run(
        bootstrap: str, topic: str, records: list[Record], ready: Callable[[], None]
    ) -> ProduceResult:
        # Default settings, idempotent (acks=all where the library needs it said).
        config = {"acks": "all"} if client == "librdkafka" else None
        return runner(bootstrap, topic, records, config=config, timeout_s=90, on_ready=ready)

    done = throttled_run(any_kafka, run)

    assert done.result.errors == [], done.result.summary()
    assert done.result.delivered_count == RECORDS, done.result.summary()
    assert_waited_for_the_token(done.primed, done.result.first_ack_at)
    assert_exactly_once(done)


# -- Java ----------------------------------------------------------------------------------------


def test_java_producer_throttled_acknowledges_every_record_once(any_kafka: KafkaRun) -> None:
    """The distribution's own Java producer, default settings but idempotence (on by default
    since 3.0 anyway): every record's callback reports success."""
    done = throttled_run(any_kafka, partial(_java, any_kafka))

    assert done.result.errors == [], done.result.summary()
    # One ACK per record sent, none twice.
    acked = sorted(done.result.delivered, key=lambda r: r.value)
    assert acked == clients.keyed_records("client", RECORDS), done.result.summary()
    assert_waited_for_the_token(done.primed, done.result.first_ack_at)
    assert_exactly_once(done)


def _java(
    kafka: KafkaRun, bootstrap: str, topic: str, records: list[Record], ready: Callable[[], None]
) -> ProduceResult:
    return clients.produce_java(kafka, bootstrap, topic, records, timeout_s=120, on_ready=ready)


def test_console_producer_throttled_delivers_every_record_once(any_kafka: KafkaRun) -> None:
    """``kafka-console-producer`` as an operator runs it, idempotent with acks=all; 3.1's tool
    keeps its ``retries=3``, a retry budget that a ~5 s wait fits."""
    done = throttled_run(any_kafka, partial(_console, any_kafka), wait_for_connection=True)

    assert done.result.errors == [], done.result.summary()
    # The tool closes its producer (every send completed) before it exits.
    assert_waited_for_the_token(done.primed, done.result.finished_at)
    assert_exactly_once(done)


def _console(
    kafka: KafkaRun, bootstrap: str, topic: str, records: list[Record], ready: Callable[[], None]
) -> ProduceResult:
    return clients.produce_console(kafka, bootstrap, topic, records, timeout_s=120, on_ready=ready)
