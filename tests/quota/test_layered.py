"""Layered Bloom filter: rolling, sizing, the refresh rule (touch while fresh, re-add after half
a window), expiry anywhere, and the two bounds of pidgate.quota.layered's docstring: no false
negatives inside the window, and forgotten within window + H after the last sighting."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota.bloom import BloomFilter, BloomShape, bloom_positions
from pidgate.quota.layer_plan import LayerPlan
from pidgate.quota.layered import ABSENT, STALE, LayeredBloomFilter, LayerState

W = 10_000  # window_ms
N = 10  # window_num → a layer is current for 1000 ms, fresh for 5000 ms
H = (W - 1) // 2  # the fresh horizon: 4999 ms


def plan(**changes: int | float) -> LayerPlan:
    fields: dict[str, int | float] = {"window_ms": W, "window_num": N, **changes}
    return LayerPlan(**fields)  # type: ignore[arg-type]


def see(f: LayeredBloomFilter, pid: int, now: int) -> int:
    """What the manager does when a PID is seen: touch its oldest fresh layer, else add it.
    Returns find()'s answer before the update."""
    positions = f.positions(pid)
    where = f.find(pid, positions, now)
    if where >= 0:
        assert f.touch(where, now)
    else:
        f.add(positions, now)
    return where


def live_starts(f: LayeredBloomFilter, now: int) -> list[int]:
    return [s.start_ms for s in f.export_layers() if s.last_write_ms + W > now]


def test_empty() -> None:
    f = LayeredBloomFilter(plan())
    assert f.is_empty
    assert f.layer_count == 0
    assert f.total_bits == 0
    assert not f.contains(1, 0)
    assert f.find(1, f.positions(1), 0) == ABSENT
    assert f.estimated_false_positive_rate() == 0.0
    assert f.expire(10**9) == 0
    assert not f.touch(0, 0)


def test_new_layer_every_span_lazily() -> None:
    f = LayeredBloomFilter(plan())
    f.add(f.positions(1), 0)
    f.add(f.positions(2), 999)
    assert f.layer_count == 1
    f.add(f.positions(3), 1000)
    assert f.layer_count == 2
    # Layers start at the write's time, not on a fixed grid; quiet spans make none.
    f.add(f.positions(4), 5500)
    f.add(f.positions(5), 6499)
    assert f.layer_count == 3
    assert [s.start_ms for s in f.export_layers()] == [0, 1000, 5500]
    assert all(f.contains(p, 6499) for p in range(1, 6))


def test_refresh_rule_touches_while_fresh_then_re_adds() -> None:
    f = LayeredBloomFilter(plan())
    assert see(f, 7, 0) == ABSENT
    # Fresh (under half a window old): found in layer 0 and touched, even from a later span.
    assert see(f, 7, 3000) == 0
    assert f.layer_count == 1
    assert f.export_layers()[0].last_write_ms == 3000
    # Half a window after its start layer 0 is no longer fresh: the PID is re-added.
    assert see(f, 7, W // 2) == STALE
    assert f.layer_count == 2
    assert see(f, 7, W // 2 + 1) == 1  # the new layer holds it now
    # The first layer was renewed by the touch at 3000, not by later sightings.
    assert f.export_layers()[0].last_write_ms == 3000


def test_oldest_fresh_layer_is_the_one_found() -> None:
    f = LayeredBloomFilter(plan())
    f.add(f.positions(7), 0)
    f.add(f.positions(7), 2000)  # a second copy in a newer layer (the manager never does this)
    assert f.find(7, f.positions(7), 2500) == 0
    # Once layer 0 is not fresh, layer 1 is the oldest fresh one.
    assert f.find(7, f.positions(7), 5000) == 1
    assert f.find(7, f.positions(7), 7000) == STALE


def test_touch_renews_an_older_layer_and_dead_layers_go_wherever_they_are() -> None:
    f = LayeredBloomFilter(plan())
    f.add(f.positions(1), 0)  # layer 0
    f.add(f.positions(2), 1000)  # layer 1
    f.add(f.positions(3), 2000)  # layer 2
    assert f.touch(0, 4000)  # layer 0 renewed: now the middle layer dies first
    assert not f.touch(1, 6000)  # no longer fresh: touch refused
    assert f.contains(2, W + 999)
    assert not f.contains(2, W + 1000)  # layer 1 dead, though layer 0 before it is alive
    assert f.contains(1, W + 3999)
    assert f.expire(W + 1000) == 1
    assert f.layer_count == 2
    assert [s.start_ms for s in f.export_layers()] == [0, 2000]
    # Serials keep naming the same layers after a middle layer went.
    assert f.find(3, f.positions(3), W + 1000) == STALE
    assert f.expire(W + 2000) == 1
    assert f.expire(W + 4000) == 1
    assert f.is_empty
    assert f.total_bits == 0


def test_expiry_is_keyed_on_last_write() -> None:
    f = LayeredBloomFilter(plan())
    f.add(f.positions(1), 0)
    f.add(f.positions(2), 900)  # same layer, started at 0
    assert f.contains(2, W + 899)
    assert f.expire(W + 899) == 0
    assert not f.contains(2, W + 900)
    assert f.layer_count == 1  # lookups ignore dead layers even before expire()
    assert f.expire(W + 900) == 1
    assert f.is_empty


def test_forget_bound_is_reached_when_another_pid_keeps_the_layer_fresh() -> None:
    """The bound W + H is tight: PID 1 is last seen at 0, PID 2 touches their shared layer at
    the last fresh moment (H), so PID 1 stays known until 0 + W + H - 1."""
    f = LayeredBloomFilter(plan())
    see(f, 1, 0)
    see(f, 2, 0)
    assert see(f, 2, H) == 0  # still fresh at H: touched
    assert see(f, 2, H + 1) == STALE  # not fresh any more: re-added, layer 0 not renewed
    assert f.contains(1, W + H - 1)
    assert not f.contains(1, W + H)


# -- sizing --------------------------------------------------------------------------------------


def steady(pids: int, windows: int, *, spread: bool, seed: int = 1) -> LayeredBloomFilter:
    """``pids`` PIDs of one principal, each seen once per span at a random phase for
    ``windows`` windows; each PID first appears at a random time of the first window
    (``spread``) or in the first span (a principal that starts all its producers at once)."""
    rng = random.Random(seed)
    span = W // N
    callers = sorted(
        (rng.randrange(span), pid, rng.randrange(W) if spread else 0) for pid in range(pids)
    )
    f = LayeredBloomFilter(plan())
    now = 0
    for step in range(windows * N):
        for phase, pid, joins in callers:
            now = step * span + phase
            if now >= joins:
                see(f, pid, now)
        f.expire(now)
    return f


@pytest.mark.parametrize("spread", [True, False])
def test_a_principal_with_100_active_pids_gets_small_layers(spread: bool) -> None:
    f = steady(100, windows=6, spread=spread)
    layers = f.export_layers()
    # Each PID is re-added about once per half window: spread out, ~20 per span; started
    # together, all 100 together every half window. Either way layers hold what was written,
    # not the 1000 items of the old fixed minimum (14 378 bits).
    assert max(s.shape.bit_count for s in layers) <= 3072
    assert max(s.shape.expected_items for s in layers) <= 150
    # ≈ 2-3 copies × 21 bits (each layer's share of p: see the layered module) × (headroom
    # and rounding) per PID.
    assert f.total_bits <= 100 * 120
    assert f.layer_count <= (16 if spread else 3)


@pytest.mark.parametrize("spread", [True, False])
def test_a_principal_with_10k_active_pids_gets_big_layers(spread: bool) -> None:
    f = steady(10_000, windows=3, spread=spread)
    assert max(s.shape.bit_count for s in f.export_layers()) >= 24_576
    assert f.total_bits <= 10_000 * 120


def test_a_burst_saturates_and_rolls_with_growing_layers() -> None:
    f = LayeredBloomFilter(plan())
    for pid in range(1000):
        f.add(f.positions(pid), 0)  # one at a time: no hint of the burst's size
    layers = f.export_layers()
    capacities = [s.shape.expected_items for s in layers]
    # Each layer rolled on saturation, and the next is at least twice as big.
    assert all(s.inserted_count <= s.shape.expected_items for s in layers)
    assert all(b >= 2 * a for a, b in itertools.pairwise(capacities))
    assert len(layers) <= 8  # O(log n) rolls
    assert all(f.contains(pid, 0) for pid in range(1000))
    # Every layer stays within the target rate: (set bits / m)^k <= p when full.
    assert f.estimated_false_positive_rate() < 8 * 0.001
    # With a hint (a request carrying the whole burst) one layer holds it all.
    g = LayeredBloomFilter(plan())
    for i, pid in enumerate(range(1000)):
        g.add(g.positions(pid), 0, pending=1000 - i)
    assert g.layer_count == 1
    assert g.export_layers()[0].shape.expected_items >= 1000


def test_sizes_respect_the_plan_bounds() -> None:
    f = LayeredBloomFilter(plan(min_layer_items=100, max_layer_items=200))
    f.add(f.positions(1), 0)
    assert f.export_layers()[0].shape.expected_items >= 100
    for pid in range(2, 1000):
        f.add(f.positions(pid), 0)
    assert all(s.shape.expected_items <= 200 for s in f.export_layers())
    with pytest.raises(ValueError):
        LayerPlan(window_ms=W, window_num=N, min_layer_items=0)
    with pytest.raises(ValueError):
        LayerPlan(window_ms=W, window_num=N, min_layer_items=10, max_layer_items=5)
    with pytest.raises(ValueError):
        LayerPlan(window_ms=5, window_num=10)
    with pytest.raises(ValueError):
        LayerPlan(window_ms=10, window_num=0)


def test_reconfigure_changes_window_and_freshness() -> None:
    f = LayeredBloomFilter(plan())
    f.add(f.positions(1), 0)
    uid = f.uid
    f.reconfigure(plan(window_ms=2 * W, window_num=2))
    assert f.uid != uid  # cached locations are void: freshness changed
    assert f.contains(1, 2 * W - 1)
    assert f.find(1, f.positions(1), W - 1) == 0  # fresh for W now


def test_layers_of_another_shape_are_read_never_written() -> None:
    old = BloomShape.for_capacity(1000, 0.001)  # what format 2 saved: not a power of two
    f = LayeredBloomFilter(plan())
    legacy = BloomFilter(old)
    legacy.add(bloom_positions(42, old))
    f.restore([LayerState(old, 0, 0, 1, legacy.to_bytes())])
    assert f.find(42, f.positions(42), 100) == 0
    assert not f.contains(43, 100)
    f.add(f.positions(43), 100)  # the old layer is current, but a new layer takes the write
    new = plan().shape_for(1)
    assert [s.shape for s in f.export_layers()] == [old, new]


def test_estimated_false_positive_rate_combines_layers() -> None:
    f = LayeredBloomFilter(plan(false_positive_rate=0.1, min_layer_items=10, max_layer_items=10))
    for pid in range(10):
        f.add(f.positions(pid), 0)
    one = f.estimated_false_positive_rate()
    for pid in range(10, 20):
        f.add(f.positions(pid), 1000)
    assert f.layer_count == 2
    assert f.estimated_false_positive_rate() > one
    assert 0.0 < f.estimated_false_positive_rate() < 1.0


def test_estimated_false_positive_rate_full_filter() -> None:
    f = LayeredBloomFilter(plan())
    shape = BloomShape(bit_count=8, hash_count=1, expected_items=1)
    f.restore([LayerState(shape, 0, 0, 1, b"\xff")])
    assert f.estimated_false_positive_rate() == 1.0


# -- the two bounds, with random timings over many windows ------------------------------------

# Events: (ms since previous event, op, pid). op 0-2: the PID is seen; 3: expire().
EVENTS = st.lists(
    st.tuples(st.integers(0, 700), st.integers(0, 3), st.integers(0, 30)),
    min_size=1,
    max_size=250,
)


@settings(deadline=None, max_examples=200)
@given(
    events=EVENTS,
    window_ms=st.integers(1, 2000),
    window_num=st.integers(1, 12),
    capacity=st.integers(1, 8),
)
def test_no_false_negatives_inside_window_and_forgotten_within_w_plus_h(
    events: list[tuple[int, int, int]], window_ms: int, window_num: int, capacity: int
) -> None:
    """Any PID seen at t is found at every t' < t + W; no live layer that started at or before
    a PID's last sighting survives t_last + W + H (so only a false positive can find it then).
    Tiny capacities force saturation rolls; random expire() calls must not matter; events span
    up to ~100 windows of simulated time."""
    window_num = min(window_num, window_ms)
    p = LayerPlan(
        window_ms=window_ms,
        window_num=window_num,
        false_positive_rate=0.01,
        min_layer_items=capacity,
        max_layer_items=capacity,
    )
    horizon = p.fresh_horizon_ms
    f = LayeredBloomFilter(p)
    last_seen: dict[int, int] = {}
    now = 0
    for delta, op, pid in events:
        now += delta
        if op < 3:
            positions = f.positions(pid)
            where = f.find(pid, positions, now)
            if where >= 0:
                assert f.touch(where, now)
            else:
                f.add(positions, now)
            last_seen[pid] = now
        else:
            f.expire(now)
        for seen, t in last_seen.items():
            if now < t + window_ms:
                assert f.contains(seen, now), (seen, t, now)
        # Forget bound, structurally: every live layer started after the last sighting of any
        # PID whose bound has passed (layers it could be in started at or before then).
        for state in f.export_layers():
            if state.last_write_ms + window_ms > now:
                assert state.last_write_ms - state.start_ms <= horizon
        oldest_live = min(
            (s.start_ms for s in f.export_layers() if s.last_write_ms + window_ms > now),
            default=None,
        )
        for t in last_seen.values():
            if now >= t + window_ms + horizon and oldest_live is not None:
                assert oldest_live > t
    # Memory: live layers all started within the last W + H; time rolls start at most one per
    # span, saturation rolls one per `capacity` writes.
    f.expire(now)
    assert all(s.start_ms > now - window_ms - horizon - 1 for s in f.export_layers())


@settings(deadline=None, max_examples=100)
@given(
    gaps=st.lists(st.integers(1, 999), min_size=1, max_size=60),
    window_num=st.integers(1, 12),
)
def test_all_layers_gone_w_plus_h_after_the_last_sighting(gaps: list[int], window_num: int) -> None:
    window_ms = 1000
    p = LayerPlan(window_ms=window_ms, window_num=window_num, min_layer_items=4)
    f = LayeredBloomFilter(p)
    now = 0
    for i, gap in enumerate(gaps):
        now += gap
        see(f, i % 7, now)
    assert f.expire(now + window_ms + p.fresh_horizon_ms) >= 1
    assert f.is_empty
