"""Failover on a real 3-broker Kafka 3.x cluster (RF 3, min.insync.replicas 2): the leader of
the steady producers' partition is SIGKILLed while they produce through pidgate, first one
gateway in front of the cluster, then a fleet of sidecars (one per broker, sharing known PIDs
and tokens through a topic on the cluster).

The promise (issue 21, DESIGN.md "Fleets"): a leader move costs a steady producer nothing at
the gate. It is not rejected (the quota is spent, so a new PID would be), its producer id and
epoch stay the same (no InitProducerId again, no epoch bump), every record it sent is in the
log once, and it delivers again after the failover and after the broker's restart.

One cluster serves both scenarios (a start costs ~20 s); the killed broker is restarted and
back in every ISR before the next scenario.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pidgate.proxy.background import BackgroundProxy
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    KafkaSocket,
    decode_produce,
    produce_frame,
    produce_partition_errors,
)
from tests.realkafka.cluster_tools import (
    KafkaPythonSteady,
    RdkafkaSteady,
    SteadyProducer,
    batch_producers,
    create_topic,
    first_producer_id,
    leader_of,
    read_committed_values,
    sidecar_fleet,
    wait_for_full_isr,
    wait_until,
    warm_up_pid_blocks,
)
from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import KafkaRun, start_cluster

#: Two steady producers spend the whole quota: any third PID is rejected, so a steady producer
#: that came back with a new PID after the failover would be rejected too.
QUOTA = {
    "producer.id.quota.window.size.seconds": 3600,
    "users": {"ANONYMOUS": {"producer_ids_rate": 2}},
}
ACKS_BEFORE = 20  # records each producer has acknowledged before the kill
ACKS_AFTER = 20  # ... after the kill, and again after the restart


@pytest.fixture(scope="module")
def cluster(kafka3_home: Path) -> Iterator[KafkaRun]:
    """A 3-broker cluster of this module's own (its brokers get killed), stopped at the end."""
    run = start_cluster(kafka3_home)
    try:
        warm_up_pid_blocks(run)
        yield run
    finally:
        # Its data is thrown away: SIGKILL spares each broker's clean shutdown (~10 s each).
        for node in run.broker_ports:
            run.kill_broker(node)
        run.stop()


@dataclass
class Failover:
    killed: int
    new_leader: int
    producers: list[SteadyProducer]
    #: seconds from the SIGKILL until the cluster's metadata named a new leader
    election_s: float
    #: per producer, the longest time without an acknowledgement after the SIGKILL
    stall_s: dict[str, float]
    restart_s: float


def produce_through_a_failover(
    kafka: KafkaRun,
    bootstrap: str,
    topic: str,
    settled: Callable[[], bool] = lambda: True,
) -> Failover:
    """Two steady producers (librdkafka, kafka-python) on ``topic`` through ``bootstrap``; the
    partition leader SIGKILLed once both deliver (and ``settled`` holds), restarted once both
    deliver again."""
    producers: list[SteadyProducer] = [
        RdkafkaSteady("rdkafka", topic, bootstrap),
        KafkaPythonSteady("kafkapython", topic, bootstrap),
    ]
    try:
        for producer in producers:
            producer.start()
        wait_until(
            lambda: all(len(p.acked) >= ACKS_BEFORE for p in producers),
            90,
            "both steady producers to deliver before the kill",
        )
        wait_until(settled, 60, "the proxies to settle before the kill")
        killed = leader_of(kafka.bootstrap, topic)
        kill_moment = time.monotonic()
        kafka.kill_broker(killed)
        wait_until(
            lambda: leader_of(kafka.bootstrap, topic) not in (killed, -1),
            60,
            f"a new leader after broker {killed} was SIGKILLed",
        )
        moved = time.monotonic()
        new_leader = leader_of(kafka.bootstrap, topic)
        wait_until(
            lambda: all(p.acks_after(moved) >= ACKS_AFTER for p in producers),
            120,
            f"both steady producers to deliver to the new leader {new_leader}",
        )
        started = time.monotonic()
        kafka.restart_broker(killed)
        restart_s = time.monotonic() - started
        restarted = time.monotonic()
        wait_until(
            lambda: all(p.acks_after(restarted) >= ACKS_AFTER for p in producers),
            90,
            f"both steady producers to deliver after broker {killed} restarted",
        )
    finally:
        for producer in producers:
            producer.stop(flush_timeout_s=60)
            producer.close()
    stall_s = {p.name: p.longest_stall_after(kill_moment) for p in producers}
    return Failover(killed, new_leader, producers, moved - kill_moment, stall_s, restart_s)


def assert_nothing_lost_duplicated_or_renewed(
    kafka: KafkaRun, topic: str, failover: Failover
) -> None:
    for producer in failover.producers:
        assert producer.errors == [], f"{producer.name}: {producer.errors[:5]}"
        assert Counter(producer.acked) == Counter(producer.sent), producer.name
    assert failover.new_leader != failover.killed
    sent = [value for p in failover.producers for value in p.sent]
    # Read back from the cluster itself: each record once, nothing else.
    values = read_committed_values(kafka.bootstrap, topic, expected=len(sent))
    assert Counter(values) == Counter(sent)
    # The batch headers: one producer id per producer, each with one epoch for all its records
    # (an InitProducerId again or an epoch bump would show as a second key).
    by_producer = batch_producers(kafka, topic)
    assert sorted(by_producer.values()) == sorted(len(p.sent) for p in failover.producers), (
        by_producer
    )
    assert len({producer_id for producer_id, _ in by_producer}) == 2


def assert_quota_is_spent(gate: BackgroundProxy, topic: str) -> None:
    """A third PID is rejected: the steady producers' passing was not for want of a quota."""
    producer_id = first_producer_id(gate.bootstrap)
    with KafkaSocket(gate.bootstrap, timeout_s=15) as conn:
        conn.sendall(produce_frame(topic, producer_id, 1))
        codes = produce_partition_errors(decode_produce(conn.recv_frame(), 8))
    assert codes == [REJECTED_DEFAULT]


def report(scenario: str, failover: Failover) -> None:
    # The figures the README quotes (pytest -s shows them).
    print(
        f"{scenario}: killed broker {failover.killed} -> leader {failover.new_leader} "
        f"in {failover.election_s:.1f} s; "
        + ", ".join(
            f"{p.name} sent {len(p.sent)} acked {len(p.acked)} "
            f"longest stall after the kill {failover.stall_s[p.name]:.1f} s"
            for p in failover.producers
        )
        + f"; broker restart {failover.restart_s:.1f} s"
    )


def test_gateway_failover_costs_a_steady_producer_nothing(
    cluster: KafkaRun, start_gate: GateStarter
) -> None:
    wait_for_full_isr(cluster)  # a broker killed by an earlier test is back in every ISR
    gate = start_gate(cluster, quota=QUOTA)
    topic = f"failover-gw-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.bootstrap, topic)
    failover = produce_through_a_failover(cluster, gate.bootstrap, topic)
    counters = gate.call_and_wait(lambda: gate.server.counters)
    assert counters.produce_requests_rejected == 0, counters.rejections_by_client_software
    assert counters.rejected_producer_ids == set()
    assert counters.new_producer_ids_admitted == 2  # one PID per producer, never a second
    assert_nothing_lost_duplicated_or_renewed(cluster, topic, failover)
    assert_quota_is_spent(gate, topic)
    report("gateway", failover)


def fleet_caught_up(sidecars: dict[int, BackgroundProxy]) -> bool:
    """Every sidecar has applied every fleet record the others sent: the PIDs admitted before
    the kill are known to whichever sidecar fronts the new leader (the fleet's announcements
    travel asynchronously; a kill right after the first deliveries could otherwise beat
    them, and the new leader's sidecar would charge a PID the fleet had already paid for)."""

    def counts(sidecar: BackgroundProxy) -> tuple[int, int]:
        fleet = sidecar.server.fleet
        assert fleet is not None
        return fleet.records_sent, fleet.records_applied

    seen = {node: s.call_and_wait(lambda s=s: counts(s)) for node, s in sidecars.items()}
    return all(
        applied >= sum(sent for other, (sent, _) in seen.items() if other != node)
        for node, (_, applied) in seen.items()
    )


def test_sidecar_fleet_failover_costs_a_steady_producer_nothing(cluster: KafkaRun) -> None:
    wait_for_full_isr(cluster)  # a broker killed by an earlier test is back in every ISR
    sidecars = sidecar_fleet(cluster, f"failover-{uuid.uuid4().hex[:8]}", QUOTA)
    try:
        topic = f"failover-sc-{uuid.uuid4().hex[:8]}"
        create_topic(cluster.bootstrap, topic)
        bootstrap = ",".join(s.bootstrap for s in sidecars.values())
        failover = produce_through_a_failover(
            cluster, bootstrap, topic, settled=lambda: fleet_caught_up(sidecars)
        )
        counters = {
            node: s.call_and_wait(lambda s=s: s.server.counters) for node, s in sidecars.items()
        }
        assert all(c.produce_requests_rejected == 0 for c in counters.values()), {
            node: c.rejections_by_client_software for node, c in counters.items()
        }
        # The sidecar of the killed leader admitted both PIDs; the new leader's sidecar knew
        # them from the fleet topic and charged nothing.
        assert counters[failover.killed].new_producer_ids_admitted == 2
        assert sum(c.new_producer_ids_admitted for c in counters.values()) == 2
        assert_nothing_lost_duplicated_or_renewed(cluster, topic, failover)
        assert_quota_is_spent(sidecars[failover.new_leader], topic)
        report("sidecar fleet", failover)
    finally:
        for sidecar in sidecars.values():
            sidecar.stop()
