"""``pidgate analyze <job>``: the command-line entry of every pipeline job.

``pidgate.cli`` wires this in with :func:`add_analyze_parser` and :func:`run_analyze`:

* ``activity --events PATH [--since WHEN] [--until WHEN] [--output DIR] [--master URL]``
* ``backtest --events PATH --quota-config FILE [--per-instance] [--since WHEN] [--until WHEN]
  [--output DIR] [--master URL]``
* ``footprint --log-dirs PATH... [--expiration-ms N] [--output DIR] [--master URL]``
* ``snapshots --log-dir PATH [--expiration-ms N] [--dry-run] [--master URL]``

Paths may be local or any Hadoop filesystem URI; ``--output`` defaults to
``./pidgate-reports/<job>/``. ``--master`` defaults to ``local[*]`` (or the master spark-submit
chose); every job also takes ``--conf KEY=VALUE`` (repeatable, wins), ``--driver-host``,
``--executor-python`` and ``--no-ship`` for clusters (:mod:`pidgate.pipeline.spark.session`). On a
cluster the executors are checked before the job (:mod:`pidgate.pipeline.spark.executors`), and
after it a local output without data files is an error (footprint itself refuses to report
when it read no batch).
Job modules are imported only when their job runs.

Inputs are checked before Spark starts (:mod:`pidgate.pipeline.reading.inputs`): a missing path, a
bad
quota config or an empty period is one line on stderr and exit code 2. While Spark runs, stage
lines and task progress go to stderr (:mod:`pidgate.pipeline.spark.progress`); at the end a short
summary and the report's path go to stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidgate.config.command_table import Command, Group, add_commands, option

__all__ = ["ANALYZE_COMMAND", "DEFAULT_EXPIRATION_MS", "add_analyze_parser", "run_analyze"]

#: Kafka's producer.id.expiration.ms default (KIP-854): one day.
DEFAULT_EXPIRATION_MS = 86_400_000


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key.strip(), value


_EVENTS = option("--events", "event log file, directory or glob", required=True, metavar="PATH")
_PERIOD = (
    option(
        "--since",
        "only events at or after WHEN (UTC date or time, e.g. 2026-11-23 or "
        "2026-11-23T14:00Z); default: from the first event",
        metavar="WHEN",
    ),
    option("--until", "only events before WHEN (UTC); default: to the last event", metavar="WHEN"),
)
_EXPIRATION = option(
    "--expiration-ms",
    "producer.id.expiration.ms (default 86400000, one day)",
    type=int,
    default=DEFAULT_EXPIRATION_MS,
    metavar="N",
)
_OUTPUT = option(
    "--output",
    "directory (or Hadoop URI) for Parquet and report.html; default ./pidgate-reports/<job>/",
    metavar="DIR",
)
_SPARK = Group(
    "Spark",
    (
        option("--master", "Spark master; default local[*] or spark-submit's", metavar="URL"),
        option(
            "--conf",
            "a Spark setting, repeatable, winning over pidgate's own; default: none",
            action="append",
            default=[],
            type=_conf_pair,
            metavar="KEY=VALUE",
        ),
        option(
            "--driver-host",
            "address the executors connect back to; default: the local address that routes "
            "to the master's host",
            metavar="ADDRESS",
        ),
        option(
            "--executor-python",
            "the executors' Python on a cluster; default PYSPARK_PYTHON or python3",
            metavar="PATH",
        ),
        option(
            "--no-ship",
            "do not ship pidgate and its packages to a cluster's executors (they have them); "
            "default: shipped for non-local masters",
            dest="ship",
            action="store_false",
        ),
    ),
)


def _output(args: argparse.Namespace) -> str:
    output: str | None = getattr(args, "output", None)
    return output or f"./pidgate-reports/{args.job}/"


def _check_output(output: str) -> None:
    from pidgate.pipeline.reading.inputs import InputError, is_local_path

    if is_local_path(output):
        target = Path(output.removeprefix("file://").removeprefix("file:")).expanduser()
        if target.exists() and not target.is_dir():
            raise InputError(f"--output {output}: exists and is not a directory")
        parent = next((p for p in [target, *target.parents] if p.exists()), None)
        if parent is not None and not os.access(parent, os.W_OK):
            raise InputError(f"--output {output}: {parent} is not writable")


def _check_expiration(expiration_ms: int) -> None:
    from pidgate.pipeline.reading.inputs import InputError

    if expiration_ms <= 0:
        raise InputError(f"--expiration-ms {expiration_ms}: must be a positive number of ms")


def _local_paths(args: argparse.Namespace, prepared: dict[str, Any]) -> list[Any]:
    """The local paths of this job, for the executors to prove they share them."""
    from pidgate.pipeline.reading.inputs import InputError, is_local_path
    from pidgate.pipeline.spark.executors import LocalPath, sample_files

    job: str = args.job
    checks = []
    events = prepared.get("events")
    if events is not None and events.local:
        checks.append(LocalPath("--events", args.events, sample_files(events.paths)))
    for flag, paths in (
        ("--log-dirs", getattr(args, "log_dirs", None) or []),
        ("--log-dir", [args.log_dir] if job == "snapshots" else []),
    ):
        for path in paths:
            if is_local_path(path):
                files = sample_files([path])
                if not files:
                    raise InputError(f"{flag} {path}: no files there (nothing to read)")
                checks.append(LocalPath(flag, path, files))
    output = _output(args)
    if job != "snapshots" and is_local_path(output):
        local = Path(output.removeprefix("file://").removeprefix("file:")).expanduser()
        checks.append(LocalPath("--output", str(local.absolute()), output=True))
    return checks


def _prepare_activity(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.pipeline.reading.inputs import InputError, check_period

    period = check_period(args.since, args.until)
    if args.window_seconds <= 0:
        raise InputError(f"--window-seconds {args.window_seconds}: must be a positive number")
    return _prepare_events(args, {"period": period})


def _prepare_backtest(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.config import ConfigError
    from pidgate.pipeline.jobs.backtest import load_policy
    from pidgate.pipeline.reading.inputs import InputError, check_period

    period = check_period(args.since, args.until)
    config = Path(args.quota_config)
    if not config.is_file():
        raise InputError(f"--quota-config {config}: no such file")
    try:
        policy = load_policy(config)
    except (ConfigError, OSError, ValueError) as error:
        reason = " ".join(str(error).split())
        raise InputError(f"--quota-config {config}: {reason}") from None
    return _prepare_events(args, {"period": period, "policy": policy})


def _prepare_events(args: argparse.Namespace, prepared: dict[str, Any]) -> dict[str, Any]:
    """The event-log jobs' last checks: the output, then the event files (the period and the
    job's own flags were checked first)."""
    from pidgate.pipeline.reading.inputs import event_files

    _check_output(_output(args))
    return {**prepared, "events": event_files(args.events)}


def _prepare_footprint(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.pipeline.reading.inputs import check_local_dirs

    check_local_dirs(list(args.log_dirs), "--log-dirs")
    _check_expiration(args.expiration_ms)
    _check_output(_output(args))
    return {}


def _prepare_snapshots(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.pipeline.reading.inputs import check_local_dirs

    check_local_dirs([args.log_dir], "--log-dir")
    _check_expiration(args.expiration_ms)
    return {}


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Everything checkable without Spark, checked: raises InputError (one line)."""
    prepared = _JOBS[args.job].prepare(args)
    prepared["local_paths"] = _local_paths(args, prepared)
    return prepared


def run_analyze(args: argparse.Namespace) -> int:
    """Run the job ``args.job`` with the parsed arguments; the process exit code: 0 done,
    2 bad input (one line on stderr, found before Spark starts where possible), 1 the job
    failed (its reason in one line; ``PIDGATE_DEBUG=1`` shows the traceback)."""
    from pidgate.pipeline.reading.inputs import InputError

    job: str = args.job
    prog = f"pidgate analyze {job}"
    try:
        prepared = _prepare(args)
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
            print(
                f"{prog}: failed: {one_line(error)} (PIDGATE_DEBUG=1 shows the traceback)",
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
            hosts = check_executors(spark, master, prepared["local_paths"], shipped=args.ship)
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

    output = _output(args)
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


def _run_activity(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.activity import run_activity
    from pidgate.pipeline.reading.inputs import check_remote_exists

    check_remote_exists(spark, args.events, "--events")
    since_ms, until_ms = prepared["period"]
    return run_activity(
        spark,
        prepared["events"],
        _output(args),
        since_ms=since_ms,
        until_ms=until_ms,
        window_s=args.window_seconds,
        progress=progress,
    )


def _run_backtest(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.backtest import run_backtest
    from pidgate.pipeline.reading.inputs import check_remote_exists

    check_remote_exists(spark, args.events, "--events")
    since_ms, until_ms = prepared["period"]
    return run_backtest(
        spark,
        prepared["events"],
        args.quota_config,
        _output(args),
        per_instance=args.per_instance,
        since_ms=since_ms,
        until_ms=until_ms,
        progress=progress,
    )


def _run_footprint(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.footprint import run_footprint
    from pidgate.pipeline.reading.inputs import check_remote_exists

    for path in args.log_dirs:
        check_remote_exists(spark, path, "--log-dirs")
    progress.stage(f"reading segments under {' '.join(args.log_dirs)} ...")
    return run_footprint(spark, list(args.log_dirs), args.expiration_ms, _output(args))


def _run_snapshots(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    """Writes no report: prints what it wrote and returns None."""
    from pidgate.pipeline.jobs.snapshots import run_snapshots
    from pidgate.pipeline.reading.inputs import check_remote_exists

    check_remote_exists(spark, args.log_dir, "--log-dir")
    progress.stage(f"replaying segments under {args.log_dir} ...")
    count = run_snapshots(spark, args.log_dir, args.expiration_ms, args.dry_run)
    verb = "would write" if args.dry_run else "wrote"
    progress.stage("done")
    print(f"{verb} {count} producer snapshot(s) under {args.log_dir}")
    return None


def _run_job(args: argparse.Namespace, prepared: dict[str, Any], progress: Any) -> int:
    if "pyspark" not in sys.modules:
        # Importing PySpark and starting its JVM take seconds: say so before, not after.
        progress.stage(f"pidgate analyze {args.job}: loading PySpark ...")
    from pyspark.sql import SparkSession

    from pidgate.pipeline.spark.session import stop_session

    # A session that already exists (a notebook, a test) is used and left running.
    owned = SparkSession.getActiveSession() is None
    spark = _start_spark(args, prepared, progress, owned)
    try:
        report = _JOBS[args.job].run(spark, args, prepared, progress)
        if report is None:
            return 0
        _check_written(spark, args, report)
        progress.stage("done")
        for line in progress.summary:
            print(line)
        print(f"report: {report}")
        return 0
    finally:
        progress.close()
        if owned:
            stop_session()


@dataclass(frozen=True)
class _Job:
    """What runs one job: its checks before Spark starts (raising InputError; the values they
    found, for ``run``), then the job on Spark (its report's path, or None when it printed its
    own result)."""

    prepare: Callable[[argparse.Namespace], dict[str, Any]]
    run: Callable[[Any, argparse.Namespace, dict[str, Any], Any], Any]


_JOB_COMMANDS: tuple[Command[_Job], ...] = (
    Command(
        "activity",
        "new PIDs per principal and hour, top offenders, recommended producer_ids_rate",
        arguments=(
            _EVENTS,
            option(
                "--window-seconds",
                "the quota window (quota.producer.id.quota.window.size.seconds) the recommended "
                "producer_ids_rate is for; default 3600",
                type=int,
                default=3600,
                metavar="N",
            ),
            *_PERIOD,
            _OUTPUT,
            _SPARK,
        ),
        handler=_Job(_prepare_activity, _run_activity),
    ),
    Command(
        "backtest",
        "what a candidate quota config would have throttled",
        arguments=(
            _EVENTS,
            option(
                "--quota-config",
                "pidgate YAML config whose quota section is the candidate",
                required=True,
                metavar="FILE",
            ),
            option(
                "--per-instance",
                "one quota manager per principal and pidgate instance (separate proxies), "
                "instead of one per principal",
                action="store_true",
            ),
            *_PERIOD,
            _OUTPUT,
            _SPARK,
        ),
        handler=_Job(_prepare_backtest, _run_backtest),
    ),
    Command(
        "footprint",
        "PIDs per partition and broker within producer.id.expiration.ms",
        arguments=(
            option(
                "--log-dirs", "broker log directories", required=True, nargs="+", metavar="PATH"
            ),
            _EXPIRATION,
            _OUTPUT,
            _SPARK,
        ),
        handler=_Job(_prepare_footprint, _run_footprint),
    ),
    Command(
        "snapshots",
        "rebuild missing producer snapshots",
        arguments=(
            option("--log-dir", "a log directory", required=True, metavar="PATH"),
            _EXPIRATION,
            option(
                "--dry-run", "only list the snapshots that would be written", action="store_true"
            ),
            _SPARK,
        ),
        handler=_Job(_prepare_snapshots, _run_snapshots),
    ),
)
_JOBS = {command.name: command.handler for command in _JOB_COMMANDS if command.handler}

#: ``pidgate analyze`` as a row of the ``pidgate`` command table, its jobs as its subcommands.
ANALYZE_COMMAND: Command[Callable[[argparse.Namespace], int]] = Command(
    "analyze",
    "Spark jobs over the PID event log and broker log directories",
    description="Analyse PID activity, backtest a quota, size producer state, repair "
    "producer snapshots. Runs on embedded Spark (local[*]) unless --master says otherwise.",
    handler=run_analyze,
    subcommands=_JOB_COMMANDS,
    subcommand_dest="job",
)


def add_analyze_parser(subparsers: Any) -> None:
    """Add ``analyze`` and its jobs to the ``pidgate`` subcommands (an argparse
    ``_SubParsersAction``)."""
    add_commands(subparsers, (ANALYZE_COMMAND,))
