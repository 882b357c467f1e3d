"""The client side of ``pidgate quotas``: DescribeClientQuotas / AlterClientQuotas (KIP-546)
sent to a pidgate (any Kafka endpoint, in fact) and the answer printed the way Kafka's
``kafka-configs --describe`` prints it.

Why not ``kafka-configs --alter``: Kafka's ConfigCommand refuses quota names it does not know
(``producer_ids_rate``) before sending anything. Why kafka-python's client: no Python client
offers client-quota admin methods, but kafka-python's connection manager does TLS and SASL
(PLAIN, SCRAM, GSSAPI) and version negotiation, and ships the message classes; requests go
through its ``KafkaAdminClient``'s connection manager (``_manager``, present in kafka-python 3.0).

Owns: ``QuotaClient``, ``format_describe``, ``quota_value_text`` and ``java_double``. A client
of any pidgate, not part of the running one: must not import ``serving``, ``quota_control`` or
the server.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    DescribeClientQuotasRequest,
)

from pidgate.protocol.client_quotas.entities import (
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    OUR_KEYS,
    PRODUCER_IDS_RATE,
)
from pidgate.proxy.kafka_admin import open_admin_client
from pidgate.proxy.upstream_check import describe_error
from pidgate.proxy.with_block import WithBlock

__all__ = [
    "DescribedEntry",
    "QuotaClient",
    "QuotaClientError",
    "format_describe",
    "java_double",
    "quota_value_text",
]

_USER = "user"
_TYPE_NAMES = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}


class QuotaClientError(Exception):
    """The request failed: the message carries Kafka's error name and message."""


@dataclass(frozen=True)
class DescribedEntry:
    #: (entity_type, name or None for the default), in the order the server sent them.
    entity: tuple[tuple[str, str | None], ...]
    values: tuple[tuple[str, float], ...]


def java_double(value: float) -> str:
    """``Double.toString``: what kafka-configs prints (``50.0``, ``1.0E7``, ``1.0E-4``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(float(value))  # shortest round-trip digits, never an exponent here
    sign, digits, exponent = Decimal(repr(float(value))).as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0") or "0"
    scientific = len(digits) - 1 + exponent
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{scientific}"


def _entity_text(entity: Sequence[tuple[str, str | None]]) -> str:
    by_type = dict(entity)
    parts = []
    for entity_type in ("user", "client-id", "ip"):
        if entity_type in by_type:
            name = by_type[entity_type]
            type_name = _TYPE_NAMES[entity_type]
            parts.append(
                f"{type_name} '{name}'" if name is not None else f"the default {type_name}"
            )
    return ", ".join(parts)


def quota_value_text(key: str, value: float) -> str:
    """pidgate's own keys (``producer_ids_rate``, ``producer_ids_observe``) are whole numbers
    and print as such (``3``); every other key as kafka-configs prints it (``1048576.0``)."""
    if key in OUR_KEYS and value.is_integer():
        return str(int(value))
    return java_double(value)


def format_describe(entries: Iterable[DescribedEntry]) -> str:
    """One line per entity, as ``kafka-configs --describe`` prints it, except that pidgate's
    own keys print as the integers they are (:func:`quota_value_text`)."""
    lines = []
    for entry in entries:
        values = ", ".join(f"{key}={quota_value_text(key, value)}" for key, value in entry.values)
        lines.append(f"Quota configs for {_entity_text(entry.entity)} are {values}")
    return "".join(line + "\n" for line in lines)


def _error(kind: str, code: int, message: Any) -> QuotaClientError:
    import kafka.errors

    name = type(kafka.errors.for_code(code)).__name__ if code else "NONE"
    with_message = f": {message}" if message else ""
    return QuotaClientError(f"{kind} failed with {name} ({code}){with_message}")


class QuotaClient(WithBlock):
    """One admin connection to ``bootstrap`` (a pidgate); ``security``: kafka-python settings
    (``pidgate.config.client_properties``). Use as a context manager."""

    def __init__(
        self, bootstrap: Sequence[str], security: dict[str, Any], timeout_ms: int = 30_000
    ) -> None:
        from kafka.errors import KafkaError

        try:
            self._admin = open_admin_client(
                bootstrap_servers=list(bootstrap),
                client_id="pidgate-quotas",
                request_timeout_ms=timeout_ms,
                bootstrap_timeout_ms=timeout_ms,
                **security,
            )
        except KafkaError as error:
            raise QuotaClientError(
                f"cannot reach {','.join(bootstrap)}: {describe_error(error)}"
            ) from None
        manager = getattr(self._admin, "_manager", None)
        if manager is None or not hasattr(manager, "send"):  # kafka-python's internals moved
            self._admin.close()
            raise QuotaClientError("this kafka-python version has no connection manager")
        self._manager: Any = manager

    def _on_exit(self) -> None:
        self.close()

    def close(self) -> None:
        self._admin.close()

    def _send(self, request: Any, node_id: int | None = None) -> Any:
        async def send() -> Any:
            return await self._manager.send(request, node_id=node_id)

        return self._manager.run(send)

    def node_ids(self) -> list[int]:
        """The broker nodes the cluster metadata (as pidgate rewrote it) names."""
        return sorted(int(broker.node_id) for broker in self._manager.cluster.brokers())

    def describe(self, user: str | None = None, *, default: bool = False) -> list[DescribedEntry]:
        """``--user NAME``: that user's own quotas; ``default``: users.<default>; neither: every
        entity with a user component (named or default), as ``--entity-type users`` does."""
        components: list[tuple[str, int, str | None]]
        if user is not None:
            components = [(_USER, MATCH_EXACT, user)]
        elif default:
            components = [(_USER, MATCH_DEFAULT, None)]
        else:
            components = [(_USER, MATCH_ANY, None)]
        request = DescribeClientQuotasRequest(
            components=components, strict=user is not None or default
        )
        response = self._send(request)
        if int(response.error_code):
            raise _error("DescribeClientQuotas", int(response.error_code), response.error_message)
        return [
            DescribedEntry(
                entity=tuple(
                    (str(e.entity_type), None if e.entity_name is None else str(e.entity_name))
                    for e in entry.entity or ()
                ),
                values=tuple((str(v.key), float(v.value)) for v in entry.values or ()),
            )
            for entry in response.entries or ()
        ]

    def set_rate(self, user: str | None, rate: int | None, node_id: int | None = None) -> None:
        """Set (or with ``rate`` None remove) ``producer_ids_rate`` of ``user`` (None: the
        default user), through ``node_id``'s listener (None: any)."""
        self.alter(user, [(PRODUCER_IDS_RATE, None if rate is None else float(rate))], node_id)

    def alter(
        self, user: str | None, ops: Sequence[tuple[str, float | None]], node_id: int | None = None
    ) -> None:
        """Set each (key, value) of ``user`` (None: the default user) in one request, a value
        of None removing the key, through ``node_id``'s listener (None: any)."""
        request = AlterClientQuotasRequest(
            entries=[([(_USER, user)], [(key, value or 0.0, value is None) for key, value in ops])],
            validate_only=False,
        )
        response = self._send(request, node_id)
        for entry in response.entries or ():
            if int(entry.error_code):
                raise _error("AlterClientQuotas", int(entry.error_code), entry.error_message)
