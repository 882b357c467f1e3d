"""A loopback port to listen on that nobody else is about to take.

Asking the OS for port 0 and handing the number on is racy: that port comes from the kernel's
ephemeral range (``net.ipv4.ip_local_port_range``), the same range every *outgoing* connection
takes its source port from. Between the probe and the real bind, a client connecting anywhere
(a broker connection, a Kafka client, a JVM) may be given that very port, and the bind fails
with "address already in use" (seen in CI: a gateway's broker listener lost its port to the
connection that pidgate itself had just opened to the broker). :func:`free_port` picks below
that range instead, where the kernel never assigns source ports, and checks the port is bindable
the way a server binds it (``SO_REUSEADDR``, as asyncio and Java servers do).

Owns: ``free_port``. Standard library only: must not import any pidgate module (the demo's
broker and the worker processes use it).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Ports below this are left alone (well-known and registered services cluster low).
_LOWEST = 20000
#: What this process already handed out, so two calls in a row never give the same port.
_handed_out: set[int] = set()
_random = random.Random()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def _os_chosen(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def free_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port on ``host`` that was free a moment ago, below the ephemeral range (module doc);
    the OS's choice when that range leaves no room below it or nothing there is free."""
    low = _ephemeral_low()
    if low - _LOWEST < 1000:
        return _os_chosen(host)
    if len(_handed_out) > (low - _LOWEST) // 2:
        _handed_out.clear()
    for _ in range(attempts):
        port = _random.randrange(_LOWEST, low)
        if port not in _handed_out and _bindable(host, port):
            _handed_out.add(port)
            return port
    return _os_chosen(host)
