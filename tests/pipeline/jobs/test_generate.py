"""The synthetic event log: well-formed, deterministic, rotated, gzip, several instances."""

from __future__ import annotations

import gzip
import itertools
import json
from collections import Counter
from pathlib import Path

from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events, main


def read_lines(path: Path) -> list[str]:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return f.read().splitlines()
    return path.read_text(encoding="utf-8").splitlines()


def test_generated_log(tmp_path: Path) -> None:
    cfg = GeneratorConfig(events=5000, seed=3, rotate_lines=700, gzip=True, bad_line_every=1000)
    stats = generate_events(tmp_path, cfg)
    assert stats.events == 5000 and stats.bad_lines == 5
    assert all(p.suffix == ".gz" for p in stats.files) and len(stats.files) > 3
    records, bad = [], 0
    ranges: dict[Path, tuple[int, int]] = {}
    for path in stats.files:
        ts = []
        for line in read_lines(path):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            records.append(record)
            ts.append(record["ts_ms"])
        ranges[path] = (min(ts), max(ts))
    assert bad == 5 and len(records) == 5000
    kinds = Counter(r["event"] for r in records)
    assert kinds["admitted_new"] and kinds["rejected"] and kinds["init_producer_id"]
    principals = {r["principal"] for r in records}
    assert any(p.startswith("User:app-") for p in principals)
    assert any(p.startswith("User:storm-") for p in principals)
    assert any(p.startswith("User:batchy-") for p in principals)
    assert len({r["instance"] for r in records}) == 3
    assert all(r["throttle_ms"] > 0 for r in records if r["event"] == "rejected")
    # timestamps overlap across files (several instances writing at once): out of order
    spans = sorted(ranges.values())
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_deterministic_and_cli(tmp_path: Path) -> None:
    a = generate_events(tmp_path / "a", GeneratorConfig(events=800, seed=11))
    assert main(["events", "--out", str(tmp_path / "b"), "--events", "800", "--seed", "11"]) == 0
    b_files = sorted((tmp_path / "b").iterdir())
    assert [p.name for p in sorted(a.files)] == [p.name for p in b_files]
    for pa, pb in zip(sorted(a.files), b_files, strict=True):
        assert pa.read_bytes() == pb.read_bytes()
