"""What the client-quota codecs share: kafka-python decoding with pidgate's errors, the framed
response, and entities as read from the wire.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any pidgate
package outside ``pidgate.protocol``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.framing import frame
from pidgate.protocol.headers import encode_response_header, response_header_is_flexible

from .entities import USER, Component, QuotaEntity

__all__ = ["check_version", "components_of", "decode_body", "framed", "user_entity"]


def check_version(api_key: int, api_version: int, cls: Any) -> None:
    max_version = int(cls.max_version)
    if not 0 <= api_version <= max_version:
        raise UnsupportedApiError(
            f"api key {api_key} version {api_version} is not supported (0..{max_version})",
            api_key=api_key,
            api_version=api_version,
        )


def decode_body(
    cls: Any, api_key: int, api_version: int, body: bytes | bytearray | memoryview
) -> Any:
    check_version(api_key, api_version, cls)
    try:
        return cls.decode(bytes(body), version=api_version)
    except Exception as exc:  # kafka-python raises assorted errors on garbage
        raise MalformedMessageError(
            f"malformed {cls.__name__} v{api_version}: {type(exc).__name__}: {exc}"
        ) from None


def framed(api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    """Size prefix + response header (v1 with tagged fields for flexible v1) + body."""
    flexible = response_header_is_flexible(api_key, api_version)
    return frame(encode_response_header(correlation_id, flexible) + body)


def components_of(entity_data: Iterable[Any]) -> tuple[Component, ...]:
    return tuple(
        (str(e.entity_type), None if e.entity_name is None else str(e.entity_name))
        for e in entity_data
    )


def user_entity(components: Sequence[Component]) -> QuotaEntity | None:
    """The QuotaEntity when the entity is exactly one user component, else None."""
    if len(components) != 1 or components[0][0] != USER:
        return None
    name = components[0][1]
    return QuotaEntity.default() if name is None else QuotaEntity.named(name)
