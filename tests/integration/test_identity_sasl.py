"""Identity through SASL, end to end: pidgate (identity.sasl=true) in front of the scripted SASL
broker, with real kafka-python / confluent-kafka clients and raw sockets.

What an operator relies on: new producer ids are charged to the user the *broker* accepted
(per-principal KIP-936 throttling), never to a name the broker refused, never before the
exchange succeeded, and no credential ever shows up in pidgate's logs or state.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka
import pytest
import structlog
from kafka import KafkaProducer
from kafka.protocol.sasl import SaslAuthenticateRequest

from pidgate.config import LoggingSettings, Settings, load_settings
from pidgate.demo.broker import free_port
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.logs import configure_logging
from pidgate.proxy.quota_control.admission import quota_clock_ms
from tests.integration.decisions import Decisions
from tests.integration.helpers import (
    ConnectionClosed,
    KafkaSocket,
    ScramClient,
    api_versions_request,
    decode_produce,
    encode_request,
    init_producer_id_on,
    oauthbearer_token,
    plain_token,
    produce_frame,
    produce_partition_errors,
    sasl_authenticate,
    sasl_handshake,
    send_raw_sasl_token,
    wait_until,
)
from tests.integration.sasl_broker import (
    SASL_AUTHENTICATION_FAILED,
    AuthEvent,
    ScriptedSaslBroker,
    unsigned_jwt,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")

USERS = {"alice": "pw-alice-SECRET-1", "bob": "pw-bob-SECRET-2"}
QUOTA = {
    "producer.id.quota.window.size.seconds": 3600,
    # These tests count every PID as new. pidgate has no SASL credentials for its own PID
    # frontier probe here, so grandfathering would run in learning mode (tests/integration/
    # test_grandfather.py covers that); off, the rule under test is the plain KIP-936 one.
    "grandfather_grace_ms": 0,
    "users": {"alice": {"producer_ids_rate": 1}, "bob": {"producer_ids_rate": 5}},
}
ALICE, BOB = "User:alice", "User:bob"
TOPIC = "identity"
PRODUCE_VERSION = 8


# -- fixtures and helpers ---------------------------------------------------------------------


def sasl_settings(broker: ScriptedSaslBroker, **sections: Any) -> Settings:
    """Gateway in front of ``broker`` (its node fronted on a fresh port), SASL identity on."""
    overrides: dict[str, Any] = {
        "proxy": {
            "upstream": [broker.bootstrap],
            "listen": f"127.0.0.1:{free_port()}",
            "broker_ports": {broker.node_id: free_port()},
        },
        "quota": QUOTA,
        "identity": {"sasl": True},
        # Answered at once (not held): these tests read who was charged from the answer.
        "rejection": {"max_throttle_time_ms": 300, "max_hold_ms": 0},
        "logging": {"format": "json"},
        "admin": {"listen": f"127.0.0.1:{free_port()}"},
        **sections,
    }
    return load_settings(cli_overrides=overrides)


@contextlib.contextmanager
def sasl_pidgate(
    broker: ScriptedSaslBroker, decisions: Decisions, **sections: Any
) -> Iterator[BackgroundProxy]:
    proxy = BackgroundProxy(sasl_settings(broker, **sections), observers=(decisions,)).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def on_loop(proxy: BackgroundProxy, function: Callable[[], T]) -> T:
    return proxy.call_and_wait(function)


def tracked_principals(proxy: BackgroundProxy) -> set[str]:
    snapshot = on_loop(proxy, lambda: proxy.server.quota.snapshot(quota_clock_ms()))
    return {state.principal for state in snapshot}


def open_connections(proxy: BackgroundProxy) -> int:
    return on_loop(proxy, lambda: len(proxy.server.context.connections))


def produced_pids(broker: ScriptedSaslBroker, user: str | None) -> set[int]:
    return {pid for p in broker.produced if p.user == user for pid in p.producer_ids}


def confluent_producer(
    bootstrap: str, mechanism: str, user: str, password: str, errors: list[Any], **conf: Any
) -> confluent_kafka.Producer:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": password,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": 5000,
            "socket.timeout.ms": 3000,
            "reconnect.backoff.ms": 200,
            "error_cb": errors.append,
            "log_level": 0,
            **conf,
        }
    )


def confluent_delivers(bootstrap: str, mechanism: str, user: str, password: str) -> None:
    """One idempotent confluent-kafka producer (a new PID) delivers 2 records through pidgate."""
    errors: list[Any] = []
    delivered: list[Any] = []
    producer = confluent_producer(bootstrap, mechanism, user, password, errors)
    for i in range(2):
        producer.produce(
            TOPIC, b"%s-%d" % (user.encode(), i), on_delivery=lambda e, _m: delivered.append(e)
        )
    assert producer.flush(10) == 0, f"{user}/{mechanism}: not delivered ({errors})"
    del producer
    assert delivered == [None, None], delivered


def kafka_python_producer(
    bootstrap: str, mechanism: str, user: str, password: str, **kw: Any
) -> KafkaProducer:
    config: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
        "enable_idempotence": True,
        "acks": "all",
        "request_timeout_ms": 3000,
        "max_block_ms": 5000,
        **kw,
    }
    return KafkaProducer(**config)


def kafka_python_delivers(bootstrap: str, mechanism: str, user: str, password: str) -> None:
    producer = kafka_python_producer(bootstrap, mechanism, user, password)
    try:
        for i in range(2):
            producer.send(TOPIC, b"%s-kp-%d" % (user.encode(), i)).get(timeout=10)
    finally:
        producer.close(timeout=3)


class Raw:
    """A raw connection through pidgate with its own correlation ids."""

    def __init__(self, address: str) -> None:
        self.conn = KafkaSocket(address, timeout_s=8)
        self.cid = 0

    def next_cid(self) -> int:
        self.cid += 1
        return self.cid

    def api_versions(self) -> None:
        self.conn.sendall(encode_request(api_versions_request(3), 3, self.next_cid()))
        self.conn.recv_frame()

    def handshake(self, mechanism: str, version: int = 1) -> int:
        return sasl_handshake(self.conn, mechanism, version, self.next_cid())

    def authenticate(self, token: bytes, version: int = 1) -> Any:
        return sasl_authenticate(self.conn, token, version, self.next_cid())

    def plain_login(self, user: str, password: str, version: int = 1) -> Any:
        assert self.handshake("PLAIN") == 0
        return self.authenticate(plain_token(user, password), version)

    def scram_login(self, client: ScramClient) -> Any:
        assert self.handshake("SCRAM-SHA-256") == 0
        first = self.authenticate(client.client_first())
        assert first.error_code == 0 and bytes(first.auth_bytes).startswith(b"r=")
        return self.authenticate(client.client_final(bytes(first.auth_bytes)))

    def init_producer_id(self) -> int:
        return init_producer_id_on(self.conn, self.next_cid())

    def send_produce(self, producer_id: int) -> None:
        self.conn.sendall(produce_frame(TOPIC, producer_id, self.next_cid(), PRODUCE_VERSION))

    def produce(self, producer_id: int) -> list[int]:
        """Partition error codes of a Produce carrying ``producer_id``."""
        self.send_produce(producer_id)
        return produce_partition_errors(decode_produce(self.conn.recv_frame(), PRODUCE_VERSION))

    def expect_closed(self) -> bytes:
        return self.conn.expect_closed(timeout_s=8)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def decisions() -> Decisions:
    return Decisions()


# -- 1. real clients, per-principal throttling --------------------------------------------------


def test_real_clients_are_throttled_per_sasl_principal(decisions: Decisions) -> None:
    with (
        ScriptedSaslBroker(USERS, mechanisms=("PLAIN", "SCRAM-SHA-256")) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        alice_pw, bob_pw = USERS["alice"], USERS["bob"]
        confluent_delivers(pidgate.bootstrap, "PLAIN", "alice", alice_pw)
        assert len(produced_pids(broker, "alice")) == 1

        # A second alice producer (a second new PID this hour) is throttled while bob, who has
        # his own quota, keeps producing.
        throttled: dict[str, Any] = {}

        def second_alice() -> None:
            producer = kafka_python_producer(
                pidgate.bootstrap,
                "SCRAM-SHA-256",
                "alice",
                alice_pw,
                delivery_timeout_ms=4000,
                request_timeout_ms=2000,
            )
            try:
                producer.send(TOPIC, b"alice-second").get(timeout=10)
                throttled["error"] = None
            except Exception as error:
                throttled["error"] = error
            finally:
                producer.close(timeout=3)

        alice_thread = threading.Thread(target=second_alice, daemon=True)
        alice_thread.start()
        wait_until(lambda: bool(decisions.rejected(ALICE)), 10, "alice's second PID throttled")
        confluent_delivers(pidgate.bootstrap, "PLAIN", "bob", bob_pw)
        confluent_delivers(pidgate.bootstrap, "SCRAM-SHA-256", "bob", bob_pw)
        kafka_python_delivers(pidgate.bootstrap, "PLAIN", "bob", bob_pw)
        kafka_python_delivers(pidgate.bootstrap, "SCRAM-SHA-256", "bob", bob_pw)
        alice_thread.join(15)
        assert not alice_thread.is_alive()

        # alice's second producer never got its record in within its delivery timeout.
        assert throttled["error"] is not None
        alice_pids, bob_pids = produced_pids(broker, "alice"), produced_pids(broker, "bob")
        assert len(alice_pids) == 1
        assert len(bob_pids) == 4
        assert {p.user for p in broker.produced} == {"alice", "bob"}
        # pidgate charged exactly what the broker saw each user produce...
        assert decisions.admitted(ALICE) == alice_pids
        assert decisions.admitted(BOB) == bob_pids
        # ...refused alice's second PID only, and never bob.
        assert decisions.rejected(ALICE) and not decisions.rejected(ALICE) & alice_pids
        assert decisions.rejected(BOB) == set()
        assert decisions.principals() == {ALICE, BOB}
        counters = pidgate.server.counters
        assert counters.produce_requests_rejected > 0
        assert counters.new_producer_ids_admitted == 5
        assert set(counters.rejections_by_client_software) == {"kafka-python"}
        assert tracked_principals(pidgate) == {ALICE, BOB}  # no User:ANONYMOUS


# -- 2. wrong password ---------------------------------------------------------------------------


def test_wrong_password_never_sets_a_principal(decisions: Decisions) -> None:
    # The broker closes 1 s after a failure: time for a Produce to reach pidgate first.
    with (
        ScriptedSaslBroker(USERS, failed_auth_close_delay_ms=1000) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        errors: list[Any] = []
        producer = confluent_producer(
            pidgate.bootstrap, "SCRAM-SHA-256", "bob", USERS["alice"], errors
        )
        producer.produce(TOPIC, b"never")
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not errors:
            producer.poll(0.1)
        producer.purge()
        del producer
        assert errors and errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION

        raw = Raw(pidgate.bootstrap)
        try:
            response = raw.plain_login("bob", "not-bobs-password")
            assert response.error_code == SASL_AUTHENTICATION_FAILED
            raw.send_produce(4242)  # after the failure: pidgate closes, charges nobody
            assert raw.expect_closed() == b""
        finally:
            raw.close()

        assert AuthEvent("bob", "PLAIN", False) in broker.auth_log
        assert not any(event.success for event in broker.auth_log)
        assert broker.produced == []
        assert decisions.events == []
        assert tracked_principals(pidgate) == set()
        wait_until(lambda: open_connections(pidgate) == 0, 5, "pidgate closed both connections")


# -- 3. KIP-368 re-authentication on one connection -------------------------------------------


def test_reauthentication_changes_the_principal_only_on_success(decisions: Decisions) -> None:
    with (
        ScriptedSaslBroker(
            USERS,
            session_lifetime_ms=60_000,
            allow_principal_change=True,
            failed_auth_close_delay_ms=1000,
        ) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        # Connection 1: alice, then a failed re-authentication as bob.
        raw = Raw(pidgate.bootstrap)
        try:
            raw.api_versions()
            login = raw.plain_login("alice", USERS["alice"])
            assert login.error_code == 0 and login.session_lifetime_ms == 60_000
            first = raw.init_producer_id()
            assert raw.produce(first) == [0]
            assert decisions.admitted(ALICE) == {first}
            assert produced_pids(broker, "alice") == {first}

            second = raw.init_producer_id()  # fetched now: after the failure there is no time
            assert raw.handshake("PLAIN") == 0
            failed = raw.authenticate(plain_token("bob", "wrong-password"))
            assert failed.error_code == SASL_AUTHENTICATION_FAILED
            # Sent before the broker closes (1 s after the failure): pidgate still charges
            # alice, whose quota of 1 is spent, so it is refused; bob's would have admitted it.
            raw.send_produce(second)
            assert raw.conn.recv_frame()  # pidgate's own throttling answer
            raw.expect_closed()  # then the broker ends the connection
        finally:
            raw.close()
        assert decisions.rejected(ALICE) == {second}
        assert BOB not in decisions.principals()
        assert produced_pids(broker, "bob") == set()
        assert second not in produced_pids(broker, "alice")

        # Connection 2: alice, then a successful re-authentication as bob.
        raw = Raw(pidgate.bootstrap)
        try:
            assert raw.plain_login("alice", USERS["alice"]).error_code == 0
            assert raw.handshake("PLAIN") == 0
            assert raw.authenticate(plain_token("bob", USERS["bob"])).error_code == 0
            third = raw.init_producer_id()
            assert raw.produce(third) == [0]
        finally:
            raw.close()
        assert decisions.admitted(BOB) == {third}
        assert produced_pids(broker, "bob") == {third}
        assert decisions.admitted(ALICE) == {first}
        assert tracked_principals(pidgate) == {ALICE, BOB}


# -- 4. Produce before the broker's success -------------------------------------------------------


@pytest.mark.parametrize("when", ["without_handshake", "after_handshake", "pipelined_with_auth"])
def test_produce_before_sasl_success_closes_and_charges_nobody(
    decisions: Decisions, when: str
) -> None:
    with ScriptedSaslBroker(USERS) as broker, sasl_pidgate(broker, decisions) as pidgate:
        raw = Raw(pidgate.bootstrap)
        try:
            raw.api_versions()
            if when != "without_handshake":
                assert raw.handshake("PLAIN") == 0
            if when == "pipelined_with_auth":
                # Correct credentials, but the Produce is read before the broker's verdict:
                # both frames go in one write, so pidgate reads them together (sent apart, the
                # verdict could come back first and the Produce would rightly be forwarded).
                authenticate = encode_request(
                    SaslAuthenticateRequest(auth_bytes=plain_token("alice", USERS["alice"])),
                    1,
                    raw.next_cid(),
                )
                produce = produce_frame(TOPIC, 4242, raw.next_cid(), PRODUCE_VERSION)
                raw.conn.sendall(authenticate + produce)
            else:
                raw.send_produce(4242)
            assert raw.expect_closed() == b""
        finally:
            raw.close()
        assert broker.produced == []
        assert not any(seen.api_key == 0 for seen in broker.requests)  # never forwarded
        assert decisions.events == []
        assert tracked_principals(pidgate) == set()


def test_v0_handshake_raw_tokens_set_the_principal(decisions: Decisions) -> None:
    with (
        ScriptedSaslBroker(USERS, handshake_max_version=0) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        # A Produce where the raw token should be: not a token the broker accepts, so closed.
        early = Raw(pidgate.bootstrap)
        try:
            assert early.handshake("PLAIN", version=0) == 0
            early.send_produce(4242)
            assert early.expect_closed() == b""
        finally:
            early.close()
        assert decisions.events == [] and broker.produced == []

        raw = Raw(pidgate.bootstrap)
        try:
            raw.api_versions()
            assert raw.handshake("PLAIN", version=0) == 0
            send_raw_sasl_token(raw.conn, plain_token("alice", USERS["alice"]))
            assert raw.conn.recv_frame() == b""  # the broker's empty token: success
            pid = raw.init_producer_id()
            assert raw.produce(pid) == [0]
        finally:
            raw.close()
        assert decisions.admitted(ALICE) == {pid}
        assert produced_pids(broker, "alice") == {pid}

        # A real client on the v0 framing (librdkafka falls back to it).
        confluent_delivers(pidgate.bootstrap, "SCRAM-SHA-256", "bob", USERS["bob"])
        assert len(decisions.admitted(BOB)) == 1
        assert decisions.admitted(BOB) == produced_pids(broker, "bob")
        assert tracked_principals(pidgate) == {ALICE, BOB}


# -- 5. spoofing -----------------------------------------------------------------------------------


def test_plain_authzid_never_becomes_the_principal(decisions: Decisions) -> None:
    with (
        ScriptedSaslBroker(USERS, failed_auth_close_delay_ms=1000) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        raw = Raw(pidgate.bootstrap)
        try:
            assert raw.handshake("PLAIN") == 0
            token = plain_token("alice", USERS["alice"], authzid="admin")
            response = raw.authenticate(token)
            if response.error_code == 0:  # a broker that allows it: alice pays, not admin
                pid = raw.init_producer_id()
                raw.produce(pid)
                assert decisions.principals() == {ALICE}
            else:  # refused: a Produce right after is closed by pidgate, charged to nobody
                raw.send_produce(4242)
                assert raw.expect_closed() == b""
                assert decisions.events == []
        finally:
            raw.close()
        assert "User:admin" not in decisions.principals()
        assert "User:admin" not in tracked_principals(pidgate)
        assert all(p.user != "admin" for p in broker.produced)


def test_scram_with_a_failing_proof_is_never_charged(decisions: Decisions) -> None:
    with (
        ScriptedSaslBroker(USERS, failed_auth_close_delay_ms=1000) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
    ):
        raw = Raw(pidgate.bootstrap)
        try:
            final = raw.scram_login(ScramClient("alice", "not-alices-password"))
            assert final.error_code == SASL_AUTHENTICATION_FAILED
            raw.send_produce(4242)  # before the broker closes: pidgate closes, charges nobody
            assert raw.expect_closed() == b""
        finally:
            raw.close()
        assert broker.auth_log == [AuthEvent("alice", "SCRAM-SHA-256", False)]
        assert decisions.events == []
        assert broker.produced == []
        assert tracked_principals(pidgate) == set()


@pytest.mark.parametrize("then", ["closes", "produces"])
def test_client_that_stops_mid_exchange_leaves_nothing(decisions: Decisions, then: str) -> None:
    with ScriptedSaslBroker(USERS) as broker, sasl_pidgate(broker, decisions) as pidgate:
        raw = Raw(pidgate.bootstrap)
        try:
            assert raw.handshake("SCRAM-SHA-256") == 0
            first = raw.authenticate(ScramClient("alice", USERS["alice"]).client_first())
            assert first.error_code == 0
            assert open_connections(pidgate) == 1
            if then == "produces":  # the real name was sent, the proof never was
                raw.send_produce(4242)
                assert raw.expect_closed() == b""
        finally:
            raw.close()
        wait_until(lambda: open_connections(pidgate) == 0, 5, "pidgate dropped the connection")
        assert not any(event.success for event in broker.auth_log)
        assert decisions.events == []
        assert broker.produced == []
        assert tracked_principals(pidgate) == set()


# -- 6. credentials never leak -----------------------------------------------------------------


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


_DUMP_SKIP = {"_context", "_settings", "_upstream_targets", "_client"}


def deep_repr(obj: object, depth: int = 0, seen: set[int] | None = None) -> str:
    """repr of ``obj`` and, for pidgate's own objects, of every attribute (slots too)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 5:
        return ""
    seen.add(id(obj))
    parts = [repr(obj)]
    if isinstance(obj, dict):
        parts += [deep_repr(v, depth + 1, seen) for v in obj.values()]
    elif isinstance(obj, list | tuple | set | frozenset) or type(obj).__name__ == "deque":
        parts += [deep_repr(v, depth + 1, seen) for v in obj]  # type: ignore[attr-defined]
    elif type(obj).__module__.startswith("pidgate"):
        attributes = dict(getattr(obj, "__dict__", {}))
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                attributes.setdefault(name, getattr(obj, name, None))
        for name, value in attributes.items():
            if name not in _DUMP_SKIP:
                parts.append(f"{name}={deep_repr(value, depth + 1, seen)}")
    return "\n".join(parts)


def test_credentials_never_reach_logs_or_state(tmp_path: Path, decisions: Decisions) -> None:
    good_jwt, bad_jwt = unsigned_jwt("svc"), unsigned_jwt("evil")
    secrets = [*USERS.values(), "pw-WRONG-SECRET-3", "pw-WRONG-SECRET-4", good_jwt, bad_jwt]
    secrets += [jwt.split(".")[1] for jwt in (good_jwt, bad_jwt)]  # the claims segment
    with (
        pidgate_logs(tmp_path / "pidgate.log") as log_path,
        ScriptedSaslBroker(USERS, oauth_subjects={"svc"}) as broker,
        sasl_pidgate(broker, decisions) as pidgate,
        contextlib.ExitStack() as open_clients,
    ):
        errors: list[Any] = []
        confluent = confluent_producer(pidgate.bootstrap, "PLAIN", "alice", USERS["alice"], errors)
        confluent.produce(TOPIC, b"x")
        assert confluent.flush(10) == 0
        kafka_python = kafka_python_producer(
            pidgate.bootstrap, "SCRAM-SHA-256", "bob", USERS["bob"]
        )
        open_clients.callback(kafka_python.close, 3)
        kafka_python.send(TOPIC, b"y").get(timeout=10)

        def raw() -> Raw:
            connection = Raw(pidgate.bootstrap)
            open_clients.callback(connection.close)
            return connection

        scram = ScramClient("alice", USERS["alice"])
        alice = raw()
        assert alice.scram_login(scram).error_code == 0
        assert alice.produce(alice.init_producer_id()) != [0]  # alice's second PID: throttled
        svc = raw()
        assert svc.handshake("OAUTHBEARER") == 0
        assert svc.authenticate(oauthbearer_token(good_jwt)).error_code == 0
        assert svc.produce(svc.init_producer_id()) == [0]
        secrets += [scram.proof, scram.final_message]

        wrong_scram = ScramClient("bob", "pw-WRONG-SECRET-4")
        failures = [raw() for _ in range(4)]
        assert failures[0].plain_login("alice", "pw-WRONG-SECRET-3").error_code != 0
        assert failures[1].scram_login(wrong_scram).error_code != 0
        secrets += [wrong_scram.proof, wrong_scram.final_message]
        assert failures[2].handshake("OAUTHBEARER") == 0
        assert failures[2].authenticate(oauthbearer_token(bad_jwt)).error_code == 0  # challenge
        assert failures[2].authenticate(b"\x01").error_code != 0
        # Bad input carrying a password: a SaslAuthenticate version pidgate never advertised.
        frame = bytearray(
            encode_request(
                SaslAuthenticateRequest(auth_bytes=plain_token("bob", USERS["bob"])), 2, 1
            )
        )
        frame[6:8] = b"\x00\x07"  # api_version 7
        failures[3].conn.sendall(bytes(frame))
        for failed in failures:
            with contextlib.suppress(ConnectionClosed):
                failed.expect_closed()

        # Everything pidgate holds about the live connections (alice, svc, both producers).
        state = on_loop(
            pidgate,
            lambda: [
                deep_repr(conn) + deep_repr(conn._upstream)
                for conn in pidgate.server.context.connections
            ],
        )
        assert len(state) >= 3
        snapshot = on_loop(pidgate, lambda: pidgate.server.quota.snapshot(quota_clock_ms()))
        counters = pidgate.server.counters
        exposed = {
            "connections": "\n".join(state),
            "snapshot": repr(snapshot),
            "counters": repr(counters) + repr(vars(counters)),
        }
        del confluent
    logs = log_path.read_text(encoding="utf-8")
    exposed["logs"] = logs

    # The capture works and names who was authenticated and throttled.
    for event in ("principal_authenticated", "pid_throttled"):
        assert event in logs
    for principal in (ALICE, BOB, "User:svc"):
        assert principal in logs
    assert {state.principal for state in snapshot} == {ALICE, BOB}

    for where, text in exposed.items():
        for secret in secrets:
            assert secret not in text, f"a credential ({secret[:6]}...) leaked into {where}"
        assert ",p=" not in text, f"a SCRAM client-final message leaked into {where}"
