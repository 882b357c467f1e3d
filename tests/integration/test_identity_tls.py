"""Identity and TLS, end to end: pidgate terminates client TLS in front of the module's tansu
broker (principals from client certificates, KIP-371 mapping rules), reloads its certificate
without a restart, and originates TLS to a broker that needs it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka
import pytest
import structlog
from confluent_kafka.admin import AdminClient
from cryptography import x509
from kafka import KafkaProducer
from kafka.protocol.metadata import ApiVersionsResponse

from pidgate.config import LoggingSettings, Settings, load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.logs import configure_logging
from pidgate.proxy.quota_control.admission import quota_clock_ms
from tests.integration.broker_log import producer_ids_in_log
from tests.integration.certs import Pki, make_pki, renew_server_cert, server_serial
from tests.integration.decisions import Decisions
from tests.integration.helpers import (
    KafkaSocket,
    api_versions_request,
    create_topic,
    decode_response,
    encode_request,
    unique_name,
    wait_until,
)
from tests.integration.sasl_broker import ScriptedSaslBroker

pytestmark = pytest.mark.integration

T = TypeVar("T")

ALICE, BOB = "User:alice", "User:bob"
QUOTA = {
    "producer.id.quota.window.size.seconds": 3600,
    "users": {"alice": {"producer_ids_rate": 1}, "bob": {"producer_ids_rate": 3}},
}
MAPPING_RULES = "RULE:^CN=(.*?),OU=clients.*$/$1/,DEFAULT"


# -- helpers ------------------------------------------------------------------------------------


def on_loop(proxy: BackgroundProxy, function: Callable[[], T]) -> T:
    return proxy.call_and_wait(function)


def tracked_principals(proxy: BackgroundProxy) -> set[str]:
    snapshot = on_loop(proxy, lambda: proxy.server.quota.snapshot(quota_clock_ms()))
    return {state.principal for state in snapshot}


@contextlib.contextmanager
def running(settings: Settings, decisions: Decisions | None = None) -> Iterator[BackgroundProxy]:
    proxy = BackgroundProxy(settings, observers=(decisions,) if decisions else ()).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextlib.contextmanager
def pidgate_logs(path: Path) -> Iterator[Path]:
    """pidgate's own structlog configuration (JSON, debug), written to ``path``."""
    saved = structlog.get_config()
    configure_logging(LoggingSettings(level="debug", format="json"))
    with path.open("w", encoding="utf-8") as sink:
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sink))
        try:
            yield path
        finally:
            structlog.configure(**saved)


def tls_settings(
    upstream: str, node_id: int, pki: Pki, broker_port: int, **client_tls: Any
) -> Settings:
    return load_settings(
        cli_overrides={
            "proxy": {
                "upstream": [upstream],
                "listen": f"127.0.0.1:{free_port()}",
                "broker_ports": {node_id: broker_port},
            },
            "quota": QUOTA,
            "rejection": {"max_throttle_time_ms": 300},
            "admin": {"listen": f"127.0.0.1:{free_port()}"},
            "client_tls": {
                "enabled": True,
                "certfile": str(pki.server_cert),
                "keyfile": str(pki.server_key),
                "cafile": str(pki.ca_cert),
                "client_auth": "required",
                "principal_mapping_rules": MAPPING_RULES,
                **client_tls,
            },
            "logging": {"format": "json"},
        }
    )


def ssl_conf(pki: Pki, name: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_cert)}
    if name is not None:
        conf["ssl.certificate.location"] = str(pki.client(name).cert)
        conf["ssl.key.location"] = str(pki.client(name).key)
    return conf


def confluent_produce(
    bootstrap: str, topic: str, conf: dict[str, Any], timeout_ms: int = 5000
) -> tuple[list[Any], list[Any]]:
    """One idempotent producer (a new PID) sends one record; returns (delivery results, errors)."""
    delivered: list[Any] = []
    errors: list[Any] = []
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": timeout_ms,
            "socket.timeout.ms": 3000,
            "error_cb": errors.append,
            "log_level": 0,
            **conf,
        }
    )
    producer.produce(topic, b"record", on_delivery=lambda e, _m: delivered.append(e))
    producer.flush(timeout_ms / 1000 + 5)
    del producer
    return delivered, errors


def tls_client_context(pki: Pki, name: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    if name is not None:
        context.load_cert_chain(pki.client(name).cert, pki.client(name).key)
    return context


def api_versions_over(tls: ssl.SSLSocket, correlation_id: int) -> int:
    """ApiVersions v3 on an established TLS socket; returns its error_code."""
    tls.sendall(encode_request(api_versions_request(3), 3, correlation_id))
    header = b""
    while len(header) < 4:
        chunk = tls.recv(4 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    size = int.from_bytes(header, "big")
    payload = b""
    while len(payload) < size:
        chunk = tls.recv(size - len(payload))
        if not chunk:
            raise ConnectionError("closed")
        payload += chunk
    return int(decode_response(ApiVersionsResponse, payload, 3).error_code)


def peer_serial(tls: ssl.SSLSocket) -> int:
    der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def tls_connect(address: tuple[str, int], context: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(address, timeout=5)
    try:
        return context.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise


def address_of(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    return host, int(port)


# -- 7. principals from client certificates --------------------------------------------------


def test_client_certificates_are_throttled_per_principal(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path, ["alice", "bob"])
    alice_topic, bob_topic = unique_name("tls-alice"), unique_name("tls-bob")
    for topic in (alice_topic, bob_topic):
        create_topic(broker.bootstrap, topic)  # straight on tansu, plaintext
    broker_port = free_port()
    decisions = Decisions()
    settings = tls_settings(broker.bootstrap, TANSU_NODE_ID, pki, broker_port)
    with running(settings, decisions) as pidgate:
        # Metadata through TLS names pidgate's own broker listener.
        admin = AdminClient({"bootstrap.servers": pidgate.bootstrap, **ssl_conf(pki, "alice")})
        metadata = admin.list_topics(timeout=15)
        assert [f"{b.host}:{b.port}" for b in metadata.brokers.values()] == [
            f"127.0.0.1:{broker_port}"
        ]
        del admin

        delivered, errors = confluent_produce(
            pidgate.bootstrap, alice_topic, ssl_conf(pki, "alice")
        )
        assert delivered == [None], errors

        # alice's second producer is throttled while bob's three deliver.
        second: dict[str, Any] = {}

        def second_alice() -> None:
            second["result"] = confluent_produce(
                pidgate.bootstrap, alice_topic, ssl_conf(pki, "alice"), timeout_ms=3000
            )

        alice_thread = threading.Thread(target=second_alice, daemon=True)
        alice_thread.start()
        for _ in range(2):
            delivered, errors = confluent_produce(
                pidgate.bootstrap, bob_topic, ssl_conf(pki, "bob")
            )
            assert delivered == [None], errors
        producer = KafkaProducer(
            bootstrap_servers=pidgate.bootstrap,
            security_protocol="SSL",
            ssl_cafile=str(pki.ca_cert),
            ssl_certfile=str(pki.client("bob").cert),
            ssl_keyfile=str(pki.client("bob").key),
            ssl_check_hostname=True,
            enable_idempotence=True,
            acks="all",
            request_timeout_ms=3000,
            max_block_ms=5000,
        )
        try:
            producer.send(bob_topic, b"kafka-python").get(timeout=10)
        finally:
            producer.close(timeout=3)
        alice_thread.join(15)
        assert not alice_thread.is_alive()
        alice_delivered, _ = second["result"]
        assert alice_delivered and alice_delivered[0] is not None  # timed out, throttled

        assert len(decisions.admitted(ALICE)) == 1
        assert decisions.rejected(ALICE)
        assert len(decisions.admitted(BOB)) == 3
        assert decisions.rejected(BOB) == set()
        assert {principal for principal, _, _ in decisions.events} == {ALICE, BOB}
        assert tracked_principals(pidgate) == {ALICE, BOB}  # not User:ANONYMOUS, not a DN
        assert pidgate.server.counters.produce_requests_rejected > 0
    # What tansu stored: one alice PID, bob's three, and the same PIDs pidgate admitted.
    assert set(producer_ids_in_log(broker.bootstrap, alice_topic, [0])) == decisions.admitted(ALICE)
    assert set(producer_ids_in_log(broker.bootstrap, bob_topic, [0])) == decisions.admitted(BOB)


# -- 8. no / untrusted client certificate -----------------------------------------------------


def test_missing_or_untrusted_client_certificate_is_refused(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki", ["alice"])
    foreign = make_pki(tmp_path / "foreign", ["alice"])  # same subject, another CA
    topic = unique_name("tls-refused")
    create_topic(broker.bootstrap, topic)
    decisions = Decisions()
    settings = tls_settings(broker.bootstrap, TANSU_NODE_ID, pki, free_port())
    with running(settings, decisions) as pidgate:
        address = address_of(pidgate.bootstrap)
        untrusted = tls_client_context(pki)
        untrusted.load_cert_chain(foreign.client("alice").cert, foreign.client("alice").key)
        for context in (tls_client_context(pki), untrusted):
            # TLS 1.3: the server's verdict on the client certificate arrives after the
            # client's side of the handshake, so it shows on the first read at the latest.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                tls = tls_connect(address, context)
                try:
                    api_versions_over(tls, 1)
                finally:
                    tls.close()

        # A trusted certificate still works on the same listener (the refusals were the certs).
        with contextlib.closing(tls_connect(address, tls_client_context(pki, "alice"))) as tls:
            assert api_versions_over(tls, 1) == 0

        delivered, errors = confluent_produce(
            pidgate.bootstrap, topic, ssl_conf(pki, None), timeout_ms=3000
        )
        assert delivered and delivered[0] is not None
        assert errors  # librdkafka reports the failed handshakes

        assert decisions.events == []
        assert tracked_principals(pidgate) == set()
        assert pidgate.server.counters.new_producer_ids_admitted == 0
    assert not producer_ids_in_log(broker.bootstrap, topic, [0])


# -- 9. certificate reload without restart ----------------------------------------------------


def test_server_certificate_reloads_without_restart(broker: EmbeddedBroker, tmp_path: Path) -> None:
    pki = make_pki(tmp_path, ["alice"])
    settings = tls_settings(
        broker.bootstrap, TANSU_NODE_ID, pki, free_port(), reload_interval_ms=200
    )
    with (
        pidgate_logs(tmp_path / "pidgate.log") as log_path,
        running(settings) as pidgate,
    ):
        address = address_of(pidgate.bootstrap)
        context = tls_client_context(pki, "alice")
        old_serial = server_serial(pki)
        with contextlib.closing(tls_connect(address, context)) as old:
            assert peer_serial(old) == old_serial
            assert api_versions_over(old, 1) == 0

            new_serial = renew_server_cert(pki)
            assert new_serial != old_serial
            seen: list[int] = []

            def new_connection_sees_new_serial() -> bool:
                try:
                    with contextlib.closing(tls_connect(address, context)) as fresh:
                        seen.append(peer_serial(fresh))
                        return seen[-1] == new_serial and api_versions_over(fresh, 1) == 0
                except (OSError, ssl.SSLError):  # mid-reload: retried
                    return False

            wait_until(new_connection_sees_new_serial, 8, "a new handshake with the new cert")
            assert set(seen) <= {old_serial, new_serial}
            # The established connection keeps working (and keeps its certificate).
            assert api_versions_over(old, 2) == 0
            assert peer_serial(old) == old_serial
    assert "certificates_reloaded" in log_path.read_text(encoding="utf-8")


# -- 10. TLS towards the broker -------------------------------------------------------------


def upstream_tls_settings(broker: ScriptedSaslBroker, cafile: Path) -> Settings:
    return load_settings(
        cli_overrides={
            "proxy": {
                "upstream": [broker.bootstrap],
                "listen": f"127.0.0.1:{free_port()}",
                "broker_ports": {broker.node_id: free_port()},
                "upstream_connect_timeout_ms": 3000,
            },
            "upstream_tls": {"enabled": True, "cafile": str(cafile)},
            "logging": {"format": "json"},
            "admin": {"listen": f"127.0.0.1:{free_port()}"},
        }
    )


def test_upstream_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", [])
    foreign = make_pki(tmp_path / "foreign", [])
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    with ScriptedSaslBroker(ssl_context=server, require_sasl=False) as tls_broker:
        with running(upstream_tls_settings(tls_broker, pki.ca_cert)) as pidgate:
            delivered, errors = confluent_produce(pidgate.bootstrap, "upstream-tls", {})
            assert delivered == [None], errors
        produced = tls_broker.produced
        assert len(produced) == 1
        assert produced[0].user == "ANONYMOUS" and len(produced[0].producer_ids) == 1

        with (
            pidgate_logs(tmp_path / "pidgate.log") as log_path,
            running(upstream_tls_settings(tls_broker, foreign.ca_cert)) as pidgate,
            KafkaSocket(pidgate.bootstrap, timeout_s=8) as conn,
        ):
            conn.sendall(encode_request(api_versions_request(3), 3, 1))
            assert conn.expect_closed(timeout_s=8) == b""
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and "upstream_unreachable" not in log_path.read_text(
                encoding="utf-8"
            ):
                time.sleep(0.05)
        assert tls_broker.produced == produced
    logs = log_path.read_text(encoding="utf-8")
    assert "upstream_unreachable" in logs
    assert "certificate verify failed" in logs
