"""The HTML report is self-contained: tables inline, figures as embedded PNG, text escaped."""

from __future__ import annotations

import base64
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from pyspark.sql import SparkSession

from pidgate.pipeline.outputs.report import Section, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(path: Path) -> _Collect:
    collector = _Collect()
    collector.feed(path.read_text(encoding="utf-8"))
    return collector


def check_self_contained(html_path: Path, tables: int, images: int) -> _Collect:
    doc = parse(html_path)
    for tag, attrs in doc.tags:
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not value.startswith(("http://", "https://", "//")), (tag, value)
        assert tag not in ("script", "link", "iframe")
    pngs = [a["src"] for t, a in doc.tags if t == "img" and (a.get("src") or "")]
    assert len(pngs) == images
    for src in pngs:
        assert src is not None and src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    assert sum(1 for t, _ in doc.tags if t == "table") == tables
    return doc


def test_report_is_self_contained(spark: SparkSession, tmp_path: Path) -> None:
    fig = Figure()
    fig.add_subplot().plot([1, 2, 3], [3, 1, 2])
    table = pd.DataFrame({"principal": ["User:<b>evil</b>", "User:ok"], "new_pids": [3, 1]})
    sections = [
        Section("Summary <script>", "a < b & c"),
        Section("Table and plot", "", table, fig),
        Section("Empty table", "", table.iloc[0:0]),
    ]
    frames = {"rows": spark.createDataFrame([(1, "a")], "x int, y string")}
    html_path = write_report(str(tmp_path / "out"), "Title & <more>", sections, frames)

    assert html_path == tmp_path / "out" / "report.html"
    doc = check_self_contained(html_path, tables=1, images=1)
    text = "".join(doc.text)
    assert "Summary <script>" in text and "a < b & c" in text  # escaped, so it is text again
    assert "User:<b>evil</b>" in text
    assert spark.read.parquet(str(tmp_path / "out" / "rows.parquet")).count() == 1

    # file: URIs are written locally too, and an existing report is replaced
    again = write_report(f"file://{tmp_path / 'out'}", "Second", sections[:1], {})
    assert again == html_path and "Second" in html_path.read_text()
