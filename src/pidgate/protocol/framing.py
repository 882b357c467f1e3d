"""Cutting a Kafka byte stream into frames (int32 big-endian size + payload).

Owns ``FrameDecoder`` (incremental, bounded: fed the bytes a plain protocol receives; the
broker side uses it), ``FrameReader`` with ``FrameBufferBudget`` (the same cut over buffers it
lends to ``asyncio.BufferedProtocol`` reads; the client side uses it, so big requests are read
in place), ``cut_frames`` (``FrameReader``'s cut loop: ``pure_cut_frames`` or its compiled twin
in ``_speedups``, as ``native`` chose) and ``frame``. Frames are handed out *including* their
4-byte size prefix so the proxy can forward them untouched. Must not import: asyncio, socket,
time, logging, structlog, prometheus_client, or any pidgate package outside ``protocol``.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable

from pidgate.protocol import native
from pidgate.protocol.errors import FrameTooLargeError

_SIZE = struct.Struct(">i")
SIZE_PREFIX_BYTES = 4

#: A frame as a ``FrameReader`` hands it out, size prefix included: bytes, or the bytearray a
#: big frame was read into.
Frame = bytes | bytearray


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its int32 big-endian size."""
    return _SIZE.pack(len(payload)) + payload


def pure_cut_frames(
    data: bytes | bytearray | memoryview, max_frame_bytes: int
) -> tuple[list[bytes], int, int]:
    """The complete frames at the start of ``data``: ``(frames, consumed_bytes,
    incomplete_frame_bytes)``. Frames include their size prefix; ``incomplete_frame_bytes`` is
    the whole size (prefix included) of the frame starting at ``consumed_bytes`` when its prefix
    is there, else 0. A negative or too large size prefix raises ``FrameTooLargeError``.
    ``cut_frames`` is this, or its compiled twin (``native``)."""
    end = len(data)
    frames: list[bytes] = []
    start = 0
    while end - start >= SIZE_PREFIX_BYTES:
        size = _SIZE.unpack_from(data, start)[0]
        if size < 0 or size > max_frame_bytes:
            raise FrameTooLargeError(size, max_frame_bytes)
        total = SIZE_PREFIX_BYTES + size
        if end - start < total:
            return frames, start, total
        frames.append(bytes(data[start : start + total]))
        start += total
    return frames, start, 0


cut_frames: Callable[[bytes | bytearray | memoryview, int], tuple[list[bytes], int, int]] = (
    native.compiled.cut_frames if native.compiled is not None else pure_cut_frames
)


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


class FrameBufferBudget:
    """How many bytes the ``FrameReader`` s of one event loop may set aside, together, for big
    frames still arriving. A frame's buffer is taken whole when its size prefix is read, before
    its body has arrived; the budget is what keeps clients that announce big frames and stall
    from making pidgate allocate what they announced (beyond it, frames are assembled from the
    reads, in memory that grows only with what arrives)."""

    __slots__ = ("available_bytes",)

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.available_bytes = budget_bytes

    def take(self, nbytes: int) -> bool:
        if nbytes > self.available_bytes:
            return False
        self.available_bytes -= nbytes
        return True

    def give(self, nbytes: int) -> None:
        self.available_bytes += nbytes


class FrameReader:
    """Cuts frames out of reads made into buffers it lends (``asyncio.BufferedProtocol``).

    Reads go into ``scratch``, one buffer shared by every reader of an event loop (a loop reads
    one transport at a time, and each read is handed over before the next buffer is lent);
    complete frames are copied out of it as bytes, the start of an incomplete frame is kept per
    reader, and the bytes read are zeroed once consumed (so nothing a client sent, credentials
    included, lingers in the shared buffer). An idle connection holds no buffer.

    A big frame (over ``big_frame_bytes``) gets a bytearray of its own size as soon as its
    prefix is read, if ``budget`` has room for it; the following reads fill it in place and it
    is handed out as is, so a big Produce request's body is never copied in user space (issue
    "lean": copying 1 MB frames was most of pidgate's CPU on big batches). Without room, the
    frame is assembled from the reads like a small one. ``release`` gives back what an
    unfinished frame holds (call it when the connection ends). The size prefix is checked
    before anything is kept.
    """

    __slots__ = (
        "_big",
        "_big_filled",
        "_pending",
        "big_frame_bytes",
        "budget",
        "max_frame_bytes",
        "scratch",
    )

    def __init__(
        self,
        max_frame_bytes: int,
        scratch: bytearray,
        budget: FrameBufferBudget,
        big_frame_bytes: int | None = None,
    ) -> None:
        if max_frame_bytes < 0:
            raise ValueError(f"max_frame_bytes must be >= 0, got {max_frame_bytes}")
        if len(scratch) < 2 * SIZE_PREFIX_BYTES:
            raise ValueError(f"scratch must hold at least 8 bytes, got {len(scratch)}")
        self.max_frame_bytes = max_frame_bytes
        self.scratch = scratch
        self.budget = budget
        #: Frames above this may get their own buffer (default: half the scratch buffer).
        self.big_frame_bytes = len(scratch) // 2 if big_frame_bytes is None else big_frame_bytes
        self._pending = bytearray()  # the start of an incomplete frame
        self._big: bytearray | None = None
        self._big_filled = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet handed out as part of a complete frame."""
        return self._big_filled if self._big is not None else len(self._pending)

    def get_buffer(self) -> memoryview:
        """Where the next read goes: the rest of a big frame, else the scratch buffer."""
        big = self._big
        if big is not None:
            return memoryview(big)[self._big_filled :]
        return memoryview(self.scratch)

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """``nbytes`` were read into the buffer last lent; every frame now complete."""
        big = self._big
        if big is not None:
            self._big_filled += nbytes
            if self._big_filled < len(big):
                return []
            self.release()
            return [big]
        scratch = self.scratch
        try:
            return self._cut(memoryview(scratch)[:nbytes])
        finally:
            scratch[:nbytes] = bytes(nbytes)

    def release(self) -> None:
        """Drop an unfinished big frame's buffer and give its bytes back to the budget."""
        big = self._big
        if big is not None:
            self._big, self._big_filled = None, 0
            self.budget.give(len(big))

    def _cut(self, read: memoryview) -> list[Frame]:
        pending = self._pending
        data: bytearray | memoryview
        if pending:
            pending += read
            data = pending
        else:
            data = read
        end = len(data)
        cut, start, incomplete_bytes = cut_frames(data, self.max_frame_bytes)
        frames: list[Frame] = cut  # type: ignore[assignment]  # list is invariant; read-only here
        if incomplete_bytes > self.big_frame_bytes and self.budget.take(incomplete_bytes):
            big = self._big = bytearray(incomplete_bytes)
            present = end - start
            big[:present] = data[start:end]
            self._big_filled = present
            start = end
        if data is pending:
            del pending[:start]
        elif start < end:
            pending += data[start:end]
        return frames
