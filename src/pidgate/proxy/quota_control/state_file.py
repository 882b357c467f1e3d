"""The local state file: the quota state (:mod:`pidgate.quota.state`) written atomically,
read back at startup, and a clean start with a clear warning when it cannot be used.

Owns the file's I/O and durability: write to a temporary file in the same directory, fsync it,
``os.replace`` it over the old one, fsync the directory. A crash at any point leaves either the
old file or the new one, never a mix; the file is readable by its owner only (0600) because it
names principals. No asyncio: the caller decides where this blocking I/O runs. Must not import
``serving``, ``operations`` or the server, nor log (callers report failures).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from pidgate.quota import QuotaManager, QuotaPolicy
from pidgate.quota.state.format import StateFormatError
from pidgate.quota.state.load import LoadReport, load_state
from pidgate.quota.state.run_time_overrides import QuotaOverrides

__all__ = ["load_or_start_clean", "read_state", "write_state_atomically"]

_MODE = 0o600


class Log(Protocol):
    """The part of a structlog logger this module uses."""

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable. Not possible (nor needed) on Windows."""
    if os.name == "nt":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_state_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a reader (or a restart after a crash) sees the old
    content or the new, never a partial file. The file is created with mode 0600. On any error
    the temporary file is removed and ``path`` is untouched; the error propagates."""
    directory = path.parent
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            if os.name != "nt":
                os.fchmod(tmp_file.fileno(), _MODE)  # mkstemp's 0600, whatever the umask
            tmp_file.write(data)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_directory(directory)


def read_state(path: Path) -> bytes | None:
    """The content of ``path``, or None if it does not exist. Other errors propagate."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _report_fields(report: LoadReport, now_ms: int) -> dict[str, Any]:
    return {
        "saved_ms_ago": now_ms - report.dumped_at_ms,
        "overrides": len(report.overrides),
        "principals_saved": report.principals_saved,
        "principals_restored": report.principals_restored,
        "layers_restored": report.layers_restored,
        "layers_expired": report.layers_expired,
        "principals_unlimited": report.principals_unlimited,
        "principals_idle": report.principals_idle,
        "principals_reshaped": report.principals_reshaped,
        "layers_reshaped": report.layers_reshaped,
        "principals_evicted": report.principals_evicted,
    }


def load_or_start_clean(
    path: Path, policy: QuotaPolicy, now_ms: int, log: Log
) -> tuple[QuotaManager, QuotaOverrides]:
    """The quota manager and run-time overrides saved in ``path``, fitted to ``policy`` at
    ``now_ms`` (wall-clock ms; see :func:`pidgate.quota.state.load.load_state`, which also puts
    the overrides on top of ``policy``). Never fails on the file's account: if it is missing,
    unreadable, corrupt, truncated or from a newer format, logs a warning
    (``state_file_missing`` / ``state_file_unreadable`` / ``state_file_corrupt``, with ``path``
    and ``reason``) and returns an empty manager under ``policy`` and no overrides.

    A corrupt file is kept beside the original as ``<name>.corrupt`` (replacing an older one)
    so the next save does not destroy the evidence; ``kept_as`` says where, or is None if the
    rename failed.
    """
    clean = QuotaManager(policy), QuotaOverrides()
    try:
        data = read_state(path)
    except OSError as exc:
        log.warning(
            "state_file_unreadable",
            path=str(path),
            reason=f"{type(exc).__name__}: {exc.strerror or exc}",
            action="starting with no quota state and no run-time quota overrides",
        )
        return clean
    if data is None:
        log.warning(
            "state_file_missing",
            path=str(path),
            reason="no such file (first start, or the state was removed)",
            action="starting with no quota state and no run-time quota overrides",
        )
        return clean
    try:
        manager, report = load_state(data, policy, now_ms)
    except StateFormatError as exc:
        kept_as: str | None = str(path.with_name(path.name + ".corrupt"))
        try:
            os.replace(path, path.with_name(path.name + ".corrupt"))
        except OSError:
            kept_as = None
        log.warning(
            "state_file_corrupt",
            path=str(path),
            reason=str(exc),
            size=len(data),
            kept_as=kept_as,
            action="starting with no quota state and no run-time quota overrides",
        )
        return clean
    fields = _report_fields(report, now_ms)
    if report.layers_reshaped:
        log.warning(
            "state_file_bloom_shape_changed",
            path=str(path),
            reason="the false-positive rate or layer size changed since the state was saved",
            principals=report.principals_reshaped,
            layers_dropped=report.layers_reshaped,
        )
    log.info("state_file_loaded", path=str(path), **fields)
    return manager, report.overrides
