# cython: language_level=3, boundscheck=True, wraparound=False, cdivision=False
"""The express lane (issue "native"): a client connection's steady state in C.

Owns ``ExpressLane``, the lane a ``connection.ClientConnection`` holds on the compiled path
(its ``get_buffer`` and ``buffer_updated`` are the connection's, so the event loop reads into
it first), and ``UpstreamReader``, what the broker side's ``data_received`` becomes. The
pure-Python twin is ``express.PureLane`` (no lane: every read takes the Python path);
``express`` chooses, as ``pidgate.protocol.native`` chose.

The lane takes a read only while the Python path holds nothing for its connection that the read
must meet first: no request waiting in the inbox, no reason to pause reading, no frame half
read, no batch withheld by the order rule, no SASL exchange sending bare tokens, a principal, a
Produce header seen before on this connection, and no response owed in a ``Slot`` but Produce
requests the broker still owes a plain answer (the lane takes those over as ring entries,
``_absorb``: a pipelining producer never drains them all). Then every complete frame of the read
must be a Produce with that same header (client_id and tagged fields: the correlation id aside),
acks other than 0, with room under ``max_in_flight_requests``, whose several PIDs (if any) the
quota finds known where it last saw them (``QuotaManager.admit_known``: admitted, nothing to
tell an observer) or whose one PID ``QuotaManager.admit_single`` decides (``admit_known``'s
question for that PID and the compiled shortcut of ``admit``'s miss path: a known PID, cached
or not, or a new one with a token). An admission of a new PID is told to the observers as
``Gatekeeper.tell_admitted_new`` tells them, with the request's summary made from a copy of its
body. The shortcut is asked last, once every frame passed the other checks, in frame order; if
it declines one (a grace period, no token, a layer to start, a stale copy) the whole read goes
to the Python path, whose quota finds the PIDs admitted before it known: every decision is told
once, and the bytes out are the Python path's. If every frame
is such a Produce, the frames are written to the broker in one ``write``, each is remembered in
a ring (correlation id, version, when sent) and counted in C counters; a partial frame at the
end goes to the Python reader. If any frame is not, the lane has written nothing and the whole
read goes to the Python path, which decides every frame as it would have without the lane (the
known-PID question asked again for the frames before the first that failed changes nothing
twice: it marks PIDs seen at the same instant). So the bytes out, the decisions and the errors
are the Python path's, read for read (``scripts/path_twins.py`` compares both paths over seeded
random and malformed programs).

The broker's answers to ring entries are matched in C (correlation id, and from Produce v10 no
KIP-951 node_endpoints to rewrite) and written to the client as they came, when every complete
frame of the read is such an answer; otherwise the ring is *spilled*: each entry becomes the
``Slot`` the Python path would have made, in front of any slot (ring entries are always older:
the lane only runs while no slot is owed), and the Python path takes the read. The C counters
reach ``TrafficObserver.produce_traffic`` when the metrics are collected, at a spill and when
the connection closes.

Safety: every read of a buffer is behind a bounds check on the same frame's size; the scratch
buffer is zeroed once consumed, as ``FrameReader`` does. Must not import: logging, structlog,
prometheus_client (the counters are handed to the metrics object, never written to it here).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t
from libc.string cimport memcmp, memmove, memset
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from pidgate._slots cimport field, put, slot_offset
from pidgate.protocol._speedups cimport _produce_response_passes, _walk

from dataclasses import MISSING, fields

from pidgate.protocol.framing import FrameDecoder, FrameReader
from pidgate.proxy.operations.metric_families import LATENCY_BUCKETS_S
from pidgate.proxy.quota_control.admission import UNREAD_REQUEST, ProduceContext
from pidgate.proxy.serving.ordering import ProduceOrderGuard
from pidgate.proxy.serving.records import PRODUCE, LazySummary, ProduceHeader, Slot
from pidgate.quota.manager import Admitted


#: Admitted's fields after the first two, with their defaults (read from the dataclass, so a
#: field added there is set here too).
_ADMITTED_DEFAULTS = tuple(
    (each.name, each.default) for each in fields(Admitted)[2:] if each.default is not MISSING
)
if len(_ADMITTED_DEFAULTS) != len(fields(Admitted)) - 2:
    raise TypeError("Admitted has a field past refreshed_count without a default")
cdef Py_ssize_t _ADMITTED_NEW = slot_offset(Admitted, "new_producer_ids")
cdef Py_ssize_t _ADMITTED_REFRESHED = slot_offset(Admitted, "refreshed_count")
#: (offset, default) of those fields' slots.
cdef tuple _ADMITTED_DEFAULT_SLOTS = tuple(
    (slot_offset(Admitted, name), default) for name, default in _ADMITTED_DEFAULTS
)
_new_object = object.__new__


cdef object _admitted(tuple new_producer_ids):
    """``Admitted(new_producer_ids, 0)``, its slots set where they are: the frozen dataclass's
    own ``__init__`` makes five interpreted ``object.__setattr__`` calls, half a microsecond
    per new PID (issue #25's profile), and setting them by name from here still looked each
    name up. Equal to the one ``__init__`` makes, field by field
    (tests/proxy/serving/test_express_choice.py)."""
    cdef Py_ssize_t offset
    decision = _new_object(Admitted)
    put(decision, _ADMITTED_NEW, new_producer_ids)
    put(decision, _ADMITTED_REFRESHED, 0)
    for offset, default in _ADMITTED_DEFAULT_SLOTS:
        put(decision, offset, default)
    return decision


def admitted(tuple new_producer_ids):
    """The decision the lane tells for ``new_producer_ids`` admitted as new (:func:`_admitted`)."""
    return _admitted(new_producer_ids)


def _unread():
    """The summary of a request no told observer reads (``Gatekeeper.reads_requests``)."""
    return UNREAD_REQUEST


#: Ring entries at most per connection (below ``max_in_flight_requests``, the Python path
#: takes the requests past it).
cdef int RING_CAPACITY = 1024
cdef int MAX_LATENCY_BUCKETS = 32
cdef int FIRST_WALKED_VERSION = 3
cdef int LAST_WALKED_VERSION = 13
cdef int FIRST_NODE_ENDPOINTS_VERSION = 10  # KIP-951: Produce responses may carry endpoints
cdef Py_ssize_t SIZE_PREFIX = 4
cdef Py_ssize_t REQUEST_HEADER_FIXED = 8  # api_key, api_version, correlation_id


cdef inline int16_t _i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<unsigned int>p[0] << 8) | p[1])


cdef inline int32_t _i32(const uint8_t* p) noexcept nogil:
    return <int32_t>(
        (<unsigned int>p[0] << 24) | (<unsigned int>p[1] << 16)
        | (<unsigned int>p[2] << 8) | <unsigned int>p[3]
    )


cdef inline int64_t _now_ns(int clock) noexcept nogil:
    cdef timespec now
    clock_gettime(clock, &now)
    return <int64_t>now.tv_sec * 1_000_000_000 + now.tv_nsec


cdef class _Fields:
    """Where the lane reads what it asks, every read, of its connection and the connection's
    objects (pidgate/_slots.pxd): the offsets of their classes' slots. A connection, reader,
    order guard or broker side of another class (one without slots: a stand-in in a test) is
    read by name: its class here stays None."""

    cdef type conn, reader, guard, header, decoder, upstream, context
    cdef Py_ssize_t conn_closed, conn_principal, conn_produce_header, conn_upstream
    cdef Py_ssize_t conn_transport, conn_last_active_s, conn_produce_context, conn_client_id
    cdef Py_ssize_t context_client_id
    cdef Py_ssize_t reader_big, reader_pending, guard_withheld
    cdef Py_ssize_t header_bytes, header_api_version, header_after_correlation_id
    cdef Py_ssize_t decoder_buffered, upstream_transport, upstream_decoder

    def __init__(self, type connection_class):
        try:
            self.conn_closed = slot_offset(connection_class, "closed")
            self.conn_principal = slot_offset(connection_class, "principal")
            self.conn_produce_header = slot_offset(connection_class, "_produce_header")
            self.conn_upstream = slot_offset(connection_class, "_upstream")
            self.conn_transport = slot_offset(connection_class, "transport")
            self.conn_last_active_s = slot_offset(connection_class, "last_active_s")
            self.conn_produce_context = slot_offset(connection_class, "_produce_context")
            self.conn_client_id = slot_offset(connection_class, "client_id")
            self.conn = connection_class
        except TypeError:
            self.conn = None
        self.reader_big = slot_offset(FrameReader, "_big")
        self.reader_pending = slot_offset(FrameReader, "_pending")
        self.reader = FrameReader
        self.guard_withheld = slot_offset(ProduceOrderGuard, "withheld")
        self.guard = ProduceOrderGuard
        self.header_bytes = slot_offset(ProduceHeader, "header_bytes")
        self.header_api_version = slot_offset(ProduceHeader, "api_version")
        self.header_after_correlation_id = slot_offset(ProduceHeader, "after_correlation_id")
        self.header = ProduceHeader
        self.decoder_buffered = slot_offset(FrameDecoder, "_buffered")
        self.decoder = FrameDecoder
        self.context_client_id = slot_offset(ProduceContext, "client_id")
        self.context = ProduceContext

    cdef learn_upstream(self, type upstream_class):
        """The broker side's class, met when the first one is made (the lane must not import
        its module: it builds on this one)."""
        if self.upstream is not None:
            return
        try:
            self.upstream_transport = slot_offset(upstream_class, "transport")
            self.upstream_decoder = slot_offset(upstream_class, "_decoder")
            self.upstream = upstream_class
        except TypeError:
            pass


cdef _Fields _fields = None


def read_fields(connection) -> dict:
    """What the lane reads of ``connection`` and its objects, read where it reads them: name
    to value (the tests hold each to ``getattr``)."""
    cdef _Fields at = _fields
    if at is None:
        raise RuntimeError("no express lane was made yet")
    me = connection
    upstream = field(me, at.conn, at.conn_upstream, "_upstream")
    header = field(me, at.conn, at.conn_produce_header, "_produce_header")
    reader = me._reader
    read = {
        "closed": field(me, at.conn, at.conn_closed, "closed"),
        "principal": field(me, at.conn, at.conn_principal, "principal"),
        "_produce_header": header,
        "_upstream": upstream,
        "transport": field(me, at.conn, at.conn_transport, "transport"),
        "last_active_s": field(me, at.conn, at.conn_last_active_s, "last_active_s"),
        "_reader._big": field(reader, at.reader, at.reader_big, "_big"),
        "_reader._pending": field(reader, at.reader, at.reader_pending, "_pending"),
        "_order_guard.withheld": field(
            me._order_guard, at.guard, at.guard_withheld, "withheld"
        ),
        "client_id": field(me, at.conn, at.conn_client_id, "client_id"),
    }
    context = read["_produce_context"] = field(
        me, at.conn, at.conn_produce_context, "_produce_context"
    )
    if context is not None:
        read["_produce_context.client_id"] = field(
            context, at.context, at.context_client_id, "client_id"
        )
    if header is not None:
        read["_produce_header.header_bytes"] = field(
            header, at.header, at.header_bytes, "header_bytes"
        )
        read["_produce_header.api_version"] = field(
            header, at.header, at.header_api_version, "api_version"
        )
        read["_produce_header.after_correlation_id"] = field(
            header, at.header, at.header_after_correlation_id, "after_correlation_id"
        )
    if upstream is not None:
        decoder = field(upstream, at.upstream, at.upstream_decoder, "_decoder")
        read["_upstream.transport"] = field(
            upstream, at.upstream, at.upstream_transport, "transport"
        )
        read["_upstream._decoder._buffered"] = field(
            decoder, at.decoder, at.decoder_buffered, "_buffered"
        )
    return read


cdef object _produce_context(object me, _Fields at):
    """``me.produce_context()``, its frame spared while the context made for the connection's
    client_id still holds (the observers are told a new PID's admission with it)."""
    context = field(me, at.conn, at.conn_produce_context, "_produce_context")
    if context is None or field(
        context, at.context, at.context_client_id, "client_id"
    ) != field(me, at.conn, at.conn_client_id, "client_id"):
        return me.produce_context()
    return context


cdef inline void _touch(object me, _Fields at) except *:
    """``me.last_active_s = time.monotonic()`` (its idle timeout starts again)."""
    now_s = _now_ns(CLOCK_MONOTONIC) / 1e9
    if type(me) is at.conn:
        put(me, at.conn_last_active_s, now_s)
    else:
        me.last_active_s = now_s


cdef class ExpressLane:
    """A ``ClientConnection``'s reads and its broker's answers while the connection's Python
    path holds nothing (see the module docstring)."""

    # The connection, and its objects that never change after its __init__. What changes
    # (closed, principal, transport, the upstream, the Produce header, last_active_s) is read
    # and written on the connection itself (``me`` below). The lane is an object the
    # connection holds, not its base class: a Python class built on an extension type loses
    # the interpreter's fast attribute access (3.11 specialises plain instances' __dict__
    # only), which cost the Python path 2 µs per new-PID request when we tried it.
    cdef object _conn
    cdef object _x_context, _x_slots, _x_awaiting, _x_inbox, _x_reader, _x_order_guard
    cdef object _x_sasl, _x_gate, _x_held
    # The context's Gatekeeper and its quota manager: made with the server, never replaced.
    cdef object _x_gatekeeper, _x_quota
    cdef _Fields _at
    #: Requests the lane took, since the connection opened (tests and the twin harness).
    cdef readonly long long requests_taken
    #: PIDs the lane's quota question admitted as new, since the connection opened (the same).
    cdef readonly long long new_producer_ids_admitted

    cdef object _scratch, _scratch_view
    cdef Py_ssize_t _max_frame_bytes, _max_response_frame_bytes
    cdef int _max_in_flight, _ring_capacity, _ring_head, _ring_count
    cdef int32_t* _ring_correlation_id
    cdef int16_t* _ring_version
    cdef int64_t* _ring_sent_ns
    # Counted here, handed to the metrics by flush_counters.
    cdef int64_t _requests, _request_bytes, _response_bytes
    cdef int _latency_bucket_count
    cdef double _latency_bounds_s[32]
    cdef int64_t _latency_counts[33]
    cdef double _latency_sum_s

    def __cinit__(self, *args):
        self._ring_correlation_id = NULL
        self._ring_version = NULL
        self._ring_sent_ns = NULL
        self._ring_capacity = 0

    def __dealloc__(self):
        PyMem_Free(self._ring_correlation_id)
        PyMem_Free(self._ring_version)
        PyMem_Free(self._ring_sent_ns)

    def __init__(self, connection):
        """``connection``'s lane; made at the end of its __init__ (its fields are set)."""
        cdef int index
        global _fields
        me = self._conn = connection
        if _fields is None:
            _fields = _Fields(type(connection))
        self._at = _fields
        proxy = me._settings.proxy
        cdef bytearray scratch = me._context.read_scratch
        cdef int max_in_flight_requests = proxy.max_in_flight_requests
        self._x_context = me._context
        self._x_slots = me._slots
        self._x_awaiting = me._awaiting_upstream
        self._x_inbox = me._inbox
        self._x_reader = me._reader
        self._x_order_guard = me._order_guard
        self._x_sasl = me._sasl
        self._x_gate = me._gate
        self._x_held = me._gate.held
        self._x_gatekeeper = me._context.gatekeeper
        self._x_quota = self._x_gatekeeper.quota
        self._scratch = scratch
        self._scratch_view = memoryview(scratch)
        self._max_in_flight = max_in_flight_requests
        self._max_frame_bytes = proxy.max_frame_bytes
        self._max_response_frame_bytes = proxy.max_response_frame_bytes
        capacity = min(max_in_flight_requests, RING_CAPACITY)
        self._ring_correlation_id = <int32_t*>PyMem_Malloc(capacity * sizeof(int32_t))
        self._ring_version = <int16_t*>PyMem_Malloc(capacity * sizeof(int16_t))
        self._ring_sent_ns = <int64_t*>PyMem_Malloc(capacity * sizeof(int64_t))
        if (
            self._ring_correlation_id is NULL
            or self._ring_version is NULL
            or self._ring_sent_ns is NULL
        ):
            raise MemoryError()
        self._ring_capacity = capacity
        if len(LATENCY_BUCKETS_S) > MAX_LATENCY_BUCKETS:
            raise ValueError("more latency buckets than the express lane counts")
        self._latency_bucket_count = len(LATENCY_BUCKETS_S)
        for index in range(self._latency_bucket_count):
            self._latency_bounds_s[index] = LATENCY_BUCKETS_S[index]
        self._clear_counters()

    cdef void _clear_counters(self) noexcept:
        cdef int index
        self._requests = self._request_bytes = self._response_bytes = 0
        self._latency_sum_s = 0.0
        for index in range(self._latency_bucket_count + 1):
            self._latency_counts[index] = 0

    # -- what the Python connection asks ------------------------------------------------------

    @property
    def express_owed(self):
        """Responses owed for requests the lane forwarded (not yet spilled)."""
        return self._ring_count

    def flush_counters(self):
        """Hand what the lane counted to the traffic metrics (at a scrape, a spill, a close)."""
        cdef int index
        if not (self._requests or self._request_bytes or self._response_bytes):
            return
        counts = [self._latency_counts[index] for index in range(self._latency_bucket_count + 1)]
        self._x_context.traffic.produce_traffic(
            self._requests, self._request_bytes, self._response_bytes, counts, self._latency_sum_s
        )
        self._clear_counters()

    def express_close(self):
        """The connection ended: count what was counted, forget what is owed."""
        self.flush_counters()
        self._ring_head = self._ring_count = 0

    def upstream_reader(self, upstream):
        """What ``upstream.data_received`` is on the compiled path."""
        self._at.learn_upstream(type(upstream))
        return UpstreamReader(self, upstream)

    def spill(self):
        """Every ring entry becomes the ``Slot`` the Python path would have made, oldest
        first, ahead of every slot already owed; the Python path owns them from here."""
        cdef int index, position
        if not self._ring_count:
            return
        spilled = []
        for index in range(self._ring_count):
            position = (self._ring_head + index) % self._ring_capacity
            slot = Slot(PRODUCE, self._ring_version[position], self._ring_correlation_id[position])
            slot.sent_ns = self._ring_sent_ns[position]
            spilled.append(slot)
        self._ring_head = self._ring_count = 0
        spilled.reverse()
        self._x_slots.extendleft(spilled)
        self._x_awaiting.extendleft(spilled)
        self.flush_counters()

    # -- asyncio.BufferedProtocol ------------------------------------------------------------

    def get_buffer(self, Py_ssize_t sizehint):
        # The shared scratch buffer unless the reader fills a big frame of its own (FrameReader).
        cdef _Fields at = self._at
        if field(self._x_reader, at.reader, at.reader_big, "_big") is None:
            return self._scratch_view
        return self._x_reader.get_buffer()

    def buffer_updated(self, Py_ssize_t nbytes):
        me = self._conn
        if self._lane_open(me) and self._take_read(me, nbytes):
            _touch(me, self._at)
            return
        if self._ring_count:
            self.spill()
        me._read(nbytes)

    # -- the lane -----------------------------------------------------------------------------

    cdef bint _lane_open(self, object me) except -1:
        """The Python path holds nothing that a read must meet first (or only Produce
        requests awaiting the broker's plain answer, which the lane takes over)."""
        cdef _Fields at = self._at
        if self._ring_capacity == 0 or self._x_held or self._x_inbox:
            return False
        if self._x_slots and self._ring_count:
            return False  # ring entries are older than every slot: never both (see _absorb)
        if (
            field(me, at.conn, at.conn_closed, "closed")
            or field(me, at.conn, at.conn_principal, "principal") is None
            or field(me, at.conn, at.conn_produce_header, "_produce_header") is None
        ):
            return False
        upstream = field(me, at.conn, at.conn_upstream, "_upstream")
        if upstream is None:
            return False
        reader = self._x_reader
        if (
            field(reader, at.reader, at.reader_big, "_big") is not None
            or field(reader, at.reader, at.reader_pending, "_pending")
        ):
            return False
        if field(self._x_order_guard, at.guard, at.guard_withheld, "withheld"):
            return False
        sasl = self._x_sasl
        if sasl is not None and sasl.expects_raw_tokens:
            return False
        transport = field(upstream, at.upstream, at.upstream_transport, "transport")
        return transport is not None and not transport.is_closing()

    cdef bint _absorb(self) except -1:
        """The Python path's slots become ring entries when every one of them is a Produce
        the broker still owes and nothing but its correlation id will be read of the answer
        (no response made here, no observer, no merge: what the lane itself would have left);
        False, changing nothing, otherwise. Without this a pipelining producer whose requests
        once went the Python way (a new PID, a read cut mid-frame) would never come back to
        the lane: its slots never all drain while it keeps requests in flight."""
        cdef int position, count
        slots = self._x_slots
        awaiting = self._x_awaiting
        count = len(slots)
        if self._ring_count or count != len(awaiting) or count > self._ring_capacity:
            return False  # _take_read's room already kept them under the capacity
        for slot, owed in zip(slots, awaiting):
            if (
                slot is not owed
                or slot.api_key != PRODUCE
                or slot.response is not None
                or slot.observe is not None
                or slot.merge is not None
            ):
                return False
        position = self._ring_head
        for slot in slots:
            self._ring_correlation_id[position] = slot.correlation_id
            self._ring_version[position] = slot.api_version
            self._ring_sent_ns[position] = slot.sent_ns
            position = (position + 1) % self._ring_capacity
        self._ring_count = count
        slots.clear()
        awaiting.clear()
        return True

    cdef bint _take_read(self, object me, Py_ssize_t nbytes) except -1:
        """True when the lane took the read (see the module docstring); False having written
        nothing, for the Python path to take all of it."""
        cdef bytearray scratch = self._scratch
        cdef const uint8_t* p
        cdef const uint8_t* frame
        cdef const uint8_t* after
        cdef Py_ssize_t pos = 0, size, header_bytes, after_bytes, taken_bytes = 0, tail
        cdef int taken = 0, room, api_version, position, owed
        cdef int16_t acks
        cdef int64_t now_ms = -1, sent_ns
        cdef list producer_ids
        cdef list singles = None  # (frame offset, size, PIDs) of frames with a PID not known
        if nbytes > PyByteArray_GET_SIZE(scratch) or nbytes < 0:
            return False
        p = <const uint8_t*>PyByteArray_AS_STRING(scratch)
        cdef _Fields at = self._at
        header = field(me, at.conn, at.conn_produce_header, "_produce_header")
        header_bytes = field(header, at.header, at.header_bytes, "header_bytes")
        header_version = field(header, at.header, at.header_api_version, "api_version")
        after_correlation_id = field(
            header, at.header, at.header_after_correlation_id, "after_correlation_id"
        )
        after_bytes = PyBytes_GET_SIZE(after_correlation_id)
        if header_bytes != REQUEST_HEADER_FIXED + after_bytes:
            return False
        after = <const uint8_t*>PyBytes_AS_STRING(after_correlation_id)
        # Ring entries first, then the Python path's slots (taken over below), then this read.
        owed = self._ring_count + len(self._x_slots)
        room = min(self._max_in_flight, self._ring_capacity) - owed
        while nbytes - pos >= SIZE_PREFIX:
            size = _i32(p + pos)
            if size < 0 or size > self._max_frame_bytes:
                return False  # the Python reader's error
            if nbytes - pos - SIZE_PREFIX < size:
                break  # a frame cut short: the Python reader keeps it
            if taken >= room or size < header_bytes:
                return False
            frame = p + pos + SIZE_PREFIX
            api_version = _i16(frame + 2)
            if (
                _i16(frame) != PRODUCE
                or api_version != header_version
                or memcmp(frame + REQUEST_HEADER_FIXED, after, after_bytes) != 0
                or not FIRST_WALKED_VERSION <= api_version <= LAST_WALKED_VERSION
            ):
                return False
            producer_ids = []
            acks = 0
            if _walk(frame + header_bytes, size - header_bytes, api_version, &acks, producer_ids):
                return False  # a shape the pure walk takes (or an error it raises)
            if acks == 0:
                return False
            if producer_ids:
                if now_ms < 0:
                    now_ms = _now_ns(CLOCK_REALTIME) // 1_000_000
                if len(producer_ids) == 1:
                    # admit_single answers a known PID as admit_known would: asked alone, last.
                    if singles is None:
                        singles = []
                    singles.append((pos + SIZE_PREFIX, size, producer_ids))
                elif not self._known(
                    field(me, at.conn, at.conn_principal, "principal"), producer_ids, now_ms
                ):
                    return False
            position = (self._ring_head + owed + taken) % self._ring_capacity
            self._ring_correlation_id[position] = _i32(frame + 4)
            self._ring_version[position] = <int16_t>api_version
            taken += 1
            taken_bytes += SIZE_PREFIX + size
            pos += SIZE_PREFIX + size
        if taken == 0:
            return False
        if self._x_slots and not self._absorb():
            return False
        if singles is not None and not self._admit_singles(me, singles, p, header_bytes, now_ms):
            return False
        # Every complete frame is the lane's: commit.
        sent_ns = _now_ns(CLOCK_MONOTONIC)
        for index in range(taken):
            position = (self._ring_head + self._ring_count + index) % self._ring_capacity
            self._ring_sent_ns[position] = sent_ns
        self._ring_count += taken
        self._requests += taken
        self.requests_taken += taken
        self._request_bytes += taken_bytes
        upstream = field(me, at.conn, at.conn_upstream, "_upstream")
        field(upstream, at.upstream, at.upstream_transport, "transport").write(
            PyBytes_FromStringAndSize(<const char*>p, pos)
        )
        tail = nbytes - pos
        if tail:
            # The start of a frame: to the front, for the Python reader (it zeroes it).
            memmove(<void*>p, p + pos, tail)
            memset(<void*>(p + tail), 0, pos)
            me._read(tail)
        else:
            memset(<void*>p, 0, nbytes)
        if self._ring_count + len(self._x_slots) >= self._max_in_flight:
            self._x_gate.pause("in_flight")
        return True

    cdef bint _known(self, object principal, list producer_ids, int64_t now_ms) except -1:
        """``Gatekeeper.admits_known`` without its Python frame: the quota's known-PID question
        (an error is the Python path's to meet again and report). ``admit_known`` takes any
        collection of PIDs: the walk's list, as it came."""
        self._x_gatekeeper.decided_at_ms = now_ms
        try:
            return bool(self._x_quota.admit_known(principal, producer_ids, now_ms))
        except Exception:
            return False

    cdef bint _admit_singles(
        self, object me, list singles, const uint8_t* p, Py_ssize_t header_bytes, int64_t now_ms
    ) except -1:
        """The frames with one PID, in order: ``QuotaManager.admit_single`` (``admit_known``'s
        question and the compiled shortcut of ``admit``'s miss path) decides each; an admission
        with a new PID is told to the observers as ``Gatekeeper`` would. False at the first it
        does not decide (a grace period, no token, a layer to start, a stale copy, an error):
        the whole read then goes to the Python path, which asks the quota again. PIDs admitted
        here before it are known by then, admitted with nothing to tell, so every decision is
        told once and the bytes out are the Python path's (the same new PID twice in one read:
        the second finds it cached)."""
        gatekeeper = self._x_gatekeeper
        quota = self._x_quota
        cdef _Fields at = self._at
        principal = field(me, at.conn, at.conn_principal, "principal")
        cdef Py_ssize_t offset, size
        context = None
        gatekeeper.decided_at_ms = now_ms
        for offset, size, producer_ids in singles:
            try:
                new_producer_ids = quota.admit_single(principal, producer_ids, now_ms)
            except Exception:
                return False  # the Python path meets it again and applies the failure policy
            if new_producer_ids is None:
                return False
            if new_producer_ids:
                self.new_producer_ids_admitted += len(new_producer_ids)
                if context is None:
                    context = _produce_context(me, at)
                if gatekeeper.reads_requests:
                    # A copy: the scratch buffer is zeroed once the read is consumed.
                    body = PyBytes_FromStringAndSize(
                        <const char*>(p + offset + header_bytes), size - header_bytes
                    )
                    summarize = LazySummary(memoryview(body), _i16(p + offset + 2))
                else:
                    summarize = _unread  # no told observer reads it: never asked
                gatekeeper.tell_admitted_new(context, _admitted(new_producer_ids), summarize)
        return True

    cdef bint _take_answers(self, object me, bytes data) except -1:
        """True when every complete frame of ``data`` answers the next ring entry and passes
        unchanged: written to the client as it came. False having changed nothing."""
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data), pos = 0, size, response_bytes = 0
        cdef int taken = 0, position = self._ring_head, version, bucket, index
        cdef int64_t now_ns
        cdef double latency_s
        while n - pos >= SIZE_PREFIX:
            size = _i32(p + pos)
            if size < 0 or size > self._max_response_frame_bytes:
                return False  # the Python decoder's error
            if n - pos - SIZE_PREFIX < size:
                break
            if taken >= self._ring_count or size < 4:
                return False
            if _i32(p + pos + SIZE_PREFIX) != self._ring_correlation_id[position]:
                return False
            version = self._ring_version[position]
            if version >= FIRST_NODE_ENDPOINTS_VERSION and (
                version > LAST_WALKED_VERSION
                or not _produce_response_passes(p + pos + SIZE_PREFIX, size, version)
            ):
                return False
            taken += 1
            position = (position + 1) % self._ring_capacity
            response_bytes += SIZE_PREFIX + size
            pos += SIZE_PREFIX + size
        if taken == 0:
            return False
        now_ns = _now_ns(CLOCK_MONOTONIC)
        for index in range(taken):
            position = (self._ring_head + index) % self._ring_capacity
            latency_s = (now_ns - self._ring_sent_ns[position]) / 1e9
            bucket = 0
            while bucket < self._latency_bucket_count and self._latency_bounds_s[bucket] < latency_s:
                bucket += 1
            self._latency_counts[bucket] += 1
            self._latency_sum_s += latency_s
        self._ring_head = (self._ring_head + taken) % self._ring_capacity
        self._ring_count -= taken
        self._response_bytes += response_bytes
        cdef _Fields at = self._at
        field(me, at.conn, at.conn_transport, "transport").write(
            data if pos == n else PyBytes_FromStringAndSize(<const char*>p, pos)
        )
        _touch(me, at)
        return True


cdef class UpstreamReader:
    """``data_received`` of a connection's broker side on the compiled path: answers to the
    lane's ring in C, everything else through ``UpstreamConnection.decode_and_pass``."""

    cdef ExpressLane lane
    cdef object upstream

    def __cinit__(self, ExpressLane lane, upstream):
        self.lane = lane
        self.upstream = upstream

    def __call__(self, data):
        cdef ExpressLane lane = self.lane
        cdef _Fields at = lane._at
        cdef Py_ssize_t n, pos
        upstream = self.upstream
        me = lane._conn
        if (
            lane._ring_count
            and type(data) is bytes
            and not lane._x_slots
            and not lane._x_inbox
            and not field(me, at.conn, at.conn_closed, "closed")
            and field(me, at.conn, at.conn_transport, "transport") is not None
            and not field(
                field(upstream, at.upstream, at.upstream_decoder, "_decoder"),
                at.decoder, at.decoder_buffered, "_buffered",
            )
            and lane._take_answers(me, data)
        ):
            n = PyBytes_GET_SIZE(data)
            pos = _answered_bytes(data, n)
            if pos < n:
                lane.spill()
                upstream.decode_and_pass(data[pos:])  # the start of a frame: kept
            if lane._ring_count + len(lane._x_slots) >= lane._max_in_flight:
                lane._x_gate.pause("in_flight")
            elif "in_flight" in lane._x_held:
                lane._x_gate.resume("in_flight")
            return
        if lane._ring_count:
            lane.spill()
        upstream.decode_and_pass(data)


cdef Py_ssize_t _answered_bytes(bytes data, Py_ssize_t n):
    """Where the complete frames of ``data`` end."""
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t pos = 0, size
    while n - pos >= SIZE_PREFIX:
        size = _i32(p + pos)
        if size < 0 or n - pos - SIZE_PREFIX < size:
            break
        pos += SIZE_PREFIX + size
    return pos
