"""The PID frontier probe's retries (issue 21): Kafka 4 answers the first InitProducerId after a
start with 14 COORDINATOR_LOAD_IN_PROGRESS; that and every other retriable error, and network
errors, are retried with backoff within the probe's time limit before there is no frontier, and
the reason then names the last error.

Socket-free: ``run_probe`` drives a scripted ``ProbeTarget`` on a fake clock (sleeping advances
it), so the backoff and the deadline are checked exactly. The kafka-python side is exercised
against real brokers (tests/realkafka/test_grandfather.py) and tansu (tests/integration).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError, SaslAuthenticationFailedError

from pidgate.proxy.quota_control.pid_frontier import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    RETRIABLE_ERROR_CODES,
    FrontierResult,
    run_probe,
)

COORDINATOR_LOAD_IN_PROGRESS = 14

Answer = tuple[int, int] | BaseException


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedCluster:
    """Brokers answering InitProducerId from a script per node (an answer is (error code, PID)
    or an exception to raise); past the script, fresh PIDs counting up from ``next_pid``. Each
    request takes ``request_s`` of the fake clock."""

    def __init__(
        self,
        clock: FakeClock,
        scripts: dict[int, list[Answer]],
        metadata: list[list[int] | BaseException] | None = None,
        request_s: float = 0.001,
    ) -> None:
        self.clock = clock
        self.scripts = {node: iter(script) for node, script in scripts.items()}
        self.metadata: Iterator[list[int] | BaseException] = iter(metadata or [])
        self.next_pid = {node: 1000 * node for node in scripts}
        self.request_s = request_s
        self.requests: list[tuple[int, int]] = []  # (node, timeout_ms)

    def broker_ids(self, timeout_ms: int) -> list[int]:
        self.clock.now += self.request_s
        answer = next(self.metadata, list(self.scripts))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def init_producer_id(self, node_id: int, timeout_ms: int) -> tuple[int, int]:
        self.requests.append((node_id, timeout_ms))
        self.clock.now += self.request_s
        answer = next(self.scripts[node_id], None)
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            return answer
        pid = self.next_pid[node_id]
        self.next_pid[node_id] += 1
        return 0, pid


def probe(cluster: ScriptedCluster, timeout_ms: int = 5000, jitter: float = 0.5) -> FrontierResult:
    return run_probe(
        cluster, timeout_ms, clock=cluster.clock, sleep=cluster.clock.sleep, jitter=lambda: jitter
    )


def test_kafka_4_coordinator_load_in_progress_after_a_start_is_retried_to_a_frontier() -> None:
    clock = FakeClock()
    loading = (COORDINATOR_LOAD_IN_PROGRESS, -1)
    cluster = ScriptedCluster(clock, {1: [loading, loading, loading]})
    result = probe(cluster)
    assert result.frontier == 1000, result
    assert result.per_broker == {1: (1000, 1001)}
    assert result.retries == 3
    assert "14 COORDINATOR_LOAD_IN_PROGRESS" in result.reason
    # Exponential backoff from Kafka's retry.backoff.ms (no jitter at 0.5): 0.1, 0.2, 0.4 s.
    assert clock.sleeps == pytest.approx([BACKOFF_INITIAL_S * 2**i for i in range(3)])


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (7, "REQUEST_TIMED_OUT"),
        (13, "NETWORK_EXCEPTION"),
        (14, "COORDINATOR_LOAD_IN_PROGRESS"),
        (15, "COORDINATOR_NOT_AVAILABLE"),
        (16, "NOT_COORDINATOR"),
        (51, "CONCURRENT_TRANSACTIONS"),
    ],
)
def test_each_retriable_answer_to_init_producer_id_is_retried(code: int, name: str) -> None:
    assert code in RETRIABLE_ERROR_CODES
    clock = FakeClock()
    # The second PID of the broker fails first this time: retried on its own.
    cluster = ScriptedCluster(clock, {1: [(0, 500), (code, -1)]})
    result = probe(cluster)
    assert result.frontier == 500, result
    assert result.per_broker == {1: (500, 1000)}
    assert f"{code} {name}" in result.reason
    assert len(cluster.requests) == 3


@pytest.mark.parametrize(
    "error",
    [
        KafkaConnectionError("Connection refused"),
        KafkaTimeoutError("Timed out after 300 ms"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=["refused", "timed-out", "reset"],
)
def test_network_errors_are_retried(error: BaseException) -> None:
    clock = FakeClock()
    cluster = ScriptedCluster(clock, {1: [error]}, metadata=[error])
    result = probe(cluster)
    assert result.frontier == 1000, result
    assert result.retries == 2
    assert result.reason.count(type(error).__name__) == 1, result.reason  # named once


def test_persisting_retriable_errors_give_up_at_the_time_limit_naming_the_last_error() -> None:
    clock = FakeClock()
    started = clock.now
    loading = (COORDINATOR_LOAD_IN_PROGRESS, -1)
    cluster = ScriptedCluster(clock, {1: [loading] * 1000})
    result = probe(cluster, timeout_ms=5000)
    assert result.frontier is None
    reason = result.reason
    assert reason.startswith(
        "broker 1 answered InitProducerId with error 14 COORDINATOR_LOAD_IN_PROGRESS (retriable;"
    ), reason
    assert "quota.grandfather_probe_timeout_ms" in reason
    # Bounded: never past the deadline, and no pause would have ended after it.
    assert clock.now - started <= 5.0
    # Backoff doubles to its cap: attempts at 0, 0.1, 0.3, 0.7, 1.5, 2.5, 3.5 and 4.5 s; the
    # next pause would end past 5 s, so one last attempt halfway through the rest (4.75 s),
    # then the probe gives up at once instead of sleeping.
    assert max(clock.sleeps) == BACKOFF_MAX_S
    assert clock.sleeps[-1] == pytest.approx((5.0 - 4.508) / 2, abs=0.002)
    assert len(cluster.requests) == 9 == result.retries
    assert "after 9 attempt(s) in 5000 ms" in reason
    # Each request may take at most what is left of the probe's time.
    assert all(timeout_ms <= 5000 for _, timeout_ms in cluster.requests)
    assert cluster.requests[-1][1] < 5000 - 3000


def test_an_error_that_clears_just_before_the_time_limit_still_gives_a_frontier() -> None:
    """Eight answers of 14 over 4.5 s: the last attempt, halfway through what is left, gets it."""
    clock = FakeClock()
    started = clock.now
    cluster = ScriptedCluster(clock, {1: [(COORDINATOR_LOAD_IN_PROGRESS, -1)] * 8})
    result = probe(cluster, timeout_ms=5000)
    assert result.frontier == 1000, result
    assert result.retries == 8
    assert 4.5 < clock.now - started <= 5.0


def test_jitter_keeps_pauses_within_twenty_percent() -> None:
    for jitter, factor in ((0.0, 0.8), (0.999999, 1.2)):
        clock = FakeClock()
        cluster = ScriptedCluster(clock, {1: [(COORDINATOR_LOAD_IN_PROGRESS, -1)]})
        probe(cluster, jitter=jitter)
        assert clock.sleeps == pytest.approx([BACKOFF_INITIAL_S * factor])


@pytest.mark.parametrize(
    ("code", "name"),
    [(-1, "UNKNOWN_SERVER_ERROR"), (31, "CLUSTER_AUTHORIZATION_FAILED"), (42, "INVALID_REQUEST")],
)
def test_a_non_retriable_answer_gives_no_frontier_at_once(code: int, name: str) -> None:
    clock = FakeClock()
    cluster = ScriptedCluster(clock, {1: [(code, -1)]})
    result = probe(cluster)
    assert result.frontier is None
    assert result.reason == (
        f"broker 1 answered InitProducerId with error {code} {name} (producer_id -1; not retriable)"
    )
    assert clock.sleeps == [] and len(cluster.requests) == 1


def test_an_authentication_failure_is_not_retried() -> None:
    clock = FakeClock()
    failure = SaslAuthenticationFailedError("bad credentials")
    cluster = ScriptedCluster(clock, {1: []}, metadata=[failure])
    result = probe(cluster)
    assert result.frontier is None
    assert result.reason == (
        "cannot reach the cluster: SaslAuthenticationFailedError: "
        "[Error 58] SaslAuthenticationFailedError: bad credentials (not retriable)"
    )
    assert clock.sleeps == []


def test_an_unreachable_cluster_says_so_after_retrying() -> None:
    clock = FakeClock()
    refused = KafkaConnectionError("Connection refused")
    cluster = ScriptedCluster(clock, {1: []}, metadata=[refused] * 100, request_s=0.3)
    result = probe(cluster, timeout_ms=2000)
    assert result.frontier is None
    reason = result.reason
    assert reason.startswith("cannot reach the cluster: KafkaConnectionError"), reason
    assert "retriable; still failing after" in reason


def test_metadata_without_brokers_is_retried() -> None:
    """A broker that has just started may answer Metadata before it lists itself."""
    clock = FakeClock()
    cluster = ScriptedCluster(clock, {1: []}, metadata=[[], []])
    result = probe(cluster)
    assert result.frontier == 1000, result
    assert result.retries == 2
    assert "metadata lists no broker" in result.reason
    never = ScriptedCluster(FakeClock(), {1: []}, metadata=[[]] * 100)
    failed = probe(never, timeout_ms=1000)
    assert failed.frontier is None
    assert failed.reason.startswith("the cluster's metadata lists no broker (retriable;"), failed


def test_every_broker_is_retried_under_one_time_limit() -> None:
    """Three brokers, each loading its PID block once: one frontier, the slowest broker's."""
    clock = FakeClock()
    loading = (COORDINATOR_LOAD_IN_PROGRESS, -1)
    cluster = ScriptedCluster(clock, {1: [loading], 2: [loading], 3: [loading, loading]})
    result = probe(cluster)
    assert result.frontier == 1000
    assert set(result.per_broker) == {1, 2, 3}
    assert result.retries == 4
    # The backoff starts afresh for each request: 0.1 per broker, 0.1 + 0.2 for broker 3.
    assert clock.sleeps == pytest.approx([0.1, 0.1, 0.1, 0.2])


def test_pids_out_of_order_are_not_retried() -> None:
    clock = FakeClock()
    cluster = ScriptedCluster(clock, {1: [(0, 50), (0, 40)]})
    result = probe(cluster)
    assert result.frontier is None
    assert "increasing order (50 then 40)" in result.reason
    assert clock.sleeps == []


def test_kafkas_retriable_codes_agree_with_kafka_python_for_init_producer_id_answers() -> None:
    """The set is Kafka 4.1's own flags; kafka-python's error classes carry the same flag for
    every code InitProducerId answers with (a drift in either would show here)."""
    from kafka.errors import for_code

    for code in (7, 13, 14, 15, 16, 51):
        assert code in RETRIABLE_ERROR_CODES and for_code(code).retriable
    for code in (-1, 31, 42, 47, 53):  # unknown, cluster authz, invalid request, epoch, txn authz
        assert code not in RETRIABLE_ERROR_CODES and not for_code(code).retriable
