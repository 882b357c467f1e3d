"""What pidgate did, as the demo sees it: which storm producers it throttled (a
``DecisionObserver`` on the proxy's loop) and a consistent read of its counters and quota.

Owns: ``StormDecisionTracker``, ``ProxyView`` and ``read_proxy_view``. Reads the proxy, never
drives it; must not import the demo's producers, display or confluent_kafka.
"""

from __future__ import annotations

import concurrent.futures
import threading
from dataclasses import dataclass

from pidgate.demo.plan import PRODUCER_IDS_RATE
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control.admission import ProduceContext, Rejected, quota_clock_ms
from pidgate.proxy.serving.identity import ANONYMOUS_PRINCIPAL
from pidgate.quota.manager import Decision


class StormDecisionTracker:
    """A ``DecisionObserver``: remembers which storm producers (by client.id) had at least one
    Produce request rejected, at most ``max_clients`` of them. Runs on the proxy's loop; read
    from the main thread."""

    #: Reads the context's client_id, never the request (admission.reads_request).
    reads_request = False

    def __init__(self, client_prefix: str, max_clients: int) -> None:
        self._prefix = client_prefix
        self._max_clients = max_clients
        self._lock = threading.Lock()
        self._throttled: set[str] = set()

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        client_id = context.client_id
        if not isinstance(decision, Rejected) or client_id is None:
            return
        if not client_id.startswith(self._prefix):
            return
        with self._lock:
            if len(self._throttled) < self._max_clients:
                self._throttled.add(client_id)

    def throttled_client_ids(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._throttled)


@dataclass(frozen=True)
class ProxyView:
    new_producer_ids_admitted: int
    produce_requests_rejected: int
    producer_ids_waiting: int
    tokens: float


def read_proxy_view(proxy: BackgroundProxy, timeout_s: float = 1.0) -> ProxyView | None:
    """Counters and User:ANONYMOUS's tokens, read on the proxy's loop (the quota manager is
    not thread-safe). None if the loop does not answer in time."""
    result: concurrent.futures.Future[ProxyView] = concurrent.futures.Future()
    server = proxy.server

    def read() -> None:
        try:
            now_ms = quota_clock_ms()
            tokens = float(PRODUCER_IDS_RATE)  # a principal not yet tracked has a full bucket
            for state in server.quota.snapshot(now_ms):
                if state.principal == ANONYMOUS_PRINCIPAL:
                    tokens = state.tokens
            counters = server.counters
            result.set_result(
                ProxyView(
                    new_producer_ids_admitted=counters.new_producer_ids_admitted,
                    produce_requests_rejected=counters.produce_requests_rejected,
                    producer_ids_waiting=len(counters.rejected_producer_ids),
                    tokens=tokens,
                )
            )
        except BaseException as error:
            result.set_exception(error)

    try:
        proxy.call(read)
        return result.result(timeout_s)
    except (concurrent.futures.TimeoutError, RuntimeError):
        return None
