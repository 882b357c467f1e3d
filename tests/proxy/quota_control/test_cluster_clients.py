"""The settings of quota control's own kafka-python clients (fleet topic, shared store)."""

from __future__ import annotations

import time

from pidgate.proxy.quota_control.cluster_clients import cluster_client_config


def test_bootstrap_gets_what_is_left_of_the_deadline_within_bounds() -> None:
    now = time.monotonic()
    near = cluster_client_config(["b:9092"], "pidgate-fleet-m", now + 5.0, {})
    assert 4000 <= near["bootstrap_timeout_ms"] <= 5000
    assert cluster_client_config(["b:9092"], "c", now - 1.0, {})["bootstrap_timeout_ms"] == 100
    assert cluster_client_config(["b:9092"], "c", now + 600, {})["bootstrap_timeout_ms"] == 30_000


def test_security_settings_come_last_and_the_rest_is_fixed() -> None:
    config = cluster_client_config(
        ["b:9092"], "pidgate-shared-store-i", time.monotonic() + 1, {"security_protocol": "SSL"}
    )
    assert config["bootstrap_servers"] == ["b:9092"]
    assert config["client_id"] == "pidgate-shared-store-i"
    assert config["request_timeout_ms"] == 10_000
    assert config["reconnect_backoff_max_ms"] == 2_000
    assert config["security_protocol"] == "SSL"
