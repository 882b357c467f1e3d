"""Broker endpoints in responses: finding them and rewriting them to pidgate's listeners.

Owns ``BrokerEndpoint``, ``rewrite_endpoints`` and ``endpoints_in_response`` for the responses
that advertise broker host/port in the versions pidgate allows: Metadata brokers[], FindCoordinator
(v0-3 single node, v4+ coordinators[], KIP-699), DescribeCluster brokers[] (KIP-700), and the
node_endpoints of Produce v10+ and Fetch v16+ (top-level tag 0, KIP-951).
Metadata/FindCoordinator/DescribeCluster go through kafka-python's classes (rare, small); Produce
and Fetch responses are walked by hand, headers only (never a record is copied), because they are
on the hot path and almost never carry endpoints. Must not import: asyncio, socket, time, logging,
structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.cluster import DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from pidgate.protocol import native
from pidgate.protocol._wire import (
    I32,
    as_memoryview,
    encode_compact_nullable_string,
    encode_tagged_fields,
    need,
    read_array_len,
    read_compact_nullable_string,
    read_tagged_fields,
    read_uvarint,
    skip_tagged_fields,
    write_uvarint,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError

PRODUCE_KEY = 0
FETCH_KEY = 1
METADATA_KEY = 3
FIND_COORDINATOR_KEY = 10
DESCRIBE_CLUSTER_KEY = 60
ENDPOINT_BEARING_APIS: frozenset[int] = frozenset(
    {METADATA_KEY, FIND_COORDINATOR_KEY, DESCRIBE_CLUSTER_KEY, PRODUCE_KEY, FETCH_KEY}
)
FIRST_PRODUCE_NODE_ENDPOINTS_VERSION = 10  # KIP-951
FIRST_FETCH_NODE_ENDPOINTS_VERSION = 16  # KIP-951
#: The newest Fetch response whose layout pidgate walks (kafka-python's schemas: 4-18).
MAX_FETCH_VERSION = 18
_FETCH_PARTITION_FIXED_BYTES = 4 + 2 + 8 + 8 + 8  # index, error_code, high watermark, LSO, LSO
FIRST_FIND_COORDINATOR_BATCHED_VERSION = 4  # KIP-699: coordinators[]
_PRODUCE_NODE_ENDPOINTS_TAG = 0
_PRODUCE_PARTITION_FIXED_BYTES = 4 + 2 + 8 + 8 + 8  # index, error_code, base_offset, 2 x int64


def may_carry_endpoints(api_key: int, api_version: int) -> bool:
    """Whether a response of this api and version can hold broker endpoints: Metadata,
    FindCoordinator and DescribeCluster always; Produce from v10 and Fetch from v16 (KIP-951's
    node_endpoints). Lets the proxy pass every other response on without reading its body."""
    if api_key == PRODUCE_KEY:
        return api_version >= FIRST_PRODUCE_NODE_ENDPOINTS_VERSION
    if api_key == FETCH_KEY:
        return api_version >= FIRST_FETCH_NODE_ENDPOINTS_VERSION
    return api_key in ENDPOINT_BEARING_APIS


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    node_id: int
    host: str
    port: int


EndpointRewriter = Callable[[BrokerEndpoint], tuple[str, int]]
"""Given a broker's advertised endpoint, return the (host, port) to advertise instead."""


def _malformed(api_key: int, api_version: int, exc: Exception) -> MalformedMessageError:
    return MalformedMessageError(
        f"malformed response for api key {api_key} version {api_version}: {exc}"
    )


# --- Produce (hand-written) -------------------------------------------------------------------


def _produce_top_level_tags_offset(buf: memoryview, api_version: int) -> int:
    """Offset of the top-level tagged-field section of a flexible ProduceResponse body.

    On every Produce response from v10 (KIP-951), so one-byte lengths and the usual empty
    sections (no record errors, null error message, no tagged fields) are read inline; strings
    are skipped by their length, not decoded (only where the section starts matters). Reading
    past the end raises IndexError, which the caller reports as a malformed response."""
    by_id = api_version >= 13
    topics, pos = read_array_len(buf, 0, True, "responses")
    for _ in range(topics):
        if by_id:
            need(buf, pos, 16, "topic_id")
            pos += 16
        else:
            pos = _skip_compact_string(buf, pos)
        partitions, pos = read_array_len(buf, pos, True, "partition_responses")
        for _ in range(partitions):
            pos += _PRODUCE_PARTITION_FIXED_BYTES
            if buf[pos] == 1:  # record_errors: empty (compact length 0 + 1)
                pos += 1
            else:
                errors, pos = read_array_len(buf, pos, True, "record_errors")
                for _ in range(errors):
                    need(buf, pos, 4, "batch_index")
                    pos = skip_tagged_fields(buf, _skip_compact_string(buf, pos + 4))
            pos = _skip_compact_string(buf, pos)  # error_message
            # current_leader (tag 0) lives in the partition's tagged fields
            pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
        pos = pos + 1 if buf[pos] == 0 else skip_tagged_fields(buf, pos)
    need(buf, pos, 4, "throttle_time_ms")
    return pos + 4


#: The newest Produce response :func:`produce_response_passes_unchanged` walks (v13: topic ids).
MAX_PRODUCE_WALK_VERSION = 13


def pure_produce_response_passes_unchanged(
    payload: bytes | bytearray | memoryview, api_version: int
) -> bool:
    """Whether a Produce v10+ response (``payload``: its frame after the size prefix, response
    header v1 first) is one :func:`rewrite_endpoints` would forward as it is: well formed up to
    its top-level tagged fields, and with none of them (so no KIP-951 node_endpoints). Every
    Produce v10+ response is read for those, and nearly none carries them (a broker adds them
    with a NOT_LEADER error), so the response path asks this first and passes the others on
    like a v9 response.

    False for anything else (another version, a top-level tagged field, a malformed byte): the
    caller then takes the full path, which rewrites or raises; a True always means the full path
    would have returned the response untouched."""
    if not FIRST_PRODUCE_NODE_ENDPOINTS_VERSION <= api_version <= MAX_PRODUCE_WALK_VERSION:
        return False
    buf = as_memoryview(payload)
    try:
        need(buf, 0, 4, "correlation_id")
        body = buf[skip_tagged_fields(buf, 4) :]
        tags_at = _produce_top_level_tags_offset(body, api_version)
    except (MalformedMessageError, IndexError):
        return False
    return tags_at < len(body) and body[tags_at] == 0


#: :func:`pure_produce_response_passes_unchanged`, or its compiled twin (``native``'s choice).
produce_response_passes_unchanged: Callable[[bytes | bytearray | memoryview, int], bool] = (
    native.compiled.produce_response_passes_unchanged
    if native.compiled is not None
    else pure_produce_response_passes_unchanged
)


def _skip_compact_string(buf: memoryview, pos: int) -> int:
    """The offset after a compact nullable string (uvarint length + 1; 0 = null)."""
    n = buf[pos]
    if n < 0x80:
        return pos + (n if n else 1)
    n, pos = read_uvarint(buf, pos)
    need(buf, pos, n - 1, "string")
    return pos + n - 1


@dataclass(frozen=True, slots=True)
class _RawNodeEndpoint:
    endpoint: BrokerEndpoint
    rack: str | None
    tagged: bytes  # the entry's own tagged-field section, verbatim


def _parse_node_endpoints(raw: memoryview) -> list[_RawNodeEndpoint]:
    count, pos = read_array_len(raw, 0, True, "node_endpoints")
    out: list[_RawNodeEndpoint] = []
    for _ in range(count):
        need(raw, pos, 4, "node_id")
        node_id = I32.unpack_from(raw, pos)[0]
        host, pos = read_compact_nullable_string(raw, pos + 4, "host")
        need(raw, pos, 4, "port")
        port = I32.unpack_from(raw, pos)[0]
        rack, pos = read_compact_nullable_string(raw, pos + 4, "rack")
        tags_start = pos
        pos = skip_tagged_fields(raw, pos)
        out.append(
            _RawNodeEndpoint(
                BrokerEndpoint(node_id, host or "", port), rack, bytes(raw[tags_start:pos])
            )
        )
    return out


def _encode_node_endpoints(entries: list[_RawNodeEndpoint]) -> bytes:
    out = [write_uvarint(len(entries) + 1)]
    for entry in entries:
        out.append(I32.pack(entry.endpoint.node_id))
        out.append(encode_compact_nullable_string(entry.endpoint.host))
        out.append(I32.pack(entry.endpoint.port))
        out.append(encode_compact_nullable_string(entry.rack))
        out.append(entry.tagged)
    return b"".join(out)


def _fetch_top_level_tags_offset(buf: memoryview, api_version: int) -> int:
    """Offset of the top-level tagged-field section of a FetchResponse v16+ body: a walk over
    topic and partition headers that skips every records field without reading it."""
    if api_version > MAX_FETCH_VERSION:
        raise UnsupportedApiError(
            f"Fetch version {api_version} is newer than pidgate can walk (max {MAX_FETCH_VERSION})",
            api_key=FETCH_KEY,
            api_version=api_version,
        )
    need(buf, 0, 10, "throttle_time_ms, error_code, session_id")
    topics, pos = read_array_len(buf, 10, True, "responses")
    for _ in range(topics):
        need(buf, pos, 16, "topic_id")  # v13+
        partitions, pos = read_array_len(buf, pos + 16, True, "partitions")
        for _ in range(partitions):
            need(buf, pos, _FETCH_PARTITION_FIXED_BYTES, "partition header")
            pos += _FETCH_PARTITION_FIXED_BYTES
            aborted, pos = read_array_len(buf, pos, True, "aborted_transactions")
            for _ in range(aborted):
                need(buf, pos, 16, "aborted transaction")
                pos = skip_tagged_fields(buf, pos + 16)
            need(buf, pos, 4, "preferred_read_replica")
            size, pos = read_uvarint(buf, pos + 4)  # records: compact nullable bytes
            if size > 0:
                need(buf, pos, size - 1, "records")
                pos += size - 1
            pos = skip_tagged_fields(buf, pos)  # diverging_epoch, current_leader, snapshot_id
        pos = skip_tagged_fields(buf, pos)
    return pos


def _top_level_tags_offset(api_key: int, buf: memoryview, api_version: int) -> int | None:
    """Where the top-level tags of a Produce/Fetch response start; None for versions that
    carry no node_endpoints."""
    if api_key == PRODUCE_KEY:
        if api_version < FIRST_PRODUCE_NODE_ENDPOINTS_VERSION:
            return None
        return _produce_top_level_tags_offset(buf, api_version)
    if api_version < FIRST_FETCH_NODE_ENDPOINTS_VERSION:
        return None
    return _fetch_top_level_tags_offset(buf, api_version)


def _produce_node_endpoints(
    buf: memoryview, api_version: int, api_key: int = PRODUCE_KEY
) -> tuple[int, list[tuple[int, memoryview]], list[_RawNodeEndpoint]] | None:
    """(tags offset, all top-level tags, parsed node_endpoints) or None if there are none
    (Produce v10+ or Fetch v16+: the same top-level tag 0)."""
    tags_at = _top_level_tags_offset(api_key, buf, api_version)
    if tags_at is None:
        return None
    if tags_at < len(buf) and buf[tags_at] == 0:
        return None  # the common case: no top-level tagged fields at all
    tags, _end = read_tagged_fields(buf, tags_at)
    for tag, raw in tags:
        if tag == _PRODUCE_NODE_ENDPOINTS_TAG:
            return tags_at, tags, _parse_node_endpoints(raw)
    return None


def _rewrite_produce(
    buf: memoryview, api_version: int, rewrite: EndpointRewriter, api_key: int = PRODUCE_KEY
) -> bytes | None:
    found = _produce_node_endpoints(buf, api_version, api_key)
    if found is None:
        return None
    tags_at, tags, entries = found
    changed = False
    new_entries: list[_RawNodeEndpoint] = []
    for entry in entries:
        host, port = rewrite(entry.endpoint)
        if (host, port) != (entry.endpoint.host, entry.endpoint.port):
            changed = True
        new_entries.append(
            _RawNodeEndpoint(
                BrokerEndpoint(entry.endpoint.node_id, host, port), entry.rack, entry.tagged
            )
        )
    if not changed:
        return None
    new_tags = [
        (
            tag,
            _encode_node_endpoints(new_entries)
            if tag == _PRODUCE_NODE_ENDPOINTS_TAG
            else bytes(raw),
        )
        for tag, raw in tags
    ]
    return bytes(buf[:tags_at]) + encode_tagged_fields(new_tags)


# --- Metadata / FindCoordinator / DescribeCluster (kafka-python) -------------------------------

_CLASSES: dict[int, Any] = {
    METADATA_KEY: MetadataResponse,
    FIND_COORDINATOR_KEY: FindCoordinatorResponse,
    DESCRIBE_CLUSTER_KEY: DescribeClusterResponse,
}


def _decode(api_key: int, api_version: int, buf: memoryview) -> Any:
    cls = _CLASSES[api_key]
    if not 0 <= api_version <= int(cls.max_version):
        raise UnsupportedApiError(
            f"api key {api_key} version {api_version} is newer than pidgate can rewrite "
            f"(max {cls.max_version})",
            api_key=api_key,
            api_version=api_version,
        )
    try:
        return cls.decode(buf, version=api_version)
    except Exception as exc:  # kafka-python raises assorted errors on garbage
        raise _malformed(api_key, api_version, exc) from None


def _endpoint_holders(api_key: int, api_version: int, msg: Any) -> list[tuple[Any, str]]:
    """(object with host/port, name of its node id attribute) for every live endpoint."""
    if api_key == METADATA_KEY:
        return [(b, "node_id") for b in msg.brokers or ()]
    if api_key == DESCRIBE_CLUSTER_KEY:
        return [(b, "broker_id") for b in msg.brokers or ()]
    if api_version < FIRST_FIND_COORDINATOR_BATCHED_VERSION:
        if msg.error_code != 0 or msg.node_id < 0:
            return []
        return [(msg, "node_id")]
    return [(c, "node_id") for c in msg.coordinators or () if c.error_code == 0 and c.node_id >= 0]


def rewrite_endpoints(
    api_key: int,
    api_version: int,
    body: bytes | bytearray | memoryview,
    rewrite: EndpointRewriter,
) -> bytes | None:
    """The response body with every broker endpoint replaced by ``rewrite(endpoint)``.

    None when this api/version carries no endpoints or nothing changed, so the caller forwards
    the original bytes.
    """
    if api_key not in ENDPOINT_BEARING_APIS:
        return None
    buf = as_memoryview(body)
    if api_key in (PRODUCE_KEY, FETCH_KEY):
        try:
            return _rewrite_produce(buf, api_version, rewrite, api_key)
        except (struct.error, IndexError, ValueError) as exc:
            raise _malformed(api_key, api_version, exc) from None
    msg = _decode(api_key, api_version, buf)
    changed = False
    for holder, id_attr in _endpoint_holders(api_key, api_version, msg):
        endpoint = BrokerEndpoint(int(getattr(holder, id_attr)), str(holder.host), int(holder.port))
        host, port = rewrite(endpoint)
        if (host, port) != (endpoint.host, endpoint.port):
            holder.host = host
            holder.port = port
            changed = True
    if not changed:
        return None
    return bytes(msg.encode())


def endpoints_in_response(
    api_key: int, api_version: int, body: bytes | bytearray | memoryview
) -> tuple[BrokerEndpoint, ...]:
    """Every live broker endpoint the response advertises (empty if none)."""
    if api_key not in ENDPOINT_BEARING_APIS:
        return ()
    buf = as_memoryview(body)
    if api_key in (PRODUCE_KEY, FETCH_KEY):
        try:
            found = _produce_node_endpoints(buf, api_version, api_key)
        except (struct.error, IndexError, ValueError) as exc:
            raise _malformed(api_key, api_version, exc) from None
        return () if found is None else tuple(e.endpoint for e in found[2])
    msg = _decode(api_key, api_version, buf)
    return tuple(
        BrokerEndpoint(int(getattr(holder, id_attr)), str(holder.host), int(holder.port))
        for holder, id_attr in _endpoint_holders(api_key, api_version, msg)
    )
