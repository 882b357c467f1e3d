"""Loading the quota state: a manager holding what was saved, fitted to the policy in force now.

Owns ``load_state`` and :class:`LoadReport` (what it kept and dropped, for the startup log
line). Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any
pidgate package outside ``pidgate.quota``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..layer_plan import LayerPlan
from ..manager import QuotaManager
from ..policy import QuotaPolicy
from ..principal_table import PrincipalRecord
from .decode import decode_state
from .format import StateFormatError
from .run_time_overrides import QuotaOverrides

__all__ = ["LoadReport", "load_state"]


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What :func:`load_state` kept and dropped, for the startup log line."""

    dumped_at_ms: int
    overrides: QuotaOverrides = field(default_factory=QuotaOverrides)
    principals_saved: int = 0
    principals_restored: int = 0
    layers_restored: int = 0
    layers_expired: int = 0
    principals_unlimited: int = 0  # dropped: unlimited under the current policy
    principals_idle: int = 0  # dropped: no live layer left and a full bucket (as expire())
    #: Principals / layers kept in a shape the current policy would not build (saved under
    #: another false-positive rate, or by a version before 3): read in their own shape as
    #: before, never written again; new layers get the current policy's shape.
    principals_reshaped: int = 0
    layers_reshaped: int = 0
    principals_evicted: int = 0  # dropped to honour max_principals / max_total_bits


def load_state(
    data: bytes, policy: QuotaPolicy, now_ms: int, *, apply_overrides: bool = True
) -> tuple[QuotaManager, LoadReport]:
    """A manager holding the state in ``data``, fitted to the policy in force at ``now_ms``.

    The policy in force is ``policy`` (from the configuration) with the saved overrides on top
    (``apply_overrides=False``: ``policy`` alone); it is the returned manager's policy, and the
    overrides are in the report. Per saved principal, idlest first:

    * unlimited now → dropped (the manager does not track unlimited principals);
    * the bucket, as it stood when saved, is put under the current rate and window (tokens
      kept, clamped to the new capacity, as ``update_policy`` does), then refilled at the
      current rate up to ``now_ms`` (a clock that stepped back refills nothing);
    * layers whose last write is a full current window before ``now_ms`` are dropped;
    * every other layer is kept in its own shape, so known PIDs stay known; layers in a shape
      the current policy would not build (another false-positive rate, or saved by a format
      before 3) are counted as *reshaped*: they are read, touched and expire as usual but are
      never written again (new layers get the current shape);
    * no layer left and a full bucket → dropped (exactly what ``expire()`` would forget);
    * then the caps are enforced, evicting the idlest.

    Raises :class:`StateFormatError` if ``data`` is not a complete, intact state.
    """
    snapshot = decode_state(data)
    effective = snapshot.overrides.apply_to(policy) if apply_overrides else policy
    manager = QuotaManager(effective)
    records: list[PrincipalRecord] = []
    expired = unlimited = idle = reshaped = layers_reshaped = 0
    dead_before = now_ms - effective.window_ms
    # k of the layers the current policy builds (each layer's share of the false-positive
    # rate depends on the window too: see pidgate.quota.layered).
    hash_count = LayerPlan(
        effective.window_ms, effective.window_num, effective.false_positive_rate
    ).hash_count
    for record in snapshot.principals:
        rate = effective.rate_for(record.principal)
        if rate is None:
            unlimited += 1
            continue
        bucket = (
            record.bucket.refill(snapshot.dumped_at_ms)
            .with_rate(rate, effective.window_ms)
            .refill(now_ms)
        )
        layers = tuple(layer for layer in record.layers if layer.last_write_ms > dead_before)
        expired += len(record.layers) - len(layers)
        # Keep every layer in its saved shape: positions come from the layer's own shape, as
        # at run time; dropping them would make every known PID look new (and charge for it).
        foreign = sum(
            1
            for layer in layers
            if not layer.shape.is_universal or layer.shape.hash_count != hash_count
        )
        if foreign:
            reshaped += 1
            layers_reshaped += foreign
        if not layers and bucket.is_full(now_ms):
            idle += 1
            continue
        records.append(PrincipalRecord(record.principal, bucket, layers, record.enforcement))
    try:
        evicted = manager.restore(records)
    except ValueError as exc:
        raise StateFormatError(f"inconsistent state: {exc}") from None
    return manager, LoadReport(
        dumped_at_ms=snapshot.dumped_at_ms,
        overrides=snapshot.overrides,
        principals_saved=len(snapshot.principals),
        principals_restored=manager.principal_count,
        # Eviction pops the idlest first, which are the first records restored.
        layers_restored=sum(len(record.layers) for record in records[evicted:]),
        layers_expired=expired,
        principals_unlimited=unlimited,
        principals_idle=idle,
        principals_reshaped=reshaped,
        layers_reshaped=layers_reshaped,
        principals_evicted=evicted,
    )
