"""The quotas in force and how they change while pidgate runs.

Effective ``producer_ids_rate`` per user = the config file's ``quota.users`` overlaid with
runtime overrides (AlterClientQuotas / kafka-configs, or another pidgate through the shared
store). An override of ``None`` removes the user's quota, as ``--delete-config`` does. Overrides
win over the file, also after a SIGHUP reload of the file (Kafka's dynamic configs win over
static ones too). Every change reaches the quota manager at once, so it applies to open
connections on the next new PID. The enforcement mode (``producer_ids_observe``: observe or
enforce, proxy/quota_control/observe.py) is overlaid the same way over ``quota.mode`` and
``quota.users.<name>.mode``; mode overrides are saved with the rate overrides (state.path)
but not shared through the shared store.

Owns: ``QuotaControl`` (policy building, overrides, /state view). The quota manager itself is
pure (``pidgate.quota``); persistence and the shared store plug in through callbacks. Must not
import ``serving``, ``operations``, the server, nor the shared store or the fleet (they plug
in through ``listeners`` and ``on_enforcement_began``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from pidgate.config import DEFAULT_USER_ENTITY, Settings
from pidgate.protocol.client_quotas.entities import PRODUCER_IDS_OBSERVE, QuotaChange
from pidgate.proxy.logs import get_logger
from pidgate.proxy.quota_control.quota_admin import EffectiveQuotas, entity_key
from pidgate.proxy.quota_control.state_file import load_or_start_clean, write_state_atomically
from pidgate.quota.grandfather import Enforcement
from pidgate.quota.manager import QuotaManager
from pidgate.quota.policy import ENFORCE, OBSERVE, QuotaPolicy, user_name
from pidgate.quota.policy_from_rates import policy_from_rates
from pidgate.quota.state.encode import (
    assemble_state,
    encode_principals,
    encode_state,
    snapshot_state,
)
from pidgate.quota.state.format import StateSnapshot
from pidgate.quota.state.run_time_overrides import QuotaOverrides

#: Called after overrides changed locally: (user key, rate or None). The shared store publishes.
OverrideListener = Callable[[str, int | None], None]
#: Called when a policy change began some principal's enforcement (unlimited -> limited): the
#: server probes the PID frontier and resolves it.
EnforcementListener = Callable[[Enforcement], None]


class QuotaControl:
    def __init__(
        self,
        settings: Settings,
        now_ms: Callable[[], int],
        manager: QuotaManager | None = None,
        overrides: Mapping[str, int | None] | None = None,
        mode_overrides: Mapping[str, bool | None] | None = None,
    ) -> None:
        self._settings = settings
        self._now_ms = now_ms
        self.overrides: dict[str, int | None] = dict(overrides or {})
        #: producer_ids_observe set at run time: True observe, False enforce, None removed.
        self.mode_overrides: dict[str, bool | None] = dict(mode_overrides or {})
        self.manager = manager or QuotaManager(self.policy())
        if manager is not None:
            self.manager.update_policy(self.policy(), now_ms())
        self.listeners: list[OverrideListener] = []
        self.on_enforcement_began: EnforcementListener | None = None
        #: Called after any policy change (raised, lowered, removed, reloaded): held requests
        #: are asked again at once, so a raised quota relieves them (waiting_room.py).
        self.on_policy_changed: list[Callable[[], None]] = []
        self.changes_applied = 0

    @property
    def settings(self) -> Settings:
        return self._settings

    def now(self) -> int:
        return self._now_ms()

    def effective_rates(self) -> EffectiveQuotas:
        """user key ("<default>" or a name) -> producer_ids_rate in force; its ``observe``:
        user key -> producer_ids_observe set (file or override)."""
        rates = {
            user: quota.producer_ids_rate
            for user, quota in self._settings.quota.users.items()
            if quota.producer_ids_rate is not None
        }
        for user, rate in self.overrides.items():
            if rate is None:
                rates.pop(user, None)
            else:
                rates[user] = rate
        return EffectiveQuotas(rates, observe=self.effective_modes())

    def effective_modes(self) -> dict[str, bool]:
        """user key ("<default>" or a name) -> True (observe) / False (enforce), where set."""
        quota = self._settings.quota
        modes = dict(quota.user_observe)
        if quota.default_observe is not None:
            modes[DEFAULT_USER_ENTITY] = quota.default_observe
        for user, observe in self.mode_overrides.items():
            if observe is None:
                modes.pop(user, None)
            else:
                modes[user] = observe
        return modes

    def _update_policy(self) -> None:
        began = self.manager.update_policy(self.policy(), self._now_ms())
        if began is not None and self.on_enforcement_began is not None:
            self.on_enforcement_began(began)
        for listener in self.on_policy_changed:
            listener()

    def policy(self) -> QuotaPolicy:
        quota = self._settings.quota
        return policy_from_rates(
            quota,
            self.effective_rates(),
            default_user=DEFAULT_USER_ENTITY,
            grandfather_grace_ms=quota.grandfather_grace_ms,
            observe=self.effective_modes(),
        )

    def apply_changes(
        self, changes: list[tuple[int, QuotaChange]]
    ) -> dict[int, tuple[int, str | None]]:
        """Apply AlterClientQuotas changes (already validated). Returns failures per index."""
        if not changes:
            return {}
        for _, change in changes:
            user = entity_key(change.entity)
            if change.key == PRODUCER_IDS_OBSERVE:
                observe = change.observe
                self.mode_overrides[user] = observe
                mode = None if observe is None else OBSERVE if observe else ENFORCE
                get_logger().info("quota_mode_changed", user=user, mode=mode)
            else:
                self.overrides[user] = change.rate
        self._update_policy()
        self.changes_applied += len(changes)
        for _, change in changes:
            if change.key == PRODUCER_IDS_OBSERVE:
                continue  # modes are not shared through the shared store
            for listener in self.listeners:
                listener(entity_key(change.entity), change.rate)
        return {}

    def apply_remote(self, user: str, rate: int | None) -> bool:
        """An override learned from another pidgate (shared store). True when it changed."""
        if user in self.overrides and self.overrides[user] == rate:
            return False
        self.overrides[user] = rate
        self._update_policy()
        return True

    def reload(self, settings: Settings) -> None:
        """A new config file (SIGHUP): its quotas, under the runtime overrides."""
        self._settings = settings
        self._update_policy()

    def state(self) -> dict[str, Any]:
        """Read-only view for /state: quotas in force, principals, layers, memory."""
        now_ms = self._now_ms()
        policy = self.manager.policy
        principals = [
            {
                "principal": p.principal,
                "user": user_name(p.principal),
                "mode": policy.mode_for(p.principal),
                "would_reject_requests": p.would_reject_requests,
                "would_reject_producer_ids": p.would_reject_producer_ids,
                "producer_ids_rate": p.producer_ids_rate,
                "tokens": round(p.tokens, 3),
                "layers": p.layer_count,
                "bits": p.bits,
                "estimated_false_positive_rate": p.estimated_false_positive_rate,
                "grandfather_mode": p.grandfather_mode,
                "frontier": p.frontier,
                "enforcement_began_ms": p.enforcement_began_ms,
                "grandfather_reason": p.grandfather_reason,
            }
            for p in self.manager.snapshot(now_ms)
        ]
        quota = self._settings.quota
        modes = self.effective_modes()
        return {
            "quotas": {
                # The mode of users without one of their own (users.<default>, quota.mode).
                "mode": OBSERVE if modes.get(DEFAULT_USER_ENTITY) else ENFORCE,
                "producer_ids_rate": dict(self.effective_rates()),
                "producer_ids_observe": modes,
                "overrides": self.overrides,
                "mode_overrides": self.mode_overrides,
                "window_seconds": quota.window_size_seconds,
                "window_num": quota.window_num,
                "false_positive_rate": quota.false_positive_rate,
            },
            "principals": principals,
            "grandfather": {
                "grace_ms": self.manager.policy.grace_ms,
                # Moments enforcement began for principals without state (start, changes).
                "enforcements": [
                    {
                        "began_ms": e.began_ms,
                        "mode": e.mode_at(now_ms),
                        "frontier": e.frontier,
                        "reason": e.reason,
                        "grace_ends_ms": e.grace_ends_ms,
                    }
                    for e in self.manager.enforcements()
                ],
                "grandfathered_producer_ids": self.manager.grandfathered_count,
            },
            "memory": {
                "principals_tracked": self.manager.principal_count,
                "principals_evicted": self.manager.evicted_principal_count,
                "bloom_bits": self.manager.total_bits,
                "bloom_bytes": self.manager.total_bits // 8,
                "max_principals": quota.max_principals,
                "max_total_bits": quota.max_total_bits,
            },
        }


def open_quota_control(settings: Settings, now_ms: Callable[[], int]) -> QuotaControl:
    """A QuotaControl with the state saved in ``state.path`` (when configured): overrides,
    buckets and known PIDs as they were; a missing or corrupt file starts clean, warned."""
    control = QuotaControl(settings, now_ms)
    path = settings.state.path
    if path is None:
        return control
    base_policy = control.policy()  # no overrides yet: load_state layers the saved ones on top
    manager, overrides = load_or_start_clean(path, base_policy, now_ms(), get_logger())
    return QuotaControl(
        settings, now_ms, manager=manager, overrides=dict(overrides), mode_overrides=overrides.modes
    )


def snapshot_for_saving(control: QuotaControl) -> StateSnapshot:
    """The fast half of saving: a copy of the state, taken on the event loop."""
    return snapshot_state(control.manager, control.now(), _overrides(control))


def _overrides(control: QuotaControl) -> QuotaOverrides:
    return QuotaOverrides(control.overrides, control.mode_overrides)


@dataclass(frozen=True, slots=True)
class EncodedSave:
    """A save made on the event loop a step at a time (``encode_for_saving_in_steps``): the
    principals encoded; ``write_encoded`` assembles, compresses and writes them."""

    dumped_at_ms: int
    overrides: QuotaOverrides
    principal_count: int
    principals: bytes


def encode_for_saving_in_steps(
    control: QuotaControl, step_principals: int
) -> Generator[None, None, EncodedSave]:
    """The periodic save's part on the event loop, cut into steps of ``step_principals``
    principals (yielding between them): each step's principals are copied whole and encoded
    at once, so their copies never pile up (100k principals' copies held to the end set off a
    full garbage collection). Dated when its last step is taken: no record is newer than it."""
    parts: list[bytes] = []
    count = 0
    for step in control.manager.export_in_steps(step_principals):
        parts.append(encode_principals(step))
        count += len(step)
        yield
    return EncodedSave(control.now(), _overrides(control), count, b"".join(parts))


def write_encoded(save: EncodedSave, settings: Settings) -> None:
    """The slow half of the periodic save (compress + fsync): fine in a worker thread."""
    assert settings.state.path is not None
    state = assemble_state(save.dumped_at_ms, save.overrides, save.principal_count, save.principals)
    write_state_atomically(settings.state.path, state)


def write_snapshot(snapshot: StateSnapshot, settings: Settings) -> None:
    """The slow half (encode + fsync): fine in a worker thread."""
    assert settings.state.path is not None
    write_state_atomically(settings.state.path, encode_state(snapshot))
