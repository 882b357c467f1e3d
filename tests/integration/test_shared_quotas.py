"""A fleet of pidgates agrees on quotas through the shared compacted topic: a quota changed
through one instance (AlterClientQuotas, as kafka-configs does) takes effect on the others."""

from __future__ import annotations

import time

import pytest

from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from tests.integration.helpers import create_topic, init_producer_id, unique_name
from tests.integration.test_operate import (
    MATCH_EXACT,
    REMOVE_RATE,
    alter_quotas,
    describe_quotas,
    operate_settings,
    produce_once,
    rate_op,
)

pytestmark = pytest.mark.integration

THROTTLED = 19  # NOT_ENOUGH_REPLICAS: what a raw client (no software name) is answered


def fleet_member(broker: EmbeddedBroker, topic: str) -> BackgroundProxy:
    settings = operate_settings(broker, quota={"producer.id.quota.window.size.seconds": 3600})
    settings = settings.model_copy(
        update={"shared_store": settings.shared_store.model_copy(update={"topic": topic})}
    )
    return BackgroundProxy(settings).start(timeout_s=60)


def wait_for(condition: object, timeout_s: float = 20.0) -> bool:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


def test_a_quota_changed_through_one_instance_applies_on_the_other(
    broker: EmbeddedBroker,
) -> None:
    store_topic = unique_name("pidgate-quotas")
    first = fleet_member(broker, store_topic)
    second = fleet_member(broker, store_topic)
    try:
        # Through the first instance, as kafka-configs would: ANONYMOUS may add 1 new PID/hour.
        assert alter_quotas(first.bootstrap, [("ANONYMOUS", [rate_op(1)])])[0][0] == 0
        assert wait_for(
            lambda: second.server.quota_control.effective_rates().get("ANONYMOUS") == 1
        ), "the second instance never learned the quota"
        assert describe_quotas(second.bootstrap, MATCH_EXACT, "ANONYMOUS") == {
            "ANONYMOUS": {"producer_ids_rate": 1.0}
        }

        # And the second instance enforces it: one new PID passes, the next is throttled.
        topic = unique_name("fleet")
        create_topic(second.bootstrap, topic)
        first_pid, _ = init_producer_id(second.bootstrap)
        second_pid, _ = init_producer_id(second.bootstrap)
        assert produce_once(second.bootstrap, topic, first_pid) == 0
        assert produce_once(second.bootstrap, topic, second_pid) == THROTTLED

        # A removal through the second instance reaches the first.
        assert alter_quotas(second.bootstrap, [("ANONYMOUS", [REMOVE_RATE])])[0][0] == 0
        assert wait_for(lambda: "ANONYMOUS" not in first.server.quota_control.effective_rates()), (
            "the first instance never learned the removal"
        )

        # A late joiner catches up before it serves.
        third = fleet_member(broker, store_topic)
        try:
            assert "ANONYMOUS" not in third.server.quota_control.effective_rates()
            assert third.server.quota_control.overrides == {"ANONYMOUS": None}
        finally:
            third.stop()
    finally:
        first.stop()
        second.stop()
