"""Fixtures of the real-Kafka tier: Apache Kafka started from the distribution folders that
``PIDGATE_KAFKA3_HOME`` (a ZooKeeper-capable 3.x; 3.1.0 in CI) and ``PIDGATE_KAFKA4_HOME``
(a KRaft 4.x; 4.1.0 in CI) name. Where a variable is unset, the tests that need it skip with
one line naming it, so the suite passes on a fresh clone.

Brokers are session-scoped (a start costs 10-20 s): tests share them and keep apart by topic
names and principals of their own. Tests that need a broker fresh from its start (cold-start
grandfathering) or one they may break (failover) start their own with ``start_kafka``.
Whatever happens, every broker started here is stopped at the end, by PID.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import (
    KAFKA3_HOME_VAR,
    KAFKA4_HOME_VAR,
    KafkaRun,
    kafka_home,
    start_cluster,
    start_single,
)

pytestmark = pytest.mark.realkafka


def _home_or_skip(variable: str) -> Path:
    home = kafka_home(variable)
    if home is None:
        pytest.skip(f"real-Kafka tier: set {variable} to a Kafka distribution folder to run it")
    return home


@pytest.fixture(scope="session")
def kafka3_home() -> Path:
    return _home_or_skip(KAFKA3_HOME_VAR)


@pytest.fixture(scope="session")
def kafka4_home() -> Path:
    return _home_or_skip(KAFKA4_HOME_VAR)


@pytest.fixture(scope="session")
def kafka3(kafka3_home: Path) -> Iterator[KafkaRun]:
    """One 3.x broker (ZooKeeper mode), PLAINTEXT + SASL_PLAINTEXT, shared by the session."""
    with start_single(kafka3_home) as run:
        yield run


@pytest.fixture(scope="session")
def kafka4(kafka4_home: Path) -> Iterator[KafkaRun]:
    """One 4.x broker (KRaft, combined broker+controller), PLAINTEXT + SASL_PLAINTEXT."""
    with start_single(kafka4_home) as run:
        yield run


@pytest.fixture(params=["kafka3", "kafka4"])
def any_kafka(request: pytest.FixtureRequest) -> KafkaRun:
    """Each shared broker in turn: a test that must hold on both versions."""
    run: KafkaRun = request.getfixturevalue(request.param)
    return run


@pytest.fixture
def start_kafka() -> Iterator[Callable[..., KafkaRun]]:
    """``start_kafka(home, cluster=False, **extra)`` -> a broker (or a 3-broker cluster) of the
    test's own, stopped after the test."""
    started: list[KafkaRun] = []

    def start(
        home: Path, cluster: bool = False, extra: dict[str, object] | None = None
    ) -> KafkaRun:
        run = start_cluster(home) if cluster else start_single(home, extra=extra)
        started.append(run)
        return run

    yield start
    for run in started:
        run.stop()


@pytest.fixture
def start_gate() -> Iterator[GateStarter]:
    """``start_gate(kafka, sasl=False, quota={...}, ...)`` -> pidgate in front of ``kafka``,
    in-process (its counters readable), stopped after the test."""
    starter = GateStarter()
    yield starter
    starter.stop_all()
