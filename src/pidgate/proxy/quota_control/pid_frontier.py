"""Learning the PID frontier: a fresh producer ID from every broker of the upstream cluster; the
smallest is a lower bound on every PID the cluster allocates afterwards (the argument and its
limits: :mod:`pidgate.quota.grandfather` and docs/grandfathering.md).

Owns ``FrontierProber`` / ``probe_frontier`` (blocking: run them in a worker thread),
``FrontierResult``, the retry rules (``RETRIABLE_ERROR_CODES``, ``run_probe``) and
``ProbeTarget``, what a probe asks of the cluster.

How: a kafka-python admin client bootstraps from the configured upstream addresses with the
shared store's ``security`` settings (TLS / SASL for kafka-python; PLAINTEXT needs nothing),
learns every broker from its Metadata answer -- in sidecar mode too, where the upstream is one
broker: a broker left out could hold an older PID block -- and sends each broker two
InitProducerId requests with a null transactional id (each allocates one PID and creates no
partition or transaction state). The InitProducerId version is negotiated from the broker's
ApiVersions (tansu answers v3+ correctly; its v0-v2 is broken, kafka-python picks the newest).
Each broker must answer both without error and the second PID must be larger than the first
(a broker that does not allocate in increasing order gives no frontier).

Retries: an answer with one of Kafka's retriable error codes (Kafka 4 answers the first
InitProducerId after a start with 14 COORDINATOR_LOAD_IN_PROGRESS while its broker fetches a PID
block from the controller, KIP-730) and a network error (refused, reset, timed out, no broker
reachable yet) are retried with exponential backoff and jitter (Kafka's own client defaults,
KIP-580: 100 ms doubling up to 1 s, +-20 %) until the probe's time limit
(``quota.grandfather_probe_timeout_ms``). Only then, or at once on a non-retriable answer (an
authorization or authentication failure, an unknown error, PIDs out of order), is there no
frontier, with a reason naming the last error -- never an exception: the caller falls back to
learning mode and says why.

Cost: two PIDs per broker per probe (a retried request allocates none: it was refused); pidgate
probes at start and when a policy change makes a principal limited, never on the request path.
The probe talks to the brokers directly, never through pidgate. kafka-python only; never logs
``security``. Must not import ``serving``, ``operations`` or the server (the quota control room
calls it).
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kafka.errors import KafkaError, for_code
from kafka.protocol.producer import InitProducerIdRequest

from pidgate.proxy.kafka_admin import open_admin_client
from pidgate.proxy.upstream_check import describe_error

__all__ = [
    "RETRIABLE_ERROR_CODES",
    "FrontierProber",
    "FrontierResult",
    "ProbeTarget",
    "probe_frontier",
    "run_probe",
]

#: Transaction timeout sent with the probe's InitProducerId (ignored without a transactional id,
#: but the broker validates it against transaction.max.timeout.ms).
_TRANSACTION_TIMEOUT_MS = 60_000

#: Kafka's own retriable flags: the error codes whose exception extends
#: ``org.apache.kafka.common.errors.RetriableException`` in ``Errors.java`` of Kafka 4.1.0
#: (read from kafka-clients-4.1.0.jar: ``Errors.values()``, ``exception() instanceof
#: RetriableException``). Kafka 3.1.0 flags the same codes but 51 CONCURRENT_TRANSACTIONS, which
#: its producer's TransactionManager retried anyway. The ones InitProducerId can answer with:
#: 7 REQUEST_TIMED_OUT, 13 NETWORK_EXCEPTION, 14 COORDINATOR_LOAD_IN_PROGRESS (Kafka 4's
#: ``RPCProducerIdManager`` without a PID block yet), 15 COORDINATOR_NOT_AVAILABLE,
#: 16 NOT_COORDINATOR, 51 CONCURRENT_TRANSACTIONS; the rest are listed for completeness.
#: Not retriable, so no frontier at once: -1 UNKNOWN_SERVER_ERROR, 31
#: CLUSTER_AUTHORIZATION_FAILED (no IdempotentWrite on the cluster), 42 INVALID_REQUEST, ...
RETRIABLE_ERROR_CODES: frozenset[int] = frozenset(
    {
        *(2, 3, 5, 6, 7, 9, 13, 14, 15, 16, 19, 20, 41, 51, 56, 70, 71, 72, 74, 75),
        *(78, 80, 83, 84, 88, 89, 100, 103, 106, 122, 123, 133),
    }
)

#: Backoff between attempts (Kafka clients' retry.backoff.ms / retry.backoff.max.ms defaults and
#: their +-20 % jitter, KIP-580).
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 1.0
BACKOFF_JITTER = 0.2
#: The last attempt, when the next pause would end past the deadline, is made only if at least
#: this much is left for it.
LAST_TRY_MIN_S = 0.05

_T = TypeVar("_T")


@dataclass(frozen=True)
class FrontierResult:
    """``frontier``: the smallest fresh PID over all brokers, or None with ``reason`` saying why
    there is none. ``per_broker``: node id -> the two PIDs it answered (in order).
    ``retries``: attempts that met a retriable error."""

    frontier: int | None
    reason: str
    per_broker: dict[int, tuple[int, int]] = field(default_factory=dict)
    elapsed_ms: int = 0
    retries: int = 0


class ProbeTarget(Protocol):
    """What a probe asks of the cluster. Both calls block for at most ``timeout_ms`` and may
    raise; :func:`run_probe` decides what is retried."""

    def broker_ids(self, timeout_ms: int) -> list[int]:
        """Every broker the cluster's metadata lists now."""

    def init_producer_id(self, node_id: int, timeout_ms: int) -> tuple[int, int]:
        """One InitProducerId (null transactional id) to ``node_id``: (error code, PID)."""


def error_name(code: int) -> str:
    """``14 COORDINATOR_LOAD_IN_PROGRESS``: the code and Kafka's name for it."""
    if code == -1:  # kafka-python calls it UNKNOWN
        return "-1 UNKNOWN_SERVER_ERROR"
    name = getattr(for_code(code), "message", None) or "(a code this client does not know)"
    return f"{code} {name}"


class _Retriable(Exception):
    """An attempt failed in a way worth repeating (the message says how)."""


class _GiveUp(Exception):
    """No frontier: the message is the reason."""


def _is_retriable(error: BaseException) -> bool:
    """Network errors: kafka-python's retriable errors (KafkaConnectionError, NodeNotReadyError,
    KafkaTimeoutError, ... carry Kafka's flag) and the OS's socket errors."""
    if isinstance(error, KafkaError):
        return bool(getattr(error, "retriable", False))
    return isinstance(error, OSError)


@dataclass
class _Attempts:
    """Runs steps until they succeed, retrying retriable failures with backoff, within one
    deadline shared by every step of the probe."""

    timeout_ms: int
    deadline: float
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    jitter: Callable[[], float]
    retries: int = 0
    last_error: str | None = None
    last_try: bool = False

    def run(self, what: str, step: Callable[[int], _T]) -> _T:
        backoff_s = BACKOFF_INITIAL_S
        while True:
            remaining_ms = int((self.deadline - self.clock()) * 1000)
            if remaining_ms <= 0:
                raise _GiveUp(self._out_of_time(what))
            try:
                return step(remaining_ms)
            except _Retriable as error:
                self.last_error = str(error)
            except _GiveUp:
                raise
            except Exception as error:  # kafka-python raises many kinds
                detail = f"{what}: {describe_error(error)}"
                if not _is_retriable(error):
                    raise _GiveUp(f"{detail} (not retriable)") from error
                self.last_error = detail
            self.retries += 1
            pause_s = backoff_s * (1 + BACKOFF_JITTER * (2 * self.jitter() - 1))
            left_s = self.deadline - self.clock()
            if pause_s >= left_s:
                # One last attempt halfway through what is left (it gets the other half),
                # rather than sleeping past the deadline or giving up with time to spare.
                if self.last_try or left_s < 2 * LAST_TRY_MIN_S:
                    raise _GiveUp(self._out_of_time(what))
                self.last_try = True
                pause_s = left_s / 2
            self.sleep(pause_s)
            backoff_s = min(BACKOFF_MAX_S, backoff_s * 2)

    def _out_of_time(self, what: str) -> str:
        last = self.last_error or f"{what}: no answer"
        return (
            f"{last} (retriable; still failing after {self.retries} attempt(s) in "
            f"{self.timeout_ms} ms, quota.grandfather_probe_timeout_ms)"
        )


def run_probe(
    target: ProbeTarget,
    timeout_ms: int,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
) -> FrontierResult:
    """Two fresh PIDs from every broker ``target`` lists, each request retried on retriable
    errors within ``timeout_ms`` in all; never raises. ``clock``/``sleep``/``jitter`` (uniform
    in [0, 1)) are injectable for tests."""
    started = clock()
    attempts = _Attempts(timeout_ms, started + timeout_ms / 1000, clock, sleep, jitter)
    per_broker: dict[int, tuple[int, int]] = {}

    def elapsed_ms() -> int:
        return int((clock() - started) * 1000)

    def fresh_pid(node_id: int, remaining_ms: int) -> int:
        code, pid = target.init_producer_id(node_id, remaining_ms)
        if code in RETRIABLE_ERROR_CODES:
            raise _Retriable(
                f"broker {node_id} answered InitProducerId with error {error_name(code)}"
            )
        if code != 0 or pid < 0:
            raise _GiveUp(
                f"broker {node_id} answered InitProducerId with error {error_name(code)} "
                f"(producer_id {pid}; not retriable)"
            )
        return pid

    def broker_ids(remaining_ms: int) -> list[int]:
        brokers = target.broker_ids(remaining_ms)
        if not brokers:  # a broker that has just started may not list itself yet
            raise _Retriable("the cluster's metadata lists no broker")
        return sorted(brokers)

    try:
        brokers = attempts.run("cannot reach the cluster", broker_ids)
        for node_id in brokers:
            what = f"broker {node_id}"
            first = attempts.run(what, functools.partial(fresh_pid, node_id))
            second = attempts.run(what, functools.partial(fresh_pid, node_id))
            per_broker[node_id] = (first, second)
            if second <= first:
                raise _GiveUp(
                    f"broker {node_id} does not allocate PIDs in increasing order "
                    f"({first} then {second})"
                )
    except _GiveUp as failure:
        return FrontierResult(None, str(failure), per_broker, elapsed_ms(), attempts.retries)
    reason = f"smallest fresh PID of {len(per_broker)} broker(s)"
    if attempts.retries:
        reason += f" after {attempts.retries} retried attempt(s) (last: {attempts.last_error})"
    frontier = min(first for first, _ in per_broker.values())
    return FrontierResult(frontier, reason, per_broker, elapsed_ms(), attempts.retries)


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
        # Set by close(): a probe still running on a worker thread when the proxy stops must
        # not open a new client (and its network thread) after the last close.
        self._closed = False

    def _client(self, timeout_ms: int) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the frontier prober is closed (pidgate is stopping)")
            if self._admin is None:
                self._admin = open_admin_client(
                    bootstrap_servers=self._bootstrap,
                    client_id=self._client_id,
                    bootstrap_timeout_ms=max(100, timeout_ms),
                    request_timeout_ms=max(100, self._timeout_ms),
                    reconnect_backoff_max_ms=500,
                    **self._security,
                )
            return self._admin

    def close(self) -> None:
        """Close the client for good: a probe after this (or still running) fails."""
        with self._lock:
            self._closed = True
        self._drop_client()

    def _drop_client(self) -> None:
        with self._lock:
            admin, self._admin = self._admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    # -- ProbeTarget, over kafka-python -------------------------------------------------------

    def broker_ids(self, timeout_ms: int) -> list[int]:
        manager = self._client(timeout_ms)._manager  # kafka-python 3: the network manager

        async def refresh() -> list[int]:
            await manager.cluster.refresh_metadata()  # every broker there is now
            return [broker.node_id for broker in manager.cluster.brokers()]

        brokers: list[int] = manager.run(refresh)
        return brokers

    def init_producer_id(self, node_id: int, timeout_ms: int) -> tuple[int, int]:
        manager = self._client(timeout_ms)._manager

        async def ask() -> tuple[int, int]:
            request = InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout_ms=_TRANSACTION_TIMEOUT_MS,
                producer_id=-1,
                producer_epoch=-1,
            )
            response = await manager.wait_for(manager.send(request, node_id=node_id), timeout_ms)
            return int(response.error_code), int(response.producer_id)

        answer: tuple[int, int] = manager.run(ask)
        return answer

    # -- the probe ----------------------------------------------------------------------------

    def probe(self) -> FrontierResult:
        """Two fresh PIDs from every broker the cluster's metadata lists now, retriable errors
        retried within the timeout; never raises."""
        try:
            result = run_probe(self, self._timeout_ms)
        except Exception as error:  # run_probe reports failures; a bug guard
            result = FrontierResult(None, f"probe failed: {describe_error(error)}")
        if result.frontier is None:
            self._drop_client()  # start afresh next time
        return result


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
