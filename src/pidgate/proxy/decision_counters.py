"""The in-process tally of quota decisions that the demo shows and the tests read
(``ProxyServer.counters``).

Owns: ``DecisionCounters`` (a ``DecisionObserver``). Keeps counts only: must not import the
server, ``serving`` or ``operations``, nor log.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.quota.manager import Admitted, Decision

__all__ = ["DecisionCounters"]

#: Rejected PIDs remembered at most (a storm of new PIDs must not grow the set forever).
MAX_REJECTED_IDS_KEPT = 100_000
#: Client software names counted at most; the rest are counted as "other".
MAX_CLIENT_SOFTWARE_KEPT = 100


@dataclass
class DecisionCounters:
    """Running totals of quota decisions (a ``DecisionObserver``)."""

    #: Counts the decision, never reads the request (admission.reads_request).
    reads_request = False

    new_producer_ids_admitted: int = 0
    produce_requests_rejected: int = 0
    rejected_producer_ids: set[int] = field(default_factory=set)
    #: Rejected Produce requests by ApiVersions client_software_name ("unknown" when not sent).
    rejections_by_client_software: Counter[str] = field(default_factory=Counter)

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        if isinstance(decision, Admitted):
            self.new_producer_ids_admitted += len(decision.new_producer_ids)
            if self.rejected_producer_ids:  # a PID refused before may be admitted now
                self.rejected_producer_ids.difference_update(decision.new_producer_ids)
        else:
            self.produce_requests_rejected += 1
            software = context.client_software_name or "unknown"
            # The name is the client's choice: bound the table (a per-connection random name
            # must not grow it forever).
            if software in self.rejections_by_client_software or (
                len(self.rejections_by_client_software) < MAX_CLIENT_SOFTWARE_KEPT
            ):
                self.rejections_by_client_software[software] += 1
            else:
                self.rejections_by_client_software["other"] += 1
            if len(self.rejected_producer_ids) < MAX_REJECTED_IDS_KEPT:
                self.rejected_producer_ids.update(decision.unknown_producer_ids)
