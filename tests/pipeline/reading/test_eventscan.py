"""The compiled event-line reader (``_eventscan``) gives exactly pyarrow's table, or gives up.

Given the same bytes, :func:`scan_lines` either returns None (the caller then parses with
pyarrow, and line by line for bad lines) or a table equal to what that path gives. Checked on
every event file the tests ship, on generated logs, on odd lines, and on random mutations.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidgate.pipeline.jobs.generate import GeneratorConfig, generate_events
from pidgate.pipeline.reading import eventfacts
from pidgate.pipeline.reading.eventfacts import LINE_SCHEMA, _parse_slowly, scan_lines

DATA = Path(__file__).parents[1] / "data"

pytestmark = pytest.mark.skipif(
    eventfacts._eventscan is None, reason="the compiled event reader is not built here"
)


def _reference(data: bytes) -> tuple[pa.Table, int]:
    """What parse_lines does without the compiled reader (before its required-field filter)."""
    try:
        table = pj.read_json(
            pa.BufferReader(data), read_options=eventfacts._READ, parse_options=eventfacts._PARSE
        )
        return table, 0
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return _parse_slowly(data.split(b"\n"))


def _assert_same_or_declined(data: bytes) -> bool:
    scanned = scan_lines(data)
    if scanned is None:
        return False
    reference, bad = _reference(data)
    assert bad == 0, "the compiled reader took a buffer holding a bad line"
    assert scanned.schema == LINE_SCHEMA
    assert scanned.combine_chunks().equals(reference.cast(LINE_SCHEMA).combine_chunks())
    return True


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.jsonl")))
def test_the_shipped_event_logs_are_read_exactly(name: str) -> None:
    assert _assert_same_or_declined((DATA / name).read_bytes())


def test_a_generated_log_is_read_exactly(tmp_path: Path) -> None:
    generate_events(tmp_path, GeneratorConfig(events=20_000, seed=5))
    for path in sorted(tmp_path.glob("*.jsonl")):
        assert _assert_same_or_declined(path.read_bytes()), path.name


LINE = (
    '{"ts_ms":1767225600000,"event":"rejected","principal":"User:a","producer_id":7,'
    '"producer_epoch":0,"client_id":null,"client_software":"x/1","topic":"t","partition":3,'
    '"node_id":1,"instance":"i:9092","throttle_ms":900,"tokens":0.25,"request_id":12,'
    '"transactional":false}'
)


@pytest.mark.parametrize(
    ("lines", "taken"),
    [
        ([LINE], True),
        ([LINE, "", LINE], True),  # blank lines are skipped
        (["{}"], True),  # a row of nulls: parse_lines counts it bad for its missing fields
        ([LINE.replace('"tokens":0.25', '"tokens":-1.5e-05')], True),
        ([LINE.replace('"producer_id":7', '"producer_id":-0')], True),
        ([LINE.replace('"producer_id":7', '"producer_id":7.0')], False),  # a float PID
        ([LINE.replace('"producer_id":7', '"producer_id":"7"')], False),
        ([LINE.replace('"principal":"User:a"', '"principal":5')], False),  # Spark's text
        ([LINE.replace('"principal":"User:a"', '"principal":"U\\"a"')], False),  # escape
        ([LINE.replace("User:a", "Us\u00e9r")], False),  # non-ASCII
        ([LINE + " "], False),
        ([LINE[:-1] + ',"producer_id":8}'], False),  # a repeated field
        ([LINE.replace('"topic":"t"', '"topic":{"a":1}')], False),
        ([LINE.replace('"producer_id":7', '"producer_id":1234567890123456789')], False),
        ([LINE.replace('"partition":3', '"partition":03')], False),
        ([LINE[:-9]], False),  # truncated
        (["[1,2]"], False),
        ([LINE + "\r"], False),
        ([" " + LINE], False),
    ],
)
def test_odd_lines_are_read_exactly_or_left_to_pyarrow(lines: list[str], taken: bool) -> None:
    data = ("\n".join(lines) + "\n").encode()
    assert _assert_same_or_declined(data) == taken


def test_no_trailing_newline_and_an_empty_buffer() -> None:
    assert _assert_same_or_declined(LINE.encode())
    empty = scan_lines(b"")
    assert empty is not None and empty.num_rows == 0


_MUTATION = st.tuples(
    st.integers(0, len(LINE) - 1), st.sampled_from(list(b'{}[]":,.-+eE0 9nulltrf\\a\n\x00\x80'))
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MUTATION, max_size=4), st.integers(1, 3))
def test_random_mutations_are_read_exactly_or_left_to_pyarrow(
    mutations: list[tuple[int, int]], copies: int
) -> None:
    """Bytes flipped, inserted or deleted anywhere in a real line: never a different table,
    never a crash or a read past the buffer."""
    line = bytearray(LINE.encode())
    for position, byte in mutations:
        action = (position + byte) % 3
        position %= len(line) or 1
        if action == 0 and line:
            line[position] = byte
        elif action == 1:
            line.insert(position, byte)
        elif line:
            del line[position]
    data = b"\n".join([bytes(line)] * copies)
    _assert_same_or_declined(data)


def test_random_generated_values_are_read_exactly() -> None:
    """Lines built by json.dumps: each field missing, null, of its own type or (now and then)
    of another JSON scalar kind; every line read exactly or left to pyarrow."""
    rng = random.Random(7)
    integers: list[object] = [None, 0, -3, 2**40, 2**62]
    strings: list[object] = [None, "", "abc", "User:CN=x,OU=y", "admitted_new"]
    anything = [*integers, *strings, True, False, 1.5, -2e-7]
    lines = []
    for _ in range(3000):
        record = {}
        for field in LINE_SCHEMA:
            if rng.random() < 0.9:
                own = integers if pa.types.is_integer(field.type) else strings
                record[field.name] = rng.choice(anything if rng.random() < 0.03 else own)
        record["tokens"] = rng.choice(anything)
        lines.append(json.dumps(record, separators=(",", ":") if rng.random() < 0.5 else None))
    taken = sum(_assert_same_or_declined(line.encode()) for line in lines)
    assert taken > 1000  # the shapes pidgate writes are read by the compiled reader
    assert taken < len(lines)  # and the others left to pyarrow


def test_the_pure_path_variable_leaves_the_reading_to_pyarrow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PIDGATE_PURE_PYTHON", "1")
    assert eventfacts._compiled_reader() is None
    monkeypatch.setenv("PIDGATE_PURE_PYTHON", "0")
    assert eventfacts._compiled_reader() is not None
    monkeypatch.setattr(eventfacts, "_eventscan", None)
    assert scan_lines(LINE.encode()) is None
    table, bad = eventfacts.parse_lines(LINE.encode())  # pyarrow reads it instead
    assert (table.num_rows, bad) == (1, 0)
    assert table["principal"].to_pylist() == ["User:a"]


@pytest.mark.parametrize("special", [b'"', b"\\", b"\x00", b"\x1f", b"\x80", b"\xff"])
def test_a_special_byte_at_every_place_of_a_string(special: bytes) -> None:
    """Strings are skipped eight bytes at a time: a quote, a backslash, a control or a
    non-ASCII byte at any place of a key or a value, of any length and alignment, ends or
    declines the string exactly where the byte-by-byte reading would. The bytes on either
    side of the eight-byte tests (space, DEL) are plain and read."""
    for length in range(0, 26):
        for offset in range(0, 3):  # shifts where the string starts against 8-byte words
            for place in range(length):
                value = bytearray(b"abcdefghijklmnopqrstuvwxyz"[:length])
                value[place] = special[0]
                for template in (
                    b'{"ts_ms":1,"event":"rejected","principal":"%s","pad":"%s"}',
                    b'{"ts_ms":1,"event":"rejected","%s":1,"pad":"%s"}',  # a key
                ):
                    line = template % (bytes(value), b"x" * offset)
                    assert not _assert_same_or_declined(line) or special == b'"'
    plain = b'{"ts_ms":1,"event":"rejected","principal":"a b\x7fc d\x7fe f g h i j k"}'
    assert _assert_same_or_declined(plain)
