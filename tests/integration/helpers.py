"""Shared helpers for integration tests: a raw Kafka-protocol socket, request builders on
kafka-python's protocol classes, topic creation through pidgate and bounded wait loops.

Everything here talks over real loopback sockets; nothing is mocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from pidgate.demo.broker import free_port
from pidgate.proxy.background import BackgroundProxy

_SIZE = struct.Struct(">i")

#: Error code pidgate answers a throttled Produce with when it cannot tell the client library
#: (raw sockets here): NOT_ENOUGH_REPLICAS, which every client retries.
REJECTED_DEFAULT = 19
#: What kafka-python gets (it retries it): THROTTLING_QUOTA_EXCEEDED.
THROTTLING_QUOTA_EXCEEDED = 89
UNSUPPORTED_VERSION = 35
PRODUCE_KEY = 0
API_VERSIONS_KEY = 18


class ConnectionClosed(Exception):
    """The peer closed the connection (EOF or reset)."""


class KafkaSocket:
    """A blocking loopback socket speaking framed Kafka requests; for pipelining tests."""

    def __init__(self, address: str | tuple[str, int], timeout_s: float = 10.0) -> None:
        if isinstance(address, str):
            host, _, port = address.rpartition(":")
            address = (host, int(port))
        self.address = address
        self.sock = socket.create_connection(address, timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> KafkaSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        chunks: list[bytes] = []
        got = 0
        deadline = time.monotonic() + self.timeout_s
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"waited {self.timeout_s}s for {n - got} more bytes")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(n - got)
            except ConnectionResetError as error:
                raise ConnectionClosed("connection reset") from error
            if not chunk:
                raise ConnectionClosed(f"EOF after {got} of {n} bytes")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        """One response payload (without its size prefix)."""
        (size,) = _SIZE.unpack(self._recv_exact(4))
        assert 0 <= size < 64 * 1024 * 1024, f"implausible response size {size}"
        return self._recv_exact(size)

    def expect_closed(self, timeout_s: float = 10.0) -> bytes:
        """Wait until the peer closes the connection; returns whatever bytes arrived first
        (callers assert it is empty: no response to a bad request)."""
        received = b""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"connection still open after {timeout_s}s (received {received[:64]!r})"
                )
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return received
            except TimeoutError:
                continue
            if not chunk:
                return received
            received += chunk


def correlation_id_of(response_payload: bytes) -> int:
    """Every response header (v0 and v1) starts with the correlation id."""
    return int(_SIZE.unpack_from(response_payload, 0)[0])


def encode_request(request: Any, version: int, correlation_id: int, client_id: str = "it") -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(version=version, header=True, framed=True))


def decode_response(cls: Any, payload: bytes, version: int) -> Any:
    return cls.decode(payload, version=version, header=True)


def api_versions_request(version: int = 3) -> ApiVersionsRequest:
    if version >= 3:
        return ApiVersionsRequest(
            version=version, client_software_name="pidgate-it", client_software_version="1"
        )
    return ApiVersionsRequest(version=version)


def metadata_request(topics: list[str] | None, version: int = 1) -> MetadataRequest:
    topic_list = (
        None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    )
    kwargs: dict[str, Any] = {"version": version, "topics": topic_list}
    if version >= 4:
        kwargs["allow_auto_topic_creation"] = False
    return MetadataRequest(**kwargs)


def advertised_versions(address: str | tuple[str, int]) -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) as pidgate advertises it (ApiVersions v3 through ``address``)."""
    with KafkaSocket(address) as conn:
        conn.sendall(encode_request(api_versions_request(3), 3, 1))
        response = decode_response(ApiVersionsResponse, conn.recv_frame(), 3)
    assert response.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def init_producer_id(address: str | tuple[str, int], version: int = 4) -> tuple[int, int]:
    """A fresh (producer_id, producer_epoch) from the broker, asked through ``address``.

    tansu answers InitProducerId v0-2 with an error; v3+ works.
    """
    request = InitProducerIdRequest(
        version=version,
        transactional_id=None,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    with KafkaSocket(address) as conn:
        conn.sendall(encode_request(request, version, 1))
        response = decode_response(InitProducerIdResponse, conn.recv_frame(), version)
    assert response.error_code == 0, response
    return response.producer_id, response.producer_epoch


def record_batch(
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    count: int = 1,
    value_prefix: bytes = b"v",
) -> bytes:
    """One RecordBatch v2 (uncompressed) with ``count`` records."""
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 20,
        offset=0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )
    now_ms = int(time.time() * 1000)
    for i in range(count):
        builder.append(timestamp=now_ms, key=b"k%d" % i, value=value_prefix + b"%d" % i)
    builder.close()
    return bytes(builder.buffer())


def produce_request(
    version: int,
    topic: str,
    records: bytes,
    acks: int = -1,
    partition: int = 0,
    topic_id: uuid.UUID | None = None,
    timeout_ms: int = 10_000,
) -> ProduceRequest:
    T = ProduceRequest.TopicProduceData
    P = T.PartitionProduceData
    topic_kwargs: dict[str, Any] = {"partition_data": [P(index=partition, records=records)]}
    if version >= 13:
        assert topic_id is not None
        topic_kwargs["topic_id"] = topic_id
    else:
        topic_kwargs["name"] = topic
    kwargs: dict[str, Any] = {
        "version": version,
        "acks": acks,
        "timeout_ms": timeout_ms,
        "topic_data": [T(**topic_kwargs)],
    }
    if version >= 3:
        kwargs["transactional_id"] = None
    return ProduceRequest(**kwargs)


def produce_partition_errors(response: Any) -> list[int]:
    return [p.error_code for t in response.responses for p in t.partition_responses]


def decode_produce(payload: bytes, version: int) -> Any:
    return decode_response(ProduceResponse, payload, version)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    timeout_s: float = 20.0,
    *,
    exist_ok: bool = False,
) -> int:
    """Create ``name`` through ``bootstrap`` (pidgate) with confluent-kafka's AdminClient;
    ``exist_ok``: a topic already there (TOPIC_ALREADY_EXISTS) is not an error. Returns the
    topic's partition count as the broker then reports it (an existing topic keeps its own)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    # exception(), not result(): a raised error's traceback would hold this frame, and through
    # it the admin client, in a cycle with the future, so its connections would outlive this
    # call until the next garbage collection (a test counting pidgate's connections saw them).
    error = futures[name].exception(timeout=timeout_s)
    if error is not None and not (
        exist_ok
        and isinstance(error, KafkaException)
        and error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    ):
        raise error
    wait_until(
        lambda: name in admin.list_topics(timeout=5).topics,
        timeout_s,
        f"topic {name} visible in metadata",
    )
    return len(admin.list_topics(topic=name, timeout=5).topics[name].partitions)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for: {what}")


def http_get(address: str, path: str, timeout_s: float = 10.0) -> tuple[int, str]:
    """(status, body) of GET http://<address><path>; error statuses are returned, not raised."""
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def admin_address(proxy: BackgroundProxy) -> str:
    """host:port of an in-process pidgate's admin HTTP listener."""
    listen = proxy.server.settings.admin.listen
    return f"{listen.host}:{listen.port}"


class PidgateProcess:
    """``python -m pidgate serve`` as a child process on loopback; stderr (JSON logs) to a file.

    Stopped only by its own PID (SIGTERM, then SIGKILL after a bound).
    """

    def __init__(
        self,
        upstream: str,
        listen_port: int,
        broker_port_base: int | None = None,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.listen_port = listen_port
        self.bootstrap = f"127.0.0.1:{listen_port}"
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in close()
            prefix="pidgate-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)
        args = [
            sys.executable,
            "-m",
            "pidgate",
            "serve",
            "--upstream",
            upstream,
            "--listen",
            self.bootstrap,
            "--log-level",
            "info",
            *extra_args,
        ]
        if broker_port_base is not None:
            args += ["--broker-port-base", str(broker_port_base)]
        self.admin_port = free_port()
        args += ["--http", f"127.0.0.1:{self.admin_port}"]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("PIDGATE_")}
        environ["PIDGATE_LOGGING_FORMAT"] = "json"
        environ.update(env or {})
        self.process = subprocess.Popen(
            args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environ,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_listening(self, timeout_s: float = 20.0) -> PidgateProcess:
        """Until both the client listener and the admin HTTP listener accept a connection.

        pidgate opens the admin listener after the bootstrap one (server.start), so a test that
        scrapes /metrics right after the client port answers could be refused (CI, stop 39).
        """
        deadline = time.monotonic() + timeout_s
        waiting_for = [self.listen_port, self.admin_port]
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"pidgate exited with {self.process.returncode}: {self.log_text()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", waiting_for[0]), 0.2):
                    waiting_for.pop(0)
                if not waiting_for:
                    return self
                continue
            time.sleep(0.05)
        raise AssertionError(
            f"pidgate did not listen on 127.0.0.1:{waiting_for[0]} in {timeout_s}s "
            f"(clients: {self.listen_port}, admin: {self.admin_port})"
        )

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    events.append(entry)
        return events

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL and raise if it hangs)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
                raise AssertionError(f"pidgate ignored SIGTERM for {timeout_s}s") from None
        return int(self.process.returncode)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)


# -- raw SASL (KIP-43 / KIP-152) over a KafkaSocket --------------------------------------------


def sasl_handshake(conn: KafkaSocket, mechanism: str, version: int, correlation_id: int) -> int:
    """SaslHandshake v0/v1 on ``conn``; returns the response's error_code."""
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    conn.sendall(encode_request(SaslHandshakeRequest(mechanism=mechanism), version, correlation_id))
    response = decode_response(SaslHandshakeResponse, conn.recv_frame(), version)
    return int(response.error_code)


def send_sasl_authenticate(
    conn: KafkaSocket, token: bytes, version: int, correlation_id: int
) -> None:
    from kafka.protocol.sasl import SaslAuthenticateRequest

    conn.sendall(encode_request(SaslAuthenticateRequest(auth_bytes=token), version, correlation_id))


def sasl_authenticate(conn: KafkaSocket, token: bytes, version: int, correlation_id: int) -> Any:
    """SaslAuthenticate v0-v2 on ``conn``; returns the decoded response (error_code,
    auth_bytes, session_lifetime_ms for v1+)."""
    from kafka.protocol.sasl import SaslAuthenticateResponse

    send_sasl_authenticate(conn, token, version, correlation_id)
    return decode_response(SaslAuthenticateResponse, conn.recv_frame(), version)


def send_raw_sasl_token(conn: KafkaSocket, token: bytes) -> None:
    """A bare size-prefixed token, as after a SaslHandshake v0."""
    conn.sendall(_SIZE.pack(len(token)) + token)


def plain_token(user: str, password: str, authzid: str = "") -> bytes:
    return f"{authzid}\0{user}\0{password}".encode()


def oauthbearer_token(jwt: str) -> bytes:
    return f"n,,\x01auth=Bearer {jwt}\x01\x01".encode()


class ScramClient:
    """The client side of one RFC 5802 SCRAM-SHA-256/512 exchange (no channel binding)."""

    def __init__(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> None:
        import base64
        import hashlib

        self._b64 = base64
        self.hash = hashlib.sha256 if mechanism.endswith("256") else hashlib.sha512
        self.password = password
        self.nonce = base64.b64encode(os.urandom(18)).decode()
        self.first_bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={self.nonce}"
        #: The client-final-message sent last (contains the proof) and the proof itself.
        self.final_message = ""
        self.proof = ""

    def client_first(self) -> bytes:
        return ("n,," + self.first_bare).encode()

    def client_final(self, server_first: bytes) -> bytes:
        import hashlib
        import hmac

        fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
        salted = hashlib.pbkdf2_hmac(
            self.hash().name,
            self.password.encode(),
            self._b64.b64decode(fields["s"]),
            int(fields["i"]),
        )
        without_proof = f"c={self._b64.b64encode(b'n,,').decode()},r={fields['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", self.hash).digest()
        signature = hmac.new(self.hash(client_key).digest(), auth_message, self.hash).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.proof = self._b64.b64encode(proof).decode()
        self.final_message = f"{without_proof},p={self.proof}"
        return self.final_message.encode()


def init_producer_id_on(conn: KafkaSocket, correlation_id: int, version: int = 4) -> int:
    """A fresh producer id asked on ``conn`` (an authenticated connection)."""
    request = InitProducerIdRequest(
        version=version,
        transactional_id=None,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    conn.sendall(encode_request(request, version, correlation_id))
    response = decode_response(InitProducerIdResponse, conn.recv_frame(), version)
    assert response.error_code == 0, response
    return int(response.producer_id)


def produce_frame(
    topic: str,
    producer_id: int,
    correlation_id: int,
    version: int = 8,
    base_sequence: int = 0,
    timeout_ms: int = 10_000,
) -> bytes:
    """A framed acks=-1 Produce request with one idempotent batch of ``producer_id``;
    ``timeout_ms`` is what a client sends as its request.timeout.ms."""
    records = record_batch(producer_id, 0, base_sequence=base_sequence)
    request = produce_request(version, topic, records, timeout_ms=timeout_ms)
    return encode_request(request, version, correlation_id)
