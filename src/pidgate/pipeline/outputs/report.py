"""Parquet outputs plus one self-contained HTML report per job.

Every job ends with :func:`write_report`: the Spark DataFrames it computed go to
``<output_dir>/<name>.parquet`` through Spark's writer (so ``output_dir`` may be any Hadoop
filesystem URI), and a single ``<output_dir>/report.html`` holds the text, the tables and the
plots (PNG, base64-embedded): no external assets, openable straight from disk in a browser.

Figures should be built with :func:`new_figure` (a :class:`matplotlib.figure.Figure`, not
pyplot), which keeps the Agg backend and needs no global state or closing. matplotlib is
imported only when a figure is made: the job modules import this one, executors import the job
modules whose functions they run, and pidgate does not ship matplotlib to executors (only the
driver draws; :mod:`pidgate.pipeline.spark.shipping`).

Must not import a job, ``reading`` or ``spark``: ``outputs`` imports no other pipeline room.
"""

from __future__ import annotations

import base64
import html
import io
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pandas as pd  # type: ignore[import-untyped, unused-ignore]
from pyspark.sql import DataFrame, SparkSession

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "Section",
    "is_local_uri",
    "join_uri",
    "new_figure",
    "render_html",
    "warm_up_figures",
    "write_report",
]

REPORT_FILE = "report.html"
_HEADER = re.compile(r"<th>[^<]*</th>")

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 72em; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
p.text { white-space: pre-wrap; }
table.dataframe { border-collapse: collapse; font-size: .9em; margin: 1em 0; }
table.dataframe th, table.dataframe td { border: 1px solid #ccc; padding: .25em .6em;
       text-align: right; }
table.dataframe th { background: #f0f0f0; max-width: 9em; }
table.dataframe td { white-space: nowrap; }
table.dataframe td:first-child { text-align: left; }
div.table { overflow-x: auto; }
img.figure { max-width: 100%; display: block; margin: 1em 0; }
footer { margin-top: 3em; font-size: .8em; color: #777; }
"""


@dataclass(frozen=True)
class Section:
    """One titled part of a report: free text, an optional table and an optional figure."""

    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    figure: Figure | None = None


def new_figure(**options: Any) -> Figure:
    """A :class:`matplotlib.figure.Figure` drawn with the Agg backend (``options``: its
    constructor's, e.g. ``figsize``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(**options)


def warm_up_figures() -> None:
    """Import matplotlib and load its fonts (a third of a second, first time in a process), so
    that a job can have it done in a thread while it waits for Spark, before its first chart."""
    figure = new_figure(figsize=(1, 1))
    figure.text(0.5, 0.5, "0")
    figure.canvas.draw()


def _tick_format(span_s: float) -> str:
    """One tick format for the whole axis: times for a day or less, dates and times for two
    weeks or less, dates beyond (no mixing of dates and times on one axis)."""
    if span_s <= 600:
        return "%H:%M:%S"
    if span_s <= 86_400:
        return "%H:%M"
    if span_s <= 14 * 86_400:
        return "%m-%d %H:%M"
    return "%Y-%m-%d"


def time_axis(ax: Any, start_s: int, end_s: int, ylabel: str) -> None:
    """An x axis from ``start_s`` to ``end_s`` (epoch seconds, UTC) whose ticks all have one
    format (:func:`_tick_format`; the date goes into the axis label when the ticks show only
    times), and a labelled y axis of whole counts from 0: what every time-series chart of the
    reports uses."""
    from matplotlib.dates import AutoDateLocator, DateFormatter
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(start_s / 86_400, end_s / 86_400)
    ax.xaxis_date(UTC)
    ax.xaxis.set_major_locator(AutoDateLocator(tz=UTC, minticks=3, maxticks=9))  # type: ignore[no-untyped-call]
    fmt = _tick_format(end_s - start_s)
    ax.xaxis.set_major_formatter(DateFormatter(fmt, tz=UTC))  # type: ignore[no-untyped-call]
    first_day = datetime.fromtimestamp(start_s, UTC).strftime("%Y-%m-%d")
    last_day = datetime.fromtimestamp(max(start_s, end_s - 1), UTC).strftime("%Y-%m-%d")
    if fmt.startswith("%H"):
        day = first_day if first_day == last_day else f"{first_day} .. {last_day}"
        ax.set_xlabel(f"time (UTC) on {day}")
    elif fmt.startswith("%m"):
        ax.set_xlabel(f"time (UTC, month-day hour:minute), {first_day[:4]}")
    else:
        ax.set_xlabel("date (UTC)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def is_local_uri(uri: str) -> bool:
    """True for plain paths and ``file:`` URIs (written with Python's own file API)."""
    scheme = urlparse(uri).scheme
    # A one-letter scheme is a Windows drive letter, not a filesystem.
    return scheme in ("", "file") or len(scheme) == 1


def _local_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return Path(uri)


def join_uri(base: str, name: str) -> str:
    """``base/name`` for a path or a URI, without doubling the separator."""
    return base.rstrip("/") + "/" + name


def _figure_png(figure: Figure) -> str:
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def render_html(title: str, sections: Sequence[Section], outputs: Sequence[str] = ()) -> str:
    """The report as one HTML string (all text escaped, figures inlined as PNG data URIs)."""
    esc = html.escape
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
    ]
    for section in sections:
        parts.append(f"<section><h2>{esc(section.title)}</h2>")
        if section.text:
            parts.append(f'<p class="text">{esc(section.text)}</p>')
        if section.table is not None:
            if section.table.empty:
                parts.append("<p><em>(no rows)</em></p>")
            else:
                table = section.table.to_html(index=False, escape=True, border=0, na_rep="-")
                # Long snake_case headers may break after an underscore, not only at spaces.
                table = _HEADER.sub(lambda m: m[0].replace("_", "_<wbr>"), table)
                parts.append(f'<div class="table">{table}</div>')
        if section.figure is not None:
            alt = esc(section.title, quote=True)
            parts.append(
                f'<img class="figure" alt="{alt}" src="data:image/png;base64,'
                f'{_figure_png(section.figure)}">'
            )
        parts.append("</section>")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    footer = f"Generated by pidgate at {esc(generated)}."
    if outputs:
        footer += " Parquet outputs: " + ", ".join(esc(o) for o in outputs) + "."
    parts.append(f"<footer>{footer}</footer>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _active_session(parquet: Mapping[str, DataFrame]) -> SparkSession | None:
    for frame in parquet.values():
        return frame.sparkSession
    return SparkSession.getActiveSession()


def _write_remote(spark: SparkSession | None, uri: str, data: bytes) -> bool:
    """Write ``data`` to a Hadoop filesystem URI through the JVM; False if impossible."""
    jvm: Any = getattr(spark, "_jvm", None) if spark is not None else None
    jsc: Any = getattr(spark, "_jsc", None) if spark is not None else None
    if jvm is None or jsc is None:  # Spark Connect: no JVM gateway on the client
        return False
    hpath = jvm.org.apache.hadoop.fs.Path(uri)
    fs = hpath.getFileSystem(jsc.hadoopConfiguration())
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()
    return True


def write_report(
    output_dir: str,
    title: str,
    sections: Sequence[Section],
    parquet: Mapping[str, DataFrame],
) -> Path:
    """Write every DataFrame of ``parquet`` to ``<output_dir>/<name>.parquet`` (overwrite) and
    the report to ``<output_dir>/report.html``; return the path of the HTML file.

    Local paths and ``file:`` URIs get the HTML written directly. Other URIs (``hdfs://``,
    ``s3a://``, ...) get it through the Hadoop FileSystem of the active session; a local copy is
    also written to a temporary directory and that local path is returned (a message on stderr
    names both). Without a JVM gateway (Spark Connect) only the local copy is written, and the
    message says so.
    """
    outputs = [f"{name}.parquet" for name in parquet]
    # The tables are small, so each write is mostly Spark's per-job latency: they run side by
    # side (Spark takes jobs from several threads), and the report renders meanwhile.
    with ThreadPoolExecutor(max_workers=max(1, len(parquet))) as pool:
        writes = [
            pool.submit(frame.write.mode("overwrite").parquet, join_uri(output_dir, file_name))
            for frame, file_name in zip(parquet.values(), outputs, strict=True)
        ]
        document = render_html(title, sections, outputs).encode("utf-8")
        for write in writes:
            write.result()

    if is_local_uri(output_dir):
        local_dir = _local_path(output_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        html_path = local_dir / REPORT_FILE
        tmp = html_path.with_name(f".{REPORT_FILE}.tmp")
        tmp.write_bytes(document)
        tmp.replace(html_path)
        return html_path

    remote = join_uri(output_dir, REPORT_FILE)
    local_dir = Path(tempfile.mkdtemp(prefix="pidgate-report-"))
    html_path = local_dir / REPORT_FILE
    html_path.write_bytes(document)
    if _write_remote(_active_session(parquet), remote, document):
        print(f"report written to {remote} (local copy: {html_path})", file=sys.stderr)
    else:
        print(
            f"no Hadoop FileSystem available from this session; report written locally to "
            f"{html_path} instead of {remote}",
            file=sys.stderr,
        )
    return html_path
