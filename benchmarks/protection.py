"""Broker protection: what a storm of new idempotent producers leaves on a real Apache Kafka
broker, straight to it and through pidgate.

    python benchmarks/protection.py [--pids 20000] [--rate 50] [--window-seconds 60]
                                    [--partitions 1] [--concurrency 64] [--versions 3,4]
                                    [--paths direct,pidgate] [--kafka3 DIR] [--kafka4 DIR]

Run it from the repository root. ``--kafka3`` / ``--kafka4`` name Kafka distribution folders
(default: the ``PIDGATE_KAFKA3_HOME`` / ``PIDGATE_KAFKA4_HOME`` variables, as the real-Kafka test
tier uses); a version without a folder is skipped with one line. For every version and path a
fresh broker is started (``tests/realkafka/kafka.py``'s ``start_single``, all on 127.0.0.1) and:

1. a topic of ``--partitions`` partitions is created on the broker;
2. one InitProducerId is sent on its own (a fresh 3.1 broker stalls on concurrent ones before its
   first PID block exists; 4.1 answers 14 COORDINATOR_LOAD_IN_PROGRESS until its first block
   arrives from the controller: retried);
3. path ``pidgate``: ``pidgate serve`` in its own process in front of the broker, quota
   ``--rate`` new PIDs per ``--window-seconds`` for ``User:ANONYMOUS`` (the PLAINTEXT
   principal); the run waits for its PID-frontier probe and stops if it fell back to learning
   mode (then it would admit every PID and measure nothing);
4. one steady idempotent producer (confluent-kafka, acks=all) starts producing through the
   path, one record per ``--steady-interval-ms``, and keeps on until the storm is over; its
   deliveries and delivery errors are counted;
5. a baseline of the broker's live heap: ``jcmd <pid> GC.class_histogram`` (a full GC first);
6. the storm: ``--pids`` storm producers, ``--concurrency`` at a time, each on a connection of
   its own (a restarting client): one InitProducerId with a null transactional id (retriable
   errors retried, bounded), then one Produce (acks=-1) of one small record batch with that PID
   (epoch, sequence 0, ``timeout_ms`` 1500) to partition ``i % partitions``. Through pidgate a
   throttled one is held ~1 s (two thirds of its timeout), then rejected; it gives up: it is counted ``rejected`` (pidgate answers 19 NOT_ENOUGH_REPLICAS to a client it cannot
   name); a Produce answered 0 is ``admitted``;
7. on the broker: producer-state entries per partition (DescribeProducers, KIP-664) summed, and
   the live heap again: its total delta over the baseline, and the delta of the classes that make
   up producer state (``ProducerStateEntry``, ``BatchMetadata``, ...), each divided by the entries
   added.

Per version, the paired bytes per entry, (heap delta direct - heap delta pidgate) / (entries
direct - entries pidgate), cancels what both storms' connections leave on the broker alike
(metrics samples, ~1 MB per 20,000 connections). It prints one table (per version and path: PIDs
sent, admitted, entries, bytes per entry, live heap delta, the ratio of entries direct/pidgate,
the steady producer's errors) and a final
machine-readable ``PROTECTION {json}`` line. Everything started here is stopped by PID,
whatever happens. No test asserts speed on it; tests/realkafka/test_protection.py runs it small
and checks the counts.
"""

# Report lines are long f-strings.
# ruff: noqa: E501

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(1, str(ROOT))  # tests.realkafka.kafka: the tier's broker starter
from support.broker_heap import java_pid, live_heap  # noqa: E402
from support.processes import Served  # noqa: E402
from support.storm import TOPIC, init_producer_id_alone, producer_entries, run_storm  # noqa: E402
from tests.realkafka.kafka import (  # noqa: E402
    KAFKA3_HOME_VAR,
    KAFKA4_HOME_VAR,
    KafkaRun,
    free_port,
    kafka_home,
    start_single,
)

# -- the steady producer -----------------------------------------------------------------------


class SteadyProducer:
    """One idempotent producer (confluent-kafka, acks=all) producing one record every
    ``interval_s`` through the path under test, in a thread, until stopped."""

    def __init__(self, bootstrap: str, interval_s: float) -> None:
        self.delivered = 0
        self.errors = 0
        self.first_error = ""
        self.interval_s = interval_s
        self.producer: Producer | None = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                "client.id": "pidgate-protection-steady",
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def _delivered(self, error: Any, _message: Any) -> None:
        if error is None:
            self.delivered += 1
        else:
            self.errors += 1
            self.first_error = self.first_error or str(error)

    def _run(self) -> None:
        assert self.producer is not None
        sent = 0
        while not self._stop.is_set():
            self.producer.produce(
                TOPIC, b"steady-%d" % sent, key=b"steady", on_delivery=self._delivered
            )
            sent += 1
            self.producer.poll(self.interval_s)

    def start(self, first_delivery_s: float = 60.0) -> SteadyProducer:
        self._thread.start()
        deadline = time.monotonic() + first_delivery_s
        while self.delivered == 0 and self.errors == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the steady producer delivered nothing in {first_delivery_s}s")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop producing, wait for every record's delivery report, destroy the client (its
        threads would otherwise keep reconnecting to a stopped broker). Idempotent."""
        if self.producer is None:
            return
        self._stop.set()
        self._thread.join(30)
        left = self.producer.flush(60)
        if left:
            self.errors += left
            self.first_error = self.first_error or f"{left} records undelivered after flush"
        self.producer = None  # librdkafka's handle is destroyed with its last reference


# -- pidgate -------------------------------------------------------------------------------


class Pidgate(Served):
    """``pidgate serve`` in its own process, quota ``rate`` per ``window_s`` for User:ANONYMOUS."""

    def __init__(self, kafka: KafkaRun, log_dir: Path, rate: int, window_s: int) -> None:
        self.port = free_port()
        self.http_port = free_port()
        self.broker_port = free_port()
        self.log_path = log_dir / "pidgate.log"
        (node_id,) = kafka.broker_ports
        command = [
            sys.executable,
            "-m",
            "pidgate",
            "serve",
            "--upstream",
            kafka.bootstrap,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--broker-port-base",
            str(self.broker_port - node_id),
            "--producer-ids-rate",
            f"ANONYMOUS={rate}",
            "--quota-window-seconds",
            str(window_s),
            "--http",
            f"127.0.0.1:{self.http_port}",
            "--log-level",
            "info",
        ]
        # PIDGATE_* variables are pidgate settings to ``pidgate serve``: the tier's
        # PIDGATE_KAFKA*_HOME would be refused as unknown ones.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIDGATE_")}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
        )
        # Logs to log_path. A loaded machine (a storm beside other work) can take a while to
        # import pidgate. The per-broker listener opens once a Metadata answer names the broker.
        ports = [self.port, self.http_port]
        super().__init__(command, log_dir, "pidgate", ports, env, listen_timeout_s=120)

    def tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def wait_frontier(self, timeout_s: float = 120.0) -> str:
        """Wait for the start's PID-frontier probe; returns its log line. Learning mode (no
        frontier) is an error: every storm PID would pass free and the run would show nothing."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            for line in text.splitlines():
                if "pid_frontier_learnt" in line:
                    return line
                if "grandfather_learning_mode" in line:
                    raise RuntimeError(f"pidgate fell back to learning mode: {line}")
            if self.process.poll() is not None:
                raise RuntimeError(f"pidgate exited: {text[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"pidgate learnt no PID frontier in {timeout_s}s")


# -- one run -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    version: str
    path: str
    pids: int
    sent: int
    admitted: int
    rejected: int
    failed: dict[str, int]
    init_retries: int
    storm_seconds: float
    entries: int
    entries_before: int  # before the storm: the steady producer's
    entries_per_partition: list[int]
    heap_delta_bytes: int
    state_delta_bytes: int
    #: Live ProducerStateEntry objects added: one per entry the broker holds.
    entry_objects: int
    bytes_per_entry_heap: float
    bytes_per_entry_state: float
    steady_delivered: int
    steady_errors: int
    steady_first_error: str
    top_classes: list[tuple[str, int]]


def create_topic(bootstrap: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # A broker that has just opened its port may not have a controller yet (ZooKeeper mode):
    # ask again until it answers, TOPIC_ALREADY_EXISTS included.
    deadline = time.monotonic() + 180
    while True:
        future = admin.create_topics(
            [NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)],
            request_timeout=30,
        )[TOPIC]
        try:
            future.result(timeout=40)
            break
        except KafkaException as error:
            if error.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                break
            if time.monotonic() > deadline:
                raise
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=TOPIC, timeout=10).topics.get(TOPIC)
        if (
            topic is not None
            and len(topic.partitions) == partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topic {TOPIC} has no leaders after 60 s")


_STARTED = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _STARTED:7.1f} s] {message}", flush=True)


def run_one(home: Path, path: str, args: argparse.Namespace, log_dir: Path) -> RunResult:
    log(f"{home.name} {path}: starting a fresh broker")
    kafka = start_single(home)
    gate: Pidgate | None = None
    steady: SteadyProducer | None = None
    try:
        broker = ("127.0.0.1", kafka.broker_ports[1])
        create_topic(kafka.bootstrap, args.partitions)
        init_producer_id_alone(broker)
        target, bootstrap = broker, kafka.bootstrap
        if path == "pidgate":
            log(f"{kafka.version} {path}: starting pidgate, waiting for its PID frontier")
            gate = Pidgate(kafka, log_dir, args.rate, args.window_seconds)
            gate.wait_frontier()
            target, bootstrap = gate.address, f"127.0.0.1:{gate.port}"
        steady = SteadyProducer(bootstrap, args.steady_interval_ms / 1000).start()
        jvm = java_pid(kafka)
        live_heap(jvm)  # the first attach loads jcmd's own classes: not the baseline
        before = live_heap(jvm)
        entries_before = sum(producer_entries(broker, TOPIC, args.partitions))
        log(f"{kafka.version} {path}: storm of {args.pids} new PIDs, {args.concurrency} at a time")
        storm = run_storm(target, args.pids, args.partitions, args.concurrency, args.max_seconds)
        log(
            f"{kafka.version} {path}: storm over in {storm.seconds:.1f} s: {storm.sent} PIDs, "
            f"{storm.admitted} admitted, {storm.rejected} rejected, failed {storm.failed}"
        )
        steady.stop()
        per_partition = producer_entries(broker, TOPIC, args.partitions)
        after = live_heap(jvm)
        entries = sum(per_partition)
        added = max(entries - entries_before, 1)
        classes = after.state_classes()
        state_delta = after.state_bytes(classes) - before.state_bytes(classes)
        deltas = {
            name: after.by_class.get(name, 0) - before.by_class.get(name, 0)
            for name in set(after.by_class) | set(before.by_class)
        }
        top = sorted(deltas.items(), key=lambda item: -item[1])[:12]
        return RunResult(
            version=kafka.version,
            path=path,
            pids=args.pids,
            sent=storm.sent,
            admitted=storm.admitted,
            rejected=storm.rejected,
            failed=storm.failed,
            init_retries=storm.init_retries,
            storm_seconds=round(storm.seconds, 1),
            entries=entries,
            entries_before=entries_before,
            entries_per_partition=per_partition,
            heap_delta_bytes=after.total - before.total,
            state_delta_bytes=state_delta,
            entry_objects=after.instances.get(classes[0], 0) - before.instances.get(classes[0], 0),
            bytes_per_entry_heap=round((after.total - before.total) / added, 1),
            bytes_per_entry_state=round(state_delta / added, 1),
            steady_delivered=steady.delivered,
            steady_errors=steady.errors,
            steady_first_error=steady.first_error,
            top_classes=top,
        )
    except BaseException:
        if gate is not None:
            print(f"pidgate's log ends:\n{gate.tail()}", file=sys.stderr)
        raise
    finally:
        if steady is not None:
            with contextlib.suppress(Exception):
                steady.stop()
        if gate is not None:
            gate.stop()
        kafka.stop()


# -- report ------------------------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def report(results: list[RunResult], args: argparse.Namespace) -> dict[str, Any]:
    print()
    print(
        f"{args.pids} new idempotent PIDs (InitProducerId + one acks=-1 Produce each), "
        f"{args.partitions} partition(s); pidgate quota {args.rate} new PIDs per "
        f"{args.window_seconds} s for User:ANONYMOUS"
    )
    header = (
        f"{'version':<8} {'path':<8} {'PIDs sent':>9} {'admitted':>9} {'rejected':>9} {'entries':>8} "
        f"{'B/entry':>8} {'state B/entry':>13} {'live heap delta':>15} {'direct/pidgate':>14} "
        f"{'steady ok/errors':>16} {'storm s':>8}"
    )
    print(header)
    print("-" * len(header))
    ratios: dict[str, float] = {}
    paired: dict[str, float] = {}
    for result in results:
        direct = next(
            (r for r in results if r.version == result.version and r.path == "direct"), None
        )
        ratio = ""
        if result.path == "pidgate" and direct is not None and result.entries:
            ratios[result.version] = round(direct.entries / result.entries, 1)
            ratio = f"{ratios[result.version]:.1f}x"
            if direct.entries > result.entries:
                # Both storms opened the same connections: what the broker keeps per
                # connection (metrics samples, ...) cancels out, the entries' cost remains.
                paired[result.version] = round(
                    (direct.heap_delta_bytes - result.heap_delta_bytes)
                    / (direct.entries - result.entries),
                    1,
                )
        print(
            f"{result.version:<8} {result.path:<8} {result.sent:>9,} {result.admitted:>9,} "
            f"{result.rejected:>9,} {result.entries:>8,} {result.bytes_per_entry_heap:>8.0f} "
            f"{result.bytes_per_entry_state:>13.0f} {mb(result.heap_delta_bytes):>15} {ratio:>14} "
            f"{f'{result.steady_delivered}/{result.steady_errors}':>16} {result.storm_seconds:>8.1f}"
        )
    for version, value in paired.items():
        print(
            f"{version}: live heap per entry, paired (heap delta direct - pidgate) / (entries "
            f"direct - pidgate): {value:.0f} B"
        )
    for result in results:
        notes = []
        if result.path == "pidgate":
            quota = args.rate + args.rate * result.storm_seconds / args.window_seconds
            notes.append(
                f"the quota allowed ~{quota:.0f} new PIDs in this storm (burst {args.rate}, one "
                "token of it the steady producer's, + refill); more admitted are Bloom false "
                "positives"
            )
        if result.failed:
            notes.append(f"storm producers failed: {result.failed}")
        if result.init_retries:
            notes.append(f"InitProducerId retried {result.init_retries}x (retriable errors)")
        if result.steady_first_error:
            notes.append(f"steady producer's first error: {result.steady_first_error}")
        notes.append(
            "largest live-heap growth: "
            + ", ".join(f"{name} {mb(delta)}" for name, delta in result.top_classes[:4])
        )
        print(f"{result.version} {result.path}: " + "; ".join(notes))
    summary = {
        "pids": args.pids,
        "partitions": args.partitions,
        "rate": args.rate,
        "window_seconds": args.window_seconds,
        "ratio_direct_pidgate": ratios,
        "bytes_per_entry_paired": paired,
        "runs": [asdict(r) for r in results],
    }
    print("PROTECTION " + json.dumps(summary, sort_keys=True), flush=True)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pids", type=int, default=20_000, help="storm producers (new PIDs) per run"
    )
    parser.add_argument(
        "--rate", type=int, default=50, help="pidgate quota: new PIDs per window for User:ANONYMOUS"
    )
    parser.add_argument("--window-seconds", type=int, default=60, help="pidgate quota window")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of the storm topic")
    parser.add_argument("--concurrency", type=int, default=64, help="storm producers at a time")
    parser.add_argument(
        "--steady-interval-ms", type=float, default=20.0, help="the steady producer's pace"
    )
    parser.add_argument("--max-seconds", type=float, default=1800.0, help="bound on each storm")
    parser.add_argument(
        "--versions", default="3,4", help="which of --kafka3/--kafka4 to run (3, 4 or 3,4)"
    )
    parser.add_argument("--paths", default="direct,pidgate", help="direct, pidgate or both")
    parser.add_argument(
        "--kafka3",
        default=None,
        help=f"a Kafka 3.x distribution folder (default ${KAFKA3_HOME_VAR})",
    )
    parser.add_argument(
        "--kafka4",
        default=None,
        help=f"a Kafka 4.x distribution folder (default ${KAFKA4_HOME_VAR})",
    )
    args = parser.parse_args()
    if args.pids < 1 or args.partitions < 1 or args.concurrency < 1 or args.rate < 1:
        parser.error("--pids, --partitions, --concurrency and --rate must be at least 1")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in ("direct", "pidgate") for p in paths):
        parser.error("--paths takes direct, pidgate or direct,pidgate")
    homes: list[Path] = []
    for version in (v.strip() for v in args.versions.split(",") if v.strip()):
        if version not in ("3", "4"):
            parser.error("--versions takes 3, 4 or 3,4")
        flag, variable = (
            (args.kafka3, KAFKA3_HOME_VAR) if version == "3" else (args.kafka4, KAFKA4_HOME_VAR)
        )
        if flag:
            os.environ[variable] = flag
        home = kafka_home(variable)
        if home is None:
            print(f"Kafka {version}.x skipped: pass --kafka{version} or set {variable}", flush=True)
            continue
        homes.append(home)
    if not homes:
        print("no Kafka distribution given: nothing to run", file=sys.stderr)
        return 2
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="pidgate-protection-") as tmp:
        for home in homes:
            for path in paths:
                log_dir = Path(tmp) / f"{home.name}-{path}"
                log_dir.mkdir()
                results.append(run_one(home, path, args, log_dir))
    report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
