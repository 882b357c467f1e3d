"""pidgate in front of a real Kafka started by ``tests.realkafka.kafka``: settings for a
gateway (one listener per broker, on fresh loopback ports) and a fixture-friendly starter.

Owns: ``gate_settings`` and ``GateStarter``; tests reach the running proxy's state through
``BackgroundProxy.call_and_wait``.
"""

from __future__ import annotations

from typing import Any

from pidgate.config import Settings, load_settings
from pidgate.proxy.background import BackgroundProxy
from tests.realkafka.kafka import KafkaRun, free_port


def gate_settings(
    kafka: KafkaRun,
    *,
    sasl: bool = False,
    quota: dict[str, Any] | None = None,
    proxy: dict[str, Any] | None = None,
    rejection: dict[str, Any] | None = None,
    **sections: Any,
) -> Settings:
    """A gateway in front of ``kafka``: bootstrap and one listener per broker node on free
    loopback ports, admin HTTP on loopback, JSON logs. ``sasl=True`` fronts the broker's
    SASL_PLAINTEXT listener (single-node runs) and observes the exchange for the principal."""
    upstream = [kafka.sasl_bootstrap] if sasl else kafka.bootstrap.split(",")
    overrides: dict[str, Any] = {
        "proxy": {
            "upstream": upstream,
            "listen": f"127.0.0.1:{free_port()}",
            "broker_ports": {node_id: free_port() for node_id in kafka.broker_ports},
            **(proxy or {}),
        },
        "quota": quota or {},
        "logging": {"format": "json"},
        "admin": {"listen": f"127.0.0.1:{free_port()}"},
        **sections,
    }
    if sasl:
        overrides["identity"] = {"sasl": True, **overrides.get("identity", {})}
    if rejection:
        overrides["rejection"] = rejection
    return load_settings(cli_overrides=overrides)


class GateStarter:
    """``start(kafka, **settings)`` -> a running in-process pidgate; ``stop_all()`` at the end."""

    def __init__(self) -> None:
        self.started: list[BackgroundProxy] = []

    def __call__(self, kafka: KafkaRun, **kwargs: Any) -> BackgroundProxy:
        running = BackgroundProxy(gate_settings(kafka, **kwargs)).start(timeout_s=60)
        self.started.append(running)
        return running

    def stop_all(self) -> None:
        for running in self.started:
            running.stop()
        self.started.clear()
