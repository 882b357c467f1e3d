"""``read_split_view``: a split's lines read into a buffer the thread keeps, the same lines
``read_split`` gives, and nothing parsed from one split changed by reading the next. No Spark."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
from pidgate.pipeline.reading import eventfacts
from pidgate.pipeline.reading.eventfacts import (
    facts_of_lines,
    file_splits,
    parse_lines,
    read_split,
    read_split_view,
)


@pytest.fixture(scope="module")
def event_paths(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("events")
    generate_events(directory, GeneratorConfig(events=3000, seed=5, bad_line_every=400))
    # No newline at the end of the last file: its last line ends the file.
    (directory / "unterminated.jsonl").write_bytes(b'{"a": 1}\n\n{"b": 2}')
    with gzip.open(directory / "zipped.jsonl.gz", "wb") as out:
        out.write(b'{"ts_ms": 1, "event": "rejected", "principal": "p"}\n')
    return sorted(str(p) for p in directory.iterdir() if p.name != "_GENERATED.json")


@pytest.mark.parametrize("split_bytes", [1, 97, 4096, 1 << 25])
def test_every_split_reads_what_read_split_reads(event_paths: list[str], split_bytes: int) -> None:
    """One buffer for all splits, in turn: each view holds exactly read_split's bytes."""
    splits = file_splits(event_paths, split_bytes=split_bytes)
    for split in splits:
        view = read_split_view(*split)
        try:
            assert bytes(view) == read_split(*split), split
        finally:
            view.release()


def test_a_last_line_longer_than_the_room_kept_is_read_whole(
    event_paths: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventfacts, "_TAIL_BYTES", 8)
    long_line = json.dumps({"ts_ms": 1, "event": "rejected", "principal": "x" * 5000})
    path = tmp_path / "long.jsonl"
    path.write_text(f'{{"ts_ms": 1}}\n{long_line}\n{{"ts_ms": 2}}\n')
    for split in file_splits([str(path)], split_bytes=20):
        view = read_split_view(*split)
        assert bytes(view) == read_split(*split)
        view.release()


def test_the_buffer_is_kept_between_splits(event_paths: list[str]) -> None:
    """The point of it: the second split lands in the first one's memory, not in new pages."""
    first, second = file_splits(event_paths, split_bytes=4096)[:2]
    view = read_split_view(*first)
    owner = view.obj
    view.release()
    view = read_split_view(*second)
    assert view.obj is owner
    view.release()


def test_what_was_parsed_from_a_view_survives_the_next_read(event_paths: list[str]) -> None:
    """The facts of a split hold nothing of the buffer: reading the next splits into it
    changes none of them."""
    generated = [p for p in event_paths if p.endswith(".jsonl") and "unterminated" not in p]
    splits = file_splits(generated, split_bytes=8192)
    view = read_split_view(*splits[0])
    expected = facts_of_lines(bytes(view))
    facts = facts_of_lines(view)
    view.release()
    for split in splits[1:4]:
        read_split_view(*split).release()
    assert facts.num_rows and facts.equals(expected)


def test_a_table_pyarrow_parsed_from_a_view_outlives_the_buffer() -> None:
    """A line with an escape is not the compiled reader's: pyarrow parses it, and the table
    does not change when the buffer behind the view does."""
    escaped = b'{"ts_ms": 5, "event": "rejected", "principal": "caf\\u00e9"}\n'
    assert eventfacts.scan_lines(escaped) is None
    buffer = bytearray(escaped)
    parsed, bad = parse_lines(memoryview(buffer))
    buffer[:] = b"x" * len(buffer)
    assert bad == 0
    assert parsed.column("principal").to_pylist() == ["caf\u00e9"]


def test_a_compressed_file_is_read_whole(event_paths: list[str]) -> None:
    [zipped] = [p for p in event_paths if p.endswith(".gz")]
    view = read_split_view(zipped, 0, -1)
    assert bytes(view) == read_split(zipped, 0, -1)
    assert bytes(view).startswith(b'{"ts_ms": 1')
