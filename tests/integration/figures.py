"""Figures the reliability tests measure (counts, bytes, seconds), for RELIABILITY.md.

``record_figures("soak", records=1_000_000, seconds=41.2)`` prints one ``FIGURES {json}`` line
(shown with ``pytest -s`` or in a failure's captured output) and, when ``PIDGATE_FIGURES``
names a file, appends the same JSON object to it, one per line. Figures are reported, never
asserted on as speed (tests assert correctness and bounds only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def record_figures(test: str, **values: Any) -> None:
    line = json.dumps({"test": test, **values}, sort_keys=True, default=str)
    print(f"FIGURES {line}")
    target = os.environ.get("PIDGATE_FIGURES")
    if target:
        with Path(target).open("a", encoding="utf-8") as out:
            out.write(line + "\n")


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
