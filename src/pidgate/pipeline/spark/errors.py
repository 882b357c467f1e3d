"""One line for a failed job that names the root cause, dug out of what Spark raises.

A Python error on an executor reaches the driver as ``PythonException: An exception was thrown
from the Python worker`` (SQL) or a ``Py4JJavaError`` whose text is pages of Java frames with
the Python traceback somewhere inside; a JVM that could not start is
``PySparkRuntimeError: [JAVA_GATEWAY_EXITED]``. :func:`root_cause` finds the line that says
what went wrong (the last ``SomethingError: ...`` of a Python traceback, else the first Java
exception's message) and :func:`hint` the next step for the causes we know.

Must not import pyspark: it works on the exception's text.
"""

from __future__ import annotations

import re

__all__ = ["JobError", "hint", "one_line", "root_cause"]

# "ModuleNotFoundError: No module named 'pandas'" — a Python exception line as a traceback ends.
_PYTHON_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.+)$")
_JAVA_ERROR = re.compile(r"^\s*(?:Caused by: )?((?:[a-z]\w*\.)+[A-Z]\w*(?:Exception|Error)): (.+)$")
_GENERIC = ("PythonException", "Py4JJavaError", "An error occurred while calling")
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


class JobError(RuntimeError):
    """A job ran but its result cannot be trusted (nothing read, output lost): one line."""


def root_cause(text: str) -> str | None:
    """The most telling ``Type: message`` line in ``text``, or None."""
    python = [m for m in map(_PYTHON_ERROR.match, text.splitlines()) if m]
    python = [
        m for m in python if not m.group(1).endswith(_GENERIC) and "Traceback" not in m.group(2)
    ]
    if python:
        return f"{python[-1].group(1).rsplit('.', 1)[-1]}: {python[-1].group(2).strip()}"
    java = [m for m in map(_JAVA_ERROR.match, text.splitlines()) if m]
    if java:
        # The deepest "Caused by" is the root; Java prints it last.
        name, message = java[-1].group(1), java[-1].group(2).strip()
        return f"{name.rsplit('.', 1)[-1]}: {message}"
    return None


def hint(cause: str, remote: bool = False) -> str | None:
    """The next step for a cause we recognise; ``remote``: the job ran on a Spark Connect
    server, whose Python workers pidgate does not ship to."""
    missing = _MISSING_MODULE.search(cause)
    if missing and remote:
        return (
            f"the Spark Connect server's Python lacks {missing.group(1)}: install "
            "pidgate[analyze] where the server's Python workers run (the server's PYSPARK_PYTHON)"
        )
    if missing:
        return (
            f"the executors' Python lacks {missing.group(1)}: install pidgate[analyze] on the "
            "workers, or ship an environment that has it (pidgate ships its own packages "
            "unless --no-ship)"
        )
    if "JAVA_GATEWAY_EXITED" in cause:
        return "Spark's JVM did not start: check Java 17 (java -version) and the lines above"
    return None


def one_line(error: BaseException, limit: int = 300, *, remote: bool = False) -> str:
    """``Type: message`` of the root cause of ``error``, plus a hint when one is known."""
    text = str(error)
    cause = root_cause(text)
    if cause is None:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        cause = f"{type(error).__name__}: {first}" if first else type(error).__name__
    cause = cause[:limit]
    step = hint(cause, remote) or hint(text, remote)
    return f"{cause} ({step})" if step else cause
