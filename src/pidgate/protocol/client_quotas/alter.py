"""AlterClientQuotas (api key 49) through pidgate: our keys split off and validated, the rest
forwarded, one answer per entity.

Owns ``split_alter_request``, ``changes_to_apply`` and ``encode_alter_response`` (the package
docstring says what each does).

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any pidgate
package outside ``pidgate.protocol``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, AlterClientQuotasResponse

from .codec import components_of, decode_body, framed, user_entity
from .entities import (
    INVALID_REQUEST,
    KNOWN_ENTITY_TYPES,
    NO_BROKER_MESSAGE,
    NONE,
    OUR_KEYS,
    PRODUCER_IDS_RATE,
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_VERSION,
    Component,
    EntityKey,
    QuotaChange,
    QuotaEntity,
    entity_key,
    kafka_entity_repr,
    validate_producer_ids_observe,
    validate_producer_ids_rate,
)

__all__ = [
    "ALTER_CLIENT_QUOTAS_KEY",
    "AlterEntryPlan",
    "AlterPlan",
    "changes_to_apply",
    "encode_alter_response",
    "split_alter_request",
]

ALTER_CLIENT_QUOTAS_KEY = 49


@dataclass(frozen=True, slots=True)
class AlterEntryPlan:
    """What happens to one entry (entity + ops) of the client's AlterClientQuotas request.

    ``error_code``/``error_message`` is pidgate's own verdict (0 = none): validation of our key,
    or the broker lacking the API. ``change`` is set when the entry carries a valid op on our
    key. ``forwarded`` says whether the entry's other ops went to the broker.
    """

    index: int
    components: tuple[Component, ...]
    """The entity exactly as the client sent it (echoed in the response)."""
    entity: QuotaEntity | None
    """The user entity, when the entity is exactly one ``user`` component."""
    has_our_key: bool
    changes: tuple[QuotaChange, ...]
    """One per op on our keys, when they are all valid."""
    forwarded: bool
    error_code: int = NONE
    error_message: str | None = None

    @property
    def change(self) -> QuotaChange | None:
        """The first change (an entry usually carries one)."""
        return self.changes[0] if self.changes else None

    @property
    def key(self) -> EntityKey:
        return entity_key(self.components)


@dataclass(frozen=True, slots=True)
class AlterPlan:
    """The AlterClientQuotas request split into pidgate's part and the broker's part."""

    api_version: int
    validate_only: bool
    entries: tuple[AlterEntryPlan, ...]
    """One per entry of the original request, in request order."""
    forward_body: bytes | None
    """The request body re-encoded (same version, same validate_only) without any op on
    ``producer_ids_rate`` and without entries pidgate already failed; None when nothing is left
    for the broker."""

    @property
    def our_changes(self) -> tuple[AlterEntryPlan, ...]:
        """The entries that carry our key: each a valid ``change`` or an error."""
        return tuple(e for e in self.entries if e.has_our_key)


def split_alter_request(
    body: bytes | bytearray | memoryview, api_version: int, *, broker_supports: bool = True
) -> AlterPlan:
    """Split an AlterClientQuotas request body (after the request header).

    Per entry, like Kafka's controller (``ClientQuotaControlManager.alterClientQuotas``) an
    entity is all-or-nothing: when our part is invalid, the entry's other ops are not forwarded
    either, and (see ``changes_to_apply``) our change is applied only when the broker accepted
    the rest. Entries without our key are forwarded untouched (the broker validates them), or,
    with ``broker_supports=False``, fail with UNSUPPORTED_VERSION.
    """
    request = decode_body(AlterClientQuotasRequest, ALTER_CLIENT_QUOTAS_KEY, api_version, body)
    validate_only = bool(request.validate_only)
    R = AlterClientQuotasRequest
    plans: list[AlterEntryPlan] = []
    forward_entries: list[Any] = []
    seen: set[EntityKey] = set()
    for index, entry in enumerate(request.entries or ()):
        components = components_of(entry.entity or ())
        key = entity_key(components)
        duplicate = key in seen
        seen.add(key)
        ops = list(entry.ops or ())
        ours = [op for op in ops if str(op.key) in OUR_KEYS]
        theirs = [op for op in ops if str(op.key) not in OUR_KEYS]
        entity = user_entity(components)
        if not ours:
            if broker_supports:
                forward_entries.append(entry)
                plans.append(AlterEntryPlan(index, components, entity, False, (), True))
            elif theirs:
                plans.append(
                    AlterEntryPlan(
                        index,
                        components,
                        entity,
                        False,
                        (),
                        False,
                        UNSUPPORTED_VERSION,
                        NO_BROKER_MESSAGE.format(api="AlterClientQuotas"),
                    )
                )
            else:  # no ops at all: nothing to do
                plans.append(AlterEntryPlan(index, components, entity, False, (), False))
            continue
        code, message, changes = _validate_our_entry(components, entity, ours, duplicate)
        if code == NONE and theirs and not broker_supports:
            code, message, changes = (
                UNSUPPORTED_VERSION,
                NO_BROKER_MESSAGE.format(api="AlterClientQuotas")
                + f"; nothing was changed for {kafka_entity_repr(components)}",
                (),
            )
        forwarded = code == NONE and bool(theirs)
        if forwarded:
            forward_entries.append(R.EntryData(entity=list(entry.entity or ()), ops=theirs))
        plans.append(
            AlterEntryPlan(index, components, entity, True, changes, forwarded, code, message)
        )
    forward_body: bytes | None = None
    if forward_entries:
        forward = R(entries=forward_entries, validate_only=validate_only)
        forward_body = bytes(forward.encode(version=api_version))
    return AlterPlan(api_version, validate_only, tuple(plans), forward_body)


def _validate_our_entry(
    components: tuple[Component, ...],
    entity: QuotaEntity | None,
    ours: Sequence[Any],
    duplicate: bool,
) -> tuple[int, str | None, tuple[QuotaChange, ...]]:
    """Kafka's order of checks (ClientQuotaControlManager): duplicate key, duplicate entity,
    entity shape, then the values. Only ops on our keys are judged here."""
    keys = [str(op.key) for op in ours]
    for key in keys:
        if keys.count(key) > 1:
            return (
                INVALID_REQUEST,
                f"Duplicate quota key {key} not updating quota for this entity "
                f"{kafka_entity_repr(components)}",
                (),
            )
    if duplicate:
        return INVALID_REQUEST, f"Ignoring duplicate entity {kafka_entity_repr(components)}", ()
    error = _entity_error(components)
    if error is not None:
        return INVALID_REQUEST, error, ()
    if entity is None:
        types = "+".join(t for t, _ in components)
        return (
            INVALID_REQUEST,
            f"{keys[0]} is a per-user quota (KIP-936): set it on a user entity "
            f"(--entity-type users with --entity-name or --entity-default), not on {types}",
            (),
        )
    changes: list[QuotaChange] = []
    for op, key in zip(ours, keys, strict=True):
        if bool(op.remove):
            changes.append(QuotaChange(entity, None, key))
            continue
        value = float(op.value)
        if key == PRODUCER_IDS_RATE:
            code, message = validate_producer_ids_rate(value)
            value = float(int(value)) if code == NONE else value
        else:
            code, message = validate_producer_ids_observe(value)
        if code != NONE:
            return code, message, ()
        changes.append(QuotaChange(entity, value, key))
    return NONE, None, tuple(changes)


def _entity_error(components: Sequence[Component]) -> str | None:
    """Kafka's ClientQuotaControlManager.validateEntity messages (all INVALID_REQUEST)."""
    if not components:
        return "Invalid empty client quota entity"
    types: set[str] = set()
    for entity_type, name in components:
        if entity_type in types:
            return f"Invalid client quota entity, duplicate entity entry {entity_type}"
        types.add(entity_type)
        if entity_type not in KNOWN_ENTITY_TYPES:
            return f"Unhandled client quota entity type: {entity_type}"
        if name is not None and not name:
            return f"Empty {entity_type} not supported"
    return None


def _broker_alter_results(
    plan: AlterPlan,
    broker_response_body: bytes | bytearray | memoryview | None,
    broker_error: tuple[int, str | None] | None,
) -> tuple[dict[EntityKey, tuple[int, str | None]], int]:
    """(entity -> broker's (error_code, message), broker throttle_time_ms)."""
    if plan.forward_body is None:
        return {}, 0
    if broker_response_body is None:
        if broker_error is None:
            raise ValueError(
                "the plan forwarded entries to the broker: pass its response body or broker_error"
            )
        return {e.key: broker_error for e in plan.entries if e.forwarded}, 0
    response = decode_body(
        AlterClientQuotasResponse, ALTER_CLIENT_QUOTAS_KEY, plan.api_version, broker_response_body
    )
    results: dict[EntityKey, tuple[int, str | None]] = {}
    for entry in response.entries or ():
        message = None if entry.error_message is None else str(entry.error_message)
        results[entity_key(components_of(entry.entity or ()))] = (int(entry.error_code), message)
    return results, int(response.throttle_time_ms)


_MISSING_BROKER_RESULT = (
    UNKNOWN_SERVER_ERROR,
    "the upstream broker's AlterClientQuotas response has no result for this entity",
)


def changes_to_apply(
    plan: AlterPlan,
    broker_response_body: bytes | bytearray | memoryview | None,
    *,
    broker_error: tuple[int, str | None] | None = None,
) -> tuple[tuple[int, QuotaChange], ...]:
    """(entry index, change) for every valid change on our key that should now take effect.

    Empty for ``validate_only``. A change whose entity also carried broker keys is applied only
    if the broker accepted that entity (Kafka applies an entity's ops all or none). Call after
    the broker answered (``broker_response_body`` = its response body after the header; None
    when ``plan.forward_body`` is None, or with ``broker_error`` when the broker could not be
    asked).
    """
    if plan.validate_only:
        return ()
    results: Mapping[EntityKey, tuple[int, str | None]] = {}
    if any(e.forwarded and e.changes for e in plan.entries):
        results, _ = _broker_alter_results(plan, broker_response_body, broker_error)
    out: list[tuple[int, QuotaChange]] = []
    for entry in plan.entries:
        if not entry.changes or entry.error_code != NONE:
            continue
        if entry.forwarded and results.get(entry.key, _MISSING_BROKER_RESULT)[0] != NONE:
            continue
        out.extend((entry.index, change) for change in entry.changes)
    return tuple(out)


def encode_alter_response(
    api_version: int,
    correlation_id: int,
    plan: AlterPlan,
    our_results: Mapping[int, tuple[int, str | None]],
    broker_response_body: bytes | bytearray | memoryview | None,
    throttle_time_ms: int = 0,
    *,
    broker_error: tuple[int, str | None] | None = None,
) -> bytes:
    """The complete framed AlterClientQuotasResponse for the client.

    One entry per entry of the original request, in request order, echoing its entity. An
    entry's result, first failure wins: pidgate's own verdict from the plan; the broker's error
    for its forwarded part; ``our_results[index]`` (how applying our change went, keyed by entry
    index, absent = success). throttle_time_ms is the larger of the broker's and the argument.
    """
    if api_version != plan.api_version:
        raise ValueError(f"plan is for v{plan.api_version}, not v{api_version}")
    results, broker_throttle = _broker_alter_results(plan, broker_response_body, broker_error)
    Resp = AlterClientQuotasResponse
    entries: list[Any] = []
    for entry in plan.entries:
        code, message = entry.error_code, entry.error_message
        if code == NONE and entry.forwarded:
            code, message = results.get(entry.key, _MISSING_BROKER_RESULT)
        if code == NONE and entry.has_our_key:
            code, message = our_results.get(entry.index, (NONE, None))
        entries.append(
            Resp.EntryData(
                error_code=code,
                error_message=message,
                entity=[
                    Resp.EntryData.EntityData(entity_type=t, entity_name=n)
                    for t, n in entry.components
                ],
            )
        )
    response = Resp(throttle_time_ms=max(throttle_time_ms, broker_throttle), entries=entries)
    body = bytes(response.encode(version=api_version))
    return framed(ALTER_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)
