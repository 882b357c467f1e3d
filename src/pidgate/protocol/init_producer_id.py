"""InitProducerId (api key 22): the request's transactional id and the PID the cluster hands out.

Owns ``parse_init_producer_id_request`` and ``parse_init_producer_id_response``, a hand-written
walk of both bodies (the payload after the request / response header) for every version in
Kafka's schemas, v0-v6 (flexible, KIP-482, from v2). The proxy only observes this exchange, for
the event log: it sees which PID and epoch the cluster gave to which principal, and whether the
producer is transactional. Anything that is not exactly one well-formed body (truncated, bad
lengths, invalid UTF-8, trailing bytes) raises ``MalformedMessageError``; a version outside
v0-v6 raises ``UnsupportedApiError``. kafka-python's classes are the reference in the tests.
Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pidgate.protocol._wire import (
    I16,
    I32,
    I64,
    as_memoryview,
    need,
    read_compact_nullable_string,
    read_nullable_string,
    skip_tagged_fields,
)
from pidgate.protocol.errors import MalformedMessageError, unsupported_version

__all__ = [
    "FIRST_FLEXIBLE_INIT_PRODUCER_ID_VERSION",
    "INIT_PRODUCER_ID_KEY",
    "SUPPORTED_INIT_PRODUCER_ID_VERSIONS",
    "InitProducerIdRequestSummary",
    "InitProducerIdResponseSummary",
    "parse_init_producer_id_request",
    "parse_init_producer_id_response",
]

INIT_PRODUCER_ID_KEY = 22
SUPPORTED_INIT_PRODUCER_ID_VERSIONS = range(0, 7)
"""v0-v1 classic; v2 flexible; v3 adds producer_id/epoch to the request (KIP-360); v4-v5 only
new error codes; v6 adds 2PC fields (KIP-939)."""
FIRST_FLEXIBLE_INIT_PRODUCER_ID_VERSION = 2
_FIRST_RESUMING_VERSION = 3  # request carries producer_id + producer_epoch
_FIRST_2PC_VERSION = 6  # request: enable_2pc, keep_prepared_txn; response: ongoing txn PID/epoch

_I8 = struct.Struct(">b")


@dataclass(frozen=True, slots=True)
class InitProducerIdRequestSummary:
    """An InitProducerId request. ``producer_id``/``producer_epoch`` are -1 before v3 (and when
    the client is not resuming); ``enable_2pc``/``keep_prepared_txn`` are False before v6."""

    transactional_id: str | None
    transaction_timeout_ms: int
    producer_id: int = -1
    producer_epoch: int = -1
    enable_2pc: bool = False
    keep_prepared_txn: bool = False

    @property
    def is_transactional(self) -> bool:
        """A transactional producer names a transactional id; an idempotent one sends null."""
        return self.transactional_id is not None


@dataclass(frozen=True, slots=True)
class InitProducerIdResponseSummary:
    """An InitProducerId response. ``producer_id`` is -1 when ``error_code`` is not 0;
    ``ongoing_txn_*`` are -1 before v6."""

    throttle_time_ms: int
    error_code: int
    producer_id: int
    producer_epoch: int
    ongoing_txn_producer_id: int = -1
    ongoing_txn_producer_epoch: int = -1


def _check_version(api_version: int) -> None:
    if api_version not in SUPPORTED_INIT_PRODUCER_ID_VERSIONS:
        raise unsupported_version(
            "InitProducerId", INIT_PRODUCER_ID_KEY, api_version, SUPPORTED_INIT_PRODUCER_ID_VERSIONS
        )


def _read_bool(buf: memoryview, pos: int, what: str) -> tuple[bool, int]:
    need(buf, pos, 1, what)
    value = _I8.unpack_from(buf, pos)[0]
    if value not in (0, 1):
        raise MalformedMessageError(f"invalid boolean {value} for {what} at offset {pos}")
    return bool(value), pos + 1


def _read(fmt: struct.Struct, buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    need(buf, pos, fmt.size, what)
    return int(fmt.unpack_from(buf, pos)[0]), pos + fmt.size


def _finish(buf: memoryview, pos: int, flexible: bool, what: str) -> None:
    if flexible:
        pos = skip_tagged_fields(buf, pos)
    if pos != len(buf):
        raise MalformedMessageError(
            f"{len(buf) - pos} unexpected trailing bytes after the {what} at offset {pos}"
        )


_T = TypeVar("_T")


def _walk(
    body: bytes | bytearray | memoryview,
    api_version: int,
    kind: str,
    read: Callable[[memoryview, int, bool], tuple[_T, int]],
) -> _T:
    """``read`` the body as exactly one well-formed ``kind`` ("request" or "response"):
    trailing bytes refused, every failure as MalformedMessageError."""
    _check_version(api_version)
    buf = as_memoryview(body)
    flexible = api_version >= FIRST_FLEXIBLE_INIT_PRODUCER_ID_VERSION
    what = f"InitProducerId v{api_version} {kind}"
    try:
        summary, pos = read(buf, api_version, flexible)
        _finish(buf, pos, flexible, what)
    except (MalformedMessageError, struct.error, IndexError, ValueError) as exc:
        raise MalformedMessageError(f"malformed {what} ({len(buf)} bytes): {exc}") from None
    return summary


def parse_init_producer_id_request(
    body: bytes | bytearray | memoryview, api_version: int
) -> InitProducerIdRequestSummary:
    """Walk an InitProducerIdRequest body (the payload after the request header)."""
    return _walk(body, api_version, "request", _read_request)


def _read_request(
    buf: memoryview, api_version: int, flexible: bool
) -> tuple[InitProducerIdRequestSummary, int]:
    if flexible:
        transactional_id, pos = read_compact_nullable_string(buf, 0, "transactional_id")
    else:
        transactional_id, pos = read_nullable_string(buf, 0, "transactional_id")
    timeout_ms, pos = _read(I32, buf, pos, "transaction_timeout_ms")
    producer_id = producer_epoch = -1
    if api_version >= _FIRST_RESUMING_VERSION:
        producer_id, pos = _read(I64, buf, pos, "producer_id")
        producer_epoch, pos = _read(I16, buf, pos, "producer_epoch")
    enable_2pc = keep_prepared_txn = False
    if api_version >= _FIRST_2PC_VERSION:
        enable_2pc, pos = _read_bool(buf, pos, "enable_2pc")
        keep_prepared_txn, pos = _read_bool(buf, pos, "keep_prepared_txn")
    summary = InitProducerIdRequestSummary(
        transactional_id, timeout_ms, producer_id, producer_epoch, enable_2pc, keep_prepared_txn
    )
    return summary, pos


def parse_init_producer_id_response(
    body: bytes | bytearray | memoryview, api_version: int
) -> InitProducerIdResponseSummary:
    """Walk an InitProducerIdResponse body (the payload after the response header; the
    response header is v1 for flexible versions, v0 otherwise)."""
    return _walk(body, api_version, "response", _read_response)


def _read_response(
    buf: memoryview, api_version: int, flexible: bool
) -> tuple[InitProducerIdResponseSummary, int]:
    throttle_time_ms, pos = _read(I32, buf, 0, "throttle_time_ms")
    error_code, pos = _read(I16, buf, pos, "error_code")
    producer_id, pos = _read(I64, buf, pos, "producer_id")
    producer_epoch, pos = _read(I16, buf, pos, "producer_epoch")
    ongoing_id = ongoing_epoch = -1
    if api_version >= _FIRST_2PC_VERSION:
        ongoing_id, pos = _read(I64, buf, pos, "ongoing_txn_producer_id")
        ongoing_epoch, pos = _read(I16, buf, pos, "ongoing_txn_producer_epoch")
    summary = InitProducerIdResponseSummary(
        throttle_time_ms, error_code, producer_id, producer_epoch, ongoing_id, ongoing_epoch
    )
    return summary, pos
