"""Tests for pidgate.protocol.framing."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidgate.protocol.errors import FrameTooLargeError
from pidgate.protocol.framing import Frame, FrameBufferBudget, FrameDecoder, FrameReader, frame


def test_frame_prefixes_size() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"


def test_many_frames_in_one_chunk_and_partial_tail() -> None:
    payloads = [bytes([i]) * i for i in range(50)]
    stream = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder(max_frame_bytes=1000)
    out = dec.feed(stream + b"\x00\x00")
    assert out == [frame(p) for p in payloads]
    assert dec.buffered_bytes == 2
    assert dec.feed(b"\x00\x02x") == []
    assert dec.buffered_bytes == 5
    assert dec.feed(b"y") == [frame(b"xy")]
    assert dec.buffered_bytes == 0


def test_split_at_every_byte_boundary() -> None:
    payloads = [b"hello", b"", b"x" * 300, b"world!"]
    stream = b"".join(frame(p) for p in payloads)
    expected = [frame(p) for p in payloads]
    for cut in range(len(stream) + 1):
        for cut2 in range(cut, len(stream) + 1, 7):
            dec = FrameDecoder(max_frame_bytes=1000)
            got = dec.feed(stream[:cut]) + dec.feed(stream[cut:cut2]) + dec.feed(stream[cut2:])
            assert got == expected, (cut, cut2)
            assert dec.buffered_bytes == 0


def test_byte_by_byte_with_memoryview_and_bytearray() -> None:
    payloads = [b"a" * 10, b"b" * 3]
    stream = b"".join(frame(p) for p in payloads)
    dec = FrameDecoder(max_frame_bytes=100)
    got: list[bytes] = []
    for i in range(len(stream)):
        piece = memoryview(stream)[i : i + 1] if i % 2 else bytearray(stream[i : i + 1])
        got += dec.feed(piece)
    assert got == [frame(p) for p in payloads]
    assert all(type(f) is bytes for f in got)


def test_large_frame_in_many_chunks() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    stream = frame(payload) + frame(b"tail")
    dec = FrameDecoder(max_frame_bytes=2 * 1024 * 1024)
    got: list[bytes] = []
    for i in range(0, len(stream), 65536):
        got += dec.feed(stream[i : i + 65536])
    assert got == [frame(payload), frame(b"tail")]


def test_oversize_rejected_before_body_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=100)
    assert dec.feed(frame(b"x" * 100)) == [frame(b"x" * 100)]
    with pytest.raises(FrameTooLargeError, match="101 bytes exceeds max_frame_bytes=100"):
        dec.feed(struct.pack(">i", 101))  # prefix only, no body yet


def test_oversize_prefix_split_across_chunks() -> None:
    dec = FrameDecoder(max_frame_bytes=10)
    assert dec.feed(b"\x00\x00") == []
    with pytest.raises(FrameTooLargeError):
        dec.feed(b"\x10\x00")


def test_negative_size_rejected() -> None:
    dec = FrameDecoder(max_frame_bytes=10)
    with pytest.raises(FrameTooLargeError, match="negative"):
        dec.feed(b"\xff\xff\xff\xff")


@given(
    payloads=st.lists(st.binary(max_size=40), max_size=10),
    cuts=st.lists(st.integers(min_value=0, max_value=500), max_size=8),
)
def test_property_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    dec = FrameDecoder(max_frame_bytes=40)
    got: list[bytes] = []
    for a, b in itertools.pairwise(points):
        got += dec.feed(stream[a:b])
    assert got == [frame(p) for p in payloads]
    assert dec.buffered_bytes == 0


def read_all(reader: FrameReader, data: bytes, max_read: int) -> list[Frame]:
    """What an event loop does with a BufferedProtocol: reads of at most ``max_read`` bytes
    into the buffer lent each time."""
    frames: list[Frame] = []
    while data:
        target = reader.get_buffer()
        assert len(target) > 0
        count = min(len(target), len(data), max_read)
        target[:count] = data[:count]
        data = data[count:]
        frames += reader.buffer_updated(count)
    return frames


@given(
    payloads=st.lists(st.binary(max_size=60), max_size=10),
    max_read=st.integers(min_value=1, max_value=80),
)
def test_reader_any_read_sizes_small_and_big_frames(payloads: list[bytes], max_read: int) -> None:
    # A 32-byte scratch: frames above 16 bytes take the big-frame path.
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader(max_frame_bytes=60, scratch=bytearray(32), budget=FrameBufferBudget(1000))
    got = read_all(reader, stream, max_read)
    assert [bytes(f) for f in got] == [frame(p) for p in payloads]
    assert reader.buffered_bytes == 0


def test_reader_fills_a_big_frame_in_place() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    scratch = bytearray(64 * 1024)
    reader = FrameReader(2 * 1024 * 1024, scratch, FrameBufferBudget(8 * 1024 * 1024))
    stream = frame(payload) + frame(b"tail")
    first = reader.get_buffer()
    first[:1000] = stream[:1000]
    assert reader.buffer_updated(1000) == []
    # The rest of the frame is read into a buffer of exactly the bytes still missing.
    rest = reader.get_buffer()
    assert len(rest) == len(payload) + 4 - 1000
    rest[:] = stream[1000 : len(payload) + 4]
    (big,) = reader.buffer_updated(len(rest))
    assert type(big) is bytearray and big == frame(payload)
    assert read_all(reader, frame(b"tail"), 100) == [frame(b"tail")]
    assert scratch == bytes(len(scratch)), "what was read is zeroed once consumed"


def test_reader_takes_big_buffers_from_the_budget_and_assembles_the_rest() -> None:
    budget = FrameBufferBudget(3000)
    scratch = bytearray(64)
    first, second, third = (FrameReader(10_000, scratch, budget) for _ in range(3))
    head = struct.pack(">i", 2000 - 4) + b"x" * 10
    # Announced, 10 bytes sent: the first frame's 2,000 bytes are set aside whole...
    assert read_all(first, head, 64) == [] and budget.available_bytes == 1000
    assert len(first.get_buffer()) == 2000 - 14
    # ... the second does not fit what is left: it keeps only what arrived.
    assert read_all(second, head, 64) == [] and budget.available_bytes == 1000
    assert second.buffered_bytes == 14 and len(second.get_buffer()) == 64
    # A connection that ends gives its buffer back; a finished frame gives it back too.
    first.release()
    assert budget.available_bytes == 3000
    body = frame(b"y" * 1996)
    assert [bytes(f) for f in read_all(third, body, 64)] == [body]
    assert budget.available_bytes == 3000
    assert [bytes(f) for f in read_all(second, b"x" * (2000 - 14), 64)] == [head + b"x" * 1986]


def test_reader_rejects_oversize_and_negative_sizes_before_keeping_anything() -> None:
    reader = FrameReader(100, bytearray(64), FrameBufferBudget(1000))
    with pytest.raises(FrameTooLargeError, match="101 bytes exceeds max_frame_bytes=100"):
        read_all(reader, struct.pack(">i", 101), 64)  # prefix only, no body yet
    assert reader.buffered_bytes == 0
    with pytest.raises(FrameTooLargeError, match="negative"):
        read_all(FrameReader(10, bytearray(64), FrameBufferBudget(1000)), b"\xff" * 4, 64)


def test_readers_sharing_a_scratch_keep_their_own_partial_frames() -> None:
    scratch = bytearray(64)
    budget = FrameBufferBudget(1000)
    one, two = FrameReader(1000, scratch, budget), FrameReader(1000, scratch, budget)
    stream_one = frame(b"a" * 20) + frame(b"b" * 10)
    stream_two = frame(b"c" * 5) + frame(b"d" * 200)
    got_one: list[Frame] = []
    got_two: list[Frame] = []
    for start in range(0, max(len(stream_one), len(stream_two)), 7):  # reads interleaved
        got_one += read_all(one, stream_one[start : start + 7], 7)
        got_two += read_all(two, stream_two[start : start + 7], 7)
    assert [bytes(f) for f in got_one] == [frame(b"a" * 20), frame(b"b" * 10)]
    assert [bytes(f) for f in got_two] == [frame(b"c" * 5), frame(b"d" * 200)]
