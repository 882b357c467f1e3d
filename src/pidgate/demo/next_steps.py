"""What to type next, exactly as it runs in the user's shell: the demo's closing "Next steps" and
``pidgate test-broker``'s ``pidgate serve`` line.

The quick start (``./scripts/demo``) installs pidgate into ``.venv/`` without activating it (a
script cannot change its caller's PATH), so a bare ``pidgate`` would not be found there. Every
command printed here names pidgate the way the user's shell finds this same installation:
``pidgate`` when their PATH does, else its path (``.venv/bin/pidgate`` from the clone's root).

Owns: ``pidgate_command``, ``analyze_install_hint``, ``demo_next_steps`` and
``serve_lines``. Reads the environment only through parameters' defaults; starts nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

from pidgate.demo.plan import WINDOW_SECONDS

#: What ``pidgate analyze`` needs beyond the proxy (the ``analyze`` extra).
ANALYZE_MODULES = ("pyspark", "pandas", "pyarrow", "matplotlib")
#: ``pidgate test-broker``'s port unless ``--port`` says otherwise.
TEST_BROKER_PORT = 19092
#: ``pidgate serve``'s defaults (README "Configuration"), which the printed lines rely on.
SERVE_LISTEN = "127.0.0.1:9092"
SERVE_HTTP = "127.0.0.1:9404"


def _shown(path: Path, cwd: Path) -> str:
    """``path`` relative to ``cwd`` when below it (``.venv/bin/pidgate``), else absolute."""
    try:
        return shlex.quote(str(path.relative_to(cwd)))
    except ValueError:
        return shlex.quote(str(path))


def pidgate_command(
    argv0: str | None = None,
    executable: str | None = None,
    path_env: str | None = None,
    cwd: Path | None = None,
) -> str:
    """How to type the pidgate that runs now, in the shell it was started from: ``pidgate`` if
    that shell's PATH finds this very script, else the script's path; ``<python> -m pidgate``
    when there is no script (started as ``python -m pidgate`` outside a venv)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    path_env = os.environ.get("PATH", "") if path_env is None else path_env
    cwd = Path.cwd() if cwd is None else cwd
    if Path(argv0).name == "pidgate" and Path(argv0).is_file():
        script = Path(os.path.abspath(argv0))
    else:  # python -m pidgate: the venv's own script, if it has one
        script = Path(os.path.abspath(executable)).parent / "pidgate"
        if not script.is_file():
            return f"{shlex.quote(executable)} -m pidgate"
    found = shutil.which("pidgate", path=path_env)
    if found is not None and os.path.samefile(found, script):
        return "pidgate"
    return _shown(script, cwd)


def analyze_install_hint(executable: str | None = None, cwd: Path | None = None) -> str | None:
    """None when ``pidgate analyze`` can run here; else the command that installs its extra
    into this same environment (from the source tree pidgate runs from, when it has one:
    ``.venv/bin/python -m pip install -e '.[analyze]'`` in a clone after ``./scripts/demo``)."""
    if all(importlib.util.find_spec(name) is not None for name in ANALYZE_MODULES):
        return None
    cwd = Path.cwd() if cwd is None else cwd
    python = _shown(
        Path(os.path.abspath(sys.executable if executable is None else executable)), cwd
    )
    tree = Path(__file__).resolve().parents[3]
    if (tree / "pyproject.toml").is_file():  # an editable install of a clone: ./scripts/demo
        where = "." if tree == cwd.resolve() else str(tree)
        return f"{python} -m pip install -e {shlex.quote(where + '[analyze]')}"
    return f"{python} -m pip install 'pidgate[analyze]'"


def demo_next_steps(
    pidgate: str, event_dir: Path, report_dir: Path, install_analyze: str | None = None
) -> list[str]:
    """The demo's last lines: analyse this run's event log, open the report, try pidgate by
    hand against a test broker. Each command is shown as it runs in the user's shell."""
    analyze = (
        f"{pidgate} analyze activity --events {shlex.quote(str(event_dir))} "
        f"--output {shlex.quote(str(report_dir))} --window-seconds {WINDOW_SECONDS}"
    )
    lines = [
        "",
        "Next steps (each command runs as shown, in this shell):",
        "  1. Analyse this run's PID event log (Spark, needs Java 17; a minute or two):",
    ]
    if install_analyze is not None:
        lines += [
            "     first install the analyze extra (PySpark; ./scripts/test does it too):",
            f"       {install_analyze}",
        ]
    lines += [
        f"       {analyze}",
        f"  2. Open the report it writes in a browser: {(report_dir / 'report.html').as_uri()}",
        "  3. Try pidgate by hand: start a test broker (the demo's tansu; Ctrl-C stops it).",
        "     It prints the `pidgate serve` line to run in a second terminal:",
        f"       {pidgate} test-broker",
    ]
    return lines


def serve_lines(pidgate: str, bootstrap: str) -> list[str]:
    """What ``pidgate test-broker`` suggests: pidgate in front of ``bootstrap`` with a small
    quota, then a client and the admin endpoints through it."""
    return [
        "In a second terminal, put pidgate in front of it (5 new producer IDs per minute for",
        "PLAINTEXT clients, i.e. User:ANONYMOUS):",
        f"  {pidgate} serve --upstream {bootstrap} --producer-ids-rate ANONYMOUS=5 "
        "--quota-window-seconds 60",
        f"Clients then bootstrap from pidgate at {SERVE_LISTEN}; for instance:",
        f"  {pidgate} quotas describe --bootstrap-server {SERVE_LISTEN}",
        f"  curl -s http://{SERVE_HTTP}/state     # and /metrics, /readyz",
        "  with Kafka's tools, if installed (each run is a new producer ID, charged to the quota):",
        f"  echo hello | kafka-console-producer.sh --bootstrap-server {SERVE_LISTEN} --topic try",
    ]
