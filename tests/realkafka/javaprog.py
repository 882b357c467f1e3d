"""Running the tier's Java test programs (``java/*.java``) and reading their output.

Owns ``run_java``/``java_program``: ``java.py``'s command plus the log configuration each Kafka
release reads (log4j 1 properties up to 3.x, log4j2 YAML from 4.0, where the log4j 1 property
alone makes log4j2 print a configuration error on stdout), and any ``-D`` properties.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from tests.realkafka.java import compile_java, java_command


def java_program(
    home: Path, source: str, *args: str, properties: Mapping[str, str] | None = None
) -> list[str]:
    """The command line running ``java/<source>`` (compiled against ``home/libs``), with
    ``properties`` as ``-D`` system properties."""
    main_class = Path(source).stem
    command = java_command(home, compile_java(home, source), main_class, *args)
    extra = [f"-D{key}={value}" for key, value in (properties or {}).items()]
    log4j2 = home / "config" / "tools-log4j2.yaml"
    if log4j2.exists():
        extra.append(f"-Dlog4j2.configurationFile={log4j2}")
    return [command[0], *extra, *command[1:]]


def run_java(
    home: Path,
    source: str,
    *args: str,
    properties: Mapping[str, str] | None = None,
    timeout_s: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run a Java test program to its end; its output (never raises on a non-zero exit)."""
    return subprocess.run(
        java_program(home, source, *args, properties=properties),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
