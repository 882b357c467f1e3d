"""A ``QuotaPolicy`` from a quota section's sizing and the rates (and modes) keyed by user, the
default user's entry under its own key: the one way the proxy (``QuotaControl.policy``) and the
backtest (``policy_from_settings``) turn configured quotas into a policy.

Owns: ``QuotaSizing`` and ``policy_from_rates``. Pure: takes the sizing as any object with the
five fields (``pidgate.config.QuotaSettings`` has them), so it must not import
``pidgate.config`` (quota never reads config), nor asyncio, socket, time, logging, structlog,
prometheus_client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pidgate.quota.policy import QuotaPolicy

__all__ = ["QuotaSizing", "policy_from_rates"]


class QuotaSizing(Protocol):
    """The window and memory settings of a quota section (``quota.*`` in the config file)."""

    @property
    def window_ms(self) -> int:
        """KIP-936's window (``producer.id.quota.window.size.seconds``), in ms."""

    @property
    def window_num(self) -> int:
        """Layers per window (``producer.id.quota.window.num``)."""

    @property
    def false_positive_rate(self) -> float:
        """Of each layer (``producer.id.quota.cache.false.positive.rate``)."""

    @property
    def max_principals(self) -> int:
        """Principals tracked at most."""

    @property
    def max_total_bits(self) -> int:
        """Bloom bits of all layers together at most."""


def policy_from_rates(
    sizing: QuotaSizing,
    rates: Mapping[str, int],
    *,
    default_user: str,
    grandfather_grace_ms: int | None = None,
    observe: Mapping[str, bool] | None = None,
) -> QuotaPolicy:
    """``rates`` and ``observe`` are keyed by user name, the default user's under
    ``default_user``; ``observe`` None: no mode set anywhere (enforce)."""
    user_rates = dict(rates)
    default_rate = user_rates.pop(default_user, None)
    user_observe = dict(observe or {})
    default_observe = user_observe.pop(default_user, None)
    return QuotaPolicy(
        window_ms=sizing.window_ms,
        window_num=sizing.window_num,
        false_positive_rate=sizing.false_positive_rate,
        default_producer_ids_rate=default_rate,
        user_producer_ids_rates=user_rates,
        max_principals=sizing.max_principals,
        max_total_bits=sizing.max_total_bits,
        grandfather_grace_ms=grandfather_grace_ms,
        default_observe=default_observe,
        user_observe=user_observe,
    )
