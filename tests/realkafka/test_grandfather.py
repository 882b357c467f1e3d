"""Grandfathering on real Apache Kafka 3.1 and 4.1 (issue 21): producers that existed before a
principal's enforcement began are never throttled; a storm of new producers right after it is
held to the quota.

- **Cold start on a fresh broker** (a broker of the test's own): pidgate starts with a quota the
  moment the broker listens. Kafka 4 answers the first InitProducerId after a start with
  14 COORDINATOR_LOAD_IN_PROGRESS while it fetches a PID block from the controller; pidgate's
  frontier probe retries it and reaches ``frontier`` mode, where it used to fall back to
  learning mode and admit a storm free. On a fresh 3.1 (ZooKeeper) broker the probe is the lone
  first InitProducerId that broker needs before concurrent ones (../shared/kafka/README.md).
  Then pidgate restarts without a state file on the same ports: the producers that ran through
  the first one are grandfathered, never rejected; a new storm is held to the quota again.
- **Quota activation** (the session brokers): producers running while the principal is
  unlimited keep producing without one rejection after AlterClientQuotas sets a quota live;
  new PIDs after it are throttled.

Real parts: Apache Kafka from the distribution folders, pidgate in-process (its counters and
/state read on its loop), librdkafka idempotent producers (confluent-kafka, acks=all).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control.pid_frontier import FrontierResult, probe_frontier
from tests.integration.helpers import admin_address, create_topic, http_get, unique_name, wait_until
from tests.integration.metrics_text import metric, parse_samples
from tests.integration.test_grandfather import SteadyProducers, storm
from tests.integration.test_operate import alter_quotas, rate_op
from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import KafkaRun, free_port

HOUR_S = 3600
RATE = 2  # new PIDs per window
STORM = 8  # new idempotent producers at once
USER = "ANONYMOUS"  # PLAINTEXT listeners: every client is ANONYMOUS


def quota(rate: int | None) -> dict[str, Any]:
    users = {"<default>": {"producer_ids_rate": rate}} if rate is not None else {}
    return {
        "producer.id.quota.window.size.seconds": HOUR_S,
        "users": users,
        # The default (5 s) holds on a quiet machine; here ~7 engineers share 2 cores and
        # kafka-python's bootstrap alone took 2.8 s against a fresh 3.1 broker at load 11.
        # Only a failing probe waits this long.
        "grandfather_probe_timeout_ms": 20_000,
    }


def samples(gate: BackgroundProxy) -> Any:
    status, text = http_get(admin_address(gate), "/metrics")
    assert status == 200
    return parse_samples(text)


def principal_state(gate: BackgroundProxy) -> tuple[dict[str, Any], dict[str, Any]]:
    """(this user's /state entry, the latest frontier probe), read on pidgate's loop."""
    state = gate.call_and_wait(gate.server.state)
    (principal,) = [p for p in state["principals"] if p["principal"] == f"User:{USER}"]
    probe: dict[str, Any] = state["grandfather"]["last_probe"]
    return principal, probe


def last_probe(gate: BackgroundProxy) -> FrontierResult | None:
    return gate.call_and_wait(lambda: gate.server.last_frontier)


def grandfathered(gate: BackgroundProxy) -> float:
    return metric(samples(gate), "pidgate_producer_ids_grandfathered_total", user=USER)


def decisions(gate: BackgroundProxy) -> tuple[int, int]:
    """(new PIDs admitted, distinct PIDs rejected), read on pidgate's loop."""
    counters = gate.server.counters
    return gate.call_and_wait(
        lambda: (counters.new_producer_ids_admitted, len(counters.rejected_producer_ids))
    )


def keeps_delivering(steady: SteadyProducers, count: int, timeout_s: float) -> None:
    since = time.monotonic()
    wait_until(lambda: steady.each_delivered_since(since, count), timeout_s, "steady delivering")


def assert_storm_held(outcome: dict[str, Any], tokens: int) -> None:
    """At most ``tokens`` of the storm delivered, every other one refused by the quota."""
    delivered = [name for name, error in outcome.items() if error is None]
    assert len(outcome) == STORM, outcome
    assert len(delivered) <= tokens, outcome


# -- cold start on a fresh broker, then a restart without state ------------------------------


@pytest.mark.parametrize("home_fixture", ["kafka3_home", "kafka4_home"])
def test_cold_start_on_a_fresh_broker_learns_the_frontier_and_a_restart_grandfathers(
    home_fixture: str,
    request: pytest.FixtureRequest,
    start_kafka: Callable[..., KafkaRun],
    start_gate: GateStarter,
) -> None:
    home: Path = request.getfixturevalue(home_fixture)
    kafka = start_kafka(home)
    # Same listeners for both pidgates: the producers reconnect to the second one.
    ports = {"listen": f"127.0.0.1:{free_port()}", "broker_ports": {1: free_port()}}
    # pidgate starts the moment the broker listens: its probe is the broker's first
    # InitProducerId (on 4.1 answered 14 COORDINATOR_LOAD_IN_PROGRESS until the PID block is in).
    first = start_gate(kafka, quota=quota(RATE), proxy=ports)
    cold_probe = last_probe(first)
    assert cold_probe is not None and cold_probe.frontier is not None, cold_probe
    print(f"cold start on {kafka.version}: {cold_probe}")
    if kafka.major >= 4:  # KRaft fetches PID blocks asynchronously: the probe met it, retried
        assert cold_probe.retries >= 1, cold_probe
        assert "14 COORDINATOR_LOAD_IN_PROGRESS" in cold_probe.reason, cold_probe
    topic = unique_name("gf-cold")
    create_topic(kafka.bootstrap, topic)

    with SteadyProducers(first.bootstrap, topic, count=1, max_s=90) as steady:
        # The steady producer is new here: it takes one of the RATE tokens.
        steady.wait_all_delivering(timeout_s=30)
        first_storm = storm(first.bootstrap, topic, STORM)
        principal, probe = principal_state(first)
        assert principal["grandfather_mode"] == "frontier", principal
        assert probe["frontier"] is not None and set(probe["brokers"]) == {"1"}, probe
        assert grandfathered(first) == 0  # every PID here was allocated after the probe
        first_new, first_rejected = decisions(first)

        # pidgate restarts without a state file, the same listeners, the same quota: the
        # steady producer existed before this pidgate started.
        first.stop()
        second = start_gate(kafka, quota=quota(RATE), proxy=ports)
        keeps_delivering(steady, 5, timeout_s=30)  # reconnected
        second_storm = storm(second.bootstrap, topic, STORM)
        keeps_delivering(steady, 3, timeout_s=15)
        steady.stop()
    principal, probe = principal_state(second)
    second_new, second_rejected = decisions(second)
    assert steady.all_errors() == []  # never rejected, not by either pidgate
    assert principal["grandfather_mode"] == "frontier", principal
    assert probe["frontier"] is not None, probe
    assert grandfathered(second) == 1  # the steady producer, and no storm PID
    assert first_new <= RATE and second_new <= RATE
    assert_storm_held(first_storm, RATE - 1)  # one token went to the steady producer
    assert_storm_held(second_storm, RATE)
    assert sum(e is None for e in second_storm.values()) >= 1  # the tokens were there for it
    assert first_rejected >= STORM - (RATE - 1)
    assert second_rejected >= STORM - RATE


# -- quota activation on the shared brokers --------------------------------------------------


def test_quota_activation_never_throttles_running_producers_and_holds_a_new_storm(
    any_kafka: KafkaRun, start_gate: GateStarter
) -> None:
    steady_count = 3
    # A session broker may be fresh: a fresh 3.1 broker needs one InitProducerId on its own
    # before concurrent ones (../shared/kafka/README.md); the probe sends two, one at a time.
    warm_up = probe_frontier(any_kafka.bootstrap.split(","), timeout_ms=60_000)
    assert warm_up.frontier is not None, warm_up
    gate = start_gate(any_kafka, quota=quota(None))  # nobody limited: no probe yet
    topic = unique_name("gf-activate")
    create_topic(any_kafka.bootstrap, topic)
    with SteadyProducers(gate.bootstrap, topic, steady_count, max_s=90) as steady:
        steady.wait_all_delivering(timeout_s=30)
        # Set live, through pidgate (AlterClientQuotas for the default user): a quota smaller
        # than the producers already running.
        assert alter_quotas(gate.bootstrap, [(None, [rate_op(RATE)])]) == [
            (0, None, [("user", None)])
        ]
        activated = time.monotonic()
        # The quota applies at once; the frontier probe runs right after it. Until it answers
        # the principal is `pending` and admits unknown PIDs (docs/grandfathering.md, "Probe
        # timing"): here that round trip took up to 1.2 s at load 24 on 2 cores (against tansu
        # on a quiet machine, 20-35 ms), and 3 storm PIDs passed in it. The storm starts
        # when the frontier is known: from then on no new PID passes free.
        wait_until(lambda: last_probe(gate) is not None, 30, "the frontier probe answering")
        outcome = storm(gate.bootstrap, topic, STORM)
        keeps_delivering(steady, 3, timeout_s=15)
        steady.stop()
    principal, probe = principal_state(gate)
    new, rejected = decisions(gate)
    assert steady.all_errors() == []
    assert steady.each_delivered_since(activated, 3)
    assert grandfathered(gate) == steady_count
    assert principal["grandfather_mode"] == "frontier", principal
    assert probe["frontier"] is not None, probe
    assert new <= RATE
    assert_storm_held(outcome, RATE)
    assert sum(e is None for e in outcome.values()) >= 1
    assert rejected >= STORM - RATE
