"""The driver JVM's start-up options (pipeline/spark/driver_jvm.py): C1 only, and a class-data
sharing archive recorded by the first run and mapped by every later one, checked in the JVM
itself (its arguments, and the archive in its memory map). Real JVMs in subprocesses, each
with a cache directory of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pidgate.pipeline.spark import driver_jvm
from pidgate.pipeline.spark.driver_jvm import driver_java_options
from pidgate.pipeline.spark.jvm_options import C1_ONLY

from .test_cluster import DATA, SRC

# Starts a local session the way pidgate analyze does, and reports what its JVM runs with:
# its arguments, and which .jsa files it has mapped (class-data sharing in use).
_PROBE = """
import json, sys
from pyspark import SparkContext
from pidgate.pipeline.spark.session import ClusterOptions, spark_session, stop_session
spark = spark_session("local[1]", options=ClusterOptions(conf=json.loads(sys.argv[1])))
assert spark.range(10).count() == 10
pid = SparkContext._gateway.proc.pid
jvm = SparkContext._jvm
arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
with open(f"/proc/{pid}/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})
stop_session()
print(json.dumps({"arguments": arguments, "mapped": mapped}))
"""


def _probe(
    cache: Path, conf: dict[str, str] | None = None, env: dict[str, str] | None = None
) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(conf or {})],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(SRC), **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_first_run_records_the_classes_and_later_runs_map_them(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _probe(cache)
    assert C1_ONLY in first["arguments"]
    recorded = [a for a in first["arguments"] if a.startswith("-XX:ArchiveClassesAtExit=")]
    assert len(recorded) == 1, first["arguments"]
    # Written aside, then renamed: one archive, no partial left.
    files = sorted((cache / "pidgate" / "spark-jvm").iterdir())
    assert [f.suffix for f in files] == [".jsa"], files
    assert files[0].stat().st_size > 50_000_000  # Spark's classes, not an empty claim

    second = _probe(cache)
    assert C1_ONLY in second["arguments"]
    assert f"-XX:SharedArchiveFile={files[0]}" in second["arguments"]
    # The JVM accepted it: the archive is in its memory map.
    assert str(files[0]) in second["mapped"]
    assert sorted((cache / "pidgate" / "spark-jvm").iterdir()) == files

    # The user's --conf wins: their options replace pidgate's, and nothing is recorded.
    own = _probe(cache, {"spark.driver.defaultJavaOptions": "-Dpidgate.test=1"})
    assert "-Dpidgate.test=1" in own["arguments"]
    assert C1_ONLY not in own["arguments"]
    assert str(files[0]) not in own["mapped"]


def test_an_administrators_default_options_follow_pidgates(tmp_path: Path) -> None:
    # spark-defaults.conf is where an administrator puts spark.driver.defaultJavaOptions; the
    # launcher lets a --conf replace it, so pidgate's options go first and theirs follow (the
    # JVM takes the last of a repeated option, so theirs win).
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        "# site defaults\n"
        "spark.driver.defaultJavaOptions  -Dsite.proxy=on -XX:TieredStopAtLevel=4\n"
    )
    (tmp_path / "cache" / "pidgate" / "spark-jvm").mkdir(parents=True)
    arguments = _probe(tmp_path / "cache", env={"SPARK_CONF_DIR": str(conf_dir)})["arguments"]
    assert "-Dsite.proxy=on" in arguments
    assert arguments.index(C1_ONLY) < arguments.index("-XX:TieredStopAtLevel=4")


def test_the_cli_says_why_its_first_run_ends_later(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": str(SRC)}
    runs = []
    for name in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-m", "pidgate", "analyze", "activity",
             "--events", str(DATA / "recorded_events.jsonl"), "--output", str(tmp_path / name)],
            capture_output=True, text=True, timeout=300, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert (tmp_path / name / "report.html").is_file()
        runs.append(done.stderr)
    saving = "saving the classes Spark loaded, so that later runs start faster"
    assert saving in runs[0]
    assert saving not in runs[1]
    assert len(list((tmp_path / "cache" / "pidgate" / "spark-jvm").glob("*.jsa"))) == 1


def test_one_process_records_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    options, recording = driver_java_options()
    assert recording is not None
    assert recording.partial.is_file()  # the claim
    assert f"-XX:ArchiveClassesAtExit={recording.partial}" in options
    # While this (live) process records, another start gets the JIT option alone.
    assert driver_java_options() == (C1_ONLY, None)
    # A claim whose process is gone is removed, and the next start records.
    dead = recording.partial.with_name(recording.target.stem + ".999999999.jsa.part")
    recording.partial.rename(dead)
    options, again = driver_java_options()
    assert again is not None and not dead.exists()
    assert again.partial.is_file()


def test_other_installations_keep_their_newest_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = driver_jvm.cache_dir()
    directory.mkdir(parents=True)
    older, newer = directory / "spark-classes-aaaa.jsa", directory / "spark-classes-bbbb.jsa"
    unrelated = directory / "notes.txt"
    for index, path in enumerate((older, newer, unrelated)):
        path.write_bytes(b"x")
        os.utime(path, ns=(index * 10**9, index * 10**9))
    _, recording = driver_java_options()
    assert recording is not None
    assert not older.exists()
    assert newer.exists() and unrelated.exists()


def test_without_java_only_the_jit_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert driver_java_options() == (C1_ONLY, None)
    assert not (tmp_path / "pidgate").exists()


class _Gateway:
    """Stands in for py4j's gateway: ``proc`` is a real process that, like the gateway JVM,
    exits when its stdin ends (``cat``), but writes no archive: a JVM that cannot record."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)

    def shutdown(self) -> None:
        pass


def test_a_jvm_that_cannot_record_is_not_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # This process's own recording (the shared test session's JVM) is put back afterwards.
    monkeypatch.setattr(driver_jvm, "_pending", None)
    _, recording = driver_java_options()
    assert recording is not None
    driver_jvm.start_recording(recording, _Gateway())
    assert driver_jvm.recording_pending()
    assert driver_jvm.finish_recording() is None
    assert not driver_jvm.recording_pending()
    assert not recording.partial.exists() and not recording.target.exists()
    # Later starts neither record nor announce it: the JIT option alone.
    assert driver_java_options() == (C1_ONLY, None)
