"""free_port: a loopback port below the kernel's ephemeral range, bindable, not handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pidgate.proxy import ports
from pidgate.proxy.ports import free_port


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_the_port_is_outside_the_range_outgoing_connections_take_their_source_ports_from() -> None:
    low, _ = _ephemeral_range()
    if low - ports._LOWEST < 1000:
        pytest.skip(f"ephemeral range starts at {low}: no room below it on this host")
    chosen = [free_port() for _ in range(50)]
    assert all(ports._LOWEST <= port < low for port in chosen)
    assert len(set(chosen)) == len(chosen), "a port was handed out twice"


def test_a_server_can_listen_on_it_and_outgoing_connections_never_land_on_it() -> None:
    port = free_port()
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        # What the race looked like: many outgoing connections, each given a source port by the
        # kernel; none may be the port handed out (they would have stolen it before the bind).
        sources = []
        for _ in range(200):
            with socket.create_connection(("127.0.0.1", port)) as client:
                sources.append(client.getsockname()[1])
                accepted, _ = server.accept()
                accepted.close()
        assert port not in sources


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        # Force the random pick onto the busy port first, then a free one.
        picks = iter([taken, taken])
        monkeypatch.setattr(ports, "_LOWEST", 1024)
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65535)
        real = ports._random.randrange
        monkeypatch.setattr(
            ports._random, "randrange", lambda a, b: next(picks, None) or real(a, b)
        )
        chosen = free_port()
        assert chosen != taken
        with socket.socket() as server:
            server.bind(("127.0.0.1", chosen))


def test_without_room_below_the_range_the_os_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._LOWEST + 10)
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
