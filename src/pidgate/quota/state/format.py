"""The quota state as bytes: every principal's token bucket and Bloom layers, plus the quota
overrides set at run time, so that a restart changes nothing a client can observe.

Owns the state format: its description below, the magic, version and header, the tables of its
tags, the errors a load raises and :class:`StateSnapshot`, what a state holds before it is
fitted to a policy. Writing is :mod:`.encode`'s, reading :mod:`.decode`'s, fitting
:mod:`.load`'s. Times are absolute wall-clock milliseconds, so state saved by one process
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

Loading fits the saved state to the *current* policy (:func:`pidgate.quota.state.load.load_state`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..grandfather import FRONTIER, LEARNING, OFF, PENDING, GrandfatherMode
from ..principal_table import PrincipalRecord
from .run_time_overrides import QuotaOverrides

__all__ = [
    "CRC",
    "ENFORCEMENT_MODES",
    "FORMAT_VERSION",
    "HEADER",
    "MAGIC",
    "MAX_BIT_COUNT",
    "MODE_TAGS",
    "RAW",
    "SHARED_SHAPE_VERSIONS",
    "SPARSE16",
    "SPARSE32",
    "StateFormatError",
    "StateSnapshot",
    "UnsupportedStateVersion",
]

MAGIC = b"PIDGSTAT"
FORMAT_VERSION = 4
#: Versions before 3 saved one Bloom shape per principal, shared by all its layers.
SHARED_SHAPE_VERSIONS = (1, 2)
ENFORCEMENT_MODES: tuple[GrandfatherMode | None, ...] = (
    None,
    FRONTIER,
    LEARNING,
    PENDING,
    OFF,
)
#: A mode override's tag: removed, enforce, observe.
MODE_TAGS: tuple[bool | None, ...] = (None, False, True)

HEADER = struct.Struct(">8sHHQQ")
CRC = struct.Struct(">I")
RAW, SPARSE16, SPARSE32 = 0, 1, 2
# Refuse absurd shapes before allocating bits for them (2**32 bits = 512 MiB per layer).
MAX_BIT_COUNT = 2**32


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


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The decoded content of a state: what was saved, before fitting it to a policy."""

    dumped_at_ms: int
    overrides: QuotaOverrides
    principals: tuple[PrincipalRecord, ...]
