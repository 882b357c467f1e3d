"""The response path of one client connection: the broker's frames in, each matched to the slot
of the request it answers, read only when pidgate needs to (SASL outcomes, ApiVersions narrowed,
broker endpoints rewritten, split client-quota requests merged), and written back to the client
in request order, behind any response pidgate made itself for an earlier request.

Owns: ``ResponsePath`` (the order responses go back in: the slots owed, those the broker still
owes, the acks=0 Produce requests a broker might answer anyway) and ``ResponseClient`` (what it
needs of its client connection). Must not import the connection or produce-gate modules (they
use this one): the client is reached through ``ResponseClient`` only.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections import deque
from typing import Protocol

from pidgate.config import Settings
from pidgate.protocol.api_versions import (
    NOT_FORWARDED_APIS,
    broker_api_versions,
    narrow_api_versions_response,
)
from pidgate.protocol.endpoints import (
    may_carry_endpoints,
    produce_response_passes_unchanged,
    rewrite_endpoints,
)
from pidgate.protocol.errors import ProtocolError
from pidgate.protocol.framing import Frame, frame
from pidgate.protocol.headers import parse_response_header
from pidgate.protocol.sasl import SaslObserver
from pidgate.proxy.quota_control.quota_admin import CLIENT_QUOTA_VERSIONS
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.flow_control import ReadGate
from pidgate.proxy.serving.records import (
    API_VERSIONS,
    PRODUCE,
    RAW_SASL_TOKEN,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Slot,
)
from pidgate.proxy.serving.upstream import UpstreamConnection

_CORRELATION_ID = struct.Struct(">i")
#: Correlation ids of acks=0 Produce requests remembered per connection, in case the broker
#: answers them anyway (tansu does; Kafka brokers never do). Bounded, since a Kafka broker
#: never answers them and so never clears them.
_MAX_ACKS0_IDS = 1024


class ResponseClient(Protocol):
    """What the response path (and the produce gate) needs of its client connection
    (``connection.ClientConnection``)."""

    transport: asyncio.Transport | None
    closed: bool
    peer: str
    #: When the connection last read or wrote (monotonic s), for its idle timeout.
    last_active_s: float

    @property
    def settings(self) -> Settings:
        """The settings the connection was accepted with."""
        ...

    @property
    def upstream(self) -> UpstreamConnection | None: ...

    def process_inbox(self) -> None: ...
    def adopt_sasl_principal(self) -> None: ...
    def close(self) -> None: ...


class ResponsePath:
    """Responses owed to one client connection, and the broker's answers on their way back."""

    def __init__(
        self,
        client: ResponseClient,
        context: ProxyContext,
        gate: ReadGate,
        inbox: deque[Frame],
        sasl: SaslObserver | None,
    ) -> None:
        self._client = client
        self._context = context
        #: The client's read gate: too many responses owed pauses reading (``in_flight``).
        self._gate = gate
        self._max_in_flight = client.settings.proxy.max_in_flight_requests
        #: Requests read but not yet passed on (the request path's): read on after a response.
        self._inbox = inbox
        self._sasl = sasl
        #: Every response owed to the client, in request order (the request path appends).
        self.slots: deque[Slot] = deque()
        #: The slots the broker still owes, in the order it answers them.
        self.awaiting_upstream: deque[Slot] = deque()
        self.acks0_ids: deque[int] = deque(maxlen=_MAX_ACKS0_IDS)

    def on_upstream_frames(self, frames: list[bytes]) -> None:
        for response in frames:
            if self.acks0_ids and self._answers_acks0(response):
                continue
            if not self.awaiting_upstream:
                self.fail_upstream(
                    "unexpected_response", "the broker answered a request never sent"
                )
                return
            slot = self.awaiting_upstream.popleft()
            if (
                slot.observe is None
                and slot.merge is None
                and (
                    slot.passes_through
                    or (
                        slot.api_key == PRODUCE
                        and produce_response_passes_unchanged(
                            memoryview(response)[4:], slot.api_version
                        )
                    )
                )
            ):
                # Nothing in this response's body concerns pidgate (a Produce before v10, or a
                # later one without KIP-951 node_endpoints): match its correlation id and pass
                # it on as it is.
                if len(response) < 8:
                    self.fail_upstream("bad_response", "response shorter than its header")
                    return
                correlation_id = _CORRELATION_ID.unpack_from(response, 4)[0]
                if correlation_id != slot.correlation_id:
                    self.fail_upstream(
                        "bad_response",
                        f"response correlation_id {correlation_id} does not match the "
                        f"request's {slot.correlation_id}",
                    )
                    return
                self._context.traffic.response(
                    slot.api_key, len(response), (time.perf_counter_ns() - slot.sent_ns) / 1e9
                )
                slot.response = response
                continue
            if slot.api_key == RAW_SASL_TOKEN:
                try:
                    self._on_raw_sasl_response(response)
                except Exception as error:  # the observer never raises for tokens; belt and braces
                    self.fail_upstream("internal_error", repr(error))
                    return
                slot.response = response
                continue
            try:
                correlation_id, body_offset = parse_response_header(
                    memoryview(response)[4:], slot.api_key, slot.api_version
                )
                if correlation_id != slot.correlation_id:
                    raise ProtocolError(
                        f"response correlation_id {correlation_id} does not match the request's "
                        f"{slot.correlation_id}"
                    )
                self._context.traffic.response(
                    slot.api_key,
                    len(response),
                    (time.perf_counter_ns() - slot.sent_ns) / 1e9,
                )
                if slot.observe is not None:
                    slot.observe(memoryview(response)[4 + body_offset :])
                if slot.merge is not None:
                    response = slot.merge(response)
                else:
                    response = self._transform_response(slot, response, body_offset)
            except ProtocolError as error:
                self.fail_upstream("bad_response", str(error))
                return
            except Exception as error:  # a bug, not bad bytes: never pass a response half-done
                self.fail_upstream("internal_error", repr(error))
                return
            if may_carry_endpoints(slot.api_key, slot.api_version):
                ready = self._context.router.listeners_ready()
                if ready is not None:
                    ready.add_done_callback(functools.partial(self._fill, slot, response))
                    continue
            slot.response = response
        self.flush()
        if self._inbox:
            self._client.process_inbox()

    def _answers_acks0(self, response: bytes) -> bool:
        """True when ``response`` answers an acks=0 Produce. Kafka brokers never send one, tansu
        does; the client expects nothing, so it is dropped instead of failing the connection."""
        if len(response) < 4 + _CORRELATION_ID.size:
            return False
        correlation_id = _CORRELATION_ID.unpack_from(response, 4)[0]
        awaiting = self.awaiting_upstream
        if awaiting and awaiting[0].correlation_id == correlation_id:
            return False
        try:
            self.acks0_ids.remove(correlation_id)
        except ValueError:
            return False
        return True

    def _fill(self, slot: Slot, response: bytes, _ready: object = None) -> None:
        slot.response = response
        self.flush()
        if self._inbox:
            self._client.process_inbox()

    def _on_raw_sasl_response(self, response: bytes) -> None:
        assert self._sasl is not None
        self._sasl.on_raw_server_token(memoryview(response)[4:])
        self._client.adopt_sasl_principal()

    def _transform_response(self, slot: Slot, response: bytes, body_offset: int) -> bytes:
        payload = memoryview(response)[4:]
        body = payload[body_offset:]
        new_body: bytes | None = None
        if slot.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and self._sasl is not None:
            if slot.api_key == SASL_HANDSHAKE:
                self._sasl.on_handshake_response(body, slot.api_version)
            else:
                self._sasl.on_authenticate_response(body, slot.api_version)
                self._client.adopt_sasl_principal()
            return response
        if slot.api_key == API_VERSIONS:
            self._context.quota_admin.broker_versions = broker_api_versions(body, slot.api_version)
            new_body = narrow_api_versions_response(
                body,
                slot.api_version,
                self._context.api_version_limits,
                CLIENT_QUOTA_VERSIONS,
                drop=NOT_FORWARDED_APIS,
            )
        elif may_carry_endpoints(slot.api_key, slot.api_version):
            new_body = rewrite_endpoints(
                slot.api_key, slot.api_version, body, self._context.router.rewrite
            )
        if new_body is None:
            return response
        return frame(bytes(payload[:body_offset]) + new_body)

    def flush(self) -> None:
        """Write every response now first in line to the client, in request order."""
        client = self._client
        transport = client.transport
        if transport is None or client.closed:
            return
        ready: list[bytes] = []
        slots = self.slots
        while slots and slots[0].response is not None:
            response = slots.popleft().response
            assert response is not None
            ready.append(response)
        if ready:
            transport.writelines(ready)
            client.last_active_s = time.monotonic()
        if len(slots) >= self._max_in_flight:
            self._gate.pause("in_flight")
        elif "in_flight" in self._gate.held:
            self._gate.resume("in_flight")

    def fail_upstream(self, event: str, reason: str) -> None:
        """The broker side broke the protocol: close both sides (other connections go on)."""
        client = self._client
        self._context.traffic.protocol_error(event)
        self._context.log.warning(event, key=event, client=client.peer, error=reason)
        upstream = client.upstream
        if upstream is not None:
            upstream.close()
        client.close()
