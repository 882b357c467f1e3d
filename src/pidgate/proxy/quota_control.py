"""The quotas in force and how they change while pidgate runs.

Effective ``producer_ids_rate`` per user = the config file's ``quota.users`` overlaid with
runtime overrides (AlterClientQuotas / kafka-configs, or another pidgate through the shared
store). An override of ``None`` removes the user's quota, as ``--delete-config`` does. Overrides
win over the file, also after a SIGHUP reload of the file (Kafka's dynamic configs win over
static ones too). Every change reaches the quota manager at once, so it applies to open
connections on the next new PID.

Owns: ``QuotaControl`` (policy building, overrides, /state view). The quota manager itself is
pure (``pidgate.quota``); persistence and the shared store plug in through callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any

from pidgate.config import DEFAULT_USER_ENTITY, Settings
from pidgate.protocol.client_quotas import QuotaChange
from pidgate.proxy.logs import get_logger
from pidgate.proxy.quota_admin import entity_key
from pidgate.proxy.state_file import load_or_start_clean, write_state_atomically
from pidgate.quota.grandfather import Enforcement
from pidgate.quota.manager import QuotaManager
from pidgate.quota.persistence import (
    QuotaOverrides,
    StateSnapshot,
    assemble_state,
    encode_principals,
    encode_state,
    snapshot_state,
)
from pidgate.quota.policy import QuotaPolicy

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
    ) -> None:
        self._settings = settings
        self._now_ms = now_ms
        self.overrides: dict[str, int | None] = dict(overrides or {})
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

    def effective_rates(self) -> dict[str, int]:
        """user key ("<default>" or a name) -> producer_ids_rate in force."""
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
        return rates

    def _update_policy(self) -> None:
        began = self.manager.update_policy(self.policy(), self._now_ms())
        if began is not None and self.on_enforcement_began is not None:
            self.on_enforcement_began(began)
        for listener in self.on_policy_changed:
            listener()

    def policy(self) -> QuotaPolicy:
        quota = self._settings.quota
        rates = self.effective_rates()
        default = rates.pop(DEFAULT_USER_ENTITY, None)
        return QuotaPolicy(
            window_ms=quota.window_ms,
            window_num=quota.window_num,
            false_positive_rate=quota.false_positive_rate,
            default_producer_ids_rate=default,
            user_producer_ids_rates=rates,
            max_principals=quota.max_principals,
            max_total_bits=quota.max_total_bits,
            grandfather_grace_ms=quota.grandfather_grace_ms,
        )

    def apply_changes(
        self, changes: list[tuple[int, QuotaChange]]
    ) -> dict[int, tuple[int, str | None]]:
        """Apply AlterClientQuotas changes (already validated). Returns failures per index."""
        if not changes:
            return {}
        for _, change in changes:
            user = entity_key(change.entity)
            self.overrides[user] = change.rate
        self._update_policy()
        self.changes_applied += len(changes)
        for _, change in changes:
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
        principals = [
            {
                "principal": p.principal,
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
        return {
            "quotas": {
                "producer_ids_rate": self.effective_rates(),
                "overrides": self.overrides,
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
    return QuotaControl(settings, now_ms, manager=manager, overrides=dict(overrides))


def snapshot_for_saving(control: QuotaControl) -> StateSnapshot:
    """The fast half of saving: a copy of the state, taken on the event loop."""
    return snapshot_state(control.manager, control.now(), QuotaOverrides(control.overrides))


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
    return EncodedSave(control.now(), QuotaOverrides(control.overrides), count, b"".join(parts))


def write_encoded(save: EncodedSave, settings: Settings) -> None:
    """The slow half of the periodic save (compress + fsync): fine in a worker thread."""
    assert settings.state.path is not None
    state = assemble_state(save.dumped_at_ms, save.overrides, save.principal_count, save.principals)
    write_state_atomically(settings.state.path, state)


def write_snapshot(snapshot: StateSnapshot, settings: Settings) -> None:
    """The slow half (encode + fsync): fine in a worker thread."""
    assert settings.state.path is not None
    write_state_atomically(settings.state.path, encode_state(snapshot))
