"""ApiVersions: reading the client's software name and narrowing the broker's version ranges.

Owns ``parse_api_versions_request`` (client_software_name/version, v3+, KIP-511),
``narrow_api_versions_response`` (so clients only pick versions pidgate can parse) and
``proxy_api_version_limits`` (what those versions are, and why). Hand-written because the narrowed
body must keep everything else byte-for-byte (throttle_time_ms, supported/finalized features and
any tagged field newer than our schemas). Must not import: asyncio, socket, time, logging,
structlog, prometheus_client, or any other pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from kafka.protocol.admin.cluster import DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse

from pidgate.protocol._wire import (
    I16,
    I32,
    as_memoryview,
    need,
    read_array_len,
    read_compact_nullable_string,
    skip_tagged_fields,
    write_uvarint,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError, unsupported_version
from pidgate.protocol.headers import KNOWN_API_VERSIONS
from pidgate.protocol.sasl import SASL_AUTHENTICATE_VERSIONS, SASL_HANDSHAKE_VERSIONS

API_VERSIONS_KEY = 18
FIRST_FLEXIBLE_API_VERSIONS_VERSION = 3  # KIP-482/KIP-511
_ENTRY = struct.Struct(">hhh")  # api_key, min_version, max_version


@dataclass(frozen=True, slots=True)
class ClientSoftware:
    name: str | None
    version: str | None


def _check_version(api_version: int) -> None:
    if not 0 <= api_version <= KNOWN_API_VERSIONS[API_VERSIONS_KEY][1]:
        raise unsupported_version("ApiVersions", API_VERSIONS_KEY, api_version)


def parse_api_versions_request(
    body: bytes | bytearray | memoryview, api_version: int
) -> ClientSoftware:
    """client_software_name / client_software_version of a v3+ request; both None before v3."""
    _check_version(api_version)
    if api_version < FIRST_FLEXIBLE_API_VERSIONS_VERSION:
        return ClientSoftware(None, None)
    buf = as_memoryview(body)
    try:
        name, pos = read_compact_nullable_string(buf, 0, "client_software_name")
        version, pos = read_compact_nullable_string(buf, pos, "client_software_version")
    except (struct.error, IndexError) as exc:
        raise MalformedMessageError(
            f"malformed ApiVersions v{api_version} request: {exc}"
        ) from None
    return ClientSoftware(name, version)


def narrow_api_versions_response(
    body: bytes | bytearray | memoryview,
    api_version: int,
    limits: Mapping[int, tuple[int, int]],
    answered_locally: Mapping[int, tuple[int, int]] | None = None,
    *,
    drop: frozenset[int] | None = None,
) -> bytes:
    """Clamp the broker's [min, max] per api key to ``limits``; drop keys outside them.

    With ``drop`` given, keys outside ``limits`` are kept as the broker advertised them (pidgate
    forwards them untouched) and only the keys in ``drop`` are removed.

    ``answered_locally``: api keys pidgate answers itself (in whole or in part, e.g. the client
    quota APIs for ``producer_ids_rate``). They are advertised with pidgate's range even when the
    broker lacks them; when the broker has them too, with the intersection, since requests
    mixing pidgate's and the broker's keys are split and forwarded in the same version.

    Everything after the api_keys array (throttle_time_ms and the v3+ tagged fields: supported
    and finalized features, KIP-584) is copied verbatim, as are per-entry tagged fields. An error
    response is returned unchanged: on UNSUPPORTED_VERSION the broker encodes the body as v0 so
    that any client can read it (KIP-511), whatever version was asked for.
    """
    response = _read_api_keys(body, api_version, check_tail=True)
    if response is None:
        return bytes(body)
    buf, flexible, entries, pos = response
    local = dict(answered_locally or {})
    kept: list[bytes] = []
    for api_key, min_version, max_version, start, end in entries:
        limit = limits.get(api_key)
        if api_key in local:
            own = local.pop(api_key)
            limit = (max(own[0], limit[0]), min(own[1], limit[1])) if limit else own
        if limit is None and drop is not None and api_key not in drop:
            kept.append(bytes(buf[start:end]))  # forwarded untouched: as advertised
        elif limit is not None:
            lo = max(min_version, limit[0])
            hi = min(max_version, limit[1])
            if lo <= hi:
                kept.append(_ENTRY.pack(api_key, lo, hi) + bytes(buf[start + _ENTRY.size : end]))
    no_tags = b"\x00" if flexible else b""
    kept += [_ENTRY.pack(key, lo, hi) + no_tags for key, (lo, hi) in sorted(local.items())]
    count_bytes = write_uvarint(len(kept) + 1) if flexible else I32.pack(len(kept))
    return b"".join([bytes(buf[0:2]), count_bytes, *kept, bytes(buf[pos:])])


def broker_api_versions(
    body: bytes | bytearray | memoryview, api_version: int
) -> dict[int, tuple[int, int]]:
    """The api keys and version ranges the broker itself advertised (empty on an error)."""
    response = _read_api_keys(body, api_version, check_tail=False)
    if response is None:
        return {}
    return {api_key: (lo, hi) for api_key, lo, hi, _, _ in response[2]}


_Entry = tuple[int, int, int, int, int]
"""One api_keys entry: api_key, min_version, max_version, its start and end offsets."""


def _read_api_keys(
    body: bytes | bytearray | memoryview, api_version: int, *, check_tail: bool
) -> tuple[memoryview, bool, list[_Entry], int] | None:
    """(body, flexible, entries, offset after the api_keys array) of an ApiVersions response;
    None for an error response. ``check_tail``: also validate what follows the array
    (throttle_time_ms from v1, tagged fields from v3)."""
    _check_version(api_version)
    buf = as_memoryview(body)
    try:
        need(buf, 0, 2, "ApiVersions response error_code")
        if I16.unpack_from(buf, 0)[0] != 0:
            return None
        flexible = api_version >= FIRST_FLEXIBLE_API_VERSIONS_VERSION
        count, pos = read_array_len(buf, 2, flexible, "api_keys")
        entries: list[_Entry] = []
        for _ in range(count):
            need(buf, pos, _ENTRY.size, "api_keys entry")
            api_key, min_version, max_version = _ENTRY.unpack_from(buf, pos)
            end = pos + _ENTRY.size
            if flexible:
                end = skip_tagged_fields(buf, end)
            entries.append((api_key, min_version, max_version, pos, end))
            pos = end
        if check_tail:
            tail_end = pos
            if api_version >= 1:
                need(buf, tail_end, 4, "throttle_time_ms")
                tail_end += 4
            if flexible:
                skip_tagged_fields(buf, tail_end)
    except (struct.error, IndexError) as exc:
        raise MalformedMessageError(
            f"malformed ApiVersions v{api_version} response: {exc}"
        ) from None
    return buf, flexible, entries, pos


#: ShareFetch (78) and ShareAcknowledge (79) responses carry broker endpoints (node_endpoints,
#: KIP-932) and kafka-python's schemas do not describe them yet, so pidgate cannot rewrite them:
#: they are removed from ApiVersions answers rather than let clients learn brokers' own addresses.
NOT_FORWARDED_APIS: frozenset[int] = frozenset({78, 79})

#: The api keys pidgate reads or rewrites; every other key is forwarded untouched in whatever
#: versions the broker advertises (``inspected_api_version_limits``).
INSPECTED_APIS: frozenset[int] = frozenset(
    {
        0,  # Produce: PIDs (admission)
        1,  # Fetch: v16+ node_endpoints rewritten
        3,  # Metadata: broker endpoints rewritten
        10,  # FindCoordinator: coordinator endpoints rewritten
        17,  # SaslHandshake: identity
        18,  # ApiVersions: client software, this narrowing
        22,  # InitProducerId: the event log
        36,  # SaslAuthenticate: identity
        48,  # DescribeClientQuotas: producer_ids_rate answered by pidgate
        49,  # AlterClientQuotas: idem
        55,  # DescribeQuorum: capped below v2, whose listeners pidgate does not rewrite
        60,  # DescribeCluster: broker endpoints rewritten
    }
)


def forwarded_untouched(api_key: int, limits: Mapping[int, tuple[int, int]]) -> bool:
    """True for a request pidgate forwards without parsing more than its first 8 bytes (an api
    key outside ``limits``, the inspected ones). Raises UnsupportedApiError for the keys pidgate
    never forwards (``NOT_FORWARDED_APIS``), which it never advertised either."""
    if api_key in NOT_FORWARDED_APIS:
        raise UnsupportedApiError(
            f"api_key {api_key} is not one pidgate forwards (its responses carry broker "
            "endpoints pidgate cannot rewrite)",
            api_key=api_key,
        )
    return api_key not in limits


def inspected_api_version_limits() -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) versions for the keys pidgate inspects (``INSPECTED_APIS``) only:
    the rest is forwarded without looking inside, in the broker's own versions."""
    limits = proxy_api_version_limits()
    limits[1] = KNOWN_API_VERSIONS[1]  # node_endpoints of v16+ are rewritten (endpoints.py)
    return {key: limits[key] for key in INSPECTED_APIS if key in limits}


# Produce: v3 is the oldest we walk (transactional_id + RecordBatch v2, KIP-98); v13 the newest
# in the schemas (topic ids, KIP-516).
_PRODUCE_LIMITS = (3, 13)
# Fetch v16+ responses may carry node_endpoints (KIP-951). Rewriting those would mean decoding
# and re-encoding whole fetch responses (megabytes of records), so we stop at v15.
_FETCH_MAX = 15
# DescribeQuorum v2 adds nodes[].listeners (KIP-853): broker endpoints we do not rewrite.
_DESCRIBE_QUORUM_MAX = 1


def proxy_api_version_limits() -> dict[int, tuple[int, int]]:
    """api_key -> (min, max) versions pidgate lets clients use.

    Every api key in Kafka's schemas (known to kafka-python), with these exceptions; keys the
    schemas do not know are absent and so are dropped from ApiVersions answers, because we
    could not even parse their request headers' flexibility.
    """
    limits = dict(KNOWN_API_VERSIONS)
    limits[0] = _PRODUCE_LIMITS
    limits[1] = (limits[1][0], min(limits[1][1], _FETCH_MAX))
    limits[55] = (limits[55][0], min(limits[55][1], _DESCRIBE_QUORUM_MAX))
    # The SASL observer reads exactly these versions (protocol/sasl.py); a newer schema must
    # not let clients pick one it cannot follow.
    limits[17] = (0, min(limits[17][1], SASL_HANDSHAKE_VERSIONS[1]))
    limits[36] = (0, min(limits[36][1], SASL_AUTHENTICATE_VERSIONS[1]))
    # Endpoint-bearing responses are decoded and re-encoded with kafka-python's classes, so only
    # versions those classes know are allowed (today the same as the schemas').
    for api_key, cls in (
        (3, MetadataResponse),
        (10, FindCoordinatorResponse),
        (60, DescribeClusterResponse),
    ):
        max_version = int(cls.max_version)
        limits[api_key] = (limits[api_key][0], min(limits[api_key][1], max_version))
    return limits


#: Kafka error code UNSUPPORTED_VERSION.
UNSUPPORTED_VERSION = 35


def encode_api_versions_unsupported(correlation_id: int, supported: tuple[int, int]) -> bytes:
    """A complete framed ApiVersionsResponse v0 with UNSUPPORTED_VERSION, as brokers send for an
    ApiVersions request newer than they know (KIP-511): v0 so any client can read it, listing the
    ApiVersions range ``supported`` so the client retries with a version both sides speak.
    """
    body = b"".join(
        [
            I16.pack(UNSUPPORTED_VERSION),
            I32.pack(1),
            _ENTRY.pack(API_VERSIONS_KEY, supported[0], supported[1]),
        ]
    )
    payload = I32.pack(correlation_id) + body  # response header v0: ApiVersions never flexible
    return I32.pack(len(payload)) + payload
