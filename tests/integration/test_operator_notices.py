"""Misconfigurations an operator must hear about, each said once with the fix, on a real
``pidgate serve`` process in front of a real tansu broker: Kubernetes service-link variables,
no quota at all, SASL through a pidgate whose identity.sasl is off, a broker listener that
cannot bind (not ready, with the reason), a bootstrap port in use (the setting named), no
upstream broker answering at start (the address named, in the log and in /readyz) and sidecar
mode without fleet.id."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from tests.integration.helpers import (
    KafkaSocket,
    PidgateProcess,
    encode_request,
    http_get,
    metadata_request,
    sasl_handshake,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def processes() -> Iterator[list[PidgateProcess]]:
    started: list[PidgateProcess] = []
    yield started
    for process in started:
        process.terminate()
        process.close()


def events_named(process: PidgateProcess, name: str) -> list[dict[str, Any]]:
    return [event for event in process.log_events() if event.get("event") == name]


def test_service_links_and_no_quota_are_warned_once_and_serve(
    broker: EmbeddedBroker, processes: list[PidgateProcess]
) -> None:
    service_links = {
        "PIDGATE_PORT": "tcp://10.96.0.12:9092",
        "PIDGATE_PORT_9092_TCP": "tcp://10.96.0.12:9092",
        "PIDGATE_PORT_9092_TCP_ADDR": "10.96.0.12",
        "PIDGATE_SERVICE_HOST": "10.96.0.12",
        "PIDGATE_SERVICE_PORT": "9092",
    }
    process = PidgateProcess(broker.bootstrap, free_port(), env=service_links)
    processes.append(process)
    process.wait_listening()
    wait_until(lambda: events_named(process, "pidgate_started"), 10, "started")
    (ignored,) = events_named(process, "environment_variables_ignored")
    assert ignored["variables"] == sorted(service_links)
    assert "enableServiceLinks: false" in ignored["fix"]
    (no_quota,) = events_named(process, "no_quota_configured")
    assert "--default-producer-ids-rate" in no_quota["fix"]
    assert no_quota["level"] == "warning"


def test_sasl_through_a_pidgate_without_identity_sasl_is_warned_once(
    broker: EmbeddedBroker, processes: list[PidgateProcess]
) -> None:
    process = PidgateProcess(
        broker.bootstrap, free_port(), extra_args=("--default-producer-ids-rate", "10")
    )
    processes.append(process)
    process.wait_listening()
    for attempt in range(3):
        # tansu has no SASL and answers with an error; the handshake still passed pidgate.
        with KafkaSocket(process.bootstrap) as conn:
            sasl_handshake(conn, "PLAIN", 1, correlation_id=attempt)
    wait_until(
        lambda: events_named(process, "sasl_handshake_while_identity_sasl_off"), 10, "warning"
    )
    (warning,) = events_named(process, "sasl_handshake_while_identity_sasl_off")
    assert "PIDGATE_IDENTITY_SASL=true" in warning["fix"]
    assert "User:ANONYMOUS" in warning["consequence"]
    assert not events_named(process, "no_quota_configured")


def test_a_broker_listener_that_cannot_bind_makes_readyz_not_ready(
    broker: EmbeddedBroker, processes: list[PidgateProcess]
) -> None:
    blocked = free_port()  # free a moment ago; base + node id is that port
    base = blocked - TANSU_NODE_ID
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", blocked))
    blocker.listen()
    process = PidgateProcess(
        broker.bootstrap,
        free_port(),
        broker_port_base=base,
        extra_args=("--default-producer-ids-rate", "10"),
    )
    processes.append(process)
    admin = f"127.0.0.1:{process.admin_port}"
    try:
        process.wait_listening()
        assert http_get(admin, "/readyz")[0] == 200
        with KafkaSocket(process.bootstrap) as conn:  # Metadata names broker 111: listener opens
            conn.sendall(encode_request(metadata_request(None), 1, 1))
            conn.recv_frame()
        status, body = http_get(admin, "/readyz")
        assert status == 503
        assert f"broker listener for node {TANSU_NODE_ID}" in body
        assert f"127.0.0.1:{base + TANSU_NODE_ID}" in body
        assert "proxy.broker_ports" in body
    finally:
        blocker.close()
    # Freed: the next response naming the broker opens the listener, and pidgate is ready.
    with KafkaSocket(process.bootstrap) as conn:
        conn.sendall(encode_request(metadata_request(None), 1, 2))
        conn.recv_frame()
    wait_until(lambda: http_get(admin, "/readyz")[0] == 200, 10, "ready once the port is free")


def test_bootstrap_port_in_use_names_the_setting(broker: EmbeddedBroker) -> None:
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    port = blocker.getsockname()[1]
    process = PidgateProcess(broker.bootstrap, port)
    try:
        assert process.process.wait(20) == 1
        (failed,) = events_named(process, "startup_failed")
        assert f"bootstrap listener 127.0.0.1:{port}" in failed["error"]
        assert "proxy.listen" in failed["error"] and "--listen" in failed["error"]
    finally:
        blocker.close()
        process.close()


def test_a_dead_upstream_is_named_at_start_and_in_readyz(
    processes: list[PidgateProcess],
) -> None:
    """Nothing listens on the upstream port: the start says which address did not answer and
    what to check (log event and one plain stderr line), /readyz's 503 carries the same reason;
    once a broker listens there, pidgate is ready."""
    dead = f"127.0.0.1:{free_port()}"
    process = PidgateProcess(dead, free_port())
    processes.append(process)
    process.wait_listening()
    reason = f"no upstream broker answered at {dead} (connection refused)"
    (warning,) = events_named(process, "upstream_unreachable_at_start")
    assert warning["reason"] == reason
    assert "--upstream" in warning["check"] and "proxy.upstream" in warning["check"]
    plain = [line for line in process.log_text().splitlines() if line.startswith("pidgate: ")]
    assert plain == [
        f"pidgate: warning: {reason}: check that the broker runs and that --upstream "
        "(proxy.upstream) is its listener's HOST:PORT as reachable from here"
    ]
    admin = f"127.0.0.1:{process.admin_port}"
    assert http_get(admin, "/readyz") == (503, f"not ready: {reason}\n")
    host, port = dead.rsplit(":", 1)
    with EmbeddedBroker(port=int(port), host=host):
        wait_until(lambda: http_get(admin, "/readyz")[0] == 200, 10, "ready once a broker answers")


def test_sidecar_without_fleet_id_warns_at_start(
    broker: EmbeddedBroker, processes: list[PidgateProcess]
) -> None:
    alone = PidgateProcess(broker.bootstrap, free_port(), extra_args=("--mode", "sidecar"))
    in_fleet = PidgateProcess(
        broker.bootstrap,
        free_port(),
        extra_args=("--mode", "sidecar"),
        env={"PIDGATE_FLEET_ID": "notices-test"},
    )
    processes += [alone, in_fleet]
    for process in (alone, in_fleet):
        process.wait_listening(60)
        wait_until(lambda p=process: events_named(p, "pidgate_started"), 10, "started")
    (warning,) = events_named(alone, "sidecar_without_fleet")
    assert "rejects steady producers" in warning["consequence"]
    assert "fleet.id" in warning["fix"] and "PIDGATE_FLEET_ID" in warning["fix"]
    plain = [line for line in alone.log_text().splitlines() if line.startswith("pidgate: ")]
    assert len(plain) == 1 and plain[0].startswith(
        "pidgate: warning: sidecar mode without fleet.id: "
    )
    assert "set the same fleet.id on every sidecar" in plain[0]
    assert not events_named(in_fleet, "sidecar_without_fleet")
    assert "pidgate: warning" not in in_fleet.log_text()


def _produce_through(bootstrap: str, topic: str, count: int) -> int:
    """Idempotent records produced through ``bootstrap``; how many were delivered."""
    from confluent_kafka import Producer

    delivered: list[bool] = []
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for index in range(count):
        producer.produce(
            topic, str(index).encode(), on_delivery=lambda err, _msg: delivered.append(err is None)
        )
    assert producer.flush(30) == 0
    return sum(delivered)


def test_the_data_path_is_named_at_start_and_the_pure_path_forced_serves_alike(
    broker: EmbeddedBroker, processes: list[PidgateProcess]
) -> None:
    """Issue "native": pidgate says which data path runs (compiled, as the normal install
    builds it); PIDGATE_PURE_PYTHON=1 forces the pure one with one log line naming why, and
    both serve the same idempotent producer."""
    compiled = PidgateProcess(
        broker.bootstrap, free_port(), extra_args=("--default-producer-ids-rate", "10")
    )
    pure = PidgateProcess(
        broker.bootstrap,
        free_port(),
        extra_args=("--default-producer-ids-rate", "10"),
        env={"PIDGATE_PURE_PYTHON": "1"},
    )
    processes += [compiled, pure]
    for process in (compiled, pure):
        process.wait_listening()
        wait_until(lambda p=process: events_named(p, "pidgate_started"), 10, "started")
    (started,) = events_named(compiled, "pidgate_started")
    assert started["data_path"] == "compiled" and started["express_lane"] is True
    assert events_named(compiled, "pure_python_data_path") == []
    (started,) = events_named(pure, "pidgate_started")
    assert started["data_path"] == "pure" and started["express_lane"] is False
    (line,) = events_named(pure, "pure_python_data_path")
    assert line["reason"] == "PIDGATE_PURE_PYTHON=1 is set" and line["level"] == "info"
    for process in (compiled, pure):
        assert _produce_through(process.bootstrap, "data-path-" + str(process.pid), 50) == 50
