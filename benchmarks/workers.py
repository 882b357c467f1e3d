"""Throughput and CPU of ``pidgate serve --workers N`` for N = 1, 2, 4, side by side in one run.

Each round starts one tansu broker (once), then for every N: ``pidgate serve --workers N`` as a
subprocess (quota on, so every Produce goes through the quota; N > 1 is a fleet through the
topic), and ``--producers`` librdkafka producers (idempotent, ``linger.ms=0``, one 100-byte
record per request, one connection each, so SO_REUSEPORT spreads them over the workers) sending for
``--seconds``. Printed per N: delivered records/s, Produce requests pidgate read (from its
merged /metrics), and pidgate's CPU (every process: supervisor and workers, from /proc) per
request. This machine has 2 cores shared by the broker, the producers and pidgate: read the
CPU per request, not an absolute speed-up.

    .venv/bin/python benchmarks/workers.py [--seconds 10] [--producers 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer
from tests.integration.helpers import (
    PidgateProcess,
    create_topic,
    http_get,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import parse_samples

from pidgate.demo.broker import EmbeddedBroker, free_port

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for child_file in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in child_file.read_text().split():
            found.extend(_descendants(int(child)))
    return found


def _cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / _CLOCK_TICKS


def _produce_requests(admin: str) -> float:
    _, text = http_get(admin, "/metrics")
    return sum(
        value
        for labels, value in parse_samples(text).get("pidgate_requests_total", [])
        if labels.get("api_key") == "Produce"
    )


def run_once(broker: EmbeddedBroker, workers: int, seconds: float, producers: int) -> dict:
    port = free_port()
    pidgate = PidgateProcess(
        broker.bootstrap,
        port,
        broker_port_base=free_port() - 111,
        extra_args=("--workers", str(workers), "--default-producer-ids-rate", "1000"),
    ).wait_listening(60)
    admin = f"127.0.0.1:{pidgate.admin_port}"
    try:
        wait_until(lambda: http_get(admin, "/readyz")[0] == 200, 60, "pidgate ready")
        topic = unique_name(f"workers{workers}")
        create_topic(broker.bootstrap, topic, partitions=producers)
        delivered = [0] * producers
        stop = threading.Event()

        def load(index: int) -> None:
            producer = Producer(
                {
                    "bootstrap.servers": pidgate.bootstrap,
                    "enable.idempotence": True,
                    "linger.ms": 0,
                    # One record per request: the PID-storm workload is many small requests.
                    "batch.num.messages": 1,
                    "queue.buffering.max.messages": 10_000,
                }
            )

            def on_delivery(error: object, _message: object) -> None:
                if error is None:
                    delivered[index] += 1

            producer.produce(topic, b"w", partition=index, on_delivery=on_delivery)
            producer.flush(10)  # the PID is admitted before the clock starts
            delivered[index] = 0
            ready.wait()
            while not stop.is_set():
                try:
                    producer.produce(topic, b"x" * 100, partition=index, on_delivery=on_delivery)
                except BufferError:
                    producer.poll(0.01)
                producer.poll(0)
            producer.flush(10)

        ready = threading.Event()
        threads = [threading.Thread(target=load, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)
        pids = _descendants(pidgate.pid)
        requests_before = _produce_requests(admin)
        cpu_before = _cpu_seconds(pids)
        counted_before = sum(delivered)
        ready.set()
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        cpu = _cpu_seconds(pids) - cpu_before
        requests = _produce_requests(admin) - requests_before
        records = sum(delivered) - counted_before
        stop.set()
        for thread in threads:
            thread.join(30)
    finally:
        pidgate.terminate(60)
        pidgate.close()
    return {
        "workers": workers,
        "records_per_s": records / elapsed,
        "produce_requests_per_s": requests / elapsed,
        "cpu_cores": cpu / elapsed,
        "cpu_us_per_request": cpu / requests * 1e6 if requests else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    results: dict[int, list[dict]] = {n: [] for n in counts}
    with EmbeddedBroker() as broker:
        for _ in range(args.rounds):
            for n in counts:  # interleaved: noise hits every N alike
                results[n].append(run_once(broker, n, args.seconds, args.producers))
    for n in counts:
        rows = results[n]
        print(
            f"WORKERS n={n} "
            + " ".join(
                f"{key}={statistics.median(r[key] for r in rows):.1f}"
                for key in (
                    "records_per_s",
                    "produce_requests_per_s",
                    "cpu_cores",
                    "cpu_us_per_request",
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
