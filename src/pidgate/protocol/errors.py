"""Exceptions raised by the sans-IO Kafka wire codec.

Owns the ``ProtocolError`` hierarchy. Every failure to understand bytes from the wire surfaces
as a subclass of ``ProtocolError`` so the proxy needs exactly one ``except`` to close a broken
connection. Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any
other pidgate package.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: the bytes on the wire are not something pidgate can handle."""


class FrameTooLargeError(ProtocolError):
    """A frame's size prefix exceeds the configured maximum (or is negative)."""

    def __init__(self, size_bytes: int, max_frame_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.max_frame_bytes = max_frame_bytes
        if size_bytes < 0:
            detail = f"negative frame size prefix {size_bytes}"
        else:
            detail = (
                f"frame size prefix {size_bytes} bytes exceeds max_frame_bytes={max_frame_bytes}"
            )
        super().__init__(detail)


class MalformedMessageError(ProtocolError):
    """Truncated or garbage bytes where a Kafka message was expected."""


class UnsupportedApiError(ProtocolError):
    """An api key pidgate does not know, or a version of it pidgate cannot handle.

    ``correlation_id`` is set when it could be read (it sits at a fixed offset in every request
    header version), so the caller can still answer the client, e.g. with UNSUPPORTED_VERSION.
    """

    def __init__(
        self,
        message: str,
        *,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        super().__init__(message)


def unsupported_version(
    api_name: str, api_key: int, api_version: int, handled: range | None = None
) -> UnsupportedApiError:
    """The error for an ``api_name`` request or response in a version pidgate cannot read,
    naming the versions it ``handled`` when given."""
    message = f"{api_name} (api key {api_key}) version {api_version} is not supported"
    if handled is not None:
        message += f"; pidgate handles v{handled.start}..v{handled.stop - 1}"
    return UnsupportedApiError(message, api_key=api_key, api_version=api_version)
