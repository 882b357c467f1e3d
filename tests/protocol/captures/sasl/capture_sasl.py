"""Record real clients' SASL exchanges for pidgate's SASL observer tests.

Run once by hand (``timeout 600 .venv/bin/python tests/protocol/captures/sasl/capture_sasl.py``);
the ``sasl_captures.json`` it writes next to itself is committed and replayed, socket-free, by
``tests/protocol/test_sasl.py``.

It starts a tiny scripted SASL *server* on 127.0.0.1 (one thread per connection, every socket
with a timeout) that answers just enough of the Kafka protocol for a client to authenticate and
fetch metadata: ApiVersions, SaslHandshake (v0 or v1, as configured per run), SaslAuthenticate
(v0-v2) and Metadata. It checks PLAIN passwords, runs a real RFC 5802 SCRAM server (so clients
verify the server signature and send their client-final), accepts any OAUTHBEARER token, and
records every SASL frame both ways. It then drives kafka-python, confluent-kafka (librdkafka) and
aiokafka through it, and closes everything it opened. The passwords below are test-only strings.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from pidgate.protocol._wire import (
    as_memoryview,
    read_nullable_string,
    read_uvarint,
    write_uvarint,
)
from pidgate.protocol.api_versions import proxy_api_version_limits
from pidgate.protocol.framing import FrameDecoder
from pidgate.protocol.headers import parse_request_header

HOST = "127.0.0.1"
OUT = Path(__file__).resolve().parent / "sasl_captures.json"
PASSWORD = "pidgate-test-secret-Pw0rd"  # test-only; tests assert it never shows up in a repr
PLAIN_USER = "plain-user"
SCRAM_USER = "a,b=c"  # needs RFC 5802 escaping: n=a=2Cb=3Dc
SCRAM_SIMPLE_USER = "scram-user"
OAUTH_SUB = "oauth-user"
SESSION_LIFETIME_MS = 1500  # only in the re-authentication runs (KIP-368)
CLIENT_TIMEOUT_S = 15.0
SCRAM_ITERATIONS = 4096
SCRAM_SALT = b"pidgate-capture-salt"


def unsigned_jwt(claims: dict[str, Any]) -> str:
    def b64(obj: dict[str, Any]) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{b64({'alg': 'none'})}.{b64(claims)}."


JWT = unsigned_jwt({"sub": OAUTH_SUB, "iat": 1700000000, "exp": 4102444800, "scope": "kafka"})


def scram_unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """RFC 5802 server side, enough for a client to verify us and send its client-final."""

    def __init__(self, mechanism: str) -> None:
        self.hash = hashlib.sha256 if mechanism.endswith("256") else hashlib.sha512
        self.step = 0
        self.auth_message = b""
        self.nonce = b""
        self.name = ""

    def handle(self, token: bytes) -> tuple[bytes, bool, bool]:
        """(reply, done, ok)"""
        if self.step == 0:
            # gs2 header "n,," (or "n,a=...,"), then the bare message. Greedy so that a client
            # that forgets to escape ',' in the name (kafka-python) still gets an answer.
            m = re.match(rb"^[nyp][^,]*,[^,]*,(n=(.*),r=([^,]*)(?:,.*)?)$", token, re.S)
            if not m:
                return b"e=invalid-encoding", True, False
            bare, name, cnonce = m.group(1), m.group(2), m.group(3)
            self.name = scram_unescape(name.decode())
            self.nonce = cnonce + b"pidgateservernonce"
            server_first = b"r=%s,s=%s,i=%d" % (
                self.nonce,
                base64.b64encode(SCRAM_SALT),
                SCRAM_ITERATIONS,
            )
            self.auth_message = bare + b"," + server_first
            self.step = 1
            return server_first, False, True
        # client-final: c=...,r=...,p=proof
        without_proof, _, proof_b64 = token.rpartition(b",p=")
        self.auth_message += b"," + without_proof
        salted = hashlib.pbkdf2_hmac(
            self.hash().name, PASSWORD.encode(), SCRAM_SALT, SCRAM_ITERATIONS
        )
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        stored_key = self.hash(client_key).digest()
        signature = hmac.new(stored_key, self.auth_message, self.hash).digest()
        try:
            proof = base64.b64decode(proof_b64)
        except ValueError:
            return b"e=invalid-proof", True, False
        if bytes(a ^ b for a, b in zip(client_key, signature, strict=True)) != proof:
            return b"e=invalid-proof", True, False
        server_key = hmac.new(salted, b"Server Key", self.hash).digest()
        server_sig = hmac.new(server_key, self.auth_message, self.hash).digest()
        return b"v=" + base64.b64encode(server_sig), True, True


def mechanism_handler(mechanism: str) -> Callable[[bytes], tuple[bytes, bool, bool]]:
    if mechanism.startswith("SCRAM-"):
        return ScramServer(mechanism).handle
    if mechanism == "PLAIN":

        def plain(token: bytes) -> tuple[bytes, bool, bool]:
            parts = token.split(b"\0")
            ok = len(parts) == 3 and parts[2].decode() == PASSWORD
            return b"", True, ok

        return plain

    def oauth(token: bytes) -> tuple[bytes, bool, bool]:
        return b"", True, token.startswith(b"n,")

    return oauth


class Server:
    def __init__(self) -> None:
        self.listen = socket.socket()
        self.listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listen.bind((HOST, 0))
        self.listen.listen(32)
        self.listen.settimeout(0.5)
        self.port = int(self.listen.getsockname()[1])
        self.lock = threading.Lock()
        self.label = "none"
        self.handshake_max = 1
        self.session_lifetime_ms = 0
        self.exchanges: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.conns: list[socket.socket] = []

    def configure(self, label: str, handshake_max: int, session_lifetime_ms: int = 0) -> None:
        with self.lock:
            self.label = label
            self.handshake_max = handshake_max
            self.session_lifetime_ms = session_lifetime_ms

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listen.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(CLIENT_TIMEOUT_S)
            with self.lock:
                label, hs_max, lifetime = self.label, self.handshake_max, self.session_lifetime_ms
                self.conns.append(conn)
                conn_id = len(self.conns)
            t = threading.Thread(
                target=self.connection, args=(conn, conn_id, label, hs_max, lifetime), daemon=True
            )
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        self.stopped.set()
        self.listen.close()
        with self.lock:
            for c in self.conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
        for t in self.threads:
            t.join(timeout=5)

    # -- one connection -------------------------------------------------------------------------

    def connection(
        self, conn: socket.socket, conn_id: int, label: str, hs_max: int, lifetime: int
    ) -> None:
        decoder = FrameDecoder(max_frame_bytes=1 << 20)
        raw_mode = False
        exchange: dict[str, Any] | None = None
        handler: Callable[[bytes], tuple[bytes, bool, bool]] | None = None
        mechanism = ""

        def send(payload: bytes) -> None:
            conn.sendall(struct.pack(">i", len(payload)) + payload)

        try:
            while data := conn.recv(65536):
                for fr in decoder.feed(data):
                    payload = bytes(fr[4:])
                    if raw_mode:
                        assert exchange is not None and handler is not None
                        exchange["frames"].append({"kind": "raw_client", "hex": payload.hex()})
                        reply, done, ok = handler(payload)
                        if not ok:
                            exchange["server_outcome"] = "failed"
                            return  # v0: failure = the broker closes the connection
                        exchange["frames"].append({"kind": "raw_server", "hex": reply.hex()})
                        send(reply)
                        if done:
                            exchange["server_outcome"] = "succeeded"
                            raw_mode = False
                        continue
                    hdr = parse_request_header(payload)
                    body = payload[hdr.header_bytes :]
                    cid = struct.pack(">i", hdr.correlation_id)
                    if hdr.api_key == 18:
                        send(api_versions_response(hdr.api_version, hdr.correlation_id, hs_max))
                    elif hdr.api_key == 3:
                        send(metadata_response(hdr.api_version, hdr.correlation_id, self.port))
                    elif hdr.api_key == 17:
                        mech, _ = read_nullable_string(as_memoryview(body), 0, "mechanism")
                        mechanism = mech or ""
                        handler = mechanism_handler(mechanism)
                        exchange = {
                            "label": label,
                            "connection": conn_id,
                            "mechanism": mechanism,
                            "handshake_version": hdr.api_version,
                            "client_id": hdr.client_id,
                            "frames": [],
                            "server_outcome": "pending",
                        }
                        with self.lock:
                            self.exchanges.append(exchange)
                        resp = struct.pack(">hi", 0, 4) + b"".join(
                            struct.pack(">h", len(m)) + m
                            for m in (b"PLAIN", b"SCRAM-SHA-256", b"SCRAM-SHA-512", b"OAUTHBEARER")
                        )
                        exchange["frames"].append(
                            {
                                "kind": "request",
                                "api_key": 17,
                                "api_version": hdr.api_version,
                                "hex": body.hex(),
                            }
                        )
                        exchange["frames"].append(
                            {
                                "kind": "response",
                                "api_key": 17,
                                "api_version": hdr.api_version,
                                "hex": resp.hex(),
                            }
                        )
                        send(cid + resp)
                        raw_mode = hdr.api_version == 0
                    elif hdr.api_key == 36:
                        assert exchange is not None and handler is not None
                        v = hdr.api_version
                        token = read_auth_bytes(body, flexible=v >= 2)
                        exchange["frames"].append(
                            {"kind": "request", "api_key": 36, "api_version": v, "hex": body.hex()}
                        )
                        reply, done, ok = handler(token)
                        resp = authenticate_response(
                            v, ok, reply if ok else b"", lifetime if done and ok else 0
                        )
                        exchange["frames"].append(
                            {"kind": "response", "api_key": 36, "api_version": v, "hex": resp.hex()}
                        )
                        if done or not ok:
                            exchange["server_outcome"] = "succeeded" if ok else "failed"
                        send(cid + (b"\x00" if v >= 2 else b"") + resp)
                        if not ok:
                            return
                    else:
                        return  # anything else: we have what we came for
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()


def read_auth_bytes(body: bytes, flexible: bool) -> bytes:
    if flexible:
        n, pos = read_uvarint(as_memoryview(body), 0)
        return body[pos : pos + n - 1]
    (n,) = struct.unpack_from(">i", body, 0)
    return body[4 : 4 + n]


def authenticate_response(version: int, ok: bool, auth: bytes, lifetime_ms: int) -> bytes:
    err = 0 if ok else 58
    msg = None if ok else b"Authentication failed (capture server)"
    if version >= 2:
        out = struct.pack(">h", err)
        out += b"\x00" if msg is None else write_uvarint(len(msg) + 1) + msg
        out += write_uvarint(len(auth) + 1) + auth
        out += struct.pack(">q", lifetime_ms) + b"\x00"
        return out
    out = struct.pack(">h", err)
    out += struct.pack(">h", -1) if msg is None else struct.pack(">h", len(msg)) + msg
    out += struct.pack(">i", len(auth)) + auth
    if version >= 1:
        out += struct.pack(">q", lifetime_ms)
    return out


def api_versions_response(version: int, correlation_id: int, hs_max: int) -> bytes:
    limits = proxy_api_version_limits()
    limits[17] = (0, hs_max)
    limits[36] = (0, 2)
    # Only what we answer (plus Produce, so no client thinks the broker is ancient).
    keep = {0, 3, 17, 18, 36}
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
        for k, (lo, hi) in sorted(limits.items())
        if k in keep
    ]
    r = ApiVersionsResponse(error_code=0, api_keys=keys, throttle_time_ms=0)
    r.API_VERSION = min(version, 3)  # v4 has v3's layout
    r.with_header(correlation_id=correlation_id)
    return bytes(r.encode(header=True, framed=False))


def metadata_response(version: int, correlation_id: int, port: int) -> bytes:
    broker = MetadataResponse.MetadataResponseBroker(node_id=0, host=HOST, port=port, rack=None)
    r = MetadataResponse(
        throttle_time_ms=0, brokers=[broker], cluster_id="pidgate-sasl", controller_id=0, topics=[]
    )
    r.API_VERSION = version
    r.with_header(correlation_id=correlation_id)
    return bytes(r.encode(header=True, framed=False))


# -- the clients ------------------------------------------------------------------------------


def kafka_python_run(bootstrap: str, mechanism: str, user: str, reauth: bool = False) -> None:
    from kafka import KafkaAdminClient
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Tokens(AbstractTokenProvider):  # type: ignore[misc]
        def token(self) -> str:
            return JWT

        def extensions(self) -> dict[str, str]:
            return {"traceId": "capture1"}

    kw: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "request_timeout_ms": 5000,
    }
    if mechanism == "OAUTHBEARER":
        kw["sasl_oauth_token_provider"] = Tokens()
    else:
        kw["sasl_plain_username"] = user
        kw["sasl_plain_password"] = PASSWORD
    admin = KafkaAdminClient(**kw)
    try:
        if reauth:
            deadline = time.monotonic() + 3 * SESSION_LIFETIME_MS / 1000
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    admin.list_topics()
                time.sleep(0.3)
    finally:
        admin.close()


def confluent_run(bootstrap: str, mechanism: str, user: str, reauth: bool = False) -> None:
    import confluent_kafka

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "socket.timeout.ms": 5000,
        "log_level": 0,
    }
    if mechanism == "OAUTHBEARER":

        def oauth_cb(_config: str) -> tuple[str, float, str, dict[str, str]]:
            return JWT, time.time() + 3600, OAUTH_SUB, {"traceId": "capture1"}

        conf["oauth_cb"] = oauth_cb
    else:
        conf["sasl.username"] = user
        conf["sasl.password"] = PASSWORD
    producer = confluent_kafka.Producer(conf)
    try:
        producer.poll(0.5)  # runs oauth_cb
        producer.list_topics(timeout=10)
        if reauth:
            deadline = time.monotonic() + 3 * SESSION_LIFETIME_MS / 1000
            while time.monotonic() < deadline:
                producer.poll(0.2)
                with contextlib.suppress(Exception):
                    producer.list_topics(timeout=2)
    finally:
        producer.flush(1)


def aiokafka_run(bootstrap: str, mechanism: str, user: str, reauth: bool = False) -> None:
    import aiokafka
    from aiokafka.abc import AbstractTokenProvider

    class Tokens(AbstractTokenProvider):  # type: ignore[misc]
        async def token(self) -> str:
            return JWT

        def extensions(self) -> dict[str, str]:
            return {"traceId": "capture1"}

    async def main() -> None:
        kw: dict[str, Any] = {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "request_timeout_ms": 5000,
        }
        if mechanism == "OAUTHBEARER":
            kw["sasl_oauth_token_provider"] = Tokens()
        else:
            kw["sasl_plain_username"] = user
            kw["sasl_plain_password"] = PASSWORD
        producer = aiokafka.AIOKafkaProducer(**kw)
        await asyncio.wait_for(producer.start(), CLIENT_TIMEOUT_S)
        await producer.stop()

    asyncio.run(main())


RUNS: list[tuple[str, Callable[..., None], str, str, int, bool]] = []
for hs in (1, 0):
    for name, fn in (
        ("kafka-python", kafka_python_run),
        ("confluent-kafka", confluent_run),
        ("aiokafka", aiokafka_run),
    ):
        RUNS.append((name, fn, "PLAIN", PLAIN_USER, hs, False))
        RUNS.append((name, fn, "SCRAM-SHA-256", SCRAM_USER, hs, False))
        RUNS.append((name, fn, "SCRAM-SHA-512", SCRAM_SIMPLE_USER, hs, False))
        RUNS.append((name, fn, "OAUTHBEARER", "", hs, False))
RUNS.append(("kafka-python", kafka_python_run, "SCRAM-SHA-256", SCRAM_SIMPLE_USER, 1, True))
RUNS.append(("confluent-kafka", confluent_run, "PLAIN", PLAIN_USER, 1, True))


def run_bounded(fn: Callable[[], None], timeout_s: float) -> str:
    """Run a client in a daemon thread; give up waiting after ``timeout_s``."""
    result: list[str] = []

    def target() -> None:
        try:
            fn()
            result.append("ok")
        except Exception as exc:  # a client's complaint about our minimal server is data
            result.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    return result[0] if result else "timed out"


def versions() -> dict[str, str]:
    import aiokafka
    import confluent_kafka
    import kafka

    return {
        "kafka-python": kafka.__version__,
        "confluent-kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "aiokafka": aiokafka.__version__,
    }


def main() -> int:
    server = Server()
    serve = threading.Thread(target=server.serve, daemon=True)
    serve.start()
    bootstrap = f"{HOST}:{server.port}"
    runs: list[dict[str, Any]] = []
    try:
        for client, fn, mechanism, user, hs_max, reauth in RUNS:
            label = f"{client}/{mechanism}/hs{hs_max}" + ("/reauth" if reauth else "")
            server.configure(label, hs_max, SESSION_LIFETIME_MS if reauth else 0)
            result = run_bounded(lambda: fn(bootstrap, mechanism, user, reauth), 40.0)  # noqa: B023
            time.sleep(0.3)
            runs.append(
                {
                    "label": label,
                    "client": client,
                    "mechanism": mechanism,
                    "user": user,
                    "handshake_max": hs_max,
                    "reauth": reauth,
                    "client_result": result,
                }
            )
            print(f"{label}: {result}", file=sys.stderr)
    finally:
        server.stop()
    with server.lock:
        exchanges = list(server.exchanges)
    OUT.write_text(
        json.dumps(
            {
                "versions": versions(),
                "password": PASSWORD,
                "jwt_sub": OAUTH_SUB,
                "runs": runs,
                "exchanges": exchanges,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"{len(exchanges)} exchanges -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
