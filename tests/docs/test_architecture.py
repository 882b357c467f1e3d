"""ARCHITECTURE.md and the README's Layout are a map of the code: every file and folder they
name must exist, and every room of the proxy and the pipeline must be on the map, so the map
cannot drift from the code unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "pidgate"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
README = ROOT / "README.md"

# `serving/connection.py`, `quota/state/`, `operations/metrics*.py`, `proxy/workers.py` ...
_NAMED_PATH = re.compile(r"`((?:[a-z_]+/)+(?:[a-z_*]+\.py)?)`")


def _named_paths(text: str) -> set[str]:
    return {m.group(1) for m in _NAMED_PATH.finditer(text)}


def _resolve(named: str) -> list[Path]:
    """Where a path named relative to src/pidgate (``quota/bloom.py``), to one of the proxy's
    or the pipeline's rooms (``serving/tls.py``), or to the repository root can be."""
    bases = [PACKAGE, PACKAGE / "proxy", PACKAGE / "pipeline", ROOT]
    if named.startswith("proxy/"):
        bases = [PACKAGE]
    found: list[Path] = []
    for base in bases:
        found += [p for p in base.glob(named.rstrip("/")) if p.exists()]
    return found


def test_every_path_architecture_names_exists() -> None:
    named = _named_paths(ARCHITECTURE.read_text())
    assert len(named) > 30  # the table and the request path name files throughout
    missing = sorted(n for n in named if not _resolve(n))
    assert missing == []


def test_every_room_of_the_proxy_and_the_pipeline_is_on_the_map() -> None:
    text = ARCHITECTURE.read_text()
    rooms = [
        p.name
        for parent in (PACKAGE / "proxy", PACKAGE / "pipeline")
        for p in parent.iterdir()
        if p.is_dir() and (p / "__init__.py").exists()
    ]
    assert {"serving", "quota_control", "operations", "jobs", "reading"} <= set(rooms)
    assert [room for room in rooms if f"{room}/" not in text] == []


def test_the_readme_layout_names_every_package_and_points_at_the_map() -> None:
    layout = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    assert "ARCHITECTURE.md" in layout
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    assert [p for p in packages if f"src/pidgate/{p}/" not in layout] == []
