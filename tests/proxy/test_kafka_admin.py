"""An admin client that cannot start leaves no network thread behind, and a closed frontier
prober opens no new client: kafka-python 3 starts a ``kafka-io-<client_id>`` thread before
it bootstraps in ``KafkaAdminClient``'s constructor and left it running when the bootstrap
failed (one more thread per failed attempt, for the life of the process). Real sockets: a
loopback port nothing listens on."""

from __future__ import annotations

import secrets
import socket
import threading
import time

import pytest
from kafka.errors import KafkaError

from pidgate.proxy.kafka_admin import open_admin_client
from pidgate.proxy.quota_control.pid_frontier import FrontierProber


def _refused_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"  # closed again: connections are refused


def _network_threads(client_id: str, wait_s: float = 2.0) -> list[str]:
    """The client's network threads still alive after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [t.name for t in threading.enumerate() if t.name == f"kafka-io-{client_id}"]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)


def test_a_client_that_cannot_bootstrap_raises_and_leaves_no_thread() -> None:
    client_id = f"pidgate-test-{secrets.token_hex(4)}"
    for _ in range(3):  # as the fleet retries its topic set-up
        with pytest.raises(KafkaError):
            open_admin_client(
                bootstrap_servers=[_refused_address()],
                client_id=client_id,
                bootstrap_timeout_ms=300,
                request_timeout_ms=300,
            )
    assert _network_threads(client_id) == []


def test_a_closed_frontier_prober_opens_no_client_for_a_probe_still_to_come() -> None:
    client_id = f"pidgate-test-{secrets.token_hex(4)}"
    prober = FrontierProber([_refused_address()], timeout_ms=300, client_id=client_id)
    prober.close()  # the proxy stops while a probe waits for a worker thread
    result = prober.probe()
    assert result.frontier is None
    assert "closed" in result.reason
    assert _network_threads(client_id) == []


def test_a_failed_probe_leaves_no_thread_and_the_next_one_tries_afresh() -> None:
    client_id = f"pidgate-test-{secrets.token_hex(4)}"
    prober = FrontierProber([_refused_address()], timeout_ms=400, client_id=client_id)
    try:
        first = prober.probe()
        second = prober.probe()
    finally:
        prober.close()
    assert first.frontier is None and second.frontier is None
    assert "closed" not in second.reason  # a failure drops the client, it does not close
    assert _network_threads(client_id) == []
