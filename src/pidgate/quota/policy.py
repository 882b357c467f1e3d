"""The quota policy: an immutable, validated description of who may activate how many PIDs.

Owns KIP-936's configuration values (``producer_ids_rate`` per user and default,
``producer.id.quota.window.size.seconds`` as ``window_ms``, ``producer.id.quota.window.num``,
``producer.id.quota.cache.false.positive.rate``) plus pidgate's memory caps, the precedence
rule user → default → unlimited, and the enforcement mode (observe or enforce) with the same
precedence: user → default → enforce.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package (``pidgate.config`` builds a QuotaPolicy; quota never reads config).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["ENFORCE", "OBSERVE", "USER_PREFIX", "QuotaPolicy", "user_name"]

#: The two enforcement modes: decide and act, or decide, record and forward everything.
ENFORCE = "enforce"
OBSERVE = "observe"

USER_PREFIX = "User:"


def user_name(principal: str) -> str:
    """The quota key of a principal: ``"User:alice"`` → ``"alice"``; any other string (a name
    already stripped, or a non-User principal type) is its own key."""
    if principal.startswith(USER_PREFIX):
        return principal[len(USER_PREFIX) :]
    return principal


def _check_rate(what: str, rate: object) -> None:
    if isinstance(rate, bool) or not isinstance(rate, int):
        raise ValueError(f"{what} must be an integer, got {rate!r}")
    if rate < 0:
        raise ValueError(f"{what} must be >= 0 (0 allows no new producer IDs), got {rate}")


@dataclass(frozen=True)
class QuotaPolicy:
    """Everything the quota manager needs to decide; replace it whole to change quotas.

    ``user_producer_ids_rates`` is keyed by user *name* without the ``User:`` prefix, the way
    ``kafka-configs --entity-type users --entity-name alice`` and the CLI's
    ``--producer-ids-rate alice=5`` name it. It is copied into a read-only mapping.

    ``max_total_bits`` caps the sum of all Bloom layer bits (2**30 bits = 128 MiB). Layers are
    sized to what each principal writes (:mod:`pidgate.quota.layered`): ≈ 14.4 bits per item at
    p = 0.001 plus headroom and rounding to the size ladder, and an active PID has 2–3 copies
    alive, so ≈ 75–80 bits (10 B) per active PID at steady state (benchmarks/memory.py), plus
    48 B per layer and ≈ 0.5 KiB per principal of Python objects; ``max_principals`` bounds the
    latter for idle principals.
    ``min_layer_items`` is the smallest capacity of a new layer (16 items = 256 bits at
    p = 0.001; smaller only saves bits that the layer's own bookkeeping outweighs);
    ``max_layer_items`` bounds one layer (1M items ≈ 2 MiB at p = 0.001); principals that write
    more roll layers early on saturation.
    """

    window_ms: int = 3_600_000
    window_num: int = 11
    false_positive_rate: float = 0.001
    default_producer_ids_rate: int | None = None
    user_producer_ids_rates: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    max_principals: int = 100_000
    max_total_bits: int = 2**30
    min_layer_items: int = 16
    max_layer_items: int = 1_000_000
    #: How long after a principal's enforcement began PIDs the cluster allocated before then
    #: are admitted free (``quota.grandfather_grace_ms``); None: one layer's span,
    #: window_ms / window_num; 0 turns grandfathering off.
    grandfather_grace_ms: int | None = None
    #: Observe mode (decide and record, but forward everything): of the default user (None:
    #: not set, enforce) and per user name, the same keys as ``user_producer_ids_rates``.
    default_observe: bool | None = None
    user_observe: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if isinstance(self.window_num, bool) or self.window_num < 1:
            raise ValueError(f"window_num must be >= 1, got {self.window_num}")
        if self.window_ms < self.window_num:
            raise ValueError(
                f"window_ms ({self.window_ms}) must be >= window_num ({self.window_num}) "
                "so every layer spans at least 1 ms"
            )
        p = self.false_positive_rate
        if not (isinstance(p, float | int) and math.isfinite(p) and 0.0 < p < 1.0):
            raise ValueError(f"false_positive_rate must be strictly between 0 and 1, got {p!r}")
        if self.default_producer_ids_rate is not None:
            _check_rate("default_producer_ids_rate", self.default_producer_ids_rate)
        rates = dict(self.user_producer_ids_rates)
        for name, rate in rates.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"user names must be non-empty strings, got {name!r}")
            _check_rate(f"producer_ids_rate of user {name!r}", rate)
        object.__setattr__(self, "user_producer_ids_rates", MappingProxyType(rates))
        observe = dict(self.user_observe)
        for name, flag in observe.items():
            if not isinstance(name, str) or not name or not isinstance(flag, bool):
                raise ValueError(f"user_observe needs user names -> bool, got {name!r}: {flag!r}")
        object.__setattr__(self, "user_observe", MappingProxyType(observe))
        if self.max_principals < 1:
            raise ValueError(f"max_principals must be >= 1, got {self.max_principals}")
        if self.max_total_bits < 1:
            raise ValueError(f"max_total_bits must be >= 1, got {self.max_total_bits}")
        grace = self.grandfather_grace_ms
        if grace is not None and (
            isinstance(grace, bool) or not isinstance(grace, int) or grace < 0
        ):
            raise ValueError(f"grandfather_grace_ms must be None or an int >= 0, got {grace!r}")
        if self.min_layer_items < 1:
            raise ValueError(f"min_layer_items must be >= 1, got {self.min_layer_items}")
        if self.max_layer_items < self.min_layer_items:
            raise ValueError(
                f"max_layer_items ({self.max_layer_items}) must be >= "
                f"min_layer_items ({self.min_layer_items})"
            )
        # A layer has at most 2**32 bits (the state format's limit).
        if self.max_layer_items * -math.log(p) / math.log(2) ** 2 > 2**32:
            raise ValueError(
                f"max_layer_items ({self.max_layer_items}) needs layers of more than 2**32 bits "
                f"at false_positive_rate {p}"
            )

    @property
    def grace_ms(self) -> int:
        """The grandfathering grace period in force (see ``grandfather_grace_ms``)."""
        if self.grandfather_grace_ms is not None:
            return self.grandfather_grace_ms
        return self.window_ms // self.window_num

    def activates_any(self, previous: QuotaPolicy) -> bool:
        """Whether some principal unlimited under ``previous`` is limited under this policy
        (its enforcement begins with this change)."""
        if (
            previous.default_producer_ids_rate is None
            and self.default_producer_ids_rate is not None
        ):
            return True
        return any(previous.rate_for(user) is None for user in self.user_producer_ids_rates)

    def rate_for(self, principal: str) -> int | None:
        """New PIDs per window for ``principal``; None means unlimited.

        Precedence (KIP-936, like every Kafka client quota): the user's own rate, else the
        default user rate, else unlimited. ``"User:alice"`` is looked up as ``"alice"``
        (see :func:`user_name`); so ``--producer-ids-rate ANONYMOUS=5`` governs the
        ``User:ANONYMOUS`` principal of a PLAINTEXT listener.
        """
        rate = self.user_producer_ids_rates.get(user_name(principal))
        if rate is not None:
            return rate
        return self.default_producer_ids_rate

    def observes(self, principal: str) -> bool:
        """Whether ``principal``'s would-be throttles are only recorded (observe mode), its
        requests forwarded: the user's own mode, else the default user's, else enforce."""
        flag = self.user_observe.get(user_name(principal))
        if flag is not None:
            return flag
        return bool(self.default_observe)

    def mode_for(self, principal: str) -> str:
        """``"observe"`` or ``"enforce"`` for ``principal`` (see :meth:`observes`)."""
        return OBSERVE if self.observes(principal) else ENFORCE
