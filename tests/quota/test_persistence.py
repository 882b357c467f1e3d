"""Quota state persistence: a restart is invisible (throttled stays throttled, known PIDs stay
known), saved state is fitted to the current policy, and no corruption loads silently."""

from __future__ import annotations

import base64
import contextlib
import struct
import zlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pidgate.quota import (
    Admitted,
    BloomFilter,
    BloomShape,
    LayeredBloomFilter,
    LayerPlan,
    QuotaManager,
    QuotaPolicy,
    Rejected,
)
from pidgate.quota.layered import LayerState
from pidgate.quota.principal_table import PrincipalRecord
from pidgate.quota.state.decode import decode_state
from pidgate.quota.state.encode import assemble_state, dump_state, encode_principals, encode_state
from pidgate.quota.state.format import (
    FORMAT_VERSION,
    MAGIC,
    StateFormatError,
    StateSnapshot,
    UnsupportedStateVersion,
)
from pidgate.quota.state.load import load_state
from pidgate.quota.state.run_time_overrides import DEFAULT_USER, QuotaOverrides

W = 60_000  # window_ms
T0 = 1_700_000_000_000  # wall-clock ms


def policy(**changes: object) -> QuotaPolicy:
    base = QuotaPolicy(window_ms=W, window_num=6, default_producer_ids_rate=5)
    return replace(base, **changes)  # type: ignore[arg-type]


def throttled_manager() -> tuple[QuotaManager, Rejected]:
    """alice activated 5 PIDs (her whole budget) and is rejected for a 6th."""
    m = QuotaManager(policy())
    assert isinstance(m.admit("User:alice", [1, 2, 3], T0), Admitted)
    assert isinstance(m.admit("User:alice", [4, 5], T0 + 1000), Admitted)
    rejected = m.admit("User:alice", [6], T0 + 2000)
    assert isinstance(rejected, Rejected)
    return m, rejected


def body_of(data: bytes) -> bytes:
    """The decompressed body of a state (after the 28-byte header, before the CRC)."""
    return zlib.decompress(data[28:-4])


def rewrap(body: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A well-formed envelope (magic, lengths, CRC) around an arbitrary body."""
    compressed = zlib.compress(body)
    head = struct.pack(">8sHHQQ", MAGIC, version, 0, len(body), len(compressed)) + compressed
    return head + struct.pack(">I", zlib.crc32(head))


# -- a restart is invisible ------------------------------------------------------------------


def test_throttled_principal_stays_throttled_with_the_same_throttle_time() -> None:
    m, rejected = throttled_manager()
    data = dump_state(m, T0 + 2000)
    restored, report = load_state(data, policy(), T0 + 2000)
    assert report.principals_restored == 1
    assert restored.admit("User:alice", [6], T0 + 2000) == rejected
    # Time keeps running across the restart: 4 s later the wait is 4 s shorter.
    assert rejected.throttle_time_ms == 10_000
    later, _ = load_state(data, policy(), T0 + 6000)
    again = later.admit("User:alice", [6], T0 + 6000)
    assert isinstance(again, Rejected)
    assert again.throttle_time_ms == 6000
    # And once it has passed, the PID is admitted.
    done, _ = load_state(data, policy(), T0 + 12_000)
    assert done.admit("User:alice", [6], T0 + 12_000) == Admitted((6,), 0)


def test_known_pids_stay_known_and_cost_nothing() -> None:
    m, _ = throttled_manager()
    restored, _ = load_state(dump_state(m, T0 + 2000), policy(), T0 + 3000)
    for pid in range(1, 6):
        assert restored.is_known("User:alice", pid, T0 + 3000)
    assert not restored.is_known("User:alice", 6, T0 + 3000)
    # Known PIDs pass although the bucket is empty.
    assert restored.admit("User:alice", [1, 2, 3, 4, 5], T0 + 3000) == Admitted((), 0)
    assert restored.snapshot(T0 + 3000) == m.snapshot(T0 + 3000)


def test_round_trip_is_exact() -> None:
    m, _ = throttled_manager()
    m.admit("User:bob", list(range(100, 104)), T0 + 30_000)
    overrides = QuotaOverrides({"alice": 5, DEFAULT_USER: None, "carol": 7})
    snapshot = decode_state(dump_state(m, T0 + 30_000, overrides))
    assert snapshot.dumped_at_ms == T0 + 30_000
    assert snapshot.overrides == overrides
    assert snapshot.principals == m.export()
    assert [r.principal for r in snapshot.principals] == ["User:alice", "User:bob"]  # idlest first


def test_idle_order_survives_so_eviction_picks_the_same_principal() -> None:
    m = QuotaManager(policy(max_principals=3))
    for i, name in enumerate(["a", "b", "c"]):
        m.admit(f"User:{name}", [i], T0 + i)
    m.admit("User:a", [0], T0 + 10)  # a becomes the most recently active
    restored, _ = load_state(dump_state(m, T0 + 10), policy(max_principals=3), T0 + 10)
    restored.admit("User:d", [9], T0 + 20)
    assert [s.principal for s in restored.snapshot(T0 + 20)] == ["User:c", "User:a", "User:d"]


def test_empty_manager_round_trips() -> None:
    restored, report = load_state(dump_state(QuotaManager(policy()), T0), policy(), T0)
    assert restored.principal_count == 0
    assert report.principals_saved == 0
    assert report.overrides == QuotaOverrides()


# -- fitted to the clock and policy at load time -------------------------------------------------


def test_expired_layers_are_dropped() -> None:
    m = QuotaManager(policy(default_producer_ids_rate=100))
    m.admit("User:alice", [1], T0)  # layer 1
    m.admit("User:alice", [2], T0 + 20_000)  # layer 2 (a layer is current for 10 s)
    data = dump_state(m, T0 + 20_000)
    restored, report = load_state(data, policy(default_producer_ids_rate=100), T0 + W + 1)
    assert report.layers_expired == 1
    assert report.layers_restored == 1
    assert not restored.is_known("User:alice", 1, T0 + W + 1)
    assert restored.is_known("User:alice", 2, T0 + W + 1)


def test_principal_with_nothing_left_is_forgotten() -> None:
    m, _ = throttled_manager()
    # A window after the last write every layer is dead and the bucket has refilled.
    restored, report = load_state(dump_state(m, T0 + 2000), policy(), T0 + 1000 + W)
    assert restored.principal_count == 0
    assert report.principals_idle == 1
    assert report.layers_expired == 1


def test_clock_stepped_back_keeps_everything() -> None:
    m, rejected = throttled_manager()
    restored, report = load_state(dump_state(m, T0 + 2000), policy(), T0 - 60_000)
    assert report.principals_restored == 1
    assert report.layers_expired == 0
    assert restored.is_known("User:alice", 1, T0 - 60_000)
    assert restored.admit("User:alice", [6], T0 - 60_000) == rejected


def test_refill_uses_the_current_rate() -> None:
    m, rejected = throttled_manager()  # rate 5/min, empty bucket at T0 + 1000
    data = dump_state(m, T0 + 2000)
    faster, _ = load_state(data, policy(default_producer_ids_rate=50), T0 + 2000)
    # The raise grants the 45 tokens it adds (what was spent stays spent); 1/6 of a token was
    # held when saved, the other 5/6 come at the new rate (one per 1.2 s), not the old (12 s).
    assert rejected.throttle_time_ms == 10_000
    storm = list(range(100, 145))
    assert faster.admit("User:alice", storm, T0 + 2000) == Admitted(tuple(storm), 0)
    assert faster.admit("User:alice", [6], T0 + 2000) == Rejected(1000, (6,))
    # The time the proxy was down counts at the current rate.
    later, _ = load_state(data, policy(default_producer_ids_rate=50), T0 + 2500)
    assert later.admit("User:alice", storm, T0 + 2500) == Admitted(tuple(storm), 0)
    assert later.admit("User:alice", [6], T0 + 2500) == Rejected(500, (6,))


def test_lower_rate_clamps_tokens() -> None:
    m = QuotaManager(policy(default_producer_ids_rate=100))
    m.admit("User:alice", [1], T0)  # 99 tokens left
    restored, _ = load_state(dump_state(m, T0), policy(default_producer_ids_rate=3), T0)
    assert restored.snapshot(T0)[0].tokens == 3
    assert restored.snapshot(T0)[0].producer_ids_rate == 3
    assert restored.is_known("User:alice", 1, T0)  # layers kept as they were


def test_principal_that_became_unlimited_is_dropped() -> None:
    m, _ = throttled_manager()
    p = policy(default_producer_ids_rate=None)
    restored, report = load_state(dump_state(m, T0 + 2000), p, T0 + 2000)
    assert restored.principal_count == 0
    assert report.principals_unlimited == 1
    assert restored.admit("User:alice", [6], T0 + 2000) == Admitted((), 0, tracked=False)


def test_changed_false_positive_rate_keeps_the_saved_shape_and_known_pids() -> None:
    m, rejected = throttled_manager()
    p = policy(false_positive_rate=0.01)
    restored, report = load_state(dump_state(m, T0 + 2000), p, T0 + 2000)
    assert report.principals_reshaped == 1
    assert report.layers_reshaped == 1
    assert report.layers_restored == 1
    # Known PIDs stay known (positions come from the saved shape, as at run time) ...
    assert restored.is_known("User:alice", 1, T0 + 2000)
    # ... and the principal is still throttled for new ones.
    assert restored.admit("User:alice", [6], T0 + 2000) == rejected
    (saved,) = m.export()[0].layers
    assert restored.snapshot(T0 + 2000)[0].bits == saved.shape.bit_count
    # New writes go to a new layer in the new shape (k = 10 at p = 0.01 with 6 layers a
    # window, k = 14 at 0.001), never the old one.
    assert restored.admit("User:alice", [6], T0 + 12_000) == Admitted((6,), 0)
    old, new = restored.export()[0].layers
    assert old == saved
    assert new.shape.hash_count == LayerPlan(W, 6, 0.01).hash_count == 10
    assert saved.shape.hash_count == LayerPlan(W, 6, 0.001).hash_count == 14


def test_changed_layer_size_keeps_layers_as_they_are() -> None:
    m, _ = throttled_manager()
    restored, report = load_state(dump_state(m, T0 + 2000), policy(min_layer_items=500), T0 + 2000)
    # Sizes are per layer: a new minimum applies to the next layer, saved ones are not foreign.
    assert report.principals_reshaped == 0
    assert restored.export()[0].layers == m.export()[0].layers
    assert restored.admit("User:alice", [6], T0 + 12_000) == Admitted((6,), 0)
    assert restored.export()[0].layers[-1].shape.expected_items >= 500


def test_changed_window_rescales_the_bucket() -> None:
    m = QuotaManager(policy(default_producer_ids_rate=10))
    m.admit("User:alice", [1, 2, 3, 4], T0)  # 6 of 10 tokens left
    p = policy(default_producer_ids_rate=10, window_ms=2 * W)
    restored, _ = load_state(dump_state(m, T0), p, T0)
    assert restored.snapshot(T0)[0].tokens == 6
    # The layer now lives two minutes after its last write.
    assert restored.is_known("User:alice", 1, T0 + W + 1)


def test_caps_are_enforced_on_load() -> None:
    m = QuotaManager(policy())
    for i in range(5):
        m.admit(f"User:u{i}", [i], T0 + i)
    restored, report = load_state(dump_state(m, T0 + 5), policy(max_principals=2), T0 + 5)
    assert report.principals_evicted == 3
    assert report.principals_restored == 2
    assert report.layers_restored == 2
    assert [s.principal for s in restored.snapshot(T0 + 5)] == ["User:u3", "User:u4"]


# -- quota overrides ----------------------------------------------------------------------------


def test_overrides_are_saved_and_applied_on_load() -> None:
    m, _ = throttled_manager()
    overrides = QuotaOverrides({"alice": 1})
    restored, report = load_state(dump_state(m, T0 + 2000, overrides), policy(), T0 + 2000)
    assert report.overrides == overrides
    assert restored.policy.rate_for("User:alice") == 1
    assert restored.policy.rate_for("User:bob") == 5
    assert restored.snapshot(T0 + 2000)[0].producer_ids_rate == 1
    plain, _ = load_state(
        dump_state(m, T0 + 2000, overrides), policy(), T0 + 2000, apply_overrides=False
    )
    assert plain.policy == policy()


def test_overrides_apply_to() -> None:
    base = policy(default_producer_ids_rate=5, user_producer_ids_rates={"alice": 1, "bob": 2})
    assert QuotaOverrides().apply_to(base) is base
    p = QuotaOverrides({"alice": None, "carol": 9, DEFAULT_USER: 50}).apply_to(base)
    assert p.rate_for("User:alice") == 50  # removed: falls back to the default
    assert p.rate_for("User:bob") == 2
    assert p.rate_for("User:carol") == 9
    assert p.rate_for("User:dave") == 50
    unlimited = QuotaOverrides({DEFAULT_USER: None}).apply_to(base)
    assert unlimited.rate_for("User:dave") is None
    assert unlimited.rate_for("User:bob") == 2


def test_overrides_are_an_immutable_validated_mapping() -> None:
    o = QuotaOverrides({"alice": 3})
    o2 = o.with_rate("bob", None)
    assert dict(o) == {"alice": 3}
    assert dict(o2) == {"alice": 3, "bob": None}
    assert o2 == QuotaOverrides([("bob", None), ("alice", 3)])
    assert hash(o2) == hash(QuotaOverrides({"bob": None, "alice": 3}))
    assert o2 != o
    for bad in ({"": 1}, {"alice": -1}, {"alice": True}, {"alice": 1.5}):
        with pytest.raises(ValueError):
            QuotaOverrides(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        o["alice"] = 4  # type: ignore[index]


# -- encodings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "pids"),
    [
        (5, 3),  # 256-bit layers, sparse u16
        (100_000, 6000),  # 131 072-bit layers, sparse u32
        (10_000, 5000),  # dense, raw bytes
        (1, 1),
    ],
)
def test_every_layer_encoding_round_trips(rate: int, pids: int) -> None:
    p = policy(default_producer_ids_rate=rate)
    m = QuotaManager(p)
    m.admit("User:alice", list(range(pids)), T0)
    data = dump_state(m, T0)
    assert decode_state(data).principals == m.export()
    restored, _ = load_state(data, p, T0)
    assert all(restored.is_known("User:alice", pid, T0) for pid in range(pids))


def test_size_is_compact() -> None:
    p = policy(default_producer_ids_rate=100)
    m = QuotaManager(p)
    for i in range(200):
        m.admit(f"User:user-{i}", list(range(i * 10, i * 10 + 10)), T0 + i)
    data = dump_state(m, T0 + 200)
    # 512 bits (64 bytes) per principal in memory, ~100 of them set.
    assert len(data) < 200 * 100


def test_names_round_trip_whatever_they_contain() -> None:
    p = policy()
    m = QuotaManager(p)
    names = ["User:CN=ünïcode,O=例え", "User:", "x" * 5000, "User:a\x00b", "User:\udcff"]
    for i, name in enumerate(names):
        m.admit(name, [i], T0)
    restored, _ = load_state(dump_state(m, T0), p, T0)
    assert [s.principal for s in restored.snapshot(T0)] == names


# -- corruption is always detected -----------------------------------------------------------


def small_state() -> bytes:
    m, _ = throttled_manager()
    return dump_state(m, T0 + 2000, QuotaOverrides({"alice": 5}))


def test_every_flipped_byte_is_detected() -> None:
    data = small_state()
    assert len(data) < 400
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[i] ^= mask
            with pytest.raises(StateFormatError):
                load_state(bytes(corrupt), policy(), T0 + 2000)


def test_every_truncation_is_detected() -> None:
    data = small_state()
    for n in range(len(data)):
        with pytest.raises(StateFormatError):
            load_state(data[:n], policy(), T0 + 2000)


def test_extra_bytes_are_detected() -> None:
    data = small_state()
    with pytest.raises(StateFormatError, match="trailing"):
        load_state(data + b"\x00", policy(), T0)
    with pytest.raises(StateFormatError, match="trailing"):
        load_state(data + data, policy(), T0)


def test_messages_say_what_is_wrong() -> None:
    data = small_state()
    with pytest.raises(StateFormatError, match="bad magic"):
        load_state(b"", policy(), T0)
    with pytest.raises(StateFormatError, match="bad magic"):
        load_state(b'{"json": true}', policy(), T0)
    with pytest.raises(StateFormatError, match="truncated"):
        load_state(data[:-1], policy(), T0)
    corrupt = bytearray(data)
    corrupt[40] ^= 1
    with pytest.raises(StateFormatError, match="checksum"):
        load_state(bytes(corrupt), policy(), T0)


def test_newer_format_is_refused() -> None:
    newer = rewrap(body_of(small_state()), version=FORMAT_VERSION + 1)
    with pytest.raises(UnsupportedStateVersion, match="newer") as info:
        load_state(newer, policy(), T0)
    assert info.value.version == FORMAT_VERSION + 1
    assert isinstance(info.value, StateFormatError)
    assert isinstance(info.value, ValueError)


def test_intact_envelope_around_inconsistent_content_is_detected() -> None:
    body = body_of(small_state())
    assert decode_state(rewrap(body)) == decode_state(small_state())
    for n in range(len(body)):
        with pytest.raises(StateFormatError):
            load_state(rewrap(body[:n]), policy(), T0)


def test_inconsistent_records_are_detected() -> None:
    shape = BloomShape.for_capacity(1000, 0.001)
    good = LayerState(shape, T0, T0, 1, bytes((shape.bit_count + 7) // 8))
    bad_layers = [
        (replace(good, bits=b"\xff" * len(good.bits)),),  # pad bits set
        (good, replace(good, bits=b"\xff" * len(good.bits))),
    ]
    for layers in bad_layers:
        m, _ = throttled_manager()
        (record,) = m.export()
        snapshot = StateSnapshot(T0, QuotaOverrides(), (replace(record, layers=layers),))
        with pytest.raises(StateFormatError, match="inconsistent"):
            load_state(encode_state(snapshot), policy(), T0)
    m, _ = throttled_manager()
    (record,) = m.export()
    twice = StateSnapshot(T0, QuotaOverrides(), (record, record))
    with pytest.raises(StateFormatError, match="twice"):
        load_state(encode_state(twice), policy(), T0)


@settings(deadline=None, max_examples=300)
@given(body=st.binary(max_size=200))
def test_any_body_loads_or_raises_state_format_error(body: bytes) -> None:
    with contextlib.suppress(StateFormatError):
        load_state(rewrap(body), policy(), T0)


# -- the quota class additions ------------------------------------------------------------------


def test_bloom_filter_bytes_round_trip_and_validation() -> None:
    shape = BloomShape(bit_count=13, hash_count=2, expected_items=3)
    b = BloomFilter(shape)
    b.add((0, 12))
    assert b.to_bytes() == b"\x80\x08"
    copy = BloomFilter.from_bytes(shape, b.to_bytes(), b.inserted_count)
    assert copy.contains((0, 12)) and not copy.contains((1, 12))
    assert copy.inserted_count == 1
    assert copy.to_bytes() == b.to_bytes()
    with pytest.raises(ValueError, match="cannot hold"):
        BloomFilter.from_bytes(shape, b"\x00", 0)
    with pytest.raises(ValueError, match="beyond"):
        BloomFilter.from_bytes(shape, b"\x00\x04", 0)
    with pytest.raises(ValueError, match="inserted_count"):
        BloomFilter.from_bytes(shape, b"\x00\x00", -1)


def test_layered_filter_export_restore() -> None:
    plan = LayerPlan(W, 6)
    f = LayeredBloomFilter(plan)
    f.add(f.positions(1), T0)
    f.add(f.positions(2), T0 + 20_000)
    f.touch(0, T0 + 25_000)  # the older layer's last write is now the later one: allowed
    g = LayeredBloomFilter(plan)
    g.restore(f.export_layers())
    assert g.export_layers() == f.export_layers()
    assert g.layer_count == 2
    assert g.contains(1, T0 + 20_000)
    # Restored layers are independent copies.
    g.add(g.positions(3), T0 + 20_001)
    assert not f.contains(3, T0 + 20_001)
    # A failed restore changes nothing.
    shape = f.export_layers()[0].shape
    for bad in (
        LayerState(shape, T0, T0, 0, b""),  # too few bytes
        LayerState(shape, T0 + 1, T0, 0, bytes(shape.bit_count // 8)),  # starts after last write
        LayerState(shape, T0, T0, -1, bytes(shape.bit_count // 8)),
    ):
        with pytest.raises(ValueError):
            g.restore([*f.export_layers(), bad])
    assert g.layer_count == 2


def test_manager_restore_replaces_state_and_enforces_caps() -> None:
    m, _ = throttled_manager()
    m.admit("User:bob", [9], T0 + 3000)
    records = m.export()
    fresh = QuotaManager(policy())
    fresh.admit("User:zed", [1], T0)
    assert fresh.restore(records) == 0
    assert fresh.export() == records
    assert fresh.total_bits == m.total_bits
    capped = QuotaManager(policy(max_principals=1))
    assert capped.restore(records) == 1
    assert [r.principal for r in capped.export()] == ["User:bob"]
    with pytest.raises(ValueError, match="twice"):
        fresh.restore([*records, records[0]])
    assert fresh.export() == records
    assert isinstance(records[0], PrincipalRecord)


# -- a restart is invisible, whatever happened before it -----------------------------------------

REQUESTS = st.lists(
    st.tuples(
        st.integers(0, 4000),  # ms since the previous request
        st.sampled_from(["User:a", "User:b", "User:c", "ANONYMOUS"]),
        st.lists(st.integers(0, 30), max_size=4),
    ),
    max_size=40,
)


@settings(deadline=None, max_examples=150)
@given(
    before=REQUESTS,
    after=REQUESTS,
    gap_ms=st.integers(0, 30_000),
    window_num=st.integers(1, 6),
    rates=st.tuples(st.integers(0, 6), st.integers(0, 6)),
)
def test_restart_changes_no_decision(
    before: list[tuple[int, str, list[int]]],
    after: list[tuple[int, str, list[int]]],
    gap_ms: int,
    window_num: int,
    rates: tuple[int, int],
) -> None:
    p = QuotaPolicy(
        window_ms=20_000,
        window_num=window_num,
        default_producer_ids_rate=rates[0],
        user_producer_ids_rates={"b": rates[1], "ANONYMOUS": 1},
        min_layer_items=3,  # tiny layers: saturation rolls layers too
        max_layer_items=3,
    )
    original = QuotaManager(p)
    now = T0
    for delta, principal, pids in before:
        now += delta
        original.admit(principal, pids, now)
    saved_at = now
    now += gap_ms
    restored, report = load_state(dump_state(original, saved_at), p, now)
    assert report.principals_saved == len(original.export())
    for pid in range(31):
        for principal in ("User:a", "User:b", "User:c", "ANONYMOUS"):
            assert restored.is_known(principal, pid, now) == original.is_known(principal, pid, now)
    for delta, principal, pids in after:
        now += delta
        assert restored.admit(principal, pids, now) == original.admit(principal, pids, now)


# -- state format 2 (one Bloom shape per principal) still loads ----------------------------------

#: Saved by pidgate before format 3 (layers of 1000 items, 14 378 bits, for every principal):
#: policy window 60 s in 6 layers, rate 5, enforcement begun at T0 with frontier 1000. alice:
#: PIDs 1-5 grandfathered at T0 (+1 s), 2000 new at T0 + 20 s, 1 refreshed at T0 + 20.001 s,
#: 2001 new at T0 + 30 s (three layers); bob: 2100-2103 new at T0 + 30 s. Dumped at T0 + 30 s.
FORMAT_2_STATE = base64.b64decode(
    "UElER1NUQVQAAgAAAAAAAAAAAX8AAAAAAAABTXicZZBLKERhFMf/53z3ftdcNVMa7C28FtIYC4rRDDUxxiTTJOVx"
    "uaGmZho7WQzJShIWisXksSGUhYUssFBiYcqC3SwsZjkLC4+SO4+FUqfO6XQ6v985mffTn08DXBaeMxPtRsxQM88i"
    "H4X+UVzPalSsoVD9BkJ0SwmY1KHckweL2OdquJVhjKAJo4BIU4hb0IdNpOmGpoUdzVSuVOKM/aglJ77RKXQOYAxe"
    "GgQlU8fW6vXgk0PGEzHDnNILHhPR2Ukzb5Jbtv8xEcXxrKaSa4WdWhg+fGGba7gRLrRBRyu64bfwNisrqIIbEdqh"
    "IQzQGhZoCb3I4ZDfhBcz3EUVMOicHtCAAK/iA1EkaYvmLVFBDjqg65cTC0dMzgs1Il9FkeIpMfoRtOo7NYU91Sd7"
    "pF8GZOlVRPqj6uWYFuFx7cp2qUne1er4/7m/bEhzL7pq1Dc="
)


def test_format_2_state_loads_and_keeps_every_pid_known() -> None:
    assert FORMAT_2_STATE[8:10] == b"\x00\x02"
    now = T0 + 30_000
    restored, report = load_state(FORMAT_2_STATE, policy(), now)
    assert (report.principals_restored, report.layers_restored) == (2, 4)
    # Every layer is in the old shape: read as saved, never written again.
    assert (report.principals_reshaped, report.layers_reshaped) == (2, 4)
    for principal, pids in (("User:alice", [1, 2, 3, 4, 5, 2000, 2001]), ("User:bob", [2100])):
        assert all(restored.is_known(principal, pid, now) for pid in pids)
    assert not restored.is_known("User:alice", 6, now)
    (alice,) = (s for s in restored.snapshot(now) if s.principal == "User:alice")
    assert alice.frontier == 1000 and alice.bits == 3 * 14_378
    # 2000's layer (started at T0 + 20 s) is still fresh: touched, free.
    assert restored.admit("User:alice", [2000], T0 + 35_000) == Admitted((), 0)
    # 3 is only in the first layer (T0), no longer fresh: refreshed into a new, power-of-two
    # layer; the newest old-shape layer (T0 + 30 s, still current) is not written.
    assert restored.admit("User:alice", [3], T0 + 35_000) == Admitted((), 1)
    layers = next(r for r in restored.export() if r.principal == "User:alice").layers
    smallest = LayerPlan(W, 6).shape_for(1).bit_count  # 16 items at p·(3/4)/10, k = 14
    assert [layer.shape.bit_count for layer in layers] == [14_378, 14_378, 14_378, smallest]
    # Saved again, it is a current-format state that loads to the same decisions.
    again = dump_state(restored, T0 + 35_000)
    assert again[8:10] == FORMAT_VERSION.to_bytes(2, "big") == b"\x00\x04"
    reloaded, _ = load_state(again, policy(), T0 + 35_000)
    assert [r.layers for r in reloaded.export()] == [r.layers for r in restored.export()]
    for pid in (1, 2, 3, 4, 5, 2000, 2001):
        assert reloaded.admit("User:alice", [pid], T0 + 50_000) == restored.admit(
            "User:alice", [pid], T0 + 50_000
        )


def test_format_2_bodies_are_checked_like_format_3() -> None:
    body = body_of(FORMAT_2_STATE)
    assert decode_state(rewrap(body, version=2)).principals
    for n in range(0, len(body), 7):
        with pytest.raises(StateFormatError):
            load_state(rewrap(body[:n], version=2), policy(), T0)
    with pytest.raises(StateFormatError):
        load_state(rewrap(body, version=3), policy(), T0)  # a v2 body read as v3


# -- saved a step at a time ------------------------------------------------------------------


def test_an_export_in_steps_is_the_export_and_round_trips() -> None:
    m = QuotaManager(policy())
    for i in range(25):
        assert isinstance(m.admit(f"User:u{i}", [i, i + 1000], T0 + i), Admitted)
    steps = list(m.export_in_steps(10))
    assert [len(step) for step in steps] == [10, 10, 5]
    records = tuple(r for step in steps for r in step)
    assert records == m.export()
    overrides = QuotaOverrides({"carol": 7})
    data = encode_state(StateSnapshot(T0 + 30, overrides, records))
    # Encoded a step at a time and joined: byte for byte the state encoded in one go.
    parts = b"".join(encode_principals(step) for step in steps)
    assert assemble_state(T0 + 30, overrides, len(records), parts) == data
    restored, report = load_state(data, policy(), T0 + 30)
    assert report.principals_restored == 25
    assert restored.snapshot(T0 + 30) == m.snapshot(T0 + 30)


def test_an_export_in_steps_copies_each_principal_as_its_step_finds_it() -> None:
    m = QuotaManager(policy(max_principals=4))
    for i in range(4):
        m.admit(f"User:u{i}", [i], T0)
    steps = m.export_in_steps(2)
    first = next(steps)  # u0, u1
    m.admit("User:u0", [10], T0 + 5)  # u0 copied already: its new PID waits for the next save
    m.admit("User:u1", [11], T0 + 5)
    m.admit("User:u3", [13], T0 + 5)  # u3 not yet copied: its new PID is in this one
    m.admit("User:late", [99], T0 + 5)  # evicts the idlest, u2, before its step
    (second,) = list(steps)
    restored, _ = load_state(
        encode_state(StateSnapshot(T0 + 5, QuotaOverrides(), first + second)), policy(), T0 + 5
    )
    assert [r.principal for r in first + second] == ["User:u0", "User:u1", "User:u3"]
    assert not restored.is_known("User:u0", 10, T0 + 5)
    assert restored.is_known("User:u3", 13, T0 + 5)
    assert restored.is_known("User:u0", 0, T0 + 5)


# -- a state saved before each layer got its share of the false-positive rate still loads --------

#: Saved (format 3) by pidgate before issue #21 item 4, when every layer was built for p itself
#: (k = 10): window 60 s in 6 layers, rate 100. alice: PIDs 1-40 at T0 (one 768-bit layer),
#: 100-109 at T0 + 10 s, 200-204 at T0 + 25 s; bob: 300-302 at T0 + 25 s. Dumped at T0 + 30 s.
OLD_SIZING_STATE = base64.b64decode(
    "UElER1NUQVQAAwAAAAAAAAAAAXAAAAAAAAABRnice/Bl3b+fSQxMXKHFqUVWiTmZyakpD64wN2zcy3RhGUiKuYGN"
    "y7RhwWqQKg0G62mtjwQ4Ph5kNnY7sqFK7spKjeZbT/iUzJ0EbNZ08ARYGp/akpCcwNi/qTlJwN7Cnf2B0gXvky2m"
    "VSYv/EMUZBwuOE/WyVmg8OSR0KkNXms8nJgCTj9Q8FgVveCqh8HjzuaNKQ1MXIIL9qwBWcbF4MSgzCEgzMPZa6HF"
    "p39W0SCyY1Zig8AiKQcTp4OaiY4zQC6DOJKBlYFBgIGBiZGBgcWBQUGBiYGJgYPBQYmByQEoDAECUOzAwNDgACQV"
    "wFwHkGgDFwMDo4ADC4MDJwcDkARCAaDtQANBGgMSwPo5wCGUlJ8ECp8Hcx5Dw4cR5GSoK5gZOIEOcGRoYmCIADqF"
    "yYmBsaGBwUOAyYVBEWimB6MCAwBl/24IHwRZCw=="
)


def test_state_saved_under_the_old_per_layer_sizing_loads_and_keeps_every_pid_known() -> None:
    now = T0 + 31_000
    saved_pids = {
        "User:alice": [*range(1, 41), *range(100, 110), *range(200, 205)],
        "User:bob": [300, 301, 302],
    }
    restored, report = load_state(OLD_SIZING_STATE, policy(default_producer_ids_rate=100), now)
    assert (report.principals_restored, report.layers_restored) == (2, 4)
    # k = 10 layers are not what the current plan builds (k = 14 here): read, never written.
    assert LayerPlan(W, 6).hash_count == 14
    assert (report.principals_reshaped, report.layers_reshaped) == (2, 4)
    for principal, pids in saved_pids.items():
        assert all(restored.is_known(principal, pid, now) for pid in pids)
    old_layers = next(r for r in restored.export() if r.principal == "User:alice").layers
    assert [layer.shape.hash_count for layer in old_layers] == [10, 10, 10]
    # The estimate counts the old layers (each built for p on its own) from their fill.
    (alice,) = (s for s in restored.snapshot(now) if s.principal == "User:alice")
    assert 0.0 < alice.estimated_false_positive_rate < 0.001
    # A new PID at T0 + 31 s: the newest old layer (T0 + 25 s) is still current but sealed,
    # so a layer in the current shape takes it; the old layers are kept as they were.
    assert restored.admit("User:alice", [500], now) == Admitted((500,), 0)
    layers = next(r for r in restored.export() if r.principal == "User:alice").layers
    assert layers[:3] == old_layers
    new = layers[3]
    assert new.shape.hash_count == 14 and new.shape.is_universal and new.inserted_count == 1
    # Saved again and reloaded: the same layers, the same PIDs known.
    reloaded, again = load_state(
        dump_state(restored, now), policy(default_producer_ids_rate=100), now
    )
    assert again.layers_reshaped == 4
    assert [r.layers for r in reloaded.export()] == [r.layers for r in restored.export()]
    for principal, pids in saved_pids.items():
        assert all(reloaded.is_known(principal, pid, now) for pid in pids)
    assert reloaded.is_known("User:alice", 500, now)


def test_mode_overrides_are_saved_and_applied_on_load() -> None:
    m, _ = throttled_manager()
    overrides = QuotaOverrides({"alice": 5}, modes={"alice": True, DEFAULT_USER: False})
    data = dump_state(m, T0 + 2000, overrides)
    assert data[8:10] == b"\x00\x04"  # format 4 carries modes
    restored, report = load_state(data, policy(), T0 + 2000)
    assert dict(report.overrides.modes) == {"alice": True, DEFAULT_USER: False}
    assert restored.policy.observes("User:alice")
    assert not restored.policy.observes("User:bob")
    # Mode overrides alone (no rate override) are kept too.
    only_modes, _ = load_state(
        dump_state(m, T0 + 2000, QuotaOverrides(modes={"bob": True})), policy(), T0 + 2000
    )
    assert only_modes.policy.observes("User:bob") and not only_modes.policy.observes("User:al")


def test_mode_overrides_apply_to_like_rates() -> None:
    base = policy(default_observe=True, user_observe={"alice": False, "bob": True})
    p = QuotaOverrides(modes={"alice": None, "carol": False}).apply_to(base)
    assert p.observes("User:alice")  # removed: follows the default user (observe)
    assert p.observes("User:bob")
    assert not p.observes("User:carol")
    enforced = QuotaOverrides(modes={DEFAULT_USER: None}).apply_to(base)
    assert not enforced.observes("User:dave")  # the default removed: enforce
    with pytest.raises(ValueError):
        QuotaOverrides(modes={"alice": 1})  # type: ignore[dict-item]
