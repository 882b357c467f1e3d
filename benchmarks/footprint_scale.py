"""Scale run of the footprint job (not run by the tests).

Generates >= 1 GB of Kafka segments (RecordBatch v2, valid CRC-32C, idempotent and
transactional producers) with :func:`pidgate.pipeline.reading.logdirs.generate_log_dirs` in a
temporary
directory (or ``--dir``), starts a session on ``--master`` (default ``local[2]``; its start is
timed apart and NOT included), then runs :func:`pidgate.pipeline.jobs.footprint.run_footprint` over
the segments ``--runs`` times and prints, per run, the wall time, MB/s end to end (every batch's
CRC is verified, so every byte is read) and the number of Spark jobs. The first run pays the
JVM's and the Python workers' warm-up; later runs show the warm cost. Then the parse alone on
the executors (the footprint's job without the table writes, warm), and
the per-file parser alone in this process with and without CRC checks (the CRC's cost).
The machine's load average is printed before and after.

    .venv/bin/python benchmarks/footprint_scale.py --gigabytes 1.0 --runs 3

The last line is for scripts: ``FOOTPRINT mb=… first_s=… first_mb_per_s=… warm_s=… jobs=…
parse_s=… parser_mb_per_s=… parser_no_crc_mb_per_s=… load_before=… load_after=…``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _load() -> str:
    return "/".join(f"{v:.1f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--dir", help="work dir (default: a temporary dir, removed afterwards)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--payload-kib", type=int, default=64)
    parser.add_argument("--records-per-batch", type=int, default=4)
    parser.add_argument("--segments-per-partition", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    args = parser.parse_args(argv)

    from pidgate.pipeline.jobs.footprint import run_footprint, scan, segment_tasks, small_rows
    from pidgate.pipeline.jobs.footprint_scan import parse_segment
    from pidgate.pipeline.reading.logdirs import generate_log_dirs
    from pidgate.pipeline.spark.session import spark_session, stop_session

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pidgate-footprint-"))
    work.mkdir(parents=True, exist_ok=True)
    brokers, topics, partitions = 2, 4, 4
    files = topics * partitions * args.segments_per_partition
    batch_bytes = args.payload_kib * 1024 * args.records_per_batch
    target = int(args.gigabytes * 1e9)
    batches_per_segment = math.ceil(target / (files * batch_bytes))
    load_before = _load()
    print(f"load average (1/5/15 min) before: {load_before} on {os.cpu_count()} cores")
    try:
        start = time.perf_counter()
        generated = generate_log_dirs(
            str(work / "logs"),
            brokers=brokers,
            topics=topics,
            partitions=partitions,
            segments_per_partition=args.segments_per_partition,
            batches_per_segment=batches_per_segment,
            idempotent_producers=2_000,
            transactional_producers=200,
            records_per_batch=args.records_per_batch,
            payload_bytes=args.payload_kib * 1024,
        )
        gen_s = time.perf_counter() - start
        mb = generated.bytes_written / 1e6
        print(
            f"generated {mb:.0f} MB in {generated.segment_files} segment files "
            f"({generated.batches} batches, {generated.producer_ids} producers) "
            f"in {gen_s:.1f} s ({mb / gen_s:.0f} MB/s)"
        )

        start = time.perf_counter()
        spark = spark_session(args.master, app_name="pidgate-footprint-scale")
        sc = spark.sparkContext
        print(f"session start on {sc.master}: {time.perf_counter() - start:.1f} s (not included)")
        times: list[float] = []
        jobs: list[int] = []
        for run in range(args.runs):
            group = f"footprint-{run}"
            sc.setJobGroup(group, group)
            start = time.perf_counter()
            report = run_footprint(spark, generated.log_dirs, 86_400_000, str(work / "out"))
            times.append(time.perf_counter() - start)
            jobs.append(len(sc.statusTracker().getJobIdsForGroup(group)))
            print(
                f"footprint run {run + 1} ({'first' if run == 0 else 'warm'}): "
                f"{times[-1]:.2f} s, {mb / times[-1]:.0f} MB/s end to end, {jobs[-1]} Spark jobs"
            )
        print(f"report: {report}")

        # The parse alone on the executors (warm): the footprint's job without its writes.
        parts = segment_tasks(generated.log_dirs)
        start = time.perf_counter()
        small_rows(spark, scan(spark, parts))
        parse_s = time.perf_counter() - start
        print(f"parse stage alone on the executors: {parse_s:.2f} s, {mb / parse_s:.0f} MB/s")
        stop_session()

        # The parser alone, this process, over the first 8 files (page cache warm).
        tasks = [task for files_of in parts for task in files_of][:8]
        size = sum(Path(t[4]).stat().st_size for t in tasks) / 1e6
        rates = {}
        for crc in (True, False, True, False):
            start = time.perf_counter()
            for task in tasks:
                parse_segment(task, verify_crc=crc)
            rates.setdefault(crc, []).append(size / (time.perf_counter() - start))
        with_crc, without = max(rates[True]), max(rates[False])
        print(
            f"parser alone, 1 process: {with_crc:.0f} MB/s with CRC-32C checks, "
            f"{without:.0f} MB/s without"
        )
        load_after = _load()
        print(f"load average after: {load_after}")
        warm = statistics.median(times[1:]) if len(times) > 1 else float("nan")
        print(
            f"FOOTPRINT mb={mb:.0f} first_s={times[0]:.2f} first_mb_per_s={mb / times[0]:.0f} "
            f"warm_s={warm:.2f} jobs={jobs[0]} parse_s={parse_s:.2f} "
            f"parser_mb_per_s={with_crc:.0f} parser_no_crc_mb_per_s={without:.0f} "
            f"load_before={load_before} load_after={load_after}"
        )
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
