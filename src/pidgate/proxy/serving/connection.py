"""One client connection and its upstream broker connection.

Owns the per-connection request/response pipeline:
- frames cut by ``protocol.framing``; most forwarded untouched (every complete frame of one
  read in a single ``writelines``: send calls decide small-frame speed);
- Produce requests walked and put through the ``Gatekeeper``; a rejected one is held (its
  connection not read) until its principal has the tokens or the quota changes, then forwarded
  (``waiting_room``); a hold that runs out, or one there is no room for, is answered locally
  with the throttle time (muted for it when not held, as brokers do since KIP-219), and later
  in-flight batches of the same producer and partition are rejected with it
  (``ordering.ProduceOrderGuard``);
- responses go back in request order: a locally made response waits behind the responses the
  broker still owes for earlier requests;
- ApiVersions responses narrowed, broker endpoints rewritten (``Router``);
- backpressure both ways: a side that cannot take writes stops reading of the other side, and
  too many requests in flight stop reading of the client;
- limits: a connection beyond ``proxy.max_connections`` (total) or
  ``proxy.max_connections_per_ip`` is closed at once (``ConnectionLimits``); one quiet for
  ``proxy.idle_timeout_ms`` with no response owed is closed; one whose reading is paused is
  checked every second for a client hang-up (TCP state), which a paused transport cannot see.

A protocol error on either side closes both connections; the process and other connections
are unaffected. Pausing and resuming reads, connection limits and the hang-up probe live in
``flow_control``; the order rule in ``ordering``.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections import deque
from collections.abc import Callable, Collection
from typing import Any, cast

from pidgate.protocol.api_versions import (
    NOT_FORWARDED_APIS,
    ClientSoftware,
    broker_api_versions,
    encode_api_versions_unsupported,
    forwarded_untouched,
    narrow_api_versions_response,
    parse_api_versions_request,
)
from pidgate.protocol.endpoints import may_carry_endpoints, rewrite_endpoints
from pidgate.protocol.errors import ProtocolError, UnsupportedApiError
from pidgate.protocol.framing import Frame, FrameDecoder, FrameReader, frame
from pidgate.protocol.headers import (
    RequestHeader,
    parse_request_header,
    parse_response_header,
)
from pidgate.protocol.init_producer_id import (
    parse_init_producer_id_request,
    parse_init_producer_id_response,
)
from pidgate.protocol.produce import (
    ProduceRequestSummary,
    encode_produce_rejection,
    parse_produce_request,
    produce_acks_and_producer_ids,
)
from pidgate.proxy.quota_control.admission import (
    ProduceContext,
    Rejected,
    WouldReject,
    monotonic_ms,
    quota_clock_ms,
    rejection_error_code,
)
from pidgate.proxy.quota_control.quota_admin import CLIENT_QUOTA_APIS, CLIENT_QUOTA_VERSIONS
from pidgate.proxy.quota_control.waiting_room import Recheck
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.flow_control import (
    HANG_UP_PROBE_INTERVAL_S,
    ConnectionLimits,
    ReadGate,
    peer_has_hung_up,
)
from pidgate.proxy.serving.identity import UnmappablePrincipalError
from pidgate.proxy.serving.ordering import ProduceOrderGuard

PRODUCE = 0
API_VERSIONS = 18
INIT_PRODUCER_ID = 22
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
#: Slot marker for a bare SASL token after a v0 SaslHandshake (no Kafka header, KIP-43).
RAW_SASL_TOKEN = -1
_API_KEY_VERSION_CORRELATION = struct.Struct(">hhi")
_CORRELATION_ID = struct.Struct(">i")
#: Correlation ids of acks=0 Produce requests remembered per connection, in case the broker
#: answers them anyway (tansu does; Kafka brokers never do). Bounded, since a Kafka broker
#: never answers them and so never clears them.
_MAX_ACKS0_IDS = 1024

Address = tuple[str, int]

#: Responses pidgate reads beyond the correlation id, whatever their version: SASL exchanges
#: (the principal), ApiVersions (narrowed), and the bare SASL token marker.
_READ_RESPONSES = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS, RAW_SASL_TOKEN})


def _reads_response_body(api_key: int, api_version: int) -> bool:
    return api_key in _READ_RESPONSES or may_carry_endpoints(api_key, api_version)


#: _Slot's answer per (api_key, api_version), memoised: a handful of pairs per process.
_PASSES_THROUGH: dict[int, bool] = {}


def _passes_through(api_key: int, api_version: int) -> bool:
    passes = not _reads_response_body(api_key, api_version)
    if len(_PASSES_THROUGH) < 4096:  # keys come from clients: bounded all the same
        _PASSES_THROUGH[(api_key << 16) | (api_version & 0xFFFF)] = passes
    return passes


class _Slot:
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


class _ProduceHeader:
    """The last Produce header of a connection past its correlation id: clients repeat it."""

    __slots__ = ("after_correlation_id", "api_version", "header_bytes")

    def __init__(self, api_version: int, header_bytes: int, after_correlation_id: bytes) -> None:
        self.api_version = api_version
        #: Where the body starts; the header's bytes from offset 8 (client_id, tagged fields).
        self.header_bytes = header_bytes
        self.after_correlation_id = after_correlation_id


class _LazySummary:
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


#: Holds shorter than this are not worth a timer: the request is answered at once instead.
_MIN_HOLD_MS = 50


class _HeldProduce:
    """A Produce held by its connection until its principal has the tokens (waiting_room)."""

    __slots__ = (
        "api_version",
        "connection",
        "context",
        "correlation_id",
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
        connection: ClientConnection,
        request: Frame,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        context: ProduceContext,
        producer_ids: tuple[int, ...],
        decision: Rejected,
    ) -> None:
        self.connection = connection
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
        self.slot = _Slot(PRODUCE, api_version, correlation_id)
        #: When the tokens may be there, as last computed (monotonic ms).
        self.wait_until_ms = monotonic_ms() + decision.throttle_time_ms

    def recheck(self) -> Recheck:
        return self.connection._recheck_held(self)

    @property
    def tokens_needed(self) -> int:
        return len(self.unknown_producer_ids)

    def expire(self, tokens_ahead: int) -> None:
        self.connection._expire_held(self, tokens_ahead)


class ClientConnection(asyncio.BufferedProtocol):
    """The client side; owns the upstream connection it opens."""

    def __init__(
        self,
        context: ProxyContext,
        upstream_targets: Callable[[], list[Address]],
        node_id: int | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._context = context
        #: None: no connection limits (only the idle timeout applies).
        self._limits = limits
        #: The IP this connection is counted under in ``_limits``; None when not counted.
        self._counted_ip: str | None = None
        self._idle_handle: asyncio.TimerHandle | None = None
        self._last_active_s = time.monotonic()
        self.node_id = node_id
        self._settings = context.settings
        self._upstream_targets = upstream_targets
        self._reader = FrameReader(
            self._settings.proxy.max_frame_bytes, context.read_scratch, context.frame_buffer_budget
        )
        self._gate = ReadGate(on_pause=self._watch_for_hang_up)
        self._hang_up_probe: asyncio.TimerHandle | None = None
        self._inbox: deque[Frame] = deque()
        self._slots: deque[_Slot] = deque()
        self._awaiting_upstream: deque[_Slot] = deque()
        self._acks0_ids: deque[int] = deque(maxlen=_MAX_ACKS0_IDS)
        self._upstream: UpstreamConnection | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._unmute_handle: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        #: Who pays for this connection's new PIDs; None until SASL authentication succeeds.
        self.principal: str | None = None
        self._sasl = context.identity.new_sasl_observer()
        self.client_id: str | None = None
        self.client_software = ClientSoftware(name=None, version=None)
        self.closed = False
        # Per-connection values the hot path would otherwise rebuild for every Produce.
        self._produce_context: ProduceContext | None = None
        self._produce_header: _ProduceHeader | None = None
        #: Batches rejected here that later in-flight batches must not overtake (ordering.py).
        self._order_guard = ProduceOrderGuard()
        #: When the throttle of this connection's latest rejection ends (monotonic ms).
        self._throttled_until_ms = 0
        #: The Produce held for tokens; nothing after it is read or forwarded until it ends.
        self._held: _HeldProduce | None = None

    # -- asyncio.Protocol (client side) ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if self._limits is not None and not self._within_limits(transport, peer):
            return
        try:
            self.principal = self._context.identity.principal_for_connection(
                transport.get_extra_info("peercert")
            )
        except UnmappablePrincipalError as error:
            # Kafka fails the authentication of such a client; so do we.
            self._context.log.warning(
                "principal_unmappable",
                key=self.peer.rpartition(":")[0],
                client=self.peer,
                error=str(error),
            )
            transport.close()
            return
        high = self._settings.proxy.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self._gate.attach(transport)
        # Data can arrive before the upstream connection is ready (seen with uvloop): it is kept
        # in the inbox, and reading pauses until the broker side exists.
        self._gate.pause("connecting")
        self._context.connections.add(self)
        self._context.traffic.connection_opened()
        self._connect_task = asyncio.ensure_future(self._connect_upstream())
        self._schedule_idle_check(self._settings.proxy.idle_timeout_ms / 1000)

    def _within_limits(self, transport: asyncio.Transport, peer: object) -> bool:
        """Count this connection, or close it at once when over a connection limit."""
        assert self._limits is not None
        ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        settings = self._settings.proxy
        exceeded = self._limits.acquire(
            ip, settings.max_connections, settings.max_connections_per_ip
        )
        if exceeded is None:
            self._counted_ip = ip
            return True
        self.closed = True
        self._context.traffic.protocol_error(exceeded)
        self._context.log.warning(
            exceeded,
            # One key per client host: a flood from one host is a bounded number of lines.
            key=ip,
            client=self.peer,
            open_connections=self._limits.total,
            open_from_ip=self._limits.from_ip(ip),
            max_connections=settings.max_connections,
            max_connections_per_ip=settings.max_connections_per_ip,
        )
        transport.abort()  # nothing was read or owed: no need to flush anything
        return False

    def _schedule_idle_check(self, delay_s: float) -> None:
        if delay_s <= 0 or self.closed:
            return
        loop = asyncio.get_running_loop()
        self._idle_handle = loop.call_later(delay_s, self._check_idle)

    def _check_idle(self) -> None:
        """Timer: close the connection if quiet for ``idle_timeout_ms`` with nothing owed,
        else look again when it could first be. One timer per connection, never re-armed on
        the hot path: reads and writes only note the time."""
        self._idle_handle = None
        timeout_s = self._settings.proxy.idle_timeout_ms / 1000
        if self.closed or timeout_s <= 0:
            return
        quiet_s = time.monotonic() - self._last_active_s
        if not self.idle:
            self._schedule_idle_check(timeout_s)
        elif quiet_s < timeout_s:
            self._schedule_idle_check(timeout_s - quiet_s)
        else:
            self._context.log.info(
                "idle_connection_closed",
                key=self.peer.rpartition(":")[0],
                client=self.peer,
                client_id=self.client_id,
                idle_ms=int(quiet_s * 1000),
            )
            self.close()

    def _watch_for_hang_up(self) -> None:
        """Reading just paused (in-flight limit, mute, backpressure, connecting): a paused
        transport never sees the client's FIN, so look at the socket's TCP state instead, every
        ``HANG_UP_PROBE_INTERVAL_S`` while paused. Without this, a client that gave up on a
        hung or slow broker (its request timeout) kept both sockets, and the broker's state for
        them, until the broker answered."""
        if self._hang_up_probe is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._hang_up_probe = loop.call_later(HANG_UP_PROBE_INTERVAL_S, self._probe_hang_up)

    def _probe_hang_up(self) -> None:
        self._hang_up_probe = None
        if self.closed or self.transport is None or not self._gate.paused:
            return
        if not peer_has_hung_up(self.transport):
            self._watch_for_hang_up()
            return
        self._context.log.info(
            "client_hung_up_while_paused",
            key=self.peer.rpartition(":")[0],
            client=self.peer,
            client_id=self.client_id,
            responses_owed=len(self._slots),
        )
        # Kafka brokers close a connection on EOF and drop what it still owed; so do we. What
        # was already forwarded stays forwarded; what was never read is never forwarded.
        self.transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        # Big frames are read into buffers of their own size, in place (FrameReader).
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._last_active_s = time.monotonic()
        if self._gate.held:
            self._gate.enforce()  # at most this one read while paused (uvloop, see ReadGate)
        try:
            frames = self._reader.buffer_updated(nbytes)
        except ProtocolError as error:
            self._fail("bad_request_frame", error)
            return
        if frames:
            self._inbox.extend(frames)
        self._process_inbox()

    def data_received(self, data: bytes) -> None:
        """``data`` as a plain Protocol would get it (benchmarks and tests without a loop)."""
        view = memoryview(data)
        while view and not self.closed:
            target = self.get_buffer(len(view))
            count = min(len(target), len(view))
            target[:count] = view[:count]
            view = view[count:]
            self.buffer_updated(count)

    def begin_shutdown(self) -> None:
        """Stop reading: requests already read are still forwarded and answered; anything the
        client sends after this is never forwarded, so its retry elsewhere cannot duplicate.
        A held Produce is answered (rejected) now: its client retries elsewhere."""
        self._gate.pause("shutdown")
        held = self._held
        if held is not None and self._context.waiting_room is not None:
            self._context.waiting_room.expire_now(held)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._reader.release()  # a big frame cut short gives its buffer back to the loop
        if self in self._context.connections:
            self._context.connections.discard(self)
            self._context.traffic.connection_closed(self.peer)
        if self._limits is not None and self._counted_ip is not None:
            self._limits.release(self._counted_ip)
            self._counted_ip = None
        if self._unmute_handle is not None:
            self._unmute_handle.cancel()
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        if self._hang_up_probe is not None:
            self._hang_up_probe.cancel()
            self._hang_up_probe = None
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        if self._held is not None and self._context.waiting_room is not None:
            # Never forwarded now: its client is gone (and will retry elsewhere, if at all).
            self._context.waiting_room.drop(self._held)
            self._held = None
        if self._upstream is not None:
            self._upstream.close()
        self._inbox.clear()
        self._slots.clear()

    def pause_writing(self) -> None:
        if self._upstream is not None:
            self._upstream.gate.pause("client_backpressure")

    def resume_writing(self) -> None:
        if self._upstream is not None:
            self._upstream.gate.resume("client_backpressure")

    # -- state --------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No request read from the client is waiting for a response (graceful shutdown
        waits for this after ``begin_shutdown``)."""
        return not self._slots and not self._inbox

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- upstream -----------------------------------------------------------------------------

    async def _connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        timeout_s = self._settings.proxy.upstream_connect_timeout_ms / 1000
        last_error: BaseException | None = None
        targets = self._upstream_targets()
        for host, port in targets:
            try:
                _, upstream = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: UpstreamConnection(self),
                        host,
                        port,
                        ssl=self._context.upstream_ssl,
                        server_hostname=host if self._context.upstream_ssl else None,
                    ),
                    timeout_s,
                )
            except asyncio.CancelledError:
                raise
            except Exception as error:  # OSError, timeout, and e.g. UnicodeError for bad hosts
                last_error = error
                continue
            if self.closed:
                upstream.close()
                return
            self._upstream = upstream
            self._gate.resume("connecting")
            self._process_inbox()
            return
        self._context.log.warning(
            "upstream_unreachable",
            key="upstream_unreachable",
            upstreams=[f"{host}:{port}" for host, port in targets],
            error=str(last_error) if last_error else "no upstream configured",
            client=self.peer,
        )
        self.close()

    def on_upstream_lost(self) -> None:
        if not self.closed:
            self.close()

    def on_upstream_frames(self, frames: list[bytes]) -> None:
        for response in frames:
            if self._acks0_ids and self._answers_acks0(response):
                continue
            if not self._awaiting_upstream:
                self._fail_upstream(
                    "unexpected_response", "the broker answered a request never sent"
                )
                return
            slot = self._awaiting_upstream.popleft()
            if slot.observe is None and slot.merge is None and slot.passes_through:
                # Nothing in this response's body concerns pidgate (a Produce before v10 above
                # all): match its correlation id and pass it on unread.
                if len(response) < 8:
                    self._fail_upstream("bad_response", "response shorter than its header")
                    return
                correlation_id = _CORRELATION_ID.unpack_from(response, 4)[0]
                if correlation_id != slot.correlation_id:
                    self._fail_upstream(
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
                    self._fail_upstream("internal_error", repr(error))
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
                self._fail_upstream("bad_response", str(error))
                return
            except Exception as error:  # a bug, not bad bytes: never pass a response half-done
                self._fail_upstream("internal_error", repr(error))
                return
            if may_carry_endpoints(slot.api_key, slot.api_version):
                ready = self._context.router.listeners_ready()
                if ready is not None:
                    ready.add_done_callback(functools.partial(self._fill, slot, response))
                    continue
            slot.response = response
        self._flush_responses()
        if self._inbox:
            self._process_inbox()

    def _answers_acks0(self, response: bytes) -> bool:
        """True when ``response`` answers an acks=0 Produce. Kafka brokers never send one, tansu
        does; the client expects nothing, so it is dropped instead of failing the connection."""
        if len(response) < 4 + _CORRELATION_ID.size:
            return False
        correlation_id = _CORRELATION_ID.unpack_from(response, 4)[0]
        awaiting = self._awaiting_upstream
        if awaiting and awaiting[0].correlation_id == correlation_id:
            return False
        try:
            self._acks0_ids.remove(correlation_id)
        except ValueError:
            return False
        return True

    def _fill(self, slot: _Slot, response: bytes, _ready: object = None) -> None:
        slot.response = response
        self._flush_responses()
        if self._inbox:
            self._process_inbox()

    def _on_raw_sasl_response(self, response: bytes) -> None:
        assert self._sasl is not None
        self._sasl.on_raw_server_token(memoryview(response)[4:])
        self._sasl_principal_changed()

    def _sasl_principal_changed(self) -> None:
        """Adopt the user of the last exchange the broker accepted (KIP-368 re-authentication
        replaces it only then)."""
        assert self._sasl is not None
        claim = self._sasl.authenticated
        if claim is None:
            return
        principal = self._context.identity.principal_for_sasl(claim)
        if principal != self.principal:
            self.principal = principal
            self._produce_context = None
            self._context.log.info(
                "principal_authenticated",
                key=principal,
                principal=principal,
                mechanism=claim.mechanism,
                client=self.peer,
            )

    def _transform_response(self, slot: _Slot, response: bytes, body_offset: int) -> bytes:
        payload = memoryview(response)[4:]
        body = payload[body_offset:]
        new_body: bytes | None = None
        if slot.api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) and self._sasl is not None:
            if slot.api_key == SASL_HANDSHAKE:
                self._sasl.on_handshake_response(body, slot.api_version)
            else:
                self._sasl.on_authenticate_response(body, slot.api_version)
                self._sasl_principal_changed()
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

    # -- requests -----------------------------------------------------------------------------

    def _process_inbox(self) -> None:
        upstream = self._upstream
        if upstream is None or self.closed:
            return
        forward: list[Frame] = []
        # At most max_in_flight_requests responses owed at once: past that, frames wait in the
        # inbox (at most one read's worth: reading is paused) until responses drain.
        max_in_flight = self._settings.proxy.max_in_flight_requests
        slots = self._slots
        held = self._gate.held
        while (
            self._inbox
            and len(slots) < max_in_flight
            and "mute" not in held
            and self._held is None
            and not self.closed
        ):
            request = self._inbox.popleft()
            try:
                outgoing = self._handle_request(request)
                if outgoing is not None:
                    forward.append(outgoing)
            except ProtocolError as error:
                self._fail("bad_request", error)
                return
            except Exception as error:  # state unknown: close rather than half-forward
                self._fail("internal_error", error)
                return
        if forward:
            upstream.write_frames(forward)
        if slots and slots[0].response is not None:
            self._flush_responses()  # answers made here, now first in line
        elif len(slots) >= max_in_flight:
            self._gate.pause("in_flight")
        elif "in_flight" in held:
            self._gate.resume("in_flight")

    def _handle_request(self, request: Frame) -> Frame | None:
        """Account for one request; the frame to forward to the broker (usually ``request``
        itself), or None when pidgate answered it (or nothing answers it)."""
        payload = memoryview(request)[4:]
        sasl = self._sasl
        if sasl is not None and sasl.expects_raw_tokens:
            if not sasl.raw_client_frame_is_request(payload):
                # A bare token after a v0 handshake: forwarded untouched; its answer is bare too.
                sasl.on_raw_client_token(payload)
                slot = _Slot(RAW_SASL_TOKEN, 0, -1)
                self._slots.append(slot)
                self._awaiting_upstream.append(slot)
                return request
            # The exchange ended without a last server token (GSSAPI): drop what waits for one.
            self._drop_unanswered_raw_tokens()
            self._sasl_principal_changed()
        if len(payload) < _API_KEY_VERSION_CORRELATION.size:
            raise ProtocolError(f"request of {len(payload)} bytes is shorter than any header")
        api_key, api_version, correlation_id = _API_KEY_VERSION_CORRELATION.unpack_from(payload)
        cached = self._produce_header
        if (
            api_key == PRODUCE
            and cached is not None
            and cached.api_version == api_version
            and payload[8 : cached.header_bytes] == cached.after_correlation_id
        ):
            # The same client_id and tagged fields as the last Produce on this connection: the
            # header parses to the same values but the correlation id (checked in full once).
            self._context.traffic.request(PRODUCE, len(request))
            return self._produce(
                request, payload[cached.header_bytes :], api_version, correlation_id
            )
        if forwarded_untouched(api_key, self._context.api_version_limits):
            # Not inspected: forwarded as is, in the versions the broker itself advertised.
            self._context.traffic.request(api_key, len(request))
            self._slots.append(slot := _Slot(api_key, api_version, correlation_id))
            self._awaiting_upstream.append(slot)
            return request
        try:
            header = parse_request_header(payload)
        except UnsupportedApiError as error:
            if error.api_key != API_VERSIONS or error.correlation_id is None:
                raise
            # A client newer than pidgate: answer as a broker would (v0, UNSUPPORTED_VERSION,
            # our ApiVersions range) so it retries with a version both sides speak (KIP-511).
            slot = _Slot(API_VERSIONS, 0, error.correlation_id)
            slot.response = encode_api_versions_unsupported(
                error.correlation_id, self._context.api_version_limits[API_VERSIONS]
            )
            self._slots.append(slot)
            return None
        limits = self._context.api_version_limits.get(header.api_key)
        if limits is None or not limits[0] <= header.api_version <= limits[1]:
            raise UnsupportedApiError(
                f"api_key {header.api_key} version {header.api_version} is not one pidgate "
                f"advertised ({limits[0]}..{limits[1]})"
                if limits
                else f"api_key {header.api_key} is not one pidgate forwards"
            )
        self.client_id = header.client_id
        self._context.traffic.request(header.api_key, len(request))
        body = payload[header.header_bytes :]
        if header.api_key == PRODUCE:
            self._produce_header = _ProduceHeader(
                header.api_version,
                header.header_bytes,
                bytes(payload[8 : header.header_bytes]),
            )
            return self._produce(request, body, header.api_version, header.correlation_id)
        elif header.api_key in CLIENT_QUOTA_APIS:
            return self._client_quotas(header, payload, body)
        elif header.api_key == SASL_HANDSHAKE and sasl is not None:
            sasl.on_handshake_request(body, header.api_version)
        elif header.api_key == SASL_HANDSHAKE:
            self._context.notices.sasl_without_identity(self.peer)
        elif header.api_key == SASL_AUTHENTICATE and sasl is not None:
            sasl.on_authenticate_request(body, header.api_version)
        elif header.api_key == API_VERSIONS:
            self.client_software = parse_api_versions_request(body, header.api_version)
            self._produce_context = None
        slot = _Slot(header.api_key, header.api_version, header.correlation_id)
        if header.api_key == INIT_PRODUCER_ID and self._context.event_log is not None:
            slot.observe = self._init_producer_id_observer(body, header.api_version)
        self._slots.append(slot)
        self._awaiting_upstream.append(slot)
        return request

    def _produce(
        self, request: Frame, body: memoryview, api_version: int, correlation_id: int
    ) -> Frame | None:
        """A Produce request: the frame to forward, or None when answered here (rejected, or
        held behind a rejected batch) or when nothing answers it (acks=0)."""
        # The lean walk (acks and PIDs only); the full summary is built only when something
        # needs it: a rejection, a hold, the order guard, an observer (see admission.py).
        acks, producer_ids = produce_acks_and_producer_ids(body, api_version)
        if self.principal is None:
            # Kafka's SASL listener closes a connection that produces before authenticating;
            # pidgate does the same, so nothing is ever charged to, or hidden behind, a name
            # the broker has not accepted.
            raise ProtocolError("Produce before SASL authentication completed")
        if producer_ids:
            context = self._produce_context
            if context is None or context.client_id != self.client_id:
                context = self._produce_context = ProduceContext(
                    principal=self.principal,
                    client_id=self.client_id,
                    client_software_name=self.client_software.name,
                    peer=self.peer,
                    node_id=self.node_id,
                )
            summary = _LazySummary(body, api_version)
            guard = self._order_guard
            if guard.withheld and guard.overtakes(summary()):
                # An idempotent batch behind one rejected here: a broker would fail it too
                # (OUT_OF_ORDER_SEQUENCE), and the client retries both in order.
                self._reject_behind(api_version, correlation_id, summary(), context)
                return None
            decision = self._context.gatekeeper.check_producer_ids(context, producer_ids, summary)
            if isinstance(decision, Rejected):
                if not self._try_hold(
                    request, api_version, correlation_id, summary(), context, decision, producer_ids
                ):
                    self._reject(api_version, correlation_id, summary(), decision, context)
                return None
            if isinstance(decision, WouldReject):  # observe mode: forwarded (observe.py)
                self._log_throttled(context, decision.rejected, event="pid_would_throttle")
            if guard.withheld:
                guard.admitted(summary())
        if acks == 0:
            self._acks0_ids.append(correlation_id)
        else:
            slot = _Slot(PRODUCE, api_version, correlation_id)
            self._slots.append(slot)
            self._awaiting_upstream.append(slot)
        return request

    def _init_producer_id_observer(
        self, body: memoryview, api_version: int
    ) -> Callable[[memoryview], None]:
        """Records which PID the cluster handed to which principal (the event log)."""
        transactional = parse_init_producer_id_request(body, api_version).is_transactional

        def observe(response_body: memoryview) -> None:
            event_log = self._context.event_log
            answer = parse_init_producer_id_response(response_body, api_version)
            if event_log is None or answer.error_code != 0:
                return
            event_log.record_init_producer_id(
                self.principal or "",
                self.client_id,
                self.client_software.name,
                answer.producer_id,
                answer.producer_epoch,
                transactional,
                ts_ms=quota_clock_ms(),
                node_id=self.node_id,
            )

        return observe

    def _client_quotas(
        self, header: RequestHeader, payload: memoryview, body: memoryview
    ) -> bytes | None:
        """producer_ids_rate is pidgate's to answer (KIP-546 APIs); the rest is the broker's."""
        plan = self._context.quota_admin.plan(
            header.api_key,
            header.api_version,
            header.correlation_id,
            bytes(payload[: header.header_bytes]),
            body,
        )
        slot = _Slot(header.api_key, header.api_version, header.correlation_id)
        self._slots.append(slot)
        if plan.local_response is not None:
            slot.response = plan.local_response
            return None
        slot.merge = plan.merge
        self._awaiting_upstream.append(slot)
        return plan.forward_frame

    def _drop_unanswered_raw_tokens(self) -> None:
        unanswered = [s for s in self._awaiting_upstream if s.api_key == RAW_SASL_TOKEN]
        for slot in unanswered:
            self._awaiting_upstream.remove(slot)
            self._slots.remove(slot)

    def _reject(
        self,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        decision: Rejected,
        context: ProduceContext,
    ) -> None:
        """Answer a Produce the quota rejected: the throttle sent (and the mute) is capped by
        ``rejection.max_throttle_time_ms`` so that a client keeps retrying within its delivery
        budget (KIP-91) and each retry is judged again."""
        error_code = self._error_code(context)
        settings = self._settings.rejection
        throttle_time_ms = min(decision.throttle_time_ms, settings.max_throttle_time_ms)
        self._log_throttled(
            context, decision, throttle_time_ms=throttle_time_ms, error_code=error_code
        )
        now_ms = monotonic_ms()
        self._order_guard.rejected(produce, now_ms)
        self._throttled_until_ms = now_ms + throttle_time_ms
        self._answer_rejected(api_version, correlation_id, produce, error_code, throttle_time_ms)
        if throttle_time_ms > 0:
            self._mute(throttle_time_ms)

    # -- holding for tokens (waiting_room.py) ------------------------------------------------

    def _try_hold(
        self,
        request: Frame,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        context: ProduceContext,
        decision: Rejected,
        producer_ids: Collection[int],
    ) -> bool:
        """Hold a rejected Produce for its tokens; False when it cannot be held (holding off,
        acks=0, a request timeout too short, the quota failing, or the waiting room full)."""
        room = self._context.waiting_room
        hold_ms = min(self._settings.rejection.max_hold_ms, produce.timeout_ms * 2 // 3)
        if (
            room is None
            or produce.acks == 0
            or hold_ms < _MIN_HOLD_MS
            or self._context.gatekeeper.last_decision_failed  # the failure policy's answer
        ):
            return False
        held = _HeldProduce(
            self,
            request,
            api_version,
            correlation_id,
            produce,
            context,
            tuple(producer_ids),
            decision,
        )
        if not room.hold(held, hold_ms, decision.throttle_time_ms):
            return False
        self._held = held
        self._slots.append(held.slot)
        self._gate.pause("hold")
        self._log_throttled(context, decision, held_for_at_most_ms=hold_ms)
        return True

    def _log_throttled(self, context: ProduceContext, decision: Rejected, **fields: Any) -> None:
        """``pid_throttled`` (or ``event``: ``pid_would_throttle``): one line per throttled
        Produce, rate-limited per principal and event."""
        self._context.log.warning(
            fields.pop("event", "pid_throttled"),
            key=context.principal,
            principal=context.principal,
            client_id=context.client_id,
            client_software=context.client_software_name,
            peer=context.peer,
            producer_ids=list(decision.unknown_producer_ids[:10]),
            tokens_available_in_ms=decision.throttle_time_ms,
            **fields,
        )

    def _recheck_held(self, held: _HeldProduce) -> Recheck:
        """Ask the quota again for ``held``: forward it when admitted, else the wait left."""
        if self.closed or self._held is not held or self._upstream is None:
            return "gone"
        decision = self._context.gatekeeper.check_producer_ids(
            held.context, held.producer_ids, lambda: held.produce, report_rejection=False
        )
        if isinstance(decision, Rejected):
            held.wait_until_ms = monotonic_ms() + decision.throttle_time_ms
            return decision.throttle_time_ms
        self._held = None
        if self._order_guard.withheld:
            self._order_guard.admitted(held.produce)
        slot = held.slot
        slot.sent_ns = time.perf_counter_ns()
        self._awaiting_upstream.append(slot)
        self._upstream.write_frames([held.request])
        self._gate.resume("hold")
        self._process_inbox()
        return "released"

    def _expire_held(self, held: _HeldProduce, tokens_ahead: int) -> None:
        """The hold ran out without tokens: answer with the honest remaining wait -- until
        the bucket has refilled the tokens of the requests held ahead of it and its own --
        capped by ``rejection.max_hold_throttle_time_ms``, and read on. No mute: the client's
        retry is held again, which is what paces a client that ignores throttle_time_ms
        (librdkafka), while one that honours it (Java, KafkaJS; KIP-219) waits out the whole
        wait on one retry."""
        if self._held is not held:
            return
        self._held = None
        if self.closed:
            return
        context = held.context
        error_code = self._error_code(context)
        now_ms = monotonic_ms()
        wait_ms = max(held.wait_until_ms - now_ms, 0)
        if tokens_ahead:
            wait_ms = self._context.gatekeeper.quota.time_until_refilled_ms(
                held.principal, tokens_ahead + held.tokens_needed, quota_clock_ms()
            )
        throttle_time_ms = min(wait_ms, self._settings.rejection.max_hold_throttle_time_ms)
        self._context.log.info(
            "produce_hold_expired",
            key=context.principal,
            principal=context.principal,
            client_id=context.client_id,
            peer=context.peer,
            producer_ids=list(held.unknown_producer_ids[:10]),
            throttle_time_ms=throttle_time_ms,
            error_code=error_code,
        )
        self._order_guard.rejected(held.produce, now_ms)
        self._throttled_until_ms = now_ms + throttle_time_ms
        held.slot.response = encode_produce_rejection(
            held.api_version, held.correlation_id, held.produce, error_code, throttle_time_ms
        )
        self._gate.resume("hold")
        self._flush_responses()
        self._process_inbox()

    # -- answering rejections ------------------------------------------------------------------

    def _reject_behind(
        self,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        context: ProduceContext,
    ) -> None:
        """Answer a Produce that would overtake a batch rejected on this connection, as the
        broker would have failed it: the same code, the rest of the same throttle, no new mute
        (the rejection it follows already muted the connection), nothing charged."""
        error_code = self._error_code(context)
        now_ms = monotonic_ms()
        throttle_time_ms = max(0, self._throttled_until_ms - now_ms)
        self._order_guard.rejected(produce, now_ms)
        self._context.traffic.produce_held()
        self._context.log.info(
            "produce_held_for_order",
            key=context.principal,
            principal=context.principal,
            client_id=context.client_id,
            peer=context.peer,
            producer_ids=sorted(produce.producer_ids())[:10],
            throttle_time_ms=throttle_time_ms,
            error_code=error_code,
        )
        self._answer_rejected(api_version, correlation_id, produce, error_code, throttle_time_ms)

    def _error_code(self, context: ProduceContext) -> int:
        codes = self._settings.rejection.error_codes
        return rejection_error_code(context.client_software_name, codes, context.client_id)

    def _answer_rejected(
        self,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        error_code: int,
        throttle_time_ms: int,
    ) -> None:
        if produce.acks != 0:  # acks=0 gets no response, ever (it carries no PID anyway)
            slot = _Slot(PRODUCE, api_version, correlation_id)
            slot.response = encode_produce_rejection(
                api_version, correlation_id, produce, error_code, throttle_time_ms
            )
            self._slots.append(slot)

    def _mute(self, mute_ms: int) -> None:
        # KIP-219: answer at once, then stop reading the connection for the throttle time.
        # librdkafka ignores throttle_time_ms, so muting is what actually slows it down.
        self._gate.pause("mute")
        if self._unmute_handle is not None:
            self._unmute_handle.cancel()
        loop = asyncio.get_running_loop()
        self._unmute_handle = loop.call_later(mute_ms / 1000, self._unmute)

    def _unmute(self) -> None:
        self._unmute_handle = None
        self._gate.resume("mute")
        self._process_inbox()

    # -- responses ----------------------------------------------------------------------------

    def _flush_responses(self) -> None:
        if self.transport is None or self.closed:
            return
        ready: list[bytes] = []
        slots = self._slots
        while slots and slots[0].response is not None:
            response = slots.popleft().response
            assert response is not None
            ready.append(response)
        if ready:
            self.transport.writelines(ready)
            self._last_active_s = time.monotonic()
        if len(slots) >= self._settings.proxy.max_in_flight_requests:
            self._gate.pause("in_flight")
        elif "in_flight" in self._gate.held:
            self._gate.resume("in_flight")

    # -- failures -----------------------------------------------------------------------------

    def _fail(self, event: str, error: Exception) -> None:
        self._context.traffic.protocol_error(event)
        self._context.log.warning(
            event,
            key=self.peer.rpartition(":")[0],  # per client host: a storm of connections is one key
            client=self.peer,
            client_id=self.client_id,
            error=str(error),
        )
        self.close()

    def _fail_upstream(self, event: str, reason: str) -> None:
        self._context.traffic.protocol_error(event)
        self._context.log.warning(event, key=event, client=self.peer, error=reason)
        if self._upstream is not None:
            self._upstream.close()
        self.close()


class UpstreamConnection(asyncio.Protocol):
    """The broker side of one client connection."""

    def __init__(self, client: ClientConnection) -> None:
        self._client = client
        settings = client._settings.proxy
        self._decoder = FrameDecoder(settings.max_response_frame_bytes)
        self._high = settings.write_buffer_high_bytes
        self.gate = ReadGate()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self._high, low=self._high // 4)
        self.gate.attach(transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as error:
            self._client._fail_upstream("bad_response_frame", str(error))
            return
        if frames:
            self._client.on_upstream_frames(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.on_upstream_lost()

    def pause_writing(self) -> None:
        self._client._gate.pause("upstream_backpressure")

    def resume_writing(self) -> None:
        self._client._gate.resume("upstream_backpressure")

    def write_frames(self, frames: list[Frame]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(frames)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
