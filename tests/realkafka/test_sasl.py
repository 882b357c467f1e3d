"""SASL principals on real Apache Kafka (3.1 ZooKeeper, 4.1 KRaft): pidgate in front of the
broker's SASL_PLAINTEXT listener charges each new producer ID to the user the *broker*
authenticated (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; DESIGN.md "Identity"), per user.

Users ``alice`` and ``bob`` (password ``<user>-secret``) may start 1 and 2 new PIDs per hour.
What an operator relies on, shown with librdkafka and kafka-python:

- alice's first producer delivers; her second (another mechanism, same user) is throttled;
- bob is not: alice's exhausted quota is hers alone, and bob's producer delivers at once;
- a wrong password is refused by the broker, and charges nobody: bob, after a refused attempt
  under his name, still has his token;
- pidgate's /state and /metrics name User:alice and User:bob with what each was charged.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.realkafka import clients
from tests.realkafka.clients import ProduceResult
from tests.realkafka.gate_watch import gate_state, observed_gate, quota_for, user_metric
from tests.realkafka.kafka import SASL_USERS, KafkaRun

pytestmark = pytest.mark.realkafka

HOUR_S = 3600
RECORDS = 20
#: A producer that would wait an hour gives its records up after this (librdkafka's
#: message.timeout.ms): the quota doing its job.
SHORT_TIMEOUT = {"message.timeout.ms": 4000}
#: A producer whose login the broker refuses gives its records up after this.
REFUSED_TIMEOUT = {"message.timeout.ms": 3000}


def confluent_sasl(mechanism: str, user: str, password: str, **extra: Any) -> dict[str, Any]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "acks": "all",
        **extra,
    }


def kafka_python_sasl(mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def test_new_pids_are_charged_to_the_sasl_user_the_broker_accepted(any_kafka: KafkaRun) -> None:
    clients.warm_up(any_kafka)
    topic = clients.unique_topic("sasl")
    clients.create_topic(any_kafka.bootstrap, topic)
    quota = quota_for({"alice": 1, "bob": 2}, HOUR_S)
    results: list[ProduceResult] = []

    def delivers(result: ProduceResult) -> None:
        results.append(result)
        assert result.errors == [] and result.delivered_count == RECORDS, result.summary()

    with observed_gate(any_kafka, sasl=True, quota=quota) as (gate, log):
        # alice over PLAIN (kafka-python): a new PID, her one token.
        delivers(
            clients.produce_kafka_python(
                gate.bootstrap,
                topic,
                clients.keyed_records("alice-plain", RECORDS),
                config=kafka_python_sasl("PLAIN", "alice", SASL_USERS["alice"]),
                timeout_s=60,
            )
        )

        # At once (each of these waits for something that never comes, so in parallel):
        # alice again over SCRAM-SHA-256 (librdkafka), the same user with no token left; and a
        # wrong password for bob over each mechanism, which the broker refuses.
        with ThreadPoolExecutor(4) as pool:
            alice_again = pool.submit(
                clients.produce_confluent,
                gate.bootstrap,
                topic,
                clients.keyed_records("alice-scram256", RECORDS),
                config=confluent_sasl(
                    "SCRAM-SHA-256", "alice", SASL_USERS["alice"], **SHORT_TIMEOUT
                ),
                timeout_s=15,
            )
            refused = [
                pool.submit(
                    clients.produce_confluent,
                    gate.bootstrap,
                    topic,
                    clients.keyed_records(f"bob-wrong-{mechanism}", 2),
                    config=confluent_sasl(
                        mechanism, "bob", "not-bobs-password", log_level=0, **REFUSED_TIMEOUT
                    ),
                    timeout_s=10,
                )
                for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
            ]
        throttled = alice_again.result()
        assert throttled.delivered_count == 0, throttled.summary()
        assert user_metric(gate, "pidgate_producer_ids_throttled_total", "alice") >= 1
        for attempt in refused:
            result = attempt.result()
            assert result.delivered_count == 0, result.summary()
            assert any("authentication" in error.lower() for error in result.errors), result.errors

        # bob over SCRAM-SHA-512 (librdkafka) and SCRAM-SHA-256 (kafka-python): alice's
        # exhausted quota does not touch him, and the refused attempts did not spend his tokens.
        delivers(
            clients.produce_confluent(
                gate.bootstrap,
                topic,
                clients.keyed_records("bob-scram512", RECORDS),
                config=confluent_sasl("SCRAM-SHA-512", "bob", SASL_USERS["bob"]),
                timeout_s=60,
            )
        )
        delivers(
            clients.produce_kafka_python(
                gate.bootstrap,
                topic,
                clients.keyed_records("bob-scram256", RECORDS),
                config=kafka_python_sasl("SCRAM-SHA-256", "bob", SASL_USERS["bob"]),
                timeout_s=60,
            )
        )

        state = {p["principal"]: p for p in gate_state(gate)["principals"]}
        charged = {
            user: (
                user_metric(gate, "pidgate_producer_ids_new_total", user),
                user_metric(gate, "pidgate_producer_ids_throttled_total", user),
            )
            for user in ("alice", "bob")
        }
        decided = Counter((d.principal, d.admitted) for d in log.decided)

    print(f"\n{any_kafka.version}: charged {charged}; decisions {dict(decided)}")
    # Each user was charged their own PIDs: alice 1 admitted + 1 throttled, bob 2 admitted and
    # never throttled; no decision was made for anyone else (the refused logins charged no one).
    assert charged == {"alice": (1.0, 1.0), "bob": (2.0, 0.0)}
    assert {principal for principal, _ in decided} == {"User:alice", "User:bob"}
    assert decided[("User:bob", False)] == 0
    assert set(state) == {"User:alice", "User:bob"}
    assert state["User:alice"]["tokens"] < 1 and state["User:bob"]["tokens"] < 1
    assert state["User:alice"]["producer_ids_rate"] == 1
    assert state["User:bob"]["producer_ids_rate"] == 2

    # What the broker stored: exactly the delivered producers' records (read over PLAINTEXT).
    stored = Counter(clients.read_back(any_kafka.bootstrap, topic))
    delivered = Counter(record for result in results for record in result.delivered)
    assert stored == delivered
