"""The false-positive rate a never-seen PID meets across *all* live layers (issue #21 item 4).

A new PID is tested against every live layer of its principal (pidgate.quota.layered), so what
it meets is the union of the layers' rates. These tests fill a principal's filter the way a
storm and steady producers do, look up >= 100k PIDs it never saw and check, with binomial
bounds, that (1) the rate stays within the configured p = 0.001 and (2) the estimate pidgate
exports (``estimated_false_positive_rate``, the metrics' source) agrees with what the lookups
observe. Pure, seeded, socket-free.
"""

from __future__ import annotations

import math
import random

from pidgate.quota.bloom import rate_at_capacity
from pidgate.quota.layer_plan import LayerPlan
from pidgate.quota.layered import LayeredBloomFilter
from pidgate.quota.manager import Admitted, QuotaManager, QuotaPolicy

P = 0.001
W = 3_600_000  # KIP-936's defaults: a 1 h window in 11 layers
N = 11
LOOKUPS = 150_000
#: Bounds at 4 standard deviations: with fixed seeds the outcome is deterministic anyway; the
#: width says how far apart two rates may be before the test calls them different.
Z = 4.0


def binomial_interval(rate: float, trials: int) -> tuple[float, float]:
    """Hits expected from ``trials`` lookups at ``rate``: mean ± Z·sd (normal approximation,
    widened by one hit for the small counts at these rates)."""
    mean = rate * trials
    spread = Z * math.sqrt(trials * rate * (1 - rate)) + 1
    return mean - spread, mean + spread


def never_seen(rng: random.Random) -> int:
    # Bit 62 set: disjoint from every PID the fills below use (all < 2**62).
    return rng.getrandbits(62) | (1 << 62)


def test_storm_and_steady_producers_meet_the_configured_rate_and_the_estimate() -> None:
    """A principal with a quota of 3000 new PIDs an hour (50/min), 300 steady producers
    sending every 30 s and a storm of 5 new PIDs a second for 1.4 windows: the bucket's burst
    and the refill fill the layers (early rolls included), the steady PIDs are refreshed."""
    rng = random.Random(20261126)
    policy = QuotaPolicy(window_ms=W, window_num=N, default_producer_ids_rate=3000)
    manager = QuotaManager(policy)
    principal = "User:storm"
    now = 1_700_000_000_000
    steady = [rng.getrandbits(61) for _ in range(300)]
    manager.admit(principal, steady, now)
    admitted = 0
    end = now + W * 14 // 10
    while now < end:
        now += 1000
        for _ in range(5):
            admitted += isinstance(manager.admit(principal, [rng.getrandbits(61)], now), Admitted)
        if now // 1000 % 30 == 0:
            for pid in steady:
                manager.admit(principal, [pid], now)
    (state,) = manager.snapshot(now)
    assert admitted > 5000  # the storm really filled the filter: burst plus 1.4 h of refill
    assert state.layer_count >= 12  # several layers live, all of them consulted
    assert all(manager.is_known(principal, pid, now) for pid in steady)

    hits = sum(manager.is_known(principal, never_seen(rng), now) for _ in range(LOOKUPS))
    observed = hits / LOOKUPS
    estimate = state.estimated_false_positive_rate
    # (1) Within the configured rate: the hits are not more than p allows.
    assert hits <= binomial_interval(P, LOOKUPS)[1], (observed, estimate)
    # (2) The exported estimate agrees with what the lookups met.
    low, high = binomial_interval(estimate, LOOKUPS)
    assert low <= hits <= high, (observed, estimate)


def fill_worst_case(seed: int) -> tuple[LayeredBloomFilter, int, int]:
    """Every chain of layers a filter can keep alive at once, each head full to its capacity
    and followed by an early roll half full: the most a principal's layers can hold. One
    write burst per span (a new head); every layer touched as late as it may be (at the end
    of its fresh half window), so it lives as long as the rules allow. Returns the filter,
    the time it is read at and how many PIDs it took."""
    plan = LayerPlan(W, N, P)
    f = LayeredBloomFilter(plan)
    rng = random.Random(seed)
    span = -(-W // N)
    start = 1_700_000_000_000
    now = start
    added = 0
    serials: list[tuple[int, int]] = []  # (serial, start) of every layer
    end = start + W + plan.fresh_horizon_ms
    while now <= end:
        # Renew every layer still fresh: the latest touch it can get before the next burst.
        for serial, _ in serials:
            f.touch(serial, now - 1)
        head = f.add(f.positions(rng.getrandbits(61)), now, pending=600)
        serials.append((head, now))
        added += 1
        capacity = f.export_layers()[-1].shape.expected_items
        while f.newest_serial == head:
            f.add(f.positions(rng.getrandbits(61)), now)
            added += 1
        early = f.newest_serial
        serials.append((early, now))
        for _ in range(capacity):  # the early roll (twice the capacity) half full
            f.add(f.positions(rng.getrandbits(61)), now)
            added += 1
        assert f.newest_serial == early
        now += span
    return f, now - span + 1, added


def test_worst_case_stays_within_the_configured_rate() -> None:
    f, now, added = fill_worst_case(seed=7)
    plan = f.plan
    live = [layer for layer in f.export_layers() if layer.last_write_ms + W > now]
    heads = [layer for layer in live if layer.inserted_count >= layer.shape.expected_items]
    # Every chain the rules allow is alive with its head full: the bound is reached.
    assert len(heads) >= plan.max_live_chains - 2
    # What the shapes promise: each full head at most r₀, so the union stays below p.
    assert all(rate_at_capacity(layer.shape) <= plan.layer_rate for layer in heads)
    estimate = f.estimated_false_positive_rate(now)
    assert estimate <= P

    rng = random.Random(11)
    hits = sum(f.contains(never_seen(rng), now) for _ in range(LOOKUPS))
    low, high = binomial_interval(estimate, LOOKUPS)
    assert low <= hits <= high, (hits / LOOKUPS, estimate)
    assert hits <= binomial_interval(P, LOOKUPS)[1]
    # The budget is used, not wasted: the worst case comes close to p (within a binomial
    # bound of the configured rate, from below).
    assert hits >= binomial_interval(P * 0.6, LOOKUPS)[0], (hits / LOOKUPS, added)


def test_early_rolls_take_shrinking_shares_and_a_new_span_starts_over() -> None:
    """A burst within one span rolls layer after layer; each early roll is built for a quarter
    of the previous one's rate (down to r₀/256), so the whole chain stays under (4/3)·r₀ plus
    r₀/256 per roll past the fourth; the next span's layer is built for r₀ again."""
    plan = LayerPlan(W, N, P)
    f = LayeredBloomFilter(plan)
    rng = random.Random(3)
    now = 1_700_000_000_000
    while len(f.export_layers()) < 7:
        f.add(f.positions(rng.getrandbits(61)), now)
    full = f.export_layers()[:-1]  # the newest is the one being filled
    rates = [rate_at_capacity(layer.shape) for layer in full]
    r0 = plan.layer_rate
    for depth, rate in enumerate(rates):
        target = r0 / 4 ** min(depth, 4)
        assert target / 2 < rate <= target, (depth, rate, target)
    assert sum(rates) <= r0 * 4 / 3 + r0 / 256
    # Every layer's shape shares k, so one hash of a PID serves the whole chain.
    assert {layer.shape.hash_count for layer in full} == {plan.hash_count}
    later = now + -(-W // N)
    f.add(f.positions(rng.getrandbits(61)), later)
    head = f.export_layers()[-1]
    assert head.start_ms == later
    assert r0 / 2 < rate_at_capacity(head.shape) <= r0
