"""``pidgate analyze activity`` on a standalone cluster against ``local[2]``, same machine, same
input, one run each (not run by the tests).

Generates (once, cached under ``--dir``) an event log with :mod:`pidgate.pipeline.jobs.generate`,
starts a Master and a 2-core Worker in a network namespace (the test harness,
``tests/pipeline/spark/spark_cluster.py``: needs root), and runs the CLI as a user would, first on
``local[2]``, then with ``--master spark://...``. Prints, for each, the wall time end to end and
the job's own time (from the job's first stage line to "done", read from the progress lines:
JVM start and, on the cluster, the executor check excluded), and the cluster/local ratios.
The cluster run gets the 4 shuffle partitions ``local[2]`` has by default, and any ``--conf``
given here.

    sudo .venv/bin/python benchmarks/pipeline_cluster.py --events 1000000 --dir /tmp/pgbench
"""

from __future__ import annotations

import argparse
import os
import re
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
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.pipeline.spark.spark_cluster import standalone_cluster, unavailable

    reason = unavailable()
    if reason:
        sys.exit(f"cannot start the namespace cluster: {reason}")
    args.dir.mkdir(parents=True, exist_ok=True)
    events = _events(args.dir, args.events)
    local = _run(events, args.dir / "out-local", "local[2]")
    print(f"local[2]: {local[0]:.1f} s end to end, job {local[1]:.1f} s", flush=True)
    with standalone_cluster(args.dir / "cluster", cores=2, memory="2g") as cluster:
        # The shuffle partitions local[2] gets by default (Spark's 200 suit big clusters).
        remote = _run(
            events, args.dir / "out-cluster", cluster.master_url,
            "--conf", f"spark.sql.shuffle.partitions={LOCAL_SHUFFLE_PARTITIONS}",
            *(arg for pair in args.conf for arg in ("--conf", pair)),
        )  # fmt: skip
    print(f"cluster ({cluster.master_url}, 1 worker, 2 cores, "
          f"spark.sql.shuffle.partitions={LOCAL_SHUFFLE_PARTITIONS}): "
          f"{remote[0]:.1f} s end to end, job {remote[1]:.1f} s")  # fmt: skip
    print(f"ratio cluster/local: job {remote[1] / local[1]:.2f}x, "
          f"end to end {remote[0] / local[0]:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
