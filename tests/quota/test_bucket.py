"""Token bucket: exact refill, take and throttle arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota.bucket import TokenBucket


def test_starts_full_and_takes_exactly() -> None:
    bucket = TokenBucket.full(rate=3, window_ms=1000, now_ms=0)
    assert bucket.tokens(0) == 3.0
    after = bucket.try_take(3, 0)
    assert after is not None
    assert after.tokens(0) == 0.0
    assert after.try_take(1, 0) is None
    # 1 token = 1000 token·ms; refill 3 per ms → ceil(1000 / 3) = 334 ms.
    assert after.time_until_available_ms(1, 0) == 334
    assert after.try_take(1, 333) is None
    assert after.try_take(1, 334) is not None
    assert after.tokens(333) == pytest.approx(999 / 1000)
    assert after.time_until_available_ms(2, 100) == 567  # (2000 - 300) / 3, rounded up
    assert after.time_until_available_ms(0, 0) == 0


def test_refill_caps_at_capacity() -> None:
    bucket = TokenBucket.full(rate=5, window_ms=10_000, now_ms=0).try_take(5, 0)
    assert bucket is not None
    assert bucket.tokens(5000) == 2.5
    assert bucket.tokens(10_000) == 5.0
    assert bucket.tokens(10**9) == 5.0
    assert bucket.is_full(10_000)
    assert not bucket.is_full(9_999)


def test_time_backwards_refills_nothing() -> None:
    bucket = TokenBucket.full(rate=5, window_ms=10_000, now_ms=1000).try_take(5, 1000)
    assert bucket is not None
    assert bucket.refill(500) is bucket
    assert bucket.tokens(0) == 0.0
    assert bucket.try_take(1, 999) is None


def test_more_than_capacity_waits_for_full_bucket() -> None:
    bucket = TokenBucket.full(rate=4, window_ms=1000, now_ms=0)
    assert bucket.try_take(5, 0) is None
    assert bucket.time_until_available_ms(5, 0) == 0  # already full: waiting cannot help
    empty = bucket.try_take(4, 0)
    assert empty is not None
    assert empty.time_until_available_ms(50, 0) == 1000


def test_rate_zero_never_refills() -> None:
    bucket = TokenBucket.full(rate=0, window_ms=1000, now_ms=0)
    assert bucket.try_take(0, 0) is not None
    assert bucket.try_take(1, 10**9) is None
    assert bucket.time_until_available_ms(1, 0) == 1000
    assert bucket.is_full(0)


def test_with_rate_clamps_and_rescales() -> None:
    bucket = TokenBucket.full(rate=10, window_ms=1000, now_ms=0)
    lower = bucket.with_rate(2, 1000)
    assert lower.tokens(0) == 2.0  # clamped to the new capacity
    rescaled = lower.with_rate(2, 3000)
    assert rescaled.tokens(0) == 2.0  # the same tokens in the longer window
    assert rescaled.tokens(1500) == 2.0  # full: it refills no further
    half = TokenBucket.full(rate=10, window_ms=1000, now_ms=0).try_take(10, 0)
    assert half is not None
    settled = half.with_rate(1, 1000, now_ms=50)  # 0.5 tokens earned at the old rate
    assert settled.tokens(50) == 0.5


def test_a_raise_grants_the_capacity_it_adds_and_spent_tokens_stay_spent() -> None:
    """Issue "patience": a raised quota relieves waiting producers at once. What the principal
    spent in the window stays spent; the rest of the new quota is there now."""
    empty = TokenBucket.full(rate=2, window_ms=1000, now_ms=0).try_take(2, 0)
    assert empty is not None and empty.tokens(0) == 0.0
    raised = empty.with_rate(20, 1000, now_ms=0)
    assert raised.tokens(0) == 18.0  # 20 allowed, 2 spent
    assert raised.tokens(50) == 19.0  # and it refills at the new rate: 20 per 1000 ms
    full = TokenBucket.full(rate=2, window_ms=1000, now_ms=0).with_rate(20, 1000)
    assert full.tokens(0) == 20.0  # nothing spent: the whole new quota
    in_debt = TokenBucket.full(rate=2, window_ms=1000, now_ms=0).debit(5, 0)  # fleet overshoot
    assert in_debt.with_rate(4, 1000).tokens(0) == -1.0  # 5 spent of 4: still owes one


def test_validation() -> None:
    with pytest.raises(ValueError):
        TokenBucket.full(rate=-1, window_ms=1000, now_ms=0)
    with pytest.raises(ValueError):
        TokenBucket.full(rate=1, window_ms=0, now_ms=0)


@settings(deadline=None, max_examples=200)
@given(
    rate=st.integers(1, 1000),
    window_ms=st.integers(1, 100_000),
    taken=st.integers(0, 1000),
    need=st.integers(1, 1000),
    start=st.integers(0, 10**6),
)
def test_throttle_time_is_exact(
    rate: int, window_ms: int, taken: int, need: int, start: int
) -> None:
    bucket = TokenBucket.full(rate, window_ms, start).try_take(min(taken, rate), start)
    assert bucket is not None
    wait = bucket.time_until_available_ms(need, start)
    if need > rate:
        assert bucket.refill(start + wait).is_full(start + wait)
        if wait:
            assert not bucket.is_full(start + wait - 1)
    else:
        assert bucket.try_take(need, start + wait) is not None
        if wait:
            assert bucket.try_take(need, start + wait - 1) is None


def test_time_until_refilled_counts_tokens_beyond_the_capacity() -> None:
    """The n-th token from now, each taken as it comes: what a request waits behind others."""
    empty = TokenBucket.full(rate=1, window_ms=10_000, now_ms=0).try_take(1, 0)
    assert empty is not None
    assert empty.time_until_refilled_ms(1, 0) == 10_000
    assert empty.time_until_refilled_ms(3, 0) == 30_000  # beyond the capacity of 1
    assert empty.time_until_refilled_ms(3, 4_000) == 26_000
    assert empty.time_until_available_ms(3, 0) == 10_000  # the capped answer, for contrast
    assert TokenBucket.full(rate=2, window_ms=1000, now_ms=0).time_until_refilled_ms(2, 0) == 0
    assert TokenBucket.full(rate=0, window_ms=1000, now_ms=0).time_until_refilled_ms(1, 0) == 1000
