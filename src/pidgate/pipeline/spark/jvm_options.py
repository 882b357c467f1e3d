"""The JVM options pidgate adds to a session's ``spark.*.defaultJavaOptions``, and how they
meet an administrator's.

Executors of a non-local master run only the C1 compiler (``-XX:TieredStopAtLevel=1``), as the
driver does (:mod:`~pidgate.pipeline.spark.driver_jvm`). In standalone mode (and on YARN and
Kubernetes) an application's executors live as long as the application, seconds to minutes
for ``pidgate analyze``; the C2 compiler's work pays off later than that and competes with
the tasks for the same cores. Measured on the 2-core VM: the activity job over 10M events in
a local JVM (which runs the tasks) took 36.1-36.5 s with C1 only and 42.0-44.0 s with C2, the
class archive mapped in both; on the namespace cluster the job's time fell from 26.5 to 22.3 s
(README, "On a cluster").

``spark.*.defaultJavaOptions`` is where Spark expects an administrator's options, usually in
``spark-defaults.conf``. A value pidgate sets replaces the file's (the launcher gives
``--conf`` precedence), so pidgate puts its options *before* the file's value, which the JVM
reads last and so wins on any option both name. A user's ``--conf`` for the key replaces both,
as every ``--conf`` wins. Must not import a job or ``outputs``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "C1_ONLY",
    "DRIVER_DEFAULT_JAVA_OPTIONS",
    "EXECUTOR_DEFAULT_JAVA_OPTIONS",
    "before_administrators",
    "launcher_defaults",
]

C1_ONLY = "-XX:TieredStopAtLevel=1"
#: Spark puts these before the matching ``spark.*.extraJavaOptions``.
DRIVER_DEFAULT_JAVA_OPTIONS = "spark.driver.defaultJavaOptions"
EXECUTOR_DEFAULT_JAVA_OPTIONS = "spark.executor.defaultJavaOptions"
# A java.util.Properties line: key, then '=', ':' or white space, then the value.
_PROPERTY = re.compile(r"^\s*([^\s=:]+)\s*[=:\s]\s*(.*?)\s*$")


def _spark_home(environ: Mapping[str, str]) -> Path | None:
    if environ.get("SPARK_HOME"):
        return Path(environ["SPARK_HOME"])
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).parent


def launcher_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``spark-defaults.conf`` the launcher reads for a session pidgate starts:
    ``$SPARK_CONF_DIR``'s, else ``$SPARK_HOME/conf``'s (pyspark's own folder when unset);
    empty when there is none or it cannot be read. Continued lines (a trailing backslash) and
    escapes, rare in this file, are not interpreted."""
    environ = os.environ if environ is None else environ
    conf_dir = environ.get("SPARK_CONF_DIR")
    home = _spark_home(environ)
    folder = Path(conf_dir) if conf_dir else (home / "conf" if home else None)
    if folder is None:
        return {}
    try:
        text = (folder / "spark-defaults.conf").read_text(errors="replace")
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        if line.lstrip().startswith(("#", "!")):
            continue
        match = _PROPERTY.match(line)
        if match:
            values[match.group(1)] = match.group(2)
    return values


def before_administrators(ours: str, key: str, defaults: Mapping[str, str]) -> str:
    """``ours`` followed by ``spark-defaults.conf``'s value of ``key`` (module doc)."""
    theirs = defaults.get(key, "").strip()
    return f"{ours} {theirs}" if theirs else ours
