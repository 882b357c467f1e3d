"""Micro-benchmarks of pidgate's per-request work, without sockets (plain timeit).

    python benchmarks/micro.py [--repeat 7] [--only NAME] [--skip-memory] [--cold MB]

Each line is the median (and best) of ``--repeat`` timeit repeats, in µs per call. Bodies are
built with kafka-python's classes (the reference encoder of the protocol tests). The machine
is shared and noisy: compare medians of runs made side by side, never single numbers.

``native`` times the per-request primitives that have a compiled twin (issue #25): the lean
Produce walk and the frame cut (``pidgate.protocol.native``), a PID's Bloom positions and the
scan of a principal's layers for a new PID (``pidgate.quota.compiled``), compiled and pure side by
side in this one process whatever path it runs. Every other group runs the path this process
chose at import (printed first): ``PIDGATE_PURE_PYTHON=1`` runs them on the pure one.

``--cold MB`` times each call alone after reading MB megabytes, so the CPU caches hold something
else when it starts: a proxy serving one request at a time sleeps between requests while the
client and the broker run, and comes back to cold caches. What the per-request path costs there
depends on how much memory it touches, not only on how many instructions it runs.
"""

# Report lines are long f-strings, and closures are timed inside the loop that binds them.
# ruff: noqa: E501, B023

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import timeit
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

from kafka.protocol.metadata import MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from pidgate.protocol import native
from pidgate.protocol.endpoints import METADATA_KEY, BrokerEndpoint, rewrite_endpoints
from pidgate.protocol.framing import frame, pure_cut_frames
from pidgate.protocol.produce import (
    encode_produce_rejection,
    parse_produce_request,
    pure_produce_acks_and_producer_ids,
)
from pidgate.quota.bloom import BloomShape, bloom_positions, pure_universal_positions
from pidgate.quota.manager import QuotaManager, QuotaPolicy

RESULTS: list[tuple[str, float, float]] = []


#: ``--cold``: bytes read between two timed calls, so each call finds the CPU caches holding
#: something else, as a proxy serving one request at a time between other processes does.
COLD_BYTES = 0
COLD_CALLS = 1000


def bench(name: str, fn: Callable[[], object], repeat: int, target_s: float = 0.2) -> float:
    """µs per call: median of ``repeat`` repeats, each about ``target_s`` long (with
    ``--cold``: each of ``COLD_CALLS`` calls timed alone, after reading ``COLD_BYTES``)."""
    if COLD_BYTES:
        return _bench_cold(name, fn, repeat)
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()  # calls in >= 0.2 s
    number = max(1, int(number * target_s / 0.2))
    runs = [t / number * 1e6 for t in timer.repeat(repeat=repeat, number=number)]
    med, best = statistics.median(runs), min(runs)
    RESULTS.append((name, med, best))
    print(f"{name:58s} {med:9.2f} µs  (best {best:.2f})", flush=True)
    return med


def _bench_cold(name: str, fn: Callable[[], object], repeat: int) -> float:
    junk = bytes(range(256)) * (COLD_BYTES // 256)
    runs = []
    for _ in range(repeat):
        total_ns = 0
        for _ in range(COLD_CALLS):
            junk.count(b"\xff")  # reads every byte: evicts what the last call left in cache
            start = time.perf_counter_ns()
            fn()
            total_ns += time.perf_counter_ns() - start
        runs.append(total_ns / COLD_CALLS / 1000)
    med, best = statistics.median(runs), min(runs)
    label = f"{name}, cold"
    RESULTS.append((label, med, best))
    print(f"{label:58s} {med:9.2f} µs  (best {best:.2f})", flush=True)
    return med


# -- message builders (kafka-python) -----------------------------------------------------------


def records(producer_id: int, count: int = 10, value_bytes: int = 1000) -> bytes:
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 22,
        offset=0,
        transactional=False,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
    )
    for i in range(count):
        builder.append(timestamp=1_700_000_000_000 + i, key=None, value=b"x" * value_bytes)
    builder.close()
    return bytes(builder.buffer())


TOPIC_ID = uuid.UUID(int=0x1234).bytes


def produce_body(
    version: int,
    partitions: int,
    producer_id: int = 4242,
    count: int = 10,
    value_bytes: int = 1000,
) -> bytes:
    T = ProduceRequest.TopicProduceData
    P = T.PartitionProduceData
    blob = records(producer_id, count, value_bytes)
    kwargs: dict[str, Any] = {
        "partition_data": [P(index=i, records=blob) for i in range(partitions)]
    }
    if version >= 13:
        kwargs["topic_id"] = uuid.UUID(bytes=TOPIC_ID)
    else:
        kwargs["name"] = "bench-topic"
    req = ProduceRequest(
        version=version, transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[T(**kwargs)]
    )
    return bytes(req.encode(version=version))


def request_frame(
    api_key: int, version: int, correlation_id: int, body: bytes, flexible: bool
) -> bytes:
    client_id = b"rdkafka"
    header = (
        api_key.to_bytes(2, "big")
        + version.to_bytes(2, "big")
        + correlation_id.to_bytes(4, "big", signed=True)
        + len(client_id).to_bytes(2, "big")
        + client_id
        + (b"\x00" if flexible else b"")
    )
    return frame(header + body)


def produce_response_frame(version: int, correlation_id: int) -> bytes:
    R = ProduceResponse
    T = R.TopicProduceResponse
    P = T.PartitionProduceResponse
    kwargs: dict[str, Any] = {
        "partition_responses": [
            P(
                index=0,
                error_code=0,
                base_offset=1,
                log_append_time_ms=-1,
                log_start_offset=0,
                record_errors=[],
                error_message=None,
            )
        ]
    }
    if version >= 13:
        kwargs["topic_id"] = uuid.UUID(bytes=TOPIC_ID)
    else:
        kwargs["name"] = "bench-topic"
    body = bytes(
        R(version=version, responses=[T(**kwargs)], throttle_time_ms=0).encode(version=version)
    )
    flexible = version >= 9
    return frame(
        correlation_id.to_bytes(4, "big", signed=True) + (b"\x00" if flexible else b"") + body
    )


def metadata_body(version: int, brokers: int, partitions: int) -> bytes:
    M = MetadataResponse
    msg = M(
        version=version,
        throttle_time_ms=0,
        brokers=[
            M.MetadataResponseBroker(node_id=n, host=f"broker-{n}.example", port=9092, rack=None)
            for n in range(brokers)
        ],
        cluster_id="cluster",
        controller_id=0,
        topics=[
            M.MetadataResponseTopic(
                error_code=0,
                name="bench-topic",
                topic_id=uuid.UUID(bytes=TOPIC_ID),
                is_internal=False,
                partitions=[
                    M.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=0,
                        partition_index=p,
                        leader_id=p % brokers,
                        leader_epoch=0,
                        replica_nodes=[p % brokers],
                        isr_nodes=[p % brokers],
                        offline_replicas=[],
                    )
                    for p in range(partitions)
                ],
            )
        ],
    )
    return bytes(msg.encode(version=version))


# -- benchmarks ---------------------------------------------------------------------------------


def bench_produce_walk(repeat: int) -> None:
    for version in (9, 13):
        for partitions in (1, 10, 50):
            body = produce_body(version, partitions)
            view = memoryview(body)
            bench(
                f"produce walk v{version} {partitions:2d} partitions ({len(body) // 1000} kB)",
                lambda: parse_produce_request(view, version),
                repeat,
            )


def bench_native(repeat: int) -> None:
    """The lean walk and the frame cut, compiled and pure, on the same input in turn."""
    try:
        from pidgate.protocol import _speedups  # type: ignore[attr-defined]
    except ImportError as error:
        print(f"native: the compiled module is not built ({error}): pure only")
        _speedups = None
    pairs: list[tuple[str, float, float]] = []

    def both(name: str, compiled: Callable[[], object], pure: Callable[[], object]) -> None:
        if _speedups is None:
            bench(f"{name}, pure", pure, repeat)
            return
        if compiled() != pure():
            raise AssertionError(f"{name}: the compiled and pure results differ")
        c = bench(f"{name}, compiled", compiled, repeat)
        p = bench(f"{name}, pure", pure, repeat)
        pairs.append((name, c, p))

    walk = _speedups.produce_acks_and_producer_ids if _speedups else None
    cases = [(9, 1, 1, 100), (9, 1, 10, 1000), (9, 10, 10, 1000), (9, 50, 10, 1000)]
    cases += [(13, 1, 1, 100), (13, 50, 10, 1000)]
    for version, partitions, count, value_bytes in cases:
        body = produce_body(version, partitions, count=count, value_bytes=value_bytes)
        view = memoryview(body)  # as the connection hands it over
        both(
            f"lean walk v{version} {partitions:2d} partitions x {count:2d} x {value_bytes} B",
            lambda: walk(view, version),
            lambda: pure_produce_acks_and_producer_ids(view, version),
        )
    # The small_requests.py request (Produce v9, one 100-byte record), one frame or 32 in one
    # read (pipelined), then one 1 MB frame; cut from a memoryview, as FrameReader does.
    small = request_frame(0, 9, 7, produce_body(9, 1, count=1, value_bytes=100), True)
    big = request_frame(0, 9, 7, produce_body(9, 1, count=1000, value_bytes=1000), True)
    cut = _speedups.cut_frames if _speedups else None
    limit = 100 << 20
    for label, data in (
        (f"1 frame of {len(small)} B", small),
        (f"32 frames of {len(small)} B", small * 32),
        (f"1 frame of {len(big) >> 10} KiB", big),
    ):
        view = memoryview(bytearray(data))
        both(
            f"cut_frames {label}",
            lambda: cut(view, limit),
            lambda: pure_cut_frames(view, limit),
        )
    # The quota's new-PID arithmetic (pidgate.quota._bloomspeed): the hash and positions of a
    # PID, then the scan of an 11-layer filter that does not hold it.
    try:
        from pidgate.quota import _bloomspeed  # type: ignore[attr-defined]
    except ImportError as error:
        print(f"native: the compiled quota module is not built ({error})")
        _bloomspeed = None
    if _speedups is not None and _bloomspeed is not None:
        both(
            "universal_positions (k=14)",
            lambda: _bloomspeed.universal_positions(10**12 + 7, 14),
            lambda: pure_universal_positions(10**12 + 7, 14),
        )
        manager, now = _manager_with_layers(11)
        seen = manager._principals["User:bench"].seen
        positions = pure_universal_positions(10**12 + 7, seen._max_hashes)
        plan = seen.plan
        both(
            f"layer scan, new PID ({seen.layer_count} layers)",
            lambda: _bloomspeed.find(
                seen._bits,
                seen._meta,
                seen._first,
                positions,
                now,
                plan.window_ms,
                plan.fresh_divisor,
            ),
            lambda: seen.find_pure(10**12 + 7, positions, now),
        )
    for name, c, p in pairs:
        print(f"  {name:56s} pure/compiled {p / c:5.2f}x ({p - c:+.2f} µs)")


def _manager_with_layers(
    layers: int = 11, rate: int = 1_000_000_000, layer_items: int = 1000
) -> tuple[QuotaManager, int]:
    """A principal whose filter has ``layers`` live layers; returns (manager, now_ms)."""
    policy = QuotaPolicy(
        window_ms=3_600_000,
        window_num=11,
        default_producer_ids_rate=rate,
        min_layer_items=layer_items,
        max_layer_items=layer_items,
        max_total_bits=2**40,
    )
    manager = QuotaManager(policy)
    now = 1_000_000_000
    span = policy.window_ms // policy.window_num + 1
    pid = 1
    for _ in range(layers):
        manager.admit("User:bench", (pid,), now)
        pid += 1
        now += span
    now -= span  # stay inside the newest layer's span
    return manager, now


def bench_quota(repeat: int) -> None:
    manager, now = _manager_with_layers(11)
    layers = manager.snapshot(now)[0].layer_count
    known = (11,)  # the PID admitted last: in the newest (current) layer
    bench(
        f"quota admit, known PID ({layers} layers, in newest)",
        lambda: manager.admit("User:bench", known, now),
        repeat,
    )
    counter = iter(range(10**12, 10**13))
    # A fresh PID every call: misses the newest layer and all 10 older ones, takes a token
    # (a huge rate: the bucket never runs dry) and is added to the newest layer (sized for
    # 4M PIDs so it does not roll during the benchmark).
    manager2, now2 = _manager_with_layers(11, layer_items=4_000_000)
    bench(
        f"quota admit, new PID ({layers} layers scanned, admitted, added)",
        lambda: manager2.admit("User:bench", (next(counter),), now2),
        repeat,
    )
    if COLD_BYTES:
        # The same admission into a filter of one small layer, where the one above probes 11
        # layers of 7 MiB each: cold, the difference is what the filter's memory costs (each
        # probe another page; issue #25, README "A new PID's cost is the filter's memory").
        # Sized for every call a cold run makes (COLD_CALLS per repeat): it never fills.
        small_items = COLD_CALLS * repeat + 1
        manager_small, now_small = _manager_with_layers(1, layer_items=small_items)
        small_kib = manager_small.snapshot(now_small)[0].bits // 8192
        bench(
            f"quota admit, new PID (1 layer, {small_kib} KiB, admitted, added)",
            lambda: manager_small.admit("User:bench", (next(counter),), now_small),
            repeat,
        )
        _bench_cold_parts(repeat, manager, now, manager2, now2, counter)
    # A fresh PID every call with an empty bucket: the 11-layer scan and the rejection only.
    manager3, now3 = _manager_with_layers(11, rate=11)
    bench(
        f"quota admit, new PID ({layers} layers scanned, rejected)",
        lambda: manager3.admit("User:bench", (next(counter),), now3),
        repeat,
    )
    shape = BloomShape.for_capacity(1000, 0.001)
    bench(
        f"bloom_positions (k={shape.hash_count}, m={shape.bit_count})",
        lambda: bloom_positions(123456789, shape),
        repeat,
    )


def _bench_cold_parts(
    repeat: int,
    manager: QuotaManager,
    now: int,
    manager_big: QuotaManager,
    now_big: int,
    counter: Any,
) -> None:
    """``--cold``: the two calls the express lane makes for a new PID, each alone, beside a
    known PID's one and an empty call: ``admit_known`` (the location cache: a hit, a miss),
    then ``admit_single`` (the scan, the token, the bits) into eleven large layers and into
    eleven small ones. The same number of probes and writes in both filters; only the memory
    they span differs, so their gap is what the filter's size costs (issue #25)."""
    small_items = COLD_CALLS * repeat * 2 + 1
    manager_small, now_small = _manager_with_layers(11, layer_items=small_items)
    small_kib = manager_small.snapshot(now_small)[0].bits // 8192
    big_kib = manager_big.snapshot(now_big)[0].bits // 8192
    known = (11,)
    bench("an empty Python call (the floor of a cold call)", lambda: None, repeat)
    bench(
        "admit_known, known PID (location cache hit)",
        lambda: manager.admit_known("User:bench", known, now),
        repeat,
    )
    bench(
        "admit_known, new PID (location cache miss)",
        lambda: manager.admit_known("User:bench", (next(counter),), now),
        repeat,
    )
    for kib, target, at in ((big_kib, manager_big, now_big), (small_kib, manager_small, now_small)):
        bench(
            f"admit_single, new PID (11 layers, {kib:,} KiB)",
            lambda target=target, at=at: target.admit_single("User:bench", (next(counter),), at),
            repeat,
        )


def bench_gatekeeper(repeat: int) -> None:
    from pidgate.proxy.quota_control.admission import Gatekeeper, ProduceContext

    manager, _ = _manager_with_layers(11)
    gate = Gatekeeper(manager)
    summary = parse_produce_request(produce_body(9, 1, producer_id=11), 9)
    ctx = ProduceContext("User:bench", "rdkafka", "librdkafka", "127.0.0.1:1")
    # Gatekeeper uses the wall clock; the manager above lives in 2001, so prime it at "now".
    gate.check(ctx, summary)
    bench(
        "Gatekeeper.check, known PID, 1 partition (wall clock)",
        lambda: gate.check(ctx, summary),
        repeat,
    )


def bench_rejection(repeat: int) -> None:
    for version in (9, 13):
        for partitions in (1, 50):
            summary = parse_produce_request(produce_body(version, partitions), version)
            bench(
                f"encode_produce_rejection v{version} {partitions:2d} partitions",
                lambda: encode_produce_rejection(version, 7, summary, 87, 1000),
                repeat,
            )


def bench_metadata(repeat: int) -> None:
    def rewrite(endpoint: BrokerEndpoint) -> tuple[str, int]:
        return "127.0.0.1", 19000 + endpoint.node_id

    for brokers, partitions in ((1, 1), (3, 50)):
        body = metadata_body(12, brokers, partitions)
        bench(
            f"Metadata v12 rewrite_endpoints {brokers} brokers {partitions} partitions",
            lambda: rewrite_endpoints(METADATA_KEY, 12, body, rewrite),
            repeat,
        )


class _FakeTransport:
    """Just enough of asyncio.Transport for ClientConnection / UpstreamConnection."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += 1

    def writelines(self, data: list[bytes]) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...
    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def _proxy_with_fake_transports(producer_ids_rate: int) -> Callable[[], tuple[Any, Any]]:
    """A connection factory on one ``ProxyServer`` with a default quota of
    ``producer_ids_rate``: each call gives a ``ClientConnection`` (principal set) and its
    ``UpstreamConnection``, both on fake transports."""
    from pidgate.config import load_settings
    from pidgate.proxy.server import ProxyServer
    from pidgate.proxy.serving.connection import ClientConnection
    from pidgate.proxy.serving.upstream import UpstreamConnection

    settings = load_settings(
        cli_overrides={
            "proxy": {"upstream": ["127.0.0.1:9"], "listen": "127.0.0.1:0"},
            "quota": {"users": {"<default>": {"producer_ids_rate": producer_ids_rate}}},
            "admin": {"enabled": False},
        }
    )
    server = ProxyServer(settings)

    def connect() -> tuple[Any, Any]:
        conn = ClientConnection(server.context, lambda: [("127.0.0.1", 9)])
        client_transport = _FakeTransport()
        conn.transport = client_transport  # type: ignore[assignment]
        conn.principal = server.context.identity.principal_for_connection(None)
        conn._gate.attach(client_transport)  # type: ignore[arg-type]
        upstream = UpstreamConnection(conn)
        upstream.transport = _FakeTransport()  # type: ignore[assignment]
        conn._upstream = upstream
        return conn, upstream

    return connect


def bench_proxy_path(repeat: int) -> None:
    """One Produce request through ClientConnection (frame cut, header, walk, Gatekeeper with
    metrics and counters observers, slot bookkeeping, forward) and its response back (frame cut,
    correlation check, metrics, Produce endpoint check, flush), with fake transports."""
    connect = _proxy_with_fake_transports(1000)
    for version in (9, 11):
        conn, upstream = connect()
        body = produce_body(version, 1, producer_id=77)
        requests = [request_frame(0, version, cid, body, version >= 9) for cid in range(64)]
        responses = [produce_response_frame(version, cid) for cid in range(64)]
        conn.data_received(requests[0])  # first sight of the PID: admitted, now known
        upstream.data_received(responses[0])
        state = {"i": 0}

        def one() -> None:
            i = state["i"] = (state["i"] + 1) & 63
            conn.data_received(requests[i])
            upstream.data_received(responses[i])

        # a request's correlation id must match its response's: cycle through 64 of them
        bench(
            f"proxy path: Produce v{version} 1 partition, known PID, request+response", one, repeat
        )
        assert not conn.closed, "the fake connection failed"
    _proxy_path_new_pids(repeat)


def _proxy_path_new_pids(repeat: int) -> None:
    """As :func:`bench_proxy_path`, every request from a PID never seen (a quota so high none
    is rejected): the walk, the quota's miss path (hash, scan of every layer, token, write),
    the full walk for the observers (metrics, counters), and the response."""
    connect = _proxy_with_fake_transports(1_000_000_000)
    conn, upstream = connect()
    marker = 0x0123456789ABCDEF
    template = request_frame(0, 9, 0, produce_body(9, 1, producer_id=marker), True)
    pid_at = template.index(marker.to_bytes(8, "big"))
    requests = [bytearray(template) for _ in range(64)]
    for cid, request in enumerate(requests):
        request[8:12] = cid.to_bytes(4, "big")  # the correlation id
    responses = [produce_response_frame(9, cid) for cid in range(64)]
    state = {"i": 0, "pid": 10**12}

    def one() -> None:
        i = state["i"] = (state["i"] + 1) & 63
        request = requests[i]
        request[pid_at : pid_at + 8] = (pid := state["pid"] + 1).to_bytes(8, "big")
        state["pid"] = pid
        conn.data_received(request)
        upstream.data_received(responses[i])

    bench("proxy path: Produce v9 1 partition, new PID, request+response", one, repeat)
    assert not conn.closed, "the fake connection failed"


def memory_1m_pids(principals: int = 10_000, pids_per_principal: int = 100) -> None:
    """tracemalloc of a QuotaManager right after 1M PIDs were admitted once across 10k
    principals (one layer each), p = 0.001. Only the cost of the first layer: the steady state
    (several windows of every PID producing) is what benchmarks/memory.py measures."""
    print(
        f"\nmemory: {principals * pids_per_principal:,} PIDs across {principals:,} principals, "
        "p = 0.001, each admitted once (steady state: benchmarks/memory.py)"
    )
    policy = QuotaPolicy(
        default_producer_ids_rate=pids_per_principal,
        false_positive_rate=0.001,
        max_total_bits=2**40,
        max_principals=10**6,
    )
    names = [f"User:u{p}" for p in range(principals)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    manager = QuotaManager(policy)
    now = 1_000_000_000
    pid = 0
    for name in names:
        ids = tuple(range(pid, pid + pids_per_principal))
        pid += pids_per_principal
        manager.admit(name, ids, now)
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    used += sum(sys.getsizeof(name) for name in names)
    layers = sum(state.layer_count for state in manager.snapshot(now))
    print(
        f"  {used / 1e6:.1f} MB traced incl. principal names ({used / (principals * pids_per_principal):.1f} B/PID), "
        f"{manager.total_bits / 8 / 1e6:.2f} MB of bits, {layers:,} layers"
    )
    RESULTS.append(("memory 1M PIDs/10k principals, admitted once (MB)", used / 1e6, used / 1e6))
    del manager


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--only", help="run only benchmarks whose group name contains this")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--cold",
        metavar="MB",
        type=int,
        default=0,
        help="read MB megabytes between two timed calls (CPU caches cold, as in a proxy that "
        "sleeps between requests while other processes run); each call timed alone",
    )
    args = parser.parse_args()
    global COLD_BYTES
    COLD_BYTES = args.cold << 20
    print(
        f"data path of this process: {native.DATA_PATH}"
        + (f" ({native.PURE_REASON})" if native.PURE_REASON else "")
    )
    groups = {
        "native": bench_native,
        "walk": bench_produce_walk,
        "quota": bench_quota,
        "gatekeeper": bench_gatekeeper,
        "rejection": bench_rejection,
        "metadata": bench_metadata,
        "proxy": bench_proxy_path,
    }
    for name, fn in groups.items():
        if args.only and args.only not in name:
            continue
        fn(args.repeat)
    if not args.skip_memory and (not args.only or "memory" in args.only):
        memory_1m_pids()
    return 0


if __name__ == "__main__":
    sys.exit(main())
