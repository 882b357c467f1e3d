"""Self-checks of the test fixtures ``sasl_broker.ScriptedSaslBroker`` and ``certs``: real clients
(kafka-python, confluent-kafka) talk to the scripted broker directly, and raw sockets check the
SASL state machine. No pidgate and no tansu involved."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
from kafka.net.sasl.oauth import AbstractTokenProvider
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from pidgate.protocol.headers import parse_response_header
from tests.integration.certs import make_pki, renew_server_cert, server_serial
from tests.integration.sasl_broker import (
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    AuthEvent,
    ScriptedSaslBroker,
    unsigned_jwt,
)

pytestmark = pytest.mark.integration

USERS = {"alice": "alice-secret", "bob": "bob-secret"}
TOPIC = "sasl-topic"


# -- real clients -----------------------------------------------------------------------------


def kafka_python_producer(broker: ScriptedSaslBroker, mechanism: str, **kw: Any) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        enable_idempotence=True,
        acks="all",
        request_timeout_ms=3000,
        max_block_ms=3000,
        bootstrap_timeout_ms=2000,
        **kw,
    )


def confluent_producer(
    broker: ScriptedSaslBroker, mechanism: str, errors: list[Any], **conf: Any
) -> confluent_kafka.Producer:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 5000,
            "socket.timeout.ms": 3000,
            "reconnect.backoff.ms": 500,
            "error_cb": errors.append,
            "log_level": 0,
            **conf,
        }
    )


def assert_produced_by(broker: ScriptedSaslBroker, user: str) -> None:
    produced = broker.produced
    assert produced, "nothing reached the broker"
    for record in produced:
        assert record.user == user
        assert record.topic == TOPIC
        assert record.partition == 0
        assert len(record.producer_ids) == 1 and record.producer_ids[0] >= 1000


@pytest.mark.parametrize("handshake_max", [1, 0])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_produces(mechanism: str, handshake_max: int) -> None:
    with ScriptedSaslBroker(USERS, handshake_max_version=handshake_max) as broker:
        producer = kafka_python_producer(
            broker, mechanism, sasl_plain_username="alice", sasl_plain_password="alice-secret"
        )
        try:
            for i in range(3):
                producer.send(TOPIC, b"v%d" % i)
            producer.flush(timeout=5)
        finally:
            producer.close(timeout=3)
        assert_produced_by(broker, "alice")
        assert AuthEvent("alice", mechanism, True) in broker.auth_log
        assert not any(not e.success for e in broker.auth_log)


@pytest.mark.parametrize(
    ("mechanism", "handshake_max"),
    [("PLAIN", 1), ("SCRAM-SHA-256", 1), ("SCRAM-SHA-512", 0)],
)
def test_confluent_produces(mechanism: str, handshake_max: int) -> None:
    errors: list[Any] = []
    with ScriptedSaslBroker(USERS, handshake_max_version=handshake_max) as broker:
        producer = confluent_producer(
            broker, mechanism, errors, **{"sasl.username": "bob", "sasl.password": "bob-secret"}
        )
        for i in range(3):
            producer.produce(TOPIC, b"v%d" % i)
        assert producer.flush(8) == 0
        del producer
        assert_produced_by(broker, "bob")
        assert AuthEvent("bob", mechanism, True) in broker.auth_log
    assert errors == []


def test_kafka_python_wrong_password(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kafka")
    with ScriptedSaslBroker(USERS) as broker:
        with pytest.raises(KafkaTimeoutError):
            kafka_python_producer(
                broker, "SCRAM-SHA-256", sasl_plain_username="alice", sasl_plain_password="nope"
            )
        assert broker.auth_log and all(
            e == AuthEvent("alice", "SCRAM-SHA-256", False) for e in broker.auth_log
        )
        assert broker.produced == []
        assert all(r.user is None for r in broker.requests)  # nothing after the failure
    assert "SaslAuthenticationFailedError" in caplog.text


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_confluent_wrong_password(mechanism: str) -> None:
    errors: list[Any] = []
    with ScriptedSaslBroker(USERS) as broker:
        producer = confluent_producer(
            broker, mechanism, errors, **{"sasl.username": "bob", "sasl.password": "alice-secret"}
        )
        producer.produce(TOPIC, b"x")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not errors:
            producer.poll(0.1)
        assert errors and errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
        assert "Authentication failed" in errors[0].str()
        producer.purge()
        del producer
        assert AuthEvent("bob", mechanism, False) in broker.auth_log
        assert broker.produced == []


class Tokens(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, sub: str) -> None:
        self.sub = sub

    def token(self) -> str:
        return unsigned_jwt(self.sub)


def test_oauthbearer_kafka_python() -> None:
    with ScriptedSaslBroker(oauth_subjects={"svc"}) as broker:
        producer = kafka_python_producer(
            broker, "OAUTHBEARER", sasl_oauth_token_provider=Tokens("svc")
        )
        try:
            producer.send(TOPIC, b"x").get(timeout=5)
        finally:
            producer.close(timeout=3)
        assert_produced_by(broker, "svc")
        with pytest.raises(KafkaTimeoutError):
            kafka_python_producer(broker, "OAUTHBEARER", sasl_oauth_token_provider=Tokens("evil"))
        assert AuthEvent("evil", "OAUTHBEARER", False) in broker.auth_log


def test_oauthbearer_confluent() -> None:
    def conf(sub: str) -> dict[str, Any]:
        def oauth_cb(_config: str) -> tuple[str, float, str, dict[str, str]]:
            return unsigned_jwt(sub), time.time() + 3600, sub, {}

        return {"oauth_cb": oauth_cb}

    errors: list[Any] = []
    with ScriptedSaslBroker(oauth_subjects={"svc"}) as broker:
        producer = confluent_producer(broker, "OAUTHBEARER", errors, **conf("svc"))
        producer.produce(TOPIC, b"x")
        assert producer.flush(8) == 0
        del producer
        assert_produced_by(broker, "svc")
        assert errors == []

        producer = confluent_producer(broker, "OAUTHBEARER", errors, **conf("evil"))
        producer.produce(TOPIC, b"x")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not errors:
            producer.poll(0.1)
        producer.purge()
        del producer
        assert errors and errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
        assert AuthEvent("evil", "OAUTHBEARER", False) in broker.auth_log


def test_confluent_reauthenticates() -> None:
    """KIP-368: librdkafka re-authenticates on the same connection before the session ends."""
    errors: list[Any] = []
    with ScriptedSaslBroker(USERS, session_lifetime_ms=1000) as broker:
        producer = confluent_producer(
            broker, "PLAIN", errors, **{"sasl.username": "bob", "sasl.password": "bob-secret"}
        )
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            producer.produce(TOPIC, b"x")
            producer.poll(0.1)
        assert producer.flush(5) == 0
        del producer
        reauths = [r for r in broker.requests if r.api_key == 17 and r.user == "bob"]
        assert reauths, "no SaslHandshake on an authenticated connection"
        assert broker.auth_log.count(AuthEvent("bob", "PLAIN", True)) > broker.connections
        assert_produced_by(broker, "bob")
    assert errors == []


# -- the SASL state machine, over raw sockets -----------------------------------------------------


class Raw:
    def __init__(self, broker: ScriptedSaslBroker) -> None:
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=3)
        self.cid = 0

    def send(self, request: Any, version: int) -> None:
        self.cid += 1
        request.API_VERSION = version
        request.with_header(correlation_id=self.cid, client_id="raw")
        self.sock.sendall(bytes(request.encode(header=True, framed=True)))

    def send_raw(self, token: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(token)) + token)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self.recv_exactly(4))[0]
        return self.recv_exactly(size)

    def recv(self, response_class: Any, version: int) -> Any:
        frame = self.recv_frame()
        cid, body_at = parse_response_header(frame, response_class.API_KEY, version)
        assert cid == self.cid
        return response_class.decode(frame[body_at:], version=version)

    def recv_exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionError:
            return True

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def broker() -> Any:
    with ScriptedSaslBroker(USERS, mechanisms=("PLAIN", "SCRAM-SHA-256")) as running:
        yield running


def test_api_versions_then_metadata_before_auth_closes(broker: ScriptedSaslBroker) -> None:
    raw = Raw(broker)
    raw.send(ApiVersionsRequest(), 3)
    resp = raw.recv(ApiVersionsResponse, 3)
    keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert keys[17] == (0, 1) and keys[36] == (0, 2) and keys[22] == (0, 4)
    raw.send(MetadataRequest(topics=None), 1)
    assert raw.closed()
    raw.close()


def test_unsupported_mechanism(broker: ScriptedSaslBroker) -> None:
    raw = Raw(broker)
    raw.send(SaslHandshakeRequest(mechanism="OAUTHBEARER"), 1)
    resp = raw.recv(SaslHandshakeResponse, 1)
    assert resp.error_code == UNSUPPORTED_SASL_MECHANISM
    assert resp.mechanisms == ["PLAIN", "SCRAM-SHA-256"]
    assert raw.closed()
    raw.close()


def test_v1_failure_answers_58_then_closes(broker: ScriptedSaslBroker) -> None:
    raw = Raw(broker)
    raw.send(SaslHandshakeRequest(mechanism="PLAIN"), 1)
    assert raw.recv(SaslHandshakeResponse, 1).error_code == 0
    raw.send(SaslAuthenticateRequest(auth_bytes=b"\0alice\0wrong"), 2)
    resp = raw.recv(SaslAuthenticateResponse, 2)
    assert resp.error_code == SASL_AUTHENTICATION_FAILED
    assert raw.closed()
    raw.close()
    assert broker.auth_log == [AuthEvent("alice", "PLAIN", False)]


def test_v0_raw_tokens(broker: ScriptedSaslBroker) -> None:
    ok = Raw(broker)
    ok.send(SaslHandshakeRequest(mechanism="PLAIN"), 0)
    assert ok.recv(SaslHandshakeResponse, 0).error_code == 0
    ok.send_raw(b"\0alice\0alice-secret")
    assert ok.recv_frame() == b""  # empty server token: success
    ok.send(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")]), 1)
    ok.recv_frame()
    ok.close()
    bad = Raw(broker)
    bad.send(SaslHandshakeRequest(mechanism="PLAIN"), 0)
    bad.recv(SaslHandshakeResponse, 0)
    bad.send_raw(b"\0alice\0wrong")
    assert bad.closed()  # v0: failure = the broker closes the connection
    bad.close()
    assert broker.auth_log == [
        AuthEvent("alice", "PLAIN", True),
        AuthEvent("alice", "PLAIN", False),
    ]
    assert broker.topics == {"t": 1}


def test_scram_unknown_user_fails_at_client_first(broker: ScriptedSaslBroker) -> None:
    raw = Raw(broker)
    raw.send(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), 1)
    raw.recv(SaslHandshakeResponse, 1)
    raw.send(SaslAuthenticateRequest(auth_bytes=b"n,,n=mallory,r=abc"), 1)
    assert raw.recv(SaslAuthenticateResponse, 1).error_code == SASL_AUTHENTICATION_FAILED
    assert raw.closed()
    raw.close()


def test_reauth_must_keep_the_principal(broker: ScriptedSaslBroker) -> None:
    raw = Raw(broker)
    for user, password in (("alice", "alice-secret"), ("bob", "bob-secret")):
        raw.send(SaslHandshakeRequest(mechanism="PLAIN"), 1)
        raw.recv(SaslHandshakeResponse, 1)
        raw.send(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()), 1)
        resp = raw.recv(SaslAuthenticateResponse, 1)
    assert resp.error_code == SASL_AUTHENTICATION_FAILED  # Kafka: no principal change
    assert raw.closed()
    raw.close()


# -- TLS ----------------------------------------------------------------------------------------


def test_pki_server_and_client_certs(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, ["alice", "bob"])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    client_ctx.load_cert_chain(pki.client("alice").cert, pki.client("alice").key)

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)
    seen: list[Any] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(5)
                seen.append(tls.getpeercert())
                tls.sendall(b"ok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for host in ("localhost", "127.0.0.1"):  # both SANs verify
            with (
                socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=5) as s,
                client_ctx.wrap_socket(s, server_hostname=host) as tls,
            ):
                assert tls.recv(2) == b"ok"
        t.join(5)
    finally:
        listener.close()
    assert len(seen) == 2
    subject = dict(rdn[0] for rdn in seen[0]["subject"])
    assert subject == {
        "commonName": "alice",
        "organizationalUnitName": "clients",
        "organizationName": "pidgate-test",
    }
    assert pki.client("alice").subject == "CN=alice,OU=clients,O=pidgate-test"

    before = server_serial(pki)
    assert renew_server_cert(pki) != before
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)  # the new pair matches


def test_confluent_sasl_ssl(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, [])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    errors: list[Any] = []
    with ScriptedSaslBroker(USERS, ssl_context=ctx) as broker:
        producer = confluent_producer(
            broker,
            "SCRAM-SHA-256",
            errors,
            **{
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(pki.ca_cert),
                "sasl.username": "alice",
                "sasl.password": "alice-secret",
            },
        )
        producer.produce(TOPIC, b"x")
        assert producer.flush(8) == 0
        del producer
        assert_produced_by(broker, "alice")
    assert errors == []


def test_mtls_without_sasl_uses_the_certificate_subject(tmp_path: Path) -> None:
    """``require_sasl=False`` + a client-cert-verifying context: an SSL listener whose principal
    is the client certificate's subject, as Kafka's default SSL principal builder shows it."""
    pki = make_pki(tmp_path, ["carol"])
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca_cert))
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    errors: list[Any] = []
    with ScriptedSaslBroker(ssl_context=ctx, require_sasl=False) as broker:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca_cert),
                "ssl.certificate.location": str(pki.client("carol").cert),
                "ssl.key.location": str(pki.client("carol").key),
                "enable.idempotence": True,
                "message.timeout.ms": 5000,
                "error_cb": errors.append,
                "log_level": 0,
            }
        )
        producer.produce(TOPIC, b"x")
        assert producer.flush(8) == 0
        del producer
        assert_produced_by(broker, pki.client("carol").subject)
        assert broker.auth_log == []
    assert errors == []
