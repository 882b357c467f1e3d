"""Cutting a Kafka byte stream into frames (int32 big-endian size + payload).

Owns ``FrameDecoder`` (incremental, bounded) and ``frame``. Frames are handed out *including*
their 4-byte size prefix so the proxy can forward them untouched. Must not import: asyncio,
socket, time, logging, structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections import deque

from pidgate.protocol.errors import FrameTooLargeError

_SIZE = struct.Struct(">i")
SIZE_PREFIX_BYTES = 4


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its int32 big-endian size."""
    return _SIZE.pack(len(payload)) + payload


class FrameDecoder:
    """Incremental frame splitter.

    Input chunks are kept in a deque and joined once per frame, so a large frame arriving in many
    reads costs one copy, and many small frames in one read are sliced out by offset (no
    re-copying of the remaining tail per frame). The size prefix is checked as soon as its 4
    bytes are present, before any of the body is buffered beyond what already arrived.
    """

    __slots__ = ("_buffered", "_chunks", "_frame_bytes", "_head_offset", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be >= 0, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._chunks: deque[bytes] = deque()
        self._head_offset = 0  # bytes of _chunks[0] already handed out
        self._buffered = 0  # bytes not yet handed out
        self._frame_bytes: int | None = None  # size of the frame being assembled, prefix included

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as part of a complete frame."""
        return self._buffered

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Add ``data`` and return every frame now complete (each with its size prefix)."""
        if (
            not self._buffered
            and type(data) is bytes
            and len(data) >= SIZE_PREFIX_BYTES
            and _SIZE.unpack_from(data)[0] + SIZE_PREFIX_BYTES == len(data)
            and len(data) - SIZE_PREFIX_BYTES <= self.max_frame_bytes
        ):
            # The common read: exactly one whole frame, nothing buffered before it.
            return [data]
        if data:
            chunk = data if isinstance(data, bytes) else bytes(data)
            self._chunks.append(chunk)
            self._buffered += len(chunk)
        frames: list[bytes] = []
        while True:
            if self._frame_bytes is None:
                if self._buffered < SIZE_PREFIX_BYTES:
                    break
                size = self._peek_size()
                if size < 0 or size > self.max_frame_bytes:
                    raise FrameTooLargeError(size, self.max_frame_bytes)
                self._frame_bytes = SIZE_PREFIX_BYTES + size
            if self._buffered < self._frame_bytes:
                break
            frames.append(self._take(self._frame_bytes))
            self._frame_bytes = None
        return frames

    def _peek_size(self) -> int:
        head = self._chunks[0]
        off = self._head_offset
        if len(head) - off >= SIZE_PREFIX_BYTES:
            return int(_SIZE.unpack_from(head, off)[0])
        # The prefix straddles chunks: gather its 4 bytes (tiny copy).
        prefix = bytearray()
        for i, chunk in enumerate(self._chunks):
            start = off if i == 0 else 0
            prefix += chunk[start : start + SIZE_PREFIX_BYTES - len(prefix)]
            if len(prefix) >= SIZE_PREFIX_BYTES:
                break
        return int(_SIZE.unpack_from(prefix, 0)[0])

    def _take(self, n: int) -> bytes:
        chunks = self._chunks
        head = chunks[0]
        off = self._head_offset
        self._buffered -= n
        avail = len(head) - off
        if avail >= n:
            # A chunk that is exactly one frame is handed out without a copy.
            out = head if off == 0 and avail == n else head[off : off + n]
            off += n
            if off == len(head):
                chunks.popleft()
                off = 0
            self._head_offset = off
            return out
        parts = [head[off:] if off else head]
        need = n - avail
        chunks.popleft()
        while need:
            chunk = chunks[0]
            if len(chunk) <= need:
                parts.append(chunk)
                need -= len(chunk)
                chunks.popleft()
            else:
                parts.append(chunk[:need])
                self._head_offset = need
                return b"".join(parts)
        self._head_offset = 0
        return b"".join(parts)
