"""Kafka request and response headers, and which API versions are flexible.

Owns ``FLEXIBLE_REQUEST_FROM`` / ``KNOWN_API_VERSIONS`` (built once at import from the JSON message
schemas kafka-python ships, i.e. Kafka's own ``clients/src/main/resources/common/message``), request
header parsing (v1, or v2 with tagged fields for flexible versions, KIP-482) and response header
parsing/encoding (v0, or v1 for flexible versions; ApiVersions responses always v0, KIP-511).
Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package.
"""

from __future__ import annotations

import importlib.resources
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pidgate.protocol._wire import (
    I16,
    I32,
    as_memoryview,
    need,
    read_nullable_string,
    skip_tagged_fields,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError

API_VERSIONS_KEY = 18
NEVER_FLEXIBLE = 1 << 15
"""Sentinel "first flexible version" for APIs with no flexible versions: above any int16 version."""

_SCHEMA_PACKAGE = "kafka.protocol.schemas.resources"
_COMMENT_LINES = re.compile(r"(?m)^\s*//.*$")  # Kafka's schema files carry // comment lines


def _parse_versions(spec: str) -> tuple[int, int] | None:
    """Kafka schema version ranges: "none", "3", "3-13", "9+" (open-ended)."""
    spec = spec.strip()
    if spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), NEVER_FLEXIBLE - 1
    if "-" in spec:
        lo, hi = spec.split("-", 1)
        return int(lo), int(hi)
    return int(spec), int(spec)


def _load_schemas(
    suffix: str,
) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    flexible_from: dict[int, int] = {}
    known: dict[int, tuple[int, int]] = {}
    for entry in importlib.resources.files(_SCHEMA_PACKAGE).iterdir():
        name = entry.name
        if not name.endswith(suffix + ".json"):
            continue
        data = json.loads(_COMMENT_LINES.sub("", entry.read_text(encoding="utf-8")))
        if data.get("type") != suffix.lower():
            continue
        api_key = int(data["apiKey"])
        valid = _parse_versions(data["validVersions"])
        if valid is None:
            continue
        # kafka-python treats every API's minimum as 0 (the broker's ApiVersions answer is the
        # real bound), and so do we: old clients' requests still parse.
        known[api_key] = (0, valid[1])
        flexible = _parse_versions(data.get("flexibleVersions", "none"))
        flexible_from[api_key] = NEVER_FLEXIBLE if flexible is None else flexible[0]
    return flexible_from, known


_req_flexible, _req_known = _load_schemas("Request")
_resp_flexible, _ = _load_schemas("Response")

FLEXIBLE_REQUEST_FROM: Mapping[int, int] = MappingProxyType(dict(sorted(_req_flexible.items())))
"""api_key -> first flexible request version (``NEVER_FLEXIBLE`` if none)."""
FLEXIBLE_RESPONSE_FROM: Mapping[int, int] = MappingProxyType(dict(sorted(_resp_flexible.items())))
"""api_key -> first flexible response version (same as requests for every schema today)."""
KNOWN_API_VERSIONS: Mapping[int, tuple[int, int]] = MappingProxyType(
    dict(sorted(_req_known.items()))
)
"""api_key -> (0, max valid version) from the request schemas."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_bytes: int
    """Length of the header inside the payload: the body starts at ``payload[header_bytes:]``."""


def peek_request_header(payload: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id): the fixed first 8 bytes of every request header,
    whatever the API and version, enough to forward a request pidgate does not inspect and
    match its response."""
    buf = as_memoryview(payload)
    try:
        need(buf, 0, 8, "request header")
        api_key, api_version = I16.unpack_from(buf, 0)[0], I16.unpack_from(buf, 2)[0]
        return int(api_key), int(api_version), int(I32.unpack_from(buf, 4)[0])
    except (IndexError, struct.error) as exc:
        raise MalformedMessageError(f"malformed request header: {exc}") from None


def request_is_flexible(api_key: int, api_version: int) -> bool:
    return api_version >= FLEXIBLE_REQUEST_FROM.get(api_key, NEVER_FLEXIBLE)


def parse_request_header(payload: bytes | bytearray | memoryview) -> RequestHeader:
    """Parse a request header from a frame payload (no 4-byte size prefix).

    Header v1 (api_key, api_version, correlation_id, client_id) for non-flexible versions, v2
    (v1 + tagged fields) for flexible ones. client_id stays a classic int16 string even in v2 so
    that brokers can read any ApiVersions request (KIP-511).
    """
    buf = as_memoryview(payload)
    try:
        need(buf, 0, 8, "request header")
        api_key = I16.unpack_from(buf, 0)[0]
        api_version = I16.unpack_from(buf, 2)[0]
        correlation_id = I32.unpack_from(buf, 4)[0]
        known = KNOWN_API_VERSIONS.get(api_key)
        if known is None:
            # No header values in the message: bytes that are not a Kafka request (e.g. a raw
            # SASL token after a v0 handshake) may hold credentials, and messages get logged.
            raise UnsupportedApiError(
                "a request with an api key pidgate does not know",
                api_key=api_key,
                api_version=api_version,
                correlation_id=correlation_id,
            )
        if not known[0] <= api_version <= known[1]:
            raise UnsupportedApiError(
                f"api key {api_key} version {api_version} outside supported {known[0]}..{known[1]}",
                api_key=api_key,
                api_version=api_version,
                correlation_id=correlation_id,
            )
        client_id, pos = read_nullable_string(buf, 8, "request header client_id")
        if request_is_flexible(api_key, api_version):
            pos = skip_tagged_fields(buf, pos)
    except (IndexError, struct.error) as exc:
        raise MalformedMessageError(f"malformed request header: {exc}") from None
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def response_header_is_flexible(api_key: int, api_version: int) -> bool:
    """Whether a response uses header v1 (tagged fields). ApiVersions never does (KIP-511)."""
    if api_key == API_VERSIONS_KEY:
        return False
    first = FLEXIBLE_RESPONSE_FROM.get(api_key)
    if first is None:
        raise UnsupportedApiError(
            f"unknown api key {api_key} (version {api_version})",
            api_key=api_key,
            api_version=api_version,
        )
    return api_version >= first


def parse_response_header(
    payload: bytes | bytearray | memoryview, api_key: int, api_version: int
) -> tuple[int, int]:
    """Return (correlation_id, body_offset) of a response payload (no size prefix).

    For an api key the schemas do not know (forwarded untouched) the header's flexibility is
    unknown: body_offset is then 4, which only the correlation id check may rely on."""
    buf = as_memoryview(payload)
    need(buf, 0, 4, "response header")
    correlation_id = int(I32.unpack_from(buf, 0)[0])
    pos = 4
    if api_key not in FLEXIBLE_RESPONSE_FROM and api_key != API_VERSIONS_KEY:
        return correlation_id, pos
    if response_header_is_flexible(api_key, api_version):
        pos = skip_tagged_fields(buf, pos)
    return correlation_id, pos


def encode_response_header(correlation_id: int, flexible: bool) -> bytes:
    """Response header v0, or v1 with an empty tagged-field section."""
    return I32.pack(correlation_id) + (b"\x00" if flexible else b"")
