"""Tests for pidgate.protocol.framing."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pidgate.protocol.errors import FrameTooLargeError
from pidgate.protocol.framing import FrameDecoder, frame


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
