"""``producer_ids_rate`` and ``producer_ids_observe`` set at run time (AlterClientQuotas), as
saved with the quota state and laid over the configuration's policy.

Owns :class:`QuotaOverrides` and :data:`DEFAULT_USER`. Must not import: asyncio, socket, time,
logging, structlog, prometheus_client, or any pidgate package outside ``pidgate.quota``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import TypeVar

from ..policy import QuotaPolicy

__all__ = ["DEFAULT_USER", "QuotaOverrides"]

DEFAULT_USER = "<default>"  # the user-default entity, as kafka-configs prints it

_V = TypeVar("_V")


def _check_override(user: object, rate: object) -> None:
    if not isinstance(user, str) or not user:
        raise ValueError(f"override users must be non-empty strings, got {user!r}")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 0):
        raise ValueError(f"producer_ids_rate override of {user!r} must be None or an int >= 0")


class QuotaOverrides(Mapping[str, int | None]):
    """``producer_ids_rate`` set at run time (AlterClientQuotas), keyed like
    ``QuotaPolicy.user_producer_ids_rates`` by user name, with :data:`DEFAULT_USER` for the
    user-default entity. A value of None records that the entity's rate was *removed*: the user
    falls back to the default rate (for :data:`DEFAULT_USER`: users without their own rate are
    unlimited), whatever the configuration file says. Immutable; overrides win over the file.

    ``modes``: ``producer_ids_observe`` set at run time, keyed the same way: True observe,
    False enforce, None removed (the user falls back to the default user's mode, the default
    user to enforce). Not part of the mapping (it maps rates)."""

    __slots__ = ("_rates", "modes")

    def __init__(
        self,
        rates: Mapping[str, int | None] | Iterable[tuple[str, int | None]] = (),
        modes: Mapping[str, bool | None] | None = None,
    ) -> None:
        items = dict(rates)
        for user, rate in items.items():
            _check_override(user, rate)
        self._rates: Mapping[str, int | None] = MappingProxyType(items)
        mode_items = dict(modes or {})
        for user, observe in mode_items.items():
            if not isinstance(user, str) or not user or not isinstance(observe, bool | None):
                raise ValueError(f"mode override of {user!r} must be True, False or None")
        self.modes: Mapping[str, bool | None] = MappingProxyType(mode_items)

    def __getitem__(self, user: str) -> int | None:
        return self._rates[user]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __hash__(self) -> int:
        return hash((frozenset(self._rates.items()), frozenset(self.modes.items())))

    def __repr__(self) -> str:
        if self.modes:
            return f"QuotaOverrides({dict(self._rates)!r}, modes={dict(self.modes)!r})"
        return f"QuotaOverrides({dict(self._rates)!r})"

    def with_rate(self, user: str, rate: int | None) -> QuotaOverrides:
        """These overrides with ``user``'s rate set (None: removed)."""
        return QuotaOverrides({**self._rates, user: rate}, self.modes)

    def apply_to(self, policy: QuotaPolicy) -> QuotaPolicy:
        """``policy`` (from the configuration) with these overrides on top."""
        if self.modes:
            default_observe, user_observe = _overlay(
                policy.default_observe, policy.user_observe, self.modes
            )
            policy = replace(policy, default_observe=default_observe, user_observe=user_observe)
        if not self._rates:
            return policy
        default, users = _overlay(
            policy.default_producer_ids_rate, policy.user_producer_ids_rates, self._rates
        )
        return replace(policy, default_producer_ids_rate=default, user_producer_ids_rates=users)


def _overlay(
    default: _V | None, users: Mapping[str, _V], overrides: Mapping[str, _V | None]
) -> tuple[_V | None, dict[str, _V]]:
    """(default, per-user values) of a policy setting with ``overrides`` on top: the
    :data:`DEFAULT_USER` entry replaces the default, None removes a user's own value."""
    users = dict(users)
    for user, value in overrides.items():
        if user == DEFAULT_USER:
            default = value
        elif value is None:
            users.pop(user, None)
        else:
            users[user] = value
    return default, users
