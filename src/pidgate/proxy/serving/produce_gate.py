"""What one client connection does with a Produce the quota rejected: hold it for its
principal's tokens (``waiting_room``), or answer it here with the throttle time and mute the
connection for it (KIP-219); and what it does with a later batch that would overtake one
rejected here (answered the same way, ``ordering.ProduceOrderGuard``).

Owns: ``ProduceGate`` (one per connection: the held Produce, the mute timer, the end of the
latest throttle, the order guard its rejections fill). Only the rejection path runs here: an
admitted Produce never reaches it. Must not import the connection module (it uses this one):
the connection is reached through ``responses.ResponseClient`` only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

from pidgate.protocol.framing import Frame
from pidgate.protocol.produce import ProduceRequestSummary, encode_produce_rejection
from pidgate.proxy.quota_control.admission import (
    ProduceContext,
    Rejected,
    monotonic_ms,
    quota_clock_ms,
    rejection_error_code,
)
from pidgate.proxy.quota_control.waiting_room import Recheck
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.flow_control import ReadGate
from pidgate.proxy.serving.ordering import ProduceOrderGuard
from pidgate.proxy.serving.records import PRODUCE, HeldProduce, Slot
from pidgate.proxy.serving.responses import ResponseClient, ResponsePath

#: Holds shorter than this are not worth a timer: the request is answered at once instead.
_MIN_HOLD_MS = 50


class ProduceGate:
    """Rejected Produce requests of one client connection: held, or answered with a throttle."""

    def __init__(
        self,
        client: ResponseClient,
        context: ProxyContext,
        responses: ResponsePath,
        gate: ReadGate,
    ) -> None:
        self._client = client
        self._context = context
        self._settings = client.settings
        self._responses = responses
        #: The client's read gate: paused while a Produce is held (``hold``) or muted (``mute``).
        self._gate = gate
        #: Batches rejected here that later in-flight batches must not overtake (ordering.py);
        #: the request path asks it before the quota.
        self.order_guard = ProduceOrderGuard()
        #: When the throttle of this connection's latest rejection ends (monotonic ms).
        self._throttled_until_ms = 0
        self._unmute_handle: asyncio.TimerHandle | None = None
        #: The Produce held for tokens; nothing after it is read or forwarded until it ends.
        self.held: HeldProduce | None = None

    def refuse(
        self,
        request: Frame,
        api_version: int,
        correlation_id: int,
        produce: ProduceRequestSummary,
        context: ProduceContext,
        decision: Rejected,
        producer_ids: Collection[int],
    ) -> None:
        """A Produce the quota rejected: held for its tokens (waiting_room.py) when it can be,
        else answered at once."""
        room = self._context.waiting_room
        hold_ms = min(self._settings.rejection.max_hold_ms, produce.timeout_ms * 2 // 3)
        if (
            room is None
            or produce.acks == 0
            or hold_ms < _MIN_HOLD_MS
            or self._context.gatekeeper.last_decision_failed  # the failure policy's answer
        ):
            self._reject(api_version, correlation_id, produce, decision, context)
            return
        held = HeldProduce(
            self,
            request,
            api_version,
            correlation_id,
            produce,
            context,
            tuple(producer_ids),
            decision,
        )
        if not room.hold(held, hold_ms, decision.throttle_time_ms):  # the waiting room is full
            self._reject(api_version, correlation_id, produce, decision, context)
            return
        self.held = held
        self._responses.slots.append(held.slot)
        self._gate.pause("hold")
        self.log_throttled(context, decision, held_for_at_most_ms=hold_ms)

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
        self.log_throttled(
            context, decision, throttle_time_ms=throttle_time_ms, error_code=error_code
        )
        now_ms = monotonic_ms()
        self.order_guard.rejected(produce, now_ms)
        self._throttled_until_ms = now_ms + throttle_time_ms
        self._answer_rejected(api_version, correlation_id, produce, error_code, throttle_time_ms)
        if throttle_time_ms > 0:
            self._mute(throttle_time_ms)

    # -- holding for tokens (waiting_room.py) ------------------------------------------------

    def log_throttled(self, context: ProduceContext, decision: Rejected, **fields: Any) -> None:
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

    def recheck_held(self, held: HeldProduce) -> Recheck:
        """Ask the quota again for ``held``: forward it when admitted, else the wait left."""
        upstream = self._client.upstream
        if self._client.closed or self.held is not held or upstream is None:
            return "gone"
        decision = self._context.gatekeeper.check_producer_ids(
            held.context, held.producer_ids, lambda: held.produce, report_rejection=False
        )
        if isinstance(decision, Rejected):
            held.wait_until_ms = monotonic_ms() + decision.throttle_time_ms
            return decision.throttle_time_ms
        self.held = None
        if self.order_guard.withheld:
            self.order_guard.admitted(held.produce)
        slot = held.slot
        slot.sent_ns = time.perf_counter_ns()
        self._responses.awaiting_upstream.append(slot)
        upstream.write_frames([held.request])
        self._gate.resume("hold")
        self._client.process_inbox()
        return "released"

    def expire_held(self, held: HeldProduce, tokens_ahead: int) -> None:
        """The hold ran out without tokens: answer with the honest remaining wait -- until
        the bucket has refilled the tokens of the requests held ahead of it and its own --
        capped by ``rejection.max_hold_throttle_time_ms``, and read on. No mute: the client's
        retry is held again, which is what paces a client that ignores throttle_time_ms
        (librdkafka), while one that honours it (Java, KafkaJS; KIP-219) waits out the whole
        wait on one retry."""
        if self.held is not held:
            return
        self.held = None
        if self._client.closed:
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
        self._log_answered(
            "produce_hold_expired",
            context,
            list(held.unknown_producer_ids[:10]),
            throttle_time_ms,
            error_code,
        )
        self.order_guard.rejected(held.produce, now_ms)
        self._throttled_until_ms = now_ms + throttle_time_ms
        held.slot.response = encode_produce_rejection(
            held.api_version, held.correlation_id, held.produce, error_code, throttle_time_ms
        )
        self._gate.resume("hold")
        self._responses.flush()
        self._client.process_inbox()

    def expire_now(self) -> None:
        """Answer the held Produce (rejected) now, if any: the proxy is shutting down."""
        held = self.held
        if held is not None and self._context.waiting_room is not None:
            self._context.waiting_room.expire_now(held)

    def close(self) -> None:
        """The connection is gone: no unmute, and the held Produce is never forwarded (its
        client will retry elsewhere, if at all)."""
        if self._unmute_handle is not None:
            self._unmute_handle.cancel()
        if self.held is not None and self._context.waiting_room is not None:
            self._context.waiting_room.drop(self.held)
            self.held = None

    # -- answering rejections ------------------------------------------------------------------

    def reject_behind(
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
        self.order_guard.rejected(produce, now_ms)
        self._context.traffic.produce_held()
        self._log_answered(
            "produce_held_for_order",
            context,
            sorted(produce.producer_ids())[:10],
            throttle_time_ms,
            error_code,
        )
        self._answer_rejected(api_version, correlation_id, produce, error_code, throttle_time_ms)

    def _log_answered(
        self,
        event: str,
        context: ProduceContext,
        producer_ids: list[int],
        throttle_time_ms: int,
        error_code: int,
    ) -> None:
        """One line per Produce answered here after a hold or behind a rejection."""
        self._context.log.info(
            event,
            key=context.principal,
            principal=context.principal,
            client_id=context.client_id,
            peer=context.peer,
            producer_ids=producer_ids,
            throttle_time_ms=throttle_time_ms,
            error_code=error_code,
        )

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
            slot = Slot(PRODUCE, api_version, correlation_id)
            slot.response = encode_produce_rejection(
                api_version, correlation_id, produce, error_code, throttle_time_ms
            )
            self._responses.slots.append(slot)

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
        self._client.process_inbox()
