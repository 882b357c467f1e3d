"""A DecisionObserver for tests: which principal each new PID was charged to."""

from __future__ import annotations

import threading

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.quota.manager import Decision, Rejected


class Decisions:
    """A DecisionObserver: which principal each new PID was charged to (admitted or refused)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[tuple[str, bool, tuple[int, ...]]] = []

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        if isinstance(decision, Rejected):
            event = (context.principal, False, tuple(decision.unknown_producer_ids))
        else:
            event = (context.principal, True, tuple(decision.new_producer_ids))
        with self._lock:
            self._events.append(event)

    @property
    def events(self) -> list[tuple[str, bool, tuple[int, ...]]]:
        with self._lock:
            return list(self._events)

    def principals(self) -> set[str]:
        return {principal for principal, _, _ in self.events}

    def admitted(self, principal: str) -> set[int]:
        return {pid for p, ok, pids in self.events if p == principal and ok for pid in pids}

    def rejected(self, principal: str) -> set[int]:
        return {pid for p, ok, pids in self.events if p == principal and not ok for pid in pids}
