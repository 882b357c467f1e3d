"""``pidgate analyze activity`` on a standalone cluster against ``local[2]``, same machine, same
input, in turn (``--rounds`` pairs; not run by the tests).

Generates (once, cached under ``--dir``) an event log with :mod:`pidgate.pipeline.jobs.generate`,
starts a Master and a 2-core Worker in a network namespace (the test harness,
``tests/pipeline/spark/spark_cluster.py``: needs root) and waits until the worker has
registered, then runs the CLI as a user would, on ``local[2]`` and with
``--master spark://...`` in turn. Prints, for each, the wall time end to end and
the job's own time (from the job's first stage line to "done", read from the progress lines:
JVM start and, on the cluster, the executor check excluded), and the cluster/local ratios.
The cluster run gets the 4 shuffle partitions ``local[2]`` has by default, and any ``--conf``
given here; with several rounds, the medians of the paired ratios.

    sudo .venv/bin/python benchmarks/pipeline_cluster.py --events 10000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL_SHUFFLE_PARTITIONS = 4
_STAMP = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")


def _events(directory: Path, events: int) -> Path:
    log_dir = directory / f"events-{events}"
    if not (log_dir / "_GENERATED").exists():
        subprocess.run(
            [sys.executable, "-m", "pidgate.pipeline.jobs.generate", "events",
             "--out", str(log_dir), "--events", str(events), "--rotate-lines", "250000"],
            check=True,
        )  # fmt: skip
        (log_dir / "_GENERATED").write_text(str(events))
    return log_dir


def _run(events: Path, output: Path, master: str, *extra: str) -> tuple[float, float]:
    """(wall seconds, job seconds) of one ``pidgate analyze activity`` run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pidgate", "analyze", "activity", "--events", str(events),
         "--output", str(output), "--master", master, *extra],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{master}: exit {done.returncode}\n{done.stderr[-3000:]}")
    stamps = [m for m in map(_STAMP.match, done.stderr.splitlines()) if m]
    for stamp in stamps:  # where the time went: the job's own progress lines
        print(f"  [{float(stamp.group(1)):6.1f}s] {stamp.group(2)[:100]}", flush=True)
    first = next(float(m.group(1)) for m in stamps if m.group(2).startswith("reading"))
    last = next(float(m.group(1)) for m in stamps if m.group(2) == "done")
    return wall_s, last - first


def _load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pgbench")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the cluster run, repeatable (e.g. "
        "spark.executor.defaultJavaOptions= to give the executors C2 again)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="local and cluster runs in turn, this many pairs"
    )
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.pipeline.spark.spark_cluster import standalone_cluster, unavailable

    reason = unavailable()
    if reason:
        sys.exit(f"cannot start the namespace cluster: {reason}")
    args.dir.mkdir(parents=True, exist_ok=True)
    events = _events(args.dir, args.events)
    cluster_conf = [
        # The shuffle partitions local[2] gets by default (Spark's 200 suit big clusters).
        "--conf", f"spark.sql.shuffle.partitions={LOCAL_SHUFFLE_PARTITIONS}",
        *(arg for pair in args.conf for arg in ("--conf", pair)),
    ]  # fmt: skip
    ratios: list[tuple[float, float]] = []
    # One cluster for every round, started before the first one: a cluster is up before
    # anyone submits to it, and its start is not the job's.
    with standalone_cluster(args.dir / "cluster", cores=2, memory="2g") as cluster:
        for round_number in range(1, args.rounds + 1):
            print(f"round {round_number} of {args.rounds} (load {_load()})", flush=True)
            local = _run(events, args.dir / "out-local", "local[2]")
            print(f"local[2]: {local[0]:.1f} s end to end, job {local[1]:.1f} s", flush=True)
            remote = _run(events, args.dir / "out-cluster", cluster.master_url, *cluster_conf)
            print(f"cluster ({cluster.master_url}, 1 worker, 2 cores, "
                  f"spark.sql.shuffle.partitions={LOCAL_SHUFFLE_PARTITIONS}): "
                  f"{remote[0]:.1f} s end to end, job {remote[1]:.1f} s")  # fmt: skip
            ratios.append((remote[1] / local[1], remote[0] / local[0]))
            print(f"ratio cluster/local: job {ratios[-1][0]:.2f}x, "
                  f"end to end {ratios[-1][1]:.2f}x", flush=True)  # fmt: skip
    if len(ratios) > 1:
        jobs = sorted(job for job, _ in ratios)
        ends = sorted(end for _, end in ratios)
        print(f"median of {len(ratios)} rounds (load {_load()}): job "
              f"{statistics.median(jobs):.2f}x ({jobs[0]:.2f}-{jobs[-1]:.2f}), end to end "
              f"{statistics.median(ends):.2f}x ({ends[0]:.2f}-{ends[-1]:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
