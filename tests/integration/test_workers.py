"""``pidgate serve --workers 4``: four processes share the listeners (SO_REUSEPORT) and one quota
through the fleet topic; one admin endpoint covers them all (issue "fleet")."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from pidgate.demo.broker import EmbeddedBroker, free_port
from tests.integration.conftest import anonymous_quota
from tests.integration.helpers import (
    PidgateProcess,
    create_topic,
    http_get,
    init_producer_id,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import parse_samples
from tests.integration.test_fleet import produce_once

pytestmark = pytest.mark.integration

RATE, WINDOW_S, WORKERS, STORM_S = 4, 4, 4, 12.0


def test_four_workers_share_listeners_quota_and_one_admin_endpoint(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    config = tmp_path / "pidgate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "quota": {**anonymous_quota(RATE, WINDOW_S), "grandfather_grace_ms": 0},
                "fleet": {"flush_interval_ms": 50},
                "rejection": {"max_throttle_time_ms": 200},
            }
        )
    )
    port = free_port()
    pidgate = PidgateProcess(
        broker.bootstrap,
        port,
        broker_port_base=free_port() - 111,
        extra_args=("--config", str(config), "--workers", str(WORKERS)),
    ).wait_listening(60)
    admin = f"127.0.0.1:{pidgate.admin_port}"
    try:
        wait_until(lambda: http_get(admin, "/readyz")[0] == 200, 60, "every worker ready")
        topic = unique_name("workers")
        create_topic(broker.bootstrap, topic)

        steady_errors: list[str] = []
        steady = Producer({"bootstrap.servers": pidgate.bootstrap, "enable.idempotence": True})
        for i in range(2000):
            steady.produce(
                topic,
                b"steady-%d" % i,
                partition=0,
                on_delivery=lambda e, _m: steady_errors.append(str(e)) if e else None,
            )
        assert steady.flush(30) == 0

        admitted: list[int] = []
        lock = threading.Lock()
        started = time.monotonic()

        def storm() -> None:
            while time.monotonic() - started < STORM_S:
                pid = init_producer_id(broker.bootstrap)[0]
                if produce_once(pidgate.bootstrap, topic, pid) == 0:  # a new connection
                    with lock:
                        admitted.append(pid)
                time.sleep(0.05)

        threads = [threading.Thread(target=storm) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(STORM_S + 30)
        elapsed = time.monotonic() - started

        status, text = http_get(admin, "/metrics")
        assert status == 200
        samples = parse_samples(text)
        connections = {
            labels["worker"]: value for labels, value in samples["pidgate_connections_total"]
        }
        new_pids = sum(value for _, value in samples["pidgate_producer_ids_new_total"])
        status, body = http_get(admin, "/state")
        state: dict[str, Any] = json.loads(body)
    finally:
        exit_code = pidgate.terminate(60)
        pidgate.close()

    assert exit_code == 0  # every worker drained and exited 0
    assert steady_errors == []
    # Every worker took connections: SO_REUSEPORT spread them.
    assert sorted(connections) == [str(i) for i in range(WORKERS)]
    assert all(value > 0 for value in connections.values())
    assert sorted(state["workers"]) == [str(i) for i in range(WORKERS)]
    assert state["workers_alive"] == WORKERS
    fleet_ids = {worker["fleet"]["id"] for worker in state["workers"].values()}
    assert len(fleet_ids) == 1  # one fleet
    # The quota holds across the workers: one burst plus the refill plus the fleet's bound.
    quota_bound = RATE + RATE * (elapsed + 1) / WINDOW_S
    overshoot_bound = (WORKERS - 1) * 2
    print(
        f"FIGURES workers admitted={len(admitted)} quota_bound={quota_bound:.1f} "
        f"connections={connections}"
    )
    assert len(admitted) <= quota_bound + overshoot_bound
    assert new_pids == len(admitted) + 1  # the storm's and the steady producer's, once each
