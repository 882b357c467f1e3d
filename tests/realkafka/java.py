"""Java test programs compiled against a Kafka distribution's own client jars (``libs/*``):
the Java producer and AdminClient exactly as that Kafka release ships them.

Owns: ``compile_java`` (javac once per source and distribution, into a cache folder) and
``java_command`` (the command line that runs a compiled class).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

#: Java sources of the tier's test programs.
JAVA_SOURCES = Path(__file__).parent / "java"


def _cache_dir() -> Path:
    return Path(tempfile.gettempdir()) / "pidgate-java-classes"


def compile_java(home: Path, source: str) -> Path:
    """Compile ``java/<source>`` against ``home/libs/*``; the classes folder (cached by the
    source's and the distribution's identity, so a session compiles each once)."""
    if shutil.which("javac") is None:
        raise RuntimeError("javac not found: the real-Kafka tier needs a JDK (17)")
    path = JAVA_SOURCES / source
    key = hashlib.sha256(path.read_bytes() + str(home).encode()).hexdigest()[:16]
    out = _cache_dir() / f"{path.stem}-{key}"
    if not (out / f"{path.stem}.class").exists():
        staging = Path(tempfile.mkdtemp(prefix=f"{path.stem}-", dir=_ensure(_cache_dir())))
        subprocess.run(
            ["javac", "-nowarn", "-cp", f"{home / 'libs'}/*", "-d", str(staging), str(path)],
            check=True,
            capture_output=True,
            timeout=180,
        )
        staging.replace(out) if not out.exists() else shutil.rmtree(staging)
    return out


def _ensure(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def java_command(home: Path, classes: Path, main_class: str, *args: str) -> list[str]:
    """``java`` running ``main_class`` from ``classes`` with the distribution's jars."""
    # Kafka 4 logs through log4j2 (tools-log4j2.yaml), 3.x through log4j 1.
    log4j2 = home / "config" / "tools-log4j2.yaml"
    logging = (
        f"-Dlog4j2.configurationFile={log4j2}"
        if log4j2.exists()
        else f"-Dlog4j.configuration=file:{home / 'config' / 'tools-log4j.properties'}"
    )
    return [
        "java",
        "-Xmx256m",
        logging,
        "-cp",
        f"{classes}:{home / 'libs'}/*",
        main_class,
        *args,
    ]
