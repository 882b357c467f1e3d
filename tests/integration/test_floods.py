"""Floods: pidgate under connection churn, principal churn and PID churn, on loopback.

What an operator relies on when a client (or a fleet of them) misbehaves at scale, proved with
pidgate running as its own ``python -m pidgate serve`` process (so its file descriptors, RSS and
CPU are its own), real sockets, and a real idempotent confluent-kafka (librdkafka) producer that
keeps producing through every flood:

1. 10,000 client connections opened and closed quickly (reset at once, reset after a request,
   closed after an answer, reset mid-frame), ~200 at a time, in front of a real tansu broker:
   afterwards pidgate holds no connection and no more file descriptors than before, and the
   well-behaved producer never saw an error.
2. 100,000 distinct SASL principals, each authenticating (KIP-368 re-authentication on 16 long
   connections, PLAIN) and activating one new PID, through the scripted SASL broker (tansu has
   no SASL): pidgate never tracks more than ``quota.max_principals``, evicts exactly the
   principals beyond it, idlest first, counts them in ``/metrics``, keeps Bloom bits under
   ``quota.max_total_bits``, and a principal with its own quota producing throughout is never
   evicted and never rejected. RSS grows little once the cap is reached.
3. 1,000,000 distinct PIDs from one principal (ANONYMOUS, 1000 new PIDs per 10 s) in 10,000
   pipelined Produce requests of 100 record batches each, in front of tansu: new PIDs admitted
   stay within burst + rate x elapsed / window, every batch's PID is charged, the rejections are
   counted in ``/metrics``, no rejected request reaches the broker (read back from tansu), the
   principal's Bloom memory is bounded by its rate, not by the PIDs it throws (so one principal
   can never reach the global caps: eviction is shown by test 2), and a producer of the same
   principal whose PID is already known keeps producing with zero errors.

Figures (durations, rates, RSS, file descriptors, bits, evictions) are printed as ``FIGURES``
lines (``pytest -s``) and never asserted as speed; the assertions are correctness and bounds.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import multiprocessing
import os
import socket
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import confluent_kafka
import crc32c
import pytest

from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.quota.bloom import bits_per_item_at
from pidgate.quota.layer_plan import LayerPlan
from tests.integration.broker_log import fetch_batch_headers, producer_ids_in_log
from tests.integration.figures import open_fd_count, record_figures, rss_bytes
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    PidgateProcess,
    api_versions_request,
    create_topic,
    encode_request,
    http_get,
    record_batch,
    wait_until,
)
from tests.integration.metrics_text import Samples, metric, parse_samples
from tests.integration.sasl_broker import ScriptedSaslBroker

pytestmark = pytest.mark.integration

MIB = 1 << 20
PRODUCE, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 17, 36
PRODUCE_VERSION = 8
#: Bits of the smallest Bloom layer (min_layer_items, 16 items, each layer built for its share
#: of the default false-positive rate 0.001 over a 1 h window in 11 layers: 640 bits, see
#: pidgate.quota.layered): what a principal that activated one PID holds. Layers are sized to
#: what a principal writes (issue #12).
SMALLEST_LAYER_BITS = LayerPlan(3_600_000, 11).shape_for(1).bit_count
#: Bits of a Bloom layer for 1000 items (the flood principal's rate per window) at its layers'
#: share of p = 0.001 (window 10 s in 11 layers), before rounding up: the unit of the flood's
#: memory bound.
_FLOOD_PLAN = LayerPlan(10_000, 11)
RATE_LAYER_BITS = math.ceil(1000 * bits_per_item_at(_FLOOD_PLAN.layer_rate, _FLOOD_PLAN.hash_count))

_SIZE = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HEADER_V1 = struct.Struct(">hhih")
_CLIENT_ID = b"floods"


# -- Kafka frames built with struct: kafka-python's encoders (~50 us) are too slow for 1M PIDs --


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """A size-prefixed request with a v1 header (non-flexible API versions only)."""
    header = _HEADER_V1.pack(api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    return _SIZE.pack(len(header) + len(body)) + header + body


def kafka_string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


class BatchFactory:
    """One-record RecordBatch v2 for any producer id and timestamp: a kafka-python template with
    the fields patched into a copy and the CRC-32C recomputed (about 1 us a batch; thread-safe:
    the template is never written)."""

    def __init__(self, idempotent: bool = True) -> None:
        if idempotent:
            template = record_batch(producer_id=0, producer_epoch=0, base_sequence=0)
        else:
            template = record_batch()  # producer_id -1: no PID
        self._template = template

    def batch(self, producer_id: int | None = None, timestamp_ms: int | None = None) -> bytes:
        batch = bytearray(self._template)
        if producer_id is not None:
            struct.pack_into(">q", batch, 43, producer_id)
        if timestamp_ms is not None:
            struct.pack_into(">qq", batch, 27, timestamp_ms, timestamp_ms)
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
        return bytes(batch)


def produce_body(topics: list[tuple[str, bytes]]) -> bytes:
    """Produce v3-v8 body, acks=-1: each topic with one partition (0) holding ``records``."""
    parts = [
        kafka_string(name) + _SIZE.pack(1) + struct.pack(">ii", 0, len(records)) + records
        for name, records in topics
    ]
    no_transactional_id = _I16.pack(-1)
    return no_transactional_id + struct.pack(">hii", -1, 10_000, len(parts)) + b"".join(parts)


def first_partition_error(payload: bytes, first_topic: str) -> int:
    """error_code of the first partition of a Produce v8 response (header v0)."""
    offset = 4 + 4 + 2 + len(first_topic.encode()) + 4 + 4
    return int(_I16.unpack_from(payload, offset)[0])


def correlation_id(payload: bytes) -> int:
    return int(_SIZE.unpack_from(payload, 0)[0])


class FrameReader:
    """Size-prefixed frames from a blocking socket, buffering whole reads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()

    def frame(self) -> bytes:
        buffer = self._buffer
        while True:
            if len(buffer) >= 4:
                size = _SIZE.unpack_from(buffer, 0)[0]
                if len(buffer) >= 4 + size:
                    payload = bytes(buffer[4 : 4 + size])
                    del buffer[: 4 + size]
                    return payload
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("pidgate closed the connection")
            buffer += chunk


def connect(address: str, timeout_s: float = 60.0) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# -- pidgate as a child process; its admin endpoint ------------------------------------------


@contextlib.contextmanager
def pidgate_process(upstream: str, config: dict[str, Any]) -> Iterator[PidgateProcess]:
    """``python -m pidgate serve --config`` with ``config`` (plus loopback listeners), stopped
    by its own PID at the end."""
    with tempfile.TemporaryDirectory(prefix="pidgate-floods-") as directory:
        path = Path(directory) / "pidgate.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        process = PidgateProcess(upstream, free_port(), extra_args=("--config", str(path)))
        try:
            process.wait_listening()
            yield process
        finally:
            try:
                assert process.terminate() == 0, process.log_text()[-2000:]
            finally:
                process.close()


def admin_get(process: PidgateProcess, path: str) -> str:
    status, body = http_get(f"127.0.0.1:{process.admin_port}", path, timeout_s=20)
    assert status == 200, (path, status, body[:500])
    return body


def scrape(process: PidgateProcess) -> Samples:
    return parse_samples(admin_get(process, "/metrics"))


def protocol_errors(samples: Samples) -> dict[str, float]:
    return {labels["kind"]: v for labels, v in samples.get("pidgate_protocol_errors_total", [])}


def pidgate_view(process: PidgateProcess) -> str:
    """What pidgate says about its traffic, for failure messages (a scrape that fails or times
    out says something too: the event loop is stuck)."""
    try:
        samples = scrape(process)
    except Exception as error:
        return f"pidgate /metrics failed: {error!r}"
    keep = (
        "pidgate_connections",
        "pidgate_requests_total",
        "pidgate_upstream_latency_seconds_count",
        "pidgate_produce_requests_rejected_total",
        "pidgate_protocol_errors_total",
    )
    return "pidgate: " + json.dumps({name: samples.get(name, []) for name in keep})


def state(process: PidgateProcess) -> dict[str, Any]:
    answer = json.loads(admin_get(process, "/state"))
    assert isinstance(answer, dict)
    return answer


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quiet_fd_count(pid: int) -> int:
    """File descriptors of ``pid`` once transient ones settle: the fewest of a few samples (an
    admin HTTP connection just answered may still be closing)."""
    counts = []
    for _ in range(5):
        counts.append(open_fd_count(pid))
        time.sleep(0.05)
    return min(counts)


class Workers:
    """Threads running ``targets``; ``join`` waits until a deadline and fails the test with the
    first error any of them raised (an assertion in a flood thread keeps its message)."""

    def __init__(self, targets: list[Callable[[], None]]) -> None:
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._guarded, args=(target,), daemon=True)
            for target in targets
        ]

    def _guarded(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:  # re-raised by join()
            self.errors.append(error)

    def start(self) -> Workers:
        for thread in self._threads:
            thread.start()
        return self

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads) and not self.errors

    def join(self, deadline: float, describe: Callable[[], str]) -> None:
        """Wait for every thread until ``deadline``; on an error or a thread still running,
        fail with ``describe()`` (pidgate's own view) appended."""
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        if self.errors:
            raise AssertionError(f"{self.errors[0]!r}; {describe()}") from self.errors[0]
        if any(t.is_alive() for t in self._threads):
            raise AssertionError(f"flood threads missed the deadline; {describe()}")


# -- a well-behaved real producer --------------------------------------------------------------


@dataclass
class SteadyProducer:
    """An idempotent librdkafka producer (one PID for its life) sending a record every
    ``interval_s`` until stopped; every delivery error and client error is kept."""

    config: dict[str, Any]
    topic: str
    interval_s: float = 0.02
    delivered: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    undelivered: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyProducer:
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = confluent_kafka.Producer(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                "error_cb": lambda error: self.errors.append(f"client: {error}"),
                **self.config,
            }
        )

        def on_delivery(error: object, _message: object) -> None:
            if error is None:
                self.delivered.append(time.monotonic())
            else:
                self.errors.append(f"delivery: {error}")

        for sequence in range(1_000_000):  # bounded; stopped by the test long before
            if self._stop.is_set():
                break
            producer.produce(self.topic, b"steady-%d" % sequence, on_delivery=on_delivery)
            producer.poll(0)
            self._stop.wait(self.interval_s)
        self.undelivered = producer.flush(30)

    def wait_delivered(self, count: int, timeout_s: float) -> None:
        wait_until(
            lambda: len(self.delivered) >= count or bool(self.errors),
            timeout_s,
            f"{count} steady deliveries",
        )
        assert not self.errors, self.errors[:5]

    def finish(self) -> None:
        """Stop producing, deliver what is queued and close the producer (its connections)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "steady producer did not finish"
        assert self.undelivered == 0, f"{self.undelivered} records never delivered"


def delivered_between(producer: SteadyProducer, start: float, end: float) -> int:
    return sum(1 for t in producer.delivered if start <= t <= end)


# -- 1. 10,000 connections opened and closed ---------------------------------------------------

CHURN_CONNECTIONS = 10_000
CHURN_THREADS = 25
#: Sockets each churn thread holds open at once: up to 25 x 8 = 200 connections in parallel.
CHURN_BATCH = 8
CHURN_DEADLINE_S = 120
CHURN_KINDS = ("reset", "reset_unread", "closed_answered", "reset_mid_frame")
_RST_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, no TIME_WAIT


def churn(
    address: tuple[str, int], first: int, count: int, deadline: float, seen: Counter[str]
) -> None:
    """Open and close ``count`` connections, CHURN_BATCH at a time, cycling through the kinds:
    RST right after connect; ApiVersions sent, RST without reading the answer; ApiVersions
    answered, then a normal close (FIN); half a frame sent, then RST."""
    api_versions = encode_request(api_versions_request(3), 3, 1)
    for start in range(first, first + count, CHURN_BATCH):
        if time.monotonic() > deadline:
            raise AssertionError("connection churn missed its deadline")
        batch: list[tuple[str, socket.socket]] = []
        try:
            for index in range(start, min(start + CHURN_BATCH, first + count)):
                sock = socket.create_connection(address, timeout=20)
                batch.append((CHURN_KINDS[index % len(CHURN_KINDS)], sock))
            for kind, sock in batch:
                if kind == "reset_mid_frame":
                    sock.sendall(api_versions[: len(api_versions) // 2])
                elif kind != "reset":
                    sock.sendall(api_versions)
                if kind == "closed_answered":
                    payload = FrameReader(sock).frame()
                    assert correlation_id(payload) == 1
                    assert _I16.unpack_from(payload, 4)[0] == 0  # ApiVersions error_code
                else:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST_LINGER)
                seen[kind] += 1  # this thread's own Counter
        finally:
            for _, sock in batch:
                sock.close()


def time_wait_sockets(port: int, remote: bool) -> int:
    """TIME_WAIT TCP sockets whose remote (or local) port is ``port``, from /proc/net/tcp."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address = fields[2] if remote else fields[1]
        if fields[3] == "06" and int(address.rpartition(":")[2], 16) == port:
            count += 1
    return count


def test_10k_connections_opened_and_closed_leave_nothing_behind(broker: EmbeddedBroker) -> None:
    """10,000 connect/close cycles, ~200 in parallel, through pidgate in front of tansu: every
    connection is accepted (none refused by a limit) and the answered ones get their
    ApiVersions; afterwards pidgate holds no connection and no more file descriptors than
    before (no leak, also not for connections reset before their broker side was connected),
    and a real idempotent producer kept delivering through the churn with zero errors, one PID,
    and every record exactly once in the broker."""
    config = {"proxy": {"broker_ports": {TANSU_NODE_ID: free_port()}}}
    with pidgate_process(broker.bootstrap, config) as gate:
        topic = f"steady-churn-{os.getpid()}-{time.monotonic_ns()}"
        create_topic(gate.bootstrap, topic)  # also opens the broker listener (a lasting fd)
        wait_until(lambda: metric(scrape(gate), "pidgate_connections") == 0, 20, "admin closed")
        fds_before, rss_before = quiet_fd_count(gate.pid), rss_bytes(gate.pid)
        opened_before = metric(scrape(gate), "pidgate_connections_total")

        steady = SteadyProducer({"bootstrap.servers": gate.bootstrap}, topic).start()
        steady.wait_delivered(1, 30)
        fds_with_producer = quiet_fd_count(gate.pid)  # a figure: the producer may open more

        per_thread = CHURN_CONNECTIONS // CHURN_THREADS
        seen: list[Counter[str]] = [Counter() for _ in range(CHURN_THREADS)]
        address = ("127.0.0.1", gate.listen_port)
        started = time.monotonic()
        deadline = started + CHURN_DEADLINE_S
        cpu_before = cpu_seconds(gate.pid)
        workers = Workers(
            [
                functools.partial(churn, address, i * per_thread, per_thread, deadline, seen[i])
                for i in range(CHURN_THREADS)
            ]
        ).start()
        rss_peak = rss_before
        while workers.running and time.monotonic() < deadline:
            rss_peak = max(rss_peak, rss_bytes(gate.pid))
            time.sleep(0.2)
        workers.join(deadline, functools.partial(pidgate_view, gate))
        churn_seconds = time.monotonic() - started
        churn_cpu = cpu_seconds(gate.pid) - cpu_before
        by_kind = sum(seen, Counter[str]())
        assert sum(by_kind.values()) == CHURN_CONNECTIONS, by_kind
        time_wait_upstream = time_wait_sockets(broker.port, remote=True)

        # The churn leaves nothing: at most the producer's own connections (bootstrap and
        # broker listener), each holding two file descriptors (client and broker side).
        def churn_gone() -> bool:
            open_now = metric(scrape(gate), "pidgate_connections")
            return open_now <= 2 and quiet_fd_count(gate.pid) <= fds_before + 2 * open_now

        wait_until(churn_gone, 30, "churn connections and their fds gone", step_s=0.2)
        samples = scrape(gate)
        assert metric(samples, "pidgate_connections_total") - opened_before >= CHURN_CONNECTIONS
        errors = protocol_errors(samples)
        assert not any(kind.startswith("connection_limit") for kind in errors), errors
        steady.wait_delivered(len(steady.delivered) + 3, 20)  # still producing after the churn
        during = delivered_between(steady, started, started + churn_seconds)
        steady.finish()
        assert steady.errors == []

        wait_until(lambda: metric(scrape(gate), "pidgate_connections") == 0, 30, "all closed")
        wait_until(lambda: quiet_fd_count(gate.pid) <= fds_before, 30, "fds back to baseline")
        fds_after, rss_after = quiet_fd_count(gate.pid), rss_bytes(gate.pid)
        in_log = producer_ids_in_log(broker.bootstrap, topic, [0])
        assert len(in_log) == 1, in_log  # one PID: the producer never had to start over
        assert sum(in_log.values()) == len(steady.delivered)  # each record exactly once
        record_figures(
            "floods.connections",
            connections=CHURN_CONNECTIONS,
            by_kind=dict(by_kind),
            seconds=round(churn_seconds, 2),
            connections_per_s=round(CHURN_CONNECTIONS / churn_seconds),
            pidgate_cpu_s=round(churn_cpu, 2),
            fds_before=fds_before,
            fds_with_producer=fds_with_producer,
            fds_after=fds_after,
            rss_before=rss_before,
            rss_peak=rss_peak,
            rss_after=rss_after,
            upstream_time_wait=time_wait_upstream,
            protocol_errors=errors,
            steady_delivered_during=during,
            steady_delivered=len(steady.delivered),
        )
        assert during > 0, "the steady producer delivered nothing during the churn"
        assert rss_after - rss_before < 64 * MIB


# -- 2. 100,000 principals -----------------------------------------------------------------------

PRINCIPALS = 100_000
MAX_PRINCIPALS = 10_000
#: Far above MAX_PRINCIPALS x SMALLEST_LAYER_BITS (2.56M), so max_principals is the cap that
#: binds.
MAX_TOTAL_BITS = 150_000_000
SASL_CONNECTIONS = 16
SASL_DEADLINE_S = 150
SASL_TOPIC = "principals"
GOOD_USER = "good"
PASSWORD = "pw-floods"


def _serve_sasl_broker(control: Connection, users: list[str]) -> None:
    """In a child process (its own GIL, so the flood's client threads do not slow it): the
    scripted SASL broker, until told to stop; on request, what it received."""
    with ScriptedSaslBroker(
        dict.fromkeys(users, PASSWORD),
        mechanisms=("PLAIN",),
        allow_principal_change=True,
        topics=[SASL_TOPIC],
    ) as broker:
        control.send(broker.bootstrap)
        while control.recv() == "produced":
            control.send([(p.user, p.producer_ids) for p in broker.produced])


@contextlib.contextmanager
def sasl_broker_process(users: list[str]) -> Iterator[tuple[str, Connection]]:
    """(bootstrap, control pipe) of a ScriptedSaslBroker in a child process, ended at exit."""
    context = multiprocessing.get_context("spawn")
    control, child_end = context.Pipe()
    process = context.Process(
        target=_serve_sasl_broker, args=(child_end, users), name="sasl-broker", daemon=True
    )
    process.start()
    try:
        assert control.poll(60), "scripted SASL broker did not start"
        yield str(control.recv()), control
    finally:
        with contextlib.suppress(OSError):
            control.send("stop")
        process.join(15)
        if process.is_alive():
            process.kill()
            process.join(5)


def plain_authenticate(user: str, correlation: int) -> bytes:
    token = f"\0{user}\0{PASSWORD}".encode()
    return request_frame(SASL_AUTHENTICATE, 1, correlation, _SIZE.pack(len(token)) + token)


def principal_churn(
    address: str, users: list[str], first_pid: int, deadline: float, produced: list[int]
) -> None:
    """On one connection, for each user in turn: SaslHandshake v1, SaslAuthenticate v1 (PLAIN;
    from the second user on a KIP-368 re-authentication as another user), then one Produce
    with a fresh PID, which must be admitted (the user's bucket starts full).

    One request at a time, as real clients do: pidgate reads the authenticate token only once
    the handshake is answered, and the principal changes when the broker's answer passes, so a
    pipelined SaslAuthenticate or Produce would still be charged to the previous user (or, on
    the first exchange, close the connection). Pipelining the Produce with the next handshake
    would also make the scripted broker's two answers wait for a delayed ACK (no TCP_NODELAY
    there), ~40 ms each."""
    factory = BatchFactory()
    handshake_body = kafka_string("PLAIN")
    with connect(address) as sock:
        reader = FrameReader(sock)
        for index, user in enumerate(users):
            if index % 256 == 0 and time.monotonic() > deadline:
                raise AssertionError("principal churn missed its deadline")
            cid = 3 * index
            sock.sendall(request_frame(SASL_HANDSHAKE, 1, cid, handshake_body))
            assert _I16.unpack_from(reader.frame(), 4)[0] == 0, f"handshake for {user}"
            sock.sendall(plain_authenticate(user, cid + 1))
            assert _I16.unpack_from(reader.frame(), 4)[0] == 0, f"authentication of {user}"
            pid = first_pid + index
            body = produce_body([(SASL_TOPIC, factory.batch(pid))])
            sock.sendall(request_frame(PRODUCE, PRODUCE_VERSION, cid + 2, body))
            error = first_partition_error(reader.frame(), SASL_TOPIC)
            assert error == 0, f"{user}'s first PID was refused ({error})"
            produced.append(pid)


@dataclass
class Sample:
    at_s: float
    principals_done: int
    tracked: float
    evicted: float
    bits: float
    rss: int


def test_100k_principals_are_capped_evicted_idlest_first_and_counted() -> None:
    """100,000 SASL principals each activate one new PID through pidgate (identity.sasl) in
    front of the scripted SASL broker, with quota.max_principals 10,000: pidgate never tracks
    more than the cap (sampled during the flood), ends with exactly the cap, has evicted
    exactly the 90,001 principals beyond it (100,001 tracked in all: the flood's and the good
    one) and shows that in /metrics and /state, evicted idlest first (on each connection the
    principals still tracked are the last ones it authenticated), kept Bloom bits under
    quota.max_total_bits, and a principal with its own quota producing throughout (a real SASL
    PLAIN librdkafka producer) was never rejected nor evicted (its one PID counted new exactly
    once). Every principal's PID reached the broker. pidgate's RSS grows by less than 32 MiB
    while the 90,000 principals after the cap pass."""
    names = [f"user-{i}" for i in range(PRINCIPALS)]
    with sasl_broker_process([*names, GOOD_USER]) as (bootstrap, control):
        config = {
            "proxy": {"broker_ports": {1: free_port()}},
            "identity": {"sasl": True},
            "quota": {
                "producer.id.quota.window.size.seconds": 3600,
                "users": {
                    "<default>": {"producer_ids_rate": 1},
                    GOOD_USER: {"producer_ids_rate": 5},
                },
                "max_principals": MAX_PRINCIPALS,
                "max_total_bits": MAX_TOTAL_BITS,
                # No SASL credentials for pidgate's PID frontier probe here: grandfathering
                # would run in learning mode; this test is about caps and eviction.
                "grandfather_grace_ms": 0,
            },
            # Every flood request answered at once: this test is about what the principals cost.
            "rejection": {"max_hold_ms": 0},
        }
        with pidgate_process(bootstrap, config) as gate:
            rss_before = rss_bytes(gate.pid)
            good = SteadyProducer(
                {
                    "bootstrap.servers": gate.bootstrap,
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": GOOD_USER,
                    "sasl.password": PASSWORD,
                },
                SASL_TOPIC,
            ).start()
            good.wait_delivered(1, 30)

            chunks = [names[i::SASL_CONNECTIONS] for i in range(SASL_CONNECTIONS)]
            produced: list[list[int]] = [[] for _ in chunks]
            started = time.monotonic()
            deadline = started + SASL_DEADLINE_S
            cpu_before = cpu_seconds(gate.pid)
            workers = Workers(
                [
                    functools.partial(
                        principal_churn,
                        gate.bootstrap,
                        chunk,
                        10_000_000 + i * 1_000_000,
                        deadline,
                        done,
                    )
                    for i, (chunk, done) in enumerate(zip(chunks, produced, strict=True))
                ]
            ).start()
            samples: list[Sample] = []
            while workers.running and time.monotonic() < deadline:
                now = scrape(gate)
                samples.append(
                    Sample(
                        at_s=time.monotonic() - started,
                        principals_done=sum(len(p) for p in produced),
                        tracked=metric(now, "pidgate_principals_tracked"),
                        evicted=metric(now, "pidgate_principals_evicted_total"),
                        bits=metric(now, "pidgate_bloom_filter_bytes") * 8,
                        rss=rss_bytes(gate.pid),
                    )
                )
                # Sparse: a scrape walks every tracked principal (see scrape_ms below).
                for _ in range(50):
                    if not workers.running:
                        break
                    time.sleep(0.1)
            workers.join(deadline, functools.partial(pidgate_view, gate))
            churn_seconds = time.monotonic() - started
            churn_cpu = cpu_seconds(gate.pid) - cpu_before
            scrape_started = time.monotonic()
            scrape(gate)
            scrape_ms = (time.monotonic() - scrape_started) * 1000
            done = sum(len(p) for p in produced)
            assert done == PRINCIPALS, done

            good.wait_delivered(len(good.delivered) + 3, 20)
            during = delivered_between(good, started, started + churn_seconds)
            good.finish()
            final = scrape(gate)
            memory = state(gate)
            rss_after = rss_bytes(gate.pid)
            control.send("produced")
            at_broker: list[tuple[str | None, tuple[int, ...]]] = control.recv()

    # Every principal's PID reached the broker, charged there to the user it authenticated.
    expected = {
        (user, pid)
        for chunk, pids in zip(chunks, produced, strict=True)
        for user, pid in zip(chunk, pids, strict=True)
    }
    flood_at_broker = {(u, pids[0]) for u, pids in at_broker if u != GOOD_USER}
    assert flood_at_broker == expected

    # The cap held at every sample and binds at the end; evictions are exact and visible.
    tracked_ever = PRINCIPALS + 1  # + the good principal
    assert max(s.tracked for s in samples) <= MAX_PRINCIPALS
    assert metric(final, "pidgate_principals_tracked") == MAX_PRINCIPALS
    assert metric(final, "pidgate_principals_evicted_total") == tracked_ever - MAX_PRINCIPALS
    assert memory["memory"]["principals_evicted"] == tracked_ever - MAX_PRINCIPALS
    assert memory["memory"]["principals_tracked"] == MAX_PRINCIPALS
    # Bloom memory: one layer per principal, under the bits cap at every sample.
    assert max(s.bits for s in samples) <= MAX_TOTAL_BITS
    assert (
        metric(final, "pidgate_bloom_filter_bytes") * 8
        == MAX_PRINCIPALS * SMALLEST_LAYER_BITS
        <= MAX_TOTAL_BITS
    )

    # Idlest first: on each connection, the principals still tracked are its latest ones.
    tracked = {p["principal"].removeprefix("User:") for p in memory["principals"]}
    assert GOOD_USER in tracked
    for chunk in chunks:
        kept = [user for user in chunk if user in tracked]
        assert kept == chunk[len(chunk) - len(kept) :], "a more recent principal was evicted"

    # The good principal: never rejected, never evicted (its PID was new exactly once).
    assert good.errors == []
    assert during > 0, "the good producer delivered nothing during the flood"
    assert metric(final, "pidgate_producer_ids_new_total", user=GOOD_USER) == 1
    assert metric(final, "pidgate_produce_requests_rejected_total", user=GOOD_USER) == 0

    # RSS: once the cap is reached, more principals cost no more memory (bounded growth).
    at_cap = [s for s in samples if s.evicted > 0]
    assert at_cap, "no sample after the cap was reached"
    rss_at_cap = at_cap[0].rss
    record_figures(
        "floods.principals",
        principals=PRINCIPALS,
        max_principals=MAX_PRINCIPALS,
        seconds=round(churn_seconds, 2),
        principals_per_s=round(PRINCIPALS / churn_seconds),
        pidgate_cpu_s=round(churn_cpu, 2),
        evicted=metric(final, "pidgate_principals_evicted_total"),
        tracked_max=max(s.tracked for s in samples),
        bloom_bits=metric(final, "pidgate_bloom_filter_bytes") * 8,
        bloom_bits_max=max(s.bits for s in samples),
        max_total_bits=MAX_TOTAL_BITS,
        rss_before=rss_before,
        rss_at_cap=rss_at_cap,
        principals_at_cap_sample=at_cap[0].principals_done,
        rss_after=rss_after,
        rss_max=max(s.rss for s in samples),
        good_delivered_during=during,
        scrape_ms_at_cap=round(scrape_ms, 1),
        samples=len(samples),
    )
    assert rss_after - rss_at_cap < 32 * MIB


# -- 3. 1,000,000 PIDs from one principal ---------------------------------------------------------

FLOOD_PIDS = 1_000_000
PIDS_PER_REQUEST = 100
FLOOD_REQUESTS = FLOOD_PIDS // PIDS_PER_REQUEST
FLOOD_CONNECTIONS = 4
FLOOD_RATE = 1000
FLOOD_WINDOW_S = 10
WINDOW_NUM = 11  # producer.id.quota.window.num default
FLOOD_MAX_TOTAL_BITS = 1 << 22
FLOOD_DEADLINE_S = 150
#: Far above the PIDs tansu hands out (from 1), so the flood never uses a real one.
FIRST_FLOOD_PID = 1 << 40
#: Requests answered when 100,000 PIDs have been thrown: the first checkpoint.
CHECKPOINT_REQUESTS = 100_000 // PIDS_PER_REQUEST


@dataclass
class FloodTally:
    """What the flood's connections were answered, shared by their reader threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    answered: int = 0
    forwarded: list[int] = field(default_factory=list)  # request indexes the broker answered
    rejected: int = 0
    codes: Counter[int] = field(default_factory=Counter)

    def record(self, request: int, error_code: int) -> None:
        with self.lock:
            self.answered += 1
            self.codes[error_code] += 1
            if error_code == REJECTED_DEFAULT:
                self.rejected += 1
            else:
                self.forwarded.append(request)


def pid_flood(
    address: str,
    requests: range,
    frame_for: Callable[[int], bytes],
    first_topic: str,
    deadline: float,
    tally: FloodTally,
) -> None:
    """Pipeline ``requests`` on one connection (a writer thread; pidgate's max in-flight and
    backpressure pace it) and read every answer in order here."""
    failure: list[BaseException] = []

    with connect(address) as sock:

        def write() -> None:
            try:
                for start in range(0, len(requests), 10):
                    if time.monotonic() > deadline:
                        raise AssertionError("PID flood missed its deadline")
                    sock.sendall(b"".join(frame_for(r) for r in requests[start : start + 10]))
            except BaseException as error:  # reported by the reader
                failure.append(error)

        writer = threading.Thread(target=write, name="pid-flood-writer", daemon=True)
        writer.start()
        reader = FrameReader(sock)
        try:
            for request in requests:
                payload = reader.frame()
                assert correlation_id(payload) == request, "responses out of order"
                tally.record(request, first_partition_error(payload, first_topic))
        finally:
            with contextlib.suppress(OSError):  # unblocks the writer if reading failed
                sock.shutdown(socket.SHUT_RDWR)
            writer.join(30)
    if failure:
        raise failure[0]


def principal_bits(memory: dict[str, Any], principal: str) -> int:
    (entry,) = [p for p in memory["principals"] if p["principal"] == principal]
    return int(entry["bits"])


def test_1m_pids_from_one_principal_are_throttled_with_bounded_memory(
    broker: EmbeddedBroker,
) -> None:
    """1,000,000 distinct PIDs from User:ANONYMOUS (rate 1000 per 10 s window) in 10,000
    pipelined Produce requests, each 100 one-record batches (every one a new PID) in one
    partition plus a PID-less marker batch (timestamp = request index) in a second topic:
    pidgate charges every batch's PID (a request needs ~100 tokens), admits no more new PIDs
    than burst + rate x elapsed / window, answers the rest itself (counted exactly in
    pidgate_produce_requests_rejected, and per PID in pidgate_producer_ids_rejected), so the
    broker holds exactly the markers of the admitted requests; the principal's Bloom bits are
    bounded by its rate and window, not by the 1M PIDs (rejected PIDs are never recorded, so one
    principal cannot reach the global caps and nothing is evicted), and RSS grows by less than
    32 MiB from 100k to 1M PIDs; a librdkafka producer of the same principal whose PID was
    admitted before the flood keeps producing with zero errors and is never rejected."""
    run = f"{os.getpid()}-{time.monotonic_ns()}"
    flood_topic, marks_topic, steady_topic = (f"{n}-{run}" for n in ("flood", "marks", "steady"))
    config = {
        "proxy": {"broker_ports": {TANSU_NODE_ID: free_port()}},
        "quota": {
            "producer.id.quota.window.size.seconds": FLOOD_WINDOW_S,
            "producer.id.quota.window.num": WINDOW_NUM,
            "users": {"ANONYMOUS": {"producer_ids_rate": FLOOD_RATE}},
            "max_total_bits": FLOOD_MAX_TOTAL_BITS,
        },
        # Answered at once: holding or muting would only slow the flood down.
        "rejection": {"max_throttle_time_ms": 0, "max_hold_ms": 0},
    }
    with pidgate_process(broker.bootstrap, config) as gate:
        for topic in (flood_topic, marks_topic, steady_topic):
            create_topic(gate.bootstrap, topic)
        rss_before = rss_bytes(gate.pid)
        # Before the principal's first new PID, on both clocks: pidgate's quota clock is the
        # wall clock, so a step of it must not make the bound below too tight.
        quota_started, quota_started_wall = time.monotonic(), time.time()
        steady = SteadyProducer({"bootstrap.servers": gate.bootstrap}, steady_topic).start()
        steady.wait_delivered(1, 30)

        pid_batch = BatchFactory().batch
        mark_batch = BatchFactory(idempotent=False).batch
        mark_base_ms = int(time.time() * 1000)

        def frame_for(request: int) -> bytes:
            first = FIRST_FLOOD_PID + request * PIDS_PER_REQUEST
            pids = b"".join(pid_batch(first + i) for i in range(PIDS_PER_REQUEST))
            mark = mark_batch(timestamp_ms=mark_base_ms + request)
            body = produce_body([(flood_topic, pids), (marks_topic, mark)])
            return request_frame(PRODUCE, PRODUCE_VERSION, request, body)

        tally = FloodTally()
        started = time.monotonic()
        deadline = started + FLOOD_DEADLINE_S
        cpu_before = cpu_seconds(gate.pid)
        workers = Workers(
            [
                functools.partial(
                    pid_flood,
                    gate.bootstrap,
                    range(c, FLOOD_REQUESTS, FLOOD_CONNECTIONS),
                    frame_for,
                    flood_topic,
                    deadline,
                    tally,
                )
                for c in range(FLOOD_CONNECTIONS)
            ]
        ).start()
        wait_until(
            lambda: tally.answered >= CHECKPOINT_REQUESTS or not workers.running,
            FLOOD_DEADLINE_S,
            "100k PIDs answered",
        )
        checkpoint_s = time.monotonic() - started
        checkpoint = state(gate)
        rss_checkpoint = rss_bytes(gate.pid)
        workers.join(deadline, functools.partial(pidgate_view, gate))
        flood_seconds = time.monotonic() - started
        flood_cpu = cpu_seconds(gate.pid) - cpu_before
        assert tally.answered == FLOOD_REQUESTS, tally.answered

        steady.wait_delivered(len(steady.delivered) + 3, 20)
        during = delivered_between(steady, started, started + flood_seconds)
        final = scrape(gate)
        elapsed_s = max(time.monotonic() - quota_started, time.time() - quota_started_wall)
        memory = state(gate)
        rss_after = rss_bytes(gate.pid)
        steady.finish()

    user = "ANONYMOUS"
    forwarded = len(tally.forwarded)
    assert forwarded + tally.rejected == FLOOD_REQUESTS
    new_pids = metric(final, "pidgate_producer_ids_new_total", user=user)
    rejected_pids = metric(final, "pidgate_producer_ids_rejected_total", user=user)

    # Rate: never more new PIDs than one burst plus the refill over the time elapsed.
    allowed = FLOOD_RATE + FLOOD_RATE * elapsed_s / FLOOD_WINDOW_S
    assert new_pids <= allowed, (new_pids, allowed)
    # Every batch's PID is charged: a forwarded request took a token per new PID in it (a few
    # may pass free as Bloom false positives), so only ~allowed/100 requests got through.
    assert 1 <= forwarded <= allowed / (PIDS_PER_REQUEST - 10), forwarded
    assert new_pids <= 1 + forwarded * PIDS_PER_REQUEST  # + the steady producer's one PID
    # Rejections are counted: every rejected request, and its PIDs (less false positives).
    assert metric(final, "pidgate_produce_requests_rejected_total", user=user) == tally.rejected
    assert 0.99 * PIDS_PER_REQUEST * tally.rejected <= rejected_pids
    assert rejected_pids <= PIDS_PER_REQUEST * tally.rejected

    # Nothing rejected reached the broker: its marker topic holds exactly the forwarded ones.
    marks = [
        h.base_timestamp - mark_base_ms
        for h in fetch_batch_headers(broker.bootstrap, marks_topic, [0])
    ]
    assert sorted(marks) == sorted(tally.forwarded)

    # Memory is bounded by the rate, not by the PIDs thrown at it; the caps never bind.
    most_layers = WINDOW_NUM + 2 + int(new_pids) // 1000
    bits_checkpoint = principal_bits(checkpoint, f"User:{user}")
    bits_after = principal_bits(memory, f"User:{user}")
    assert bits_checkpoint <= most_layers * RATE_LAYER_BITS
    assert bits_after <= most_layers * RATE_LAYER_BITS
    assert memory["memory"]["bloom_bits"] == bits_after <= FLOOD_MAX_TOTAL_BITS
    assert memory["memory"]["principals_evicted"] == 0
    assert memory["memory"]["principals_tracked"] == 1

    # The well-behaved producer (same principal, known PID) never noticed: no error, and every
    # rejection counted above was the flood's.
    assert steady.errors == []
    assert during > 0, "the steady producer delivered nothing during the flood"
    in_log = producer_ids_in_log(broker.bootstrap, steady_topic, [0])
    assert len(in_log) == 1 and sum(in_log.values()) == len(steady.delivered), in_log

    record_figures(
        "floods.pids",
        pids=FLOOD_PIDS,
        requests=FLOOD_REQUESTS,
        seconds=round(flood_seconds, 2),
        pids_per_s=round(FLOOD_PIDS / flood_seconds),
        pidgate_cpu_s=round(flood_cpu, 2),
        forwarded_requests=forwarded,
        rejected_requests=tally.rejected,
        new_pids_admitted=new_pids,
        new_pids_allowed=round(allowed, 1),
        pids_rejected=rejected_pids,
        pids_passed_as_known=PIDS_PER_REQUEST * tally.rejected - rejected_pids,
        response_codes=dict(tally.codes),
        checkpoint_s=round(checkpoint_s, 2),
        bits_at_100k=bits_checkpoint,
        bits_at_1m=bits_after,
        bits_if_every_pid_were_kept=FLOOD_PIDS * RATE_LAYER_BITS // 1000,
        layers_at_1m=memory["principals"][0]["layers"],
        rss_before=rss_before,
        rss_at_100k=rss_checkpoint,
        rss_at_1m=rss_after,
        steady_delivered_during=during,
    )
    assert rss_after - rss_checkpoint < 32 * MIB
