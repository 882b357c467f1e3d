# cython: language_level=3, boundscheck=True, wraparound=False, cdivision=False
"""The per-request primitives compiled (issue "native"): the same functions as the pure-Python
ones in ``framing`` and ``produce``, with the same results and the same errors.

Owns ``cut_frames`` (the frame cutting of ``FrameReader``) and ``produce_acks_and_producer_ids``
(the Produce walk of the per-request path). Which one runs is chosen by
:mod:`pidgate.protocol.native`; nothing imports this module directly but that one and the tests.

Safety: every read goes through ``_byte``/``_i16``/``_i32``/``_i64`` below, which take the
buffer's length and are only called after a bounds check on the same line's offsets; a buffer
is held (``PyObject_GetBuffer``) for exactly the duration of a call. The Produce walk handles the
shapes every client sends (one- and two-byte varints, empty tagged-field sections, v2 record
batches); for anything else (a legacy batch, a long varint, tagged fields, and every malformed
request) it hands the whole request to the pure walk, which raises the error or returns the
result: so errors are identical by construction, and only the common shapes are twice-written
(the property test in tests/protocol/test_native.py compares both on random and broken input).

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any pidgate
package outside ``pidgate.protocol``.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_ND
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t

from pidgate.protocol.errors import FrameTooLargeError

cdef int FIRST_FLEXIBLE_VERSION = 9
cdef int FIRST_TOPIC_ID_VERSION = 13
cdef int FIRST_SUPPORTED_VERSION = 3
cdef int LAST_SUPPORTED_VERSION = 13
cdef Py_ssize_t BATCH_V2_HEADER_BYTES = 61
cdef Py_ssize_t MAGIC_OFFSET = 16
cdef Py_ssize_t BATCH_LENGTH_OFFSET = 8
cdef Py_ssize_t PRODUCER_ID_OFFSET = 43
cdef Py_ssize_t LOG_OVERHEAD_BYTES = 12
cdef Py_ssize_t MIN_BATCH_V2_LENGTH = 49  # BATCH_V2_HEADER_BYTES - LOG_OVERHEAD_BYTES

ctypedef unsigned int uint16_t_
ctypedef unsigned int uint32_t_
ctypedef unsigned long long uint64_t_

# Big-endian reads. Callers check ``pos + width <= end`` first; nothing here reads past it.

cdef inline int16_t _i16(const uint8_t* p, Py_ssize_t pos) noexcept nogil:
    return <int16_t>((<uint16_t_>p[pos] << 8) | p[pos + 1])

cdef inline int32_t _i32(const uint8_t* p, Py_ssize_t pos) noexcept nogil:
    return <int32_t>(
        (<uint32_t_>p[pos] << 24) | (<uint32_t_>p[pos + 1] << 16)
        | (<uint32_t_>p[pos + 2] << 8) | <uint32_t_>p[pos + 3]
    )

cdef inline int64_t _i64(const uint8_t* p, Py_ssize_t pos) noexcept nogil:
    cdef uint64_t_ value = 0
    cdef int i
    for i in range(8):
        value = (value << 8) | p[pos + i]
    return <int64_t>value


def cut_frames(data, Py_ssize_t max_frame_bytes):
    """Complete frames at the start of ``data`` (a bytes-like object), as the pure
    ``framing.cut_frames``: ``(frames, consumed_bytes, incomplete_frame_bytes)`` where frames
    include their size prefix, and ``incomplete_frame_bytes`` is the whole size (prefix
    included) of the frame that starts at ``consumed_bytes`` when its prefix is there, else 0.
    A negative or too large size prefix raises ``FrameTooLargeError``, as the pure one.
    Anything but a flat byte buffer (not a buffer, not contiguous, items wider than a byte,
    several dimensions) goes to the pure cut, whose ``len`` and slices count items."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef Py_ssize_t end, start = 0, size, total
    cdef list frames = []
    if not _flat_bytes(data, &view):
        return _pure_cut(data, max_frame_bytes)
    try:
        p = <const uint8_t*>view.buf
        end = view.len
        while end - start >= 4:
            size = _i32(p, start)
            if size < 0 or size > max_frame_bytes:
                raise FrameTooLargeError(size, max_frame_bytes)
            total = 4 + size
            if end - start < total:
                return frames, start, total
            frames.append(PyBytes_FromStringAndSize(<const char*>(p + start), total))
            start += total
        return frames, start, 0
    finally:
        PyBuffer_Release(&view)


cdef bint _flat_bytes(object data, Py_buffer* view) except -1:
    """True with ``view`` held when ``data`` is one flat run of single-byte items (bytes,
    bytearray, a contiguous one-dimensional byte memoryview): the only shape both paths read
    alike. False, holding nothing, for the rest: a pure function takes those whole (for a
    strided or multi-dimensional view the pure ones index items, not bytes)."""
    try:
        PyObject_GetBuffer(data, view, PyBUF_ND)  # contiguous only; shape and itemsize kept
    except (TypeError, BufferError):
        return False
    if view.ndim != 1 or view.itemsize != 1:
        PyBuffer_Release(view)
        return False
    return True


cdef object _pure_cut_frames = None


cdef object _pure_cut(object data, Py_ssize_t max_frame_bytes):
    global _pure_cut_frames
    if _pure_cut_frames is None:
        from pidgate.protocol.framing import pure_cut_frames

        _pure_cut_frames = pure_cut_frames
    return _pure_cut_frames(data, max_frame_bytes)


cdef object _pure_walk = None


cdef object _delegate(object body, object api_version):
    """The pure walk, for every shape this one does not take: it raises the error or returns
    the result, exactly as on the pure path."""
    global _pure_walk
    if _pure_walk is None:
        from pidgate.protocol.produce import pure_produce_acks_and_producer_ids

        _pure_walk = pure_produce_acks_and_producer_ids
    return _pure_walk(body, api_version)


def produce_acks_and_producer_ids(body, api_version):
    """(acks, producer ids) of a ProduceRequest body: ``produce.produce_acks_and_producer_ids``
    compiled (same results, same errors; see the module docstring)."""
    cdef Py_buffer view
    cdef int result, version
    cdef int16_t acks = 0
    cdef list producer_ids = []
    # Anything but a supported int (a bool, a huge int, another type) is the pure walk's to judge.
    if type(api_version) is not int or not (
        FIRST_SUPPORTED_VERSION <= api_version <= LAST_SUPPORTED_VERSION
    ):
        return _delegate(body, api_version)
    version = api_version
    if not _flat_bytes(body, &view):
        return _delegate(body, api_version)  # not a flat byte buffer: the pure walk says what
    try:
        result = _walk(<const uint8_t*>view.buf, view.len, version, &acks, producer_ids)
    finally:
        PyBuffer_Release(&view)
    if result != 0:
        return _delegate(body, api_version)
    return acks, tuple(producer_ids)


cdef int _walk(
    const uint8_t* p, Py_ssize_t end, int api_version, int16_t* acks_out, list producer_ids
) except -1:
    """0 when the request was walked; 1 when the pure walk must take it (unusual or broken)."""
    cdef bint flexible = api_version >= FIRST_FLEXIBLE_VERSION
    cdef bint by_id = api_version >= FIRST_TOPIC_ID_VERSION
    cdef Py_ssize_t pos = 0, count, topic_count, partition_count, size, stop, remaining, total
    cdef Py_ssize_t t, q
    cdef int b0, b1
    cdef int32_t batch_length
    cdef int64_t producer_id
    # transactional_id
    if flexible:
        if end < 1:
            return 1
        b0 = p[0]
        if b0 >= 0x80:
            return 1
        pos = 1 if b0 == 0 else b0
    else:
        if end < 2:
            return 1
        size = _i16(p, 0)
        if size < -1:
            return 1
        pos = 2 + (size if size > 0 else 0)
    if pos + 6 > end:
        return 1
    acks_out[0] = _i16(p, pos)
    pos += 6
    topic_count = _array_len(p, end, &pos, flexible)
    if topic_count < 0:
        return 1
    for t in range(topic_count):
        if by_id:
            pos += 16
        elif flexible:
            if pos >= end:
                return 1
            b0 = p[pos]
            if b0 >= 0x80:
                return 1
            pos += b0 if b0 else 1
        else:
            if pos + 2 > end:
                return 1
            size = _i16(p, pos)
            if size < -1:
                return 1
            pos += 2 + (size if size > 0 else 0)
        if pos > end:
            return 1
        partition_count = _array_len(p, end, &pos, flexible)
        if partition_count < 0:
            return 1
        for q in range(partition_count):
            if pos + 4 > end:
                return 1
            pos += 4
            if flexible:
                if pos >= end:
                    return 1
                b0 = p[pos]
                if b0 < 0x80:
                    size = b0 - 1
                    pos += 1
                else:
                    if pos + 1 >= end:
                        return 1
                    b1 = p[pos + 1]
                    if b1 >= 0x80:
                        return 1
                    size = ((b0 & 0x7F) | (b1 << 7)) - 1
                    pos += 2
            else:
                if pos + 4 > end:
                    return 1
                size = _i32(p, pos)
                pos += 4
                if size < -1:
                    return 1
            if size >= 0:
                stop = pos + size
                if stop > end:
                    return 1
                while pos < stop:
                    remaining = stop - pos
                    if remaining < BATCH_V2_HEADER_BYTES or p[pos + MAGIC_OFFSET] != 2:
                        return 1  # short or legacy batch: the pure walk has every rule for them
                    batch_length = _i32(p, pos + BATCH_LENGTH_OFFSET)
                    if batch_length < MIN_BATCH_V2_LENGTH:
                        return 1
                    total = LOG_OVERHEAD_BYTES + batch_length
                    if total > remaining:
                        return 1
                    producer_id = _i64(p, pos + PRODUCER_ID_OFFSET)
                    if producer_id != -1:
                        producer_ids.append(producer_id)
                    pos += total
                pos = stop
            if flexible:
                if pos >= end or p[pos] != 0:
                    return 1
                pos += 1
        if flexible:
            if pos >= end or p[pos] != 0:
                return 1
            pos += 1
    if flexible and (pos >= end or p[pos] != 0):
        return 1
    return 0


cdef inline Py_ssize_t _array_len(
    const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io, bint flexible
) noexcept nogil:
    """An array's element count (null = 0), or -1 when the pure walk must take it; checked as
    ``_wire.read_array_len``: a count the bytes left cannot hold is refused."""
    cdef Py_ssize_t pos = pos_io[0], n
    cdef int b0
    if flexible:
        if pos >= end:
            return -1
        b0 = p[pos]
        if b0 >= 0x80:
            return -1
        n = b0 - 1
        pos += 1
    else:
        if pos + 4 > end:
            return -1
        n = _i32(p, pos)
        pos += 4
        if n < -1:
            return -1
    if n > end - pos:
        return -1
    pos_io[0] = pos
    return n if n > 0 else 0


# --- Produce v10+ responses: forwarded as they are unless they carry top-level tags ----------

cdef int FIRST_PRODUCE_NODE_ENDPOINTS_VERSION = 10  # KIP-951
cdef int MAX_PRODUCE_WALK_VERSION = 13
cdef Py_ssize_t PRODUCE_PARTITION_FIXED_BYTES = 30  # index, error_code, base_offset, 2 x int64
cdef object _pure_passes = None


cdef inline bint _uvarint(
    const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io, uint64_t_* out
) noexcept nogil:
    """``_wire.read_uvarint``: False where it raises (truncated, or longer than 5 bytes)."""
    cdef Py_ssize_t pos = pos_io[0]
    cdef uint64_t_ value = 0
    cdef int shift = 0
    cdef uint8_t b
    while True:
        if pos < 0 or pos >= end:
            return False
        b = p[pos]
        pos += 1
        value |= (<uint64_t_>(b & 0x7F)) << shift
        if not b & 0x80:
            pos_io[0] = pos
            out[0] = value
            return True
        shift += 7
        if shift > 28:
            return False


cdef inline bint _skip_tags(const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io) noexcept nogil:
    """``_wire.skip_tagged_fields``: False where it raises."""
    cdef uint64_t_ count, i, tag, size
    if not _uvarint(p, end, pos_io, &count):
        return False
    i = 0
    while i < count:
        if not _uvarint(p, end, pos_io, &tag) or not _uvarint(p, end, pos_io, &size):
            return False
        if <uint64_t_>(end - pos_io[0]) < size or pos_io[0] > end:
            return False
        pos_io[0] += <Py_ssize_t>size
        i += 1
    return True


cdef inline bint _skip_section(const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io) noexcept nogil:
    """A tagged-field section as the pure walk reads it: one zero byte when empty (nearly
    always), else ``_skip_tags``."""
    if pos_io[0] < 0 or pos_io[0] >= end:
        return False
    if p[pos_io[0]] == 0:
        pos_io[0] += 1
        return True
    return _skip_tags(p, end, pos_io)


cdef inline bint _compact_count(
    const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io, Py_ssize_t* out
) noexcept nogil:
    """``_wire.read_array_len`` of a compact array: False where it raises."""
    cdef uint64_t_ raw
    cdef Py_ssize_t n
    if not _uvarint(p, end, pos_io, &raw):
        return False
    n = <Py_ssize_t>raw - 1
    if n > end - pos_io[0]:
        return False
    out[0] = n if n > 0 else 0
    return True


cdef inline bint _skip_compact_string(
    const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos_io
) noexcept nogil:
    """``endpoints._skip_compact_string``: a short length is skipped unchecked, as there (a
    string running past the end fails at the next read, on both paths)."""
    cdef Py_ssize_t pos = pos_io[0]
    cdef uint64_t_ n
    if pos < 0 or pos >= end:
        return False
    if p[pos] < 0x80:
        pos_io[0] = pos + (p[pos] if p[pos] else 1)
        return True
    if not _uvarint(p, end, pos_io, &n):
        return False
    if pos_io[0] > end or <uint64_t_>(end - pos_io[0]) < n - 1:
        return False
    pos_io[0] += <Py_ssize_t>(n - 1)
    return True


cdef bint _produce_response_passes(
    const uint8_t* p, Py_ssize_t end, int api_version
) noexcept nogil:
    cdef Py_ssize_t pos, topics, partitions, errors, t, q, e
    if end < 4:
        return False
    pos = 4  # correlation_id
    if not _skip_tags(p, end, &pos):  # response header v1
        return False
    p += pos  # the body, as the pure walk sees it (offsets from here)
    end -= pos
    pos = 0
    if not _compact_count(p, end, &pos, &topics):
        return False
    for t in range(topics):
        if api_version >= 13:
            if pos + 16 > end:
                return False
            pos += 16
        elif not _skip_compact_string(p, end, &pos):
            return False
        if not _compact_count(p, end, &pos, &partitions):
            return False
        for q in range(partitions):
            pos += PRODUCE_PARTITION_FIXED_BYTES
            if pos >= end:
                return False
            if p[pos] == 1:  # record_errors: empty
                pos += 1
            else:
                if not _compact_count(p, end, &pos, &errors):
                    return False
                for e in range(errors):
                    if pos + 4 > end:
                        return False
                    pos += 4
                    if not _skip_compact_string(p, end, &pos) or not _skip_tags(p, end, &pos):
                        return False
            if not _skip_compact_string(p, end, &pos):  # error_message
                return False
            if not _skip_section(p, end, &pos):  # the partition's (current_leader: tag 0)
                return False
        if not _skip_section(p, end, &pos):  # the topic's
            return False
    if pos + 4 > end:  # throttle_time_ms
        return False
    pos += 4
    return pos < end and p[pos] == 0


def produce_response_passes_unchanged(payload, api_version):
    """``endpoints.produce_response_passes_unchanged`` compiled: the same answer for every
    input (a flat byte buffer is walked here; anything else goes to the pure function)."""
    global _pure_passes
    cdef Py_buffer view
    cdef bint passes
    if type(api_version) is not int or not (
        FIRST_PRODUCE_NODE_ENDPOINTS_VERSION <= api_version <= MAX_PRODUCE_WALK_VERSION
    ):
        return False
    if not _flat_bytes(payload, &view):
        if _pure_passes is None:
            from pidgate.protocol.endpoints import pure_produce_response_passes_unchanged

            _pure_passes = pure_produce_response_passes_unchanged
        return _pure_passes(payload, api_version)
    try:
        passes = _produce_response_passes(<const uint8_t*>view.buf, view.len, api_version)
    finally:
        PyBuffer_Release(&view)
    return passes
