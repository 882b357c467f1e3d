"""The jobs of ``pidgate analyze`` as rows of the command table: each job's flags, its checks
before Spark starts (a missing path, a bad quota config or an empty period raises
``InputError``: one line on stderr, exit code 2) and its run on Spark.

Owns: :data:`JOB_COMMANDS` (name, help, flags, handler), the flags several jobs share (the
period, ``--output``, ``--expiration-ms``, the Spark group), :func:`prepare` and
:func:`output_dir`. Job modules (``pidgate.pipeline.jobs``) are imported only when their job
runs. Must not import: ``pidgate.pipeline.cli`` (its driver imports this), pyspark at module
level.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from pidgate.config.command_table import Command, Group, option

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
            "--remote",
            "a Spark Connect server instead of a master (activity and backtest only); "
            "default SPARK_REMOTE when --master is not given",
            metavar="sc://HOST:PORT",
        ),
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


def output_dir(args: argparse.Namespace) -> str:
    """The job's ``--output``, else ``./pidgate-reports/<job>/``."""
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
    output = output_dir(args)
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

    _check_output(output_dir(args))
    return {**prepared, "events": event_files(args.events)}


def _prepare_footprint(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.pipeline.reading.inputs import check_local_dirs

    check_local_dirs(list(args.log_dirs), "--log-dirs")
    _check_expiration(args.expiration_ms)
    _check_output(output_dir(args))
    return {}


def _prepare_snapshots(args: argparse.Namespace) -> dict[str, Any]:
    from pidgate.pipeline.reading.inputs import check_local_dirs

    check_local_dirs([args.log_dir], "--log-dir")
    _check_expiration(args.expiration_ms)
    return {}


def _remote(args: argparse.Namespace) -> str | None:
    """The Spark Connect server of this run (``--remote``, else ``SPARK_REMOTE`` unless
    ``--master`` is given); raises InputError for flags it excludes and jobs it cannot run."""
    from pidgate.pipeline.reading.inputs import InputError

    remote: str | None = args.remote
    from_env = os.environ.get("SPARK_REMOTE") or None
    if args.master and remote:
        raise InputError(
            f"--master {args.master} and --remote {remote} exclude each other: a Spark Connect "
            "server runs on its own master"
        )
    if args.master and from_env:
        # pyspark itself would connect to SPARK_REMOTE whatever the master says.
        raise InputError(
            f"--master {args.master}: SPARK_REMOTE={from_env} is set too, and pyspark would "
            "connect there; unset SPARK_REMOTE to use --master"
        )
    remote = remote or from_env
    if remote is None:
        return None
    for flag, excluded in (
        ("--driver-host", args.driver_host),
        ("--executor-python", args.executor_python),
        ("--no-ship", not args.ship),
    ):
        if excluded:
            raise InputError(
                f"{flag} applies to --master only: the Spark Connect server {remote} runs its "
                "own executors"
            )
    refusal = JOBS[args.job].connect_refusal
    if refusal:
        raise InputError(f"cannot run on Spark Connect: {refusal}; use --master")
    return remote


def _check_remote_paths(remote: str, local_paths: list[Any]) -> None:
    """A Spark Connect server reads and writes on its own host: local paths only when that
    host is this one."""
    from pidgate.pipeline.reading.inputs import InputError
    from pidgate.pipeline.spark.masters import connect_address, is_this_host

    address = connect_address(remote)
    if not local_paths or address is None or is_this_host(address[0]):
        return
    first = local_paths[0]
    raise InputError(
        f"{first.flag} {first.path}: a local path, but the Spark Connect server {remote} is on "
        "another host and reads and writes on its side; use a Hadoop URI (hdfs://, s3a://) "
        "or run pidgate on the server's host"
    )


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Everything checkable without Spark, checked: raises InputError (one line)."""
    remote = _remote(args)
    prepared = JOBS[args.job].prepare(args)
    prepared["local_paths"] = _local_paths(args, prepared)
    prepared["remote"] = remote
    if remote:
        _check_remote_paths(remote, prepared["local_paths"])
    return prepared


def _event_job_kwargs(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> dict[str, Any]:
    """The keyword arguments both event-log jobs take, once their events are known to exist."""
    from pidgate.pipeline.reading.inputs import check_remote_exists

    check_remote_exists(spark, args.events, "--events")
    since_ms, until_ms = prepared["period"]
    return {"since_ms": since_ms, "until_ms": until_ms, "progress": progress}


def _run_activity(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.activity import run_activity

    shared = _event_job_kwargs(spark, args, prepared, progress)
    events = prepared["events"]
    return run_activity(spark, events, output_dir(args), window_s=args.window_seconds, **shared)


def _run_backtest(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.backtest import run_backtest

    shared = _event_job_kwargs(spark, args, prepared, progress)
    return run_backtest(
        spark,
        prepared["events"],
        args.quota_config,
        output_dir(args),
        per_instance=args.per_instance,
        **shared,
    )


def _run_footprint(
    spark: Any, args: argparse.Namespace, prepared: dict[str, Any], progress: Any
) -> Any:
    from pidgate.pipeline.jobs.footprint import run_footprint
    from pidgate.pipeline.reading.inputs import check_remote_exists

    for path in args.log_dirs:
        check_remote_exists(spark, path, "--log-dirs")
    progress.stage(f"reading segments under {' '.join(args.log_dirs)} ...")
    return run_footprint(spark, list(args.log_dirs), args.expiration_ms, output_dir(args))


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


class Job(NamedTuple):
    """What runs one job: its checks before Spark starts (raising InputError; the values they
    found, for ``run``), then the job on Spark (its report's path, or None when it printed its
    own result); why it cannot run on Spark Connect (None: it can); whether its Python tasks
    are RDD ones (else DataFrame ones: ``mapInArrow``, pandas UDFs), which the executor check
    runs its probe as, so that the job reuses the probe's Python workers."""

    prepare: Callable[[argparse.Namespace], dict[str, Any]]
    run: Callable[[Any, argparse.Namespace, dict[str, Any], Any], Any]
    connect_refusal: str | None = None
    rdd_tasks: bool = False


# Spark Connect has no SparkContext: no RDDs, parallelize or mapPartitions.
_RDD_SEGMENTS = "it reads segment files with the RDD API"


JOB_COMMANDS: tuple[Command[Job], ...] = (
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
        handler=Job(_prepare_activity, _run_activity),
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
        handler=Job(_prepare_backtest, _run_backtest),
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
        handler=Job(_prepare_footprint, _run_footprint, _RDD_SEGMENTS, rdd_tasks=True),
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
        handler=Job(_prepare_snapshots, _run_snapshots, _RDD_SEGMENTS, rdd_tasks=True),
    ),
)
#: What runs each job, by name.
JOBS = {command.name: command.handler for command in JOB_COMMANDS if command.handler}
