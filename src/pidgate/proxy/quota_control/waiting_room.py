"""Produce requests held until their principal has the tokens they need (issue "patience").

A Produce whose new PIDs need tokens that are not there is neither forwarded nor answered: its
connection stops being read (what a Kafka broker does to a client over its quota, KIP-219) and
the request waits here. It is released -- forwarded as if it had just arrived -- the moment its
principal's bucket holds the tokens, or the quota changes (a raise relieves at once), and is
answered with a rejection only when its hold ends: ``rejection.max_hold_ms``, and never past
two thirds of the request's own ``timeout_ms`` (the client's ``request.timeout.ms``), so the
client never times it out. A rejected client thus spends one retry per hold, not one per few
seconds, and a client with a finite retry budget (KafkaJS ``retries: 5``, the Java console
producer's ``retries=3``) outlasts a wait that fits its ``delivery.timeout.ms``.

Owns: ``WaitingRoom`` (the held requests per principal, in arrival order; the timers that wake
them; the bounds on how many and how many bytes are held) and the ``HeldProduce`` protocol a
connection implements for each request it holds. Knows nothing of sockets or frames: the
connection forwards, answers and resumes itself. Imports no metrics or logging: its counters are
read by ``metrics`` at scrape time. Must not import ``serving``, ``operations`` or the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

#: What a held request's re-check found: released (forwarded), still waiting (ms until its
#: principal's bucket may hold the tokens), or gone (its connection closed meanwhile).
Recheck = Literal["released", "gone"] | int

#: How a hold ended, as counted in ``pidgate_produce_holds_total``.
HoldOutcome = Literal["released", "expired", "dropped"]

#: Wake a little after the bucket's computed instant: the quota clock has ms resolution and a
#: timer may fire a hair early.
_WAKE_SLACK_S = 0.002


class HeldProduce(Protocol):
    """One held request, as the connection that holds it sees it."""

    @property
    def principal(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def tokens_needed(self) -> int:
        """New PIDs it carries: the tokens it takes when released."""
        ...

    def recheck(self) -> Recheck:
        """Ask the quota again; forward the request if admitted."""
        ...

    def expire(self, tokens_ahead: int) -> None:
        """The hold ran out: answer the request with a rejection; ``tokens_ahead``: what the
        requests held before it need (they take the next tokens)."""
        ...


@dataclass
class _Entry:
    held: HeldProduce
    since_s: float
    expiry: asyncio.TimerHandle | None = None


@dataclass
class HoldStats:
    """Counters for metrics, read at scrape time."""

    started: int = 0
    outcomes: dict[str, int] = field(
        default_factory=lambda: {"released": 0, "expired": 0, "dropped": 0}
    )
    #: Seconds held, summed over ended holds (with ``sum(outcomes)``: the mean hold).
    held_seconds: float = 0.0
    #: Holds refused because a bound was reached (answered as a plain rejection instead).
    refused: int = 0


class WaitingRoom:
    """The held Produce requests of one event loop, per principal in arrival order."""

    def __init__(
        self,
        max_held_requests: int,
        max_held_bytes: int,
        clock_s: Callable[[], float],
    ) -> None:
        self.max_held_requests = max_held_requests
        self.max_held_bytes = max_held_bytes
        self._clock_s = clock_s
        self._queues: dict[str, deque[_Entry]] = {}
        self._entries: dict[int, _Entry] = {}  # id(held) -> entry
        self._wakers: dict[str, asyncio.TimerHandle] = {}
        self.held_bytes = 0
        self.stats = HoldStats()

    @property
    def held_requests(self) -> int:
        return len(self._entries)

    def has_room_for(self, size_bytes: int) -> bool:
        return (
            len(self._entries) < self.max_held_requests
            and self.held_bytes + size_bytes <= self.max_held_bytes
        )

    def hold(self, held: HeldProduce, hold_ms: int, wait_ms: int) -> bool:
        """Hold ``held`` for at most ``hold_ms``, first re-checked after ``wait_ms`` (the
        time until its principal's bucket may hold the tokens). False (nothing held) when a
        bound is reached: the caller answers as it would without holding."""
        if not self.has_room_for(held.size_bytes):
            self.stats.refused += 1
            return False
        loop = asyncio.get_running_loop()
        entry = _Entry(held, self._clock_s())
        entry.expiry = loop.call_later(hold_ms / 1000, self._expire, entry)
        self._entries[id(held)] = entry
        self._queues.setdefault(held.principal, deque()).append(entry)
        self.held_bytes += held.size_bytes
        self.stats.started += 1
        self._wake_in(held.principal, wait_ms)
        return True

    def drop(self, held: HeldProduce) -> None:
        """Its connection closed: the request is never forwarded."""
        entry = self._entries.get(id(held))
        if entry is not None:
            self._end(entry, "dropped")

    def expire_now(self, held: HeldProduce) -> None:
        """Answer ``held`` as expired now (its connection is shutting down)."""
        entry = self._entries.get(id(held))
        if entry is not None:
            self._expire(entry)

    def wake_all(self) -> None:
        """The quota changed (raised, removed, reloaded): re-check every principal now."""
        for principal in list(self._queues):
            self._wake(principal)

    def wake_soon_all(self) -> None:
        """``wake_all`` on the next loop iteration (safe to call from inside a decision).
        Outside a running loop nothing can be held, so there is nothing to wake."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_soon(self.wake_all)

    def close(self) -> None:
        """Stop (shutdown): every held request is answered as expired now."""
        for entry in list(self._entries.values()):
            self._expire(entry)
        for handle in self._wakers.values():
            handle.cancel()
        self._wakers.clear()

    # -- internals ---------------------------------------------------------------------------

    def _wake_in(self, principal: str, wait_ms: int) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(wait_ms, 0) / 1000 + _WAKE_SLACK_S
        current = self._wakers.get(principal)
        if current is not None:
            if current.when() <= when:
                return
            current.cancel()
        self._wakers[principal] = loop.call_at(when, self._wake, principal)

    def _wake(self, principal: str) -> None:
        """Re-check the principal's held requests in arrival order; the first still waiting
        stops the pass (first come, first served) and sets the next wake-up."""
        waker = self._wakers.pop(principal, None)
        if waker is not None:
            waker.cancel()
        queue = self._queues.get(principal)
        while queue:
            entry = queue[0]
            outcome = entry.held.recheck()
            if outcome == "released":
                self._end(entry, "released")
            elif outcome == "gone":
                self._end(entry, "dropped")
            else:
                assert isinstance(outcome, int)
                self._wake_in(principal, outcome)
                return

    def _expire(self, entry: _Entry) -> None:
        if id(entry.held) not in self._entries:
            return
        tokens_ahead = 0
        for ahead in self._queues.get(entry.held.principal, ()):
            if ahead is entry:
                break
            tokens_ahead += ahead.held.tokens_needed
        self._end(entry, "expired")
        entry.held.expire(tokens_ahead)
        # The request first in line may have been this one: the next may be ready.
        principal = entry.held.principal
        if self._queues.get(principal):
            self._wake_in(principal, 0)

    def _end(self, entry: _Entry, outcome: HoldOutcome) -> None:
        held = entry.held
        if self._entries.pop(id(held), None) is None:
            return
        if entry.expiry is not None:
            entry.expiry.cancel()
        queue = self._queues.get(held.principal)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(entry)
            if not queue:
                del self._queues[held.principal]
                waker = self._wakers.pop(held.principal, None)
                if waker is not None:
                    waker.cancel()
        self.held_bytes -= held.size_bytes
        self.stats.outcomes[outcome] += 1
        self.stats.held_seconds += max(0.0, self._clock_s() - entry.since_s)
