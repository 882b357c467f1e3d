"""The compiled Bloom arithmetic (``pidgate.quota._bloomspeed``, issue "native"): built by the
normal install, chosen unless ``PIDGATE_PURE_PYTHON`` says otherwise, and indistinguishable from
the pure functions it replaces.

The compiled module is imported directly, so the comparisons run on the pure path too: the
hash against ``mmh3`` itself, the positions against ``pure_universal_positions``, the layer scan
against ``LayeredBloomFilter.find_pure`` over filters grown with random timings, and the bit
writes against bitarray's own indexing. Inputs a caller could get wrong (a PID outside 64 bits,
too many hashes, rows that do not fit the bits) raise instead of reading out of bounds.
"""

from __future__ import annotations

import os
import sys
import types

import mmh3
import pytest
from bitarray import bitarray
from bitarray.util import urandom, zeros
from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota import bloom, compiled, layered
from pidgate.quota.bloom import UNIVERSAL_MODULUS, pure_universal_positions
from pidgate.quota.bucket import TokenBucket
from pidgate.quota.layer_plan import LayerPlan
from pidgate.quota.layered import LayeredBloomFilter
from pidgate.quota.manager import Admitted, QuotaManager, QuotaPolicy, Rejected
from pidgate.quota.principal_table import TrackedPrincipal

from ..compiled_modules import import_compiled, needs, printed_by_fresh_interpreter

COMPILED, NOT_BUILT = import_compiled("pidgate.quota._bloomspeed")
needs_compiled = needs(COMPILED, NOT_BUILT, "test_the_compiled_module_is_built_and_chosen")
INT64 = st.integers(-(2**63), 2**63 - 1)


def _choice(env_value: str | None) -> dict[str, object]:
    """What a fresh interpreter importing pidgate.quota chose."""
    code = """if True:
        import json
        from pidgate.quota import bloom, compiled
        module = compiled.bloomspeed
        print(json.dumps({
            "module": None if module is None else module.__name__,
            "positions_pure": bloom.universal_positions is bloom.pure_universal_positions,
        }))
    """
    return printed_by_fresh_interpreter(code, env_value)


def test_the_compiled_module_is_built_and_chosen() -> None:
    assert COMPILED is not None, NOT_BUILT
    assert _choice(None) == {"module": "pidgate.quota._bloomspeed", "positions_pure": False}


@pytest.mark.parametrize("value", ["1", "yes"])
def test_pidgate_pure_python_forces_the_pure_bloom_path(value: str) -> None:
    assert _choice(value) == {"module": None, "positions_pure": True}


def test_a_module_that_does_not_import_leaves_the_pure_path() -> None:
    """As after a failed compile (tests/deploy/test_native_build.py installs one)."""
    code = """if True:
        import json, sys
        sys.modules["pidgate.quota._bloomspeed"] = None  # import raises ImportError
        from pidgate.quota import bloom, compiled
        print(json.dumps({
            "module": compiled.bloomspeed,
            "positions_pure": bloom.universal_positions is bloom.pure_universal_positions,
        }))
    """
    assert printed_by_fresh_interpreter(code, None) == {"module": None, "positions_pure": True}


def test_a_module_built_from_older_source_leaves_the_pure_path() -> None:
    """A build that lacks a newer function (an in-place build left from an older checkout) is
    not used, rather than used for some functions and failing at import for the others."""
    code = """if True:
        import json, sys, types
        stale = types.ModuleType("pidgate.quota._bloomspeed")
        stale.universal_positions = stale.find = stale.set_positions = lambda *a: None
        sys.modules["pidgate.quota._bloomspeed"] = stale
        from pidgate.quota import compiled, manager
        print(json.dumps({
            "module": compiled.bloomspeed,
            "known_pure": manager.QuotaManager.admit_known
            is manager.QuotaManager.admit_known_pure,
        }))
    """
    assert printed_by_fresh_interpreter(code, None) == {"module": None, "known_pure": True}


def test_this_process_uses_the_chosen_path() -> None:
    forced = os.environ.get("PIDGATE_PURE_PYTHON", "") not in ("", "0")
    if forced or COMPILED is None:
        assert compiled.bloomspeed is None
        assert bloom.universal_positions is pure_universal_positions
    else:
        assert compiled.bloomspeed is COMPILED
        assert bloom.universal_positions is COMPILED.universal_positions


# --- the hash and the positions ---------------------------------------------------------------


@needs_compiled
@given(pid=INT64)
def test_the_hash_is_mmh3s(pid: int) -> None:
    assert COMPILED is not None
    key = pid.to_bytes(8, "big", signed=True)
    assert COMPILED.murmur3_pid(pid) == mmh3.mmh3_x64_128_utupledigest(key, 0)


@needs_compiled
@pytest.mark.parametrize("pid", [0, 1, -1, 2**63 - 1, -(2**63), 4242, 10**12])
@pytest.mark.parametrize("hash_count", [1, 2, 7, 14, 30, 64])
def test_positions_at_the_edges_equal_the_pure_ones(pid: int, hash_count: int) -> None:
    assert COMPILED is not None
    got = COMPILED.universal_positions(pid, hash_count)
    assert got == pure_universal_positions(pid, hash_count)
    assert all(0 <= p < UNIVERSAL_MODULUS for p in got)


@needs_compiled
@given(pid=INT64, hash_count=st.integers(1, 64))
def test_positions_equal_the_pure_ones(pid: int, hash_count: int) -> None:
    assert COMPILED is not None
    assert COMPILED.universal_positions(pid, hash_count) == pure_universal_positions(
        pid, hash_count
    )


@needs_compiled
@pytest.mark.parametrize("pid", [2**63, -(2**63) - 1, 2**100])
def test_a_pid_outside_64_bits_is_refused_as_the_pure_path_refuses_it(pid: int) -> None:
    assert COMPILED is not None
    with pytest.raises(OverflowError):
        pure_universal_positions(pid, 3)
    with pytest.raises(OverflowError):
        COMPILED.universal_positions(pid, 3)


@needs_compiled
@pytest.mark.parametrize("hash_count", [0, -1, 65])
def test_a_hash_count_outside_1_to_64_is_refused(hash_count: int) -> None:
    assert COMPILED is not None
    with pytest.raises(ValueError, match="hash_count"):
        COMPILED.universal_positions(7, hash_count)


# --- the scan of the layers ------------------------------------------------------------------

PLAN = LayerPlan(window_ms=60_000, window_num=6, false_positive_rate=0.01)
#: Small layers with many false positives (the scan's "held" branches), and N = 1 (a layer is
#: fresh the whole window: fresh_divisor 1).
PLANS = [PLAN, LayerPlan(window_ms=60_000, window_num=1, false_positive_rate=0.2)]


def _grown_filter(
    steps: list[tuple[int, int]], plan: LayerPlan = PLAN
) -> tuple[LayeredBloomFilter, int]:
    """A filter fed ``(pid, time step)`` sightings as the manager would (find, then touch or
    add), with expiry run as it goes; returns it and the last time."""
    seen = LayeredBloomFilter(plan)
    now_ms = 1_000_000
    for pid, step_ms in steps:
        now_ms += step_ms
        if now_ms >= seen.next_check_ms:
            seen.expire(now_ms)
        positions = seen.positions(pid)
        where = seen.find_pure(pid, positions, now_ms)
        if where >= 0:
            seen.touch(where, now_ms)
        else:
            seen.add(positions, now_ms)
    return seen, now_ms


SIGHTINGS = st.lists(
    st.tuples(st.integers(0, 400), st.sampled_from([0, 1, 50, 2_000, 9_000, 31_000, 70_000])),
    min_size=1,
    max_size=300,
)


@needs_compiled
@settings(max_examples=150, deadline=None)
@given(
    steps=SIGHTINGS,
    probes=st.lists(st.integers(-5, 500), max_size=40),
    later_ms=st.sampled_from([0, 1, 10_000, 30_000, 59_999, 90_000, 200_000]),
    plan=st.sampled_from(PLANS),
)
def test_the_scan_finds_what_the_pure_scan_finds(
    steps: list[tuple[int, int]], probes: list[int], later_ms: int, plan: LayerPlan
) -> None:
    assert COMPILED is not None
    seen, now_ms = _grown_filter(steps, plan)
    for pid in [p for p, _ in steps] + probes:
        positions = seen.positions(pid)
        for at_ms in (now_ms, now_ms + later_ms):
            got = COMPILED.find(
                seen._bits,
                seen._meta,
                seen._first,
                positions,
                at_ms,
                plan.window_ms,
                plan.fresh_divisor,
            )
            assert got == seen.find_pure(pid, positions, at_ms)
            assert seen.find(pid, positions, at_ms) == got


@needs_compiled
def test_the_scan_of_a_filter_with_no_layers_is_absent() -> None:
    assert COMPILED is not None
    seen = LayeredBloomFilter(PLAN)
    got = COMPILED.find(seen._bits, seen._meta, 0, seen.positions(5), 10, 60_000, 2)
    assert got == layered.ABSENT


@needs_compiled
def test_rows_that_do_not_fit_the_bits_are_refused_not_read() -> None:
    assert COMPILED is not None
    seen, now_ms = _grown_filter([(1, 0), (2, 1)])
    positions = seen.positions(1)
    meta = seen._meta[:]
    meta[4] = len(seen._bits) * 4  # a layer bigger than every bit held
    with pytest.raises(ValueError, match="exceed"):
        COMPILED.find(seen._bits, meta, 0, positions, now_ms, 60_000, 2)
    with pytest.raises(ValueError, match="whole rows"):
        COMPILED.find(seen._bits, meta[:5], 0, positions, now_ms, 60_000, 2)
    meta = seen._meta[:]
    meta[5] = len(positions) + 1  # more hashes than positions given
    with pytest.raises(ValueError, match="hashes"):
        COMPILED.find(seen._bits, meta, 0, positions, now_ms, 60_000, 2)


# --- the writes ------------------------------------------------------------------------------


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    pid=INT64,
    offset=st.integers(0, 300),
    bit_count=st.sampled_from([1, 3, 5, 7, 8, 64, 105, 1024, 3 * 2**10]),
    hash_count=st.integers(1, 20),
    tail=st.integers(0, 17),
)
def test_the_writes_set_the_bits_the_pure_loop_sets(
    pid: int, offset: int, bit_count: int, hash_count: int, tail: int
) -> None:
    assert COMPILED is not None
    positions = pure_universal_positions(pid, 20)
    start = urandom(offset + bit_count + tail, endian="big")
    expected = start.copy()
    for i in range(hash_count):
        expected[offset + positions[i] % bit_count] = 1
    got = start.copy()
    COMPILED.set_positions(got, offset, bit_count, hash_count, positions)
    assert got == expected


@needs_compiled
def test_writes_past_the_bits_are_refused_and_change_nothing() -> None:
    assert COMPILED is not None
    bits = zeros(64, endian="big")
    positions = pure_universal_positions(9, 4)
    with pytest.raises(IndexError):
        COMPILED.set_positions(bits, 10, 64, 4, positions)
    with pytest.raises(ValueError, match="hashes asked"):
        COMPILED.set_positions(bits, 0, 64, 5, positions)
    with pytest.raises(ValueError, match="0 bits"):
        COMPILED.set_positions(bits, 0, 0, 1, positions)
    assert not bits.any()


@needs_compiled
def test_a_bitarray_in_use_by_the_writes_is_not_left_locked() -> None:
    """The buffer is released on every return: the filter can still grow afterwards."""
    assert COMPILED is not None
    bits = bitarray(64, endian="big")
    bits.setall(0)
    COMPILED.set_positions(bits, 0, 64, 3, pure_universal_positions(1, 3))
    with pytest.raises(IndexError):
        COMPILED.set_positions(bits, 60, 64, 3, pure_universal_positions(1, 3))
    bits += zeros(64)
    assert len(bits) == 128


# -- the known-PID check and the one-PID miss path (QuotaManager.admit_known, admit_single) --


def _manager(
    check: str,
    window_num: int,
    fresh_divisor_plan: bool,
    *,
    max_principals: int = 100,
    cache_size: int = 4096,
) -> QuotaManager:
    """A manager whose ``admit`` asks the compiled (``check="compiled"``) or the pure
    known-PID check and one-PID shortcut first, whichever path this process runs."""
    manager = QuotaManager(
        QuotaPolicy(
            window_ms=1000,
            window_num=window_num if fresh_divisor_plan else 1,
            min_layer_items=3,  # tiny layers: saturation rolls layers early too
            max_layer_items=3,
            user_producer_ids_rates={"alice": 4, "bob": 4},  # anyone else: unlimited
            max_principals=max_principals,
            grandfather_grace_ms=200,
        )
    )
    manager.positions_cache_size = cache_size
    if check == "compiled":
        assert COMPILED is not None
        manager.admit_known = types.MethodType(COMPILED.admit_known, manager)  # type: ignore[method-assign]
        manager.admit_single = types.MethodType(COMPILED.admit_single, manager)  # type: ignore[method-assign]
    else:
        manager.admit_known = manager.admit_known_pure  # type: ignore[method-assign]
        manager.admit_single = manager.admit_single_pure  # type: ignore[method-assign]
    return manager


def _state(manager: QuotaManager, now_ms: int) -> object:
    """Everything a decision could have changed: each principal's layers, bucket and place in
    the recently-used order, and the location cache."""
    # Filters are numbered process-wide (``uid``): the cache is compared by whose filter.
    owners = {state.seen.uid: name for name, state in manager._principals.items()}
    locations = {
        pid: (owners.get(uid, "gone"), serial, cached_ms)
        for pid, (uid, serial, cached_ms) in manager._positions_cache.items()
    }
    return (
        manager.export(),
        [record.principal for record in manager.export()],
        list(locations.items()),  # in insertion order: clearing when full depends on it
        manager.snapshot(now_ms),
        [state.seen.next_check_ms for state in manager._principals.values()],
        manager._total_bits,
        manager.grandfathered_count,
        manager.evicted_principal_count,
    )


# A request: (ms since the previous one, principal, PIDs). Few PIDs, so most repeat.
KNOWN_REQUESTS = st.lists(
    st.tuples(
        st.sampled_from([0, 0, 0, 0, 1, 1, 2, 7, 120, 300, 499, 501, 1000]),
        st.sampled_from(["alice", "bob", "unlimited"]),
        st.lists(st.integers(0, 12), max_size=4),
    ),
    min_size=1,
    max_size=120,
)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    requests=KNOWN_REQUESTS,
    window_num=st.integers(1, 11),
    fresh_divisor_plan=st.booleans(),
    as_tuple=st.booleans(),
    max_principals=st.sampled_from([1, 2, 100]),
    cache_size=st.sampled_from([1, 3, 4096]),
    enforcement_at=st.sampled_from([None, 0, 5]),
)
def test_admit_decides_and_changes_the_same_on_either_path(
    requests: list[tuple[int, str, list[int]]],
    window_num: int,
    fresh_divisor_plan: bool,
    as_tuple: bool,
    max_principals: int,
    cache_size: int,
    enforcement_at: int | None,
) -> None:
    """The same requests through ``admit`` with the compiled and with the pure known-PID check
    and one-PID shortcut ahead of its general path: the same decisions and the same state after
    each, and both known-PID checks give the same answer first."""
    options = {"max_principals": max_principals, "cache_size": cache_size}
    compiled = _manager("compiled", window_num, fresh_divisor_plan, **options)
    pure = _manager("pure", window_num, fresh_divisor_plan, **options)
    now_ms = 1_000_000
    for index, (step_ms, principal, pids) in enumerate(requests):
        now_ms += step_ms
        if index == enforcement_at:  # grandfathering: a grace period (learning mode) begins
            compiled.begin_enforcement(now_ms)
            pure.begin_enforcement(now_ms)
        producer_ids = tuple(pids) if as_tuple else pids
        assert compiled.admit_known(principal, producer_ids, now_ms) == pure.admit_known(
            principal, producer_ids, now_ms
        )
        assert _state(compiled, now_ms) == _state(pure, now_ms)
        assert compiled.admit(principal, producer_ids, now_ms) == pure.admit(
            principal, producer_ids, now_ms
        )
        assert _state(compiled, now_ms) == _state(pure, now_ms)


@needs_compiled
@settings(max_examples=200, deadline=None)
@given(
    requests=KNOWN_REQUESTS,
    window_num=st.integers(1, 11),
    fresh_divisor_plan=st.booleans(),
    cache_size=st.sampled_from([1, 3, 4096]),
    enforcement_at=st.sampled_from([None, 0, 5]),
)
def test_one_pid_asked_of_the_shortcut_alone_decides_as_admit(
    requests: list[tuple[int, str, list[int]]],
    window_num: int,
    fresh_divisor_plan: bool,
    cache_size: int,
    enforcement_at: int | None,
) -> None:
    """The express lane asks ``admit_single`` alone for a frame with one PID (no
    ``admit_known`` first): its answer, or ``admit``'s where it has none, is the pure
    ``admit``'s decision, with the same state after each request."""
    compiled = _manager("compiled", window_num, fresh_divisor_plan, cache_size=cache_size)
    pure = _manager("pure", window_num, fresh_divisor_plan, cache_size=cache_size)
    now_ms = 1_000_000
    for index, (step_ms, principal, pids) in enumerate(requests):
        now_ms += step_ms
        if index == enforcement_at:
            compiled.begin_enforcement(now_ms)
            pure.begin_enforcement(now_ms)
        expected = pure.admit(principal, pids, now_ms)
        single = compiled.admit_single(principal, pids, now_ms) if len(pids) == 1 else None
        if single is None:
            decision = compiled.admit(principal, pids, now_ms)
        else:
            decision = Admitted(single, 0)
        assert decision == expected
        assert _state(compiled, now_ms) == _state(pure, now_ms)


@needs_compiled
def test_the_one_pid_shortcut_answers_a_cached_pid_as_the_known_pid_check_does() -> None:
    """A PID where the location cache says, in a fresh layer: ``admit_single`` admits it as
    known with ``admit_known``'s changes (its layer touched, the principal recently used, the
    cache as it was), also where the filter holds a layer restored off the ladder."""
    by_single = _manager("compiled", 4, True)
    by_known = _manager("compiled", 4, True)
    for manager in (by_single, by_known):
        manager.admit("alice", [7], 1_000_000)
        manager.admit("bob", [9], 1_000_000)
        manager.admit("alice", [7], 1_000_050)  # found by a scan, and cached
        for principal in ("alice", "bob"):  # a restored layer: the shortcut's scan declines
            manager._principals[principal].seen._restored = True
        manager._positions_cache.pop(9, None)  # bob's PID where no cache says
    assert by_single.admit_single("alice", [7], 1_000_100) == ()
    assert by_known.admit_known("alice", [7], 1_000_100) is True
    assert _state(by_single, 1_000_100) == _state(by_known, 1_000_100)
    assert by_single.export()[-1].principal == "alice"  # recently used, as admit_known does
    assert by_single.export()[-1].layers[-1].last_write_ms == 1_000_100
    # Not cached, and a restored layer: the shortcut declines (admit's general path scans).
    assert by_single.admit_single("bob", [9], 1_000_100) is None


@needs_compiled
def test_the_known_pid_check_admits_a_cached_pid_and_touches_its_layer() -> None:
    """A PID admitted a moment ago: the compiled check says known and renews its layer's last
    use (what keeps a producing PID known); a PID never seen, another principal's, or one
    asked after the layer went stale, is left to ``admit``."""
    manager = _manager("compiled", 4, True)
    assert manager.admit("alice", [7], 1_000_000) == Admitted((7,), 0)
    assert manager.admit_known("alice", [7], 1_000_050) is False  # not cached yet: admit scans
    assert manager.admit("alice", [7], 1_000_050) == Admitted((), 0)  # found, and cached
    assert manager.admit_known("alice", [7], 1_000_100) is True
    layer = manager.export()[0].layers[-1]
    assert layer.last_write_ms == 1_000_100
    assert manager.admit_known("alice", [8], 1_000_100) is False
    assert manager.admit_known("bob", [7], 1_000_100) is False
    assert manager.admit_known("alice", [7, 8], 1_000_100) is False
    # A layer is fresh for half a window (LayerPlan.fresh_divisor): then only admit refreshes.
    assert manager.admit_known("alice", [7], 1_000_499) is True
    assert manager.admit_known("alice", [7], 1_000_500) is False
    assert manager.export()[0].layers[-1].last_write_ms == 1_000_499


@needs_compiled
def test_a_malformed_location_is_refused_and_a_serial_out_of_range_is_not_read() -> None:
    manager = _manager("compiled", 4, True)
    manager.admit("alice", [7], 1_000_000)
    manager.admit("alice", [7], 1_000_000)
    uid, _, cached_ms = manager._positions_cache[7]
    manager._positions_cache[7] = (uid, 10**6, cached_ms)  # no such layer: not read
    assert manager.admit_known("alice", [7], 1_000_001) is False
    manager._positions_cache[7] = (uid, -5, cached_ms)
    assert manager.admit_known("alice", [7], 1_000_001) is False
    manager._positions_cache[7] = (uid, 0)  # type: ignore[assignment]
    with pytest.raises(ValueError, match="location cache entry"):
        manager.admit_known("alice", [7], 1_000_001)


@needs_compiled
def test_the_one_pid_shortcut_admits_what_admit_would_and_leaves_the_rest() -> None:
    """``admit_single`` (compiled): a new PID with a token and room in the newest layer is
    admitted as new, written and cached; a PID a fresh layer holds but the cache does not is
    admitted as known; every other case is left to ``admit``'s general path, unchanged."""
    manager = _manager("compiled", 4, True)
    assert manager.admit_single("alice", [1], 1_000_000) is None  # no state: admit's first
    manager.admit("alice", [1], 1_000_000)
    before = _state(manager, 1_000_001)
    assert manager.admit_single("alice", {2}, 1_000_001) is None  # not a list or tuple
    assert manager.admit_single("alice", [2, 3], 1_000_001) is None  # several PIDs
    assert _state(manager, 1_000_001) == before
    assert manager.admit_single("alice", (2,), 1_000_001) == (2,)
    assert manager._positions_cache[2][1:] == (0, 1_000_001)
    assert manager.is_known("alice", 2, 1_000_002)
    # 4 a window, 2 taken, 1 ms of refill.
    assert manager.snapshot(1_000_001)[0].tokens == pytest.approx(2 + 4 / 1000)
    manager._positions_cache.clear()
    assert manager.admit_single("alice", [2], 1_000_002) == ()  # known, not cached: cached now
    assert 2 in manager._positions_cache
    assert manager.admit_single("alice", [3], 1_000_003) == (3,)
    before = _state(manager, 1_000_003)
    assert manager.admit_single("alice", [4], 1_000_003) is None  # the layer is full (3 items)
    assert _state(manager, 1_000_003) == before
    assert manager.admit("alice", [4], 1_000_003) == Admitted((4,), 0)  # a new layer
    assert len(manager.export()[0].layers) == 2
    before = _state(manager, 1_000_004)
    assert manager.admit_single("alice", [5], 1_000_004) is None  # no token left
    assert _state(manager, 1_000_004) == before
    rejected = manager.admit("alice", [5], 1_000_004)
    assert isinstance(rejected, Rejected) and rejected.unknown_producer_ids == (5,)
    # Past the newest layer's span (a quarter window): a new PID needs a new layer.
    before = _state(manager, 1_000_900)
    assert manager.admit_single("alice", [6], 1_000_900) is None
    assert _state(manager, 1_000_900) == before
    assert manager.admit("alice", [6], 1_000_900) == Admitted((6,), 0)


# -- slots read where they are (admit_known and admit_single read fields by offset) ----------


@needs_compiled
def test_every_field_read_by_offset_is_the_field_of_that_name() -> None:
    """The compiled checks read the quota's slots at their offsets, not by name (a cold name
    lookup cost several cache misses a field): every one of them, on a principal with a
    grace period and two layers, is the object ``getattr`` gives."""
    manager = _manager("compiled", 4, True)
    manager.begin_enforcement(1_000_000)
    manager.admit("alice", [1, 2, 3, 4], 1_000_000)
    state = manager._principals["alice"]
    objects = [state, state.seen, state.seen.plan, state.enforcement, state.bucket]
    for obj in objects:
        fields = COMPILED.slot_fields(obj)
        assert fields, type(obj).__name__
        for name, value in fields.items():
            assert value is getattr(obj, name), f"{type(obj).__name__}.{name}"
    with pytest.raises(TypeError):
        COMPILED.slot_fields(manager)  # not a class whose slots are read


class _TrackedElsewhere(TrackedPrincipal):
    """A principal's state of another type: its fields are read by name."""

    __slots__ = ()


@needs_compiled
def test_a_state_of_another_type_is_read_by_name_and_decided_alike() -> None:
    """The offsets hold for the exact classes they were read from; a principal's state of any
    other type (a subclass here) goes through ``getattr`` and gets the same decisions."""
    compiled_manager = _manager("compiled", 4, True)
    pure = _manager("pure", 4, True)
    for manager in (compiled_manager, pure):
        manager.admit("alice", [1], 1_000_000)
        state = manager._principals["alice"]
        manager._principals["alice"] = _TrackedElsewhere(
            state.seen, state.bucket, state.enforcement
        )
    for now_ms, pids in ((1_000_001, [1]), (1_000_002, [2]), (1_000_003, [2]), (1_000_004, [3])):
        assert compiled_manager.admit_known("alice", pids, now_ms) == pure.admit_known(
            "alice", pids, now_ms
        )
        assert compiled_manager.admit("alice", pids, now_ms) == pure.admit("alice", pids, now_ms)
        assert _state(compiled_manager, now_ms) == _state(pure, now_ms)
    assert type(compiled_manager._principals["alice"]) is _TrackedElsewhere


@needs_compiled
def test_a_bucket_replaced_in_place_is_released_and_the_new_one_is_whole() -> None:
    """``admit_single`` swaps the principal's bucket in its slot: the old bucket loses the
    reference the state held (no leak), and the new one is a complete, frozen, hashable
    TokenBucket equal to what ``try_take`` makes."""
    manager = _manager("compiled", 4, True)
    manager.admit("alice", [1], 1_000_000)
    state = manager._principals["alice"]
    old = state.bucket
    expected = old.try_take(1, 1_000_001)
    held = sys.getrefcount(old)
    assert manager.admit_single("alice", (2,), 1_000_001) == (2,)
    assert state.bucket is not old
    assert sys.getrefcount(old) == held - 1
    assert state.bucket == expected
    assert hash(state.bucket) == hash(expected)
    with pytest.raises(AttributeError):
        state.bucket.level = 0  # type: ignore[misc]  # still frozen


@needs_compiled
def test_taking_tokens_leaks_no_reference() -> None:
    """Each bucket ``take_token`` builds holds its figures once; dropping them all gives back
    every reference they took."""
    rate = 10**9 + 7  # an int object of its own (not a cached small int)
    bucket = TokenBucket.full(rate, 1000, 1_000_000)
    before = sys.getrefcount(rate)
    taken = [COMPILED.take_token(bucket, 1_000_000 + i) for i in range(1000)]
    assert all(t is not None and t.rate is rate for t in taken)
    assert sys.getrefcount(rate) == before + 1000
    del taken
    assert sys.getrefcount(rate) == before


# -- the token a new PID takes (admit_single's TokenBucket.try_take(1) in C) ----------------


@st.composite
def _buckets(draw: st.DrawFn) -> TokenBucket:
    """Buckets as the quota holds them, figures from tiny to past 64 bits, in debt or full."""
    rate = draw(st.one_of(st.integers(0, 10), st.integers(0, 2**70)))
    window_ms = draw(st.one_of(st.integers(1, 1000), st.integers(1, 2**66)))
    capacity = rate * window_ms
    level = draw(
        st.one_of(
            st.sampled_from([capacity, 0, -10 * capacity, window_ms, window_ms - 1]),
            st.integers(-10 * capacity, capacity),
        ).filter(lambda value: -10 * capacity <= value <= capacity)
    )
    updated_ms = draw(st.one_of(st.integers(0, 10**13), INT64))
    return TokenBucket(rate, window_ms, level, updated_ms)


@needs_compiled
@settings(max_examples=2000, deadline=None)
@given(bucket=_buckets(), now_ms=st.one_of(st.integers(0, 10**13), INT64), step_ms=INT64)
def test_the_token_taken_in_c_is_try_takes(bucket: TokenBucket, now_ms: int, step_ms: int) -> None:
    """The same bucket after the take, or None when ``try_take`` refuses, for buckets whose
    figures fit 64 bits and for those that do not (left to ``try_take`` itself), time running
    forwards, standing still and backwards."""
    for at_ms in (now_ms, bucket.updated_ms, bucket.updated_ms + 1):
        if -(2**63) <= at_ms < 2**63:
            assert COMPILED.take_token(bucket, at_ms) == bucket.try_take(1, at_ms)
    nearby_ms = bucket.updated_ms + step_ms % 10**7
    if nearby_ms < 2**63:
        assert COMPILED.take_token(bucket, nearby_ms) == bucket.try_take(1, nearby_ms)


@needs_compiled
def test_the_token_taken_in_c_from_a_full_an_empty_and_an_indebted_bucket() -> None:
    full = TokenBucket.full(4, 1000, 1_000_000)
    taken = COMPILED.take_token(full, 1_000_000)
    assert taken == TokenBucket(4, 1000, 3000, 1_000_000)
    assert COMPILED.take_token(TokenBucket(4, 1000, 999, 1_000_000), 1_000_000) is None
    assert COMPILED.take_token(TokenBucket(4, 1000, 999, 1_000_000), 1_000_001) == TokenBucket(
        4, 1000, 3, 1_000_001
    )
    indebted = TokenBucket(4, 1000, -40_000, 1_000_000)  # ten windows of fleet debt
    assert COMPILED.take_token(indebted, 1_010_249) is None
    assert COMPILED.take_token(indebted, 1_010_250) == TokenBucket(4, 1000, 0, 1_010_250)
    assert COMPILED.take_token(TokenBucket(0, 1000, 0, 5), 10**9) is None  # rate 0: no refill
    # Past 64 bits: try_take itself, the same answer.
    huge = TokenBucket.full(2**70, 1000, 0)
    assert COMPILED.take_token(huge, 1) == TokenBucket(2**70, 1000, 2**70 * 1000 - 1000, 1)
