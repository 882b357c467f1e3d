"""Scale run of the footprint job (not run by the tests).

Generates >= 1 GB of Kafka segments (RecordBatch v2, valid CRC-32C, idempotent and
transactional producers) with :func:`pidgate.pipeline.logdirs.generate_log_dirs` in a temporary
directory (or ``--dir``), then runs :func:`pidgate.pipeline.footprint.run_footprint` over them on
``local[*]`` and prints the wall time and MB/s (every batch's CRC is verified, so every byte is
read). Also times the per-file parser alone in this process for comparison.

    .venv/bin/python benchmarks/footprint_scale.py --gigabytes 1.0
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--dir", help="work dir (default: a temporary dir, removed afterwards)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--payload-kib", type=int, default=64)
    parser.add_argument("--records-per-batch", type=int, default=4)
    parser.add_argument("--segments-per-partition", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    args = parser.parse_args(argv)

    from pidgate.pipeline.footprint import parse_segment, run_footprint, segment_tasks
    from pidgate.pipeline.logdirs import generate_log_dirs
    from pidgate.pipeline.spark import spark_session, stop_session

    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pidgate-footprint-"))
    work.mkdir(parents=True, exist_ok=True)
    brokers, topics, partitions = 2, 4, 4
    files = topics * partitions * args.segments_per_partition
    batch_bytes = args.payload_kib * 1024 * args.records_per_batch
    target = int(args.gigabytes * 1e9)
    batches_per_segment = math.ceil(target / (files * batch_bytes))
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

        # The parser alone, single process, over the first few files (page cache is warm).
        tasks = [task for task, _ in segment_tasks(generated.log_dirs)][:8]
        sizes = sum(Path(t[4]).stat().st_size for t in tasks)
        start = time.perf_counter()
        for task in tasks:
            parse_segment(task)
        one = time.perf_counter() - start
        print(f"parser alone, 1 process: {sizes / 1e6 / one:.0f} MB/s (CRC-32C verified)")

        spark = spark_session(args.master, app_name="pidgate-footprint-scale")
        spark.sparkContext.parallelize([0], 1).count()  # start the executors before timing
        start = time.perf_counter()
        report = run_footprint(spark, generated.log_dirs, 86_400_000, str(work / "out"))
        run_s = time.perf_counter() - start
        print(
            f"footprint over {mb:.0f} MB on {spark.sparkContext.master}: {run_s:.1f} s, "
            f"{mb / run_s:.0f} MB/s (report: {report})"
        )
        # The parsing stage alone on the executors (warm), without the aggregations and writes.
        from pidgate.pipeline.footprint import parse_segments

        all_tasks = [task for task, _ in segment_tasks(generated.log_dirs)]
        start = time.perf_counter()
        parse_segments(spark, all_tasks, True, generated.bytes_written).count()
        parse_s = time.perf_counter() - start
        print(f"parse stage alone on the executors: {parse_s:.1f} s, {mb / parse_s:.0f} MB/s")
        stop_session()
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
