"""The gate between a decoded Produce request and the quota manager: which principal pays,
which error code a rejected client gets, and the seam through which decisions are observed
(logs now; metrics and the event log plug in as further ``DecisionObserver``s). A principal in
observe mode gets ``WouldReject`` where enforcement would reject (proxy/quota_control/observe.py).

Owns: ``Gatekeeper`` (including the quota failure policy: what happens to a Produce request when
the quota manager itself raises), ``rejection_error_code``, the ``DecisionObserver`` protocol
(and ``reads_request``: which observers need the request's full walk).
Must not import ``serving``, ``operations`` or the server (they call it), nor any IO.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.quota_control.observe import (
    WouldReject,
    record_would_reject,
    would_reject_observers,
)
from pidgate.quota.manager import Admitted, Decision, QuotaManager, Rejected


def monotonic_ms() -> int:
    """For durations (timeouts, grace periods): never jumps."""
    return time.monotonic_ns() // 1_000_000


def quota_clock_ms() -> int:
    """The quota's time: wall-clock ms, so that persisted buckets and Bloom layers stay
    meaningful across restarts, and event-log timestamps equal the times decisions were made at
    (the backtest replays them). A clock stepped backwards only pauses refills (quota/bucket)."""
    return time.time_ns() // 1_000_000


def rejection_error_code(
    client_software_name: str | None, table: Mapping[str, int], client_id: str | None = None
) -> int:
    """Pick the code a client library retries without a fatal error.

    The table's keys match ``client_software_name`` (ApiVersions v3+) case-insensitively as
    substrings, the longest matching key winning; a client that names no software (ApiVersions
    v0-2: aiokafka, older Java clients) is matched the same way by its ``client_id``
    (aiokafka's default is ``aiokafka-producer-N``); ``default`` otherwise.
    """
    for name in (client_software_name, client_id):
        if name:
            lowered = name.lower()
            matches = [key for key in table if key != "default" and key.lower() in lowered]
            if matches:
                return table[max(matches, key=len)]
            if name is client_software_name:
                break  # a named library is what it says, whatever its client_id
    return table["default"]


@dataclass(frozen=True, slots=True)
class ProduceContext:
    """Who sent a Produce request; what observers learn besides the decision."""

    principal: str
    client_id: str | None
    client_software_name: str | None
    peer: str
    #: The broker node the connection fronts (gateway broker listeners; None on bootstrap).
    node_id: int | None = None


#: What a Produce request gets when the quota manager raises: "open" forwards it unthrottled,
#: "closed" answers it as throttled (``proxy.quota_failure_policy``).
QuotaFailurePolicy = Literal["open", "closed"]


class DecisionObserver(Protocol):
    """Told of every rejection and of every admission with something new (a new, refreshed or
    grandfathered PID). An observer whose ``on_decision`` never reads ``request`` says so with
    a class attribute ``reads_request = False`` (see :func:`reads_request`)."""

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None: ...


#: What observers that never read the request get when none of the told observers reads it:
#: the request's full walk is a fifth of a new PID's cost (issue #25's profile), and the
#: metrics and counters only count the decision.
UNREAD_REQUEST = ProduceRequestSummary(transactional_id=None, acks=0, timeout_ms=0, topics=())


def reads_request(observer: object) -> bool:
    """Whether ``observer`` reads the request summary it is given: True unless its class says
    ``reads_request = False`` (an observer that does not say is given the real summary)."""
    return bool(getattr(observer, "reads_request", True))


class Gatekeeper:
    """Asks the quota manager about each Produce request and tells the observers."""

    def __init__(
        self,
        quota: QuotaManager,
        observers: Sequence[DecisionObserver] = (),
        on_observer_error: Callable[[DecisionObserver, Exception], None] | None = None,
        *,
        failure_policy: QuotaFailurePolicy = "open",
        failure_throttle_ms: int = 1000,
        on_quota_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.quota = quota
        self._observers = tuple(observers)
        #: Whether a told observer needs the request's full walk (else it is never made for
        #: an admission; a rejection makes it anyway, for its answer). The express lane reads
        #: it too: it copies a new PID's request out of its scratch buffer only for a reader.
        self.reads_requests = any(reads_request(observer) for observer in self._observers)
        self._would_reject_observers = would_reject_observers(self._observers)
        self._on_observer_error = on_observer_error
        self.observer_errors = 0
        #: Read on every failure, so a config reload may change them.
        self.failure_policy: QuotaFailurePolicy = failure_policy
        self.failure_throttle_ms = failure_throttle_ms
        self._on_quota_error = on_quota_error
        self.quota_failures = 0
        #: The last decision came from the failure policy, not the quota: a connection does not
        #: hold such a rejection for tokens (asking a failing quota again is no use).
        self.last_decision_failed = False
        #: When the last decision was made (quota clock): observers record this exact time, so
        #: a replay of the event log (the backtest) decides at the same instants.
        self.decided_at_ms = 0

    def check(
        self, context: ProduceContext, request: ProduceRequestSummary
    ) -> Decision | WouldReject | None:
        """None when the request carries no PID (never throttled), else the quota decision;
        see :meth:`check_producer_ids`."""
        return self.check_producer_ids(context, request.producer_ids(), lambda: request)

    def admits_known(self, principal: str, producer_ids: Collection[int]) -> bool:
        """True when the quota finds every one of ``producer_ids`` (a non-empty collection)
        known and fresh where it last saw it (``QuotaManager.admit_known``): the request is
        admitted with nothing new, so there is nothing to tell an observer and no summary to
        build. False otherwise, with nothing changed; also when the quota raises: then
        :meth:`check_producer_ids`, which the caller asks next, meets the error again and
        applies the failure policy. The first question of every Produce carrying PIDs, so the
        steady state of busy producers runs no interpreted quota code (issue #25)."""
        self.decided_at_ms = now_ms = time.time_ns() // 1_000_000  # quota_clock_ms(), inline
        try:
            return self.quota.admit_known(principal, producer_ids, now_ms)
        except Exception:  # check_producer_ids reports it and applies the failure policy
            return False

    def check_producer_ids(
        self,
        context: ProduceContext,
        producer_ids: Collection[int],
        summarize: Callable[[], ProduceRequestSummary],
        *,
        report_rejection: bool = True,
    ) -> Decision | WouldReject | None:
        """The quota decision for a Produce carrying ``producer_ids`` (duplicates allowed);
        None when it carries none (never throttled); ``WouldReject`` (forward it) where the
        principal is in observe mode and enforcement would reject it. ``summarize`` builds the
        request's full summary, asked for only when an observer is told (a new, refreshed,
        grandfathered or rejected PID) that reads it (:func:`reads_request`): the steady state of
        known PIDs never builds it, nor does a new PID's admission with only the metrics and
        counters told.

        Should the quota manager raise, the failure policy decides instead: None (forward, fail
        open) or a ``Rejected`` of ``failure_throttle_ms`` (fail closed). Either way the error
        goes to ``on_quota_error`` and observers are not told (no quota decision was made).

        ``report_rejection=False``: a held request asked again (waiting_room.py); its wait was
        reported when it was first rejected, so a rejection again is not news (nor is a
        would-be rejection when its principal was switched to observe meanwhile)."""
        if not producer_ids:
            return None
        self.decided_at_ms = now_ms = time.time_ns() // 1_000_000  # quota_clock_ms(), inline
        try:
            decision = self.quota.admit(context.principal, producer_ids, now_ms)
        except Exception as error:  # a bug in the quota subsystem: the policy says what now
            failed = self._quota_failed(error, frozenset(producer_ids))
            # Observe mode forwards every request, also one the failure policy would refuse.
            observes = failed is not None and self.quota.policy.observes(context.principal)
            return None if observes else failed
        self.last_decision_failed = False
        if isinstance(decision, Rejected) and self.quota.policy.observes(context.principal):
            if not report_rejection:
                return WouldReject(decision)
            return record_would_reject(
                self.quota,
                context,
                decision,
                summarize,
                self._would_reject_observers,
                self._observer_failed,
            )
        if not self._observers:
            return decision
        if isinstance(decision, Rejected):
            told = report_rejection
        else:
            told = bool(
                decision.new_producer_ids
                or decision.refreshed_count
                or decision.grandfathered_producer_ids
            )
        if told:
            self.tell(context, decision, summarize)
        return decision

    def tell(
        self,
        context: ProduceContext,
        decision: Decision,
        summarize: Callable[[], ProduceRequestSummary],
    ) -> None:
        """Tell the observers a decision the quota made (so the last decision did not fail);
        ``summarize`` is asked for the request's summary only when one of them reads it."""
        self.last_decision_failed = False
        if not self._observers:
            return
        request = summarize() if self.reads_requests else UNREAD_REQUEST
        for observer in self._observers:
            try:
                observer.on_decision(context, request, decision)
            except Exception as error:
                self._observer_failed(observer, error)

    #: What the express lane calls for a new PID it admitted through
    #: ``QuotaManager.admit_single`` at ``decided_at_ms`` (``decision`` is
    #: ``Admitted(new_producer_ids, 0)``): the observers learn it as :meth:`check_producer_ids`
    #: would have told them, in one frame.
    tell_admitted_new = tell

    def _observer_failed(self, observer: object, error: Exception) -> None:
        # Observers (logs, metrics, event log) never change what happens to the request.
        self.observer_errors += 1
        if self._on_observer_error is not None:
            self._on_observer_error(observer, error)  # type: ignore[arg-type]

    def _quota_failed(self, error: Exception, producer_ids: frozenset[int]) -> Rejected | None:
        self.quota_failures += 1
        self.last_decision_failed = True
        if self._on_quota_error is not None:
            # Reporting must not turn a handled failure into a closed connection.
            with contextlib.suppress(Exception):
                self._on_quota_error(error)
        if self.failure_policy == "open":
            return None
        return Rejected(
            throttle_time_ms=self.failure_throttle_ms,
            unknown_producer_ids=tuple(sorted(producer_ids)),
        )


__all__ = [
    "Admitted",
    "DecisionObserver",
    "Gatekeeper",
    "ProduceContext",
    "QuotaFailurePolicy",
    "Rejected",
    "WouldReject",
    "monotonic_ms",
    "quota_clock_ms",
    "rejection_error_code",
]
