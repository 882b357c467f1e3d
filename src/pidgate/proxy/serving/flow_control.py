"""Flow control of one client connection, kept apart from its request and response paths (as
uvicorn keeps FlowControl apart from its protocol class): when reading a transport pauses and
resumes (``ReadGate``), how many connections a proxy holds (``ConnectionLimits``), and when a
connection is closed for being over a limit or unused (``ConnectionWatch``: the limit check on
accept, the idle timeout, and the hang-up probe of a paused connection, since a paused transport
never sees the FIN: ``peer_has_hung_up``).

Must not import: the connection, server or context modules (they use this one); a watched
connection is reached through ``WatchedConnection`` only.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from typing import Protocol

from pidgate.config import ProxySettings
from pidgate.proxy.logs import RateLimitedLog

__all__ = [
    "HANG_UP_PROBE_INTERVAL_S",
    "ConnectionLimits",
    "ConnectionWatch",
    "ErrorCounter",
    "ReadGate",
    "WatchedConnection",
    "peer_has_hung_up",
]

#: How often a paused client connection's socket is checked for a hang-up.
HANG_UP_PROBE_INTERVAL_S = 1.0
#: Linux tcp_states.h: the peer sent FIN (CLOSE_WAIT) or the connection is gone (CLOSE).
_TCP_CLOSE = 7
_TCP_CLOSE_WAIT = 8


def peer_has_hung_up(transport: asyncio.BaseTransport) -> bool:
    """True when the client closed its side (FIN or RST seen by the kernel), whatever unread
    data is still queued: the first byte of Linux ``TCP_INFO`` is the TCP state. False where
    TCP_INFO is unavailable (then a paused connection is noticed when reading resumes)."""
    sock = transport.get_extra_info("socket")
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None:
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 1)[0]
    except (OSError, IndexError, TypeError):
        return False
    return state in (_TCP_CLOSE, _TCP_CLOSE_WAIT)


class ReadGate:
    """Pauses reading a transport while any reason holds, resumes when none does."""

    def __init__(self, on_pause: Callable[[], None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        #: The reasons reading is paused for; read-only outside this class (the connection's
        #: per-request path tests it inline: no method call while nothing holds, issue "lean").
        self.held: set[str] = set()
        #: Called when reading pauses (no reason held before this one).
        self._on_pause = on_pause

    def pause(self, reason: str) -> None:
        first = not self.held
        if first and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self.held.add(reason)
        if first and self._on_pause is not None:
            self._on_pause()

    @property
    def paused(self) -> bool:
        return bool(self.held)

    def resume(self, reason: str) -> None:
        if reason not in self.held:
            return
        self.held.discard(reason)
        if not self.held and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        if self.held:
            transport.pause_reading()

    def holds(self, reason: str) -> bool:
        return reason in self.held

    def enforce(self) -> None:
        """Pause again if the transport is reading while a reason holds. uvloop starts reading
        an accepted connection after ``connection_made`` returns, ignoring a pause made there
        (asyncio's own loop honours it, gh-103607): without this, everything a client sent
        while its broker connection was still being made was read into memory, unbounded."""
        transport = self.transport
        if (
            self.held
            and transport is not None
            and transport.is_reading()
            and not transport.is_closing()
        ):
            transport.pause_reading()


class ConnectionLimits:
    """Open client connections of one proxy, in total and per client IP, against
    ``proxy.max_connections`` and ``proxy.max_connections_per_ip`` (shared by every listener).

    With client TLS a connection counts from the end of its handshake (when asyncio hands it
    over), so handshakes in progress are not counted."""

    def __init__(self) -> None:
        self.total = 0
        self._per_ip: dict[str, int] = {}

    def acquire(self, ip: str, max_total: int, max_per_ip: int) -> str | None:
        """Count a new connection from ``ip``; or, over a limit, the limit's name (and no
        count)."""
        if self.total >= max_total:
            return "connection_limit"
        if self._per_ip.get(ip, 0) >= max_per_ip:
            return "connection_limit_per_ip"
        self.total += 1
        self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
        return None

    def release(self, ip: str) -> None:
        self.total -= 1
        left = self._per_ip.get(ip, 0) - 1
        if left > 0:
            self._per_ip[ip] = left
        else:
            self._per_ip.pop(ip, None)

    def from_ip(self, ip: str) -> int:
        return self._per_ip.get(ip, 0)


class WatchedConnection(Protocol):
    """What ``ConnectionWatch`` needs of its client connection (``connection.ClientConnection``)."""

    closed: bool
    transport: asyncio.Transport | None
    peer: str
    client_id: str | None
    #: When the connection last read or wrote (monotonic s).
    last_active_s: float

    @property
    def idle(self) -> bool: ...
    @property
    def reading_paused(self) -> bool: ...
    @property
    def responses_owed(self) -> int: ...
    def close(self) -> None: ...


class ErrorCounter(Protocol):
    """Where a refused connection is counted (the proxy's ``TrafficObserver``)."""

    def protocol_error(self, kind: str) -> None: ...


class ConnectionWatch:
    """Closes one client connection that nobody should keep open: over a connection limit when
    accepted, quiet for ``proxy.idle_timeout_ms`` with nothing owed, or hung up by its client
    while its reading is paused."""

    def __init__(
        self,
        client: WatchedConnection,
        settings: ProxySettings,
        limits: ConnectionLimits | None,
        log: RateLimitedLog,
        errors: ErrorCounter,
    ) -> None:
        self._client = client
        self._settings = settings
        #: None: no connection limits (only the idle timeout applies).
        self._limits = limits
        #: The IP this connection is counted under in ``_limits``; None when not counted.
        self._counted_ip: str | None = None
        self._log = log
        self._errors = errors
        self._idle_timeout_s = settings.idle_timeout_ms / 1000
        self._idle_handle: asyncio.TimerHandle | None = None
        self._hang_up_probe: asyncio.TimerHandle | None = None

    def admit(self, transport: asyncio.Transport, peer: object) -> bool:
        """Count this connection, or abort it at once when over a connection limit."""
        if self._limits is None:
            return True
        ip = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        settings = self._settings
        exceeded = self._limits.acquire(
            ip, settings.max_connections, settings.max_connections_per_ip
        )
        if exceeded is None:
            self._counted_ip = ip
            return True
        self._errors.protocol_error(exceeded)
        self._log.warning(
            exceeded,
            # One key per client host: a flood from one host is a bounded number of lines.
            key=ip,
            client=self._client.peer,
            open_connections=self._limits.total,
            open_from_ip=self._limits.from_ip(ip),
            max_connections=settings.max_connections,
            max_connections_per_ip=settings.max_connections_per_ip,
        )
        transport.abort()  # nothing was read or owed: no need to flush anything
        return False

    def start(self) -> None:
        self._schedule_idle_check(self._idle_timeout_s)

    def stop(self) -> None:
        """The connection is gone: uncounted, no more timers."""
        if self._limits is not None and self._counted_ip is not None:
            self._limits.release(self._counted_ip)
            self._counted_ip = None
        if self._idle_handle is not None:
            self._idle_handle.cancel()
            self._idle_handle = None
        if self._hang_up_probe is not None:
            self._hang_up_probe.cancel()
            self._hang_up_probe = None

    def _schedule_idle_check(self, delay_s: float) -> None:
        if delay_s <= 0 or self._client.closed:
            return
        loop = asyncio.get_running_loop()
        self._idle_handle = loop.call_later(delay_s, self._check_idle)

    def _check_idle(self) -> None:
        """Timer: close the connection if quiet for ``idle_timeout_ms`` with nothing owed,
        else look again when it could first be. One timer per connection, never re-armed on
        the hot path: reads and writes only note the time."""
        self._idle_handle = None
        client = self._client
        timeout_s = self._idle_timeout_s
        if client.closed or timeout_s <= 0:
            return
        quiet_s = time.monotonic() - client.last_active_s
        if not client.idle:
            self._schedule_idle_check(timeout_s)
        elif quiet_s < timeout_s:
            self._schedule_idle_check(timeout_s - quiet_s)
        else:
            self._log.info(
                "idle_connection_closed",
                key=client.peer.rpartition(":")[0],
                client=client.peer,
                client_id=client.client_id,
                idle_ms=int(quiet_s * 1000),
            )
            client.close()

    def watch_for_hang_up(self) -> None:
        """Reading just paused (in-flight limit, mute, backpressure, connecting): a paused
        transport never sees the client's FIN, so look at the socket's TCP state instead, every
        ``HANG_UP_PROBE_INTERVAL_S`` while paused. Without this, a client that gave up on a
        hung or slow broker (its request timeout) kept both sockets, and the broker's state for
        them, until the broker answered."""
        if self._hang_up_probe is None and not self._client.closed:
            loop = asyncio.get_running_loop()
            self._hang_up_probe = loop.call_later(HANG_UP_PROBE_INTERVAL_S, self._probe_hang_up)

    def _probe_hang_up(self) -> None:
        self._hang_up_probe = None
        client = self._client
        transport = client.transport
        if client.closed or transport is None or not client.reading_paused:
            return
        if not peer_has_hung_up(transport):
            self.watch_for_hang_up()
            return
        self._log.info(
            "client_hung_up_while_paused",
            key=client.peer.rpartition(":")[0],
            client=client.peer,
            client_id=client.client_id,
            responses_owed=client.responses_owed,
        )
        # Kafka brokers close a connection on EOF and drop what it still owed; so do we. What
        # was already forwarded stays forwarded; what was never read is never forwarded.
        transport.abort()
