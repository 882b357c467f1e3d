"""Live quota administration through the Kafka protocol (KIP-546 client-quota APIs), so
``pidgate quotas set --user alice --producer-ids-rate 50``, AdminClient
alter/describeClientQuotas and ``kafka-configs --describe`` work against pidgate.

pidgate answers the ``producer_ids_rate`` and ``producer_ids_observe`` (observe mode) part of
DescribeClientQuotas / AlterClientQuotas itself; every other key goes to the broker; a request
mixing both is split, and the broker's answer merged with pidgate's
(``protocol.client_quotas``). This module turns a request into a plan the connection
executes: a local response, or a frame to forward plus a ``merge`` that builds the client's
response from the broker's.

Owns: ``QuotaAdmin``, ``EffectiveQuotas`` (what is in force: rates, and modes alongside).
Must not import ``serving``, ``operations`` or the server (the connection calls it), nor any
IO: it plans, the connection sends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pidgate.config import DEFAULT_USER_ENTITY
from pidgate.protocol.client_quotas.alter import (
    ALTER_CLIENT_QUOTAS_KEY,
    changes_to_apply,
    encode_alter_response,
    split_alter_request,
)
from pidgate.protocol.client_quotas.describe import (
    DESCRIBE_CLIENT_QUOTAS_KEY,
    encode_describe_response,
    split_describe_request,
)
from pidgate.protocol.client_quotas.entities import (
    PRODUCER_IDS_OBSERVE,
    PRODUCER_IDS_RATE,
    QuotaChange,
    QuotaEntity,
)
from pidgate.protocol.framing import frame
from pidgate.protocol.headers import parse_response_header

CLIENT_QUOTA_APIS = frozenset({DESCRIBE_CLIENT_QUOTAS_KEY, ALTER_CLIENT_QUOTAS_KEY})
#: Versions pidgate answers (the schemas' range; v1 is flexible).
CLIENT_QUOTA_VERSIONS = {DESCRIBE_CLIENT_QUOTAS_KEY: (0, 1), ALTER_CLIENT_QUOTAS_KEY: (0, 1)}


def entity_key(entity: QuotaEntity) -> str:
    """The user key used in settings and overrides ("<default>" for users.<default>)."""
    return DEFAULT_USER_ENTITY if entity.is_default else str(entity.user)


def entity_for(user_key: str) -> QuotaEntity:
    return QuotaEntity.default() if user_key == DEFAULT_USER_ENTITY else QuotaEntity.named(user_key)


class EffectiveQuotas(dict[str, int]):
    """``producer_ids_rate`` in force per user key ("<default>" or a name), as a plain dict;
    ``observe`` holds ``producer_ids_observe`` per user key where set (True observe, False
    enforce). Riding on the rates keeps QuotaAdmin's one source of what is in force."""

    def __init__(self, rates: Mapping[str, int], observe: Mapping[str, bool]) -> None:
        super().__init__(rates)
        self.observe = dict(observe)


@dataclass(frozen=True)
class QuotaPlan:
    """What the connection does with one client-quota request."""

    local_response: bytes | None = None
    forward_frame: bytes | None = None
    merge: Callable[[bytes], bytes] | None = None


class QuotaAdmin:
    """Plans client-quota requests against the effective quotas.

    ``effective_rates()`` gives the producer_ids_rate per user key currently in force (config
    file overlaid with runtime overrides); ``apply(changes)`` makes changes take effect (policy
    update, persistence, shared store) and returns an error per change index that failed.
    """

    def __init__(
        self,
        effective_rates: Callable[[], Mapping[str, int]],
        apply: Callable[[list[tuple[int, QuotaChange]]], Mapping[int, tuple[int, str | None]]],
    ) -> None:
        self._effective_rates = effective_rates
        self._apply = apply
        #: Whether the upstream broker offers the client-quota APIs (learned from its
        #: ApiVersions answer; tansu does not).
        self.broker_versions: dict[int, tuple[int, int]] = {}

    def broker_supports(self, api_key: int, api_version: int) -> bool:
        supported = self.broker_versions.get(api_key)
        return supported is not None and supported[0] <= api_version <= supported[1]

    def plan(
        self,
        api_key: int,
        api_version: int,
        correlation_id: int,
        header: bytes,
        body: memoryview,
    ) -> QuotaPlan:
        """``header`` is the request header as the client sent it (reused when forwarding)."""
        broker = self.broker_supports(api_key, api_version)
        if api_key == ALTER_CLIENT_QUOTAS_KEY:
            return self._plan_alter(api_version, correlation_id, header, body, broker)
        return self._plan_describe(api_version, correlation_id, header, body, broker)

    def _plan_alter(
        self, version: int, correlation_id: int, header: bytes, body: memoryview, broker: bool
    ) -> QuotaPlan:
        plan = split_alter_request(body, version, broker_supports=broker)
        if plan.forward_body is None:
            results = self._apply(list(changes_to_apply(plan, None)))
            return QuotaPlan(
                local_response=encode_alter_response(version, correlation_id, plan, results, None)
            )

        def merge(response: bytes) -> bytes:
            broker_body = _response_body(response, ALTER_CLIENT_QUOTAS_KEY, version)
            results = self._apply(list(changes_to_apply(plan, broker_body)))
            return encode_alter_response(version, correlation_id, plan, results, broker_body)

        return QuotaPlan(forward_frame=frame(header + plan.forward_body), merge=merge)

    def _plan_describe(
        self, version: int, correlation_id: int, header: bytes, body: memoryview, broker: bool
    ) -> QuotaPlan:
        plan = split_describe_request(body, version, broker_supports=broker)
        if not plan.ask_broker or plan.forward_body is None:
            return QuotaPlan(
                local_response=encode_describe_response(
                    version, correlation_id, plan, self._ours(), None
                )
            )

        def merge(response: bytes) -> bytes:
            broker_body = _response_body(response, DESCRIBE_CLIENT_QUOTAS_KEY, version)
            return encode_describe_response(
                version, correlation_id, plan, self._ours(), broker_body
            )

        return QuotaPlan(forward_frame=frame(header + plan.forward_body), merge=merge)

    def _ours(self) -> dict[QuotaEntity, dict[str, float]]:
        rates = self._effective_rates()
        ours = {entity_for(user): {PRODUCER_IDS_RATE: float(rate)} for user, rate in rates.items()}
        observe = rates.observe if isinstance(rates, EffectiveQuotas) else {}
        for user, flag in observe.items():
            ours.setdefault(entity_for(user), {})[PRODUCER_IDS_OBSERVE] = float(flag)
        return ours


def _response_body(response: bytes, api_key: int, api_version: int) -> bytes:
    payload = memoryview(response)[4:]
    _, offset = parse_response_header(payload, api_key, api_version)
    return bytes(payload[offset:])
