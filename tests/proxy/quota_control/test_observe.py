"""Observe mode without sockets: the gatekeeper forwards what enforcement would reject and tells
only the observers that record would-be rejections; the mode comes from the settings
(``quota.mode``, ``users.<name>.mode``, ``serve --observe``) under runtime overrides set through
the client-quota key ``producer_ids_observe``."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from pidgate.cli import build_parser
from pidgate.config import load_settings
from pidgate.config.serve_flags import serve_overrides
from pidgate.protocol.client_quotas.alter import ALTER_CLIENT_QUOTAS_KEY
from pidgate.protocol.client_quotas.describe import DESCRIBE_CLIENT_QUOTAS_KEY
from pidgate.protocol.client_quotas.entities import MATCH_ANY
from pidgate.protocol.headers import parse_response_header
from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.operations.metrics import ProxyMetrics
from pidgate.proxy.quota_control.admission import Gatekeeper, ProduceContext, WouldReject
from pidgate.proxy.quota_control.quota_admin import QuotaAdmin
from pidgate.proxy.quota_control.quotas_in_force import QuotaControl
from pidgate.quota.manager import Admitted, QuotaManager, Rejected
from pidgate.quota.policy import QuotaPolicy

T0 = 1_700_000_000_000
ALICE = ProduceContext("User:alice", "c", None, "127.0.0.1:1")


def produce(*pids: int) -> ProduceRequestSummary:
    batches = tuple(BatchHeader(0, 100, 2, 0, 0, 0, 0, pid, 0, 0, 1) for pid in pids)
    topic = TopicProduce(name="t", topic_id=None, partitions=(PartitionProduce(0, batches),))
    return ProduceRequestSummary(None, -1, 1000, (topic,))


class Decisions:
    """A DecisionObserver only: would-be rejections never reach it."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_decision(self, context: Any, request: Any, decision: Any) -> None:
        self.seen.append(decision)


class WouldRejects(Decisions):
    def __init__(self) -> None:
        super().__init__()
        self.would_reject: list[Rejected] = []

    def on_would_reject(self, context: Any, request: Any, rejected: Rejected) -> None:
        self.would_reject.append(rejected)


def test_observed_principals_are_forwarded_recorded_and_charged_nothing() -> None:
    quota = QuotaManager(
        QuotaPolicy(default_producer_ids_rate=1, default_observe=True, user_observe={"bob": False})
    )
    decisions, would_rejects = Decisions(), WouldRejects()
    gate = Gatekeeper(quota, (decisions, would_rejects))
    assert isinstance(gate.check(ALICE, produce(1)), Admitted)  # the one token, as enforced
    observed = gate.check(ALICE, produce(2, 3))
    assert isinstance(observed, WouldReject)
    assert observed.rejected.unknown_producer_ids == (2, 3)
    assert [r.unknown_producer_ids for r in would_rejects.would_reject] == [(2, 3)]
    assert all(isinstance(d, Admitted) for d in decisions.seen)  # never told of a rejection
    # Nothing recorded: the PIDs are still unknown, asked again they are decided again.
    assert not quota.is_known("User:alice", 2, gate.decided_at_ms)
    assert isinstance(gate.check(ALICE, produce(2)), WouldReject)
    (state,) = quota.snapshot(gate.decided_at_ms)
    assert (state.would_reject_requests, state.would_reject_producer_ids) == (2, 3)
    # bob's own mode (enforce) wins over the default user's.
    bob = ProduceContext("User:bob", "c", None, "127.0.0.1:2")
    assert isinstance(gate.check(bob, produce(7)), Admitted)
    assert isinstance(gate.check(bob, produce(8)), Rejected)


def test_a_held_request_asked_again_in_observe_mode_is_released_untold() -> None:
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=0, default_observe=True))
    would_rejects = WouldRejects()
    gate = Gatekeeper(quota, (would_rejects,))
    again = gate.check_producer_ids(ALICE, [5], lambda: produce(5), report_rejection=False)
    assert isinstance(again, WouldReject)
    assert would_rejects.would_reject == []


def test_metrics_count_would_be_rejections_and_show_the_mode_per_principal() -> None:
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1, default_observe=True))
    metrics = ProxyMetrics(quota, now_ms=lambda: T0)
    gate = Gatekeeper(quota, (metrics,))
    gate.check(ALICE, produce(1))
    gate.check(ALICE, produce(2, 3))
    text = metrics.render().decode()
    labels = 'principal="User:alice",user="alice"'
    assert f"pidgate_producer_ids_would_reject_total{{{labels}}} 2.0" in text
    assert f"pidgate_produce_requests_would_reject_total{{{labels}}} 1.0" in text
    assert f"pidgate_quota_observe{{{labels}}} 1.0" in text
    assert f"pidgate_produce_requests_rejected_total{{{labels}}} 0.0" in text


def test_settings_and_the_serve_flag_set_the_mode() -> None:
    args = build_parser().parse_args(["serve", "--upstream", "k:9092", "--observe"])
    assert serve_overrides(args)["quota"]["mode"] == "observe"
    settings = load_settings(cli_overrides=serve_overrides(args))
    assert QuotaControl(settings, lambda: T0).policy().observes("User:anyone")
    enforced = build_parser().parse_args(["serve", "--upstream", "k:9092"])
    assert "quota" not in serve_overrides(enforced)
    settings = load_settings(
        cli_overrides={
            "proxy": {"upstream": ["k:9092"]},
            "quota": {
                "users": {"alice": {"mode": "observe"}, "<default>": {"producer_ids_rate": 3}}
            },
        }
    )
    policy = QuotaControl(settings, lambda: T0).policy()
    assert policy.observes("User:alice") and not policy.observes("User:bob")
    with pytest.raises(Exception, match="mode"):
        load_settings(cli_overrides={"proxy": {"upstream": ["k:9092"]}, "quota": {"mode": "x"}})


def _answer(api_key: int, version: int, framed: bytes) -> Any:
    payload = memoryview(framed)[4:]
    _, offset = parse_response_header(payload, api_key, version)
    cls = AlterClientQuotasResponse if api_key == ALTER_CLIENT_QUOTAS_KEY else None
    cls = cls or DescribeClientQuotasResponse
    return cls.decode(bytes(payload[offset:]), version=version)


def alter(
    admin: QuotaAdmin,
    user: str | None,
    key: str,
    value: float,
    remove: bool = False,
    *more: tuple[str, float],
) -> int:
    R = AlterClientQuotasRequest
    ops = [(key, value, remove), *((k, v, False) for k, v in more)]
    request = R(
        entries=[
            R.EntryData(
                entity=[R.EntryData.EntityData(entity_type="user", entity_name=user)],
                ops=[R.EntryData.OpData(key=k, value=v, remove=rm) for k, v, rm in ops],
            )
        ],
        validate_only=False,
    )
    body = memoryview(bytes(request.encode(version=1)))
    plan = admin.plan(ALTER_CLIENT_QUOTAS_KEY, 1, 7, b"", body)
    assert plan.local_response is not None  # no broker client-quota APIs: answered here
    (entry,) = _answer(ALTER_CLIENT_QUOTAS_KEY, 1, plan.local_response).entries
    return int(entry.error_code)


def describe(admin: QuotaAdmin) -> dict[str | None, dict[str, float]]:
    R = DescribeClientQuotasRequest
    request = R(components=[R.ComponentData(entity_type="user", match_type=MATCH_ANY, match=None)])
    body = memoryview(bytes(request.encode(version=1)))
    plan = admin.plan(DESCRIBE_CLIENT_QUOTAS_KEY, 1, 8, b"", body)
    assert plan.local_response is not None
    response = _answer(DESCRIBE_CLIENT_QUOTAS_KEY, 1, plan.local_response)
    assert response.error_code == 0, response.error_message
    return {e.entity[0].entity_name: {v.key: v.value for v in e.values} for e in response.entries}


def test_producer_ids_observe_is_altered_and_described_like_the_rate() -> None:
    settings = load_settings(
        cli_overrides={
            "proxy": {"upstream": ["k:9092"]},
            "quota": {"users": {"alice": {"producer_ids_rate": 4}}},
        }
    )
    control = QuotaControl(settings, lambda: T0)
    admin = QuotaAdmin(control.effective_rates, control.apply_changes)
    assert alter(admin, "alice", "producer_ids_observe", 1.0) == 0
    assert alter(admin, None, "producer_ids_observe", 0.0) == 0
    assert alter(admin, "bob", "producer_ids_observe", 0.5) == 42  # INVALID_REQUEST
    assert describe(admin) == {
        None: {"producer_ids_observe": 0.0},
        "alice": {"producer_ids_rate": 4.0, "producer_ids_observe": 1.0},
    }
    assert control.manager.policy.observes("User:alice")
    assert control.mode_overrides == {"alice": True, "<default>": False}
    assert alter(admin, "alice", "producer_ids_observe", 0.0, remove=True) == 0
    assert not control.manager.policy.observes("User:alice")
    assert describe(admin) == {
        None: {"producer_ids_observe": 0.0},
        "alice": {"producer_ids_rate": 4.0},
    }
    state = control.state()["quotas"]
    assert (state["mode"], state["producer_ids_observe"]) == ("enforce", {"<default>": False})


def test_one_request_sets_the_rate_and_the_mode_together() -> None:
    settings = load_settings(cli_overrides={"proxy": {"upstream": ["k:9092"]}})
    control = QuotaControl(settings, lambda: T0)
    admin = QuotaAdmin(control.effective_rates, control.apply_changes)
    assert (
        alter(admin, "carol", "producer_ids_rate", 6.0, False, ("producer_ids_observe", 1.0)) == 0
    )
    assert describe(admin) == {"carol": {"producer_ids_rate": 6.0, "producer_ids_observe": 1.0}}
    # A bad mode value fails the entity whole: the rate beside it is not applied either.
    assert (
        alter(admin, "dave", "producer_ids_rate", 6.0, False, ("producer_ids_observe", 2.0)) == 42
    )
    assert "dave" not in control.effective_rates()


class BrokenQuota(QuotaManager):
    """Fault injection: ``admit`` raises, as a bug in the quota subsystem would."""

    def admit(self, principal: str, producer_ids: Any, now_ms: int, **_: Any) -> Any:
        raise RuntimeError("injected quota failure")


def test_observe_mode_forwards_what_a_closed_failure_policy_would_refuse() -> None:
    observed = Gatekeeper(
        BrokenQuota(QuotaPolicy(default_producer_ids_rate=1, default_observe=True)),
        failure_policy="closed",
    )
    assert observed.check(ALICE, produce(1)) is None  # forwarded
    assert observed.quota_failures == 1
    enforced = Gatekeeper(
        BrokenQuota(QuotaPolicy(default_producer_ids_rate=1)), failure_policy="closed"
    )
    assert isinstance(enforced.check(ALICE, produce(1)), Rejected)
