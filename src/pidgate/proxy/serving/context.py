"""What every connection of one proxy shares: settings, the gatekeeper, the router, the log and
the set of open connections (for graceful shutdown).

Owns: ``ProxyContext`` (a plain holder; no behaviour of its own), and the protocols of what the
connections report (``TrafficObserver``) and what the server asks of an open one
(``OpenConnection``). Must not import any connection module (they all use this one).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pidgate.config import Settings
from pidgate.protocol.framing import FrameBufferBudget
from pidgate.proxy.logs import RateLimitedLog
from pidgate.proxy.operations.event_log import EventLog
from pidgate.proxy.operations.notices import OperatorNotices
from pidgate.proxy.quota_control.admission import Gatekeeper
from pidgate.proxy.quota_control.quota_admin import QuotaAdmin
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.proxy.serving.identity import IdentityPolicy
from pidgate.proxy.serving.routing import Router


class TrafficObserver(Protocol):
    """What the connections report for metrics; called on the hot path, so implementations
    must be cheap (plain counter additions)."""

    def connection_opened(self) -> None: ...
    def connection_closed(self, peer: str | None = None) -> None: ...
    def request(self, api_key: int, size_bytes: int) -> None: ...
    def response(self, api_key: int, size_bytes: int, upstream_latency_s: float | None) -> None: ...
    def produce_traffic(
        self,
        requests: int,
        request_bytes: int,
        response_bytes: int,
        latency_counts: list[int],
        latency_sum_s: float,
    ) -> None:
        """What a connection's express lane counted (Produce), handed over in one call."""
        ...

    def protocol_error(self, kind: str) -> None: ...
    def produce_held(self) -> None: ...


class OpenConnection(Protocol):
    """What graceful shutdown asks of an open client connection (``ClientConnection``)."""

    @property
    def idle(self) -> bool: ...
    def begin_shutdown(self) -> None: ...
    def close(self) -> None: ...
    def flush_counters(self) -> None:
        """Hand what its express lane counted to the traffic metrics."""
        ...


#: The shared read buffer's size: frames up to half of it are read into it, larger ones into
#: buffers of their own (uvloop's own read buffer is 256 KiB, shared the same way).
READ_SCRATCH_BYTES = 256 * 1024
#: Big frames being read, together, per loop: 64 1-MB Produce requests at once; past that,
#: frames are assembled from the reads (slower, never refused).
FRAME_BUFFER_BUDGET_BYTES = 64 * 1024 * 1024


@dataclass
class ProxyContext:
    settings: Settings
    gatekeeper: Gatekeeper
    router: Router
    log: RateLimitedLog
    #: api_key -> (min, max) versions pidgate advertises and accepts.
    api_version_limits: Mapping[int, tuple[int, int]]
    #: Who each connection is charged to (PLAINTEXT, TLS certificates, observed SASL).
    identity: IdentityPolicy
    #: Where traffic is counted (metrics).
    traffic: TrafficObserver
    #: Answers producer_ids_rate in the client-quota APIs.
    quota_admin: QuotaAdmin
    #: TLS towards the brokers, or None for plaintext.
    upstream_ssl: ssl.SSLContext | None = None
    #: The PID event log, when configured.
    event_log: EventLog | None = None
    #: Produce requests held for their principal's tokens; None: never hold.
    waiting_room: WaitingRoom | None = None
    #: Misconfigurations said once (SASL through a pidgate with identity.sasl off, ...).
    notices: OperatorNotices = field(default_factory=OperatorNotices)
    connections: set[OpenConnection] = field(default_factory=set)
    #: Where every client connection of this context's loop reads small frames into
    #: (``FrameReader``: one loop reads one transport at a time).
    read_scratch: bytearray = field(default_factory=lambda: bytearray(READ_SCRATCH_BYTES))
    #: What this loop's client connections may set aside for big frames still arriving.
    frame_buffer_budget: FrameBufferBudget = field(
        default_factory=lambda: FrameBufferBudget(FRAME_BUFFER_BUDGET_BYTES)
    )
