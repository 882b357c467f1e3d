"""The waiting room's own rules, on a real event loop without sockets: first come first served
per principal, bounds, expiry with the tokens ahead, drops, and wakes on a quota change."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pidgate.proxy.quota_control.waiting_room import Recheck, WaitingRoom


@dataclass
class FakeHeld:
    """A held request whose quota answers come from a list (the decision is what is tested
    elsewhere; here only the room's order and bookkeeping)."""

    principal: str
    answers: list[Recheck] = field(default_factory=list)
    size_bytes: int = 100
    tokens_needed: int = 1
    rechecks: int = 0
    expired_with: list[int] = field(default_factory=list)

    def recheck(self) -> Recheck:
        self.rechecks += 1
        return self.answers.pop(0) if self.answers else 60_000

    def expire(self, tokens_ahead: int) -> None:
        self.expired_with.append(tokens_ahead)


def room(max_held_requests: int = 10, max_held_bytes: int = 10_000) -> WaitingRoom:
    return WaitingRoom(max_held_requests, max_held_bytes, time.monotonic)


def run(coroutine):  # type: ignore[no-untyped-def]
    return asyncio.run(coroutine)


def test_released_in_arrival_order_and_the_first_still_waiting_stops_the_pass() -> None:
    async def main() -> None:
        waiting = room()
        first = FakeHeld("User:a", ["released"])
        second = FakeHeld("User:a", [500])
        third = FakeHeld("User:a", ["released"])
        for held in (first, second, third):
            assert waiting.hold(held, hold_ms=10_000, wait_ms=10)
        await asyncio.sleep(0.05)
        assert (first.rechecks, second.rechecks, third.rechecks) == (1, 1, 0)
        assert waiting.held_requests == 2 and waiting.stats.outcomes["released"] == 1

    run(main())


def test_bounds_refuse_a_hold_and_say_so() -> None:
    async def main() -> None:
        waiting = room(max_held_requests=1)
        assert waiting.hold(FakeHeld("User:a"), 10_000, 10_000)
        assert not waiting.hold(FakeHeld("User:b"), 10_000, 10_000)
        by_bytes = room(max_held_bytes=150)
        assert by_bytes.hold(FakeHeld("User:a"), 10_000, 10_000)
        assert not by_bytes.hold(FakeHeld("User:a"), 10_000, 10_000)
        assert waiting.stats.refused == 1 and by_bytes.stats.refused == 1
        assert by_bytes.held_bytes == 100
        waiting.close()
        by_bytes.close()

    run(main())


def test_an_expiring_hold_learns_the_tokens_held_ahead_of_it() -> None:
    async def main() -> None:
        waiting = room()
        ahead = FakeHeld("User:a", tokens_needed=2)
        other_principal = FakeHeld("User:b", tokens_needed=5)
        short = FakeHeld("User:a")
        assert waiting.hold(ahead, hold_ms=10_000, wait_ms=10_000)
        assert waiting.hold(other_principal, hold_ms=10_000, wait_ms=10_000)
        assert waiting.hold(short, hold_ms=20, wait_ms=10_000)
        await asyncio.sleep(0.1)
        assert short.expired_with == [2]  # only its own principal's queue counts
        assert waiting.stats.outcomes["expired"] == 1 and waiting.held_requests == 2
        waiting.close()
        assert ahead.expired_with == [0] and waiting.held_requests == 0
        assert waiting.held_bytes == 0

    run(main())


def test_a_dropped_hold_is_never_asked_again_and_a_quota_change_wakes_the_rest() -> None:
    async def main() -> None:
        waiting = room()
        gone = FakeHeld("User:a", ["released"])
        stays = FakeHeld("User:a", ["released"])
        assert waiting.hold(gone, hold_ms=10_000, wait_ms=60_000)
        assert waiting.hold(stays, hold_ms=10_000, wait_ms=60_000)
        waiting.drop(gone)
        waiting.wake_soon_all()  # what a quota change calls
        await asyncio.sleep(0.01)
        assert gone.rechecks == 0 and stays.rechecks == 1
        assert waiting.stats.outcomes == {"released": 1, "expired": 0, "dropped": 1}
        assert waiting.held_requests == 0

    run(main())


def test_wake_soon_outside_a_loop_is_harmless() -> None:
    # A quota changed before the server's loop runs: nothing can be held yet, nothing to wake.
    waiting = room()
    waiting.wake_soon_all()
    assert waiting.held_requests == 0
