"""The PID event log from a real throttling run: real tansu, pidgate in front, real
confluent-kafka producers. Every PID admitted as new, every rejection and every
InitProducerId answer is a line with the fields DESIGN.md lists.

Run as a script (``python -m tests.integration.test_event_log``) it records the run into
tests/pipeline/data/recorded_events.jsonl, which the backtest parity test replays.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from tests.integration.conftest import proxy_settings
from tests.integration.helpers import create_topic, unique_name

pytestmark = pytest.mark.integration

RATE = 2
WINDOW_S = 4
PRODUCERS = 6
RECORDED = Path(__file__).resolve().parents[1] / "pipeline" / "data" / "recorded_events.jsonl"
QUOTA = {
    "producer.id.quota.window.size.seconds": WINDOW_S,
    "users": {"ANONYMOUS": {"producer_ids_rate": RATE}},
}


def storm(bootstrap: str, topic: str) -> list[list[str]]:
    errors: list[list[str]] = [[] for _ in range(PRODUCERS)]

    def one(index: int) -> None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "client.id": f"storm-{index}",
                "message.timeout.ms": 60_000,
            }
        )
        for record in range(3):
            producer.produce(
                topic,
                f"{index}-{record}".encode(),
                on_delivery=lambda e, _m, i=index: errors[i].append(str(e)) if e else None,
            )
        producer.flush(60)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    return errors


def record_run(broker: EmbeddedBroker, directory: Path) -> list[dict[str, Any]]:
    settings = proxy_settings(broker, quota=QUOTA, rejection={"max_throttle_time_ms": 500})
    settings = settings.model_copy(
        update={"event_log": settings.event_log.model_copy(update={"directory": directory})}
    )
    with BackgroundProxy(settings) as proxy:
        topic = unique_name("events")
        create_topic(proxy.bootstrap, topic)
        errors = storm(proxy.bootstrap, topic)
        assert errors == [[] for _ in range(PRODUCERS)], errors
        time.sleep(1.5)  # the writer flushes every second
    lines = [
        json.loads(line)
        for path in sorted(directory.glob("pidgate-events-*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert lines, "no events written"
    return lines


def test_a_throttling_run_writes_every_decision_and_handed_out_pid(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    events = record_run(broker, tmp_path)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_kind.setdefault(event["event"], []).append(event)

    fields = {
        "ts_ms", "event", "principal", "producer_id", "producer_epoch", "client_id",
        "client_software", "topic", "partition", "node_id", "instance", "throttle_ms",
        "tokens", "request_id", "transactional",
    }  # fmt: skip
    assert all(set(event) == fields for event in events)

    handed_out = {e["producer_id"] for e in by_kind["init_producer_id"]}
    admitted = {e["producer_id"] for e in by_kind["admitted_new"]}
    rejected = {e["producer_id"] for e in by_kind["rejected"]}
    # Every producer got a PID from the cluster, and every one was eventually admitted once.
    assert len(handed_out) == PRODUCERS
    assert admitted == handed_out
    assert len(by_kind["admitted_new"]) == PRODUCERS
    # The quota made some wait: only RATE fit the first burst.
    assert len(rejected) >= PRODUCERS - RATE
    assert rejected <= admitted
    for event in by_kind["rejected"]:
        assert event["principal"] == "User:ANONYMOUS"
        assert event["throttle_ms"] > 0
        assert event["client_software"] == "confluent-kafka-python"
        assert event["client_id"].startswith("storm-")
        assert event["partition"] is not None and event["topic"].startswith("events")
    for event in by_kind["admitted_new"]:
        assert event["node_id"] == 111  # produced through tansu's broker listener
        assert event["tokens"] is not None and event["tokens"] >= 0
    assert all(e["transactional"] is False for e in by_kind["init_producer_id"])


if __name__ == "__main__":  # record tests/pipeline/data/recorded_events.jsonl
    import tempfile

    with EmbeddedBroker() as running, tempfile.TemporaryDirectory() as scratch:
        recorded = record_run(running, Path(scratch))
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        with RECORDED.open("w") as out:
            for event in recorded:
                out.write(json.dumps(event) + "\n")
        print(f"recorded {len(recorded)} events to {RECORDED}")
