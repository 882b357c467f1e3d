"""Pruning the executor archive cache, with real files in a temporary ``XDG_CACHE_HOME``: older
archives beyond the kept ones and abandoned partial builds go, everything else stays, and a
removal that fails never fails the job; the archive's bytecode is what an interpreter runs. No
JVM and no real archive build (the shipped packages are replaced by small files)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from pidgate.pipeline.spark import shipping
from pidgate.pipeline.spark.shipping import (
    KEPT_ARCHIVES,
    cache_dir,
    executor_archive,
    prune_cache,
    stale_archives,
)

_HOUR_S = 3600


def _archive_name(digest_digit: str) -> str:
    return f"pidgate-env-py311-x86_64-{digest_digit * 16}.tar.gz"


def _put(directory: Path, name: str, age_s: float, size_bytes: int = 1000) -> Path:
    """A file ``age_s`` seconds old (by mtime)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(b"x" * size_bytes)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return cache_dir()


def test_stale_archives_keeps_the_current_and_the_most_recent_others() -> None:
    current = Path("/c") / _archive_name("a")
    mtimes_ns = {
        current: 1,  # the one just built, even with a clock that went back
        Path("/c") / _archive_name("b"): 40,
        Path("/c") / _archive_name("c"): 30,
        Path("/c") / _archive_name("d"): 20,
        Path("/c/pidgate-env-notes.txt"): 10,
        Path("/c/pidgate-env-py311-x86_64-0123.tar.gz"): 5,  # not a digest
    }
    assert stale_archives(mtimes_ns, 2, current) == [
        Path("/c") / _archive_name("c"),
        Path("/c") / _archive_name("d"),
    ]
    assert stale_archives(mtimes_ns, 1, current) == [
        Path("/c") / _archive_name(digit) for digit in "bcd"
    ]
    assert stale_archives(mtimes_ns, 4, current) == []


def test_prune_removes_older_archives_and_abandoned_builds_only(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    current = _put(cache, _archive_name("a"), age_s=0)
    previous = _put(cache, _archive_name("b"), age_s=60)
    older = [
        _put(cache, _archive_name(d), age_s=120 + i, size_bytes=3_000_000)
        for i, d in enumerate("cd")
    ]
    abandoned = _put(cache, "pidgate-env-k3j_x9a2.tar.gz.part", age_s=2 * _HOUR_S)
    abandoned_before = _put(cache, "tmpab12cd34.part", age_s=2 * _HOUR_S)
    building = _put(cache, "pidgate-env-zz99yy88.tar.gz.part", age_s=30)
    foreign = [
        _put(cache, "notes.txt", age_s=10 * _HOUR_S),
        _put(cache, "pidgate-env-mine.tar.gz", age_s=10 * _HOUR_S),
        _put(cache, "other-tool.part", age_s=10 * _HOUR_S),
    ]
    (cache / _archive_name("e")).mkdir()  # a directory named like an archive: not ours

    prune_cache(current)

    assert KEPT_ARCHIVES == 2
    assert current.exists() and previous.exists() and building.exists()
    assert all(path.exists() for path in foreign) and (cache / _archive_name("e")).is_dir()
    assert not any(path.exists() for path in [*older, abandoned, abandoned_before])
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("removed 2 older executor archives and 2 abandoned partial builds (6 MB)")
    assert err.rstrip().endswith(f"from {cache}")


def test_nothing_to_prune_prints_nothing(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    current = _put(cache, _archive_name("a"), age_s=0)
    _put(cache, _archive_name("b"), age_s=60)
    prune_cache(current)
    assert capsys.readouterr().err == ""


def test_a_failing_removal_never_raises(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    current = _put(cache, _archive_name("a"), age_s=0)
    _put(cache, _archive_name("b"), age_s=60)
    locked = _put(cache, _archive_name("c"), age_s=120)
    vanishing = _put(cache, _archive_name("d"), age_s=180)
    removable = _put(cache, _archive_name("e"), age_s=240, size_bytes=2_000_000)
    unlink = Path.unlink

    def flaky_unlink(path: Path, missing_ok: bool = False) -> None:
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        if path == vanishing:  # another process pruned it between listing and removing
            unlink(path)
        unlink(path, missing_ok)

    monkeypatch.setattr(Path, "unlink", flaky_unlink)
    prune_cache(current)

    assert locked.exists() and not vanishing.exists() and not removable.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        "removed 1 older executor archive (2 MB); could not remove 1 file (Permission denied)"
    )


def test_an_unlistable_cache_never_raises(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prune_cache(tmp_path / "gone" / _archive_name("a"))
    assert capsys.readouterr().err.count("\n") == 1


def test_executor_archive_prunes_after_a_build_only(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One small file stands in for pidgate and its packages (the real build takes tens of s).
    source = tmp_path / "init.py"
    source.write_text("")
    monkeypatch.setattr(shipping, "shipped_distributions", lambda: [])
    monkeypatch.setattr(shipping, "_pidgate_files", lambda: [(source, "pidgate/__init__.py")])
    old = [_put(cache, _archive_name(d), age_s=60 * (i + 1)) for i, d in enumerate("bcd")]

    built = executor_archive()

    assert built.exists() and built not in old
    assert old[0].exists() and not old[1].exists() and not old[2].exists()
    assert not list(cache.glob("*.part"))
    late = _put(cache, _archive_name("e"), age_s=30)
    assert executor_archive() == built  # found in the cache: nothing built, nothing pruned
    assert late.exists() and old[0].exists()


def test_the_line_names_the_default_cache_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    current = _put(cache_dir(), _archive_name("a"), age_s=0)
    for i, digit in enumerate("bc"):
        _put(cache_dir(), _archive_name(digit), age_s=60 * (i + 1))
    prune_cache(current)
    assert capsys.readouterr().err == (
        "removed 1 older executor archive (0 MB) from ~/.cache/pidgate/spark-env\n"
    )


def test_the_archive_carries_bytecode_the_interpreter_uses_without_the_source(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Executors unpack the archive afresh for every application: without bytecode in it,
    # each Python worker compiled pandas, pyarrow and pidgate again.
    package = tmp_path / "src" / "pg_shipped"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("ANSWER = 'from the archive'\n")
    (package / "later.py").write_text("def f(:\n")  # only another Python compiles it
    monkeypatch.setattr(shipping, "shipped_distributions", lambda: [])
    monkeypatch.setattr(
        shipping,
        "_pidgate_files",
        lambda: [(package / name, f"pg_shipped/{name}") for name in ("__init__.py", "later.py")],
    )
    unpacked = tmp_path / "executor"
    with tarfile.open(executor_archive()) as archive:
        names = archive.getnames()
        archive.extractall(unpacked, filter="data")
    tag = sys.implementation.cache_tag
    assert f"pg_shipped/__pycache__/__init__.{tag}.pyc" in names
    assert not [name for name in names if name.startswith("pg_shipped/__pycache__/later.")]
    # Unchecked: the bytecode is used as it is, whatever the source beside it now says.
    (unpacked / "pg_shipped" / "__init__.py").write_text("ANSWER = 'compiled again'\n")
    done = subprocess.run(
        [sys.executable, "-c", "import pg_shipped; print(pg_shipped.ANSWER)"],
        cwd=unpacked,
        env={**os.environ, "PYTHONPATH": str(unpacked), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "from the archive"
