"""Hypothesis properties of QuotaManager: no false negatives, active PIDs never new, the rate
bound over any arrival sequence, and the memory caps."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota.manager import Admitted, QuotaManager, QuotaPolicy, Rejected

W = 1000

# A request: (ms since the previous one, PIDs). Small PID space so PIDs repeat.
REQUESTS = st.lists(
    st.tuples(st.integers(0, 300), st.lists(st.integers(0, 40), max_size=4)),
    min_size=1,
    max_size=80,
)


def policy(rate: int, window_num: int) -> QuotaPolicy:
    return QuotaPolicy(
        window_ms=W,
        window_num=window_num,
        default_producer_ids_rate=rate,
        min_layer_items=3,  # tiny layers, so saturation rolls layers early too
        max_layer_items=3,
    )


@settings(deadline=None, max_examples=120)
@given(requests=REQUESTS, rate=st.integers(0, 6), window_num=st.integers(1, 11))
def test_admitted_pid_known_for_a_full_window(
    requests: list[tuple[int, list[int]]], rate: int, window_num: int
) -> None:
    """(1) Every PID of an admitted request is known at every t' < t + window_ms."""
    m = QuotaManager(policy(rate, window_num))
    admitted_at: dict[int, int] = {}
    now = 0
    for delta, pids in requests:
        now += delta
        if isinstance(m.admit("User:p", pids, now), Admitted):
            admitted_at.update(dict.fromkeys(pids, now))
        if delta % 3 == 0:
            m.expire(now)
        for pid, t in admitted_at.items():
            if now < t + W:
                assert m.is_known("User:p", pid, now), (pid, t, now)


@settings(deadline=None, max_examples=100)
@given(
    gaps=st.lists(st.integers(1, W - 1), min_size=1, max_size=40),
    churn=st.lists(st.lists(st.integers(1, 10**6), max_size=3), max_size=40),
    rate=st.integers(1, 5),
    window_num=st.integers(1, 11),
)
def test_active_pid_is_never_new(
    gaps: list[int], churn: list[list[int]], rate: int, window_num: int
) -> None:
    """(3) A PID that produces again less than window_ms after its previous admitted request is
    never new, whatever else the principal does (new PIDs, rejections, expiry) in between.
    (Stronger than "every window/window_num": a touch or re-add renews it for a full window.)"""
    m = QuotaManager(policy(rate, window_num))
    assert m.admit("User:p", [0], 0) == Admitted((0,), 0)
    now = 0
    for i, gap in enumerate(gaps):
        others = churn[i] if i < len(churn) else []
        m.admit("User:p", others, now + gap // 2)  # may be admitted or rejected
        m.expire(now + gap // 2)
        now += gap
        decision = m.admit("User:p", [0], now)
        assert isinstance(decision, Admitted)
        assert decision.new_producer_ids == ()


@settings(deadline=None, max_examples=120)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 400), st.lists(st.integers(0, 10**9), max_size=5)),
        min_size=1,
        max_size=80,
    ),
    rate=st.integers(0, 6),
    window_num=st.integers(1, 11),
    expire_every=st.integers(1, 10),
)
def test_rate_bound_over_any_arrivals(
    requests: list[tuple[int, list[int]]], rate: int, window_num: int, expire_every: int
) -> None:
    """(4) New PIDs admitted in any window-long interval ≤ 2·rate, and by time T ≤
    rate + rate·(T − t0)/window_ms (burst + continuous refill)."""
    m = QuotaManager(policy(rate, window_num))
    admissions: list[tuple[int, int]] = []  # (time, new PIDs)
    start = None
    now = 0
    for i, (delta, pids) in enumerate(requests):
        now += delta
        if start is None and pids:
            start = now
        decision = m.admit("User:p", pids, now)
        if isinstance(decision, Admitted) and decision.new_producer_ids:
            admissions.append((now, len(decision.new_producer_ids)))
        else:
            assert isinstance(decision, Rejected) or not decision.new_producer_ids
            if isinstance(decision, Rejected):
                assert decision.throttle_time_ms >= 1
        if i % expire_every == 0:
            m.expire(now)
        if start is not None:
            total = sum(n for _, n in admissions)
            assert total <= rate + Fraction(rate * (now - start), W)
    for a, _ in admissions:
        in_window = sum(n for t, n in admissions if a <= t < a + W)
        assert in_window <= 2 * rate


@settings(deadline=None, max_examples=120)
@given(
    requests=st.lists(
        st.tuples(
            st.integers(0, 300), st.integers(0, 8), st.lists(st.integers(0, 500), max_size=4)
        ),
        min_size=1,
        max_size=80,
    ),
    max_principals=st.integers(1, 4),
    max_layers=st.integers(1, 8),
    rate=st.integers(1, 20),
)
def test_memory_caps_hold(
    requests: list[tuple[int, int, list[int]]], max_principals: int, max_layers: int, rate: int
) -> None:
    """(5) total_bits ≤ max_total_bits and principal_count ≤ max_principals always, and
    total_bits is exactly the sum of every principal's layers."""
    bits_per_layer = 2 * 10  # layers of 2 items at p=0.01 → shape(20 bits, 7 hashes)
    p = QuotaPolicy(
        window_ms=W,
        window_num=4,
        false_positive_rate=0.01,
        default_producer_ids_rate=rate,
        min_layer_items=2,
        max_layer_items=2,
        max_principals=max_principals,
        max_total_bits=max_layers * bits_per_layer,
    )
    m = QuotaManager(p)
    now = 0
    evicted = 0
    for delta, who, pids in requests:
        now += delta
        m.admit(f"User:{who}", pids, now)
        assert m.principal_count <= max_principals
        assert m.total_bits <= p.max_total_bits
        assert m.total_bits == sum(s.bits for s in m.snapshot(now))
        assert m.evicted_principal_count >= evicted
        evicted = m.evicted_principal_count
    m.expire(now)
    assert m.total_bits == sum(s.bits for s in m.snapshot(now))


@settings(deadline=None, max_examples=150)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 400), st.integers(0, 2), st.lists(st.integers(0, 25), max_size=4)),
        min_size=1,
        max_size=120,
    ),
    rate=st.integers(0, 8),
    window_num=st.integers(1, 11),
    false_positive_rate=st.sampled_from([0.001, 0.3]),
)
def test_location_cache_never_changes_a_decision(
    requests: list[tuple[int, int, list[int]]],
    rate: int,
    window_num: int,
    false_positive_rate: float,
) -> None:
    """(6) The manager's location cache (where a PID was last found) is only a shortcut: a
    manager whose cache is emptied before every request decides exactly the same, and ends in
    the same state (tiny layers, at p = 0.3 too, so false positives and saturation rolls are
    frequent)."""
    p = replace(policy(rate, window_num), false_positive_rate=false_positive_rate)
    cached = QuotaManager(p)
    uncached = QuotaManager(p)
    now = 0
    for delta, who, pids in requests:
        now += delta
        uncached._positions_cache.clear()
        assert cached.admit(f"User:{who}", pids, now) == uncached.admit(f"User:{who}", pids, now)
        if delta % 5 == 0:
            cached.expire(now)
            uncached.expire(now)
    assert [r.layers for r in cached.export()] == [r.layers for r in uncached.export()]
