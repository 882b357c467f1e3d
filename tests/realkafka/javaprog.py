"""Running the tier's Java test programs (``java/*.java``) with system properties.

Owns ``run_java``/``java_program``: ``java.py``'s command (compiled once per distribution) plus
``-D`` properties for the program.
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
