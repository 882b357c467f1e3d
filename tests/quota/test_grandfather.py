"""Grandfathering (issue 11): PIDs the cluster allocated before a principal's enforcement began
are admitted free during the grace period; everything else is charged as before. Pure: no
sockets, time is a parameter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pidgate.quota import Admitted, QuotaManager, QuotaPolicy, Rejected
from pidgate.quota.grandfather import FRONTIER, LEARNING, OFF, PENDING, Enforcement
from pidgate.quota.state.decode import decode_state
from pidgate.quota.state.encode import dump_state
from pidgate.quota.state.load import load_state

WINDOW_MS = 11_000  # 11 layers of 1 s: default grace = 1 s
T0 = 1_700_000_000_000
USER = "User:alice"


def policy(rate: int | None = 2, **kw: object) -> QuotaPolicy:
    rates = {} if rate is None else {"alice": rate}
    return QuotaPolicy(window_ms=WINDOW_MS, window_num=11, user_producer_ids_rates=rates, **kw)  # type: ignore[arg-type]


def started(frontier: int | None, rate: int | None = 2, **kw: object) -> QuotaManager:
    manager = QuotaManager(policy(rate, **kw))
    manager.begin_enforcement(T0).resolve(frontier, "probed" if frontier else "probe failed")
    return manager


def test_default_grace_is_one_layer_span_and_zero_turns_it_off() -> None:
    assert policy().grace_ms == 1000
    assert policy(grandfather_grace_ms=0).grace_ms == 0
    manager = started(1000, grandfather_grace_ms=0)
    assert isinstance(manager.admit(USER, [1, 2, 3], T0), Rejected)


def test_at_start_six_old_producers_pass_free_and_new_ones_are_held_to_the_quota() -> None:
    manager = started(frontier=1000, rate=2)
    for pid in range(100, 106):  # six producers allocated before the probe
        decision = manager.admit(USER, [pid], T0 + 10)
        assert decision == Admitted((), 0, grandfathered_producer_ids=(pid,))
    # They stay known after the grace period: still no tokens (touched while their layer is
    # under half a window old, re-added after that).
    assert manager.admit(USER, [100], T0 + 5_000) == Admitted((), 0)
    assert manager.admit(USER, [100], T0 + 6_000) == Admitted((), 1)
    # A storm of PIDs allocated after the probe: exactly the quota's 2, then rejections.
    decisions = [manager.admit(USER, [1000 + i], T0 + 20) for i in range(5)]
    assert [type(d) for d in decisions] == [Admitted, Admitted, Rejected, Rejected, Rejected]
    assert decisions[0] == Admitted((1000,), 0)
    assert manager.grandfathered_count == 6


def test_an_unseen_pid_below_the_frontier_after_the_grace_is_charged() -> None:
    manager = started(frontier=1000, rate=1)
    after_grace = T0 + 1000
    assert manager.admit(USER, [5], after_grace) == Admitted((5,), 0)  # took the only token
    forged = manager.admit(USER, [6], after_grace)
    assert isinstance(forged, Rejected) and forged.unknown_producer_ids == (6,)


def test_a_rejected_request_records_nothing_and_a_throttled_pid_never_becomes_free() -> None:
    manager = started(frontier=1000, rate=1)
    assert manager.admit(USER, [1000], T0) == Admitted((1000,), 0)
    rejected = manager.admit(USER, [1001], T0 + 1)
    assert isinstance(rejected, Rejected)
    # The frontier does not move: a later policy change for someone else, and time inside
    # the grace, leave 1001 charged.
    manager.update_policy(policy(1, default_producer_ids_rate=5), T0 + 2)
    assert isinstance(manager.admit(USER, [1001], T0 + 3), Rejected)


def test_learning_mode_admits_every_unknown_pid_during_the_grace_only() -> None:
    manager = started(frontier=None, rate=0)
    assert manager.admit(USER, [1, 99_999], T0 + 999) == Admitted(
        (), 0, grandfathered_producer_ids=(1, 99_999)
    )
    assert isinstance(manager.admit(USER, [7], T0 + 1000), Rejected)
    (state,) = manager.snapshot(T0 + 500)
    assert (state.grandfather_mode, state.frontier) == (LEARNING, None)
    assert state.grandfather_reason == "probe failed"
    assert manager.snapshot(T0 + 1000)[0].grandfather_mode == OFF


def test_pending_enforcement_learns_until_resolved_and_then_the_frontier_applies() -> None:
    manager = QuotaManager(policy(0))
    enforcement = manager.begin_enforcement(T0)
    assert enforcement.mode == PENDING
    assert manager.admit(USER, [5000], T0) == Admitted((), 0, grandfathered_producer_ids=(5000,))
    enforcement.resolve(100, "probed")
    assert isinstance(manager.admit(USER, [4000], T0 + 1), Rejected)
    assert manager.admit(USER, [50], T0 + 1) == Admitted((), 0, grandfathered_producer_ids=(50,))
    enforcement.resolve(10**9, "a second answer")  # once only
    assert enforcement.frontier == 100


def test_unlimited_to_limited_begins_enforcement_at_that_moment() -> None:
    manager = started(frontier=10, rate=None)  # alice unlimited at start
    assert manager.admit(USER, [500], T0 + 1) == Admitted((), 0, tracked=False)
    activated = manager.update_policy(policy(rate=1), T0 + 60_000)
    assert activated is not None and activated.began_ms == T0 + 60_000
    activated.resolve(1000, "probed")
    # 500 predates the activation's frontier: free, though the start frontier was 10.
    got = manager.admit(USER, [500], T0 + 60_001)
    assert got == Admitted((), 0, grandfathered_producer_ids=(500,))
    assert manager.admit(USER, [1000], T0 + 60_002) == Admitted((1000,), 0)
    assert isinstance(manager.admit(USER, [1001], T0 + 60_003), Rejected)


def test_a_change_that_limits_nobody_new_begins_nothing() -> None:
    manager = started(frontier=10, rate=1)
    assert manager.update_policy(policy(rate=5), T0 + 1) is None
    assert manager.update_policy(policy(rate=None), T0 + 2) is None


def test_a_user_limited_before_the_change_keeps_its_own_beginning() -> None:
    manager = started(frontier=10, rate=None, default_producer_ids_rate=1)
    bob_limited = QuotaPolicy(
        window_ms=WINDOW_MS,
        window_num=11,
        default_producer_ids_rate=1,
        user_producer_ids_rates={"bob": 3},
    )
    activated = manager.update_policy(bob_limited, T0 + 100)
    assert activated is None  # bob was limited by the default already
    # Alice's enforcement began at the start (frontier 10): 500 is charged, 5 is free.
    assert manager.admit(USER, [5], T0 + 200) == Admitted((), 0, grandfathered_producer_ids=(5,))
    assert manager.admit(USER, [500], T0 + 200) == Admitted((500,), 0)


def test_an_evicted_principal_keeps_its_frontier_with_a_new_grace() -> None:
    manager = started(frontier=1000, rate=1, max_principals=1, default_producer_ids_rate=1)
    assert manager.admit(USER, [10], T0) == Admitted((), 0, grandfathered_producer_ids=(10,))
    assert manager.admit("User:bob", [2000], T0 + 5000) == Admitted((2000,), 0)  # evicts alice
    assert manager.evicted_principal_count == 1
    # Alice's old producer passes free again (its frontier kept, grace from the eviction) ...
    got = manager.admit(USER, [10], T0 + 5500)
    assert got == Admitted((), 0, grandfathered_producer_ids=(10,))
    # ... and a PID above her frontier is charged (bucket restarted full: 1 token, then none).
    assert manager.admit(USER, [1500], T0 + 5500) == Admitted((1500,), 0)
    assert isinstance(manager.admit(USER, [1501], T0 + 5500), Rejected)


def test_pre_enforcement_pids_pass_free_for_the_backtest_replay() -> None:
    manager = QuotaManager(policy(0))  # no enforcement recorded: nothing grandfathered by itself
    assert isinstance(manager.admit(USER, [7], T0), Rejected)
    got = manager.admit(USER, [7], T0, pre_enforcement=[7])
    assert got == Admitted((), 0, grandfathered_producer_ids=(7,))
    assert manager.admit(USER, [7], T0 + 1) == Admitted((), 0)


def test_enforcement_survives_a_restart_through_the_state_file() -> None:
    manager = started(frontier=1000, rate=1)
    assert manager.admit(USER, [1000], T0) == Admitted((1000,), 0)
    data = dump_state(manager, T0 + 10)
    restored, _ = load_state(data, policy(1), T0 + 20)
    (state,) = restored.snapshot(T0 + 20)
    assert (state.grandfather_mode, state.frontier, state.enforcement_began_ms) == (
        FRONTIER,
        1000,
        T0,
    )
    assert restored.admit(USER, [999], T0 + 30) == Admitted(
        (), 0, grandfathered_producer_ids=(999,)
    )
    assert isinstance(restored.admit(USER, [1001], T0 + 30), Rejected)


def test_a_pending_enforcement_saved_loads_as_learning() -> None:
    manager = QuotaManager(policy(1))
    manager.begin_enforcement(T0)
    manager.admit(USER, [3], T0)
    (record,) = decode_state(dump_state(manager, T0)).principals
    assert record.enforcement == Enforcement(
        T0, 1000, LEARNING, None, "restarted before the frontier probe answered"
    )


def test_a_version_1_state_file_still_loads(tmp_path: Path) -> None:
    """Writes a state with the previous release's persistence module (from git history) and
    loads it with this one."""
    repo = Path(__file__).resolve().parents[2]
    old = tmp_path / "old"
    (old / "pidgate").mkdir(parents=True)
    try:
        for name in ("__init__", "bloom", "bucket", "layered", "manager", "policy", "persistence"):
            source = subprocess.run(
                ["git", "show", f"6f0f957:src/pidgate/quota/{name}.py"],
                cwd=repo,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            (old / "pidgate" / f"{name}.py").write_text(source)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"git history not available: {error}")
    script = (
        "import sys; from pidgate.manager import QuotaManager; from pidgate.policy import "
        "QuotaPolicy; from pidgate.persistence import dump_state\n"
        "m = QuotaManager(QuotaPolicy(window_ms=11000, window_num=11, "
        "user_producer_ids_rates={'alice': 1}))\n"
        f"m.admit('User:alice', [42], {T0})\n"
        f"sys.stdout.buffer.write(dump_state(m, {T0}))\n"
    )
    data = subprocess.run(
        [sys.executable, "-c", script], cwd=old, check=True, capture_output=True
    ).stdout
    assert data[8:10] == b"\x00\x01"  # format version 1
    restored, report = load_state(data, policy(1), T0 + 1)
    assert report.principals_restored == 1
    assert restored.admit(USER, [42], T0 + 2) == Admitted((), 0)  # still known: no token
    assert restored.snapshot(T0 + 2)[0].grandfather_mode == OFF


def test_a_later_activation_wins_over_an_earlier_eviction() -> None:
    manager = started(frontier=1000, rate=1, max_principals=1, default_producer_ids_rate=1)
    assert manager.admit(USER, [10], T0) == Admitted((), 0, grandfathered_producer_ids=(10,))
    manager.admit("User:bob", [2000], T0 + 10)  # evicts alice (her frontier: 1000)
    unlimited = QuotaPolicy(
        window_ms=WINDOW_MS, window_num=11, max_principals=1, default_producer_ids_rate=None
    )
    assert manager.update_policy(unlimited, T0 + 20) is None
    activated = manager.update_policy(policy(rate=1, max_principals=1), T0 + 30)
    assert activated is not None
    activated.resolve(5000, "probed")
    # 3000 predates the activation's frontier: free, though above the evicted one's.
    assert manager.admit(USER, [3000], T0 + 40) == Admitted(
        (), 0, grandfathered_producer_ids=(3000,)
    )
