"""The client-quota keys pidgate owns, Kafka's codes and entity types, and the values they take.

Owns ``PRODUCER_IDS_RATE`` / ``PRODUCER_IDS_OBSERVE``, the error codes, entity and match types
the client-quota APIs use, :class:`QuotaEntity` / :class:`QuotaChange` and the validation of a
proposed value (Kafka's own messages).

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any pidgate
package outside ``pidgate.protocol``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "CLIENT_ID",
    "INVALID_REQUEST",
    "IP",
    "KNOWN_ENTITY_TYPES",
    "MATCH_ANY",
    "MATCH_DEFAULT",
    "MATCH_EXACT",
    "NONE",
    "NO_BROKER_MESSAGE",
    "OUR_KEYS",
    "PRODUCER_IDS_OBSERVE",
    "PRODUCER_IDS_RATE",
    "UNKNOWN_SERVER_ERROR",
    "UNSUPPORTED_VERSION",
    "USER",
    "Component",
    "EntityKey",
    "QuotaChange",
    "QuotaEntity",
    "entity_key",
    "kafka_entity_repr",
    "validate_producer_ids_observe",
    "validate_producer_ids_rate",
]

PRODUCER_IDS_RATE = "producer_ids_rate"
"""The KIP-936 quota key pidgate owns: new producer IDs per quota window, per user."""
PRODUCER_IDS_OBSERVE = "producer_ids_observe"
"""pidgate's mode key: 1.0 observe (would-be throttles recorded, requests forwarded), 0.0
enforce; per user and the default user, like the rate."""
OUR_KEYS = (PRODUCER_IDS_RATE, PRODUCER_IDS_OBSERVE)

# Kafka error codes (org.apache.kafka.common.protocol.Errors).
NONE = 0
UNKNOWN_SERVER_ERROR = -1
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42

# Entity types (ClientQuotaEntity.USER / CLIENT_ID / IP, KIP-546; "ip" from KIP-612).
USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
KNOWN_ENTITY_TYPES = frozenset({USER, CLIENT_ID, IP})

# DescribeClientQuotasRequest.MATCH_TYPE_* (KIP-546): these values must not change.
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_ANY = 2  # Kafka calls it MATCH_TYPE_SPECIFIED: "any specified name"

# producer_ids_rate is an integer quota (pidgate's config and QuotaPolicy hold ints): Kafka bounds
# an INT-typed quota by Integer.MAX_VALUE and allows 1e-6 of fraction (validateQuotaKeyValue).
_INT_MAX = 2**31 - 1
_FRACTION_EPSILON = 1e-6

NO_BROKER_MESSAGE = (
    "the upstream broker does not support client quotas ({api}); through pidgate only "
    f"{PRODUCER_IDS_RATE}, which pidgate serves itself, can be altered"
)

Component = tuple[str, str | None]
"""One component of a quota entity: (entity_type, entity_name); a None name is the default."""
EntityKey = tuple[Component, ...]
"""A quota entity in canonical (sorted) form: Kafka's ClientQuotaEntity is a map, so order
of components carries no meaning and a broker may echo them in any order."""


def entity_key(components: Iterable[Component]) -> EntityKey:
    return tuple(sorted(components, key=lambda c: (c[0], c[1] is not None, c[1] or "")))


def kafka_entity_repr(components: Sequence[Component]) -> str:
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
