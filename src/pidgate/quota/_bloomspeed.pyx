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
:func:`take_token` (``TokenBucket.try_take(1, now_ms)``, which admit_single takes in C).
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
from cpython.ref cimport PyObject
from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport INT64_MAX, int64_t, uint64_t

from pidgate.quota.bucket import TokenBucket

#: 105·2**32 (``bloom.UNIVERSAL_MODULUS``); positions are below it, so x + y fits in 64 bits.
cdef uint64_t _MODULUS = 105 * (<uint64_t>1 << 32)
cdef uint64_t _C1 = 0x87C37B91114253D5ULL
cdef uint64_t _C2 = 0x4CF5AD432745937FULL
#: The most hashes a shape of ``bloom`` can ask for (k = ceil(-log2(rate)), rate >= 1e-15);
#: a larger ``hash_count`` is refused rather than looped over.
cdef int _MAX_HASHES = 64
cdef int64_t _INT64_MAX = INT64_MAX
# A TokenBucket made field by field (a frozen dataclass with slots: its member descriptors set
# what __init__ would, without __post_init__'s checks, which _take_one's arithmetic keeps).
_new_bucket = object.__new__
_set_rate = TokenBucket.rate.__set__
_set_window_ms = TokenBucket.window_ms.__set__
_set_level = TokenBucket.level.__set__
_set_updated_ms = TokenBucket.updated_ms.__set__
# Results of find() that are not a serial (layered.ABSENT, layered.STALE).
cdef int64_t _ABSENT = -1
cdef int64_t _STALE = -2


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


cdef object _ready_state(object principals, object principal, int64_t now_ms):
    """The principal's ``TrackedPrincipal`` in the manager's table (an ``OrderedDict``, read as
    the dict it is), or None when it has none or its filter's expiry is due (``admit`` runs
    that first: it may drop the layers a shortcut would read)."""
    if not isinstance(principals, dict):
        raise TypeError("the manager's principals are not a dict")
    cdef PyObject* found = PyDict_GetItemWithError(principals, principal)
    if found is NULL or now_ms >= <int64_t>(<object>found).seen.next_check_ms:
        return None
    return <object>found


def admit_known(manager, principal, producer_ids, int64_t now_ms) -> bool:
    """``QuotaManager.admit_known_pure`` compiled (bound as ``QuotaManager.admit_known``): when
    every PID is where the manager's location cache says, in a fresh layer of ``principal``'s
    filter, touch those layers, mark the principal recently used and return True; otherwise
    return False having changed nothing (``admit`` decides)."""
    principals = manager._principals
    state = _ready_state(principals, principal, now_ms) if producer_ids else None
    if state is None:
        return False
    seen = state.seen
    cdef dict cache = manager._positions_cache
    cdef int64_t uid = seen.uid
    cdef array meta = seen._meta
    cdef int64_t first_serial = seen._first
    plan = seen.plan
    cdef int64_t window_ms = plan.window_ms
    cdef int64_t fresh_divisor = plan.fresh_divisor
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
    principals.move_to_end(principal)
    return True


def admit_single(manager, principal, producer_ids, int64_t now_ms):
    """``QuotaManager.admit_single``, the common case of ``admit``'s miss path compiled (the pure
    path has no such shortcut: its ``admit`` is the reference): one PID, not where the
    location cache says (``admit_known`` said no), of a principal with state whose expiry is
    not due and whose filter holds no layer restored off the ladder. Returns what ``admit``
    decides, having changed what it changes:

    * ``()``: a fresh layer holds the PID (it was not cached): touched and cached, admitted;
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
    principals = manager._principals
    state = _ready_state(principals, principal, now_ms)
    seen = None if state is None else state.seen
    if seen is None or seen._restored:
        return None
    producer_id = producer_ids[0]
    cdef int64_t pid = producer_id
    cdef int all_hashes = seen._max_hashes
    if all_hashes < 1 or all_hashes > _MAX_HASHES:
        raise ValueError(f"hash_count {all_hashes} is outside 1..{_MAX_HASHES}")
    cdef uint64_t pos[64]
    _positions(pid, all_hashes, pos)
    cdef array meta = seen._meta
    cdef Py_ssize_t rows = len(meta)
    cdef long long* row = meta.data.as_longlongs
    plan = seen.plan
    cdef int64_t window_ms = plan.window_ms
    cdef int64_t first_serial = seen._first
    bits = seen._bits
    cdef Py_buffer view
    cdef int64_t where
    cdef uint64_t nbits, m, offset, index
    cdef Py_ssize_t base
    cdef int i, k
    cdef int64_t window_num
    PyObject_GetBuffer(bits, &view, PyBUF_SIMPLE | PyBUF_WRITABLE)
    try:
        nbits = <uint64_t>len(bits)
        where = _find(
            <const unsigned char*>view.buf, nbits, row, rows, first_serial, pos, all_hashes,
            now_ms, window_ms, <int64_t>plan.fresh_divisor,
        )
        if where >= 0:
            # Known, in a fresh layer: touch it (find() saw it fresh, so the touch holds).
            base = <Py_ssize_t>((where - first_serial) * 6)
            if now_ms > row[base + 1]:
                row[base + 1] = now_ms
            principals.move_to_end(principal)
            _remember(manager, producer_id, seen.uid, where, now_ms)
            return ()
        if where != _ABSENT:
            return None  # stale: refreshed by the general path
        enforcement = state.enforcement
        if enforcement is not None:
            began_ms = enforcement.began_ms
            if began_ms <= now_ms < began_ms + enforcement.grace_ms:
                return None  # grandfathering may admit it free
        # The newest layer must take the PID as it is (LayeredBloomFilter.add's conditions).
        base = rows - 6
        if base < 0:
            return None
        m = <uint64_t>row[base + 4]
        k = <int>row[base + 5]
        window_num = <int64_t>plan.window_num
        if window_num < 1:
            raise ValueError(f"window_num {window_num} is below 1")
        # As add(): (now - start) * window_num >= window, last + window <= now; written
        # without a product or a sum that could leave 64 bits.
        if (
            row[base + 2] >= row[base + 3]
            or row[base] <= now_ms + (-window_ms // window_num)
            or row[base + 1] <= now_ms - window_ms
            or k != <int>plan.hash_count
            or m == 0
            or _MODULUS % m
        ):
            return None
        if k < 1 or k > all_hashes or m > nbits:
            raise ValueError("the newest layer does not fit the positions or the bits")
        bucket = _take_one(state.bucket, now_ms)
        if bucket is None:
            return None  # rejected: the general path says for how long
        state.bucket = bucket
        principals.move_to_end(principal)
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
        _remember(manager, producer_id, seen.uid, first_serial + base // 6, now_ms)
        return (producer_id,)
    finally:
        PyBuffer_Release(&view)


def take_token(bucket, int64_t now_ms):
    """``bucket.try_take(1, now_ms)``, as :func:`admit_single` takes a new PID's token."""
    return _take_one(bucket, now_ms)


cdef object _take_one(bucket, int64_t now_ms):
    """``TokenBucket.try_take(1, now_ms)`` without its two interpreted frames: the refill and
    the take in 64-bit integers, the new bucket built without ``__post_init__`` (its level is
    within bounds: the old one's, raised to at most the capacity, less a token it holds). A
    bucket whose figures do not fit 64 bits (or whose refill could leave them) is left to
    ``try_take`` itself."""
    if type(bucket) is not TokenBucket:
        return bucket.try_take(1, now_ms)
    cdef int64_t rate, window_ms, level, updated_ms, capacity, gap
    try:
        rate = bucket.rate
        window_ms = bucket.window_ms
        level = bucket.level
        updated_ms = bucket.updated_ms
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
    _set_rate(taken, bucket.rate)
    _set_window_ms(taken, bucket.window_ms)
    _set_level(taken, level - window_ms)
    _set_updated_ms(taken, updated_ms)
    return taken


cdef int _remember(manager, producer_id, uid, int64_t serial, int64_t now_ms) except -1:
    """``QuotaManager._remember_location``."""
    cdef dict cache = manager._positions_cache
    if len(cache) >= <Py_ssize_t>manager.positions_cache_size:
        cache.clear()
    cache[producer_id] = (uid, serial, now_ms)
    return 0
