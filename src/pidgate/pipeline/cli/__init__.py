"""``pidgate analyze <job>``: the command-line entry of every pipeline job.

``pidgate.cli`` wires this in with :data:`ANALYZE_COMMAND` (a row of its command table, the
jobs its subcommands) and :func:`run_analyze`; :func:`add_analyze_parser` adds the same to any
argparse subcommands:

* ``activity --events PATH [--since WHEN] [--until WHEN] [--output DIR] [--master URL]``
* ``backtest --events PATH --quota-config FILE [--per-instance] [--since WHEN] [--until WHEN]
  [--output DIR] [--master URL]``
* ``footprint --log-dirs PATH... [--expiration-ms N] [--output DIR] [--master URL]``
* ``snapshots --log-dir PATH [--expiration-ms N] [--dry-run] [--master URL]``

``--remote sc://HOST:PORT`` (or ``SPARK_REMOTE``) runs ``activity`` and ``backtest`` on a Spark
Connect server instead of a master; ``footprint`` and ``snapshots`` use the RDD API, which Spark
Connect lacks, and are refused before anything starts. Local paths are refused unless the server
is on this host (it reads and writes on its side).

Paths may be local or any Hadoop filesystem URI; ``--output`` defaults to
``./pidgate-reports/<job>/``. ``--master`` defaults to ``local[*]`` (or the master spark-submit
chose); every job also takes ``--conf KEY=VALUE`` (repeatable, wins), ``--driver-host``,
``--executor-python`` and ``--no-ship`` for clusters (:mod:`pidgate.pipeline.spark.session`). On a
cluster the executors are checked before the job (:mod:`pidgate.pipeline.spark.executors`), and
after it a local output without data files is an error (footprint itself refuses to report
when it read no batch).

Each job's flags, checks and run are one row of :mod:`pidgate.pipeline.cli.job_table`; this
module is the driver around them. Inputs are checked before Spark starts
(:mod:`pidgate.pipeline.reading.inputs`): a missing path, a bad quota config or an empty period
is one line on stderr and exit code 2. While Spark runs, stage lines and task progress go to
stderr (:mod:`pidgate.pipeline.spark.progress`); at the end a short summary and the report's
path go to stdout.

The top of the pipeline: may import every pipeline package (jobs only inside the function that
runs them, pyspark only once a job runs) and ``pidgate.config``; nothing in the pipeline
imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pidgate.config.command_table import Command, add_commands
from pidgate.pipeline.cli.job_table import JOB_COMMANDS, JOBS, output_dir, prepare

__all__ = ["ANALYZE_COMMAND", "add_analyze_parser", "run_analyze"]


def run_analyze(args: argparse.Namespace) -> int:
    """Run the job ``args.job`` with the parsed arguments; the process exit code: 0 done,
    2 bad input (one line on stderr, found before Spark starts where possible), 1 the job
    failed (its reason in one line; ``PIDGATE_DEBUG=1`` shows the traceback)."""
    from pidgate.pipeline.reading.inputs import InputError

    job: str = args.job
    prog = f"pidgate analyze {job}"
    try:
        prepared = prepare(args)
    except InputError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2

    from pidgate.pipeline.spark.progress import Progress

    progress = Progress()
    events = prepared.get("events")
    try:
        return _run_job(args, prepared, progress)
    except InputError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if os.environ.get("PIDGATE_DEBUG"):
            raise
        from pidgate.pipeline.spark.errors import JobError, one_line

        if isinstance(error, JobError):
            print(f"{prog}: {error}", file=sys.stderr)
        else:
            cause = one_line(error, remote=bool(prepared.get("remote")))
            print(
                f"{prog}: failed: {cause} (PIDGATE_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
        return 1
    finally:
        progress.close()
        if events is not None:
            events.cleanup()


def _start_spark(
    args: argparse.Namespace, prepared: dict[str, Any], progress: Any, owned: bool
) -> Any:
    """The session for this job; on a cluster, with its executors checked."""
    remote = prepared.get("remote")
    if remote:
        from pidgate.pipeline.spark.session import remote_session

        if owned:
            progress.stage(
                f"pidgate analyze {args.job}: connecting to Spark Connect ({remote}) ..."
            )
        spark = remote_session(remote, app_name=f"pidgate-{args.job}", conf=dict(args.conf))
        progress.watch(spark)
        return spark
    from pidgate.pipeline.spark.masters import is_local
    from pidgate.pipeline.spark.session import ClusterOptions, effective_master, spark_session

    options = ClusterOptions(
        conf=dict(args.conf),
        driver_host=args.driver_host,
        ship=args.ship,
        executor_python=args.executor_python,
    )
    master = effective_master(args.master, options.conf)
    if owned:
        named = master or "the master spark-submit chose"
        progress.stage(f"pidgate analyze {args.job}: starting Spark ({named}) ...")
    spark = spark_session(args.master, app_name=f"pidgate-{args.job}", options=options)
    progress.watch(spark)
    if owned and master and not is_local(master):
        from pidgate.pipeline.spark.executors import check_executors

        progress.stage("checking the executors (Python, packages, local paths) ...")
        try:
            hosts = check_executors(
                spark,
                master,
                prepared["local_paths"],
                shipped=args.ship,
                through_arrow=not JOBS[args.job].rdd_tasks,
            )
        except BaseException:
            from pidgate.pipeline.spark.session import stop_session

            stop_session()
            raise
        progress.stage(f"executors ready on {', '.join(hosts)}")
    return spark


def _check_written(spark: Any, args: argparse.Namespace, report: Any) -> None:
    """Raise JobError when a job's local output holds no data files (executors that wrote
    elsewhere)."""
    from pidgate.pipeline.reading.inputs import is_local_path
    from pidgate.pipeline.spark.errors import JobError

    output = output_dir(args)
    if not is_local_path(output):
        return
    directory = Path(str(report)).parent
    for table in sorted(directory.glob("*.parquet")):
        if not any(p.name.startswith("part-") for p in table.iterdir()):
            raise JobError(
                f"--output {output}: {table.name} holds no data files, only what the driver "
                "wrote: the executors wrote to a filesystem it does not see; use storage every "
                "worker shares at the same path, or a Hadoop URI (hdfs://, s3a://)"
            )


def _run_job(args: argparse.Namespace, prepared: dict[str, Any], progress: Any) -> int:
    if "pyspark" not in sys.modules:
        # Importing PySpark and starting its JVM take seconds: say so before, not after.
        progress.stage(f"pidgate analyze {args.job}: loading PySpark ...")
    from pyspark.sql import SparkSession

    from pidgate.pipeline.spark.driver_jvm import cache_dir as driver_jvm_cache
    from pidgate.pipeline.spark.driver_jvm import recording_pending
    from pidgate.pipeline.spark.session import stop_session

    # A session that already exists (a notebook, a test) is used and left running.
    owned = SparkSession.getActiveSession() is None
    spark = _start_spark(args, prepared, progress, owned)
    try:
        report = JOBS[args.job].run(spark, args, prepared, progress)
        if report is None:
            return 0
        _check_written(spark, args, report)
        progress.stage("done")
        for line in progress.summary:
            print(line)
        print(f"report: {report}")
        return 0
    finally:
        if owned and recording_pending():
            progress.stage(
                "saving the classes Spark loaded, so that later runs start faster "
                f"(once, 15-20 s; ~190 MB in {driver_jvm_cache()}) ..."
            )
        progress.close()
        if owned:
            stop_session()


#: ``pidgate analyze`` as a row of the ``pidgate`` command table, its jobs as its subcommands.
ANALYZE_COMMAND: Command[Callable[[argparse.Namespace], int]] = Command(
    "analyze",
    "Spark jobs over the PID event log and broker log directories",
    description="Analyse PID activity, backtest a quota, size producer state, repair "
    "producer snapshots. Runs on embedded Spark (local[*]) unless --master says otherwise.",
    handler=run_analyze,
    subcommands=JOB_COMMANDS,
    subcommand_dest="job",
)


def add_analyze_parser(subparsers: Any) -> None:
    """Add ``analyze`` and its jobs to the ``pidgate`` subcommands (an argparse
    ``_SubParsersAction``)."""
    add_commands(subparsers, (ANALYZE_COMMAND,))
