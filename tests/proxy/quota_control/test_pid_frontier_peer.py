"""The PID frontier probe's retries over real sockets and kafka-python: a scripted broker
(tests/integration/sasl_broker.py, no SASL) answers InitProducerId with a scripted sequence of
error codes first, as Kafka 4 does after a start (14 COORDINATOR_LOAD_IN_PROGRESS while its PID
block is on its way). The same on real Kafka 4.1: tests/realkafka/test_grandfather.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from pidgate.proxy.quota_control.pid_frontier import probe_frontier
from tests.integration import sasl_broker
from tests.integration.sasl_broker import ScriptedSaslBroker


@pytest.fixture
def answers_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Error codes the scripted broker answers InitProducerId with, in order, before it hands
    out PIDs (the test appends to it)."""
    script: list[int] = []
    lock = threading.Lock()

    def init_producer_id(connection: Any, version: int, cid: int, body: bytes) -> None:
        InitProducerIdRequest.decode(body, version=version)
        with lock:
            code = script.pop(0) if script else 0
        pid, epoch = (connection.broker._new_pid(), 0) if code == 0 else (-1, -1)
        response = InitProducerIdResponse(
            throttle_time_ms=0, error_code=code, producer_id=pid, producer_epoch=epoch
        )
        connection.send(sasl_broker._encode(response, version, cid))

    monkeypatch.setattr(sasl_broker._Connection, "init_producer_id", init_producer_id)
    yield script


def test_coordinator_load_in_progress_is_retried_over_the_wire(answers_first: list[int]) -> None:
    answers_first.extend([14, 14, 15])
    with ScriptedSaslBroker(require_sasl=False, first_producer_id=7000) as broker:
        result = probe_frontier([broker.bootstrap], timeout_ms=10_000)
    assert result.frontier == 7000, result
    assert result.per_broker == {1: (7000, 7001)}
    assert result.retries == 3
    assert "15 COORDINATOR_NOT_AVAILABLE" in result.reason  # the last one retried


def test_persisting_load_in_progress_gives_up_in_time_naming_it(answers_first: list[int]) -> None:
    answers_first.extend([14] * 1000)
    started = time.monotonic()
    with ScriptedSaslBroker(require_sasl=False) as broker:
        result = probe_frontier([broker.bootstrap], timeout_ms=1500)
    assert time.monotonic() - started < 10  # bounded by the timeout (and a loaded machine)
    assert result.frontier is None
    assert result.reason.startswith(
        "broker 1 answered InitProducerId with error 14 COORDINATOR_LOAD_IN_PROGRESS (retriable;"
    ), result.reason
    assert result.retries >= 3  # 0.1 + 0.2 + 0.4 s of backoff fit in 1.5 s


def test_a_non_retriable_error_is_not_retried(answers_first: list[int]) -> None:
    answers_first.extend([31])
    with ScriptedSaslBroker(require_sasl=False) as broker:
        result = probe_frontier([broker.bootstrap], timeout_ms=5000)
    assert result.frontier is None
    assert result.reason == (
        "broker 1 answered InitProducerId with error 31 CLUSTER_AUTHORIZATION_FAILED "
        "(producer_id -1; not retriable)"
    )
    assert result.retries == 0
