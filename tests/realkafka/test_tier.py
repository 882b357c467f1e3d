"""The tier's own promise: each distribution starts and serves clients through pidgate."""

from __future__ import annotations

from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import KafkaRun


def test_each_broker_serves_its_version_through_pidgate(
    any_kafka: KafkaRun, start_gate: GateStarter
) -> None:
    gate = start_gate(any_kafka)
    result = any_kafka.run_tool("kafka-broker-api-versions", "--bootstrap-server", gate.bootstrap)
    assert result.returncode == 0, result.stderr[-2000:]
    # The tool prints one line per broker, named by the listener pidgate advertises for it.
    listener = gate.server.settings.proxy.broker_ports[1]
    assert f"127.0.0.1:{listener} (id: 1" in result.stdout
    assert "Produce(0)" in result.stdout
