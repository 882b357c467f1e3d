# cython: language_level=3, boundscheck=True, wraparound=False
"""The compiled twin of the layered Bloom filter's per-PID arithmetic (issue "native").

Owns six functions, each giving exactly what its pure-Python original gives (the tests feed
both the same PIDs and layers): :func:`universal_positions` (``bloom.universal_positions``:
Murmur3 x64-128 of the PID's 8 big-endian bytes, then the double hashing mod 105·2**32),
:func:`find` (``LayeredBloomFilter.find`` for filters without restored off-ladder layers),
:func:`set_positions` (the bit writes of ``LayeredBloomFilter.add``), :func:`admit_known`
(``QuotaManager.admit_known_pure``: the known-PID check of every Produce),
:func:`admit_single` (``QuotaManager.admit``'s decision for one PID that is not cached, in its
common cases: the same decision and the same changes, else nothing changed) and
:func:`take_token` (``TokenBucket.try_take(1, now_ms)``, which admit_single takes in C);
:func:`slot_fields` shows the tests which slots those read at their offsets instead of by name.
Why: a new PID costs one hash, one scan of every live layer, one write and a token, ~18 µs of
interpreted big-integer arithmetic, bit indexing and bucket building per PID, the largest part
of the new-PID path (issue #25's profile); a known PID costs two interpreted frames, three
dict lookups and a layer touch on every Produce of every producer, the quota's share of the
known-PID path.

Pure like the rest of ``pidgate.quota``: no clocks, I/O or logging. Every bit read or written
is checked against the buffer's length first (an out-of-range index raises IndexError, as
bitarray itself would).
"""

from cpython.array cimport array
from cpython.dict cimport PyDict_GetItemWithError
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport INT64_MAX, int64_t, uint64_t

from pidgate._slots cimport field as _field, put as _put, slot as _slot, slot_offset as _slot_offset

from collections import OrderedDict

from pidgate.quota.bucket import TokenBucket


#: 105·2**32 (``bloom.UNIVERSAL_MODULUS``); positions are below it, so x + y fits in 64 bits.
cdef uint64_t _MODULUS = 105 * (<uint64_t>1 << 32)
cdef uint64_t _C1 = 0x87C37B91114253D5ULL
cdef uint64_t _C2 = 0x4CF5AD432745937FULL
#: The most hashes a shape of ``bloom`` can ask for (k = ceil(-log2(rate)), rate >= 1e-15);
#: a larger ``hash_count`` is refused rather than looped over.
cdef int _MAX_HASHES = 64
cdef int64_t _INT64_MAX = INT64_MAX
_new_bucket = object.__new__
_move_to_end = OrderedDict.move_to_end
# Results of find() that are not a serial (layered.ABSENT, layered.STALE).
cdef int64_t _ABSENT = -1
cdef int64_t _STALE = -2


# -- slots read where they are (pidgate/_slots.pxd) -----------------------------------------
#
# The quota's objects (TrackedPrincipal, LayeredBloomFilter, LayerPlan, TokenBucket,
# Enforcement) keep their fields in __slots__, and a new PID's admission reads some twenty of
# them: read at their offsets, not by name (cachegrind put ~40% of admit_single's and ~60% of
# admit_known's cold misses in the name lookups; README "Where a new PID's time goes").


cdef class _Slots:
    """The offsets of the slots this module reads, resolved once the quota's classes exist
    (they import this module, through ``quota.compiled``, so not at its own import)."""

    cdef type tracked, layered, plan, enforcement
    cdef Py_ssize_t tracked_seen, tracked_bucket, tracked_enforcement
    cdef Py_ssize_t seen_next_check_ms, seen_uid, seen_meta, seen_first, seen_plan
    cdef Py_ssize_t seen_restored, seen_max_hashes, seen_bits
    cdef Py_ssize_t plan_window_ms, plan_window_num, plan_fresh_divisor, plan_hash_count
    cdef Py_ssize_t enforcement_began_ms, enforcement_grace_ms
    cdef Py_ssize_t bucket_rate, bucket_window_ms, bucket_level, bucket_updated_ms

    def __init__(self):
        from pidgate.quota.grandfather import Enforcement
        from pidgate.quota.layer_plan import LayerPlan
        from pidgate.quota.layered import LayeredBloomFilter
        from pidgate.quota.principal_table import TrackedPrincipal

        self.tracked = TrackedPrincipal
        self.tracked_seen = _slot_offset(TrackedPrincipal, "seen")
        self.tracked_bucket = _slot_offset(TrackedPrincipal, "bucket")
        self.tracked_enforcement = _slot_offset(TrackedPrincipal, "enforcement")
        self.layered = LayeredBloomFilter
        self.seen_next_check_ms = _slot_offset(LayeredBloomFilter, "next_check_ms")
        self.seen_uid = _slot_offset(LayeredBloomFilter, "uid")
        self.seen_meta = _slot_offset(LayeredBloomFilter, "_meta")
        self.seen_first = _slot_offset(LayeredBloomFilter, "_first")
        self.seen_plan = _slot_offset(LayeredBloomFilter, "plan")
        self.seen_restored = _slot_offset(LayeredBloomFilter, "_restored")
        self.seen_max_hashes = _slot_offset(LayeredBloomFilter, "_max_hashes")
        self.seen_bits = _slot_offset(LayeredBloomFilter, "_bits")
        self.plan = LayerPlan
        self.plan_window_ms = _slot_offset(LayerPlan, "window_ms")
        self.plan_window_num = _slot_offset(LayerPlan, "window_num")
        self.plan_fresh_divisor = _slot_offset(LayerPlan, "fresh_divisor")
        self.plan_hash_count = _slot_offset(LayerPlan, "hash_count")
        self.enforcement = Enforcement
        self.enforcement_began_ms = _slot_offset(Enforcement, "began_ms")
        self.enforcement_grace_ms = _slot_offset(Enforcement, "grace_ms")
        self.bucket_rate = _slot_offset(TokenBucket, "rate")
        self.bucket_window_ms = _slot_offset(TokenBucket, "window_ms")
        self.bucket_level = _slot_offset(TokenBucket, "level")
        self.bucket_updated_ms = _slot_offset(TokenBucket, "updated_ms")


cdef _Slots _slots_of = None


cdef inline _Slots _slots():
    global _slots_of
    if _slots_of is None:
        _slots_of = _Slots()
    return _slots_of


def slot_fields(obj) -> dict:
    """What this module reads of ``obj`` (a TrackedPrincipal, LayeredBloomFilter, LayerPlan,
    Enforcement or TokenBucket), read where it reads it: name to value. For the tests, which
    hold each to ``getattr``."""
    cdef _Slots at = _slots()
    cdef dict names
    if type(obj) is at.tracked:
        names = {"seen": at.tracked_seen, "bucket": at.tracked_bucket,
                 "enforcement": at.tracked_enforcement}
    elif type(obj) is at.layered:
        names = {"next_check_ms": at.seen_next_check_ms, "uid": at.seen_uid,
                 "_meta": at.seen_meta, "_first": at.seen_first, "plan": at.seen_plan,
                 "_restored": at.seen_restored, "_max_hashes": at.seen_max_hashes,
                 "_bits": at.seen_bits}
    elif type(obj) is at.plan:
        names = {"window_ms": at.plan_window_ms, "window_num": at.plan_window_num,
                 "fresh_divisor": at.plan_fresh_divisor, "hash_count": at.plan_hash_count}
    elif type(obj) is at.enforcement:
        names = {"began_ms": at.enforcement_began_ms, "grace_ms": at.enforcement_grace_ms}
    elif type(obj) is TokenBucket:
        names = {"rate": at.bucket_rate, "window_ms": at.bucket_window_ms,
                 "level": at.bucket_level, "updated_ms": at.bucket_updated_ms}
    else:
        raise TypeError(f"no slots of {type(obj).__name__} are read here")
    return {name: _slot(obj, offset) for name, offset in names.items()}


cdef inline uint64_t _rotl64(uint64_t x, int r) noexcept nogil:
    return (x << r) | (x >> (64 - r))


cdef inline uint64_t _fmix64(uint64_t k) noexcept nogil:
    k ^= k >> 33
    k *= 0xFF51AFD7ED558CCDULL
    k ^= k >> 33
    k *= 0xC4CEB9FE1A85EC53ULL
    k ^= k >> 33
    return k


cdef inline void _murmur3_pid(int64_t producer_id, uint64_t* h1_out, uint64_t* h2_out) noexcept nogil:
    """MurmurHash3_x64_128, seed 0, of the PID's 8-byte big-endian two's-complement form (the
    key ``bloom_positions`` hashes). An 8-byte key has no 16-byte block: only the tail step
    (its bytes read little-endian into k1) and the finalization run."""
    cdef uint64_t v = <uint64_t>producer_id
    cdef uint64_t k1 = 0
    cdef int i
    # The big-endian bytes read little-endian: byte-reversed.
    for i in range(8):
        k1 = (k1 << 8) | ((v >> (8 * i)) & 0xFF)
    cdef uint64_t h1 = 0
    cdef uint64_t h2 = 0
    k1 *= _C1
    k1 = _rotl64(k1, 31)
    k1 *= _C2
    h1 ^= k1
    h1 ^= 8
    h2 ^= 8
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    h2 += h1
    h1_out[0] = h1
    h2_out[0] = h2


def murmur3_pid(producer_id: int) -> tuple[int, int]:
    """``mmh3.mmh3_x64_128_utupledigest(producer_id.to_bytes(8, "big", signed=True), 0)``."""
    cdef uint64_t h1, h2
    _murmur3_pid(producer_id, &h1, &h2)
    return h1, h2


cdef void _positions(int64_t producer_id, int hash_count, uint64_t* out) noexcept nogil:
    """The first ``hash_count`` (1..64, checked by the caller) universal positions."""
    cdef uint64_t h1, h2
    _murmur3_pid(producer_id, &h1, &h2)
    cdef uint64_t x = h1 % _MODULUS
    cdef uint64_t y = h2 % _MODULUS
    cdef int i
    out[0] = x
    for i in range(1, hash_count):
        x = (x + y) % _MODULUS
        y = (y + <uint64_t>i) % _MODULUS
        out[i] = x


def universal_positions(producer_id: int, int hash_count) -> tuple:
    """``bloom.universal_positions``: the first ``hash_count`` positions of the PID mod
    105·2**32."""
    if hash_count < 1 or hash_count > _MAX_HASHES:
        raise ValueError(f"hash_count {hash_count} is outside 1..{_MAX_HASHES}")
    cdef uint64_t pos[64]
    _positions(producer_id, hash_count, pos)
    return tuple([pos[i] for i in range(hash_count)])


cdef int _load_positions(tuple positions, uint64_t* out) except -1:
    cdef Py_ssize_t count = PyTuple_GET_SIZE(positions)
    cdef Py_ssize_t i
    if count < 1 or count > _MAX_HASHES:
        raise ValueError(f"{count} positions: expected 1..{_MAX_HASHES}")
    for i in range(count):
        out[i] = <object>PyTuple_GET_ITEM(positions, i)
    return <int>count


cdef inline bint _bit(const unsigned char* data, uint64_t nbits, uint64_t index) except -1:
    if index >= nbits:
        raise IndexError("bitarray index out of range")
    return (data[index >> 3] >> (7 - (index & 7))) & 1


cdef int64_t _find(
    const unsigned char* data,
    uint64_t nbits,
    const long long* row,
    Py_ssize_t rows,
    int64_t first_serial,
    const uint64_t* pos,
    int all_hashes,
    int64_t now_ms,
    int64_t window_ms,
    int64_t fresh_divisor,
) except -3:
    """``LayeredBloomFilter.find`` over the bits and rows as C arrays (see :func:`find`)."""
    if rows % 6:
        raise ValueError(f"meta holds {rows} integers, not whole rows of 6")
    # Fresh while (now - start) * divisor < window, i.e. start > fresh_after (as layered.find).
    cdef int64_t fresh_after = now_ms + (-window_ms // fresh_divisor)
    cdef int64_t dead_before = now_ms - window_ms
    cdef uint64_t offset = nbits
    cdef int64_t found = _ABSENT
    cdef bint fresh = True
    cdef Py_ssize_t base = rows - 6
    cdef uint64_t m
    cdef int k, i
    cdef bint held
    while base >= 0:
        m = <uint64_t>row[base + 4]
        if m == 0:  # a dropped layer's row
            base -= 6
            continue
        if m > offset:
            raise ValueError("meta's layer sizes exceed the bits held")
        offset -= m
        if fresh and row[base] <= fresh_after:
            # Layers start in time order: this one and all older ones are not fresh.
            if found != _ABSENT:
                return found
            fresh = False
        # A fresh layer is never dead (its last write >= its start > now - window).
        if fresh or row[base + 1] > dead_before:
            k = <int>row[base + 5]
            if k < 1 or k > all_hashes:
                raise ValueError(f"layer of {k} hashes, {all_hashes} positions given")
            held = True
            for i in range(k):
                if not _bit(data, nbits, offset + pos[i] % m):
                    held = False
                    break
            if held:
                if not fresh:
                    return _STALE
                found = first_serial + base // 6
        base -= 6
    return found


def find(
    bits,
    array meta,
    int64_t first_serial,
    tuple positions,
    int64_t now_ms,
    int64_t window_ms,
    int64_t fresh_divisor,
) -> int:
    """``LayeredBloomFilter.find`` over ``bits`` (every layer's bits end to end, big-endian
    bitarray) and ``meta`` (``array('q')``, six integers per layer, oldest first; the row
    fields as in ``layered``: start 0, last 1, bits 4, hashes 5), for a filter holding no
    restored off-ladder layer (the caller runs the pure scan for those)."""
    cdef uint64_t pos[64]
    cdef int all_hashes = _load_positions(positions, pos)
    cdef Py_buffer view
    PyObject_GetBuffer(bits, &view, PyBUF_SIMPLE)
    try:
        return _find(
            <const unsigned char*>view.buf,
            <uint64_t>len(bits),
            meta.data.as_longlongs,
            len(meta),
            first_serial,
            pos,
            all_hashes,
            now_ms,
            window_ms,
            fresh_divisor,
        )
    finally:
        PyBuffer_Release(&view)


def set_positions(bits, uint64_t offset, uint64_t bit_count, int hash_count, tuple positions):
    """Set the first ``hash_count`` of ``positions`` (reduced mod ``bit_count``) in the layer
    whose bits start at ``offset`` of ``bits``: the writes of ``LayeredBloomFilter.add``."""
    cdef uint64_t pos[64]
    cdef int count = _load_positions(positions, pos)
    if hash_count < 1 or hash_count > count:
        raise ValueError(f"{hash_count} hashes asked of {count} positions")
    if bit_count == 0:
        raise ValueError("a layer of 0 bits")
    cdef Py_buffer view
    PyObject_GetBuffer(bits, &view, PyBUF_SIMPLE | PyBUF_WRITABLE)
    cdef unsigned char* data = <unsigned char*>view.buf
    cdef uint64_t nbits = <uint64_t>len(bits)
    cdef uint64_t index
    cdef int i
    try:
        if offset + bit_count > nbits:
            raise IndexError("bitarray index out of range")
        for i in range(hash_count):
            index = offset + pos[i] % bit_count
            data[index >> 3] |= <unsigned char>(0x80 >> (index & 7))
    finally:
        PyBuffer_Release(&view)


cdef inline Py_ssize_t _fresh_row(
    dict cache, object producer_id, int64_t uid, int64_t first_serial, Py_ssize_t rows,
    const long long* row, int64_t now_ms, int64_t window_ms, int64_t fresh_divisor,
) except -2:
    """The row offset of the layer the location cache names for ``producer_id``, when that
    entry is this filter's (``uid``), not from the future, and its layer is held, live and
    fresh (``LayeredBloomFilter.is_fresh``); else -1."""
    cdef PyObject* entry = PyDict_GetItemWithError(cache, producer_id)
    if entry is NULL:
        return -1
    if type(<object>entry) is not tuple or len(<tuple>entry) != 3:
        raise ValueError("a location cache entry is not (uid, serial, ms cached)")
    cdef tuple where = <tuple>entry
    if <int64_t>where[0] != uid or now_ms < <int64_t>where[2]:
        return -1
    cdef int64_t serial = where[1]
    if serial < first_serial or serial - first_serial >= rows // 6:
        return -1
    cdef Py_ssize_t base = <Py_ssize_t>((serial - first_serial) * 6)
    # Live and fresh (is_fresh: last + window > now, (now - start) * divisor < window), written
    # without a product or a sum that could leave 64 bits for any row a state file restores.
    if row[base + 1] <= now_ms - window_ms or row[base] <= now_ms + (-window_ms // fresh_divisor):
        return -1
    return base


cdef object _ready_state(_Slots at, object principals, object principal, int64_t now_ms):
    """The principal's ``TrackedPrincipal`` in the manager's table (an ``OrderedDict``, read as
    the dict it is), or None when it has none or its filter's expiry is due (``admit`` runs
    that first: it may drop the layers a shortcut would read)."""
    if not isinstance(principals, dict):
        raise TypeError("the manager's principals are not a dict")
    cdef PyObject* found = PyDict_GetItemWithError(principals, principal)
    if found is NULL:
        return None
    state = <object>found
    seen = _field(state, at.tracked, at.tracked_seen, "seen")
    if now_ms >= <int64_t>_field(seen, at.layered, at.seen_next_check_ms, "next_check_ms"):
        return None
    return state


cdef inline void _mark_used(object principals, object principal) except *:
    """``principals.move_to_end(principal)``, the method taken from the class, not looked up."""
    if type(principals) is OrderedDict:
        _move_to_end(principals, principal)
    else:
        principals.move_to_end(principal)


def admit_known(manager, principal, producer_ids, int64_t now_ms) -> bool:
    """``QuotaManager.admit_known_pure`` compiled (bound as ``QuotaManager.admit_known``): when
    every PID is where the manager's location cache says, in a fresh layer of ``principal``'s
    filter, touch those layers, mark the principal recently used and return True; otherwise
    return False having changed nothing (``admit`` decides)."""
    cdef _Slots at = _slots()
    principals = manager._principals
    state = _ready_state(at, principals, principal, now_ms) if producer_ids else None
    if state is None:
        return False
    seen = _field(state, at.tracked, at.tracked_seen, "seen")
    cdef dict cache = manager._positions_cache
    cdef int64_t uid = _field(seen, at.layered, at.seen_uid, "uid")
    cdef array meta = _field(seen, at.layered, at.seen_meta, "_meta")
    cdef int64_t first_serial = _field(seen, at.layered, at.seen_first, "_first")
    plan = _field(seen, at.layered, at.seen_plan, "plan")
    cdef int64_t window_ms = _field(plan, at.plan, at.plan_window_ms, "window_ms")
    cdef int64_t fresh_divisor = _field(plan, at.plan, at.plan_fresh_divisor, "fresh_divisor")
    cdef Py_ssize_t rows = len(meta)
    cdef long long* row = meta.data.as_longlongs
    cdef Py_ssize_t base
    # Every PID first (nothing changes unless all are known), then the touches.
    for producer_id in producer_ids:
        if _fresh_row(
            cache, producer_id, uid, first_serial, rows, row, now_ms, window_ms, fresh_divisor
        ) < 0:
            return False
    for producer_id in producer_ids:
        base = _fresh_row(
            cache, producer_id, uid, first_serial, rows, row, now_ms, window_ms, fresh_divisor
        )
        if now_ms > row[base + 1]:
            row[base + 1] = now_ms
    _mark_used(principals, principal)
    return True


def admit_single(manager, principal, producer_ids, int64_t now_ms):
    """``QuotaManager.admit_single``, the common case of ``admit``'s miss path compiled (the pure
    path has no such shortcut: its ``admit`` is the reference): one PID of a principal with
    state whose expiry is not due. Returns what ``admit`` decides, having changed what it
    changes:

    * ``()``: the PID is where the location cache says, in a fresh layer: touched, admitted
      (``admit_known``'s answer and changes, so a caller with one PID asks this alone);
    * ``()``: a fresh layer holds the PID (it was not cached) and the filter holds no layer
      restored off the ladder: touched and cached, admitted;
    * ``(pid,)``: no live layer holds it, the principal is not in a grandfathering grace
      period, the bucket holds a token and the newest layer takes the PID without a roll: the
      token taken, the PID written and cached, admitted as new;
    * None: any other case (a stale copy to refresh, a grace period, no token, a layer to
      start, several PIDs...): nothing changed, ``admit``'s general path decides.
    """
    if (type(producer_ids) is not tuple and type(producer_ids) is not list) or len(
        producer_ids
    ) != 1:
        return None
    cdef _Slots at = _slots()
    principals = manager._principals
    state = _ready_state(at, principals, principal, now_ms)
    if state is None:
        return None
    seen = _field(state, at.tracked, at.tracked_seen, "seen")
    producer_id = producer_ids[0]
    cdef array meta = _field(seen, at.layered, at.seen_meta, "_meta")
    cdef Py_ssize_t rows = len(meta)
    cdef long long* row = meta.data.as_longlongs
    plan = _field(seen, at.layered, at.seen_plan, "plan")
    cdef int64_t window_ms = _field(plan, at.plan, at.plan_window_ms, "window_ms")
    cdef int64_t first_serial = _field(seen, at.layered, at.seen_first, "_first")
    cdef int64_t fresh_divisor = _field(plan, at.plan, at.plan_fresh_divisor, "fresh_divisor")
    # Where the location cache says, in a fresh layer: admit_known's case, decided as it does
    # (the express lane asks this alone for a frame with one PID: one call, not two).
    cdef Py_ssize_t base = _fresh_row(
        manager._positions_cache, producer_id,
        _field(seen, at.layered, at.seen_uid, "uid"),
        first_serial, rows, row, now_ms, window_ms, fresh_divisor,
    )
    if base >= 0:
        if now_ms > row[base + 1]:
            row[base + 1] = now_ms
        _mark_used(principals, principal)
        return ()
    if _field(seen, at.layered, at.seen_restored, "_restored"):
        return None
    cdef int64_t pid = producer_id
    cdef int all_hashes = _field(seen, at.layered, at.seen_max_hashes, "_max_hashes")
    if all_hashes < 1 or all_hashes > _MAX_HASHES:
        raise ValueError(f"hash_count {all_hashes} is outside 1..{_MAX_HASHES}")
    cdef uint64_t pos[64]
    _positions(pid, all_hashes, pos)
    bits = _field(seen, at.layered, at.seen_bits, "_bits")
    cdef Py_buffer view
    cdef int64_t where
    cdef uint64_t nbits, m, offset, index
    cdef int i, k
    cdef int64_t window_num, began_ms
    PyObject_GetBuffer(bits, &view, PyBUF_SIMPLE | PyBUF_WRITABLE)
    try:
        nbits = <uint64_t>len(bits)
        where = _find(
            <const unsigned char*>view.buf, nbits, row, rows, first_serial, pos, all_hashes,
            now_ms, window_ms, fresh_divisor,
        )
        if where >= 0:
            # Known, in a fresh layer: touch it (find() saw it fresh, so the touch holds).
            base = <Py_ssize_t>((where - first_serial) * 6)
            if now_ms > row[base + 1]:
                row[base + 1] = now_ms
            _mark_used(principals, principal)
            _remember(manager, producer_id, _field(seen, at.layered, at.seen_uid, "uid"), where, now_ms)
            return ()
        if where != _ABSENT:
            return None  # stale: refreshed by the general path
        enforcement = _field(state, at.tracked, at.tracked_enforcement, "enforcement")
        if enforcement is not None:
            began_ms = _field(enforcement, at.enforcement, at.enforcement_began_ms, "began_ms")
            if began_ms <= now_ms < began_ms + <int64_t>_field(
                enforcement, at.enforcement, at.enforcement_grace_ms, "grace_ms"
            ):
                return None  # grandfathering may admit it free
        # The newest layer must take the PID as it is (LayeredBloomFilter.add's conditions).
        base = rows - 6
        if base < 0:
            return None
        m = <uint64_t>row[base + 4]
        k = <int>row[base + 5]
        window_num = _field(plan, at.plan, at.plan_window_num, "window_num")
        if window_num < 1:
            raise ValueError(f"window_num {window_num} is below 1")
        # As add(): (now - start) * window_num >= window, last + window <= now; written
        # without a product or a sum that could leave 64 bits.
        if (
            row[base + 2] >= row[base + 3]
            or row[base] <= now_ms + (-window_ms // window_num)
            or row[base + 1] <= now_ms - window_ms
            or k != <int>_field(plan, at.plan, at.plan_hash_count, "hash_count")
            or m == 0
            or _MODULUS % m
        ):
            return None
        if k < 1 or k > all_hashes or m > nbits:
            raise ValueError("the newest layer does not fit the positions or the bits")
        bucket = _take_one(at, _field(state, at.tracked, at.tracked_bucket, "bucket"), now_ms)
        if bucket is None:
            return None  # rejected: the general path says for how long
        if type(state) is at.tracked:
            _put(state, at.tracked_bucket, bucket)
        else:
            state.bucket = bucket
        _mark_used(principals, principal)
        offset = nbits - m
        data = <unsigned char*>view.buf
        for i in range(k):
            index = offset + pos[i] % m
            if index >= nbits:
                raise IndexError("bitarray index out of range")
            data[index >> 3] |= <unsigned char>(0x80 >> (index & 7))
        row[base + 2] += 1
        if now_ms > row[base + 1]:
            row[base + 1] = now_ms
        _remember(
            manager, producer_id, _field(seen, at.layered, at.seen_uid, "uid"),
            first_serial + base // 6, now_ms,
        )
        return (producer_id,)
    finally:
        PyBuffer_Release(&view)


def take_token(bucket, int64_t now_ms):
    """``bucket.try_take(1, now_ms)``, as :func:`admit_single` takes a new PID's token."""
    return _take_one(_slots(), bucket, now_ms)


cdef object _take_one(_Slots at, bucket, int64_t now_ms):
    """``TokenBucket.try_take(1, now_ms)`` without its two interpreted frames: the refill and
    the take in 64-bit integers, the new bucket built without ``__post_init__`` (its level is
    within bounds: the old one's, raised to at most the capacity, less a token it holds), its
    slots set as their member descriptors would set them. A bucket whose figures do not fit 64
    bits (or whose refill could leave them) is left to ``try_take`` itself."""
    if type(bucket) is not TokenBucket:
        return bucket.try_take(1, now_ms)
    cdef int64_t rate, window_ms, level, updated_ms, capacity, gap
    rate_object = _slot(bucket, at.bucket_rate)
    window_object = _slot(bucket, at.bucket_window_ms)
    try:
        rate = rate_object
        window_ms = window_object
        level = _slot(bucket, at.bucket_level)
        updated_ms = _slot(bucket, at.bucket_updated_ms)
    except OverflowError:
        return bucket.try_take(1, now_ms)
    # The capacity, and the gap to it from ten windows of debt (the lowest level a bucket
    # holds), must fit: then nothing below leaves 64 bits.
    if rate < 0 or window_ms < 1 or rate > _INT64_MAX // 16 // window_ms:
        return bucket.try_take(1, now_ms)
    if updated_ms < -_INT64_MAX // 4 or now_ms < -_INT64_MAX // 4 or now_ms > _INT64_MAX // 4:
        return bucket.try_take(1, now_ms)  # so that now_ms - updated_ms fits
    capacity = rate * window_ms
    if level > capacity or level < -10 * capacity:
        return bucket.try_take(1, now_ms)  # not a bucket __post_init__ would have let through
    if now_ms > updated_ms:
        # min(capacity, level + elapsed * rate), the product taken only where it is below the
        # gap (elapsed * rate >= gap exactly when elapsed >= ceil(gap / rate)).
        gap = capacity - level
        if rate > 0:
            if now_ms - updated_ms >= (gap + rate - 1) // rate:
                level = capacity
            else:
                level += (now_ms - updated_ms) * rate
        updated_ms = now_ms
    if window_ms > level:
        return None
    taken = _new_bucket(TokenBucket)
    _put(taken, at.bucket_rate, rate_object)
    _put(taken, at.bucket_window_ms, window_object)
    _put(taken, at.bucket_level, level - window_ms)
    _put(taken, at.bucket_updated_ms, updated_ms)
    return taken


cdef int _remember(manager, producer_id, uid, int64_t serial, int64_t now_ms) except -1:
    """``QuotaManager._remember_location``."""
    cdef dict cache = manager._positions_cache
    if len(cache) >= <Py_ssize_t>manager.positions_cache_size:
        cache.clear()
    cache[producer_id] = (uid, serial, now_ms)
    return 0
