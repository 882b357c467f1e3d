"""Sidecar mode: one pidgate per broker, endpoints rewritten through the explicit map."""

from __future__ import annotations

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import producer_ids_in_log
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import create_topic, unique_name

pytestmark = pytest.mark.integration


def test_sidecar_rewrites_its_broker_to_itself_and_enforces_the_quota(
    broker: EmbeddedBroker,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    settings = proxy_settings(
        broker,
        quota=anonymous_quota(producer_ids_rate=1, window_seconds=3600),
        proxy={
            "mode": "sidecar",
            "listen": listen,
            "advertised_endpoints": {broker.bootstrap: listen},
        },
    )
    with BackgroundProxy(settings) as sidecar:
        advertised = AdminClient({"bootstrap.servers": sidecar.bootstrap}).list_topics(timeout=20)
        assert [f"{b.host}:{b.port}" for b in advertised.brokers.values()] == [listen]
        assert sidecar.server.broker_listener_ports == {}  # no per-broker listeners in sidecar mode

        topic = unique_name("sidecar")
        create_topic(sidecar.bootstrap, topic)
        delivered: list[object] = []
        for attempt in range(2):  # two producers: two new PIDs against a quota of one per hour
            producer = confluent_kafka.Producer(
                {
                    "bootstrap.servers": sidecar.bootstrap,
                    "enable.idempotence": True,
                    "message.timeout.ms": 4000,
                }
            )
            producer.produce(
                topic, f"record-{attempt}".encode(), on_delivery=lambda e, _m: delivered.append(e)
            )
            producer.flush(10)
        assert delivered[0] is None  # the first PID fits the quota
        assert delivered[1] is not None  # the second waits past its message timeout
        assert sidecar.server.counters.produce_requests_rejected > 0
    assert len(producer_ids_in_log(broker.bootstrap, topic, [0])) == 1
