"""The activity report as a user sees it: a real report of a recorded demo log, opened from disk
in headless Chromium (Debian's ``chromium``): the DOM it builds holds the sections and the
numbers, the page logs no console error, and its screenshot is a full-width, non-blank page with
every chart drawn."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image
from pyspark.sql import SparkSession

from pidgate.pipeline.jobs.activity import run_activity

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not on PATH")

DEMO = Path(__file__).parents[1] / "data" / "demo_events.jsonl"
WIDTH, HEIGHT = 1280, 3200


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium as root in a container: no sandbox, no GPU, no network chatter, a
    fresh profile; console messages go to stderr."""
    with tempfile.TemporaryDirectory(prefix="pidgate-chromium-") as profile:
        return subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--enable-logging=stderr",
                "--v=0",
                f"--user-data-dir={profile}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )


@pytest.fixture(scope="module")
def report(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("browser") / "report"
    return run_activity(spark, str(DEMO), str(out), window_s=10)


def test_the_browser_shows_the_sections_and_numbers(report: Path) -> None:
    shown = chromium("--dump-dom", report.as_uri())
    dom = shown.stdout
    for title in (
        "Summary",
        "Top 20 principals by new producer IDs",
        "New producer IDs and rejections per second",
        "Recommended producer_ids_rate per principal",
    ):
        assert f"<h2>{title}</h2>" in dom, title
    assert "Restart storms: 1 principal(s): User:ANONYMOUS" in dom
    assert "Events: 55" in dom
    assert dom.count('<img class="figure"') == 2
    console = [line for line in shown.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console


def test_the_screenshot_is_a_drawn_page(report: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    chromium(f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}", report.as_uri())
    with Image.open(png) as image:
        assert image.size == (WIDTH, HEIGHT)
        pixels = image.convert("RGB")
        # The charts' colours are there: the bars' blue and amber, drawn, not broken images.
        colours = {colour for _, colour in pixels.getcolors(maxcolors=1 << 20) or []}
        assert (0x4F, 0x81, 0xBD) in colours  # admitted at first try
        assert (0xF2, 0xB1, 0x34) in colours  # admitted after waiting
        assert len(colours) > 50  # text, tables and plots, not a blank page
