"""QuotaManager: the admission contract of DESIGN.md "Quota semantics", pinned exactly."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pidgate.quota.layer_plan import LayerPlan
from pidgate.quota.manager import Admitted, QuotaManager, QuotaPolicy, Rejected
from tests.steps import run_counting_steps

W = 10_000  # a short window, as in tests and the demo
ALICE = "User:alice"


def manager(rate: int | None = 5, **kwargs: Any) -> QuotaManager:
    """Window W in 10 layers (a layer is current for 1000 ms), default rate ``rate``."""
    policy = replace(QuotaPolicy(window_ms=W, window_num=10), **kwargs)
    return QuotaManager(replace(policy, default_producer_ids_rate=rate))


def test_burst_then_throttle_then_retry() -> None:
    m = manager(rate=5)
    for pid in range(5):
        assert m.admit(ALICE, [pid], 0) == Admitted((pid,), 0)
    # Empty bucket; 1 token refills in W / rate = 2000 ms.
    assert m.admit(ALICE, [5], 0) == Rejected(2000, (5,))
    assert m.admit(ALICE, [5], 1999) == Rejected(1, (5,))
    assert m.admit(ALICE, [5], 2000) == Admitted((5,), 0)
    assert m.admit(ALICE, [6], 2000) == Rejected(2000, (6,))


def test_burst_in_one_request_and_throttle_for_several_tokens() -> None:
    m = manager(rate=5)
    assert m.admit(ALICE, [1, 2, 3, 4, 5], 0) == Admitted((1, 2, 3, 4, 5), 0)
    assert m.admit(ALICE, [10, 11], 1000) == Rejected(3000, (10, 11))  # 0.5 held, 2 needed
    assert m.admit(ALICE, [10, 11], 4000) == Admitted((10, 11), 0)


def test_rejected_request_records_nothing() -> None:
    m = manager(rate=1)
    assert m.admit(ALICE, [1], 0) == Admitted((1,), 0)
    assert m.admit(ALICE, [2], 0) == Rejected(W, (2,))
    assert not m.is_known(ALICE, 2, 1)
    # Still unknown, still charged: rejection took no token, so the retry at W gets one.
    assert m.admit(ALICE, [2], W - 1) == Rejected(1, (2,))
    assert m.admit(ALICE, [2], W) == Admitted((2,), 0)


def test_all_known_admitted_with_empty_bucket() -> None:
    m = manager(rate=2)
    m.admit(ALICE, [1, 2], 0)
    assert m.admit(ALICE, [3], 0) == Rejected(W // 2, (3,))
    assert m.admit(ALICE, [1, 2, 1], 0) == Admitted((), 0)
    # In a later span their layer is still fresh (under half a window old): touched, free.
    assert m.admit(ALICE, [2, 1], 1500) == Admitted((), 0)
    # Half a window after it started, they are re-added to the newest layer, still free.
    assert m.admit(ALICE, [2, 1], W // 2) == Admitted((), 2)
    assert m.admit(ALICE, [1, 2], W // 2 + 100) == Admitted((), 0)


def test_mixed_known_and_unknown() -> None:
    m = manager(rate=2)
    m.admit(ALICE, [1], 0)
    assert m.admit(ALICE, [1, 2], 0) == Admitted((2,), 0)
    # Bucket empty: the whole request waits for the one token PID 3 needs.
    assert m.admit(ALICE, [1, 3, 2], 10) == Rejected(W // 2 - 10, (3,))
    # 1 and 2 live in a layer that is no longer current: re-added to the newest one.
    assert m.admit(ALICE, [1, 3, 2], W // 2) == Admitted((3,), 2)


def test_duplicates_cost_one_token() -> None:
    m = manager(rate=1)
    assert m.admit(ALICE, [7, 7, 7], 0) == Admitted((7,), 0)


def test_empty_request_always_admitted() -> None:
    m = manager(rate=0)
    assert m.admit(ALICE, [], 0) == Admitted((), 0)
    assert m.admit(ALICE, (), 0) == Admitted((), 0)


def test_unlimited_is_admitted_and_not_tracked() -> None:
    m = manager(rate=None)
    decision = m.admit(ALICE, range(10_000), 0)
    assert decision == Admitted((), 0, tracked=False)
    assert m.principal_count == 0
    assert m.total_bits == 0


def test_rate_zero_and_more_than_capacity() -> None:
    m = manager(rate=0)
    assert m.admit(ALICE, [1], 0) == Rejected(W, (1,))
    assert m.principal_count == 0
    m = manager(rate=3)
    # 4 > capacity: never passes; bucket already full, so the minimum throttle.
    assert m.admit(ALICE, [1, 2, 3, 4], 0) == Rejected(1, (1, 2, 3, 4))
    m.admit(ALICE, [1], 0)
    assert m.admit(ALICE, [5, 6, 7, 8], 0) == Rejected(W // 3 + 1, (5, 6, 7, 8))


def test_precedence_user_default_unlimited() -> None:
    policy = QuotaPolicy(
        window_ms=W,
        window_num=10,
        default_producer_ids_rate=2,
        user_producer_ids_rates={"alice": 1, "ANONYMOUS": 3},
    )
    m = QuotaManager(policy)
    assert isinstance(m.admit(ALICE, [1, 2], 0), Rejected)
    assert isinstance(m.admit("User:bob", [1, 2], 0), Admitted)
    assert isinstance(m.admit("User:bob", [3], 0), Rejected)
    assert isinstance(m.admit("User:ANONYMOUS", [1, 2, 3], 0), Admitted)
    unlimited = QuotaManager(replace(policy, default_producer_ids_rate=None))
    assert unlimited.admit("User:bob", [1, 2, 3], 0) == Admitted((), 0, tracked=False)


def test_update_policy_applies_to_next_new_pid() -> None:
    m = manager(rate=1)
    m.admit(ALICE, [1], 0)
    assert m.admit(ALICE, [2], 0) == Rejected(W, (2,))
    m.update_policy(replace(m.policy, default_producer_ids_rate=10))
    # The raise grants the 9 tokens it adds at once (1 of 10 spent), then refills at 10 per
    # window: one token every 1000 ms.
    assert m.admit(ALICE, list(range(2, 11)), 0) == Admitted(tuple(range(2, 11)), 0)
    assert m.admit(ALICE, [11], 0) == Rejected(1000, (11,))
    assert m.admit(ALICE, [11], 1000) == Admitted((11,), 0)
    assert m.snapshot(1000)[0].producer_ids_rate == 10


def test_update_policy_lower_rate_clamps_tokens() -> None:
    m = manager(rate=10)
    m.admit(ALICE, [1], 0)
    m.update_policy(replace(m.policy, default_producer_ids_rate=2))
    assert m.admit(ALICE, [2, 3], 0) == Admitted((2, 3), 0)
    assert isinstance(m.admit(ALICE, [4], 0), Rejected)
    assert m.is_known(ALICE, 1, 0)  # PIDs survive a rate change


def test_update_policy_unlimited_and_back() -> None:
    m = manager(rate=1)
    m.admit(ALICE, [1], 0)
    m.update_policy(replace(m.policy, default_producer_ids_rate=None))
    assert m.principal_count == 0
    assert m.admit(ALICE, [2, 3], 0) == Admitted((), 0, tracked=False)
    m.update_policy(replace(m.policy, default_producer_ids_rate=1))
    assert m.admit(ALICE, [4], 0) == Admitted((4,), 0)  # starts with a full bucket


def test_update_policy_with_now_settles_old_rate_first() -> None:
    m = manager(rate=10)
    m.admit(ALICE, list(range(10)), 0)
    m.update_policy(replace(m.policy, default_producer_ids_rate=1), now_ms=W // 2)
    assert m.snapshot(W // 2)[0].tokens == 1.0  # 5 earned at the old rate, clamped to 1


def test_pid_forgotten_after_window() -> None:
    m = manager(rate=1)
    m.admit(ALICE, [1], 0)
    assert m.is_known(ALICE, 1, W - 1)
    assert not m.is_known(ALICE, 1, W)
    assert m.expire(W) == 1  # no live layer and a full bucket
    assert m.principal_count == 0
    assert m.total_bits == 0
    assert m.admit(ALICE, [1], W) == Admitted((1,), 0)  # new again: costs a token


def test_expire_keeps_principal_until_bucket_full() -> None:
    m = manager(rate=2, window_num=1)
    m.admit(ALICE, [1], 0)
    m.admit(ALICE, [2], W - 1)
    assert m.expire(W) == 0
    assert m.principal_count == 1
    assert m.total_bits > 0
    assert m.expire(2 * W - 1) == 1


def test_active_pid_never_looks_new() -> None:
    m = manager(rate=2)
    assert m.admit(ALICE, [42], 0) == Admitted((42,), 0)
    other = 1000
    for step in range(1, 41):  # 20 windows, producing every window/2
        now = step * W // 2
        decision = m.admit(ALICE, [42], now)
        assert isinstance(decision, Admitted)
        assert decision.new_producer_ids == ()
        other += 1
        m.admit(ALICE, [other], now + 1)  # churn: new layers and spent tokens
        m.expire(now + 2)


def test_eviction_of_idlest_principal_counted() -> None:
    m = manager(rate=5, max_principals=2)
    m.admit("User:a", [1], 0)
    m.admit("User:b", [1], 1)
    m.admit("User:a", [1], 2)  # a is now the most recently active
    m.admit("User:c", [1], 3)
    assert m.principal_count == 2
    assert m.evicted_principal_count == 1
    assert [s.principal for s in m.snapshot(3)] == ["User:a", "User:c"]
    assert not m.is_known("User:b", 1, 3)  # evicted: its PIDs look new again
    assert m.admit("User:b", [1], 4) == Admitted((1,), 0)
    assert m.evicted_principal_count == 2  # a went, being idlest now


#: The smallest layer at p = 0.001 and 10 layers a window: each layer gets p·(3/4)/16 (see
#: pidgate.quota.layered), k = 14; min_layer_items (16) items in 384 bits would meet that by
#: fill but not by the duplicate-index floor n/m² (pidgate.quota.bloom.rate_of_shape): 640 bits.
SMALLEST = 640


def test_smallest_layer_size() -> None:
    assert LayerPlan(W, 10).shape_for(1).bit_count == SMALLEST


def test_eviction_by_total_bits() -> None:
    m = manager(rate=5, max_total_bits=3 * SMALLEST)  # three of the smallest layers
    for i, name in enumerate(["User:a", "User:b", "User:c"]):
        m.admit(name, [1], i)
    assert m.total_bits == 3 * SMALLEST
    assert m.evicted_principal_count == 0
    m.admit("User:a", [2], 2000)  # a rolls a second layer: b is idlest and goes
    assert m.evicted_principal_count == 1
    assert {s.principal for s in m.snapshot(2000)} == {"User:a", "User:c"}
    assert m.total_bits == 3 * SMALLEST


def test_snapshot() -> None:
    m = manager(rate=4)
    m.admit(ALICE, [1, 2], 0)
    (state,) = m.snapshot(W // 4)
    assert state.principal == ALICE
    assert state.producer_ids_rate == 4
    assert state.tokens == 3.0
    assert state.layer_count == 1
    assert state.bits == SMALLEST
    # 2 PIDs in 640 bits: the fill term is ~1e-20, the duplicate-index floor 2/640² ≈ 4.9e-6.
    assert state.estimated_false_positive_rate == pytest.approx(2 / 640**2, rel=1e-6)


def test_known_pid_renewed_even_when_request_rolls_a_layer() -> None:
    # Layers of 2 items: PIDs 1, 2 saturate the first layer at t=0. At t=500 that layer is
    # still current; a request [1, 3] finds 1 there and must renew it for a window from 500,
    # although adding 3 rolls a new layer (the touch has to happen before the roll).
    m = manager(rate=5, min_layer_items=2, max_layer_items=2)
    m.admit(ALICE, [1, 2], 0)
    assert m.admit(ALICE, [1, 3], 500) == Admitted((3,), 0)
    assert m.snapshot(500)[0].layer_count == 2
    assert m.is_known(ALICE, 1, W + 499)
    assert not m.is_known(ALICE, 1, W + 500)


def test_rejected_request_does_not_refresh_known_pids() -> None:
    m = manager(rate=1)
    m.admit(ALICE, [1], 0)
    # At 1500 PID 1's layer is no longer current; admitting [1, 2] would re-add 1, but the
    # request is rejected (0.15 tokens), so nothing may change.
    assert m.admit(ALICE, [1, 2], 1500) == Rejected(W - 1500, (2,))
    assert m.snapshot(1500)[0].layer_count == 1
    assert not m.is_known(ALICE, 1, W)


def test_location_cache_skips_a_pid_added_after_a_roll_in_its_request() -> None:
    """A PID added after a layer rolled within the same request may already be a false positive
    of the layer that rolled, which a scan finds first (it names the oldest fresh layer). So it
    must not be cached at the layer it was written to: both managers, one whose cache is emptied
    before each request, touch the same layers."""
    p = replace(
        QuotaPolicy(window_ms=W, window_num=10, default_producer_ids_rate=100),
        false_positive_rate=0.3,
        min_layer_items=3,
        max_layer_items=3,
    )
    one, three = QuotaManager(p), QuotaManager(p)
    one.admit(ALICE, [1], 0)
    three.admit(ALICE, [1, 2, 3], 0)
    # Absent from a layer holding 1, a false positive of one holding 1, 2 and 3.
    fp = next(
        pid
        for pid in range(100, 10_000)
        if three.is_known(ALICE, pid, 0) and not one.is_known(ALICE, pid, 0)
    )
    cached, uncached = QuotaManager(p), QuotaManager(p)
    for m in (cached, uncached):
        m.admit(ALICE, [1], 0)
        # 2 and 3 fill the layer, fp rolls a new one (and was already "in" the full one).
        assert m.admit(ALICE, [2, 3, fp], 10) == Admitted((2, 3, fp), 0)
        assert m.snapshot(10)[0].layer_count == 2
    uncached._positions_cache.clear()
    assert cached.admit(ALICE, [fp], 3000) == uncached.admit(ALICE, [fp], 3000)
    assert cached.export() == uncached.export()


def test_snapshot_in_steps_is_snapshot_cut_into_steps() -> None:
    m = manager(rate=5, max_principals=10)
    for i in range(10):
        m.admit(f"User:u{i}", [i], 0)
    steps = list(m.snapshot_in_steps(5, step_principals=4))
    assert [len(step) for step in steps] == [4, 4, 2]
    assert [s for step in steps for s in step] == list(m.snapshot(5))
    assert m.principal_names() == [f"User:u{i}" for i in range(10)]  # idlest first


def test_snapshot_in_steps_leaves_out_a_principal_evicted_before_its_step() -> None:
    m = manager(rate=5, max_principals=10)
    for i in range(10):
        m.admit(f"User:u{i}", [i], 0)
    steps = m.snapshot_in_steps(5, step_principals=5)
    first = next(steps)
    assert [s.principal for s in first] == [f"User:u{i}" for i in range(5)]
    for i in range(5):  # u0..u4 active again: u5 becomes the idlest
        m.admit(f"User:u{i}", [i], 6)
    m.admit("User:late", [99], 6)  # the 11th principal evicts u5
    (second,) = list(steps)
    # u5 is left out; "late" came after the snapshot began and waits for the next one.
    assert [s.principal for s in second] == [f"User:u{i}" for i in range(6, 10)]
    assert m.evicted_principal_count == 1


def test_snapshot_in_steps_needs_a_step_of_one_or_more() -> None:
    with pytest.raises(ValueError, match="step_principals must be >= 1"):
        next(manager().snapshot_in_steps(0, step_principals=0))


def _history(m: QuotaManager) -> None:
    """Principals of every kind for a cleanup at 25 s: idle a window long with a full bucket
    (forgotten), recent with tokens spent, and active."""
    for i in range(30):
        m.admit(f"User:idle{i}", [i], 0)
    for i in range(5):
        m.admit(f"User:spent{i}", list(range(100 * i, 100 * i + 5)), 20_000)
    for i in range(7):
        m.admit(f"User:active{i}", [5_000 + i], 25_000)


def test_expire_in_steps_forgets_and_frees_what_expire_does() -> None:
    one_go, stepped = manager(rate=5), manager(rate=5)
    _history(one_go)
    _history(stepped)
    forgotten = one_go.expire(25_000)
    assert forgotten == 30
    assert run_counting_steps(stepped.expire_in_steps(25_000, step_principals=8)) == (forgotten, 6)
    assert stepped.principal_names() == one_go.principal_names()
    assert stepped.snapshot(25_000) == one_go.snapshot(25_000)
    assert stepped.total_bits == one_go.total_bits == sum(s.bits for s in one_go.snapshot(25_000))


def test_expire_in_steps_skips_a_principal_gone_before_its_step() -> None:
    m = manager(rate=5, max_principals=42)
    _history(m)
    steps = m.expire_in_steps(25_000, step_principals=10)
    next(steps)  # idle0..idle9 forgotten: 32 principals left
    for i in range(11):  # 43 principals: the idlest, idle10, is evicted before its step
        m.admit(f"User:late{i}", [7_000 + i], 25_000)
    m.admit("User:idle10", [10], 25_000)  # back as a new state: idle11 is evicted in turn
    assert m.evicted_principal_count == 2
    forgotten, _ = run_counting_steps(steps)
    assert forgotten == 10 + 18  # idle12..idle29 too; idle10 is active again, idle11 is gone
    names = m.principal_names()
    assert "User:idle10" in names and "User:idle11" not in names and "User:idle12" not in names
    assert m.total_bits == sum(s.bits for s in m.snapshot(25_000))
