"""The quota state as bytes: every principal's token bucket and Bloom layers, plus the quota
overrides set at run time, so that a restart changes nothing a client can observe.

Owns the state format and the rules for fitting saved state to the policy in force at load
time. Pure: no file I/O, no clock, no logging (``pidgate.proxy.quota_control.state_file`` writes
the file
atomically and logs). Times are absolute wall-clock milliseconds, so state saved by one process
means the same in the next.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package.

Format, version 4 (integers in the header big-endian). Versions 1 to 3 still load: versions 1
and 2 had one Bloom shape for all layers of a principal (version 1: and no enforcement, so no
grandfathering), read in that shape and never written again; before 4 no mode overrides::

    magic    8 bytes  b"PIDGSTAT"
    version  u16      1 to FORMAT_VERSION (4); a larger one is refused (UnsupportedStateVersion)
    flags    u16      0 (reserved; any other value is refused)
    raw_len  u64      length of the body before compression
    zlen     u64      length of the compressed body that follows
    body     zlen bytes, zlib-compressed
    crc32    u32      zlib.crc32 of every preceding byte (header and compressed body)

CRC-32 detects every error burst of up to 32 bits, so any single corrupted byte and any
truncation is reported as :class:`StateFormatError`, never loaded as a different state.

Body (``uv``: unsigned LEB128 varint; ``sv``: zigzag-encoded signed varint; ``str``: uv byte
length + UTF-8)::

    sv   dumped_at_ms
    uv   override count, then per override, sorted by user:
         str user ("<default>" for the default user), uv 0 (removed) | 1 then uv rate
    (version 4) uv mode override count, then per override, sorted by user:
         str user, uv 0 (removed) | 1 enforce | 2 observe
    uv   principal count, then per principal, idlest first:
         str principal
         uv  bucket rate, uv bucket window_ms, uv bucket level (token·ms), sv bucket updated_ms
         (versions 1, 2) uv Bloom bit_count, uv hash_count, uv expected_items: every layer's
         uv  layer count, then per layer, oldest first:
             (version >= 3) uv bit_count, uv hash_count, uv expected_items: this layer's shape
             sv start_ms, uv last_write_ms - start_ms, uv inserted_count,
             uv encoding, then the bits:
                0 raw:    ceil(bit_count / 8) bytes, BloomFilter.to_bytes() form
                1 sparse: uv n, then n little-endian u16 gaps between set-bit indices
                2 sparse: uv n, then n little-endian u32 gaps
                (the first gap is the first index; later gaps are >= 1)
         (version >= 2) when enforcement began, :mod:`pidgate.quota.grandfather`:
         uv  0 (none) | 1 frontier | 2 learning | 3 pending | 4 off, and unless 0:
             sv began_ms, uv grace_ms, sv frontier (-1: none), str reason
         A pending enforcement (saved before the frontier probe answered) loads as learning.

Loading fits the saved state to the *current* policy (:func:`load_state`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import accumulate
from types import MappingProxyType

from bitarray import bitarray

from .bloom import BloomShape
from .bucket import TokenBucket
from .grandfather import FRONTIER, LEARNING, OFF, PENDING, Enforcement, GrandfatherMode
from .layered import LayerPlan, LayerState
from .manager import PrincipalRecord, QuotaManager
from .policy import QuotaPolicy

__all__ = [
    "DEFAULT_USER",
    "FORMAT_VERSION",
    "MAGIC",
    "LoadReport",
    "QuotaOverrides",
    "StateFormatError",
    "StateSnapshot",
    "UnsupportedStateVersion",
    "assemble_state",
    "decode_state",
    "dump_state",
    "encode_principals",
    "encode_state",
    "load_state",
    "snapshot_state",
]

MAGIC = b"PIDGSTAT"
FORMAT_VERSION = 4
#: Versions before 3 saved one Bloom shape per principal, shared by all its layers.
_SHARED_SHAPE_VERSIONS = (1, 2)
_ENFORCEMENT_MODES: tuple[GrandfatherMode | None, ...] = (
    None,
    FRONTIER,
    LEARNING,
    PENDING,
    OFF,
)
DEFAULT_USER = "<default>"  # the user-default entity, as kafka-configs prints it
#: A mode override's tag: removed, enforce, observe.
_MODE_TAGS: tuple[bool | None, ...] = (None, False, True)

_HEADER = struct.Struct(">8sHHQQ")
_CRC = struct.Struct(">I")
_RAW, _SPARSE16, _SPARSE32 = 0, 1, 2
# Refuse absurd shapes before allocating bits for them (2**32 bits = 512 MiB per layer).
_MAX_BIT_COUNT = 2**32


class StateFormatError(ValueError):
    """The bytes are not a state this version can load: not a state file, corrupt, truncated,
    or from a newer format. The message says which."""


class UnsupportedStateVersion(StateFormatError):
    """A state written by a newer format version (e.g. after a downgrade)."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"state format version {version} is newer than this pidgate reads ({FORMAT_VERSION})"
        )
        self.version = version


# -- quota overrides ----------------------------------------------------------------------


def _check_override(user: object, rate: object) -> None:
    if not isinstance(user, str) or not user:
        raise ValueError(f"override users must be non-empty strings, got {user!r}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 0):
        raise ValueError(f"producer_ids_rate override of {user!r} must be None or an int >= 0")


class QuotaOverrides(Mapping[str, int | None]):
    """``producer_ids_rate`` set at run time (AlterClientQuotas), keyed like
    ``QuotaPolicy.user_producer_ids_rates`` by user name, with :data:`DEFAULT_USER` for the
    user-default entity. A value of None records that the entity's rate was *removed*: the user
    falls back to the default rate (for :data:`DEFAULT_USER`: users without their own rate are
    unlimited), whatever the configuration file says. Immutable; overrides win over the file.

    ``modes``: ``producer_ids_observe`` set at run time, keyed the same way: True observe,
    False enforce, None removed (the user falls back to the default user's mode, the default
    user to enforce). Not part of the mapping (it maps rates)."""

    __slots__ = ("_rates", "modes")

    def __init__(
        self,
        rates: Mapping[str, int | None] | Iterable[tuple[str, int | None]] = (),
        modes: Mapping[str, bool | None] | None = None,
    ) -> None:
        items = dict(rates)
        for user, rate in items.items():
            _check_override(user, rate)
        self._rates: Mapping[str, int | None] = MappingProxyType(items)
        mode_items = dict(modes or {})
        for user, observe in mode_items.items():
            if not isinstance(user, str) or not user or not isinstance(observe, bool | None):
                raise ValueError(f"mode override of {user!r} must be True, False or None")
        self.modes: Mapping[str, bool | None] = MappingProxyType(mode_items)

    def __getitem__(self, user: str) -> int | None:
        return self._rates[user]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __hash__(self) -> int:
        return hash((frozenset(self._rates.items()), frozenset(self.modes.items())))

    def __repr__(self) -> str:
        if self.modes:
            return f"QuotaOverrides({dict(self._rates)!r}, modes={dict(self.modes)!r})"
        return f"QuotaOverrides({dict(self._rates)!r})"

    def with_rate(self, user: str, rate: int | None) -> QuotaOverrides:
        """These overrides with ``user``'s rate set (None: removed)."""
        return QuotaOverrides({**self._rates, user: rate}, self.modes)

    def apply_to(self, policy: QuotaPolicy) -> QuotaPolicy:
        """``policy`` (from the configuration) with these overrides on top."""
        policy = _apply_modes(policy, self.modes)
        if not self._rates:
            return policy
        users = dict(policy.user_producer_ids_rates)
        default = policy.default_producer_ids_rate
        for user, rate in self._rates.items():
            if user == DEFAULT_USER:
                default = rate
            elif rate is None:
                users.pop(user, None)
            else:
                users[user] = rate
        return replace(policy, default_producer_ids_rate=default, user_producer_ids_rates=users)


def _apply_modes(policy: QuotaPolicy, modes: Mapping[str, bool | None]) -> QuotaPolicy:
    if not modes:
        return policy
    users = dict(policy.user_observe)
    default = policy.default_observe
    for user, observe in modes.items():
        if user == DEFAULT_USER:
            default = observe
        elif observe is None:
            users.pop(user, None)
        else:
            users[user] = observe
    return replace(policy, default_observe=default, user_observe=users)


# -- snapshot and report ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The decoded content of a state: what was saved, before fitting it to a policy."""

    dumped_at_ms: int
    overrides: QuotaOverrides
    principals: tuple[PrincipalRecord, ...]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What :func:`load_state` kept and dropped, for the startup log line."""

    dumped_at_ms: int
    overrides: QuotaOverrides = field(default_factory=QuotaOverrides)
    principals_saved: int = 0
    principals_restored: int = 0
    layers_restored: int = 0
    layers_expired: int = 0
    principals_unlimited: int = 0  # dropped: unlimited under the current policy
    principals_idle: int = 0  # dropped: no live layer left and a full bucket (as expire())
    #: Principals / layers kept in a shape the current policy would not build (saved under
    #: another false-positive rate, or by a version before 3): read in their own shape as
    #: before, never written again; new layers get the current policy's shape.
    principals_reshaped: int = 0
    layers_reshaped: int = 0
    principals_evicted: int = 0  # dropped to honour max_principals / max_total_bits


# -- dump -----------------------------------------------------------------------------------


def snapshot_state(
    manager: QuotaManager, now_ms: int, overrides: QuotaOverrides | None = None
) -> StateSnapshot:
    """A copy of ``manager``'s state (the fast half of :func:`dump_state`: call it on the event
    loop, then :func:`encode_state` may run in a worker thread)."""
    return StateSnapshot(
        now_ms, QuotaOverrides() if overrides is None else overrides, manager.export()
    )


def dump_state(
    manager: QuotaManager, now_ms: int, overrides: QuotaOverrides | None = None
) -> bytes:
    """The state of ``manager`` and the run-time ``overrides`` at ``now_ms``, as bytes."""
    return encode_state(snapshot_state(manager, now_ms, overrides))


class _Writer:
    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out = bytearray()

    def uv(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"cannot encode {value} as unsigned")
        out = self._out
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)

    def sv(self, value: int) -> None:
        self.uv(value * 2 if value >= 0 else -value * 2 - 1)

    def text(self, value: str) -> None:
        data = value.encode("utf-8", "surrogatepass")
        self.uv(len(data))
        self._out += data

    def raw(self, data: bytes) -> None:
        self._out += data

    def getvalue(self) -> bytes:
        return bytes(self._out)


def _write_bits(w: _Writer, bit_count: int, data: bytes) -> None:
    bits = bitarray(endian="big")
    bits.frombytes(data)
    set_count = bits.count(1)
    width = 2 if bit_count <= 0x10000 else 4
    if set_count * width + 3 >= len(data):
        w.uv(_RAW)
        w.raw(data)
        return
    indexes = list(bits.search(1))
    gaps = [b - a for a, b in zip([0, *indexes], indexes, strict=False)]
    w.uv(_SPARSE16 if width == 2 else _SPARSE32)
    w.uv(len(gaps))
    w.raw(struct.pack(f"<{len(gaps)}{'H' if width == 2 else 'I'}", *gaps))


def encode_state(snapshot: StateSnapshot) -> bytes:
    """``snapshot`` in the format described in the module docstring."""
    return assemble_state(
        snapshot.dumped_at_ms,
        snapshot.overrides,
        len(snapshot.principals),
        encode_principals(snapshot.principals),
    )


def encode_principals(records: Iterable[PrincipalRecord]) -> bytes:
    """``records`` as they follow their count in a state body. A saver may encode its
    principals a step at a time and join the parts (``assemble_state``): the steps' records are
    then garbage at once instead of all held until the end."""
    w = _Writer()
    for record in records:
        bucket = record.bucket
        w.text(record.principal)
        w.uv(bucket.rate)
        w.uv(bucket.window_ms)
        w.uv(max(0, bucket.level))  # a fleet debt (bucket.debit) is kept as empty
        w.sv(bucket.updated_ms)
        w.uv(len(record.layers))
        for layer in record.layers:
            shape = layer.shape
            w.uv(shape.bit_count)
            w.uv(shape.hash_count)
            w.uv(shape.expected_items)
            w.sv(layer.start_ms)
            w.uv(layer.last_write_ms - layer.start_ms)
            w.uv(layer.inserted_count)
            _write_bits(w, shape.bit_count, layer.bits)
        enforcement = record.enforcement
        if enforcement is None:
            w.uv(0)
        else:
            w.uv(_ENFORCEMENT_MODES.index(enforcement.mode))
            w.sv(enforcement.began_ms)
            w.uv(enforcement.grace_ms)
            w.sv(-1 if enforcement.frontier is None else enforcement.frontier)
            w.text(enforcement.reason)
    return w.getvalue()


def assemble_state(
    dumped_at_ms: int, overrides: QuotaOverrides, principal_count: int, principals: bytes
) -> bytes:
    """A whole state from its parts: ``principals`` is ``principal_count`` records as
    ``encode_principals`` wrote them (one call's output, or several joined)."""
    w = _Writer()
    w.sv(dumped_at_ms)
    w.uv(len(overrides))
    for user in sorted(overrides):
        rate = overrides[user]
        w.text(user)
        if rate is None:
            w.uv(0)
        else:
            w.uv(1)
            w.uv(rate)
    w.uv(len(overrides.modes))
    for user in sorted(overrides.modes):
        w.text(user)
        w.uv(_MODE_TAGS.index(overrides.modes[user]))
    w.uv(principal_count)
    w.raw(principals)
    body = w.getvalue()
    compressed = zlib.compress(body, 6)
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(body), len(compressed)) + compressed
    return head + _CRC.pack(zlib.crc32(head))


# -- load -----------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("_data", "_pos")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def uv(self) -> int:
        data, pos = self._data, self._pos
        value = shift = 0
        while True:
            if pos >= len(data):
                raise StateFormatError("body ends inside a number")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 70:
                raise StateFormatError("number longer than 10 bytes")
        self._pos = pos
        return value

    def sv(self) -> int:
        value = self.uv()
        return value >> 1 if not value & 1 else -((value + 1) >> 1)

    def raw(self, n: int) -> bytes:
        end = self._pos + n
        if end > len(self._data):
            raise StateFormatError(f"body ends inside a {n}-byte field")
        out = self._data[self._pos : end]
        self._pos = end
        return out

    def text(self) -> str:
        try:
            return self.raw(self.uv()).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise StateFormatError(f"a name is not valid UTF-8: {exc}") from None

    @property
    def at_end(self) -> bool:
        return self._pos == len(self._data)


def _read_bits(r: _Reader, bit_count: int) -> bytes:
    encoding = r.uv()
    if encoding == _RAW:
        return r.raw((bit_count + 7) // 8)
    if encoding not in (_SPARSE16, _SPARSE32):
        raise StateFormatError(f"unknown layer encoding {encoding}")
    count = r.uv()
    width, code = (2, "H") if encoding == _SPARSE16 else (4, "I")
    gaps = struct.unpack(f"<{count}{code}", r.raw(count * width))
    if any(gap == 0 for gap in gaps[1:]):
        raise StateFormatError("sparse layer repeats a bit index")
    indexes = list(accumulate(gaps))
    if indexes and indexes[-1] >= bit_count:
        raise StateFormatError(f"sparse layer sets bit {indexes[-1]} of {bit_count}")
    bits = bitarray(bit_count, endian="big")
    bits.setall(0)
    bits[indexes] = 1
    return bits.tobytes()


def _unwrap(data: bytes) -> tuple[int, bytes]:
    """The format version and body of a state, after checking magic, version, lengths and
    CRC."""
    if data[: len(MAGIC)] != MAGIC:
        if data and MAGIC.startswith(data):
            raise StateFormatError(f"truncated: {len(data)} bytes is shorter than the header")
        raise StateFormatError("not a pidgate state (bad magic)")
    if len(data) < _HEADER.size + _CRC.size:
        raise StateFormatError(f"truncated: {len(data)} bytes is shorter than the header")
    _, version, flags, raw_len, zlen = _HEADER.unpack_from(data)
    if version > FORMAT_VERSION:
        raise UnsupportedStateVersion(version)
    if version < 1 or flags != 0:
        raise StateFormatError(f"corrupt header: version {version}, flags {flags:#x}")
    expected = _HEADER.size + zlen + _CRC.size
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "trailing bytes"
        raise StateFormatError(f"{what}: {len(data)} bytes, the header says {expected}")
    (crc,) = _CRC.unpack_from(data, expected - _CRC.size)
    if zlib.crc32(data[: expected - _CRC.size]) != crc:
        raise StateFormatError("checksum mismatch: the state is corrupt")
    inflater = zlib.decompressobj()
    try:
        body = inflater.decompress(data[_HEADER.size : expected - _CRC.size], raw_len)
    except zlib.error as exc:
        raise StateFormatError(f"body does not decompress: {exc}") from None
    if len(body) != raw_len or inflater.unconsumed_tail or not inflater.eof:
        raise StateFormatError(f"body decompresses to other than the {raw_len} bytes declared")
    return version, body


def _read_enforcement(r: _Reader, name: str) -> Enforcement | None:
    tag = r.uv()
    if tag >= len(_ENFORCEMENT_MODES):
        raise StateFormatError(f"principal {name!r} has unknown enforcement mode {tag}")
    mode = _ENFORCEMENT_MODES[tag]
    if mode is None:
        return None
    began_ms, grace_ms, frontier, reason = r.sv(), r.uv(), r.sv(), r.text()
    if mode == PENDING:
        mode, frontier, reason = LEARNING, -1, "restarted before the frontier probe answered"
    if mode == FRONTIER and frontier < 0:
        raise StateFormatError(f"principal {name!r} has frontier mode without a frontier")
    return Enforcement(began_ms, grace_ms, mode, None if frontier < 0 else frontier, reason)


def _read_shape(r: _Reader, name: str) -> BloomShape:
    shape = BloomShape(bit_count=r.uv(), hash_count=r.uv(), expected_items=r.uv())
    if shape.bit_count > _MAX_BIT_COUNT:
        raise StateFormatError(f"principal {name!r} has a layer of {shape.bit_count} bits")
    return shape


def decode_state(data: bytes) -> StateSnapshot:
    """The state in ``data``, exactly as saved. Raises :class:`StateFormatError` (or its
    subclass :class:`UnsupportedStateVersion`) if ``data`` is not a complete, intact state."""
    version, body = _unwrap(data)
    r = _Reader(body)
    try:
        dumped_at_ms = r.sv()
        overrides: dict[str, int | None] = {}
        for _ in range(r.uv()):
            user = r.text()
            tag = r.uv()
            if tag not in (0, 1):
                raise StateFormatError(f"override of {user!r} has unknown tag {tag}")
            overrides[user] = r.uv() if tag else None
        modes: dict[str, bool | None] = {}
        for _ in range(r.uv() if version >= 4 else 0):
            user = r.text()
            tag = r.uv()
            if tag >= len(_MODE_TAGS):
                raise StateFormatError(f"mode override of {user!r} has unknown tag {tag}")
            modes[user] = _MODE_TAGS[tag]
        principals: list[PrincipalRecord] = []
        for _ in range(r.uv()):
            name = r.text()
            bucket = TokenBucket(rate=r.uv(), window_ms=r.uv(), level=r.uv(), updated_ms=r.sv())
            shared = _read_shape(r, name) if version in _SHARED_SHAPE_VERSIONS else None
            layers: list[LayerState] = []
            for _ in range(r.uv()):
                shape = shared if shared is not None else _read_shape(r, name)
                start_ms = r.sv()
                last_write_ms = start_ms + r.uv()
                inserted = r.uv()
                bits = _read_bits(r, shape.bit_count)
                layers.append(LayerState(shape, start_ms, last_write_ms, inserted, bits))
            enforcement = _read_enforcement(r, name) if version >= 2 else None
            principals.append(PrincipalRecord(name, bucket, tuple(layers), enforcement))
        if not r.at_end:
            raise StateFormatError("trailing bytes after the last principal")
        return StateSnapshot(dumped_at_ms, QuotaOverrides(overrides, modes), tuple(principals))
    except StateFormatError:
        raise
    except (ValueError, struct.error) as exc:
        raise StateFormatError(f"inconsistent state: {exc}") from None


def load_state(
    data: bytes, policy: QuotaPolicy, now_ms: int, *, apply_overrides: bool = True
) -> tuple[QuotaManager, LoadReport]:
    """A manager holding the state in ``data``, fitted to the policy in force at ``now_ms``.

    The policy in force is ``policy`` (from the configuration) with the saved overrides on top
    (``apply_overrides=False``: ``policy`` alone); it is the returned manager's policy, and the
    overrides are in the report. Per saved principal, idlest first:

    * unlimited now → dropped (the manager does not track unlimited principals);
    * the bucket, as it stood when saved, is put under the current rate and window (tokens
      kept, clamped to the new capacity, as ``update_policy`` does), then refilled at the
      current rate up to ``now_ms`` (a clock that stepped back refills nothing);
    * layers whose last write is a full current window before ``now_ms`` are dropped;
    * every other layer is kept in its own shape, so known PIDs stay known; layers in a shape
      the current policy would not build (another false-positive rate, or saved by a format
      before 3) are counted as *reshaped*: they are read, touched and expire as usual but are
      never written again (new layers get the current shape);
    * no layer left and a full bucket → dropped (exactly what ``expire()`` would forget);
    * then the caps are enforced, evicting the idlest.

    Raises :class:`StateFormatError` if ``data`` is not a complete, intact state.
    """
    snapshot = decode_state(data)
    effective = snapshot.overrides.apply_to(policy) if apply_overrides else policy
    manager = QuotaManager(effective)
    records: list[PrincipalRecord] = []
    expired = unlimited = idle = reshaped = layers_reshaped = 0
    dead_before = now_ms - effective.window_ms
    # k of the layers the current policy builds (each layer's share of the false-positive
    # rate depends on the window too: see pidgate.quota.layered).
    hash_count = LayerPlan(
        effective.window_ms, effective.window_num, effective.false_positive_rate
    ).hash_count
    for record in snapshot.principals:
        rate = effective.rate_for(record.principal)
        if rate is None:
            unlimited += 1
            continue
        bucket = (
            record.bucket.refill(snapshot.dumped_at_ms)
            .with_rate(rate, effective.window_ms)
            .refill(now_ms)
        )
        layers = tuple(layer for layer in record.layers if layer.last_write_ms > dead_before)
        expired += len(record.layers) - len(layers)
        # Keep every layer in its saved shape: positions come from the layer's own shape, as
        # at run time; dropping them would make every known PID look new (and charge for it).
        foreign = sum(
            1
            for layer in layers
            if not layer.shape.is_universal or layer.shape.hash_count != hash_count
        )
        if foreign:
            reshaped += 1
            layers_reshaped += foreign
        if not layers and bucket.is_full(now_ms):
            idle += 1
            continue
        records.append(PrincipalRecord(record.principal, bucket, layers, record.enforcement))
    try:
        evicted = manager.restore(records)
    except ValueError as exc:
        raise StateFormatError(f"inconsistent state: {exc}") from None
    return manager, LoadReport(
        dumped_at_ms=snapshot.dumped_at_ms,
        overrides=snapshot.overrides,
        principals_saved=len(snapshot.principals),
        principals_restored=manager.principal_count,
        # Eviction pops the idlest first, which are the first records restored.
        layers_restored=sum(len(record.layers) for record in records[evicted:]),
        layers_expired=expired,
        principals_unlimited=unlimited,
        principals_idle=idle,
        principals_reshaped=reshaped,
        layers_reshaped=layers_reshaped,
        principals_evicted=evicted,
    )
