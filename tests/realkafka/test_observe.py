"""Observe mode on real Apache Kafka 3.1 (issue #26): a storm of new librdkafka producers all
delivers through an observing pidgate, which records what enforcement would have rejected;
``pidgate quotas set --default --enforce`` then holds the next new PID beyond the tokens the
observed storm spent, and Kafka's own ``kafka-configs --describe`` lists the mode key.

Real parts: Apache Kafka 3.1.0 (ZooKeeper mode) from the distribution folder, pidgate in-process,
confluent-kafka producers (acks=all, idempotent), Kafka's kafka-configs.sh.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pidgate.cli import main
from tests.integration.helpers import (
    KafkaSocket,
    admin_address,
    create_topic,
    http_get,
    init_producer_id,
    produce_frame,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import metric, parse_samples
from tests.integration.test_grandfather import storm
from tests.integration.test_holding import hold_stats
from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import KafkaRun

RATE = 2
STORM = 8


def test_an_observed_storm_on_kafka_31_delivers_then_enforcement_starts_warm(
    kafka3: KafkaRun, start_gate: GateStarter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = start_gate(
        kafka3,
        quota={
            "producer.id.quota.window.size.seconds": 3600,
            "mode": "observe",
            "users": {"<default>": {"producer_ids_rate": RATE}},
            "grandfather_probe_timeout_ms": 20_000,
        },
        event_log={"directory": str(tmp_path)},
    )
    topic = unique_name("observe31")
    create_topic(gate.bootstrap, topic)
    outcome = storm(gate.bootstrap, topic, STORM)
    assert len(outcome) == STORM and all(error is None for error in outcome.values()), outcome

    admin = admin_address(gate)
    samples = parse_samples(http_get(admin, "/metrics")[1])
    anonymous = {"user": "ANONYMOUS", "principal": "User:ANONYMOUS"}
    assert metric(samples, "pidgate_producer_ids_new_total", **anonymous) == RATE
    assert metric(samples, "pidgate_producer_ids_would_reject_total", **anonymous) >= STORM - RATE
    assert metric(samples, "pidgate_produce_requests_rejected_total", **anonymous) == 0
    wait_until(lambda: any(tmp_path.glob("pidgate-events-*.jsonl")), 5, "event log written")
    wait_until(
        lambda: "would_reject" in "".join(p.read_text() for p in tmp_path.glob("*.jsonl")),
        5,
        "would_reject events flushed",
    )

    assert (
        main(["quotas", "set", "--bootstrap-server", gate.bootstrap, "--default", "--enforce"]) == 0
    )
    assert main(["quotas", "describe", "--bootstrap-server", gate.bootstrap]) == 0
    assert capsys.readouterr().out.endswith(
        "Quota configs for the default user-principal are producer_ids_rate=2, "
        "producer_ids_observe=0\n"
    )
    state = json.loads(http_get(admin, "/state")[1])
    assert state["quotas"]["mode"] == "enforce"
    late, _ = init_producer_id(gate.bootstrap)
    with KafkaSocket(gate.bootstrap, timeout_s=15) as conn:
        conn.sendall(produce_frame(topic, late, 1))
        wait_until(lambda: hold_stats(gate)["held"] == 1, 10, "the next new PID held")
    described = kafka3.run_tool(
        "kafka-configs",
        "--bootstrap-server",
        gate.bootstrap,
        "--describe",
        "--entity-type",
        "users",
    )
    assert "producer_ids_rate=2.0, producer_ids_observe=0.0" in described.stdout
