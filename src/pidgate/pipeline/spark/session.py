"""The one place pipeline jobs get a SparkSession from.

``local[*]`` by default (embedded Spark, nothing to set up); any cluster through ``master`` or
spark-submit. Settings by kind of master:

* local masters: loopback bind address (``SPARK_LOCAL_IP``), 4 shuffle partitions instead of
  200 (DESIGN.md perf notes), and Python workers run this interpreter, their daemon
  :mod:`pidgate.pipeline.spark.python_daemon` (pyspark from its package, not its zip).
* other masters (:class:`ClusterOptions`): the master is checked first
  (:func:`pidgate.pipeline.spark.masters.check_master`); the driver advertises and binds an address
  the workers can reach (``--driver-host``, default: the local address that routes to a
  standalone master); executors run ``python3`` (or ``PYSPARK_PYTHON`` /
  ``spark.pyspark.python`` / ``--executor-python``) with pidgate and its dependencies shipped
  as an archive (:mod:`pidgate.pipeline.spark.shipping`) unless ``ship`` is off.
* always: no UI, Arrow transfer, UTC session time zone; a driver JVM pidgate starts itself
  gets the start-up options of :mod:`pidgate.pipeline.spark.driver_jvm` (C1 only, class-data
  sharing), and its executors on a non-local master C1 only
  (:mod:`pidgate.pipeline.spark.jvm_options`), each before an administrator's options from
  ``spark-defaults.conf``; then the user's ``conf``, which wins over everything above.

Under spark-submit (or the pyspark shell) the launcher's choices are kept and none of the
cluster settings are applied.

A Spark Connect server (:func:`remote_session`, ``--remote sc://HOST:PORT``) is checked first
(:func:`pidgate.pipeline.spark.masters.check_remote`) and gets only the UTC session time zone,
then the user's ``conf``: the server's own settings (master, bind address, Python) are its own.

Must not import a job or ``outputs``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from pidgate.pipeline.reading.inputs import InputError
from pidgate.pipeline.spark.driver_jvm import (
    driver_java_options,
    finish_recording,
    start_recording,
)
from pidgate.pipeline.spark.jvm_options import (
    C1_ONLY,
    DRIVER_DEFAULT_JAVA_OPTIONS,
    EXECUTOR_DEFAULT_JAVA_OPTIONS,
    before_administrators,
    launcher_defaults,
)
from pidgate.pipeline.spark.masters import (
    bindable,
    check_master,
    check_remote,
    driver_host_for,
    is_local,
    is_loopback,
)

__all__ = [
    "ClusterOptions",
    "effective_master",
    "remote_session",
    "spark_session",
    "stop_session",
]

_LOCAL_SHUFFLE_PARTITIONS = 4
#: Local masters' Python workers import pyspark from its package, with bytecode (the module).
_LOCAL_PYTHON_DAEMON = {"spark.python.daemon.module": "pidgate.pipeline.spark.python_daemon"}
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@dataclass(frozen=True)
class ClusterOptions:
    """How to reach and equip a cluster; every field has a working default."""

    #: ``--conf key=value`` pairs; applied last, so they win over pidgate's own settings.
    conf: Mapping[str, str] = field(default_factory=dict)
    #: The address executors connect back to (``spark.driver.host``); None: derived.
    driver_host: str | None = None
    #: Ship pidgate and its dependencies to the executors (off: the workers have them).
    ship: bool = True
    #: The executors' Python; None: ``spark.pyspark.python``, ``PYSPARK_PYTHON`` or ``python3``.
    executor_python: str | None = None


def _launched() -> bool:
    # Under spark-submit (or the pyspark shell) the launcher already chose the master.
    return "PYSPARK_GATEWAY_PORT" in os.environ or "PYSPARK_SUBMIT_ARGS" in os.environ


def effective_master(master: str | None, conf: Mapping[str, str] | None = None) -> str:
    """The master a session will use: ``master``, a ``spark.master`` conf, ``local[*]``, or ""
    when spark-submit chose it."""
    chosen = master or (conf or {}).get("spark.master")
    return chosen or ("" if _launched() else "local[*]")


def _executor_python(options: ClusterOptions, local: bool) -> str:
    return (
        options.executor_python
        or options.conf.get("spark.pyspark.python")
        or os.environ.get("PYSPARK_PYTHON")
        or (sys.executable if local else "python3")
    )


def _cluster_settings(master: str, options: ClusterOptions) -> dict[str, str]:
    """What a non-local master needs from pidgate; raises InputError when it cannot work."""
    check_master(master, options.conf, os.environ)
    settings: dict[str, str] = {}
    # A loopback SPARK_LOCAL_IP (kept for local runs, e.g. exported by a test script) would
    # make the driver unreachable from every other host.
    if is_loopback(os.environ.get("SPARK_LOCAL_IP", "")):
        del os.environ["SPARK_LOCAL_IP"]
    host = options.driver_host or options.conf.get("spark.driver.host") or driver_host_for(master)
    if host:
        settings["spark.driver.host"] = host
        settings["spark.driver.bindAddress"] = host if bindable(host) else "0.0.0.0"
    if options.ship:
        from pidgate.pipeline.spark.shipping import ARCHIVE_ALIAS

        # The archive itself is added once the session runs (_ship_archive), not through
        # spark.archives: the executors' Python path is all that must be set up front.
        path = options.conf.get("spark.executorEnv.PYTHONPATH")
        settings["spark.executorEnv.PYTHONPATH"] = (
            f"{ARCHIVE_ALIAS}:{path}" if path else ARCHIVE_ALIAS
        )
    return settings


def _shipped_archive(options: ClusterOptions) -> str | None:
    """The ``path#alias`` of pidgate's executor archive (built now if not cached) when
    ``options`` ship it, else None."""
    if not options.ship:
        return None
    from pidgate.pipeline.spark.shipping import ARCHIVE_ALIAS, executor_archive

    return f"{executor_archive()}#{ARCHIVE_ALIAS}"


# The thread adding pidgate's archive in the background, joined before the session stops.
_adding_archive: threading.Thread | None = None
_ARCHIVE_REGISTERED_WAIT_S = 30.0


def _ship_archive(session: SparkSession, archive: str) -> None:
    """Add pidgate's archive for the executors, which fetch and unpack it before their first
    task; return once Spark lists it (so every task from now on gets it).

    Not through ``spark.archives``, which the driver unpacks before it asks for any executor
    (with a local master spark-submit unpacked it a second time: +14 s measured for a 120 MB
    archive). ``addArchive`` registers the archive first and then copies and unpacks the
    driver's own copy, which nothing on the driver reads: 3-4 s of a cluster run's start
    for 75 MB on the 2-core machine. So it runs on a thread while the workers launch the
    executors, and this returns as soon as the archive is registered."""
    global _adding_archive
    context = session.sparkContext
    failures: list[BaseException] = []

    def add() -> None:
        try:
            context.addArchive(archive)
        except BaseException as error:  # raised below if Spark never listed the archive
            failures.append(error)

    thread = threading.Thread(target=add, name="pidgate-add-archive", daemon=True)
    thread.start()
    _adding_archive = thread
    deadline = time.monotonic() + _ARCHIVE_REGISTERED_WAIT_S
    while not context.listArchives and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if failures and not context.listArchives:
        raise InputError(f"could not add pidgate's archive {archive} to the session: {failures[0]}")


def _wait_for_archive() -> None:
    global _adding_archive
    if _adding_archive is not None:
        _adding_archive.join(_ARCHIVE_REGISTERED_WAIT_S)
        _adding_archive = None


def spark_session(
    master: str | None = None, app_name: str = "pidgate", options: ClusterOptions | None = None
) -> SparkSession:
    """Return the active SparkSession, creating it if needed (see the module doc for what is
    set per kind of master). Raises :class:`pidgate.pipeline.reading.inputs.InputError` when a
    cluster master cannot work as configured."""
    from pyspark import SparkContext

    options = options or ClusterOptions()
    effective = effective_master(master, options.conf)
    local = bool(effective) and is_local(effective)
    existed = SparkContext._active_spark_context is not None
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
    }
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings[_SHUFFLE_PARTITIONS] = str(_LOCAL_SHUFFLE_PARTITIONS)
        settings.update(_LOCAL_PYTHON_DAEMON)
    elif effective and not existed:
        settings.update(_cluster_settings(effective, options))
    recording = None
    if SparkContext._gateway is None and not _launched():
        # A driver JVM pidgate starts now: cheap to warm up (driver_jvm); its executors on
        # other hosts run C1 only (jvm_options). An administrator's options follow ours.
        defaults = launcher_defaults()
        ours: dict[str, str] = {}
        if DRIVER_DEFAULT_JAVA_OPTIONS not in options.conf:
            ours[DRIVER_DEFAULT_JAVA_OPTIONS], recording = driver_java_options()
        if effective and not local and EXECUTOR_DEFAULT_JAVA_OPTIONS not in options.conf:
            ours[EXECUTOR_DEFAULT_JAVA_OPTIONS] = C1_ONLY
        for key, value in ours.items():
            settings[key] = before_administrators(value, key, defaults)
    settings.update(options.conf)
    builder = SparkSession.builder.appName(app_name)
    if effective:
        builder = builder.master(effective)
    for key, value in settings.items():
        builder = builder.config(key, value)
    archive = _shipped_archive(options) if effective and not local and not existed else None
    session = builder.getOrCreate()
    if recording is not None:
        start_recording(recording, SparkContext._gateway)
    if archive is not None:
        _ship_archive(session, archive)
    if not existed and effective:
        # Read by every Python function Spark ships (RDD and pandas UDFs alike); set here
        # rather than in PYSPARK_PYTHON so that one session's choice does not leak into the
        # next one in this process.
        session.sparkContext.pythonExec = _executor_python(options, local)
    if local and _SHUFFLE_PARTITIONS not in options.conf:
        session.conf.set(_SHUFFLE_PARTITIONS, str(_LOCAL_SHUFFLE_PARTITIONS))
    session.sparkContext.setLogLevel("WARN")
    return session


def remote_session(
    remote: str, app_name: str = "pidgate", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A Spark Connect session on the server ``remote`` (``sc://HOST:PORT``), checked first;
    raises :class:`InputError` when nothing answers there or the Connect client is missing.
    The user's ``conf`` is set on the session (runtime settings only: the server silently
    ignores static ones, which are its own)."""
    check_remote(remote)
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as error:  # PySparkImportError names the missing package
        reason = " ".join(str(error).split())
        raise InputError(
            f"--remote {remote}: the Spark Connect client cannot start ({reason}); install "
            "pidgate[analyze] (grpcio, grpcio-status, googleapis-common-protos, zstandard)"
        ) from None
    builder = SparkSession.builder.remote(remote).appName(app_name)
    for key, value in {"spark.sql.session.timeZone": "UTC", **(conf or {})}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def stop_session() -> None:
    """Stop the active SparkSession, if there is one; a JVM recording its classes
    (:mod:`~pidgate.pipeline.spark.driver_jvm`) ends, and its archive is saved."""
    _wait_for_archive()  # its thread calls into the session
    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    finish_recording()
