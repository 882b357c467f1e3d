"""Learning the PID frontier: a fresh producer ID from every broker of the upstream cluster; the
smallest is a lower bound on every PID the cluster allocates afterwards (the argument and its
limits: :mod:`pidgate.quota.grandfather` and docs/grandfathering.md).

Owns ``FrontierProber`` / ``probe_frontier`` (blocking: run them in a worker thread) and
``FrontierResult``.

How: a kafka-python admin client bootstraps from the configured upstream addresses with the
shared store's ``security`` settings (TLS / SASL for kafka-python; PLAINTEXT needs nothing),
learns every broker from its Metadata answer -- in sidecar mode too, where the upstream is one
broker: a broker left out could hold an older PID block -- and sends each broker two
InitProducerId requests with a null transactional id (each allocates one PID and creates no
partition or transaction state). The InitProducerId version is negotiated from the broker's
ApiVersions (tansu answers v3+ correctly; its v0-v2 is broken, kafka-python picks the newest).
Each broker must answer both without error and the second PID must be larger than the first
(a broker that does not allocate in increasing order gives no frontier). Any failure --
unreachable, a SASL listener without credentials, an error code, a timeout -- gives no frontier
and a reason, never an exception: the caller falls back to learning mode and says why.

Cost: two PIDs per broker per probe; pidgate probes at start and when a policy change makes a
principal limited, never on the request path. The probe talks to the brokers directly, never
through pidgate. kafka-python and ``pidgate.proxy.logs`` only; never logs ``security``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient
from kafka.protocol.producer import InitProducerIdRequest

__all__ = ["FrontierProber", "FrontierResult", "probe_frontier"]

#: Transaction timeout sent with the probe's InitProducerId (ignored without a transactional id,
#: but the broker validates it against transaction.max.timeout.ms).
_TRANSACTION_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class FrontierResult:
    """``frontier``: the smallest fresh PID over all brokers, or None with ``reason`` saying why
    there is none. ``per_broker``: node id -> the two PIDs it answered (in order)."""

    frontier: int | None
    reason: str
    per_broker: dict[int, tuple[int, int]] = field(default_factory=dict)
    elapsed_ms: int = 0


def _failed(
    reason: str, started: float, per_broker: dict[int, tuple[int, int]] | None = None
) -> FrontierResult:
    return FrontierResult(None, reason, per_broker or {}, int((time.monotonic() - started) * 1000))


class FrontierProber:
    """Probes the PID frontier with one kafka-python admin client kept open between probes
    (so a probe costs two round trips per broker, not a bootstrap: the time between the moment
    enforcement begins and the frontier is short). Thread-safe; blocking: call ``probe`` from a
    worker thread. ``close`` when done."""

    def __init__(
        self,
        bootstrap_servers: list[str],
        *,
        security: dict[str, Any] | None = None,
        timeout_ms: int = 5000,
        client_id: str = "pidgate-pid-frontier",
    ) -> None:
        self._bootstrap = list(bootstrap_servers)
        self._security = dict(security or {})
        self._timeout_ms = timeout_ms
        self._client_id = client_id
        self._lock = threading.Lock()
        self._admin: Any = None

    def _client(self) -> Any:
        with self._lock:
            if self._admin is None:
                self._admin = KafkaAdminClient(
                    bootstrap_servers=self._bootstrap,
                    client_id=self._client_id,
                    bootstrap_timeout_ms=max(100, self._timeout_ms),
                    request_timeout_ms=max(100, self._timeout_ms),
                    reconnect_backoff_max_ms=500,
                    **self._security,
                )
            return self._admin

    def close(self) -> None:
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def probe(self) -> FrontierResult:
        """Two fresh PIDs from every broker the cluster's metadata lists now; never raises."""
        started = time.monotonic()
        deadline = started + self._timeout_ms / 1000
        per_broker: dict[int, tuple[int, int]] = {}
        try:
            admin = self._client()
        except Exception as error:  # kafka-python raises many kinds; all mean "no frontier"
            return _failed(f"cannot reach the cluster: {type(error).__name__}: {error}", started)
        manager = admin._manager  # kafka-python 3: the client's network manager

        async def ask_every_broker() -> str | None:
            await manager.cluster.refresh_metadata()  # every broker there is now
            brokers = sorted(broker.node_id for broker in manager.cluster.brokers())
            if not brokers:
                return "the cluster's metadata lists no broker"
            for node_id in brokers:
                answers: list[int] = []
                for _ in range(2):
                    remaining_ms = int((deadline - time.monotonic()) * 1000)
                    if remaining_ms <= 0:
                        return f"timed out after {self._timeout_ms} ms (broker {node_id})"
                    request = InitProducerIdRequest(
                        transactional_id=None,
                        transaction_timeout_ms=_TRANSACTION_TIMEOUT_MS,
                        producer_id=-1,
                        producer_epoch=-1,
                    )
                    response = await manager.wait_for(
                        manager.send(request, node_id=node_id), remaining_ms
                    )
                    if response.error_code != 0 or response.producer_id < 0:
                        return (
                            f"broker {node_id} answered InitProducerId with error "
                            f"{response.error_code} (producer_id {response.producer_id})"
                        )
                    answers.append(int(response.producer_id))
                per_broker[node_id] = (answers[0], answers[1])
                if answers[1] <= answers[0]:
                    return (
                        f"broker {node_id} does not allocate PIDs in increasing order "
                        f"({answers[0]} then {answers[1]})"
                    )
            return None

        try:
            failure = manager.run(ask_every_broker)
        except Exception as error:
            self.close()  # start afresh next time
            return _failed(f"probe failed: {type(error).__name__}: {error}", started, per_broker)
        if failure is not None:
            return _failed(failure, started, per_broker)
        frontier = min(first for first, _ in per_broker.values())
        return FrontierResult(
            frontier,
            f"smallest fresh PID of {len(per_broker)} broker(s)",
            per_broker,
            int((time.monotonic() - started) * 1000),
        )


def probe_frontier(
    bootstrap_servers: list[str],
    *,
    security: dict[str, Any] | None = None,
    timeout_ms: int = 5000,
) -> FrontierResult:
    """One probe with a client of its own (closed afterwards). Blocking."""
    prober = FrontierProber(bootstrap_servers, security=security, timeout_ms=timeout_ms)
    try:
        return prober.probe()
    finally:
        prober.close()
