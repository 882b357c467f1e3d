"""The floor under ``pidgate analyze activity`` (not run by the tests): Spark jobs that send the
same splits of the same event log through the Python workers and do less with them, side by
side with the job itself, in one session on one master.

* ``read``: each task reads its split (``eventfacts.read_split_view``) and returns its size;
* ``scan``: reads, and parses with the compiled event-line reader (``eventfacts.parse_lines``);
* ``map``: reads, parses, boils the events down to facts and packs them by home, as the job's
  first stage does, and returns the packed bytes' count: no shuffle, no reduce, no report;
* ``activity``: the whole job (``run_activity``, report and Parquet included).

Each round runs the four (the order turns every round, so none is always first after the
session's warm-up round, which is not counted); medians are printed with events/s. ``read`` is
what Spark's Python-worker path costs for this input (tasks, sockets, the workers) before
pidgate's code does anything; the steps above it are what each part of the job adds.

    .venv/bin/python benchmarks/activity_floor.py --dir /tmp/scale --events 10000000

The log comes from ``benchmarks/pipeline_scale.py activity`` (same ``--dir``, ``--events`` and
``--seed``), which generates it once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

STEPS = ("read", "scan", "map", "activity")


def _split_job(spark: object, splits: list[tuple[str, int, int]], step: str) -> int:
    """A task per split doing ``step``; returns the sum of what the tasks counted."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from pidgate.pipeline.jobs.activity_parts import packing
    from pidgate.pipeline.reading import eventfacts

    packed = packing(11)  # the reduce tasks activity_parts gives this input
    assert packed is not None
    _, pack = packed

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total = 0
        for batch in batches:
            for index in batch.column(0).to_pylist():
                data = eventfacts.read_split_view(*splits[index])  # as the job reads them
                if step == "read":
                    total += len(data)
                    data.release()
                    continue
                table, bad = eventfacts.parse_lines(data)
                data.release()
                if step == "scan":
                    total += table.num_rows + bad
                    continue
                blobs = pack(eventfacts.facts_of_table(table, bad)).column(1)
                total += sum(len(blob) for blob in blobs.to_pylist())
        yield pa.record_batch({"n": pa.array([total], pa.int64())})

    frame = spark.range(len(splits), numPartitions=len(splits))  # type: ignore[attr-defined]
    [row] = frame.mapInArrow(count, "n long").agg(F.sum("n").alias("n")).collect()
    return int(row["n"])


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from pidgate.pipeline.jobs.activity import run_activity
    from pidgate.pipeline.reading.eventfacts import file_splits
    from pidgate.pipeline.spark.session import spark_session, stop_session

    log_dir = args.dir / f"events-{args.events}-{args.seed}"
    marker = log_dir / "_GENERATED.json"
    if not marker.exists():
        print(
            f"no generated log in {log_dir}: run benchmarks/pipeline_scale.py activity --dir "
            f"{args.dir} --events {args.events} --seed {args.seed} first",
            file=sys.stderr,
        )
        return 2
    events = int(json.loads(marker.read_text())["events"])
    splits = file_splits(sorted(str(p) for p in log_dir.glob("*.jsonl")))
    output = args.dir / "floor-report"
    spark = spark_session(args.master, app_name="pidgate-bench-floor")

    def split_job(step: str) -> Callable[[], object]:
        return lambda: _split_job(spark, splits, step)

    runs = {step: split_job(step) for step in STEPS[:3]}
    runs["activity"] = lambda: run_activity(spark, str(log_dir), str(output))
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    try:
        for step in STEPS:  # warm-up round: the JVM's and the workers' first use, not counted
            print(f"warm-up: {step} {_timed(runs[step]):.1f} s", flush=True)
        for round_index in range(args.rounds):
            shift = round_index % len(STEPS)
            for step in STEPS[shift:] + STEPS[:shift]:
                seconds = _timed(runs[step])
                times[step].append(seconds)
                print(
                    f"round {round_index + 1}: {step} {seconds:.1f} s "
                    f"(load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        stop_session()
    print(f"{events:,} events in {len(splits)} splits on {args.master}, medians:")
    for step in STEPS:
        median = statistics.median(times[step])
        print(f"  {step:9} {median:6.1f} s  {events / median:>12,.0f} events/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
