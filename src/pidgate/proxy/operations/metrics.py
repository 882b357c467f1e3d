"""Prometheus metrics of one proxy: traffic by api_key, quota decisions per user, KIP-936's three
per-user quota metrics, Bloom memory, and how long throttled producer IDs have been waiting
(KIP-91).

Owns: ``ProxyMetrics`` (a ``DecisionObserver``): the counters the request path adds to, the
per-user label table and the KIP-91 wait table, and its private ``CollectorRegistry``. The
families it exports are declared in ``metric_families`` (their names are a contract: dashboards
and alert rules in deploy/ query them) and built at scrape time by ``metrics_scrape``.

Design: the hot path (every request and response) only adds to plain ints in preallocated lists;
every Prometheus object is built at scrape time by a custom collector. Per-user series are capped
(``max_user_labels``, the rest aggregate into ``user="__other__"``) and idle users are dropped, so
memory and label cardinality stay bounded whatever principals clients present.

Threading: not thread-safe, like the quota manager. Scrape from the event loop that serves the
proxy (``AdminHttpServer`` does), never from prometheus_client's threaded HTTP server.

Must not import: asyncio, socket, structlog, the connection or server modules (they call us).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from typing import Any, Final, TypeVar, cast

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import Metric

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.operations import metric_families as families
from pidgate.proxy.operations.metric_families import API_SLOTS, LATENCY_BUCKETS_S, OTHER_USER
from pidgate.proxy.operations.metrics_scrape import (
    QuotaAggregate,
    UserCounters,
    build_info_family,
    event_log_families,
    frontier_families,
    hold_families,
    per_user_families,
    quota_memory_families,
    traffic_families,
    user_key,
)
from pidgate.proxy.operations.metrics_waits import WAIT_FORGET_MS_DEFAULT, ProducerIdWaits
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.quota.manager import Admitted, Decision, QuotaManager, Rejected

_T = TypeVar("_T")

__all__ = [
    "DELIVERY_TIMEOUT_MS_DEFAULT",
    "SCRAPE_STEP_LABELS",
    "SCRAPE_STEP_PRINCIPALS",
    "ProxyMetrics",
]


#: KIP-91 ``delivery.timeout.ms`` default (Java producer and librdkafka): a record not acknowledged
#: within it fails in the client, so a PID throttled longer than this has lost records.
DELIVERY_TIMEOUT_MS_DEFAULT: Final = 120_000

#: The api key slot counting keys outside ``0 .. API_SLOTS - 1``.
_OTHER_API: Final = API_SLOTS
#: Produce's slot (api key 0), which ``produce_traffic`` adds to.
PRODUCE_SLOT: Final = 0
#: Protocol error kinds are named by pidgate's own code, but stay bounded even if one is built
#: from input by mistake.
_MAX_ERROR_KINDS: Final = 64

#: Principals, and user label values, per step of a scrape (``ProxyMetrics.render_in_steps``):
#: each step takes a few ms on the 2-core development VM, where a scrape over 100k principals
#: in one go held the event loop ~0.7 s.
SCRAPE_STEP_PRINCIPALS: Final = 1000
SCRAPE_STEP_LABELS: Final = 100


def _run_to_end(steps: Generator[None, None, _T]) -> _T:
    """What a step generator returns, run without pausing."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return cast(_T, done.value)


class _Families:
    """A stand-in registry for ``generate_latest``: renders the families it is given."""

    def __init__(self, families: tuple[Metric, ...]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


#: A scrape's time, its per-user families and its wait families (``ProxyMetrics._prepare``).
_Prepared = tuple[int, list[Metric], list[Metric]]


class _Collector:
    """The prometheus_client collector: builds every metric family from ProxyMetrics' state."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return self._metrics.collect()


class ProxyMetrics:
    """Counts what the proxy does and exports it in Prometheus format.

    Feed it from the connection (``connection_opened`` / ``connection_closed`` / ``request`` /
    ``response`` / ``protocol_error``), register it with the ``Gatekeeper`` as a
    ``DecisionObserver``, call ``config_reloaded`` after each reload; ``render()`` is the
    ``/metrics`` body.
    """

    #: Counts decisions per user, never reads the request (admission.reads_request).
    reads_request = False

    def __init__(
        self,
        quota: QuotaManager,
        now_ms: Callable[[], int],
        max_user_labels: int = 1000,
        user_idle_ms: int = 3_600_000,
        *,
        max_waiting_pids: int = 100_000,
        delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS_DEFAULT,
        wait_forget_ms: int = WAIT_FORGET_MS_DEFAULT,
        on_long_wait: Callable[[str, int, int, int], None] | None = None,
    ) -> None:
        if max_user_labels < 1:
            raise ValueError(f"max_user_labels must be >= 1, got {max_user_labels}")
        if user_idle_ms < 1:
            raise ValueError(f"user_idle_ms must be >= 1, got {user_idle_ms}")
        if max_waiting_pids < 1:
            raise ValueError(f"max_waiting_pids must be >= 1, got {max_waiting_pids}")
        self._quota = quota
        self._now_ms = now_ms
        self._max_user_labels = max_user_labels
        self._user_idle_ms = user_idle_ms

        # -- traffic (hot path: list index += int) --
        slots = API_SLOTS + 1
        self._requests = [0] * slots
        self._request_bytes = [0] * slots
        self._response_bytes = [0] * slots
        # Non-cumulative bucket counts (last = +Inf) per api key, allocated on first use.
        self._latency_counts: list[list[int] | None] = [None] * slots
        self._latency_sums = [0.0] * slots
        self._connections_opened = 0
        self._connections_closed = 0
        self._protocol_errors: dict[str, int] = {}
        self._config_reloads = {"success": 0, "failure": 0}
        self._observer_errors = 0
        self._produce_held = 0
        #: Produce requests held for tokens (the server sets it when holding is on).
        self.waiting_room: WaitingRoom | None = None
        self._quota_failures = 0
        #: The event log's counters (``EventLog.stats``), when there is an event log.
        self.event_log_stats: Callable[[], Any] | None = None
        #: Called first on every collect (the server: each connection hands over what its
        #: express lane counted).
        self.before_collect: Callable[[], None] | None = None

        # -- per user --
        # Least recently seen first, so idle users are popped from the front in O(1).
        self._users: OrderedDict[str, UserCounters] = OrderedDict()
        self._other = UserCounters(0, OTHER_USER)
        self._other_used = False
        #: The last principal decided and its label key: a storm's new PIDs come from one
        #: principal after another, each told once per PID (issue #25's profile).
        self._last_principal = ""
        self._last_user_key = user_key("")
        self._producer_ids_refreshed = 0
        # -- the PID frontier (grandfathering): latest probe --
        self._frontier: int | None = None
        self._frontier_probed_ms: int | None = None
        self._frontier_probes = {"ok": 0, "failed": 0}

        # -- KIP-91: how long rejected PIDs have been waiting --
        self._waits = ProducerIdWaits(
            max_waiting_pids, delivery_timeout_ms, wait_forget_ms, on_long_wait
        )
        # The same table, for the one look at it every admission makes.
        self._waiting = self._waits.table

        #: What ``render_in_steps`` prepared, for the ``collect`` it drives.
        self._prepared: _Prepared | None = None
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_Collector(self))
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        ProcessCollector(registry=self._registry)

    # -- output ----------------------------------------------------------------------------

    @property
    def registry(self) -> CollectorRegistry:
        return self._registry

    def render(self) -> bytes:
        """The Prometheus text exposition format (0.0.4) of this proxy's registry, in one go
        (``render_in_steps`` lets the event loop run between steps)."""
        return generate_latest(self._registry)

    # -- traffic (called per request / response: keep these to a few int additions) --------

    def connection_opened(self) -> None:
        self._connections_opened += 1

    def connection_closed(self, peer: str | None = None) -> None:
        """``peer``: the client connection's address; the PIDs waiting on it stop waiting."""
        self._connections_closed += 1
        if peer is not None:
            self._waits.connection_closed(peer)

    def request(self, api_key: int, size_bytes: int) -> None:
        slot = api_key if 0 <= api_key < API_SLOTS else _OTHER_API
        self._requests[slot] += 1
        self._request_bytes[slot] += size_bytes

    def response(self, api_key: int, size_bytes: int, upstream_latency_s: float | None) -> None:
        """``upstream_latency_s``: request forwarded → response read from the broker; None for
        responses pidgate made itself (rejections, narrowed ApiVersions errors)."""
        slot = api_key if 0 <= api_key < API_SLOTS else _OTHER_API
        self._response_bytes[slot] += size_bytes
        if upstream_latency_s is not None:
            counts = self._latency_counts[slot]
            if counts is None:
                counts = self._latency_counts[slot] = [0] * (len(LATENCY_BUCKETS_S) + 1)
            counts[bisect_left(LATENCY_BUCKETS_S, upstream_latency_s)] += 1
            self._latency_sums[slot] += upstream_latency_s

    def produce_traffic(
        self,
        requests: int,
        request_bytes: int,
        response_bytes: int,
        latency_counts: list[int],
        latency_sum_s: float,
    ) -> None:
        """What a connection's express lane counted since it last handed its counts over:
        Produce requests, their bytes, their responses' bytes and upstream latencies (bucket
        counts as ``response`` keeps them, last = +Inf)."""
        self._requests[PRODUCE_SLOT] += requests
        self._request_bytes[PRODUCE_SLOT] += request_bytes
        self._response_bytes[PRODUCE_SLOT] += response_bytes
        if any(latency_counts):
            counts = self._latency_counts[PRODUCE_SLOT]
            if counts is None:
                counts = self._latency_counts[PRODUCE_SLOT] = [0] * (len(LATENCY_BUCKETS_S) + 1)
            for bucket, count in enumerate(latency_counts):
                counts[bucket] += count
            self._latency_sums[PRODUCE_SLOT] += latency_sum_s

    def protocol_error(self, kind: str) -> None:
        errors = self._protocol_errors
        if kind not in errors and len(errors) >= _MAX_ERROR_KINDS:
            kind = "other"
        errors[kind] = errors.get(kind, 0) + 1

    def config_reloaded(self, ok: bool) -> None:
        self._config_reloads["success" if ok else "failure"] += 1

    def produce_held(self) -> None:
        """A Produce was answered as rejected because it would have overtaken a rejected batch
        of the same producer and partition (``ordering.py``)."""
        self._produce_held += 1

    @property
    def produce_held_count(self) -> int:
        return self._produce_held

    def frontier_probed(self, frontier: int | None, now_ms: int) -> None:
        """A PID frontier probe finished: ``frontier`` learnt, or None (it failed)."""
        if frontier is None:
            self._frontier_probes["failed"] += 1
            return
        self._frontier_probes["ok"] += 1
        self._frontier = frontier
        self._frontier_probed_ms = now_ms

    def observer_error(self) -> None:
        """A DecisionObserver raised (``Gatekeeper``'s ``on_observer_error``)."""
        self._observer_errors += 1

    def quota_failure(self) -> None:
        """The quota manager raised; the Produce went by ``quota_failure_policy``."""
        self._quota_failures += 1

    # -- decisions (DecisionObserver; called for rejections and admissions of new PIDs) -----

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        now = self._now_ms()
        principal = context.principal
        if principal == self._last_principal:
            key = self._last_user_key
        else:
            key = self._last_user_key = user_key(principal)
            self._last_principal = principal
        # _user's hit, inline: told for every new PID (the express lane's too).
        users = self._users
        user = users.get(key)
        if user is not None:
            users.move_to_end(key)
            user.last_seen_ms = now
        else:
            user = self._add_user(key, now, principal)
        if isinstance(decision, Admitted):
            new_ids = decision.new_producer_ids
            user.new_producer_ids += len(new_ids)
            user.grandfathered_producer_ids += len(decision.grandfathered_producer_ids)
            user.throttle_time_ms = 0  # admitted: this user's latest decision throttles nothing
            self._producer_ids_refreshed += decision.refreshed_count
            if self._waiting:
                self._waits.admitted(key, new_ids)
        else:
            user.produce_requests_rejected += 1
            user.producer_ids_rejected += len(decision.unknown_producer_ids)
            user.throttle_time_ms = decision.throttle_time_ms
            self._waits.rejected(
                key, decision.unknown_producer_ids, context.principal, context.peer, now, user
            )

    def on_would_reject(
        self, context: ProduceContext, request: ProduceRequestSummary, rejected: Rejected
    ) -> None:
        """Observe mode: a request enforcement would have rejected was forwarded
        (WouldRejectObserver); no wait starts, the PID is not throttled."""
        user = self._user(user_key(context.principal), self._now_ms(), context.principal)
        user.produce_requests_would_reject += 1
        user.producer_ids_would_reject += len(rejected.unknown_producer_ids)

    def _user(self, key: str, now: int, principal: str) -> UserCounters:
        users = self._users
        user = users.get(key)
        if user is not None:
            users.move_to_end(key)
            user.last_seen_ms = now
            return user
        return self._add_user(key, now, principal)

    def _add_user(self, key: str, now: int, principal: str) -> UserCounters:
        users = self._users
        self._forget_idle_users(now)
        if len(users) < self._max_user_labels:
            user = users[key] = UserCounters(now, principal)
            return user
        self._other_used = True
        self._other.last_seen_ms = now
        return self._other

    def _forget_idle_users(self, now: int) -> None:
        users = self._users
        horizon = now - self._user_idle_ms
        while users:
            key, user = next(iter(users.items()))
            if user.last_seen_ms > horizon:
                break
            del users[key]
        if self._other_used and self._other.last_seen_ms <= horizon:
            self._other = UserCounters(0, OTHER_USER)
            self._other_used = False

    # -- scrape --------------------------------------------------------------------------------

    def _label_quota_states(
        self, now: int, step_principals: int
    ) -> Generator[None, None, dict[str, QuotaAggregate]]:
        """Quota snapshot per label value; refreshes and assigns user labels on the way: a
        principal the quota manager still tracks is active even when no decision reached us
        (it only produces with known PIDs, or its state was restored). Yields after each step
        of ``step_principals`` principals (``render_in_steps``); the labels are assigned in
        one go, between two steps. A principal the quota manager starts or stops tracking
        meanwhile is counted as the step that reaches it finds it."""
        # Two passes, neither keeping a state per principal past its step: a scrape's garbage
        # stays young (100k states kept alive until the end set off a full collection).
        names = self._quota.principal_names()
        keys: list[tuple[str, str]] = []
        for start in range(0, len(names), step_principals):
            keys += [(user_key(name), name) for name in names[start : start + step_principals]]
            yield
        users = self._users
        for key, _ in keys:  # idlest first, so move_to_end keeps the recency order
            user = users.get(key)
            if user is not None:
                user.last_seen_ms = now
                users.move_to_end(key)
        self._forget_idle_users(now)
        for key, name in reversed(keys):  # free label slots go to the most recently active
            if len(users) >= self._max_user_labels:
                break
            if key not in users:
                users[key] = UserCounters(now, name)
                users.move_to_end(key, last=False)
        del keys
        by_label: dict[str, QuotaAggregate] = {}
        policy = self._quota.policy
        # The names labelled above, so a principal tracked since is not filed under __other__.
        for step in self._quota.snapshot_in_steps(now, step_principals, names):
            yield
            for state in step:
                key = user_key(state.principal)
                label = key if key in users else OTHER_USER
                aggregate = by_label.get(label)
                observe = policy.observes(state.principal)
                if aggregate is None:
                    by_label[label] = QuotaAggregate(state, observe)
                else:
                    aggregate.merge(state, observe)
        return by_label

    def render_in_steps(
        self,
        step_principals: int = SCRAPE_STEP_PRINCIPALS,
        step_labels: int = SCRAPE_STEP_LABELS,
    ) -> Generator[None, None, bytes]:
        """``render()`` cut into steps: it yields after every ``step_principals`` principals of
        the quota snapshot, every ``step_labels`` user label values and every metric family,
        and returns the /metrics body. ``AdminHttpServer`` lets the event loop run between
        steps, so a scrape over many principals does not hold every connection of the process
        for its whole length."""
        for name, step in (("step_principals", step_principals), ("step_labels", step_labels)):
            if step < 1:
                raise ValueError(f"{name} must be >= 1, got {step}")
        self._prepared = yield from self._prepare(step_principals, step_labels)
        try:
            parts = []
            for family in self._registry.collect():
                parts.append(generate_latest(_Families((family,))))
                yield
        finally:
            self._prepared = None
        return b"".join(parts)

    def collect(self) -> Iterator[Metric]:
        """Every metric family, built now (prometheus_client calls this on each scrape), or
        from what ``render_in_steps`` prepared."""
        prepared, self._prepared = self._prepared, None
        if self.before_collect is not None:
            self.before_collect()  # the connections' express-lane counts, so the scrape is exact
        if prepared is None:
            prepared = _run_to_end(self._prepare(SCRAPE_STEP_PRINCIPALS, SCRAPE_STEP_LABELS))
        now, per_user, waits = prepared
        yield from per_user
        yield from frontier_families(
            self._frontier_probes, self._frontier, self._frontier_probed_ms, now
        )
        yield from waits
        yield from quota_memory_families(self._quota)
        yield from traffic_families(
            self._requests,
            self._request_bytes,
            self._response_bytes,
            self._latency_counts,
            self._latency_sums,
        )
        opened, closed = self._connections_opened, self._connections_closed
        yield families.CONNECTIONS_OPEN.of(opened - closed)
        yield families.CONNECTIONS_ACCEPTED.of(opened)
        yield families.PROTOCOL_ERRORS.by_label(self._protocol_errors.items())
        yield families.CONFIG_RELOADS.by_label(self._config_reloads.items())
        yield families.PRODUCE_REQUESTS_HELD.of(self._produce_held)
        yield from hold_families(self.waiting_room)
        yield families.OBSERVER_ERRORS.of(self._observer_errors)
        yield families.USER_LABELS.of(len(self._users))
        yield build_info_family()
        yield families.QUOTA_FAILURES.of(self._quota_failures)
        stats = self.event_log_stats() if self.event_log_stats is not None else None
        if stats is not None:
            yield from event_log_families(stats)

    def _prepare(self, step_principals: int, step_labels: int) -> Generator[None, None, _Prepared]:
        """The part of a scrape that grows with principals and user labels, in steps: the
        quota snapshot per label, the labels, the per-user families and the waits."""
        quota_by_label = yield from self._label_quota_states(self._now_ms(), step_principals)
        now = self._now_ms()  # the quota pass may have taken many turns of the event loop
        self._waits.forget_old(now)
        labelled: list[tuple[str, UserCounters]] = list(self._users.items())
        if self._other_used:
            labelled.append((OTHER_USER, self._other))
        # The waits read live tables: taken in the same step as the labels they are filed under
        # (a user labelled after this step would have waits under no label of this scrape).
        waits = self._waits.families(
            now,
            users=self._users,
            labelled=labelled,
            other_used=self._other_used,
            label_values=self._label_values,
        )
        per_user = yield from per_user_families(
            quota_by_label, labelled, self._label_values, step_labels, self._producer_ids_refreshed
        )
        return now, per_user, waits

    def _label_values(self, label: str) -> list[str]:
        """``user`` and ``principal`` label values of a label key: one principal is found by
        one string on every surface (``principal`` as in /state and the event log)."""
        user = self._other if label == OTHER_USER else self._users.get(label)
        return [label, user.principal if user is not None else f"User:{label}"]
