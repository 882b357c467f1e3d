"""The broker-protection benchmark, small: ``benchmarks/protection.py`` run as a user runs it
(the README's command, a subprocess from the repository root) against a fresh broker of each
version, and its report checked against what the broker holds.

A storm of new idempotent PIDs straight to the broker leaves one producer-state entry per PID
(DescribeProducers, KIP-664); through pidgate, only the quota's burst, the refill during the
storm and the steady producer's PID reach it; the steady producer loses nothing either way.
The benchmark starts and stops its own brokers and pidgate (by PID, whatever happens).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.realkafka

ROOT = Path(__file__).resolve().parents[2]
PIDS = 300
RATE = 10  # new PIDs per window for User:ANONYMOUS
WINDOW_S = 60
#: Bloom false positives admit a new PID free with p = 0.001 (290 lookups: 0.3 expected).
FALSE_POSITIVE_SLACK = 2


def run_benchmark(version: str, home: Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "benchmarks/protection.py",
        "--pids",
        str(PIDS),
        "--rate",
        str(RATE),
        "--window-seconds",
        str(WINDOW_S),
        "--versions",
        version,
        f"--kafka{version}",
        str(home),
    ]
    # Two broker starts, two storms of 300; the bound is for a loaded machine, not a speed claim.
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=840, check=False
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROTECTION ")]
    assert len(lines) == 1, result.stdout[-3000:]
    summary: dict[str, Any] = json.loads(lines[0].removeprefix("PROTECTION "))
    return summary


@pytest.mark.timeout(900)
@pytest.mark.parametrize("version", ["3", "4"])
def test_a_pid_storm_fills_the_broker_directly_and_not_through_pidgate(
    version: str, request: pytest.FixtureRequest
) -> None:
    home: Path = request.getfixturevalue(f"kafka{version}_home")
    summary = run_benchmark(version, home)
    runs = {run["path"]: run for run in summary["runs"]}
    assert set(runs) == {"direct", "pidgate"}
    direct, gated = runs["direct"], runs["pidgate"]

    for run in (direct, gated):
        # Every storm producer got a PID and an answer: admitted, or rejected and gave up.
        assert run["failed"] == {}, run
        assert run["sent"] == PIDS
        assert run["admitted"] + run["rejected"] == PIDS
        # The steady producer kept producing through the storm and lost nothing.
        assert run["steady_errors"] == 0, run["steady_first_error"]
        assert run["steady_delivered"] > 0
        # What the broker holds is what was admitted, plus the steady producer's PID (one more
        # if librdkafka had to re-init its PID, which only an error would make it do).
        assert run["admitted"] + 1 <= run["entries"] <= run["admitted"] + 2, run

    # Straight to the broker: one entry per new PID, kept for producer.id.expiration.ms.
    assert direct["admitted"] == PIDS and direct["rejected"] == 0
    assert direct["entries"] >= PIDS

    # Through pidgate: the burst (a full bucket, one token of it the steady producer's), the
    # refill while the storm ran, and false positives; every other storm producer rejected.
    refill = math.ceil(RATE * gated["storm_seconds"] / WINDOW_S)
    assert RATE - 1 <= gated["admitted"] <= RATE - 1 + refill + FALSE_POSITIVE_SLACK, gated
    assert gated["entries"] <= RATE + refill + FALSE_POSITIVE_SLACK + 1
    assert summary["ratio_direct_pidgate"][direct["version"]] == round(
        direct["entries"] / gated["entries"], 1
    )

    # The broker's live heap (jcmd's histogram after a full GC) holds one ProducerStateEntry
    # per entry each path added (to within one: an append in flight at a histogram holds the
    # steady producer's next entry for a moment).
    for run in (direct, gated):
        added = run["entries"] - run["entries_before"]
        assert abs(run["entry_objects"] - added) <= 1, run
    # Generic classes of the entries (Long, Object[], HashMap$Node) also move with the rest of
    # the broker, so only a wide margin is asserted on their bytes.
    assert direct["state_delta_bytes"] > 0
    assert direct["state_delta_bytes"] > 2 * gated["state_delta_bytes"]
