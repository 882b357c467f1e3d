"""Layered Bloom filter: rolling, expiry (no false negatives inside the window), refresh."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota.bloom import BloomShape, bloom_positions
from pidgate.quota.layered import ABSENT, IN_CURRENT, IN_OLDER, LayeredBloomFilter

SHAPE = BloomShape.for_capacity(1000, 0.001)
W = 10_000  # window_ms
N = 10  # window_num → a layer is current for 1000 ms


def pos(pid: int, shape: BloomShape = SHAPE) -> tuple[int, ...]:
    return bloom_positions(pid, shape)


def test_empty() -> None:
    f = LayeredBloomFilter(SHAPE, W, N)
    assert f.is_empty
    assert f.layer_count == 0
    assert f.total_bits == 0
    assert not f.contains(pos(1), 0)
    assert f.estimated_false_positive_rate() == 0.0


def test_new_layer_every_window_over_num() -> None:
    f = LayeredBloomFilter(SHAPE, W, N)
    f.add(pos(1), 0)
    f.add(pos(2), 999)
    assert f.layer_count == 1
    f.add(pos(3), 1000)
    assert f.layer_count == 2
    assert f.total_bits == 2 * SHAPE.bit_count
    # Layers start lazily at the write's time, not on a fixed grid.
    f.add(pos(4), 5500)
    f.add(pos(5), 6499)
    assert f.layer_count == 3
    assert all(f.contains(pos(p), 6499) for p in range(1, 6))


def test_saturation_rolls_early() -> None:
    small = BloomShape.for_capacity(2, 0.01)
    f = LayeredBloomFilter(small, W, N)
    for pid in range(5):
        f.add(pos(pid, small), 0)
    assert f.layer_count == 3  # 2 + 2 + 1
    assert all(f.contains(pos(p, small), 0) for p in range(5))


def test_expiry_is_keyed_on_last_write() -> None:
    f = LayeredBloomFilter(SHAPE, W, N)
    f.add(pos(1), 0)
    f.add(pos(2), 900)  # same layer, started at 0
    # start + window would drop PID 2 at 10_000, 900 ms early; we keep it until 10_900.
    assert f.contains(pos(2), 10_899)
    assert f.contains(pos(1), 10_899)  # same bits, same layer: found as long as the layer lives
    assert f.expire(10_899) == 0
    assert not f.contains(pos(2), 10_900)
    assert f.layer_count == 1  # lookups ignore dead layers even before expire()
    assert f.expire(10_900) == 1
    assert f.is_empty


def test_lookup_and_refresh() -> None:
    f = LayeredBloomFilter(SHAPE, W, N)
    f.add(pos(7), 0)
    assert f.lookup(pos(7), 500) == IN_CURRENT
    assert f.lookup(pos(8), 500) == ABSENT
    assert not f.refresh(pos(7), 500)  # in the current layer: touched, not re-added
    assert f.layer_count == 1
    assert f.contains(pos(7), 10_499)  # the touch at 500 keeps it a window past 500
    assert not f.contains(pos(7), 10_500)

    f = LayeredBloomFilter(SHAPE, W, N)
    f.add(pos(7), 0)
    assert f.lookup(pos(7), 1000) == IN_OLDER  # the layer is no longer current
    assert f.refresh(pos(7), 1000)
    assert f.layer_count == 2
    assert f.lookup(pos(7), 1500) == IN_CURRENT
    assert f.contains(pos(7), 10_999)


def test_touch_only_current_layer() -> None:
    f = LayeredBloomFilter(SHAPE, W, N)
    f.touch(0)  # no layers: no-op
    f.add(pos(1), 0)
    f.touch(999)
    assert f.contains(pos(1), 10_998)
    f.touch(5000)  # not current any more: ignored
    assert not f.contains(pos(1), 10_999)


def test_reconfigure_and_validation() -> None:
    with pytest.raises(ValueError):
        LayeredBloomFilter(SHAPE, 5, 10)
    with pytest.raises(ValueError):
        LayeredBloomFilter(SHAPE, 10, 0)
    f = LayeredBloomFilter(SHAPE, W, N)
    f.add(pos(1), 0)
    f.reconfigure(2 * W, 2)
    assert f.contains(pos(1), 2 * W - 1)
    with pytest.raises(ValueError):
        f.reconfigure(1, 2)


def test_estimated_false_positive_rate_combines_layers() -> None:
    f = LayeredBloomFilter(BloomShape.for_capacity(10, 0.1), W, N)
    for pid in range(10):
        f.add(pos(pid, f.shape), 0)
    one = f.estimated_false_positive_rate()
    for pid in range(10, 20):
        f.add(pos(pid, f.shape), 1000)
    assert f.layer_count == 2
    assert f.estimated_false_positive_rate() > one
    assert 0.0 < f.estimated_false_positive_rate() < 1.0


# Events: (ms since previous event, op, pid). op: 0 add, 1 refresh, 2 expire.
EVENTS = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 2), st.integers(0, 30)),
    min_size=1,
    max_size=120,
)


@settings(deadline=None, max_examples=150)
@given(
    events=EVENTS,
    window_ms=st.integers(1, 1000),
    window_num=st.integers(1, 12),
    capacity=st.integers(1, 8),
)
def test_no_false_negatives_inside_window(
    events: list[tuple[int, int, int]], window_ms: int, window_num: int, capacity: int
) -> None:
    """Any PID added or refreshed at t is contained at every t' < t + window_ms (small
    capacities force saturation rolls; random expire() calls must not matter)."""
    window_num = min(window_num, window_ms)
    shape = BloomShape.for_capacity(capacity, 0.01)
    f = LayeredBloomFilter(shape, window_ms, window_num)
    last_written: dict[int, int] = {}
    write_times: list[int] = []
    now = 0
    for delta, op, pid in events:
        now += delta
        if op == 0:
            f.add(pos(pid, shape), now)
            last_written[pid] = now
            write_times.append(now)
        elif op == 1:
            f.refresh(pos(pid, shape), now)
            last_written[pid] = now
            write_times.append(now)
        else:
            f.expire(now)
        for seen, t in last_written.items():
            if now < t + window_ms:
                assert f.contains(pos(seen, shape), now), (seen, t, now)
    # Bounded memory: live layers after the oldest all started inside the last window; each
    # was rolled by time (at most window_num of those) or by saturation (capacity writes each).
    f.expire(now)
    recent_writes = sum(1 for t in write_times if t > now - window_ms)
    assert f.layer_count <= recent_writes // capacity + window_num + 2


@settings(deadline=None, max_examples=100)
@given(
    gaps=st.lists(st.integers(1, 999), min_size=1, max_size=60),
    window_num=st.integers(1, 12),
    noise=st.lists(st.integers(0, 10_000), max_size=60),
)
def test_all_pids_forgotten_one_span_after_last_write(
    gaps: list[int], window_num: int, noise: list[int]
) -> None:
    window_ms = 1000
    f = LayeredBloomFilter(BloomShape.for_capacity(4, 0.01), window_ms, window_num)
    now = 0
    for i, gap in enumerate(gaps):
        now += gap
        f.add(pos(noise[i] if i < len(noise) else i, f.shape), now)
    # Every layer's last write is <= now, so all are dead at now + window_ms.
    assert f.expire(now + window_ms) >= 1
    assert f.is_empty


def test_estimated_false_positive_rate_full_filter() -> None:
    tiny = BloomShape(bit_count=1, hash_count=1, expected_items=1)
    f = LayeredBloomFilter(tiny, W, N)
    f.add((0,), 0)
    assert f.estimated_false_positive_rate() == 1.0
