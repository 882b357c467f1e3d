"""The per-principal token bucket that budgets new producer IDs.

Owns the budget arithmetic: capacity ``rate`` tokens, refilled continuously at ``rate`` tokens
per ``window_ms``, starting full. KIP-599's burst rule (samples × window × rate) would allow
``window_num``× the quota at once; like DESIGN.md we cap the burst at one window's quota, which
is what KIP-936's own example (100 PIDs in one hour) expects.

Arithmetic is exact: the level is kept in *token·milliseconds* (tokens × window_ms), so a bucket
gains exactly ``rate`` units per millisecond and every comparison is an integer comparison.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package. Time is the ``now_ms`` parameter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["TokenBucket"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """Immutable bucket state; every operation returns a new bucket.

    ``level`` is in token·ms (tokens × ``window_ms``), ``updated_ms`` is the time it was
    last brought up to date. Time that runs backwards (``now_ms < updated_ms``) refills nothing.
    """

    rate: int
    window_ms: int
    level: int
    updated_ms: int

    def __post_init__(self) -> None:
        if self.rate < 0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")
        if self.window_ms < 1:
            raise ValueError(f"window_ms must be >= 1, got {self.window_ms}")
        if not -self.debt_limit_units <= self.level <= self.capacity_units:
            raise ValueError(
                f"level {self.level} outside [{-self.debt_limit_units}, {self.capacity_units}]"
            )

    @classmethod
    def full(cls, rate: int, window_ms: int, now_ms: int) -> TokenBucket:
        """A new bucket, full: a principal may activate ``rate`` PIDs at once."""
        return cls(rate=rate, window_ms=window_ms, level=rate * window_ms, updated_ms=now_ms)

    @property
    def capacity_units(self) -> int:
        return self.rate * self.window_ms

    @property
    def debt_limit_units(self) -> int:
        """How far below empty fleet debits may take the bucket (``debit``): ten windows'
        quota, a bound on the numbers only (a fleet repays a collision within a few tokens)."""
        return 10 * self.capacity_units

    def refill(self, now_ms: int) -> TokenBucket:
        """The bucket as it stands at ``now_ms``: ``rate`` units per elapsed ms, capped."""
        elapsed = now_ms - self.updated_ms
        if elapsed <= 0:
            return self
        level = min(self.capacity_units, self.level + elapsed * self.rate)
        return TokenBucket(self.rate, self.window_ms, level, now_ms)

    def is_full(self, now_ms: int) -> bool:
        return self.refill(now_ms).level >= self.capacity_units

    def tokens(self, now_ms: int) -> float:
        """Whole-and-fractional tokens at ``now_ms``, for metrics only (never for decisions)."""
        return self.refill(now_ms).level / self.window_ms

    def try_take(self, n: int, now_ms: int) -> TokenBucket | None:
        """The bucket after taking ``n`` tokens at ``now_ms``, or None if it holds fewer."""
        # refill() inlined: one bucket made per new PID, not two (every admitted new PID takes
        # a token here; issue #25's profile).
        rate, window_ms, level, updated_ms = self.rate, self.window_ms, self.level, self.updated_ms
        if now_ms > updated_ms:
            level = min(rate * window_ms, level + (now_ms - updated_ms) * rate)
            updated_ms = now_ms
        need = n * window_ms
        if need > level:
            return None
        if need == 0 and updated_ms == self.updated_ms:
            return self
        return TokenBucket(rate, window_ms, level - need, updated_ms)

    def debit(self, n: int, now_ms: int) -> TokenBucket:
        """The bucket after another fleet member took ``n`` tokens at ``now_ms``: never refused,
        and it may go below empty (a debt, bounded by ``debt_limit_units``). When members spend
        the same last tokens at once, each then debits the others' too, and the debt is repaid
        by refill before anyone admits again: the fleet's long-run rate stays the quota, and
        the overshoot is the tokens spent within one lag (proxy/quota_control/fleet.py). Persisted
        as empty
        (quota/state/): a restart forgets at most that much debt."""
        current = self.refill(now_ms)
        level = max(-self.debt_limit_units, current.level - n * self.window_ms)
        return TokenBucket(current.rate, current.window_ms, level, current.updated_ms)

    def time_until_available_ms(self, n: int, now_ms: int) -> int:
        """Milliseconds from ``now_ms`` until the bucket holds ``n`` tokens (0 if it does now),
        rounded up so that retrying after that long succeeds.

        A request for more tokens than the capacity can never pass; the answer is then the time
        until the bucket is full (0 if it already is), which is the most waiting can achieve.
        A rate of 0 never refills, so the answer is ``window_ms`` (a "not in this window" hint;
        callers cap it).
        """
        if n <= 0:
            return 0
        if self.rate == 0:
            return self.window_ms
        current = self.refill(now_ms)
        deficit = min(n, self.rate) * self.window_ms - current.level
        if deficit <= 0:
            return 0
        return _ceil_div(deficit, self.rate)

    def time_until_refilled_ms(self, n: int, now_ms: int) -> int:
        """Milliseconds from ``now_ms`` until the ``n``-th token from now is refilled, if each
        is taken as soon as it is there (others waiting ahead take theirs): unlike
        :meth:`time_until_available_ms`, ``n`` may exceed the capacity. A rate of 0 answers
        ``window_ms``, as there."""
        if n <= 0:
            return 0
        if self.rate == 0:
            return self.window_ms
        deficit = n * self.window_ms - self.refill(now_ms).level
        return _ceil_div(deficit, self.rate) if deficit > 0 else 0

    def with_rate(self, rate: int, window_ms: int, now_ms: int | None = None) -> TokenBucket:
        """The bucket under a new quota. Refills up to ``now_ms`` under the old rate first (if
        given), keeps the tokens it holds (rescaled if the window changed, rounding down), and
        clamps them to the new capacity. A raised rate also grants the capacity it adds: what
        the principal spent in the window stays spent, and the rest of the new quota is
        available at once, as a Kafka broker's rate quotas relieve at once (issue "patience":
        producers waiting for tokens are released the moment an operator raises the quota)."""
        current = self if now_ms is None else self.refill(now_ms)
        level = current.level * window_ms // current.window_ms
        if rate > current.rate:
            level += (rate - current.rate) * window_ms
        level = max(min(level, rate * window_ms), -10 * rate * window_ms)
        return replace(current, rate=rate, window_ms=window_ms, level=level)
