"""Client-quota APIs (KIP-546): pidgate answers for ``producer_ids_rate`` and
``producer_ids_observe`` (1.0 observe mode, 0.0 enforce), the broker for the rest.

Owns the sans-IO side of DescribeClientQuotas (api key 48) and AlterClientQuotas (api key 49) as
seen through pidgate, so that ``pidgate quotas``, the Java AdminClient's
alterClientQuotas/describeClientQuotas and ``kafka-configs --describe`` work unchanged
(``kafka-configs --alter`` refuses the name ``producer_ids_rate`` itself, before sending):

* ``split_alter_request``: validates every op on the KIP-936 key ``producer_ids_rate`` (user and
  user-default entities only) the way Kafka's controller validates its own quota values, and
  re-encodes the request without that key for the broker (``AlterPlan.forward_body``).
* ``changes_to_apply``: the validated changes to apply once the broker has answered (none for
  ``validate_only``; none for an entity whose broker part failed, keeping each entity
  all-or-nothing like Kafka).
* ``encode_alter_response``: one result per entity of the original request, in request order.
* ``split_describe_request`` / ``encode_describe_response``: KIP-546 filter semantics (match_type
  0 exact / 1 default / 2 any, ``strict``), the broker's entries plus our ``producer_ids_rate``.
* ``validate_producer_ids_rate`` / ``validate_producer_ids_observe``: the Kafka error for a bad
  value. Both keys are "ours" alike: split off, validated, answered and merged the same way.

Error semantics follow the KRaft broker and controller (Kafka 3.5+): every validation failure is
INVALID_REQUEST (42), never INVALID_CONFIG (40) — ``ClientQuotaControlManager.validateEntity``
/ ``validateQuotaKeyValue`` (KAFKA-14943 added "must be greater than 0") and
``ClientQuotasImage.describe`` (UNSUPPORTED_VERSION (35) for an unknown entity type in a
describe filter). One deliberate deviation: a rate of 0 is accepted, because pidgate's own
configuration allows it (0 = no new producer IDs for that user, ``QuotaPolicy``).

Without broker support (``broker_supports=False``, e.g. tansu, which lacks both APIs) pidgate
answers alone: our key works as usual; an entity carrying any other key fails as a whole with
UNSUPPORTED_VERSION (35) — what Java's admin client reports (UnsupportedVersionException) when a
broker does not offer an API — and the message "the upstream broker does not support client
quotas ...". Describe then lists only pidgate's own entries.

Decoding and encoding go through kafka-python's message classes (rare admin traffic, not the
hot path). Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any
pidgate package outside ``pidgate.protocol``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.framing import frame
from pidgate.protocol.headers import encode_response_header, response_header_is_flexible

__all__ = [
    "ALTER_CLIENT_QUOTAS_KEY",
    "DESCRIBE_CLIENT_QUOTAS_KEY",
    "INVALID_REQUEST",
    "MATCH_ANY",
    "MATCH_DEFAULT",
    "MATCH_EXACT",
    "OUR_KEYS",
    "PRODUCER_IDS_OBSERVE",
    "PRODUCER_IDS_RATE",
    "UNKNOWN_SERVER_ERROR",
    "UNSUPPORTED_VERSION",
    "AlterEntryPlan",
    "AlterPlan",
    "DescribePlan",
    "FilterComponent",
    "QuotaChange",
    "QuotaEntity",
    "changes_to_apply",
    "encode_alter_response",
    "encode_describe_response",
    "split_alter_request",
    "split_describe_request",
    "validate_producer_ids_observe",
    "validate_producer_ids_rate",
]

PRODUCER_IDS_RATE = "producer_ids_rate"
"""The KIP-936 quota key pidgate owns: new producer IDs per quota window, per user."""
PRODUCER_IDS_OBSERVE = "producer_ids_observe"
"""pidgate's mode key: 1.0 observe (would-be throttles recorded, requests forwarded), 0.0
enforce; per user and the default user, like the rate."""
OUR_KEYS = (PRODUCER_IDS_RATE, PRODUCER_IDS_OBSERVE)

DESCRIBE_CLIENT_QUOTAS_KEY = 48
ALTER_CLIENT_QUOTAS_KEY = 49

# Kafka error codes (org.apache.kafka.common.protocol.Errors).
NONE = 0
UNKNOWN_SERVER_ERROR = -1
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42

# Entity types (ClientQuotaEntity.USER / CLIENT_ID / IP, KIP-546; "ip" from KIP-612).
USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
_KNOWN_ENTITY_TYPES = frozenset({USER, CLIENT_ID, IP})

# DescribeClientQuotasRequest.MATCH_TYPE_* (KIP-546): these values must not change.
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_ANY = 2  # Kafka calls it MATCH_TYPE_SPECIFIED: "any specified name"

# producer_ids_rate is an integer quota (pidgate's config and QuotaPolicy hold ints): Kafka bounds
# an INT-typed quota by Integer.MAX_VALUE and allows 1e-6 of fraction (validateQuotaKeyValue).
_INT_MAX = 2**31 - 1
_FRACTION_EPSILON = 1e-6

_NO_BROKER_MESSAGE = (
    "the upstream broker does not support client quotas ({api}); through pidgate only "
    f"{PRODUCER_IDS_RATE}, which pidgate serves itself, can be altered"
)

Component = tuple[str, str | None]
"""One component of a quota entity: (entity_type, entity_name); a None name is the default."""
EntityKey = tuple[Component, ...]
"""A quota entity in canonical (sorted) form: Kafka's ClientQuotaEntity is a map, so order
of components carries no meaning and a broker may echo them in any order."""


def _entity_key(components: Iterable[Component]) -> EntityKey:
    return tuple(sorted(components, key=lambda c: (c[0], c[1] is not None, c[1] or "")))


def _kafka_entity_repr(components: Sequence[Component]) -> str:
    """Kafka's ClientQuotaEntity.toString(), as used in its error messages."""
    inner = ", ".join(f"{t}={'null' if n is None else n}" for t, n in components)
    return f"ClientQuotaEntity(entries={{{inner}}})"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A user quota entity: ``users.alice`` is ``QuotaEntity("alice", False)``; the default
    user (``users.<default>``, entity_name null on the wire) is ``QuotaEntity(None, True)``.

    KIP-936 quotas are per user, so user + client-id or client-id entities do not exist here.
    """

    user: str | None
    is_default: bool

    def __post_init__(self) -> None:
        if self.is_default != (self.user is None):
            raise ValueError("a QuotaEntity is either a named user or the default (user=None)")

    @classmethod
    def named(cls, user: str) -> QuotaEntity:
        return cls(user, False)

    @classmethod
    def default(cls) -> QuotaEntity:
        return cls(None, True)

    @property
    def components(self) -> tuple[Component, ...]:
        return ((USER, self.user),)


@dataclass(frozen=True, slots=True)
class QuotaChange:
    """Set ``key`` (``producer_ids_rate`` unless said) of ``entity`` to ``value``, or remove it
    (``value=None``)."""

    entity: QuotaEntity
    value: float | None
    key: str = PRODUCER_IDS_RATE

    @property
    def rate(self) -> int | None:
        """The value as the integer pidgate's QuotaPolicy holds (None = remove)."""
        return None if self.value is None else int(self.value)

    @property
    def observe(self) -> bool | None:
        """A ``producer_ids_observe`` value as the mode: True observe, False enforce, None
        removed."""
        return None if self.value is None else self.value >= 0.5


def validate_producer_ids_observe(value: float) -> tuple[int, str | None]:
    """(error_code, message) for a proposed ``producer_ids_observe``: 1.0 or 0.0 only."""
    if value in (0.0, 1.0):
        return NONE, None
    return (
        INVALID_REQUEST,
        f"Quota {PRODUCER_IDS_OBSERVE} must be 1.0 (observe) or 0.0 (enforce), got {value!r}",
    )


def validate_producer_ids_rate(value: float) -> tuple[int, str | None]:
    """(error_code, message) for a proposed ``producer_ids_rate``; (0, None) when valid.

    Mirrors Kafka's ``ClientQuotaControlManager.validateQuotaKeyValue`` for an INT-typed quota:
    INVALID_REQUEST with Kafka's own messages for too large ("Proposed value for ... is too large
    for an INT.") and fractional ("... cannot be a fractional value."; up to 1e-6 of fraction is
    tolerated, as in Kafka). Two departures: 0 is allowed (pidgate's "no new producer IDs"),
    where Kafka's quotas say "must be greater than 0"; and NaN is rejected (Kafka's checks all
    compare false for NaN and let it through).
    """
    if math.isnan(value):
        return INVALID_REQUEST, f"Quota {PRODUCER_IDS_RATE} must be a number, not NaN"
    if value < 0:
        return (
            INVALID_REQUEST,
            f"Quota {PRODUCER_IDS_RATE} must not be negative (0 allows no new producer IDs), "
            f"got {value!r}",
        )
    if value > _INT_MAX:
        return INVALID_REQUEST, f"Proposed value for {PRODUCER_IDS_RATE} is too large for an INT."
    if abs(value % 1.0) > _FRACTION_EPSILON:
        return INVALID_REQUEST, f"{PRODUCER_IDS_RATE} cannot be a fractional value."
    return NONE, None


# --- shared helpers ----------------------------------------------------------------------------


def _check_version(api_key: int, api_version: int, cls: Any) -> None:
    max_version = int(cls.max_version)
    if not 0 <= api_version <= max_version:
        raise UnsupportedApiError(
            f"api key {api_key} version {api_version} is not supported (0..{max_version})",
            api_key=api_key,
            api_version=api_version,
        )


def _decode(cls: Any, api_key: int, api_version: int, body: bytes | bytearray | memoryview) -> Any:
    _check_version(api_key, api_version, cls)
    try:
        return cls.decode(bytes(body), version=api_version)
    except Exception as exc:  # kafka-python raises assorted errors on garbage
        raise MalformedMessageError(
            f"malformed {cls.__name__} v{api_version}: {type(exc).__name__}: {exc}"
        ) from None


def _framed(api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    """Size prefix + response header (v1 with tagged fields for flexible v1) + body."""
    flexible = response_header_is_flexible(api_key, api_version)
    return frame(encode_response_header(correlation_id, flexible) + body)


def _components(entity_data: Iterable[Any]) -> tuple[Component, ...]:
    return tuple(
        (str(e.entity_type), None if e.entity_name is None else str(e.entity_name))
        for e in entity_data
    )


def _user_entity(components: Sequence[Component]) -> QuotaEntity | None:
    """The QuotaEntity when the entity is exactly one user component, else None."""
    if len(components) != 1 or components[0][0] != USER:
        return None
    name = components[0][1]
    return QuotaEntity.default() if name is None else QuotaEntity.named(name)


# --- AlterClientQuotas -------------------------------------------------------------------------


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
        return _entity_key(self.components)


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
    request = _decode(AlterClientQuotasRequest, ALTER_CLIENT_QUOTAS_KEY, api_version, body)
    validate_only = bool(request.validate_only)
    R = AlterClientQuotasRequest
    plans: list[AlterEntryPlan] = []
    forward_entries: list[Any] = []
    seen: set[EntityKey] = set()
    for index, entry in enumerate(request.entries or ()):
        components = _components(entry.entity or ())
        key = _entity_key(components)
        duplicate = key in seen
        seen.add(key)
        ops = list(entry.ops or ())
        ours = [op for op in ops if str(op.key) in OUR_KEYS]
        theirs = [op for op in ops if str(op.key) not in OUR_KEYS]
        entity = _user_entity(components)
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
                        _NO_BROKER_MESSAGE.format(api="AlterClientQuotas"),
                    )
                )
            else:  # no ops at all: nothing to do
                plans.append(AlterEntryPlan(index, components, entity, False, (), False))
            continue
        code, message, changes = _validate_our_entry(components, entity, ours, duplicate)
        if code == NONE and theirs and not broker_supports:
            code, message, changes = (
                UNSUPPORTED_VERSION,
                _NO_BROKER_MESSAGE.format(api="AlterClientQuotas")
                + f"; nothing was changed for {_kafka_entity_repr(components)}",
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
                f"{_kafka_entity_repr(components)}",
                (),
            )
    if duplicate:
        return INVALID_REQUEST, f"Ignoring duplicate entity {_kafka_entity_repr(components)}", ()
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
        if entity_type not in _KNOWN_ENTITY_TYPES:
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
    response = _decode(
        AlterClientQuotasResponse, ALTER_CLIENT_QUOTAS_KEY, plan.api_version, broker_response_body
    )
    results: dict[EntityKey, tuple[int, str | None]] = {}
    for entry in response.entries or ():
        message = None if entry.error_message is None else str(entry.error_message)
        results[_entity_key(_components(entry.entity or ()))] = (int(entry.error_code), message)
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
    return _framed(ALTER_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)


# --- DescribeClientQuotas ----------------------------------------------------------------------


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
        if c.entity_type not in _KNOWN_ENTITY_TYPES:
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
    request = _decode(DescribeClientQuotasRequest, DESCRIBE_CLIENT_QUOTAS_KEY, api_version, body)
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
        response = _decode(Resp, DESCRIBE_CLIENT_QUOTAS_KEY, api_version, broker_response_body)
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
        entity = _user_entity(_components(entry.entity or ()))
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
    return _framed(DESCRIBE_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)


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
    return _framed(DESCRIBE_CLIENT_QUOTAS_KEY, api_version, correlation_id, body)
