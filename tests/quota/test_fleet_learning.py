"""What a fleet member applies from the others (``QuotaManager.learn``) and what it announces
(``Admitted.announced_producer_ids``): pure, time as a parameter."""

from __future__ import annotations

from pidgate.quota.bucket import TokenBucket
from pidgate.quota.manager import Admitted, QuotaManager, Rejected
from pidgate.quota.policy import QuotaPolicy

WINDOW_MS = 60_000
POLICY = QuotaPolicy(
    window_ms=WINDOW_MS, window_num=6, default_producer_ids_rate=2, grandfather_grace_ms=0
)


def test_a_pid_another_member_admitted_is_known_here_and_never_charged() -> None:
    here = QuotaManager(POLICY)
    assert here.learn("User:alice", [7], taken_tokens=1, now_ms=1_000)
    assert here.is_known("User:alice", 7, 1_000)
    decision = here.admit("User:alice", [7], 2_000)
    assert isinstance(decision, Admitted) and decision.new_producer_ids == ()


def test_tokens_another_member_took_are_debited_here_in_fleet_scope() -> None:
    here = QuotaManager(POLICY)
    here.learn("User:alice", [1, 2], taken_tokens=2, now_ms=0)  # the fleet spent both tokens
    rejected = here.admit("User:alice", [3], 0)
    assert isinstance(rejected, Rejected)
    assert rejected.throttle_time_ms == WINDOW_MS // 2  # one token refills in window / rate


def test_instance_scope_shares_known_pids_but_not_tokens() -> None:
    here = QuotaManager(POLICY)
    here.learn("User:alice", [1, 2], taken_tokens=0, now_ms=0)
    assert isinstance(here.admit("User:alice", [3, 4], 0), Admitted)  # both local tokens left


def test_unlimited_principals_learn_nothing() -> None:
    here = QuotaManager(QuotaPolicy(window_ms=WINDOW_MS, window_num=6))
    assert not here.learn("User:bob", [1], taken_tokens=1, now_ms=0)
    assert here.principal_count == 0


def test_a_debit_can_leave_a_debt_that_refill_repays_before_anyone_admits() -> None:
    # Three members spent the same two tokens at once: six taken, four of them a debt.
    bucket = TokenBucket.full(2, WINDOW_MS, 0).debit(6, 0)
    assert bucket.tokens(0) == -4.0
    assert bucket.try_take(1, 2 * WINDOW_MS) is None  # two windows repay the debt
    assert bucket.try_take(1, 2 * WINDOW_MS + WINDOW_MS // 2) is not None
    assert TokenBucket.full(2, WINDOW_MS, 0).debit(10**6, 0).tokens(0) == -20.0  # bounded


def test_learnt_pids_stay_known_for_a_window_after_the_last_announcement() -> None:
    here = QuotaManager(POLICY)
    here.learn("User:alice", [7], taken_tokens=0, now_ms=0)
    here.learn("User:alice", [7], taken_tokens=0, now_ms=50_000)  # re-announced
    assert here.is_known("User:alice", 7, 100_000)
    assert not here.is_known("User:alice", 7, 111_000)


def test_an_active_pid_is_announced_again_once_per_half_window() -> None:
    member = QuotaManager(POLICY)
    member.announce_refreshes = True
    assert isinstance(member.admit("User:alice", [7], 0), Admitted)
    announced_at = []
    for now_ms in range(1_000, 3 * WINDOW_MS, 1_000):  # produces every second for 3 windows
        decision = member.admit("User:alice", [7], now_ms)
        assert isinstance(decision, Admitted)
        if decision.announced_producer_ids:
            assert decision.announced_producer_ids == (7,)
            announced_at.append(now_ms)
    # One announcement per half window (30 s), each in a new half window.
    assert len(announced_at) == 5
    assert len({t // (WINDOW_MS // 2) for t in announced_at}) == 5


def test_without_a_fleet_nothing_is_announced() -> None:
    member = QuotaManager(POLICY)
    member.admit("User:alice", [7], 0)
    decisions = [member.admit("User:alice", [7], t) for t in range(1_000, 2 * WINDOW_MS, 1_000)]
    assert all(isinstance(d, Admitted) and not d.announced_producer_ids for d in decisions)
