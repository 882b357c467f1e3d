"""A scripted Kafka broker with a SASL listener, for tests: tansu has no SASL.

``ScriptedSaslBroker`` listens on 127.0.0.1 (random port), one thread per connection, every socket
with a timeout, and behaves like a single-node Kafka broker's SASL_PLAINTEXT (or, given an
``ssl_context``, SASL_SSL) listener, as far as producers need:

* before authentication: ApiVersions and SaslHandshake only; any other request closes the
  connection (Kafka's SaslServerAuthenticator: "Unexpected Kafka request of type ... during SASL
  handshake"). A disabled mechanism gets UNSUPPORTED_SASL_MECHANISM (33) and the connection is
  closed.
* SaslHandshake v0: raw size-prefixed tokens follow, a failure closes the connection. v1:
  SaslAuthenticate (v0-v2), a failure answers SASL_AUTHENTICATION_FAILED (58) and closes.
* the connection closes ``failed_auth_close_delay_ms`` (Kafka's
  connections.failed.authentication.delay.ms, default 100) after a failed authentication.
* mechanisms: PLAIN and SCRAM-SHA-256/512 checked against ``users`` (a real RFC 5802 server:
  unknown user or wrong proof fails), OAUTHBEARER with an (unsigned) JWT whose ``sub`` is in
  ``oauth_subjects`` (otherwise the RFC 7628 error challenge, then failure, as Kafka does).
* ``session_lifetime_ms`` > 0: SaslAuthenticate v1+ announces it (KIP-368); a request other than
  SaslHandshake after the session expired closes the connection; a SaslHandshake v1 +
  SaslAuthenticate on an authenticated connection re-authenticates (same mechanism and principal,
  as Kafka insists).
* after authentication: ApiVersions, Metadata (this broker as the only node and leader; requested
  topics are auto-created), CreateTopics, InitProducerId (increasing PIDs, epoch 0, or the epoch
  bumped for a known PID) and Produce (every partition error 0, increasing offsets; acks=0 gets no
  answer). Anything else is recorded in ``unhandled`` and closes the connection.

What happened is observable, thread-safely: ``produced`` (one ``Produced(user, topic, partition,
producer_ids)`` per partition of every Produce request), ``auth_log`` (``AuthEvent(user,
mechanism, success)``; user is the attempted one on failure, None if unknown) and ``requests``
(``RequestSeen(user, api_key, api_version)`` of every Kafka request; user is None until the
connection is authenticated, so a SaslHandshake with a user is a re-authentication). Responses
are encoded with kafka-python's protocol classes; Produce bodies are read with pidgate's own
parser. ApiVersions also advertises Fetch 4-12 (never answered): librdkafka writes RecordBatch v2,
and so producer ids, only to brokers that have it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import re
import secrets
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from pidgate.protocol.framing import FrameDecoder
from pidgate.protocol.headers import parse_request_header
from pidgate.protocol.produce import parse_produce_request

HOST = "127.0.0.1"
ALL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")

PRODUCE = 0
FETCH = 1
METADATA = 3
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
INIT_PRODUCER_ID = 22
SASL_AUTHENTICATE = 36

UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
ILLEGAL_SASL_STATE = 34

_SCRAM_ITERATIONS = 4096  # Kafka's minimum


class Produced(NamedTuple):
    user: str | None
    topic: str
    partition: int
    producer_ids: tuple[int, ...]  # distinct, sorted; -1 (no PID) left out


class AuthEvent(NamedTuple):
    user: str | None
    mechanism: str
    success: bool


class RequestSeen(NamedTuple):
    user: str | None  # None before authentication
    api_key: int
    api_version: int


class _Close(Exception):
    """End this connection (after sending whatever was already sent)."""


# -- SASL mechanisms (server side) --------------------------------------------------------------

Step = tuple[bytes, bool, bool]  # (reply token, done, ok)


class _Plain:
    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self.user: str | None = None

    def step(self, token: bytes) -> Step:
        parts = token.split(b"\0")
        if len(parts) != 3:
            return b"", True, False
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        self.user = user
        expected = self.users.get(user)
        ok = (
            expected is not None
            and authzid in ("", user)
            and hmac.compare_digest(expected.encode(), password.encode())
        )
        return b"", True, ok


def _scram_unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class _Scram:
    """RFC 5802 server: unknown user fails at client-first, a wrong proof at client-final."""

    def __init__(self, mechanism: str, users: Mapping[str, str], salt: bytes) -> None:
        self.hash = hashlib.sha256 if mechanism.endswith("256") else hashlib.sha512
        self.users = users
        self.salt = salt
        self.user: str | None = None
        self.stage = 0
        self.gs2 = b""
        self.nonce = b""
        self.auth_message = b""

    def step(self, token: bytes) -> Step:
        if self.stage == 0:
            # gs2 header, then the bare message. Greedy on the name so that a client which does
            # not escape ',' in user names (kafka-python) still gets an answer.
            m = re.match(rb"^([ny][^,]*,[^,]*,)(n=(.*),r=([^,]*)(?:,.*)?)$", token, re.S)
            if not m:
                return b"", True, False
            self.gs2, bare, name, cnonce = m.groups()
            self.user = _scram_unescape(name.decode("utf-8", "replace"))
            if self.user not in self.users:
                return b"", True, False  # Kafka: "Invalid user credentials"
            self.nonce = cnonce + secrets.token_hex(12).encode()
            server_first = b"r=%s,s=%s,i=%d" % (
                self.nonce,
                base64.b64encode(self.salt),
                _SCRAM_ITERATIONS,
            )
            self.auth_message = bare + b"," + server_first
            self.stage = 1
            return server_first, False, True
        self.stage = 2
        without_proof, _, proof_b64 = token.rpartition(b",p=")
        fields = dict(
            f.split(b"=", 1) for f in without_proof.split(b",") if b"=" in f
        )  # c=..., r=...
        if fields.get(b"r") != self.nonce or fields.get(b"c") != base64.b64encode(self.gs2):
            return b"", True, False
        assert self.user is not None
        password = self.users[self.user]
        salted = hashlib.pbkdf2_hmac(
            self.hash().name, password.encode(), self.salt, _SCRAM_ITERATIONS
        )
        auth_message = self.auth_message + b"," + without_proof
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = self.hash(client_key).digest()
        signature = hmac.new(stored_key, auth_message, self.hash).digest()
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            return b"", True, False
        if len(proof) != len(signature):
            return b"", True, False
        recovered_client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(self.hash(recovered_client_key).digest(), stored_key):
            return b"", True, False
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        server_sig = hmac.new(server_key, auth_message, self.hash).digest()
        return b"v=" + base64.b64encode(server_sig), True, True


def jwt_sub(jwt: str) -> str | None:
    """The ``sub`` claim of a JWT (signature not checked), or None."""
    try:
        payload = jwt.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) else None


def unsigned_jwt(sub: str, **claims: Any) -> str:
    """An ``alg: none`` JWT for ``sub`` (expires in 2100), for OAUTHBEARER clients."""

    def b64(obj: dict[str, Any]) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    body = {"sub": sub, "iat": int(time.time()), "exp": 4102444800, **claims}
    return f"{b64({'alg': 'none'})}.{b64(body)}."


class _OAuthBearer:
    """RFC 7628: a bad token gets the JSON error challenge; the client's 0x01 then fails."""

    def __init__(self, subjects: Iterable[str]) -> None:
        self.subjects = frozenset(subjects)
        self.user: str | None = None
        self.failed = False

    def step(self, token: bytes) -> Step:
        if self.failed:
            return b"", True, False
        m = re.search(rb"\x01auth=Bearer ([^\x01]+)\x01", token)
        sub = jwt_sub(m.group(1).decode("ascii", "replace")) if m else None
        self.user = sub
        if token.startswith((b"n,", b"y,")) and sub is not None and sub in self.subjects:
            return b"", True, True
        self.failed = True
        return b'{"status":"invalid_token"}', False, True


# -- the broker -----------------------------------------------------------------------------------


def _default_api_versions(handshake_max: int) -> dict[int, tuple[int, int]]:
    return {
        PRODUCE: (3, 9),
        # Advertised, never answered (a Fetch closes the connection): librdkafka only writes
        # RecordBatch v2 (and so producer ids) to brokers with Produce >= 3 AND Fetch >= 4;
        # otherwise it sends magic-0 message sets even when idempotent.
        FETCH: (4, 12),
        METADATA: (0, 12),
        SASL_HANDSHAKE: (0, handshake_max),
        API_VERSIONS: (0, 3),
        CREATE_TOPICS: (2, 7),
        INIT_PRODUCER_ID: (0, 4),
        SASL_AUTHENTICATE: (0, 2),
    }


class _Topic(NamedTuple):
    topic_id: uuid.UUID
    partitions: int


class ScriptedSaslBroker:
    """A fake single-node Kafka broker with a SASL listener. See the module docstring.

    ``with ScriptedSaslBroker(users={"alice": "pw"}) as broker: ... broker.bootstrap``
    """

    def __init__(
        self,
        users: Mapping[str, str] | None = None,
        *,
        oauth_subjects: Iterable[str] = (),
        mechanisms: Iterable[str] = ALL_MECHANISMS,
        handshake_max_version: int = 1,
        session_lifetime_ms: int = 0,
        node_id: int = 1,
        partitions: int = 1,
        topics: Iterable[str] = (),
        auto_create_topics: bool = True,
        first_producer_id: int = 1000,
        api_versions: Mapping[int, tuple[int, int]] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        require_sasl: bool = True,
        allow_principal_change: bool = False,
        failed_auth_close_delay_ms: int = 100,
        socket_timeout_s: float = 10.0,
        cluster_id: str = "pidgate-sasl-broker",
        pid_step: int = 1,
    ) -> None:
        if handshake_max_version not in (0, 1):
            raise ValueError("handshake_max_version must be 0 or 1")
        self.users = dict(users or {})
        self.oauth_subjects = frozenset(oauth_subjects)
        self.mechanisms = tuple(mechanisms)
        self.handshake_max_version = handshake_max_version
        self.session_lifetime_ms = session_lifetime_ms
        self.node_id = node_id
        self.default_partitions = partitions
        self.auto_create_topics = auto_create_topics
        self.api_versions = dict(api_versions or _default_api_versions(handshake_max_version))
        self.ssl_context = ssl_context
        self.require_sasl = require_sasl
        self.allow_principal_change = allow_principal_change
        self.failed_auth_close_delay_ms = failed_auth_close_delay_ms
        self.socket_timeout_s = socket_timeout_s
        self.cluster_id = cluster_id
        self._scram_salt = secrets.token_bytes(16)

        self._lock = threading.Lock()
        self._topics: dict[str, _Topic] = {}
        for name in topics:
            self._topics[name] = _Topic(uuid.uuid4(), partitions)
        self._offsets: dict[tuple[str, int], int] = {}
        self._next_pid = first_producer_id
        #: Added to the next PID after each allocation (-1: a broker that does not allocate in
        #: increasing order).
        self.pid_step = pid_step
        #: Other scripted brokers listed in this one's Metadata answers (a scripted cluster).
        self.peers: list[ScriptedSaslBroker] = []
        self._produced: list[Produced] = []
        self._auth_log: list[AuthEvent] = []
        self._requests: list[RequestSeen] = []
        self._unhandled: list[RequestSeen] = []
        self._connections = 0
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopped = threading.Event()

        self._listen = socket.socket()
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listen.bind((HOST, 0))
        self._listen.listen(64)
        self._listen.settimeout(0.2)
        self.port = int(self._listen.getsockname()[1])
        self._acceptor: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> ScriptedSaslBroker:
        if self._acceptor is None:
            self._acceptor = threading.Thread(
                target=self._accept_loop, name=f"sasl-broker-{self.port}", daemon=True
            )
            self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listen.close()
        if self._acceptor is not None:
            self._acceptor.join(timeout=5)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        for t in threads:
            t.join(timeout=5)

    def __enter__(self) -> ScriptedSaslBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observations -------------------------------------------------------------------------

    @property
    def produced(self) -> list[Produced]:
        with self._lock:
            return list(self._produced)

    @property
    def auth_log(self) -> list[AuthEvent]:
        with self._lock:
            return list(self._auth_log)

    @property
    def requests(self) -> list[RequestSeen]:
        with self._lock:
            return list(self._requests)

    @property
    def unhandled(self) -> list[RequestSeen]:
        with self._lock:
            return list(self._unhandled)

    @property
    def connections(self) -> int:
        """Connections accepted so far."""
        with self._lock:
            return self._connections

    @property
    def topics(self) -> dict[str, int]:
        """topic -> partition count."""
        with self._lock:
            return {name: t.partitions for name, t in self._topics.items()}

    def topics_by_name(self) -> dict[str, _Topic]:
        with self._lock:
            return dict(self._topics)

    def wait_for(self, predicate: Callable[[ScriptedSaslBroker], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return predicate(self)

    # -- connections --------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._listen.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(self.socket_timeout_s)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._connections += 1
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    def _serve(self, raw_conn: socket.socket) -> None:
        conn: socket.socket = raw_conn
        try:
            tls_user: str | None = None
            if self.ssl_context is not None:
                conn = self.ssl_context.wrap_socket(raw_conn, server_side=True)
                with self._lock:
                    self._conns.append(conn)
                tls_user = _peer_subject(conn)
            _Connection(self, conn, tls_user).run()
        except (OSError, _Close, ssl.SSLError):
            pass
        finally:
            for c in (conn, raw_conn):
                with contextlib.suppress(OSError):
                    c.close()

    # -- shared state helpers (used by _Connection) -------------------------------------------

    def _log_auth(self, event: AuthEvent) -> None:
        with self._lock:
            self._auth_log.append(event)

    def _mechanism(self, name: str) -> _Plain | _Scram | _OAuthBearer:
        if name == "PLAIN":
            return _Plain(self.users)
        if name.startswith("SCRAM-"):
            return _Scram(name, self.users, self._scram_salt)
        return _OAuthBearer(self.oauth_subjects)

    def _ensure_topic(self, name: str, create: bool) -> _Topic | None:
        with self._lock:
            topic = self._topics.get(name)
            if topic is None and create:
                topic = self._topics[name] = _Topic(uuid.uuid4(), self.default_partitions)
            return topic

    def _new_pid(self) -> int:
        with self._lock:
            pid = self._next_pid
            self._next_pid += self.pid_step
            return pid


_RDN_SHORT = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O"}


def _peer_subject(conn: ssl.SSLSocket) -> str | None:
    """The client certificate's subject as Kafka's SSL principal shows it (``CN=..,OU=..,O=..``)."""
    cert = conn.getpeercert()
    if not cert:
        return None
    rdns = [f"{_RDN_SHORT.get(k, k)}={v}" for rdn in reversed(cert["subject"]) for k, v in rdn]
    return ",".join(rdns)


def _encode(msg: Any, version: int, correlation_id: int) -> bytes:
    msg.API_VERSION = version  # before with_header: kafka-python's setter trips over a header
    msg.with_header(correlation_id=correlation_id)
    return bytes(msg.encode(header=True, framed=True))


class _Connection:
    def __init__(self, broker: ScriptedSaslBroker, conn: socket.socket, tls_user: str | None):
        self.broker = broker
        self.conn = conn
        self.decoder = FrameDecoder(max_frame_bytes=64 << 20)
        # states: initial -> (raw | authenticate) -> authenticated [-> authenticate (re-auth)]
        self.state = "initial"
        self.user: str | None = None
        self.mechanism = ""
        self.sasl: _Plain | _Scram | _OAuthBearer | None = None
        self.verdict_logged = False
        self.reauth = False
        self.expires_at: float | None = None
        if not broker.require_sasl:
            self.state = "authenticated"
            self.user = tls_user or "ANONYMOUS"

    def send(self, framed: bytes) -> None:
        self.conn.sendall(framed)

    def run(self) -> None:
        while data := self.conn.recv(65536):
            for payload in self.decoder.feed(data):
                self.handle(bytes(payload[4:]))

    def handle(self, payload: bytes) -> None:
        if self.state == "raw":
            self.raw_token(payload)
            return
        try:
            hdr = parse_request_header(payload)
        except Exception as exc:
            raise _Close from exc
        with self.broker._lock:
            self.broker._requests.append(
                RequestSeen(
                    self.user if self.state == "authenticated" else None,
                    hdr.api_key,
                    hdr.api_version,
                )
            )
        body = payload[hdr.header_bytes :]
        key, version, cid = hdr.api_key, hdr.api_version, hdr.correlation_id
        supported = self.broker.api_versions.get(key)
        if key != API_VERSIONS and (
            supported is None or not supported[0] <= version <= supported[1]
        ):
            self.unhandled(key, version)
        if self.state == "initial":
            if key == API_VERSIONS:
                self.api_versions(version, cid)
            elif key == SASL_HANDSHAKE:
                self.handshake(version, cid, body)
            else:
                raise _Close(f"Unexpected Kafka request of type {key} during SASL handshake")
        elif self.state == "authenticate":
            if key != SASL_AUTHENTICATE:
                raise _Close(f"Unexpected Kafka request of type {key} during SASL authentication")
            self.authenticate(version, cid, body)
        else:  # authenticated
            if key == SASL_HANDSHAKE:
                self.handshake(version, cid, body)
                return
            if self.expires_at is not None and time.monotonic() > self.expires_at:
                raise _Close("session expired")
            if key == API_VERSIONS:
                self.api_versions(version, cid)
            elif key == METADATA:
                self.metadata(version, cid, body)
            elif key == INIT_PRODUCER_ID:
                self.init_producer_id(version, cid, body)
            elif key == PRODUCE:
                self.produce(version, cid, body)
            elif key == CREATE_TOPICS:
                self.create_topics(version, cid, body)
            else:
                self.unhandled(key, version)

    def unhandled(self, key: int, version: int) -> None:
        with self.broker._lock:
            self.broker._unhandled.append(RequestSeen(self.user, key, version))
        raise _Close(f"unhandled request {key} v{version}")

    # -- SASL -----------------------------------------------------------------------------------

    def api_versions(self, version: int, cid: int) -> None:
        if version > 3:  # newer than we speak: v0 UNSUPPORTED_VERSION listing ours (KIP-511)
            r = ApiVersionsResponse(
                error_code=UNSUPPORTED_VERSION,
                api_keys=[
                    ApiVersionsResponse.ApiVersion(
                        api_key=API_VERSIONS, min_version=0, max_version=3
                    )
                ],
            )
            self.send(_encode(r, 0, cid))
            return
        keys = [
            ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
            for k, (lo, hi) in sorted(self.broker.api_versions.items())
        ]
        r = ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0)
        self.send(_encode(r, version, cid))

    def handshake(self, version: int, cid: int, body: bytes) -> None:
        mechanism = SaslHandshakeRequest.decode(body, version=version).mechanism
        enabled = list(self.broker.mechanisms)
        if self.state == "authenticated":
            # KIP-368 re-authentication: v1+ only, same mechanism.
            if version == 0 or mechanism != self.mechanism:
                self.send(
                    _encode(
                        SaslHandshakeResponse(
                            error_code=ILLEGAL_SASL_STATE
                            if version == 0
                            else UNSUPPORTED_SASL_MECHANISM,
                            mechanisms=enabled,
                        ),
                        version,
                        cid,
                    )
                )
                raise _Close("bad re-authentication handshake")
            self.reauth = True
        elif mechanism not in enabled:
            self.send(
                _encode(
                    SaslHandshakeResponse(
                        error_code=UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled
                    ),
                    version,
                    cid,
                )
            )
            raise _Close(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.sasl = self.broker._mechanism(mechanism)
        self.send(_encode(SaslHandshakeResponse(error_code=0, mechanisms=enabled), version, cid))
        self.state = "raw" if version == 0 else "authenticate"

    def raw_token(self, token: bytes) -> None:
        assert self.sasl is not None
        reply, done, ok = self.sasl.step(token)
        if not ok:
            self.finish(False)
            raise _Close("authentication failed (v0)")
        if done:
            self.log_verdict(True)
        self.send(struct.pack(">i", len(reply)) + reply)
        if done:
            self.finish(True)

    def authenticate(self, version: int, cid: int, body: bytes) -> None:
        assert self.sasl is not None
        token = bytes(SaslAuthenticateRequest.decode(body, version=version).auth_bytes)
        reply, done, ok = self.sasl.step(token)
        if ok and done and self.reauth:
            ok = self.broker.allow_principal_change or self.sasl.user == self.user
        lifetime = self.broker.session_lifetime_ms if ok and done else 0
        r = SaslAuthenticateResponse(
            error_code=0 if ok else SASL_AUTHENTICATION_FAILED,
            error_message=None
            if ok
            else "Authentication failed during authentication due to invalid credentials "
            f"with SASL mechanism {self.mechanism}",
            auth_bytes=reply if ok else b"",
            session_lifetime_ms=lifetime,
        )
        if done or not ok:
            self.log_verdict(ok)
        self.send(_encode(r, version, cid))
        if not ok:
            self.finish(False)
            raise _Close("authentication failed")
        if done:
            self.finish(True)

    def log_verdict(self, ok: bool) -> None:
        """Recorded before the verdict is sent, so a test that saw the answer (or the close that
        follows it) always finds the event in ``auth_log``."""
        assert self.sasl is not None
        if not self.verdict_logged:
            self.verdict_logged = True
            self.broker._log_auth(AuthEvent(self.sasl.user, self.mechanism, ok))

    def finish(self, ok: bool) -> None:
        assert self.sasl is not None
        self.log_verdict(ok)
        self.verdict_logged = False  # a re-authentication logs its own verdict
        if not ok:
            # Kafka's connections.failed.authentication.delay.ms (default 100): without it,
            # kafka-python may see the close before the error response and report neither.
            time.sleep(self.broker.failed_auth_close_delay_ms / 1000)
            return
        self.user = self.sasl.user
        self.state = "authenticated"
        self.reauth = False
        lifetime = self.broker.session_lifetime_ms
        self.expires_at = time.monotonic() + lifetime / 1000 if lifetime > 0 else None

    # -- after authentication -------------------------------------------------------------------

    def broker_entry(self) -> Any:
        return MetadataResponse.MetadataResponseBroker(
            node_id=self.broker.node_id, host=HOST, port=self.broker.port, rack=None
        )

    def metadata(self, version: int, cid: int, body: bytes) -> None:
        req = MetadataRequest.decode(body, version=version)
        auto = self.broker.auto_create_topics and (
            version < 4 or bool(req.allow_auto_topic_creation)
        )
        if req.topics is None or (version == 0 and not req.topics):
            names = sorted(self.broker.topics)
        else:
            by_id = {t.topic_id: n for n, t in self.broker.topics_by_name().items()}
            names = [
                t.name if t.name is not None else by_id.get(t.topic_id, "") for t in req.topics
            ]
        node = self.broker.node_id
        T = MetadataResponse.MetadataResponseTopic
        P = T.MetadataResponsePartition
        topics = []
        for name in names:
            topic = self.broker._ensure_topic(name, auto) if name else None
            if topic is None:
                topics.append(
                    T(
                        error_code=3,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        is_internal=False,
                        partitions=[],
                    )
                )
                continue
            parts = [
                P(
                    error_code=0,
                    partition_index=i,
                    leader_id=node,
                    leader_epoch=0,
                    replica_nodes=[node],
                    isr_nodes=[node],
                    offline_replicas=[],
                )
                for i in range(topic.partitions)
            ]
            topics.append(
                T(
                    error_code=0,
                    name=name,
                    topic_id=topic.topic_id,
                    is_internal=False,
                    partitions=parts,
                )
            )
        r = MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                self.broker_entry(),
                *(
                    MetadataResponse.MetadataResponseBroker(
                        node_id=peer.node_id, host=HOST, port=peer.port, rack=None
                    )
                    for peer in self.broker.peers
                ),
            ],
            cluster_id=self.broker.cluster_id,
            controller_id=node,
            topics=topics,
        )
        self.send(_encode(r, version, cid))

    def create_topics(self, version: int, cid: int, body: bytes) -> None:
        req = CreateTopicsRequest.decode(body, version=version)
        results = []
        for t in req.topics:
            n = t.num_partitions if t.num_partitions > 0 else self.broker.default_partitions
            with self.broker._lock:
                exists = t.name in self.broker._topics
                if not exists and not req.validate_only:
                    self.broker._topics[t.name] = _Topic(uuid.uuid4(), n)
                topic_id = self.broker._topics[t.name].topic_id if not exists else uuid.UUID(int=0)
            results.append(
                CreateTopicsResponse.CreatableTopicResult(
                    name=t.name,
                    topic_id=topic_id,
                    error_code=TOPIC_ALREADY_EXISTS if exists else 0,
                    error_message=f"Topic '{t.name}' already exists." if exists else None,
                    num_partitions=n,
                    replication_factor=1,
                    configs=[],
                )
            )
        self.send(_encode(CreateTopicsResponse(throttle_time_ms=0, topics=results), version, cid))

    def init_producer_id(self, version: int, cid: int, body: bytes) -> None:
        req = InitProducerIdRequest.decode(body, version=version)
        known = version >= 3 and req.producer_id >= 0
        pid = req.producer_id if known else self.broker._new_pid()
        epoch = req.producer_epoch + 1 if known else 0
        r = InitProducerIdResponse(
            throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=epoch
        )
        self.send(_encode(r, version, cid))

    def produce(self, version: int, cid: int, body: bytes) -> None:
        summary = parse_produce_request(body, version)
        by_id = {t.topic_id.bytes: n for n, t in self.broker.topics_by_name().items()}
        responses = []
        for topic in summary.topics:
            name = topic.name if topic.name is not None else by_id.get(topic.topic_id or b"", "")
            partition_responses = []
            for part in topic.partitions:
                records = sum(b.last_offset_delta + 1 for b in part.batches)
                pids = tuple(sorted({b.producer_id for b in part.batches} - {-1}))
                with self.broker._lock:
                    base = self.broker._offsets.get((name, part.index), 0)
                    self.broker._offsets[(name, part.index)] = base + records
                    self.broker._produced.append(Produced(self.user, name, part.index, pids))
                partition_responses.append(
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=part.index,
                        error_code=0,
                        base_offset=base,
                        log_append_time_ms=-1,
                        log_start_offset=0,
                        record_errors=[],
                        error_message=None,
                    )
                )
            responses.append(
                ProduceResponse.TopicProduceResponse(
                    name=name,
                    topic_id=uuid.UUID(bytes=topic.topic_id)
                    if topic.topic_id
                    else uuid.UUID(int=0),
                    partition_responses=partition_responses,
                )
            )
        if summary.acks == 0:
            return  # no response for acks=0
        r = ProduceResponse(responses=responses, throttle_time_ms=0)
        self.send(_encode(r, version, cid))
