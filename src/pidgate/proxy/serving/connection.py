"""One client connection: its lifecycle and its request path, top to bottom.

Owns ``ClientConnection``: accepted (connection limits, principal from the TLS certificate),
its broker side opened (``upstream``), then every frame the client sends cut
(``protocol.framing``) and, in order, either forwarded untouched (every complete frame of one
read in a single ``writelines``: send calls decide small-frame speed) or read first: ApiVersions
and SASL exchanges noted, client-quota requests answered or split (``quota_admin``), Produce
requests walked and put through the ``Gatekeeper``. A Produce the quota rejects goes to the
connection's ``produce_gate`` (held for tokens, or answered with the throttle); the broker's
answers come back through its ``responses`` path, in request order.

Beside it: ``flow_control`` (pausing reads, connection limits, idle timeout, hang-up probe),
``responses`` (the response path), ``produce_gate`` (the rejection path), ``upstream`` (the
broker side), ``records`` (slots and held requests), ``ordering`` (the order rule). A protocol
error on either side closes both connections; the process and other connections are unaffected.

Must not be imported by any other serving module (it assembles them); only the server uses it.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from pidgate.config import Settings
from pidgate.protocol.api_versions import (
    ClientSoftware,
    encode_api_versions_unsupported,
    forwarded_untouched,
    parse_api_versions_request,
)
from pidgate.protocol.errors import ProtocolError, UnsupportedApiError
from pidgate.protocol.framing import Frame, FrameReader
from pidgate.protocol.headers import RequestHeader, parse_request_header
from pidgate.protocol.init_producer_id import (
    parse_init_producer_id_request,
    parse_init_producer_id_response,
)
from pidgate.protocol.produce import produce_acks_and_producer_ids
from pidgate.proxy.quota_control.admission import (
    ProduceContext,
    Rejected,
    WouldReject,
    quota_clock_ms,
)
from pidgate.proxy.quota_control.quota_admin import CLIENT_QUOTA_APIS
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.express import COMPILED as EXPRESS_LANE
from pidgate.proxy.serving.express import Lane
from pidgate.proxy.serving.flow_control import ConnectionLimits, ConnectionWatch, ReadGate
from pidgate.proxy.serving.identity import UnmappablePrincipalError
from pidgate.proxy.serving.produce_gate import ProduceGate
from pidgate.proxy.serving.records import (
    API_VERSIONS,
    INIT_PRODUCER_ID,
    PRODUCE,
    RAW_SASL_TOKEN,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    LazySummary,
    ProduceHeader,
    Slot,
)
from pidgate.proxy.serving.responses import ResponsePath
from pidgate.proxy.serving.routing import Address
from pidgate.proxy.serving.upstream import UpstreamConnection, open_upstream

_API_KEY_VERSION_CORRELATION = struct.Struct(">hhi")


class ClientConnection(asyncio.BufferedProtocol):
    """The client side; owns the upstream connection it opens.

    On the compiled path it holds an express lane (``_express.ExpressLane``) whose
    ``get_buffer`` and ``buffer_updated`` are its own: the steady state of a busy producer
    (known PIDs, nothing held) read and answered in C, every other read handed to the Python
    path below (``_read``) exactly as it came.

    Its fields are slots: the lane reads the few it needs at their offsets (issue #25: a name
    lookup from C costs several cache misses each; cachegrind counted a third fewer cold misses
    in the lane for a known PID's request once it read them there), and the Python path's
    reads of them are as fast as an instance dict's."""

    __slots__ = (
        "_acks0_ids",
        "_awaiting_upstream",
        "_connect_task",
        "_context",
        "_gate",
        "_inbox",
        "_lane",
        "_order_guard",
        "_produce_context",
        "_produce_gate",
        "_produce_header",
        "_reader",
        "_responses",
        "_sasl",
        "_settings",
        "_slots",
        "_upstream",
        "_upstream_targets",
        "_watch",
        "buffer_updated",
        "client_id",
        "client_software",
        "closed",
        "fail_upstream",
        "get_buffer",
        "last_active_s",
        "node_id",
        "on_upstream_frames",
        "peer",
        "principal",
        "transport",
    )

    #: The broker's frames and failures go straight to the response path: no call in between
    #: on the per-response path (``UpstreamConnection`` calls these).
    on_upstream_frames: Callable[[list[bytes]], None]
    fail_upstream: Callable[[str, str], None]
    #: The event loop's BufferedProtocol calls, bound once: the express lane's own where it
    #: runs (it reads first), else the Python path's (``_lend_buffer``, ``_read``).
    get_buffer: Callable[[int], memoryview]  # type: ignore[assignment]
    buffer_updated: Callable[[int], None]  # type: ignore[assignment]

    def __init__(
        self,
        context: ProxyContext,
        upstream_targets: Callable[[], list[Address]],
        node_id: int | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        self._context = context
        #: When the connection last read or wrote (monotonic s), for its idle timeout.
        self.last_active_s = time.monotonic()
        self.node_id = node_id
        self._settings = context.settings
        self._upstream_targets = upstream_targets
        self._reader = FrameReader(
            self._settings.proxy.max_frame_bytes, context.read_scratch, context.frame_buffer_budget
        )
        self._watch = ConnectionWatch(
            self, self._settings.proxy, limits, context.log, context.traffic
        )
        self._gate = ReadGate(on_pause=self._watch.watch_for_hang_up)
        self._inbox: deque[Frame] = deque()
        self._upstream: UpstreamConnection | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        #: Who pays for this connection's new PIDs; None until SASL authentication succeeds.
        self.principal: str | None = None
        self._sasl = context.identity.new_sasl_observer()
        self.client_id: str | None = None
        self.client_software = ClientSoftware(name=None, version=None)
        self.closed = False
        self._responses = ResponsePath(self, context, self._gate, self._inbox, self._sasl)
        # The response path's queues, appended to here for every request read.
        self._slots = self._responses.slots
        self._awaiting_upstream = self._responses.awaiting_upstream
        self._acks0_ids = self._responses.acks0_ids
        self.on_upstream_frames = self._responses.on_upstream_frames
        self.fail_upstream = self._responses.fail_upstream
        # Per-connection values the hot path would otherwise rebuild for every Produce.
        self._produce_context: ProduceContext | None = None
        self._produce_header: ProduceHeader | None = None
        self._produce_gate = ProduceGate(self, context, self._responses, self._gate)
        self._order_guard = self._produce_gate.order_guard  # asked for every Produce with PIDs
        self._lane = Lane(self)
        if EXPRESS_LANE:
            # The event loop binds these when it makes the transport: the lane reads first.
            express: Any = self._lane
            self.get_buffer = express.get_buffer
            self.buffer_updated = express.buffer_updated
        else:
            self.get_buffer = self._lend_buffer
            self.buffer_updated = self._read

    # -- asyncio.Protocol (client side) ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self._watch.admit(transport, peer):
            self.closed = True
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
        self._watch.start()

    def _lend_buffer(self, sizehint: int) -> memoryview:
        # Big frames are read into buffers of their own size, in place (FrameReader).
        return self._reader.get_buffer()

    def _read(self, nbytes: int) -> None:
        """The Python path of a read: frames cut, then passed on in order (process_inbox)."""
        self.last_active_s = time.monotonic()
        if self._gate.held:
            self._gate.enforce()  # at most this one read while paused (uvloop, see ReadGate)
        try:
            frames = self._reader.buffer_updated(nbytes)
        except ProtocolError as error:
            self._fail("bad_request_frame", error)
            return
        if frames:
            self._inbox.extend(frames)
        self.process_inbox()

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
        self._produce_gate.expire_now()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._lane.express_close()  # its counters to the metrics, nothing owed any more
        self._reader.release()  # a big frame cut short gives its buffer back to the loop
        if self in self._context.connections:
            self._context.connections.discard(self)
            self._context.traffic.connection_closed(self.peer)
        self._watch.stop()
        if self._connect_task is not None and not self._connect_task.done():
            self._connect_task.cancel()
        self._produce_gate.close()
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

    # -- the broker side (upstream.py) ---------------------------------------------------------

    async def _connect_upstream(self) -> None:
        upstream = await open_upstream(self, self._context, self._upstream_targets())
        if upstream is None:
            self.close()  # no broker reachable (logged)
            return
        if self.closed:
            upstream.close()
            return
        self._upstream = upstream
        self._gate.resume("connecting")
        self.process_inbox()

    def on_upstream_lost(self) -> None:
        if not self.closed:
            self.close()

    def on_upstream_backpressure(self, full: bool) -> None:
        if full:
            self._gate.pause("upstream_backpressure")
        else:
            self._gate.resume("upstream_backpressure")

    # -- state --------------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No request read from the client is waiting for a response (graceful shutdown
        waits for this after ``begin_shutdown``)."""
        return not self._slots and not self._inbox and not self._lane.express_owed

    @property
    def settings(self) -> Settings:
        """The settings this connection was accepted with (a reload applies to new ones)."""
        return self._settings

    @property
    def upstream(self) -> UpstreamConnection | None:
        """The broker side, once connected."""
        return self._upstream

    @property
    def reading_paused(self) -> bool:
        return self._gate.paused

    @property
    def responses_owed(self) -> int:
        return len(self._slots) + self._lane.express_owed

    @property
    def express_requests_taken(self) -> int:
        """Requests this connection's express lane took (none on the pure path)."""
        return self._lane.requests_taken

    @property
    def express_new_producer_ids(self) -> int:
        """PIDs this connection's express lane admitted as new (none on the pure path)."""
        return self._lane.new_producer_ids_admitted

    def flush_counters(self) -> None:
        """Hand what the express lane counted to the traffic metrics (before a scrape)."""
        self._lane.flush_counters()

    def upstream_reader(self, upstream: UpstreamConnection) -> Callable[[bytes], None] | None:
        """What reads the broker's bytes before the Python response path (the lane's)."""
        return self._lane.upstream_reader(upstream)

    def adopt_sasl_principal(self) -> None:
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

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # -- requests -----------------------------------------------------------------------------

    def process_inbox(self) -> None:
        """Pass on what the client sent, in order, while nothing stops reading: the in-flight
        limit, a mute, a held Produce."""
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
            and "hold" not in held  # held Produce: nothing behind it is read (produce_gate)
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
            self._responses.flush()  # answers made here, now first in line
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
                slot = Slot(RAW_SASL_TOKEN, 0, -1)
                self._slots.append(slot)
                self._awaiting_upstream.append(slot)
                return request
            # The exchange ended without a last server token (GSSAPI): drop what waits for one.
            self._drop_unanswered_raw_tokens()
            self.adopt_sasl_principal()
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
            self._slots.append(slot := Slot(api_key, api_version, correlation_id))
            self._awaiting_upstream.append(slot)
            return request
        try:
            header = parse_request_header(payload)
        except UnsupportedApiError as error:
            if error.api_key != API_VERSIONS or error.correlation_id is None:
                raise
            # A client newer than pidgate: answer as a broker would (v0, UNSUPPORTED_VERSION,
            # our ApiVersions range) so it retries with a version both sides speak (KIP-511).
            slot = Slot(API_VERSIONS, 0, error.correlation_id)
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
            self._produce_header = ProduceHeader(
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
        slot = Slot(header.api_key, header.api_version, header.correlation_id)
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
        if (
            producer_ids
            # A busy producer's PIDs, known where the quota last saw them: admitted, nothing
            # to tell (the steady state; compiled, issue #25). Else the whole decision.
            and (
                self._order_guard.withheld
                or not self._context.gatekeeper.admits_known(self.principal, producer_ids)
            )
            and not self._admitted(request, body, api_version, correlation_id, producer_ids)
        ):
            return None
        if acks == 0:
            self._acks0_ids.append(correlation_id)
        else:
            slot = Slot(PRODUCE, api_version, correlation_id)
            self._slots.append(slot)
            self._awaiting_upstream.append(slot)
        return request

    def _admitted(
        self,
        request: Frame,
        body: memoryview,
        api_version: int,
        correlation_id: int,
        producer_ids: tuple[int, ...],
    ) -> bool:
        """The quota's whole decision on a Produce carrying PIDs: True to forward it, False
        when it was answered here (rejected, held, or behind a batch rejected here)."""
        context = self.produce_context()
        summary = LazySummary(body, api_version)
        guard = self._order_guard
        if guard.withheld and guard.overtakes(summary()):
            # An idempotent batch behind one rejected here: a broker would fail it too
            # (OUT_OF_ORDER_SEQUENCE), and the client retries both in order.
            self._produce_gate.reject_behind(api_version, correlation_id, summary(), context)
            return False
        decision = self._context.gatekeeper.check_producer_ids(context, producer_ids, summary)
        if isinstance(decision, Rejected):
            self._produce_gate.refuse(
                request, api_version, correlation_id, summary(), context, decision, producer_ids
            )
            return False
        if isinstance(decision, WouldReject):  # observe mode: forwarded (observe.py)
            self._produce_gate.log_throttled(context, decision.rejected, event="pid_would_throttle")
        if guard.withheld:
            guard.admitted(summary())
        return True

    def produce_context(self) -> ProduceContext:
        """Who this connection's Produce requests come from, for observers (made again when
        the client_id or the ApiVersions software changed; needs a principal)."""
        assert self.principal is not None
        context = self._produce_context
        if context is None or context.client_id != self.client_id:
            context = self._produce_context = ProduceContext(
                principal=self.principal,
                client_id=self.client_id,
                client_software_name=self.client_software.name,
                peer=self.peer,
                node_id=self.node_id,
            )
        return context

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
        slot = Slot(header.api_key, header.api_version, header.correlation_id)
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
