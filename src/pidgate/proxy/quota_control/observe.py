"""Observe mode: pidgate decides every Produce request as it would, but forwards the ones it
would have rejected (or held), and records them as would-be rejections -- the safe first
deployment in front of a busy cluster.

A would-be rejection changes nothing in the quota: no token is taken, its PIDs stay unknown,
so the PID's next request is decided again (and admitted as new, a token taken, once the
bucket holds one). That is what enforcement would see too, so switching a principal from
observe to enforce starts enforcing from the tokens and known PIDs observed so far.

Owns: ``WouldReject`` (the decision the gatekeeper returns for such a request: forward it),
``WouldRejectObserver`` (observers that record would-be rejections: metrics, the event log)
and ``record_would_reject``. The mode itself is the quota policy's
(``QuotaPolicy.observes``: user → default → enforce).

Must not import: asyncio, socket, the connection or server modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.quota.manager import QuotaManager, Rejected

__all__ = ["WouldReject", "WouldRejectObserver", "record_would_reject", "would_reject_observers"]


@dataclass(frozen=True, slots=True)
class WouldReject:
    """Forward the request: enforcement would have answered it with ``rejected``."""

    rejected: Rejected


class _Context(Protocol):
    @property
    def principal(self) -> str: ...


@runtime_checkable
class WouldRejectObserver(Protocol):
    """An observer that records would-be rejections besides decisions (``DecisionObserver``).
    Observers without this method (the counters behind the demo, a fleet's outbox) never hear
    of them: to them a forwarded request was not rejected."""

    def on_would_reject(
        self, context: _Context, request: ProduceRequestSummary, rejected: Rejected
    ) -> None: ...


def would_reject_observers(observers: Sequence[object]) -> tuple[WouldRejectObserver, ...]:
    return tuple(o for o in observers if isinstance(o, WouldRejectObserver))


def record_would_reject(
    quota: QuotaManager,
    context: _Context,
    rejected: Rejected,
    summarize: Callable[[], ProduceRequestSummary],
    observers: Sequence[WouldRejectObserver],
    on_error: Callable[[object, Exception], None],
) -> WouldReject:
    """Count a would-be rejection (``/state``) and tell ``observers``; an observer's error goes
    to ``on_error`` and never changes what happens to the request."""
    quota.note_would_reject(context.principal, len(rejected.unknown_producer_ids))
    if observers:
        request = summarize()
        for observer in observers:
            try:
                observer.on_would_reject(context, request, rejected)
            except Exception as error:
                on_error(observer, error)
    return WouldReject(rejected)
