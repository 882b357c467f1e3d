"""proxy.quota_failure_policy: what a Produce request gets when the quota subsystem raises.

Fault injection: no real part of the quota manager raises on demand, so ``BrokenQuota`` (a
``QuotaManager`` subclass whose ``admit`` raises) stands in for a bug in it. Checked at the
``Gatekeeper`` (the decision) and on a ``ProxyServer``'s own wiring (counted as the
``quota_failure`` protocol-error kind, logged once per interval, policy changed by reload).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pidgate.config import load_settings
from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.quota_control.admission import Gatekeeper, ProduceContext, QuotaFailurePolicy
from pidgate.proxy.server import ProxyServer
from pidgate.quota.manager import Decision, QuotaManager, Rejected
from pidgate.quota.policy import QuotaPolicy

CONTEXT = ProduceContext(
    principal="User:alice", client_id="c", client_software_name=None, peer="127.0.0.1:1"
)


class BrokenQuota(QuotaManager):
    """Fault injection: ``admit`` raises, as a bug in the quota subsystem would."""

    calls = 0

    def admit(self, principal: str, producer_ids: Collection[int], now_ms: int) -> Decision:
        self.calls += 1
        raise RuntimeError("injected quota failure")


class Recorder:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def on_decision(self, context: Any, request: Any, decision: Decision) -> None:
        self.decisions.append(decision)


def produce(*pids: int) -> ProduceRequestSummary:
    batches = tuple(BatchHeader(0, 100, 2, 0, 0, 0, 0, pid, 0, 0, 1) for pid in pids)
    partition = PartitionProduce(index=0, batches=batches)
    topic = TopicProduce(name="t", topic_id=None, partitions=(partition,))
    return ProduceRequestSummary(None, -1, 1000, (topic,))


def gatekeeper(
    policy: QuotaFailurePolicy, errors: list[Exception]
) -> tuple[Gatekeeper, BrokenQuota, Recorder]:
    quota = BrokenQuota(QuotaPolicy(default_producer_ids_rate=1))
    recorder = Recorder()
    gate = Gatekeeper(
        quota,
        [recorder],
        failure_policy=policy,
        failure_throttle_ms=1000,
        on_quota_error=errors.append,
    )
    return gate, quota, recorder


def test_fail_open_forwards_the_request_and_reports_the_error() -> None:
    errors: list[Exception] = []
    gate, quota, recorder = gatekeeper("open", errors)
    assert gate.check(CONTEXT, produce(7, 8)) is None  # None: forwarded untouched
    assert quota.calls == 1
    assert gate.quota_failures == 1
    assert [str(e) for e in errors] == ["injected quota failure"]
    assert recorder.decisions == []  # no quota decision was made: observers hear nothing


def test_fail_closed_rejects_as_throttled() -> None:
    errors: list[Exception] = []
    gate, _, recorder = gatekeeper("closed", errors)
    decision = gate.check(CONTEXT, produce(8, 7))
    assert decision == Rejected(throttle_time_ms=1000, unknown_producer_ids=(7, 8))
    assert gate.quota_failures == 1 and len(errors) == 1
    assert recorder.decisions == []


def test_requests_without_a_pid_never_reach_the_quota() -> None:
    errors: list[Exception] = []
    gate, quota, _ = gatekeeper("closed", errors)
    assert gate.check(CONTEXT, produce(-1)) is None
    assert quota.calls == 0 and errors == []


def test_a_failing_error_reporter_does_not_change_the_outcome() -> None:
    def broken_reporter(error: Exception) -> None:
        raise ValueError("reporter broke too")

    gate = Gatekeeper(
        BrokenQuota(QuotaPolicy()), failure_policy="closed", on_quota_error=broken_reporter
    )
    assert isinstance(gate.check(CONTEXT, produce(1)), Rejected)


class BrokenKnownCheck(QuotaManager):
    """Fault injection: the known-PID check raises (a bug in it, compiled or pure)."""

    def admit_known(self, principal: str, producer_ids: Collection[int], now_ms: int) -> bool:
        raise RuntimeError("injected known-check failure")


@pytest.mark.parametrize(("policy", "expected"), [("open", None), ("closed", Rejected(1000, (7,)))])
def test_a_failing_known_pid_check_goes_by_the_policy_once(
    policy: QuotaFailurePolicy, expected: Rejected | None
) -> None:
    """The connection asks ``admits_known`` first, then the whole decision: a check that raises
    says no there, and the decision meets the error again and applies the failure policy,
    counted and reported once."""
    errors: list[Exception] = []
    gate = Gatekeeper(
        BrokenKnownCheck(QuotaPolicy(default_producer_ids_rate=1)),
        failure_policy=policy,
        failure_throttle_ms=1000,
        on_quota_error=errors.append,
    )
    assert gate.admits_known(CONTEXT.principal, (7,)) is False
    assert gate.check(CONTEXT, produce(7)) == expected
    assert gate.quota_failures == 1
    assert [str(e) for e in errors] == ["injected known-check failure"]


def test_a_known_pid_is_admitted_by_the_first_question_and_no_observer_hears_of_it() -> None:
    recorder = Recorder()
    gate = Gatekeeper(QuotaManager(QuotaPolicy(default_producer_ids_rate=1)), [recorder])
    assert gate.admits_known(CONTEXT.principal, (7,)) is False  # never seen: the whole decision
    gate.check(CONTEXT, produce(7))  # admitted as new (told), then found and cached:
    gate.check(CONTEXT, produce(7))
    told = len(recorder.decisions)
    assert gate.admits_known(CONTEXT.principal, (7,)) is True
    assert gate.admits_known(CONTEXT.principal, [7, 7]) is True
    assert gate.admits_known(CONTEXT.principal, (7, 8)) is False  # 8 is new
    assert len(recorder.decisions) == told


def settings(policy: str, interval_ms: int = 60_000) -> Any:
    return load_settings(
        cli_overrides={
            "proxy": {
                "upstream": ["127.0.0.1:9"],
                "quota_failure_policy": policy,
                "quota_failure_throttle_ms": 2500,
            },
            "logging": {"rate_limit_interval_ms": interval_ms},
            "admin": {"enabled": False},
        }
    )


def quota_failures(server: ProxyServer) -> float:
    for family in text_string_to_metric_families(server.metrics.render().decode()):
        for sample in family.samples:
            if sample.labels.get("kind") == "quota_failure":
                return sample.value
    return 0.0


def test_default_policy_is_open() -> None:
    default = load_settings(cli_overrides={"proxy": {"upstream": ["127.0.0.1:9"]}})
    assert default.proxy.quota_failure_policy == "open"


def test_server_counts_every_failure_and_logs_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = ProxyServer(settings("closed"))
    logged: list[dict[str, Any]] = []

    class Logger:
        def error(self, event: str, **fields: Any) -> None:
            logged.append({"event": event, **fields})

        def info(self, event: str, **fields: Any) -> None:
            pass

    monkeypatch.setattr("pidgate.proxy.server.get_logger", Logger)

    def admit(principal: str, producer_ids: Collection[int], now_ms: int) -> Decision:
        raise RuntimeError("injected quota failure")  # fault injection

    monkeypatch.setattr(server.context.gatekeeper.quota, "admit", admit)
    gate = server.context.gatekeeper
    for pid in range(5):
        assert gate.check(CONTEXT, produce(pid)) == Rejected(2500, (pid,))
    assert quota_failures(server) == 5
    assert len(logged) == 1  # once per logging.rate_limit_interval_ms, however many fail
    assert logged[0]["event"] == "quota_failure" and logged[0]["policy"] == "closed"
    assert "injected quota failure" in logged[0]["error"]

    server.reload(settings("open"))  # the policy follows a config reload
    assert gate.check(CONTEXT, produce(9)) is None
    assert quota_failures(server) == 6


def test_the_next_interval_logs_again_with_the_count_it_stands_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = ProxyServer(settings("open", interval_ms=1))
    logged: list[dict[str, Any]] = []

    class Logger:
        def error(self, event: str, **fields: Any) -> None:
            logged.append(fields)

    monkeypatch.setattr("pidgate.proxy.server.get_logger", Logger)
    clock = iter(range(0, 1000, 10))  # monotonic ms: every call a new interval
    monkeypatch.setattr("pidgate.proxy.server.monotonic_ms", lambda: next(clock))

    def admit(principal: str, producer_ids: Collection[int], now_ms: int) -> Decision:
        raise RuntimeError("injected quota failure")  # fault injection

    monkeypatch.setattr(server.context.gatekeeper.quota, "admit", admit)
    server.context.gatekeeper.check(CONTEXT, produce(1))
    server.context.gatekeeper.check(CONTEXT, produce(2))
    assert [entry["failures"] for entry in logged] == [1, 1]
