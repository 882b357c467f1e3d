"""Flow control of one client connection, kept apart from its request and response paths (as
uvicorn keeps FlowControl apart from its protocol class): when reading a transport pauses and
resumes (``ReadGate``), how many connections a proxy holds (``ConnectionLimits``), and how a
paused connection notices its client hung up (``peer_has_hung_up``: a paused transport never
sees the FIN).

Must not import: the connection, server or context modules (they use this one).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

__all__ = ["HANG_UP_PROBE_INTERVAL_S", "ConnectionLimits", "ReadGate", "peer_has_hung_up"]

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
