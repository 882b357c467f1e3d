"""Sampling a pidgate process with py-spy during a benchmark, and reading the samples back:
the top functions by self and by inclusive samples.

Imports the standard library only; must not import a benchmark script.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path


def start_profile(pid: int, path: str) -> subprocess.Popen[bytes]:
    """py-spy (beside this Python) recording ``pid``'s raw stacks into ``path`` until it gets
    SIGINT; ``PYSPY_NATIVE=1`` adds native frames (and stops the process to sample it)."""
    spy = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "py-spy"),
            "record",
            "-p",
            str(pid),
            "-r",
            "500",
            "-f",
            "raw",
            "-o",
            path,
            *(["--native"] if os.environ.get("PYSPY_NATIVE") else ["--nonblocking"]),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(1)
    return spy


def print_profile(path: str, top: int = 25) -> None:
    """Self ("tottime") and inclusive ("cumtime") sample shares per function from py-spy's
    collapsed stacks; idle time in the event loop's poll is listed too."""
    self_counts: dict[str, int] = {}
    incl_counts: dict[str, int] = {}
    total = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")[1:] if stack.startswith("process") else stack.split(";")
        frames = [re.sub(r":\d+\)$", ")", f) for f in frames]  # per function, not per line
        if frames:
            self_counts[frames[-1]] = self_counts.get(frames[-1], 0) + count
        for f in set(frames):
            incl_counts[f] = incl_counts.get(f, 0) + count
    print(f"\n== pidgate profile: {total} samples (py-spy, 500 Hz, all threads, idle included) ==")
    print("-- top by self samples --")
    for f, c in sorted(self_counts.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{100 * c / total:6.2f}%  {f}")
    print("-- top by inclusive samples --")
    for f, c in sorted(incl_counts.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{100 * c / total:6.2f}%  {f}")
