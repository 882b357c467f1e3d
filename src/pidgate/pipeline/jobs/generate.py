"""Realistic synthetic PID event logs, recorded by simulating pidgate's own quota decisions.

A discrete-event simulation of clients talking to several pidgate instances. Each instance has
its own :class:`~pidgate.quota.QuotaManager` (as separate proxies do) fed with that instance's
wall clock, and writes the events the proxy's event sink would write: ``init_producer_id`` for
every PID handed out, ``admitted_new`` per (new PID, partition) of an admitted request,
``rejected`` per (PID, partition) of a throttled request, with ``request_id`` counting requests
per instance. So the log is what a real throttling run records, and the backtest must reproduce
its decisions (tests/pipeline/jobs/test_backtest.py).

Principals:

* well-behaved (``app-NN``): a few long-lived producers each (some transactional), producing
  steadily (their known PIDs log nothing), restarting rarely;
* restart storms (``storm-N``): a producer that lives seconds, then restarts with a new PID; after
  a few rejections it gives up and restarts, which is how storms feed themselves;
* producer per batch (``batchy-N``): a new producer (sometimes two) for every batch.

Instances have clocks a few ms apart and files rotate by line count, so timestamps are out of
order across files. Files are written as they are produced (one open file per instance, bounded
buffers), so memory stays bounded however many events are asked for: 10M events is a matter of
minutes. ``tokens`` is not written (no job reads it).

CLI: ``python -m pidgate.pipeline.jobs.generate events --out DIR --events N --seed S [--gzip]``.

Imports :mod:`pidgate.quota` (the proxy's own decisions); must not import pyspark or another
pipeline module: it writes files, Spark reads them.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pidgate.quota import Admitted, QuotaManager, QuotaPolicy

__all__ = ["GeneratorConfig", "GeneratorStats", "default_policy", "generate_events", "main"]

_SOFTWARE = ("apache-kafka-java/3.7.0", "librdkafka/2.4.0", "kafka-python/2.0.2")
_TOPICS = ("orders", "payments", "clicks", "audit", "metrics")
_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def default_policy() -> QuotaPolicy:
    """The quota the simulated proxies enforce: 200 new PIDs per hour per user by default, more
    for two of the well-behaved users (so every principal is tracked and its PIDs logged)."""
    return QuotaPolicy(
        default_producer_ids_rate=200,
        user_producer_ids_rates={"app-00": 1000, "app-01": 500},
    )


@dataclass(frozen=True)
class GeneratorConfig:
    """What to simulate; ``events`` counts well-formed lines written (bad lines are extra)."""

    events: int = 100_000
    seed: int = 0
    instances: int = 3
    well_behaved: int = 20
    restart_storms: int = 3
    per_batch: int = 2
    start_ms: int = _START_MS
    rotate_lines: int = 250_000
    gzip: bool = False
    bad_line_every: int = 0
    max_skew_ms: int = 40
    policy: QuotaPolicy = field(default_factory=default_policy)


@dataclass
class GeneratorStats:
    events: int = 0
    bad_lines: int = 0
    files: list[Path] = field(default_factory=list)
    admitted_requests: int = 0
    rejected_requests: int = 0
    first_ts_ms: int = 0
    last_ts_ms: int = 0


class _Writer:
    """One instance's rotated event files; lines are buffered and flushed in chunks."""

    def __init__(self, out: Path, instance: str, cfg: GeneratorConfig, stats: GeneratorStats):
        self._out = out
        self._name = instance.replace(":", "_")
        self._cfg = cfg
        self._stats = stats
        self._seq = 0
        self._lines = 0
        self._buffer: list[str] = []
        self._file: IO[str] | None = None

    def _open(self) -> IO[str]:
        suffix = ".jsonl.gz" if self._cfg.gzip else ".jsonl"
        path = self._out / f"events-{self._name}-{self._seq:05d}{suffix}"
        self._seq += 1
        self._stats.files.append(path)
        if self._cfg.gzip:
            return gzip.open(path, "wt", encoding="utf-8", compresslevel=1)
        return path.open("w", encoding="utf-8")

    def write(self, line: str) -> None:
        self._buffer.append(line)
        self._lines += 1
        if len(self._buffer) >= 4096:
            self.flush()
        if self._lines >= self._cfg.rotate_lines:
            self.close()
            self._lines = 0

    def flush(self) -> None:
        if self._buffer:
            if self._file is None:
                self._file = self._open()
            self._file.write("\n".join(self._buffer) + "\n")
            self._buffer.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


class _Instance:
    def __init__(self, name: str, node_id: int, skew_ms: int, policy: QuotaPolicy, writer: _Writer):
        self.name = name
        self.node_id = node_id
        self.skew_ms = skew_ms
        self.quota = QuotaManager(policy)
        self.writer = writer
        self.request_id = 0


@dataclass
class _Client:
    kind: str  # "steady" | "storm" | "batch"
    principal: str
    client_id: str
    software: str
    instance: _Instance
    transactional: bool = False
    pids: list[int] = field(default_factory=list)
    partitions: list[tuple[str, int]] = field(default_factory=list)
    retries: int = 0
    cycle_start_ms: int = 0


class _Simulation:
    def __init__(self, cfg: GeneratorConfig, out: Path) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.stats = GeneratorStats()
        self.next_pid = self.rng.randrange(1_000, 1_000_000)
        self.instances = [
            _Instance(
                f"pidgate-{i}:9092",
                i,
                self.rng.randint(-cfg.max_skew_ms, cfg.max_skew_ms),
                cfg.policy,
                _Writer(out, f"pidgate-{i}:9092", cfg, self.stats),
            )
            for i in range(cfg.instances)
        ]
        self.heap: list[tuple[int, int, _Client]] = []
        self.seq = 0
        self.since_bad = 0
        self._throttle = 0  # throttle_time_ms of the last rejection

    # -- output ---------------------------------------------------------------------------

    def emit(self, inst: _Instance, record: dict[str, Any]) -> None:
        stats = self.stats
        if stats.events >= self.cfg.events:
            return  # one step can emit several events: stop at exactly the count asked for
        inst.writer.write(json.dumps(record, separators=(",", ":")))
        if stats.events == 0:
            stats.first_ts_ms = record["ts_ms"]
        stats.first_ts_ms = min(stats.first_ts_ms, record["ts_ms"])
        stats.last_ts_ms = max(stats.last_ts_ms, record["ts_ms"])
        stats.events += 1
        if self.cfg.bad_line_every:
            self.since_bad += 1
            if self.since_bad >= self.cfg.bad_line_every:
                self.since_bad = 0
                inst.writer.write('{"ts_ms": 17, "event": "admitted_new", "principal": trunc')
                stats.bad_lines += 1

    def _base(self, c: _Client, ts: int, event: str, request_id: int) -> dict[str, Any]:
        return {
            "ts_ms": ts,
            "event": event,
            "principal": c.principal,
            "client_id": c.client_id,
            "client_software": c.software,
            "node_id": c.instance.node_id,
            "instance": c.instance.name,
            "request_id": request_id,
        }

    # -- clients --------------------------------------------------------------------------

    def schedule(self, when_ms: int, client: _Client) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (when_ms, self.seq, client))

    def new_pid(self, c: _Client, now: int) -> int:
        pid = self.next_pid
        self.next_pid += self.rng.randint(1, 7)  # other clusters' clients take PIDs too
        inst = c.instance
        inst.request_id += 1
        record = self._base(c, now + inst.skew_ms, "init_producer_id", inst.request_id)
        record.update(producer_id=pid, producer_epoch=0, transactional=c.transactional)
        self.emit(inst, record)
        return pid

    def pick_partitions(self, n: int) -> list[tuple[str, int]]:
        topic = self.rng.choice(_TOPICS)
        return [(topic, p) for p in self.rng.sample(range(12), n)]

    def produce(self, c: _Client, now: int) -> bool:
        """One Produce request carrying all of ``c.pids``; True when admitted."""
        inst = c.instance
        ts = now + inst.skew_ms
        inst.request_id += 1
        decision = inst.quota.admit(c.principal, c.pids, ts)
        if isinstance(decision, Admitted):
            self.stats.admitted_requests += 1
            for pid in decision.new_producer_ids:
                for topic, partition in c.partitions:
                    record = self._base(c, ts, "admitted_new", inst.request_id)
                    record.update(
                        producer_id=pid, producer_epoch=0, topic=topic, partition=partition
                    )
                    self.emit(inst, record)
            return True
        self.stats.rejected_requests += 1
        for pid in decision.unknown_producer_ids:
            for topic, partition in c.partitions:
                record = self._base(c, ts, "rejected", inst.request_id)
                record.update(
                    producer_id=pid,
                    producer_epoch=0,
                    topic=topic,
                    partition=partition,
                    throttle_ms=decision.throttle_time_ms,
                )
                self.emit(inst, record)
        c.retries += 1
        self._throttle = decision.throttle_time_ms
        return False

    def restart(self, c: _Client, now: int, count: int = 1) -> int:
        c.pids = [self.new_pid(c, now) for _ in range(count)]
        c.partitions = self.pick_partitions(self.rng.randint(1, 3))
        c.retries = 0
        return now + self.rng.randint(5, 80)  # first Produce shortly after InitProducerId

    def step(self, c: _Client, now: int) -> int:
        rng = self.rng
        if not c.pids:
            return self.restart(c, now, 2 if c.kind == "batch" and rng.random() < 0.1 else 1)
        admitted = self.produce(c, now)
        backoff = (
            0 if admitted else min(self._throttle, 30_000) + rng.randint(50, 500)
        )  # clients wait out throttle_time_ms, then retry the same PIDs
        if c.kind == "steady":
            if not admitted:
                return now + backoff
            if rng.random() < 0.002:  # a deploy: restart with a new PID a little later
                c.pids = []
                return now + rng.randint(5_000, 60_000)
            return now + rng.randint(300_000, 1_200_000)  # keeps producing; known PIDs log nothing
        if c.kind == "storm":
            if not admitted and c.retries < 3:
                return now + backoff
            c.pids = []  # dies after a few seconds (or gives up), restarts with a new PID
            return now + rng.randint(1_000, 10_000)
        # producer per batch
        if not admitted and c.retries < 2:
            return now + backoff
        c.pids = []
        return now + rng.randint(200, 3_000)

    def run(self) -> GeneratorStats:
        cfg, rng = self.cfg, self.rng
        clients: list[_Client] = []

        def add(kind: str, principal: str, count: int) -> None:
            for k in range(count):
                clients.append(
                    _Client(
                        kind,
                        principal,
                        f"{principal.removeprefix('User:')}-{kind}-{k}",
                        rng.choice(_SOFTWARE),
                        rng.choice(self.instances),
                        transactional=kind == "steady" and rng.random() < 0.25,
                    )
                )

        for i in range(cfg.well_behaved):
            add("steady", f"User:app-{i:02d}", rng.randint(1, 4))
        for i in range(cfg.restart_storms):
            add("storm", f"User:storm-{i}", rng.randint(1, 3))
        for i in range(cfg.per_batch):
            add("batch", f"User:batchy-{i}", rng.randint(1, 2))
        for c in clients:
            self.schedule(cfg.start_ms + rng.randint(0, 600_000), c)

        while self.heap and self.stats.events < cfg.events:
            now, _, c = heapq.heappop(self.heap)
            self.schedule(self.step(c, now), c)
        for inst in self.instances:
            inst.writer.close()
        return self.stats


def generate_events(out_dir: str | Path, config: GeneratorConfig) -> GeneratorStats:
    """Simulate until ``config.events`` events are written to ``out_dir`` (created); return
    what was written. Deterministic for a given config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return _Simulation(config, out).run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pidgate.pipeline.jobs.generate",
        description="Generate synthetic pidgate data for the analysis pipeline.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    ev = commands.add_parser("events", help="a PID event log (JSON Lines)")
    ev.add_argument("--out", required=True, help="output directory")
    ev.add_argument("--events", type=int, default=100_000, help="events to write (100000)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--instances", type=int, default=3, help="pidgate instances (3)")
    ev.add_argument("--well-behaved", type=int, default=20, help="well-behaved principals (20)")
    ev.add_argument("--storms", type=int, default=3, help="restart-storm principals (3)")
    ev.add_argument("--per-batch", type=int, default=2, help="producer-per-batch principals (2)")
    ev.add_argument("--rotate-lines", type=int, default=250_000, help="lines per file (250000)")
    ev.add_argument("--gzip", action="store_true", help="gzip the files")
    ev.add_argument(
        "--bad-line-every", type=int, default=0, metavar="N", help="add a corrupt line every N"
    )
    args = parser.parse_args(argv)
    config = GeneratorConfig(
        events=args.events,
        seed=args.seed,
        instances=args.instances,
        well_behaved=args.well_behaved,
        restart_storms=args.storms,
        per_batch=args.per_batch,
        rotate_lines=args.rotate_lines,
        gzip=args.gzip,
        bad_line_every=args.bad_line_every,
    )
    stats = generate_events(args.out, config)
    print(
        f"wrote {stats.events} events ({stats.bad_lines} bad lines) to {len(stats.files)} files "
        f"in {args.out}: {stats.admitted_requests} admitted and {stats.rejected_requests} "
        f"rejected requests, ts_ms {stats.first_ts_ms}..{stats.last_ts_ms}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
