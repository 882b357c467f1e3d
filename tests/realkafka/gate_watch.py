"""What a pidgate in front of real Kafka decided, as a test reads it: the quota decisions it
made (principal, client library, the rejection code it chose) and its operator-facing /metrics
and /state.

Owns: ``DecisionLog`` (a ``DecisionObserver``), ``observed_gate`` (a gateway like
``tests.realkafka.gate``'s, with that observer attached, stopped on exit), ``quota_for``,
``user_metric`` and ``gate_state``.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control.admission import ProduceContext, rejection_error_code
from pidgate.quota.manager import Admitted, Decision
from tests.realkafka.gate import gate_settings
from tests.realkafka.kafka import KafkaRun


@dataclass(frozen=True)
class Decided:
    principal: str
    client_software_name: str | None
    client_id: str | None
    admitted: bool
    #: Tokens taken (admitted) or PIDs turned away (rejected).
    producer_ids: tuple[int, ...]
    #: The error code the rejection carried (the table lookup pidgate's connection makes).
    error_code: int | None


@dataclass
class DecisionLog:
    """Every quota decision with its context; bounded (tests make a few hundred at most)."""

    error_codes: dict[str, int]
    limit: int = 10_000
    decided: list[Decided] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        if isinstance(decision, Admitted):
            admitted, pids, code = True, decision.new_producer_ids, None
        else:
            admitted, pids = False, decision.unknown_producer_ids
            code = rejection_error_code(
                context.client_software_name, self.error_codes, context.client_id
            )
        entry = Decided(
            context.principal, context.client_software_name, context.client_id, admitted, pids, code
        )
        with self._lock:
            if len(self.decided) < self.limit:
                self.decided.append(entry)

    def rejections(self) -> list[Decided]:
        with self._lock:
            return [d for d in self.decided if not d.admitted]


def quota_for(users: dict[str, int], window_s: int) -> dict[str, Any]:
    """``producer_ids_rate`` per user over ``window_s``; grandfathering off, so every PID a test
    makes is charged, whatever pidgate learnt of the cluster's PID frontier (that is the
    grandfathering tests' subject, not these)."""
    return {
        "producer.id.quota.window.size.seconds": window_s,
        "grandfather_grace_ms": 0,
        "users": {user: {"producer_ids_rate": rate} for user, rate in users.items()},
    }


@contextmanager
def observed_gate(
    kafka: KafkaRun, **settings: Any
) -> Iterator[tuple[BackgroundProxy, DecisionLog]]:
    """pidgate in front of ``kafka`` (``gate_settings`` arguments), its decisions logged."""
    built = gate_settings(kafka, **settings)
    log = DecisionLog(dict(built.rejection.error_codes))
    gate = BackgroundProxy(built, observers=(log,)).start(timeout_s=60)
    try:
        yield gate, log
    finally:
        gate.stop()


def _admin_get(gate: BackgroundProxy, path: str) -> str:
    listen = gate.server.settings.admin.listen
    with urllib.request.urlopen(f"http://{listen.host}:{listen.port}{path}", timeout=10) as answer:
        body: bytes = answer.read()
        return body.decode()


def user_metric(gate: BackgroundProxy, name: str, user: str) -> float:
    """The value of ``name`` (a sample name, e.g. ``pidgate_producer_ids_new_total``) for
    ``user`` (the label drops ``User:``) from /metrics; 0 when the user has no sample."""
    for family in text_string_to_metric_families(_admin_get(gate, "/metrics")):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("user") == user:
                return float(sample.value)
    return 0.0


def gate_state(gate: BackgroundProxy) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(_admin_get(gate, "/state"))
    return state


def open_connections(gate: BackgroundProxy) -> int:
    return gate.call_and_wait(lambda: len(gate.server.context.connections))
