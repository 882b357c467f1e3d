"""The records one client connection keeps per request, and the API keys it tells apart.

Owns: ``Slot`` (a response owed to the client, in request order), ``HeldProduce`` (a Produce
held for its principal's tokens, as ``waiting_room`` sees it), ``ProduceHeader`` (the last
Produce header of a connection) and ``LazySummary`` (a Produce body walked on first need).
Plain records: no sockets, timers, logging or metrics.

Must not import the connection, response, upstream or produce-gate modules (they all use this
one); a held Produce reaches its gate through the ``HoldKeeper`` protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from pidgate.protocol.endpoints import may_carry_endpoints
from pidgate.protocol.framing import Frame
from pidgate.protocol.produce import ProduceRequestSummary, parse_produce_request
from pidgate.proxy.quota_control.admission import ProduceContext, Rejected, monotonic_ms
from pidgate.proxy.quota_control.waiting_room import Recheck

PRODUCE = 0
API_VERSIONS = 18
INIT_PRODUCER_ID = 22
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
#: Slot marker for a bare SASL token after a v0 SaslHandshake (no Kafka header, KIP-43).
RAW_SASL_TOKEN = -1

#: Responses pidgate reads beyond the correlation id, whatever their version: SASL exchanges
#: (the principal), ApiVersions (narrowed), and the bare SASL token marker.
_READ_RESPONSES = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, RAW_SASL_TOKEN})


def _reads_response_body(api_key: int, api_version: int) -> bool:
    return api_key in _READ_RESPONSES or may_carry_endpoints(api_key, api_version)


#: Slot's answer per (api_key, api_version), memoised: a handful of pairs per process.
_PASSES_THROUGH: dict[int, bool] = {}


def _passes_through(api_key: int, api_version: int) -> bool:
    passes = not _reads_response_body(api_key, api_version)
    if len(_PASSES_THROUGH) < 4096:  # keys come from clients: bounded all the same
        _PASSES_THROUGH[(api_key << 16) | (api_version & 0xFFFF)] = passes
    return passes


class Slot:
    """A response owed to the client, in request order."""

    __slots__ = (
        "api_key",
        "api_version",
        "correlation_id",
        "merge",
        "observe",
        "passes_through",
        "response",
        "sent_ns",
    )

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        #: The response needs no reading beyond its correlation id (see _reads_response_body).
        passes = _PASSES_THROUGH.get((api_key << 16) | (api_version & 0xFFFF))
        if passes is None:
            passes = _passes_through(api_key, api_version)
        self.passes_through = passes
        self.response: bytes | None = None
        self.sent_ns = time.perf_counter_ns()
        #: For a request pidgate split (client quotas): builds the client's response from the
        #: broker's answer to the part that was forwarded.
        self.merge: Callable[[bytes], bytes] | None = None
        #: Reads the response body on its way back (e.g. the PID an InitProducerId handed out).
        self.observe: Callable[[memoryview], None] | None = None


class ProduceHeader:
    """The last Produce header of a connection past its correlation id: clients repeat it."""

    __slots__ = ("after_correlation_id", "api_version", "header_bytes")

    def __init__(self, api_version: int, header_bytes: int, after_correlation_id: bytes) -> None:
        self.api_version = api_version
        #: Where the body starts; the header's bytes from offset 8 (client_id, tagged fields).
        self.header_bytes = header_bytes
        self.after_correlation_id = after_correlation_id


class LazySummary:
    """The full walk of one Produce body (``parse_produce_request``), made on first call."""

    __slots__ = ("_api_version", "_body", "_summary")

    def __init__(self, body: memoryview, api_version: int) -> None:
        self._body = body
        self._api_version = api_version
        self._summary: ProduceRequestSummary | None = None

    def __call__(self) -> ProduceRequestSummary:
        if self._summary is None:
            self._summary = parse_produce_request(self._body, self._api_version)
        return self._summary


class HoldKeeper(Protocol):
    """Who answers for a held Produce (``produce_gate.ProduceGate``)."""

    def recheck_held(self, held: HeldProduce) -> Recheck: ...
    def expire_held(self, held: HeldProduce, tokens_ahead: int) -> None: ...


class HeldProduce:
    """A Produce held by its connection until its principal has the tokens (waiting_room)."""

    __slots__ = (
        "api_version",
        "context",
        "correlation_id",
        "keeper",
        "principal",
        "produce",
        "producer_ids",
        "request",
        "size_bytes",
        "slot",
        "unknown_producer_ids",
        "wait_until_ms",
    )

    def __init__(
        self,
        keeper: HoldKeeper,
        request: Frame,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        context: ProduceContext,
        producer_ids: tuple[int, ...],
        decision: Rejected,
    ) -> None:
        self.keeper = keeper
        self.request = request
        self.size_bytes = len(request)
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.produce = produce
        self.context = context
        self.principal = context.principal
        #: Every PID of the request (asked again as a whole), and those the quota did not know.
        self.producer_ids = producer_ids
        self.unknown_producer_ids = decision.unknown_producer_ids
        #: Its place in the connection's response order (answered when it ends).
        self.slot = Slot(PRODUCE, api_version, correlation_id)
        #: When the tokens may be there, as last computed (monotonic ms).
        self.wait_until_ms = monotonic_ms() + decision.throttle_time_ms

    def recheck(self) -> Recheck:
        return self.keeper.recheck_held(self)

    @property
    def tokens_needed(self) -> int:
        return len(self.unknown_producer_ids)

    def expire(self, tokens_ahead: int) -> None:
        self.keeper.expire_held(self, tokens_ahead)
