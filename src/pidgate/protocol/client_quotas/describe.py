"""DescribeClientQuotas (api key 48) through pidgate: KIP-546 filters, the broker's entries with
ours merged in.

Owns ``split_describe_request``, ``encode_describe_response`` and the filter semantics (match
type 0 exact / 1 default / 2 any, ``strict``) with Kafka's validation messages.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any pidgate
package outside ``pidgate.protocol``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.client_quotas import (
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from .codec import components_of, decode_body, framed, user_entity
from .entities import (
    CLIENT_ID,
    INVALID_REQUEST,
    IP,
    KNOWN_ENTITY_TYPES,
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    NONE,
    OUR_KEYS,
    PRODUCER_IDS_RATE,
    UNSUPPORTED_VERSION,
    USER,
    Component,
    QuotaEntity,
)

__all__ = [
    "DESCRIBE_CLIENT_QUOTAS_KEY",
    "DescribePlan",
    "FilterComponent",
    "encode_describe_response",
    "split_describe_request",
]

DESCRIBE_CLIENT_QUOTAS_KEY = 48


@dataclass(frozen=True, slots=True)
class FilterComponent:
    """One filter component: match_type 0 exact name, 1 default name, 2 any name (KIP-546)."""

    entity_type: str
    match_type: int
    match: str | None


@dataclass(frozen=True, slots=True)
class DescribePlan:
    """A DescribeClientQuotas request: its filter, and whether the broker is asked.

    ``error_code``/``error_message`` is the filter's validity as a KRaft broker judges it
    (``ClientQuotasImage.describe``). It is the answer when pidgate answers alone; when the
    broker is asked, the broker's own verdict is used and ours only decides whether pidgate adds
    its entries.
    """

    api_version: int
    components: tuple[FilterComponent, ...]
    strict: bool
    ask_broker: bool
    forward_body: bytes | None
    """The request body to send the broker unchanged (None when the broker is not asked)."""
    error_code: int = NONE
    error_message: str | None = None

    def matches(self, entity: QuotaEntity) -> bool:
        """Whether ``entity`` passes the filter (False for an invalid filter)."""
        return self.error_code == NONE and _filter_matches(
            self.components, self.strict, entity.components
        )


def _filter_matches(
    components: Sequence[FilterComponent], strict: bool, entity: Sequence[Component]
) -> bool:
    """KIP-546 matching, as Kafka's ClientQuotasImage/ClientQuotaControlManager do it: every
    exact (0) or default (1) component must be present with that name (None = default); every
    any (2) component's type must be present, with any name including the default; ``strict``
    also requires the entity to have no other component. No components: everything, or
    (strict) nothing."""
    names = dict(entity)
    if strict and len(names) != len(components):
        return False
    for c in components:
        if c.entity_type not in names:
            return False
        if c.match_type == MATCH_EXACT and names[c.entity_type] != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and names[c.entity_type] is not None:
            return False
    return True


def _filter_error(components: Sequence[FilterComponent]) -> tuple[int, str | None]:
    """Kafka's ClientQuotasImage.describe validation, same order and messages."""
    seen: set[str] = set()
    for c in components:
        if not c.entity_type:
            return INVALID_REQUEST, "Invalid empty entity type."
        if c.entity_type in seen:
            return (
                INVALID_REQUEST,
                f"Entity type {c.entity_type} cannot appear more than once in the filter.",
            )
        seen.add(c.entity_type)
        if c.entity_type not in KNOWN_ENTITY_TYPES:
            return UNSUPPORTED_VERSION, f"Unsupported entity type {c.entity_type}"
        if c.match_type == MATCH_EXACT:
            if c.match is None:
                return (
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                )
        elif c.match_type == MATCH_DEFAULT:
            if c.match is not None:
                return (
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                )
        elif c.match_type == MATCH_ANY:
            if c.match is not None:
                return (
                    INVALID_REQUEST,
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                )
        else:
            return INVALID_REQUEST, f"Unknown match type {c.match_type}"
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        return (
            INVALID_REQUEST,
            "Invalid entity filter component combination. IP filter component should not be "
            "used with user or clientId filter component.",
        )
    return NONE, None


def split_describe_request(
    body: bytes | bytearray | memoryview, api_version: int, *, broker_supports: bool = True
) -> DescribePlan:
    """Read a DescribeClientQuotas request body (after the request header).

    The broker is always asked when it supports the API (the request goes unchanged: the filter
    cannot name a key, and the broker owns every key but ours); with ``broker_supports=False``
    pidgate answers alone with its own entries.
    """
    request = decode_body(
        DescribeClientQuotasRequest, DESCRIBE_CLIENT_QUOTAS_KEY, api_version, body
    )
    components = tuple(
        FilterComponent(
            str(c.entity_type), int(c.match_type), None if c.match is None else str(c.match)
        )
        for c in request.components or ()
    )
    code, message = _filter_error(components)
    return DescribePlan(
        api_version=api_version,
        components=components,
        strict=bool(request.strict),
        ask_broker=broker_supports,
        forward_body=bytes(body) if broker_supports else None,
        error_code=code,
        error_message=message,
    )


def _sort_key(entity: QuotaEntity) -> tuple[bool, str]:
    return (not entity.is_default, entity.user or "")


def encode_describe_response(
    api_version: int,
    correlation_id: int,
    plan: DescribePlan,
    our_entries: Mapping[QuotaEntity, float | Mapping[str, float]],
    broker_response_body: bytes | bytearray | memoryview | None,
    throttle_time_ms: int = 0,
    *,
    broker_error: tuple[int, str | None] | None = None,
) -> bytes:
    """The complete framed DescribeClientQuotasResponse for the client.

    ``our_entries``: pidgate's current values per user entity (set values only): a float is
    ``producer_ids_rate``; a mapping holds our keys (``producer_ids_observe`` too).
    When the broker was asked and failed, its error is the answer (entries null, as Kafka sends
    errors). Otherwise: the broker's entries in its order, with any ``producer_ids_rate`` it
    reported dropped (pidgate owns that key) and ours added to the matching single-user entity;
    then our matching entities the broker did not list (default first, then by name). An entry
    left with no values is omitted (Kafka never lists an entity without quotas).
    """
    if api_version != plan.api_version:
        raise ValueError(f"plan is for v{plan.api_version}, not v{api_version}")
    Resp = DescribeClientQuotasResponse
    throttle = throttle_time_ms
    broker_entries: list[Any] = []
    if plan.ask_broker:
        if broker_response_body is None:
            if broker_error is None:
                raise ValueError("the plan asks the broker: pass its response body or broker_error")
            return _describe_error(api_version, correlation_id, throttle, broker_error)
        response = decode_body(Resp, DESCRIBE_CLIENT_QUOTAS_KEY, api_version, broker_response_body)
        throttle = max(throttle, int(response.throttle_time_ms))
        if int(response.error_code) != NONE:
            message = None if response.error_message is None else str(response.error_message)
            return _describe_error(
                api_version, correlation_id, throttle, (int(response.error_code), message)
            )
        broker_entries = list(response.entries or ())
    elif plan.error_code != NONE:
        return _describe_error(
            api_version, correlation_id, throttle, (plan.error_code, plan.error_message)
        )

    ours = {
        e: {PRODUCER_IDS_RATE: v} if isinstance(v, int | float) else v
        for e, v in our_entries.items()
        if plan.matches(e)
    }

    def our_values(entity: QuotaEntity) -> list[Any]:
        return [
            Resp.EntryData.ValueData(key=key, value=float(value))
            for key, value in ours.pop(entity).items()
        ]

    entries: list[Any] = []
    for entry in broker_entries:
        values = [v for v in entry.values or () if str(v.key) not in OUR_KEYS]
        entity = user_entity(components_of(entry.entity or ()))
        if entity is not None and entity in ours:
            values += our_values(entity)
        if values:
            entries.append(Resp.EntryData(entity=list(entry.entity or ()), values=values))
    for entity in sorted(ours, key=_sort_key):
        entries.append(
            Resp.EntryData(
                entity=[Resp.EntryData.EntityData(entity_type=USER, entity_name=entity.user)],
                values=our_values(entity),
            )
        )
    response_out = Resp(
        throttle_time_ms=throttle, error_code=NONE, error_message=None, entries=entries
    )
    body = bytes(response_out.encode(version=api_version))
    return framed(DESCRIBE_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)


def _describe_error(
    api_version: int, correlation_id: int, throttle_time_ms: int, error: tuple[int, str | None]
) -> bytes:
    response = DescribeClientQuotasResponse(
        throttle_time_ms=throttle_time_ms,
        error_code=error[0],
        error_message=error[1],
        entries=None,
    )
    body = bytes(response.encode(version=api_version))
    return framed(DESCRIBE_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)
