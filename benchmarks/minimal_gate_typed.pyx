# cython: language_level=3, boundscheck=False, wraparound=False
"""``minimal_gate.py --typed``: the minimal gate's per-request work in typed Cython, to show
what a compiled per-connection path could reach on this machine (issue #25). Not a product.

The same work as ``minimal_gate.py`` (see there), done in C where the pure gate runs Python:
frames are cut from the bytes uvloop hands over (no copy unless a frame spans two reads, no
list of frames), the header's api_key, api_version and correlation_id and each response's
correlation_id are read from the buffer. With ``quota`` set, the lean Produce walk and the
quota decision are pidgate's own Python-level calls, as in ``minimal_gate.py --quota``: what
typing the connection alone would give, with the quota as it is. Built by ``minimal_gate.py``
with pyximport (Cython, a build requirement of pidgate, must be importable).
"""

import asyncio
import time
from collections import deque

from libc.time cimport timespec
from posix.time cimport clock_gettime, CLOCK_REALTIME

from pidgate.protocol.produce import produce_acks_and_producer_ids
from pidgate.quota._bloomspeed import admit_known

#: A ``QuotaManager`` (``--quota``), or None: no walk, no quota.
quota = None
#: ``--inline``: the walk in C here (the first batch's PID of the benchmark's one-batch Produce
#: v9 frames) and the compiled known-PID check called with it; ``admit`` only when it says no.
inline = False


cdef inline int _i32(const unsigned char* p) noexcept nogil:
    return <int>((<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16) | (<unsigned int>p[2] << 8) | p[3])


cdef inline int _i16(const unsigned char* p) noexcept nogil:
    return <short>((p[0] << 8) | p[1])


cdef inline Py_ssize_t _uvarint(const unsigned char* p, Py_ssize_t n, Py_ssize_t* pos) except -2:
    cdef Py_ssize_t value = 0
    cdef int shift = 0
    while True:
        if pos[0] >= n or shift > 28:
            raise ValueError("a varint past the body")
        value |= (p[pos[0]] & 0x7F) << shift
        pos[0] += 1
        if not p[pos[0] - 1] & 0x80:
            return value
        shift += 7


cdef long long _first_producer_id(const unsigned char* p, Py_ssize_t n) except? -3:
    """The producer id of the first batch of a Produce v9+ body (flexible), -1 when none."""
    cdef Py_ssize_t pos = 0, length
    length = _uvarint(p, n, &pos) - 1  # transactional_id
    if length > 0:
        pos += length
    pos += 6  # acks, timeout_ms
    if _uvarint(p, n, &pos) < 2:  # topics
        return -1
    pos += _uvarint(p, n, &pos) - 1  # topic name
    if _uvarint(p, n, &pos) < 2:  # partitions
        return -1
    pos += 4  # index
    length = _uvarint(p, n, &pos) - 1  # records
    if length < 61 or pos + 51 > n:
        return -1
    p += pos + 43  # base offset 8, length 4, epoch 4, magic 1, crc 4, attributes 2, delta 4, times 16
    return <long long>((<unsigned long long>_i32(p) << 32) | <unsigned int>_i32(p + 4))


cdef class _Side:
    """What both sides share: the bytes of a frame cut short, kept for the next read."""

    cdef bytearray buffer

    def __init__(self):
        self.buffer = bytearray()

    cdef object _source(self, bytes data):
        """What to cut frames from: ``data``, or the kept bytes with ``data`` appended."""
        if self.buffer:
            self.buffer += data
            return self.buffer
        return data

    def eof_received(self):
        return None

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass


cdef class Upstream(_Side):
    """The broker side: each response's correlation id checked against the oldest owed."""

    cdef Client client
    cdef object owed

    def __init__(self, Client client):
        _Side.__init__(self)
        self.client = client
        self.owed = client.owed

    def connection_made(self, transport):
        pass

    def data_received(self, bytes data):
        cdef const unsigned char[:] view = self._source(data)
        cdef Py_ssize_t n = view.shape[0], pos = 0, size
        owed = self.owed
        while n - pos >= 8:
            size = _i32(&view[pos])
            if size < 4 or n - pos - 4 < size:
                break
            if _i32(&view[pos + 4]) != owed.popleft():
                raise RuntimeError("a response out of order")
            pos += 4 + size
        view = None
        out = _taken(self.buffer, data, pos)
        if out:
            self.client.transport.write(out)

    def connection_lost(self, exc):
        self.client.transport.close()


cdef bytes _taken(bytearray buffer, bytes data, Py_ssize_t pos):
    """The ``pos`` bytes cut (``data`` itself when it was all of them); the rest kept."""
    if buffer:
        taken = bytes(buffer[:pos])
        del buffer[:pos]
        return taken
    if pos == len(data):
        return data
    buffer += data[pos:]
    return data[:pos]


cdef class Client(_Side):
    """The client side: each request's header read, Produce PIDs put to the quota."""

    cdef object host, port, upstream, owed
    cdef public object transport
    cdef list pending

    def __init__(self, host, port):
        _Side.__init__(self)
        self.host, self.port = host, port
        self.upstream = None
        self.pending = []
        self.owed = deque()

    def connection_made(self, transport):
        self.transport = transport
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self):
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, bytes data):
        cdef object source = self._source(data)
        cdef const unsigned char[:] view = source
        cdef Py_ssize_t n = view.shape[0], pos = 0, size, body_at, client_id_bytes
        cdef int api_version
        cdef long long producer_id, now_ms
        cdef timespec now
        owed = self.owed
        while n - pos >= 14:
            size = _i32(&view[pos])
            if size < 10 or n - pos - 4 < size:
                break
            if _i16(&view[pos + 4]) == 0 and quota is not None:  # Produce
                api_version = _i16(&view[pos + 6])
                client_id_bytes = _i16(&view[pos + 12])
                body_at = pos + 14 + max(client_id_bytes, 0) + (1 if api_version >= 9 else 0)
                if inline:
                    producer_id = _first_producer_id(&view[body_at], pos + 4 + size - body_at)
                    if producer_id >= 0:
                        clock_gettime(CLOCK_REALTIME, &now)
                        now_ms = now.tv_sec * 1000 + now.tv_nsec // 1_000_000
                        if not admit_known(quota, "benchmark", (producer_id,), now_ms):
                            quota.admit("benchmark", (producer_id,), now_ms)
                    owed.append(_i32(&view[pos + 8]))
                    pos += 4 + size
                    continue
                _, producer_ids = produce_acks_and_producer_ids(
                    memoryview(source)[body_at : pos + 4 + size], api_version
                )
                if producer_ids:
                    quota.admit("benchmark", producer_ids, time.time_ns() // 1_000_000)
            owed.append(_i32(&view[pos + 8]))
            pos += 4 + size
        view = None
        out = _taken(self.buffer, data, pos)
        if not out:
            return
        if self.upstream is None:
            self.pending.append(out)
        else:
            self.upstream.write(out)

    def connection_lost(self, exc):
        if self.upstream is not None:
            self.upstream.close()


async def serve(int listen_port, str host, int port):
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(host, port), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


def first_producer_id(const unsigned char[:] body):
    """``_first_producer_id`` for a check by hand against pidgate's walk."""
    return _first_producer_id(&body[0], body.shape[0])
