"""What the demo sets up before any producer starts: pidgate's settings in front of the
embedded broker, the log file that keeps pidgate's and librdkafka's logs off the terminal, and
the demo's topics.

Owns: ``demo_settings``, ``logs_in_file`` and ``create_topics``. Starts no threads and prints
nothing; must not import the demo's producers, display or scenario.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from pidgate.config import LoggingSettings, Settings, load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.demo.plan import PRODUCER_IDS_RATE, STEADY_TOPIC, STORM_TOPIC, WINDOW_SECONDS
from pidgate.proxy.logs import configure_logging


def demo_settings(broker: EmbeddedBroker, event_log: Path | None = None) -> Settings:
    """pidgate as a gateway to ``broker`` on free loopback ports, with the demo's quota; with
    ``event_log``, writing its PID event log there (flushed every second, one file per run)."""
    overrides: dict[str, Any] = {"event_log": {"directory": str(event_log)}} if event_log else {}
    return load_settings(
        cli_overrides={
            "proxy": {
                "mode": "gateway",
                "upstream": [broker.bootstrap],
                "listen": f"127.0.0.1:{free_port()}",
                "broker_ports": {TANSU_NODE_ID: free_port()},
                "shutdown_grace_ms": 2000,
            },
            "quota": {
                "producer.id.quota.window.size.seconds": WINDOW_SECONDS,
                "users": {"ANONYMOUS": {"producer_ids_rate": PRODUCER_IDS_RATE}},
            },
            "logging": {"level": "info", "format": "json"},
            "admin": {"listen": f"127.0.0.1:{free_port()}"},
            **overrides,
        }
    )


@contextlib.contextmanager
def logs_in_file(path: Path) -> Iterator[tuple[logging.Logger, Path]]:
    """pidgate's structlog events (JSON lines) and librdkafka's log lines go to ``path``, kept
    for the user, so the terminal only shows the live view. Yields the logger to give
    librdkafka and the file's path; logging goes back to stderr afterwards."""
    log_file = open(path, "w", buffering=1)  # noqa: SIM115 (closed below)
    configure_logging(LoggingSettings(level="info", format="json"))
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=log_file))
    rdkafka = logging.getLogger("pidgate.demo.librdkafka")
    rdkafka.propagate = False
    rdkafka.setLevel(logging.INFO)
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s librdkafka %(message)s"))
    rdkafka.addHandler(handler)
    try:
        yield rdkafka, path
    finally:
        rdkafka.removeHandler(handler)
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
        log_file.close()


def create_topics(bootstrap: str, logger: logging.Logger, timeout_s: float = 20.0) -> None:
    """The steady (1 partition) and storm (3 partitions) topics, through ``bootstrap``."""
    admin = AdminClient({"bootstrap.servers": bootstrap}, logger=logger)
    futures = admin.create_topics(
        [NewTopic(STEADY_TOPIC, 1, 1), NewTopic(STORM_TOPIC, 3, 1)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for topic, future in futures.items():
        try:
            future.result(timeout_s)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating topic {topic} through pidgate: {error}") from error
