"""Per-request CPU of pidgate against the floor (a trivial uvloop forwarder), small requests.

    python benchmarks/small_requests.py [--rounds 5] [--requests 20000] [--producers 16]
                                        [--records-per-producer 400] [--baseline-src DIR]
                                        [--profile FILE] [--only WORKLOAD] [--minimal-gate]
                                        [--typed-gate] [--paths compiled,pure]
                                        [--grandfather-grace-ms MS]

The PID-explosion workload is many producers sending small requests, so what pidgate costs per
request matters more than what it costs per byte. This script starts one tansu broker, the
floor (``forwarder.py``: an asyncio.Protocol pair that only copies bytes) and ``pidgate serve``
with quotas on (every Produce goes through the Gatekeeper and the layered Bloom filter), each
its own process on 127.0.0.1, and runs the same workloads through both, interleaved, in every
round:

* ``pingpong-known``: raw Produce v9 frames (one 100-byte record, acks=1) of one known PID on
  one connection, one in flight: send, wait for the response, send the next.
* ``pipelined-known``: the same frames with 32 in flight on one connection.
* ``pipelined-new``: 32 in flight, every request from a PID pidgate has not seen (admitted:
  the quota is high), so every request takes the miss path: all layers scanned, a token
  taken, bits set. The PIDs are not the broker's (see ``UNKNOWN_PRODUCER_ID``), so tansu
  answers each with an error, through both proxies alike. Every pidgate runs with
  ``quota.grandfather_grace_ms: 0`` unless ``--grandfather-grace-ms`` says otherwise: the
  steady state. For one layer's span after it starts (5.5 min by default) pidgate may admit a
  PID the cluster allocated before then for free, and the quota's compiled shortcut leaves
  every new PID to the Python path meanwhile (``-1`` measures that: pidgate's own default).
* ``librdkafka``: ``--producers`` confluent-kafka producers (idempotent, so acks=all,
  ``linger.ms=0``), each in its own thread producing one record and waiting for its delivery
  report, ``--records-per-producer`` times: one record per Produce request, many connections.

``--paths`` (default ``compiled,pure``) says which of pidgate's data paths are measured
(issue #25, ``pidgate.protocol.native``): ``pidgate`` runs the compiled per-request primitives
(``PIDGATE_PURE_PYTHON`` unset) and ``pidgate-pure`` a second ``pidgate serve`` with
``PIDGATE_PURE_PYTHON=1``, both in every round beside the floor. With ``--paths pure`` alone
the ``pidgate`` target itself runs the pure path. Each process's path is read from its memory
map (is ``_speedups`` loaded?) and printed; a "compiled" target found pure stops the run.

``--minimal-gate`` adds two processes on the raw-frame workloads: ``minimal_gate.py`` (frames
cut, headers and correlation ids read, nothing else) and ``minimal_gate.py --quota`` (the same
plus pidgate's lean walk and quota decision per Produce, nothing else of pidgate). They show how
much of pidgate's distance from the floor any Python process that reads Kafka frames pays on
this machine, and how much any that also enforces a PID quota pays. ``--typed-gate`` adds the
same two written as typed Cython classes (``minimal_gate.py --typed``, compiled on first use;
Cython must be importable): what a compiled per-connection path could reach (issue #25).

CPU is each proxy process's schedstat time (all threads, ns) over the run, divided by the
Produce requests the run sent. The ``BENCH_SMALL`` line gives per workload the floor's and
pidgate's µs per request and their ratio (medians of the per-round paired ratios), and the
throughput ratio of pidgate to the floor; with both paths also pidgate-pure's, and the
compiled/pure ratio (paired per round). Everything started here is stopped by PID. No test
imports this: it measures, it asserts nothing about speed. ``bench.py`` imports it for these
rounds; it imports ``support/`` (the processes, py-spy) and never ``bench.py``.
"""

# Report lines are long f-strings.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder
from kafka.record.util import calc_crc32c
from support.processes import Broker, Cpu, Forwarder, Pidgate, exit_on_sigterm
from support.pyspy import print_profile, start_profile

from pidgate.demo.broker import free_port

TOPIC = "pidgate-small"
VALUE = b"v" * 100
PRODUCE_VERSION = 9
PIPELINE_DEPTH = 32
#: The processes measured besides the floor and pidgate, when asked for.
OTHERS = ("baseline", "minimal", "minimal_quota", "typed", "typed_quota", "typed_inline")
#: The reference gates among them: raw frames only (they rewrite no endpoints).
GATES = ("minimal", "minimal_quota", "typed", "typed_quota", "typed_inline")
#: pidgate's data paths (``--paths``); the second pidgate process, on the pure path beside the
#: compiled one.
PATHS = ("compiled", "pure")
PURE = "pidgate-pure"
#: Issue #25's bounds on pidgate CPU per request / the floor's (no bound for ``librdkafka``).
TARGETS = {"pingpong-known": 1.3, "pipelined-known": 1.3, "pipelined-new": 1.5}
WORKLOAD_NAMES = ("pingpong-known", "pipelined-known", "pipelined-new", "librdkafka")


# -- raw frames -------------------------------------------------------------------------------

# RecordBatch v2 offsets (KAFKA-NOTES: record batch layout).
_CRC_AT, _ATTRIBUTES_AT, _PRODUCER_ID_AT, _BASE_SEQUENCE_AT = 17, 21, 43, 53


def _template(topic: str) -> tuple[bytes, int]:
    """One framed Produce v9 request (acks=1, one record of 100 bytes) and where its record
    batch starts in the frame."""
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 20,
        offset=0,
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
    )
    builder.append(timestamp=int(time.time() * 1000), key=None, value=VALUE)
    builder.close()
    batch = bytes(builder.buffer())
    T = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        version=PRODUCE_VERSION,
        transactional_id=None,
        acks=1,
        timeout_ms=10_000,
        topic_data=[T(name=topic, partition_data=[T.PartitionProduceData(index=0, records=batch)])],
    )
    request.with_header(correlation_id=0, client_id="small")
    body = request.encode(version=PRODUCE_VERSION, header=True, framed=True)
    return bytes(body), bytes(body).index(batch)


def produce_frames(
    topic: str, producer_ids: Callable[[int], int], sequences: Callable[[int], int], count: int
) -> list[bytes]:
    """``count`` framed Produce requests, correlation ids 0..count-1, request i from producer
    ``producer_ids(i)`` at base sequence ``sequences(i)`` (CRC-32C recomputed)."""
    frame, at = _template(topic)
    out = []
    for i in range(count):
        buf = bytearray(frame)
        struct.pack_into(">i", buf, 8, i)  # correlation id, after size, api key and version
        struct.pack_into(">q", buf, at + _PRODUCER_ID_AT, producer_ids(i))
        struct.pack_into(">i", buf, at + _BASE_SEQUENCE_AT, sequences(i))
        struct.pack_into(">I", buf, at + _CRC_AT, calc_crc32c(bytes(buf[at + _ATTRIBUTES_AT :])))
        out.append(bytes(buf))
    return out


def init_producer_ids(address: str, count: int) -> list[int]:
    """``count`` fresh PIDs from the broker behind ``address`` (InitProducerId v4, pipelined on
    one connection): tansu answers 59 UNKNOWN_PRODUCER_ID to a PID it did not allocate."""
    from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

    request = InitProducerIdRequest(
        version=4,
        transactional_id=None,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    request.with_header(correlation_id=1, client_id="small")
    frame = bytes(request.encode(version=4, header=True, framed=True))
    host, _, port = address.rpartition(":")
    out = []
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.settimeout(30)
        buffer = bytearray()
        for start in range(0, count, 256):
            chunk = min(256, count - start)
            sock.sendall(frame * chunk)
            for _ in range(chunk):
                payload, buffer = _recv_frame(sock, buffer)
                response = InitProducerIdResponse.decode(payload, version=4, header=True)
                if response.error_code:
                    raise RuntimeError(f"InitProducerId failed: {response}")
                out.append(int(response.producer_id))
    return out


def _recv_frame(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytearray]:
    while True:
        if len(buffer) >= 4:
            size = int.from_bytes(buffer[:4], "big")
            if len(buffer) >= 4 + size:
                return bytes(buffer[4 : 4 + size]), buffer[4 + size :]
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("connection closed mid-frame")
        buffer += chunk


def _check_response(payload: bytes, expected_error: int) -> None:
    response = ProduceResponse.decode(payload, version=PRODUCE_VERSION, header=True)
    errors = [p.error_code for t in response.responses for p in t.partition_responses]
    if errors != [expected_error]:
        raise RuntimeError(f"Produce answered {errors}, expected [{expected_error}]")


def send_frames(address: str, frames: list[bytes], depth: int, expected_error: int = 0) -> None:
    """Send ``frames`` on one connection, at most ``depth`` unanswered; every response must
    carry ``expected_error`` (checked on every 64th and the last: decoding costs the client
    CPU) and come in request order."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), 10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(30)
        sent = 0
        buffer = bytearray()
        first = min(depth, len(frames))
        sock.sendall(b"".join(frames[:first]))
        sent = first
        for i in range(len(frames)):
            payload, buffer = _recv_frame(sock, buffer)
            if int.from_bytes(payload[:4], "big") != i:
                raise RuntimeError(f"response {i} answered out of order")
            if not i & 63 or i == len(frames) - 1:
                _check_response(payload, expected_error)
            if sent < len(frames):
                sock.sendall(frames[sent])
                sent += 1


# -- workloads --------------------------------------------------------------------------------


@dataclass
class Workload:
    name: str
    prepare: Callable[[str], Any]  # bootstrap -> what run needs (not timed)
    run: Callable[[str, Any], int]  # (bootstrap, prepared) -> Produce requests sent


#: tansu 0.6's in-memory engine slows down with every PID it allocates (InitProducerId and
#: each Produce scan them all: 1,000 more PIDs took it from ~5,000 to ~1,200 requests/s), so
#: the new-PID workload cannot use broker-allocated PIDs by the thousand.
UNKNOWN_PRODUCER_ID = 59


def raw_workloads(requests: int) -> list[Workload]:
    # One PID per target for every known-PID run; its sequence goes on from run to run.
    known: dict[str, tuple[int, list[int]]] = {}
    new_pids = iter(range(1 << 40, 1 << 41, 1 << 20))

    def known_frames(bootstrap: str) -> list[bytes]:
        if bootstrap not in known:
            known[bootstrap] = (init_producer_ids(bootstrap, 1)[0], [0])
        pid, next_sequence = known[bootstrap]
        first = next_sequence[0]
        next_sequence[0] += requests
        return produce_frames(TOPIC, lambda _: pid, lambda i: first + i, requests)

    def new_frames(bootstrap: str) -> list[bytes]:
        # PIDs the broker never allocated: tansu answers UNKNOWN_PRODUCER_ID, and the proxies
        # do exactly what they do for an admitted new PID (pidgate: every layer scanned, a
        # token taken, bits set, then the frame forwarded and the answer passed back).
        base = next(new_pids)
        return produce_frames(TOPIC, lambda i: base + i, lambda _: 0, requests)

    def send(depth: int, expected_error: int = 0) -> Callable[[str, list[bytes]], int]:
        def run(bootstrap: str, frames: list[bytes]) -> int:
            send_frames(bootstrap, frames, depth, expected_error)
            return len(frames)

        return run

    return [
        Workload("pingpong-known", known_frames, send(1)),
        Workload("pipelined-known", known_frames, send(PIPELINE_DEPTH)),
        Workload("pipelined-new", new_frames, send(PIPELINE_DEPTH, UNKNOWN_PRODUCER_ID)),
    ]


def librdkafka_workload(producers: int, records: int) -> Workload:
    def prepare(bootstrap: str) -> list[Producer]:
        clients = [
            Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 0,
                    "log_level": 3,
                }
            )
            for _ in range(producers)
        ]
        for client in clients:  # metadata and InitProducerId before the clock starts
            client.produce(TOPIC, VALUE)
            if client.flush(30):
                raise RuntimeError("warm-up record not delivered")
        return clients

    def run(bootstrap: str, clients: list[Producer]) -> int:
        failures: list[Any] = []
        start = threading.Barrier(producers + 1)

        def one(client: Producer) -> None:
            def on_delivery(error: Any, _message: Any) -> None:
                if error is not None:
                    failures.append(error)

            start.wait()
            for _ in range(records):
                client.produce(TOPIC, VALUE, on_delivery=on_delivery)
                client.flush(30)

        threads = [threading.Thread(target=one, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        start.wait()
        for t in threads:
            t.join()
        if failures:
            raise RuntimeError(f"{len(failures)} delivery failures, first {failures[0]}")
        return producers * records

    return Workload("librdkafka", prepare, run)


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Measured:
    us_per_request: dict[str, list[float]] = field(default_factory=dict)
    requests_per_s: dict[str, list[float]] = field(default_factory=dict)
    cpu_ratio: list[float] = field(default_factory=list)
    throughput_ratio: list[float] = field(default_factory=list)
    #: baseline/floor, minimal/floor and minimal_quota/floor CPU ratios, paired per round like
    #: ``cpu_ratio``.
    other_cpu_ratios: dict[str, list[float]] = field(default_factory=dict)
    #: pidgate-pure/floor CPU and throughput, and pidgate (compiled)/pidgate-pure CPU, paired.
    pure_cpu_ratio: list[float] = field(default_factory=list)
    pure_throughput_ratio: list[float] = field(default_factory=list)
    compiled_pure_ratio: list[float] = field(default_factory=list)


def measure_round(
    workload: Workload,
    targets: dict[str, tuple[str, Cpu]],
    results: dict[str, Measured],
    order: list[str],
) -> str:
    got = results.setdefault(workload.name, Measured())
    line = []
    per: dict[str, tuple[float, float]] = {}
    for name in order:
        bootstrap, cpu = targets[name]
        prepared = workload.prepare(bootstrap)
        cpu0 = cpu.schedstat_ns()
        t0 = time.perf_counter()
        count = workload.run(bootstrap, prepared)
        elapsed = time.perf_counter() - t0
        us = (cpu.schedstat_ns() - cpu0) / 1000 / count
        per[name] = (us, count / elapsed)
        got.us_per_request.setdefault(name, []).append(us)
        got.requests_per_s.setdefault(name, []).append(count / elapsed)
        line.append(f"{name} {us:.1f} µs/req {count / elapsed:,.0f} req/s")
    got.cpu_ratio.append(per["pidgate"][0] / per["floor"][0])
    got.throughput_ratio.append(per["pidgate"][1] / per["floor"][1])
    extra = ""
    if PURE in per:
        got.pure_cpu_ratio.append(per[PURE][0] / per["floor"][0])
        got.pure_throughput_ratio.append(per[PURE][1] / per["floor"][1])
        got.compiled_pure_ratio.append(per["pidgate"][0] / per[PURE][0])
        extra += f" pure/floor {got.pure_cpu_ratio[-1]:.2f} compiled/pure {got.compiled_pure_ratio[-1]:.2f}"
    for other in OTHERS:
        if other in per:
            ratio = per[other][0] / per["floor"][0]
            got.other_cpu_ratios.setdefault(other, []).append(ratio)
            extra += f" {other}/floor {ratio:.2f}"
    return (
        f"{workload.name:16s} "
        + " | ".join(line)
        + f" | pidgate/floor CPU {got.cpu_ratio[-1]:.2f}{extra}"
    )


def _rounds(ratios: list[float]) -> str:
    return ", ".join(f"{r:.2f}" for r in ratios)


def report(results: dict[str, Measured], pidgate_path: str = "compiled") -> str:
    med = statistics.median
    print("\n== small requests: medians over rounds (CPU ratio paired per round) ==")
    fields = []
    for name, m in results.items():
        floor, pidgate = med(m.us_per_request["floor"]), med(m.us_per_request["pidgate"])
        others = "".join(
            f", {other} {med(m.us_per_request[other]):.1f} µs "
            f"({med(m.other_cpu_ratios[other]):.2f}x floor)"
            for other in OTHERS
            if other in m.us_per_request
        )
        print(
            f"{name:16s} CPU/request floor {floor:6.1f} µs  pidgate {pidgate:6.1f} µs{others}  "
            f"ratio {med(m.cpu_ratio):.2f} (rounds {', '.join(f'{r:.2f}' for r in m.cpu_ratio)})  "
            f"throughput pidgate/floor {med(m.throughput_ratio):.2f}"
        )
        key = name.replace("-", "_")
        fields.append(
            f"{key}_floor_us={floor:.1f} {key}_pidgate_us={pidgate:.1f} "
            f"{key}_cpu_ratio={med(m.cpu_ratio):.2f} {key}_throughput_ratio={med(m.throughput_ratio):.2f}"
        )
        target = TARGETS.get(name)
        if m.compiled_pure_ratio:
            pure = med(m.us_per_request[PURE])
            print(
                f"{'':16s} paths: compiled {pidgate:6.1f} µs ({med(m.cpu_ratio):.2f}x floor)  "
                f"pure {pure:6.1f} µs ({med(m.pure_cpu_ratio):.2f}x floor, rounds "
                f"{_rounds(m.pure_cpu_ratio)})  compiled/pure {med(m.compiled_pure_ratio):.2f} "
                f"(rounds {_rounds(m.compiled_pure_ratio)})  throughput pure/floor "
                f"{med(m.pure_throughput_ratio):.2f}"
            )
            fields.append(
                f"{key}_pidgate_pure_us={pure:.1f} {key}_pure_cpu_ratio={med(m.pure_cpu_ratio):.2f} "
                f"{key}_pure_throughput_ratio={med(m.pure_throughput_ratio):.2f} "
                f"{key}_compiled_pure_cpu_ratio={med(m.compiled_pure_ratio):.2f}"
            )
        if target:
            met = "met" if med(m.cpu_ratio) <= target else "not met"
            pure_met = (
                f"; pure {'met' if med(m.pure_cpu_ratio) <= target else 'not met'}"
                if m.compiled_pure_ratio
                else ""
            )
            print(f"{'':16s} issue #25 bound <= {target}: {pidgate_path} {met}{pure_met}")
        for other in GATES:
            if other in m.us_per_request:
                fields.append(
                    f"{key}_{other}_us={med(m.us_per_request[other]):.1f} "
                    f"{key}_{other}_cpu_ratio={med(m.other_cpu_ratios[other]):.2f}"
                )
    return " ".join(fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=20_000, help="per raw-frame run")
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--records-per-producer", type=int, default=400)
    parser.add_argument(
        "--only",
        metavar="WORKLOAD[,WORKLOAD]",
        help=f"run only these workloads, of: {', '.join(WORKLOAD_NAMES)}",
    )
    parser.add_argument(
        "--minimal-gate",
        action="store_true",
        help="also measure minimal_gate.py (frames, headers, correlation ids; no quota) and "
        "minimal_gate.py --quota (plus the lean walk and the quota decision) on the raw-frame "
        "workloads: the least any Python Kafka-aware gate, and any with a PID quota, pays here",
    )
    parser.add_argument(
        "--typed-gate",
        action="store_true",
        help="also measure minimal_gate.py --typed and --typed --quota (the same gates as "
        "typed Cython classes, compiled on first use: needs Cython) on the raw-frame workloads",
    )
    parser.add_argument(
        "--paths",
        type=_paths,
        default=PATHS,
        metavar="compiled,pure",
        help="pidgate's data paths to measure, each its own pidgate process in every round "
        "(default both: 'pidgate' compiled, 'pidgate-pure' with PIDGATE_PURE_PYTHON=1; "
        "'pure' alone runs 'pidgate' on the pure path)",
    )

    parser.add_argument(
        "--grandfather-grace-ms",
        type=int,
        default=0,
        metavar="MS",
        help="every pidgate's quota.grandfather_grace_ms (default 0: the steady state; -1: "
        "pidgate's own default, one layer's span, 5.5 min, in which the quota's compiled "
        "shortcut leaves every new PID to the Python path)",
    )


def _paths(value: str) -> tuple[str, ...]:
    paths = tuple(p.strip() for p in value.split(",") if p.strip())
    if not paths or any(p not in PATHS for p in paths) or len(set(paths)) != len(paths):
        raise argparse.ArgumentTypeError(f"a comma list of {', '.join(PATHS)}, not {value!r}")
    return tuple(p for p in PATHS if p in paths)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    add_arguments(parser)
    parser.add_argument("--baseline-src", metavar="DIR", help="also run pidgate from this tree")
    parser.add_argument("--profile", metavar="FILE", help="py-spy pidgate (raw stacks to FILE)")
    args = parser.parse_args()
    print(f"BENCH_SMALL pidgate_path={args.paths[0]} {run(args)}", flush=True)
    return 0


def run(args: argparse.Namespace) -> str:
    """Every round of every workload, printed as it goes; returns the BENCH fields."""
    only = getattr(args, "only", None)
    unknown = set((only or "").split(",")) - set(WORKLOAD_NAMES) - {""}
    if unknown:  # a typo would otherwise run nothing and print an empty summary
        raise SystemExit(f"--only {only}: no workload {', '.join(sorted(unknown))}")
    log_dir = Path(tempfile.mkdtemp(prefix="pidgate-small-"))
    forwarder_port = free_port()
    floor_broker = broker = pure_broker = forwarder = pidgate = pure = None
    baseline = None
    gates: list[Forwarder] = []
    paths = getattr(args, "paths", PATHS)
    try:
        floor_broker = Broker(log_dir, "tansu-floor", forwarder_port)
        broker = Broker(log_dir, "tansu")
        forwarder = Forwarder(forwarder_port, floor_broker.address, log_dir)
        # pidgate-pure gets a broker of its own, as the floor has: tansu keeps every record in
        # memory, so a shared broker would hold both pidgates' records.
        pure_broker = Broker(log_dir, "tansu-pure") if len(paths) > 1 else None
        brokers = [forwarder.bootstrap, broker.address]
        for bootstrap in brokers + ([pure_broker.address] if pure_broker else []):
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for future in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
                with contextlib.suppress(Exception):  # already there is fine
                    future.result(15)
        # A quota so high every new PID is admitted: the miss path runs, nothing is rejected.
        pidgate_path = paths[0]  # "compiled" when listed
        grace = getattr(args, "grandfather_grace_ms", 0)
        quota: dict[str, Any] = {
            "rate": 1_000_000_000,
            "grandfather_grace_ms": None if grace < 0 else grace,
        }
        pidgate = Pidgate(broker.address, log_dir, path=pidgate_path, **quota)
        described = {"pidgate": pidgate.check_data_path(pidgate_path)}
        targets = {
            "floor": (forwarder.bootstrap, forwarder.cpu),
            "pidgate": (pidgate.bootstrap, pidgate.cpu),
        }
        if pure_broker is not None:
            pure = Pidgate(pure_broker.address, log_dir, None, PURE, path="pure", **quota)
            described[PURE] = pure.check_data_path("pure")
            targets[PURE] = (pure.bootstrap, pure.cpu)
        # Raw frames only: the gates rewrite no endpoints, so clients bootstrapping through
        # them would be sent to the floor's forwarder.
        wanted: list[tuple[str, tuple[str, ...]]] = []
        if getattr(args, "minimal_gate", False):
            wanted += [("minimal", ()), ("minimal_quota", ("--quota",))]
        if getattr(args, "typed_gate", False):
            wanted += [
                ("typed", ("--typed",)),
                ("typed_quota", ("--typed", "--quota")),
                ("typed_inline", ("--typed", "--quota", "--inline")),
            ]
        for name, options in wanted:
            gate = Forwarder(
                free_port(),
                floor_broker.address,
                log_dir,
                "minimal_gate.py",
                *options,
                name=f"gate_{name}",
            )
            gates.append(gate)
            targets[name] = (gate.bootstrap, gate.cpu)
        if getattr(args, "baseline_src", None):
            baseline = Pidgate(
                broker.address, log_dir, args.baseline_src, "pidgate-baseline", **quota
            )
            targets["baseline"] = (baseline.bootstrap, baseline.cpu)
        workloads = [
            *raw_workloads(args.requests),
            librdkafka_workload(args.producers, args.records_per_producer),
        ]
        if args.only:
            workloads = [w for w in workloads if w.name in args.only.split(",")]
        print(
            f"tansu pid {broker.process.pid}; floor pid {forwarder.process.pid}; pidgate pid "
            f"{pidgate.process.pid}"
            + (f"; {PURE} pid {pure.process.pid}" if pure is not None else "")
            + f"; {args.rounds} rounds; logs in {log_dir}",
            flush=True,
        )
        for name, description in described.items():
            print(f"{name} data path: {description}", flush=True)

        def targets_of(w: Workload) -> list[str]:
            return [n for n in targets if n not in GATES or w.name != "librdkafka"]

        for w in workloads:  # warm-up, not counted
            for name in targets_of(w):
                w.run(targets[name][0], w.prepare(targets[name][0]))
        profile = getattr(args, "profile", None)
        spy = start_profile(pidgate.process.pid, profile) if profile else None
        results: dict[str, Measured] = {}
        for rnd in range(args.rounds):
            for w in workloads:
                names = targets_of(w)
                order = names if rnd % 2 == 0 else names[::-1]
                print(f"round {rnd + 1}: " + measure_round(w, targets, results, order), flush=True)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
            print_profile(profile)
        return f"{report(results, pidgate_path)} small_rounds={args.rounds}"
    finally:
        for p in (
            *gates,
            baseline,
            pure,
            pidgate,
            forwarder,
            pure_broker,
            broker,
            floor_broker,
        ):
            if p is not None:
                p.stop()


if __name__ == "__main__":
    sys.exit(main())
