"""Side-by-side throughput, CPU and latency: direct to tansu, through pidgate, through tansu proxy,
through the floor.

    python benchmarks/bench.py [--rounds 5] [--records 200000] [--latency-records 2000] [--quick]
                               [--paths compiled,pure]

Starts, all on 127.0.0.1: a tansu broker for direct runs (``EmbeddedBroker``); one
``pidgate serve`` subprocess (quotas on: ``--default-producer-ids-rate 1000``, so every PID is
checked against the layered Bloom filter and known after its first batch); one ``tansu proxy``
subprocess (the same binary); and the floor, ``forwarder.py`` (a trivial uvloop forwarder that
only copies bytes). Each target has a tansu broker of its own, of one binary and one config
(in memory), so every broker holds the same records when its turn comes; the floor's
advertises the forwarder's port (the forwarder rewrites no endpoints). Then, for every round,
the same confluent-kafka workload (idempotent, acks=all, 1 KB records, a fixed record count
bounded by a time limit) runs against the four targets in turn, each round starting with the
next one (A B C D, B C D A, ...), and a
single-record-at-a-time latency run alternates the targets record by record. The floor shows
what any proxy on this machine costs the big-batch workload (a second pass of every byte
through loopback and a third process on the cores), so ``pidgate/floor`` is pidgate's own
share. With both data paths (``--paths``, default ``compiled,pure``, issue #25) a second
``pidgate serve`` on the pure path (``pidgate-pure``, a broker of its own) runs beside the
compiled one in every round. Medians over rounds and paired per-round ratios are printed,
then one machine-parsable ``BENCH ...`` line. Everything started here is stopped by PID.

No test imports this: it asserts nothing about speed, it only measures. It imports
``small_requests.py`` (its rounds) and ``support/`` (the processes); nothing imports it.
"""

# Report lines are long f-strings.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import small_requests
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from support.processes import (
    Broker,
    Forwarder,
    Pidgate,
    TansuProxy,
    exit_on_sigterm,
    machine_busy_ticks,
)
from support.pyspy import print_profile

from pidgate.demo.broker import EmbeddedBroker, free_port

TOPIC = "pidgate-bench"
PURE = small_requests.PURE  # the pure-path pidgate's target name
TARGET_NAMES = ("direct", "pidgate", "tansu", "floor", "baseline", PURE)
RECORD = b"x" * 1000  # "1 KB" records


# -- workloads --------------------------------------------------------------------------------


def producer(bootstrap: str, **extra: object) -> Producer:
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        # Bounded queue (~256 MB): produce() waits on BufferError instead of the client holding
        # every record of a run at once (which took GBs of RSS across runs).
        "queue.buffering.max.messages": 250_000,
        "queue.buffering.max.kbytes": 262_144,
        "message.timeout.ms": 60_000,
        "log_level": 3,
    }
    config.update(extra)
    p = Producer(config)
    # Warm-up: metadata, InitProducerId and the PID's first (quota-admitted) batch happen here,
    # outside the timed part, so the timed part only sees known PIDs.
    p.produce(TOPIC, RECORD)
    if p.flush(30):
        raise RuntimeError(f"warm-up record to {bootstrap} not delivered")
    return p


@dataclass
class Throughput:
    delivered: int
    errors: int
    seconds: float

    @property
    def msgs_per_s(self) -> float:
        return self.delivered / self.seconds


def throughput_run(bootstrap: str, records: int, time_bound_s: float) -> Throughput:
    counts = [0, 0]

    def on_delivery(error: object, _message: object) -> None:
        counts[error is not None] += 1

    p = producer(bootstrap, on_delivery=on_delivery)
    counts[0] = counts[1] = 0
    produce, poll = p.produce, p.poll
    start = time.perf_counter()
    deadline = start + time_bound_s
    for i in range(records):
        while True:
            try:
                produce(TOPIC, RECORD)
                break
            except BufferError:
                poll(0.001)
        if not i & 0x3FFF:
            poll(0)
            if time.perf_counter() > deadline:
                break
    while len(p) and time.perf_counter() < deadline:
        p.poll(0.01)
    elapsed = time.perf_counter() - start
    delivered, errors = counts
    if len(p):
        p.purge()
        p.flush(5)
    return Throughput(delivered, errors, elapsed)


def latency_run(bootstraps: list[str], records: int) -> list[list[float]]:
    """Single record, flush, repeat: the targets alternate record by record so noise hits all
    of them alike. Returns the latencies (µs) per target."""
    producers = [producer(b, **{"linger.ms": 0}) for b in bootstraps]
    out: list[list[float]] = [[] for _ in bootstraps]
    clock = time.perf_counter_ns
    for _ in range(records):
        for p, samples in zip(producers, out, strict=True):
            t0 = clock()
            p.produce(TOPIC, RECORD)
            p.flush(10)
            samples.append((clock() - t0) / 1000)
    for p in producers:
        p.flush(10)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Results:
    msgs: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in TARGET_NAMES})
    busy_cores: dict[str, list[float]] = field(
        default_factory=lambda: {n: [] for n in TARGET_NAMES}
    )
    ratio_direct: list[float] = field(default_factory=list)
    #: floor/direct and pidgate/floor, paired per round.
    ratio_floor_direct: list[float] = field(default_factory=list)
    ratio_pidgate_floor: list[float] = field(default_factory=list)
    ratio_tansu: list[float] = field(default_factory=list)
    ratio_baseline: list[float] = field(default_factory=list)
    #: pidgate-pure/direct, pidgate-pure/floor and pidgate (compiled)/pidgate-pure, paired.
    ratio_pure_direct: list[float] = field(default_factory=list)
    ratio_pure_floor: list[float] = field(default_factory=list)
    ratio_compiled_pure: list[float] = field(default_factory=list)
    pure_cpu_s: list[float] = field(default_factory=list)
    pure_bytes: list[int] = field(default_factory=list)
    pure_added_p50: list[float] = field(default_factory=list)
    pidgate_cpu_s: list[float] = field(default_factory=list)
    pidgate_cpu_stat_s: list[float] = field(default_factory=list)
    tansu_proxy_cpu_s: list[float] = field(default_factory=list)
    pidgate_requests: list[int] = field(default_factory=list)
    pidgate_bytes: list[int] = field(default_factory=list)
    lat: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {n: [] for n in TARGET_NAMES}
    )
    added_p50: list[float] = field(default_factory=list)
    added_p99: list[float] = field(default_factory=list)
    tansu_added_p50: list[float] = field(default_factory=list)
    tansu_added_p99: list[float] = field(default_factory=list)
    single_cpu_us_per_request: list[float] = field(default_factory=list)
    baseline_added_p50: list[float] = field(default_factory=list)


def main() -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--records", type=int, default=300_000, help="1 KB records per throughput run"
    )
    parser.add_argument(
        "--latency-records",
        type=int,
        default=3000,
        help="single-record produces per target per round",
    )
    parser.add_argument(
        "--time-bound", type=float, default=20.0, help="seconds at most per throughput run"
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds, 30k records, 300 latency records"
    )
    parser.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also run a pidgate from this source tree (a directory holding the pidgate package) "
        "as a 4th target in every round, and print the paired ratio pidgate/baseline",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="sample pidgate with py-spy during the rounds (collapsed stacks to FILE; needs py-spy; "
        "adds sampling overhead, so the numbers of such a run are not the benchmark's)",
    )
    parser.add_argument(
        "--small-rounds",
        type=int,
        default=5,
        help="rounds of small_requests.py's floor comparison after the big-batch rounds (0: skip)",
    )
    small_requests.add_arguments(parser)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.records, args.latency_records = 3, 30_000, 300
        args.small_rounds, args.requests, args.records_per_producer = 2, 5000, 100
    started = time.monotonic()
    log_dir = Path(tempfile.mkdtemp(prefix="pidgate-bench-"))
    broker = EmbeddedBroker()
    pidgate: Pidgate | None = None
    tansu: TansuProxy | None = None
    baseline: Pidgate | None = None
    pure: Pidgate | None = None
    floor: Forwarder | None = None
    own_brokers: list[Broker] = []

    def own_broker(name: str, advertised_port: int | None = None) -> str:
        """A tansu broker of the target ``name`` alone; its address."""
        own_brokers.append(Broker(log_dir, f"tansu-{name}", advertised_port))
        return own_brokers[-1].address

    def create_topic(bootstrap: str) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(TOPIC, 1, 1)]).values():
            with contextlib.suppress(Exception):  # already there is fine
                future.result(15)

    try:
        broker.start()
        create_topic(broker.bootstrap)
        pidgate_path = args.paths[0]  # "compiled" when listed
        pidgate = Pidgate(pidgate_upstream := own_broker("pidgate"), log_dir, path=pidgate_path)
        described = {"pidgate": pidgate.check_data_path(pidgate_path)}
        create_topic(pidgate_upstream)
        tansu = TansuProxy(tansu_origin := own_broker("proxy"), log_dir)
        create_topic(tansu_origin)
        floor_port = free_port()
        floor = Forwarder(floor_port, own_broker("floor", floor_port), log_dir)
        create_topic(floor.bootstrap)
        targets = {
            "direct": broker.bootstrap,
            "pidgate": pidgate.bootstrap,
            "tansu": tansu.bootstrap,
            "floor": floor.bootstrap,
        }
        if args.baseline_src:
            baseline_upstream = own_broker("baseline")
            create_topic(baseline_upstream)
            baseline = Pidgate(baseline_upstream, log_dir, args.baseline_src, "pidgate-baseline")
            targets["baseline"] = baseline.bootstrap
        if len(args.paths) > 1:
            pure_upstream = own_broker("pure")
            create_topic(pure_upstream)
            pure = Pidgate(pure_upstream, log_dir, None, PURE, path="pure")
            described[PURE] = pure.check_data_path("pure")
            targets[PURE] = pure.bootstrap
        print(
            f"tansu broker pid {broker.pid} {broker.bootstrap}; pidgate pid {pidgate.process.pid} "
            f"{pidgate.bootstrap}; tansu proxy pid {tansu.process.pid} {tansu.bootstrap}; floor "
            f"pid {floor.process.pid} {floor.bootstrap}; "
            f"{args.rounds} rounds x {args.records} records; logs in {log_dir}",
            flush=True,
        )
        for name, description in described.items():
            print(f"{name} data path: {description}", flush=True)
        # Warm-up round (not counted): JIT-free Python still has caches, sockets, page faults.
        for bootstrap in targets.values():
            throughput_run(bootstrap, min(args.records, 20_000), args.time_bound)
        latency_run(list(targets.values()), 50)

        spy = None
        if args.profile:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "-p",
                    str(pidgate.process.pid),
                    "-r",
                    "500",
                    "-f",
                    "raw",
                    "-o",
                    args.profile,
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            time.sleep(1)
        res = Results()
        for rnd in range(1, args.rounds + 1):
            got: dict[str, float] = {}
            # Each round starts with the next target (A B C D, B C D A, ...): none always runs
            # first, on a machine still busy with the latency run of the round before.
            turn = list(targets.items())
            shift = (rnd - 1) % len(turn)
            for name, bootstrap in turn[shift:] + turn[:shift]:
                if name == "pidgate":
                    req0, bytes0 = pidgate.produce_requests()  # scrape first: not counted
                    cpu0, stat0 = pidgate.cpu.sample()
                elif name == "tansu":
                    tcpu0 = tansu.cpu.schedstat_ns()
                elif name == PURE and pure is not None:
                    _, pbytes0 = pure.produce_requests()
                    pcpu0 = pure.cpu.schedstat_ns()
                busy0, total0 = machine_busy_ticks()
                run = throughput_run(bootstrap, args.records, args.time_bound)
                busy1, total1 = machine_busy_ticks()
                res.busy_cores[name].append(
                    os.cpu_count() * (busy1 - busy0) / max(1, total1 - total0)
                )
                if name == "pidgate":
                    cpu1, stat1 = pidgate.cpu.sample()
                    req1, bytes1 = pidgate.produce_requests()
                    res.pidgate_cpu_s.append((cpu1 - cpu0) / 1e9)
                    res.pidgate_cpu_stat_s.append(stat1 - stat0)
                    res.pidgate_requests.append(req1 - req0)
                    res.pidgate_bytes.append(bytes1 - bytes0)
                elif name == "tansu":
                    res.tansu_proxy_cpu_s.append((tansu.cpu.schedstat_ns() - tcpu0) / 1e9)
                elif name == PURE and pure is not None:
                    res.pure_cpu_s.append((pure.cpu.schedstat_ns() - pcpu0) / 1e9)
                    res.pure_bytes.append(pure.produce_requests()[1] - pbytes0)
                if run.errors:
                    print(f"  {name}: {run.errors} delivery errors", flush=True)
                got[name] = run.msgs_per_s
                res.msgs[name].append(run.msgs_per_s)
            res.ratio_direct.append(got["pidgate"] / got["direct"])
            res.ratio_tansu.append(got["pidgate"] / got["tansu"])
            res.ratio_floor_direct.append(got["floor"] / got["direct"])
            res.ratio_pidgate_floor.append(got["pidgate"] / got["floor"])
            if "baseline" in got:
                res.ratio_baseline.append(got["pidgate"] / got["baseline"])
            if PURE in got:
                res.ratio_pure_direct.append(got[PURE] / got["direct"])
                res.ratio_pure_floor.append(got[PURE] / got["floor"])
                res.ratio_compiled_pure.append(got["pidgate"] / got[PURE])

            req0, _ = pidgate.produce_requests()  # scrape outside the CPU window
            cpu0, _ = pidgate.cpu.sample()
            lat = latency_run(list(targets.values()), args.latency_records)
            cpu1, _ = pidgate.cpu.sample()
            req1, _ = pidgate.produce_requests()
            res.single_cpu_us_per_request.append((cpu1 - cpu0) / 1000 / max(1, req1 - req0))
            pct = {
                n: (percentile(s, 0.50), percentile(s, 0.99))
                for n, s in zip(targets, lat, strict=True)
            }
            for n, v in pct.items():
                res.lat[n].append(v)
            res.added_p50.append(pct["pidgate"][0] - pct["direct"][0])
            res.added_p99.append(pct["pidgate"][1] - pct["direct"][1])
            res.tansu_added_p50.append(pct["tansu"][0] - pct["direct"][0])
            res.tansu_added_p99.append(pct["tansu"][1] - pct["direct"][1])
            if "baseline" in pct:
                res.baseline_added_p50.append(pct["baseline"][0] - pct["direct"][0])
            if PURE in pct:
                res.pure_added_p50.append(pct[PURE][0] - pct["direct"][0])
            print(
                f"round {rnd}: msg/s direct {got['direct']:,.0f} pidgate {got['pidgate']:,.0f} "
                f"tansu-proxy {got['tansu']:,.0f} floor {got['floor']:,.0f} | pidgate/direct "
                f"{res.ratio_direct[-1]:.3f} floor/direct {res.ratio_floor_direct[-1]:.3f} "
                f"pidgate/tansu-proxy {res.ratio_tansu[-1]:.3f} | pidgate CPU "
                f"{res.pidgate_cpu_s[-1]:.3f}s for {res.pidgate_requests[-1]} requests | latency p50 "
                f"direct {pct['direct'][0]:.0f} pidgate {pct['pidgate'][0]:.0f} tansu-proxy "
                f"{pct['tansu'][0]:.0f} floor {pct['floor'][0]:.0f} µs, p99 "
                f"{pct['direct'][1]:.0f}/{pct['pidgate'][1]:.0f}/{pct['tansu'][1]:.0f}/"
                f"{pct['floor'][1]:.0f} µs"
                + (
                    f" | {PURE} {got[PURE]:,.0f} msg/s, pure/direct {res.ratio_pure_direct[-1]:.3f} "
                    f"compiled/pure {res.ratio_compiled_pure[-1]:.3f}, p50 {pct[PURE][0]:.0f} µs"
                    if PURE in got
                    else ""
                ),
                flush=True,
            )
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            spy.wait(30)
            print_profile(args.profile)
        small = ""
        if args.small_rounds > 0:
            # Its own brokers and pidgate: this run's are stopped first (2 cores).
            floor.stop()
            tansu.stop()
            pidgate.stop()
            if baseline is not None:
                baseline.stop()
            if pure is not None:
                pure.stop()
            for own in own_brokers:
                own.stop()
            print("\n== small requests against the floor (benchmarks/small_requests.py) ==")
            small_args = argparse.Namespace(**vars(args))
            small_args.rounds = args.small_rounds
            small_args.profile = None
            small = " " + small_requests.run(small_args)
        report(res, args, time.monotonic() - started, small)
        return 0
    finally:
        for served in (floor, baseline, pure):
            if served is not None:
                served.stop()
        if tansu is not None:
            tansu.stop()
        if pidgate is not None:
            pidgate.stop()
        for own in own_brokers:
            own.stop()
        broker.cleanup()


def report(res: Results, args: argparse.Namespace, elapsed_s: float, small: str = "") -> None:
    med = statistics.median
    cpu_s = sum(res.pidgate_cpu_s)
    gb = sum(res.pidgate_bytes) / 1e9
    requests = sum(res.pidgate_requests)
    per_request = [
        c * 1e6 / max(1, r) for c, r in zip(res.pidgate_cpu_s, res.pidgate_requests, strict=True)
    ]
    per_gb = [c / (b / 1e9) for c, b in zip(res.pidgate_cpu_s, res.pidgate_bytes, strict=True) if b]
    tansu_per_gb = [
        c / (b / 1e9) for c, b in zip(res.tansu_proxy_cpu_s, res.pidgate_bytes, strict=True) if b
    ]
    print()
    print(f"== medians over {args.rounds} rounds ({args.records} x 1 KB records per run) ==")
    for name, label in (
        ("direct", "direct"),
        ("pidgate", "pidgate"),
        ("tansu", "tansu proxy"),
        ("floor", "floor"),
    ):
        vals = res.msgs[name]
        print(
            f"throughput {label:12s} {med(vals):>10,.0f} msg/s  (min {min(vals):,.0f} max "
            f"{max(vals):,.0f}); machine busy {med(res.busy_cores[name]):.2f} of {os.cpu_count()} cores"
        )
    print(
        f"ratio pidgate/direct       {med(res.ratio_direct):.3f}  (per round: {', '.join(f'{r:.3f}' for r in res.ratio_direct)})"
    )
    print(
        f"ratio floor/direct         {med(res.ratio_floor_direct):.3f}  (per round: {', '.join(f'{r:.3f}' for r in res.ratio_floor_direct)})"
    )
    print(
        f"ratio pidgate/floor        {med(res.ratio_pidgate_floor):.3f}  (per round: {', '.join(f'{r:.3f}' for r in res.ratio_pidgate_floor)})"
    )
    print(
        f"ratio pidgate/tansu-proxy  {med(res.ratio_tansu):.3f}  (per round: {', '.join(f'{r:.3f}' for r in res.ratio_tansu)})"
    )
    print(
        f"pidgate CPU                {med(per_gb):.3f} s/GB, {med(per_request):.1f} µs/Produce request "
        f"({requests} requests, {requests and sum(res.pidgate_bytes) / requests / 1e3:.0f} kB each; "
        f"total {cpu_s:.2f} s schedstat, {sum(res.pidgate_cpu_stat_s):.2f} s utime+stime for {gb:.2f} GB)"
    )
    print(f"tansu proxy CPU            {med(tansu_per_gb):.3f} s/GB (same record bytes)")
    print(
        f"pidgate CPU, 1-record requests (latency run): {med(res.single_cpu_us_per_request):.1f} µs/Produce request"
    )
    for name, label in (
        ("direct", "direct"),
        ("pidgate", "pidgate"),
        ("tansu", "tansu proxy"),
        ("floor", "floor"),
    ):
        p50 = med([v[0] for v in res.lat[name]])
        p99 = med([v[1] for v in res.lat[name]])
        print(f"latency {label:12s} p50 {p50:7.0f} µs  p99 {p99:7.0f} µs")
    print(
        f"added latency pidgate      p50 {med(res.added_p50):+.0f} µs  p99 {med(res.added_p99):+.0f} µs (paired, per round)"
    )
    print(
        f"added latency tansu proxy  p50 {med(res.tansu_added_p50):+.0f} µs  p99 {med(res.tansu_added_p99):+.0f} µs"
    )
    if res.ratio_baseline:
        print(
            f"baseline pidgate           {med(res.msgs['baseline']):,.0f} msg/s; ratio pidgate/baseline "
            f"{med(res.ratio_baseline):.3f} (per round: {', '.join(f'{r:.3f}' for r in res.ratio_baseline)}); "
            f"baseline added latency p50 {med(res.baseline_added_p50):+.0f} µs"
        )
    pure_fields = ""
    if res.ratio_compiled_pure:
        pure_per_gb = [
            c / (b / 1e9) for c, b in zip(res.pure_cpu_s, res.pure_bytes, strict=True) if b
        ]
        print(
            f"pidgate-pure (pure path)   {med(res.msgs[PURE]):,.0f} msg/s; ratio pure/direct "
            f"{med(res.ratio_pure_direct):.3f} (per round: {', '.join(f'{r:.3f}' for r in res.ratio_pure_direct)}); "
            f"pure/floor {med(res.ratio_pure_floor):.3f}; compiled/pure {med(res.ratio_compiled_pure):.3f} "
            f"(per round: {', '.join(f'{r:.3f}' for r in res.ratio_compiled_pure)}); "
            f"CPU {med(pure_per_gb):.3f} s/GB; added latency p50 {med(res.pure_added_p50):+.0f} µs"
        )
        pure_fields = (
            f" ratio_pure_direct={med(res.ratio_pure_direct):.3f} "
            f"ratio_pure_floor={med(res.ratio_pure_floor):.3f} "
            f"ratio_compiled_pure={med(res.ratio_compiled_pure):.3f} "
            f"pure_cpu_s_per_gb={med(pure_per_gb):.3f} "
            f"pure_added_latency_p50_us={med(res.pure_added_p50):.0f} "
            f"pure_msgs_per_s={med(res.msgs[PURE]):.0f}"
        )
    print(f"elapsed {elapsed_s:.0f} s")
    print(
        f"BENCH pidgate_path={args.paths[0]} ratio_direct={med(res.ratio_direct):.3f} ratio_tansu_proxy={med(res.ratio_tansu):.3f} "
        f"ratio_floor_direct={med(res.ratio_floor_direct):.3f} "
        f"ratio_pidgate_floor={med(res.ratio_pidgate_floor):.3f} "
        f"cpu_us_per_request={med(per_request):.1f} "
        f"cpu_us_per_request_1record={med(res.single_cpu_us_per_request):.1f} "
        f"cpu_s_per_gb={med(per_gb):.3f} "
        f"added_latency_p50_us={med(res.added_p50):.0f} added_latency_p99_us={med(res.added_p99):.0f} "
        f"direct_msgs_per_s={med(res.msgs['direct']):.0f} pidgate_msgs_per_s={med(res.msgs['pidgate']):.0f} "
        f"tansu_proxy_msgs_per_s={med(res.msgs['tansu']):.0f}{pure_fields} rounds={args.rounds} "
        f"records={args.records}{small}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
