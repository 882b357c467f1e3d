"""The local state file: atomic replacement, owner-only permissions, and a clean start with a
clear warning when the file is missing, corrupt, truncated or from a newer format."""

from __future__ import annotations

import os
import stat
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from pidgate.proxy.quota_control.state_file import (
    load_or_start_clean,
    read_state,
    write_state_atomically,
)
from pidgate.quota import QuotaManager, QuotaPolicy, Rejected
from pidgate.quota.state.encode import dump_state
from pidgate.quota.state.format import FORMAT_VERSION, MAGIC
from pidgate.quota.state.run_time_overrides import QuotaOverrides

T0 = 1_700_000_000_000
POLICY = QuotaPolicy(window_ms=60_000, window_num=6, default_producer_ids_rate=2)


class FakeLog:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.events.append(("info", event, fields))

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(("warning", event, fields))

    @property
    def warnings(self) -> list[tuple[str, dict[str, Any]]]:
        return [(event, fields) for level, event, fields in self.events if level == "warning"]


def saved_state() -> tuple[bytes, Rejected]:
    m = QuotaManager(POLICY)
    m.admit("User:alice", [1, 2], T0)
    rejected = m.admit("User:alice", [3], T0)
    assert isinstance(rejected, Rejected)
    return dump_state(m, T0, QuotaOverrides({"bob": 7})), rejected


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- atomic write --------------------------------------------------------------------------------


def test_write_then_read(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    assert read_state(path) is None
    write_state_atomically(path, b"one")
    assert read_state(path) == b"one"
    write_state_atomically(path, b"two")
    assert read_state(path) == b"two"
    assert leftovers(tmp_path) == ["state.bin"]


def test_file_is_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    old = os.umask(0)
    try:
        write_state_atomically(path, b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # replacing a looser file tightens it
    write_state_atomically(path, b"y")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_crash_before_replace_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.bin"
    write_state_atomically(path, b"old state")

    def crash(src: object, dst: object) -> None:
        # The new content is complete and durable in the temporary file at this point.
        assert Path(str(src)).read_bytes() == b"new state"
        assert Path(str(src)).parent == tmp_path
        raise KeyboardInterrupt  # anything, even a BaseException

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        write_state_atomically(path, b"new state")
    monkeypatch.undo()
    assert read_state(path) == b"old state"
    assert leftovers(tmp_path) == ["state.bin"]  # the temporary file was removed


def test_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state.bin"
    write_state_atomically(path, b"old state")

    def disk_full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_state_atomically(path, b"new state")
    monkeypatch.undo()
    assert read_state(path) == b"old state"
    assert leftovers(tmp_path) == ["state.bin"]


def test_a_killed_writer_leaves_the_old_state_loadable(tmp_path: Path) -> None:
    """A process killed mid-write runs no cleanup: what it leaves is a partial temporary file
    beside an intact state file, which loads as before."""
    path = tmp_path / "state.bin"
    data, rejected = saved_state()
    write_state_atomically(path, data)
    (tmp_path / ".state.bin.k1ll3d.tmp").write_bytes(data[:10])
    manager, _ = load_or_start_clean(path, POLICY, T0, FakeLog())
    assert manager.admit("User:alice", [3], T0) == rejected
    write_state_atomically(path, b"next")  # and the next save is not disturbed by it
    assert read_state(path) == b"next"


def test_fsyncs_file_and_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_state_atomically(tmp_path / "state.bin", b"x")
    assert synced == ["file", "dir"]


# -- load or start clean -------------------------------------------------------------------------


def test_load_restores_state_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    data, rejected = saved_state()
    write_state_atomically(path, data)
    log = FakeLog()
    manager, overrides = load_or_start_clean(path, POLICY, T0 + 1000, log)
    assert overrides == QuotaOverrides({"bob": 7})
    assert manager.policy.rate_for("User:bob") == 7
    assert manager.is_known("User:alice", 1, T0 + 1000)
    decision = manager.admit("User:alice", [3], T0 + 1000)
    assert decision == Rejected(rejected.throttle_time_ms - 1000, (3,))
    assert log.warnings == []
    ((level, event, fields),) = log.events
    assert (level, event) == ("info", "state_file_loaded")
    assert fields["path"] == str(path)
    assert fields["principals_restored"] == 1
    assert fields["saved_ms_ago"] == 1000


def test_missing_file_starts_clean_with_a_warning(tmp_path: Path) -> None:
    log = FakeLog()
    manager, overrides = load_or_start_clean(tmp_path / "absent.bin", POLICY, T0, log)
    assert manager.principal_count == 0
    assert manager.policy == POLICY
    assert overrides == QuotaOverrides()
    ((event, fields),) = log.warnings
    assert event == "state_file_missing"
    assert fields["path"] == str(tmp_path / "absent.bin")
    assert "no such file" in fields["reason"]


def assert_clean_start_on_corrupt(path: Path, content: bytes, reason: str) -> None:
    path.write_bytes(content)
    log = FakeLog()
    manager, overrides = load_or_start_clean(path, POLICY, T0, log)
    assert manager.principal_count == 0
    assert manager.policy == POLICY
    assert overrides == QuotaOverrides()
    ((event, fields),) = log.warnings
    assert event == "state_file_corrupt"
    assert fields["path"] == str(path)
    assert reason in fields["reason"]
    # The bad file is kept for inspection, out of the way of the next save.
    kept = path.with_name(path.name + ".corrupt")
    assert fields["kept_as"] == str(kept)
    assert kept.read_bytes() == content
    assert not path.exists()


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda d: d[: len(d) // 2], "truncated"),
        (lambda d: d[:-1], "truncated"),
        (lambda d: b"", "bad magic"),
        (lambda d: b"\x00" * len(d), "bad magic"),
        (lambda d: d[:40] + bytes([d[40] ^ 0x10]) + d[41:], "checksum"),
        (lambda d: d + b"\n", "trailing"),
    ],
)
def test_corrupt_file_starts_clean_with_a_warning(tmp_path: Path, mangle: Any, reason: str) -> None:
    data, _ = saved_state()
    assert_clean_start_on_corrupt(tmp_path / "state.bin", mangle(data), reason)


def test_newer_format_starts_clean_with_a_warning(tmp_path: Path) -> None:
    body = b"\x00\x00\x00"
    compressed = zlib.compress(body)
    head = struct.pack(">8sHHQQ", MAGIC, FORMAT_VERSION + 1, 0, len(body), len(compressed))
    newer = head + compressed + struct.pack(">I", zlib.crc32(head + compressed))
    assert_clean_start_on_corrupt(tmp_path / "state.bin", newer, "newer")


def test_unreadable_file_starts_clean_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    path.mkdir()  # reading a directory fails on every platform and as every user
    log = FakeLog()
    manager, _ = load_or_start_clean(path, POLICY, T0, log)
    assert manager.principal_count == 0
    ((event, fields),) = log.warnings
    assert event == "state_file_unreadable"
    assert fields["path"] == str(path)
    assert fields["reason"]


def test_changed_bloom_shape_is_warned_about(tmp_path: Path) -> None:
    path = tmp_path / "state.bin"
    data, _ = saved_state()
    write_state_atomically(path, data)
    log = FakeLog()
    stricter = QuotaPolicy(
        window_ms=60_000, window_num=6, default_producer_ids_rate=2, false_positive_rate=0.0001
    )
    manager, _ = load_or_start_clean(path, stricter, T0, log)
    assert manager.principal_count == 1  # still throttled, its PIDs look new
    ((event, fields),) = log.warnings
    assert event == "state_file_bloom_shape_changed"
    assert fields["layers_dropped"] == 1
