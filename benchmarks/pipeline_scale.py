"""Scale runs of the analysis pipeline on this machine (not run by the tests).

``activity``: generate (once, cached) an event log of >= 10M events with
:mod:`pidgate.pipeline.jobs.generate`, then run the activity job over it on ``local[*]`` and print
the
wall time, events/s and input MB/s (uncompressed JSON bytes read), and how busy the machine
was (the load average before and after: other work shares it).

    .venv/bin/python benchmarks/pipeline_scale.py activity --events 10000000 --dir /tmp/scale

``--baseline-src DIR`` (a checkout of another tree, e.g. ``git worktree add /tmp/base main``)
runs the same job from ``DIR/src`` and from this tree in turn, ``--rounds`` times, each in a
fresh process (so each pays its own session start, not counted), writes each one's report to
its own folder, checks the Parquet outputs of the two are equal, and prints the medians and
the ratio. The last line is for scripts: ``ACTIVITY events=... this_s=... baseline_s=...``.

The footprint scale run (>= 1 GB of segments) lives alongside as the ``footprint`` job.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_activity(
    events: int, workdir: Path, seed: int, master: str, output: Path | None = None
) -> dict[str, float]:
    from pidgate.pipeline.jobs.activity import run_activity
    from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
    from pidgate.pipeline.spark.session import spark_session, stop_session

    log_dir = workdir / f"events-{events}-{seed}"
    marker = log_dir / "_GENERATED.json"
    if not marker.exists():
        start = time.perf_counter()
        stats = generate_events(
            log_dir, GeneratorConfig(events=events, seed=seed, rotate_lines=1_000_000)
        )
        elapsed = time.perf_counter() - start
        marker.write_text(json.dumps({"events": stats.events, "seconds": elapsed}))
        print(
            f"generated {stats.events} events in {elapsed:.1f} s "
            f"({stats.events / elapsed:,.0f} events/s)"
        )
    generated = json.loads(marker.read_text())
    input_bytes = _dir_bytes(log_dir) - marker.stat().st_size
    mb = input_bytes / 1e6

    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    spark = spark_session(master, app_name="pidgate-bench-activity")
    session_s = time.perf_counter() - start
    try:
        start = time.perf_counter()
        report = run_activity(spark, str(log_dir), str(output or workdir / "activity-report"))
        job_s = time.perf_counter() - start
    finally:
        stop_session()
    result = {
        "events": float(generated["events"]),
        "input_mb": mb,
        "session_start_s": session_s,
        "activity_s": job_s,
        "events_per_s": generated["events"] / job_s,
        "mb_per_s": mb / job_s,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    print(
        f"activity over {generated['events']:,} events ({mb:,.0f} MB JSON) on {master}: "
        f"{job_s:.1f} s = {result['events_per_s']:,.0f} events/s, {result['mb_per_s']:.1f} MB/s "
        f"(session start {session_s:.1f} s, not included); report {report}\n"
        f"machine load (1-min load average, {os.cpu_count()} cores): {load_before:.1f} before, "
        f"{result['load_after']:.1f} after"
    )
    return result


def _one_run(src: Path, args: argparse.Namespace, output: Path) -> float:
    """The job's seconds in a fresh process importing pidgate from ``src``."""
    done = subprocess.run(
        [sys.executable, __file__, "activity", "--events", str(args.events), "--dir",
         str(args.dir), "--seed", str(args.seed), "--master", args.master,
         "--output", str(output), "--json"],
        env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result["activity_s"]


def _same_outputs(one: Path, other: Path) -> None:
    import pandas as pd  # type: ignore[import-untyped, unused-ignore]

    for name in ("hourly", "top_offenders", "recommendations"):
        a, b = (pd.read_parquet(d / f"{name}.parquet") for d in (one, other))
        keys = list(a.columns[:2])
        pd.testing.assert_frame_equal(
            a.sort_values(keys).reset_index(drop=True), b.sort_values(keys).reset_index(drop=True)
        )


def side_by_side(args: argparse.Namespace) -> None:
    here = Path(__file__).resolve().parents[1] / "src"
    base = Path(args.baseline_src).resolve() / "src"
    times: dict[str, list[float]] = {"this": [], "baseline": []}
    for round_index in range(args.rounds):
        order = [("baseline", base), ("this", here)]
        for name, src in order if round_index % 2 == 0 else reversed(order):
            seconds = _one_run(src, args, args.dir / f"report-{name}")
            times[name].append(seconds)
            print(
                f"round {round_index + 1}: {name} {seconds:.1f} s (load {os.getloadavg()[0]:.1f})"
            )
    _same_outputs(args.dir / "report-this", args.dir / "report-baseline")
    this_s, base_s = (statistics.median(times[n]) for n in ("this", "baseline"))
    print(
        f"activity over {args.events:,} events on {args.master}: this tree {this_s:.1f} s "
        f"({args.events / this_s:,.0f} events/s), baseline {base_s:.1f} s; "
        f"baseline/this {base_s / this_s:.2f}x; Parquet outputs equal"
    )
    print(f"ACTIVITY events={args.events} this_s={this_s:.1f} baseline_s={base_s:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    jobs = parser.add_subparsers(dest="job", required=True)
    act = jobs.add_parser("activity", help="activity over a generated event log")
    act.add_argument("--events", type=int, default=10_000_000)
    act.add_argument("--dir", type=Path, default=Path("/tmp/pidgate-scale"))
    act.add_argument("--seed", type=int, default=1)
    act.add_argument("--master", default="local[*]")
    act.add_argument("--baseline-src", help="another checkout to run side by side")
    act.add_argument("--rounds", type=int, default=1)
    act.add_argument("--output", type=Path, help="where the report goes")
    act.add_argument("--json", action="store_true", help="print the result as JSON last")
    args = parser.parse_args(argv)
    if args.baseline_src:
        side_by_side(args)
    elif args.job == "activity":
        result = bench_activity(args.events, args.dir, args.seed, args.master, args.output)
        if args.json:
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
