"""``pidgate analyze <job>``: the command-line entry of every pipeline job.

``pidgate.cli`` wires this in with :func:`add_analyze_parser` and :func:`run_analyze`:

* ``activity --events PATH [--output DIR] [--master URL]``
* ``backtest --events PATH --quota-config FILE [--per-instance] [--output DIR] [--master URL]``
* ``footprint --log-dirs PATH... [--expiration-ms N] [--output DIR] [--master URL]``
* ``snapshots --log-dir PATH [--expiration-ms N] [--dry-run] [--master URL]``

Paths may be local or any Hadoop filesystem URI; ``--output`` defaults to
``./pidgate-reports/<job>/``. ``--master`` defaults to ``local[*]`` (or the master spark-submit
chose). Job modules are imported only when their job runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["DEFAULT_EXPIRATION_MS", "add_analyze_parser", "run_analyze"]

#: Kafka's producer.id.expiration.ms default (KIP-854): one day.
DEFAULT_EXPIRATION_MS = 86_400_000


def _common(parser: argparse.ArgumentParser, output: bool = True) -> None:
    if output:
        parser.add_argument(
            "--output",
            metavar="DIR",
            help="directory (or Hadoop URI) for Parquet and report.html; "
            "default ./pidgate-reports/<job>/",
        )
    parser.add_argument(
        "--master", metavar="URL", help="Spark master; default local[*] or spark-submit's"
    )


def _expiration(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--expiration-ms",
        type=int,
        default=DEFAULT_EXPIRATION_MS,
        metavar="N",
        help="producer.id.expiration.ms (default 86400000, one day)",
    )


def add_analyze_parser(subparsers: Any) -> None:
    """Add ``analyze`` and its jobs to the ``pidgate`` subcommands (an argparse
    ``_SubParsersAction``)."""
    analyze: argparse.ArgumentParser = subparsers.add_parser(
        "analyze",
        help="Spark jobs over the PID event log and broker log directories",
        description="Analyse PID activity, backtest a quota, size producer state, repair "
        "producer snapshots. Runs on embedded Spark (local[*]) unless --master says otherwise.",
    )
    jobs = analyze.add_subparsers(dest="job", required=True)

    activity = jobs.add_parser(
        "activity",
        help="new PIDs per principal and hour, top offenders, recommended producer_ids_rate",
    )
    activity.add_argument(
        "--events", required=True, metavar="PATH", help="event log file, directory or glob"
    )
    _common(activity)

    backtest = jobs.add_parser(
        "backtest", help="what a candidate quota config would have throttled"
    )
    backtest.add_argument(
        "--events", required=True, metavar="PATH", help="event log file, directory or glob"
    )
    backtest.add_argument(
        "--quota-config",
        required=True,
        metavar="FILE",
        help="pidgate YAML config whose quota section is the candidate",
    )
    backtest.add_argument(
        "--per-instance",
        action="store_true",
        help="one quota manager per principal and pidgate instance (separate proxies), "
        "instead of one per principal",
    )
    _common(backtest)

    footprint = jobs.add_parser(
        "footprint", help="PIDs per partition and broker within producer.id.expiration.ms"
    )
    footprint.add_argument(
        "--log-dirs", required=True, nargs="+", metavar="PATH", help="broker log directories"
    )
    _expiration(footprint)
    _common(footprint)

    snapshots = jobs.add_parser("snapshots", help="rebuild missing producer snapshots")
    snapshots.add_argument("--log-dir", required=True, metavar="PATH", help="a log directory")
    _expiration(snapshots)
    snapshots.add_argument(
        "--dry-run", action="store_true", help="only list the snapshots that would be written"
    )
    _common(snapshots, output=False)


def _output(args: argparse.Namespace) -> str:
    output: str | None = getattr(args, "output", None)
    return output or f"./pidgate-reports/{args.job}/"


def run_analyze(args: argparse.Namespace) -> int:
    """Run the job ``args.job`` with the parsed arguments; the process exit code."""
    from pyspark.sql import SparkSession

    from pidgate.pipeline.spark import spark_session, stop_session

    job: str = args.job
    # A session that already exists (a notebook, a test) is used and left running.
    owned = SparkSession.getActiveSession() is None
    spark = spark_session(args.master, app_name=f"pidgate-{job}")
    try:
        if job == "activity":
            from pidgate.pipeline.activity import run_activity

            report = run_activity(spark, args.events, _output(args))
        elif job == "backtest":
            from pidgate.config import ConfigError
            from pidgate.pipeline.backtest import run_backtest

            try:
                report = run_backtest(
                    spark,
                    args.events,
                    args.quota_config,
                    _output(args),
                    per_instance=args.per_instance,
                )
            except ConfigError as error:
                print(f"pidgate analyze backtest: {error}", file=sys.stderr)
                return 2
        elif job == "footprint":
            from pidgate.pipeline.footprint import run_footprint

            report = run_footprint(spark, list(args.log_dirs), args.expiration_ms, _output(args))
        elif job == "snapshots":
            from pidgate.pipeline.snapshots import run_snapshots

            count = run_snapshots(spark, args.log_dir, args.expiration_ms, args.dry_run)
            verb = "would write" if args.dry_run else "wrote"
            print(f"{verb} {count} producer snapshot(s) under {args.log_dir}")
            return 0
        else:  # argparse only lets the jobs above through
            print(f"pidgate analyze: unknown job {job!r}", file=sys.stderr)
            return 2
        print(f"report: {report}")
        return 0
    finally:
        if owned:
            stop_session()
