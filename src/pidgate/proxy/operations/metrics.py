"""Prometheus metrics of one proxy: traffic by api_key, quota decisions per user, KIP-936's three
per-user quota metrics, Bloom memory, and how long throttled producer IDs have been waiting
(KIP-91).

Owns: ``ProxyMetrics`` (a ``DecisionObserver``), its private ``CollectorRegistry`` and the metric
names, which are a contract (dashboards and alert rules in deploy/ query them).

Design: the hot path (every request and response) only adds to plain ints in preallocated lists;
every Prometheus object is built at scrape time by a custom collector. Per-user series are capped
(``max_user_labels``, the rest aggregate into ``user="__other__"``) and idle users are dropped, so
memory and label cardinality stay bounded whatever principals clients present.

Threading: not thread-safe, like the quota manager. Scrape from the event loop that serves the
proxy (``AdminHttpServer`` does), never from prometheus_client's threaded HTTP server.

Must not import: asyncio, socket, structlog, the connection or server modules (they call us).
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from typing import Any, Final, TypeVar, cast

from kafka.protocol.api_key import ApiKey
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from pidgate import __version__
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.quota.manager import Admitted, Decision, QuotaManager, Rejected
from pidgate.quota.policy import user_name
from pidgate.quota.principal_table import PrincipalState

_T = TypeVar("_T")

__all__ = [
    "DELIVERY_TIMEOUT_MS_DEFAULT",
    "LATENCY_BUCKETS_S",
    "OTHER_USER",
    "ProxyMetrics",
    "api_key_name",
]

#: Label value that aggregates every user beyond ``max_user_labels``.
OTHER_USER: Final = "__other__"

#: Upstream latency buckets, 0.1 ms .. 10 s: loopback brokers answer in well under a millisecond,
#: acks=all Produce and long-poll Fetch (fetch.max.wait.ms, 500 ms default) take up to seconds.
LATENCY_BUCKETS_S: Final[tuple[float, ...]] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# repr of these floats is what the Go client prints too ("0.0001", "1.0"): stable le labels.
_BUCKET_LABELS: Final = (*(repr(b) for b in LATENCY_BUCKETS_S), "+Inf")

#: KIP-91 ``delivery.timeout.ms`` default (Java producer and librdkafka): a record not acknowledged
#: within it fails in the client, so a PID throttled longer than this has lost records.
DELIVERY_TIMEOUT_MS_DEFAULT: Final = 120_000

#: api keys are int16 on the wire; Kafka uses < 100 of them. Counters live in lists indexed by
#: api key (a list index is the cheapest per-request update), the last slot takes anything else.
_API_SLOTS: Final = 128
_OTHER_API: Final = _API_SLOTS

#: Principals come from authentication (SASL, mTLS subject); a label this long is already absurd,
#: and truncating bounds the memory one hostile name can pin.
_MAX_USER_LABEL_CHARS: Final = 256
#: Protocol error kinds are named by pidgate's own code, but stay bounded even if one is built
#: from input by mistake.
_MAX_ERROR_KINDS: Final = 64

_API_NAMES: Final[dict[int, str]] = {int(key.value): str(key.name) for key in ApiKey}


def api_key_name(api_key: int) -> str:
    """``0`` → ``"Produce"``; keys kafka-python does not name keep their number, keys outside
    the counted range are ``"other"``."""
    if not 0 <= api_key < _API_SLOTS:
        return "other"
    return _API_NAMES.get(api_key, str(api_key))


class _User:
    """Per-user counters; one per label value (at most ``max_user_labels`` plus ``__other__``)."""

    __slots__ = (
        "grandfathered_producer_ids",
        "last_seen_ms",
        "new_producer_ids",
        "principal",
        "produce_requests_rejected",
        "produce_requests_would_reject",
        "producer_ids_rejected",
        "producer_ids_throttled",
        "producer_ids_would_reject",
        "throttle_time_ms",
    )

    def __init__(self, now_ms: int, principal: str) -> None:
        self.last_seen_ms = now_ms
        #: The ``principal`` label: the principal as /state and the event log name it.
        self.principal = principal[:_MAX_USER_LABEL_CHARS]
        self.new_producer_ids = 0
        self.grandfathered_producer_ids = 0
        self.producer_ids_rejected = 0
        #: Distinct PIDs: counted at a PID's first rejection, not at its retries.
        self.producer_ids_throttled = 0
        self.produce_requests_rejected = 0
        self.throttle_time_ms = 0
        #: Observe mode: what enforcement would have rejected (forwarded instead).
        self.producer_ids_would_reject = 0
        self.produce_requests_would_reject = 0


#: Grandfathering modes, strictest first (``pidgate_grandfather_mode``).
_MODE_ORDER: Final[tuple[str, ...]] = ("off", "frontier", "pending", "learning")


class _QuotaAggregate:
    """Snapshot values of the principals behind one label (several when names collide after
    ``User:`` stripping, many for ``__other__``)."""

    __slots__ = ("false_positive_rate", "grandfather_mode", "layers", "observe", "rate", "tokens")

    def __init__(self, state: PrincipalState, observe: bool) -> None:
        self.observe = observe
        self.rate = state.producer_ids_rate
        self.tokens = state.tokens
        self.layers = state.layer_count
        self.false_positive_rate = state.estimated_false_positive_rate
        self.grandfather_mode = state.grandfather_mode

    def merge(self, state: PrincipalState, observe: bool) -> None:
        # Layers add up; for the rest the worst case is what an operator needs to see.
        self.observe = self.observe or observe
        self.rate = max(self.rate, state.producer_ids_rate)
        self.tokens = min(self.tokens, state.tokens)
        self.layers += state.layer_count
        self.false_positive_rate = max(
            self.false_positive_rate, state.estimated_false_positive_rate
        )
        # The most lenient mode behind the label is the one to see.
        if _MODE_ORDER.index(state.grandfather_mode) > _MODE_ORDER.index(self.grandfather_mode):
            self.grandfather_mode = state.grandfather_mode


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

    def __init__(
        self,
        quota: QuotaManager,
        now_ms: Callable[[], int],
        max_user_labels: int = 1000,
        user_idle_ms: int = 3_600_000,
        *,
        max_waiting_pids: int = 100_000,
        delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS_DEFAULT,
        wait_forget_ms: int = 2 * 5 * 60_000,
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
        self._max_waiting_pids = max_waiting_pids
        self._delivery_timeout_ms = delivery_timeout_ms
        # KIP-91 caps delivery.timeout.ms only by the user's patience; 2x the usual upper
        # setting (5 min) covers clients that raised it, after which a PID still "waiting" is a
        # producer that gave up or went away, and keeping it would only hold memory.
        self._wait_forget_ms = wait_forget_ms
        #: Told (principal, producer_id, waited_ms, threshold_ms) once when a rejected PID is
        #: rejected again past half of delivery.timeout.ms, and once past all of it (the log).
        self._on_long_wait = on_long_wait

        # -- traffic (hot path: list index += int) --
        slots = _API_SLOTS + 1
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

        # -- per user --
        # Least recently seen first, so idle users are popped from the front in O(1).
        self._users: OrderedDict[str, _User] = OrderedDict()
        self._other = _User(0, OTHER_USER)
        self._other_used = False
        self._producer_ids_refreshed = 0
        # -- the PID frontier (grandfathering): latest probe --
        self._frontier: int | None = None
        self._frontier_probed_ms: int | None = None
        self._frontier_probes = {"ok": 0, "failed": 0}

        # -- KIP-91: (user label key, PID) -> (first rejection ms * 4 + thresholds reported,
        # the client connection it was last rejected on), oldest first. One small tuple per
        # wait (up to max_waiting_pids of them): a PID storm fills this table. --
        self._waiting: OrderedDict[tuple[str, int], tuple[int, str]] = OrderedDict()
        self._waits_dropped = 0
        #: Waits per client connection: a wait ends with its client's connection (a producer
        #: that went away is not waiting), found by one scan when such a connection closes.
        self._waits_per_peer: dict[str, int] = {}

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
        if peer is not None and self._waits_per_peer.pop(peer, 0):
            waiting = self._waiting
            for key in [key for key, (_, on) in waiting.items() if on == peer]:
                del waiting[key]

    def _drop_wait(self, wait: tuple[int, str] | None) -> None:
        if wait is None:
            return
        peer = wait[1]
        left = self._waits_per_peer.get(peer, 0) - 1
        if left > 0:
            self._waits_per_peer[peer] = left
        else:
            self._waits_per_peer.pop(peer, None)

    def request(self, api_key: int, size_bytes: int) -> None:
        slot = api_key if 0 <= api_key < _API_SLOTS else _OTHER_API
        self._requests[slot] += 1
        self._request_bytes[slot] += size_bytes

    def response(self, api_key: int, size_bytes: int, upstream_latency_s: float | None) -> None:
        """``upstream_latency_s``: request forwarded → response read from the broker; None for
        responses pidgate made itself (rejections, narrowed ApiVersions errors)."""
        slot = api_key if 0 <= api_key < _API_SLOTS else _OTHER_API
        self._response_bytes[slot] += size_bytes
        if upstream_latency_s is not None:
            counts = self._latency_counts[slot]
            if counts is None:
                counts = self._latency_counts[slot] = [0] * (len(LATENCY_BUCKETS_S) + 1)
            counts[bisect_left(LATENCY_BUCKETS_S, upstream_latency_s)] += 1
            self._latency_sums[slot] += upstream_latency_s

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
        key = _user_key(context.principal)
        user = self._user(key, now, context.principal)
        waiting = self._waiting
        if isinstance(decision, Admitted):
            new_ids = decision.new_producer_ids
            user.new_producer_ids += len(new_ids)
            user.grandfathered_producer_ids += len(decision.grandfathered_producer_ids)
            user.throttle_time_ms = 0  # admitted: this user's latest decision throttles nothing
            self._producer_ids_refreshed += decision.refreshed_count
            if waiting:
                for pid in new_ids:
                    self._drop_wait(waiting.pop((key, pid), None))
        else:
            user.produce_requests_rejected += 1
            user.producer_ids_rejected += len(decision.unknown_producer_ids)
            user.throttle_time_ms = decision.throttle_time_ms
            self._forget_old_waits(now)
            peer = context.peer
            per_peer = self._waits_per_peer
            for pid in decision.unknown_producer_ids:
                wait_key = (key, pid)
                wait = waiting.get(wait_key)
                if wait is not None:  # a retry: the wait started at the first rejection
                    packed = wait[0]
                    if self._on_long_wait is not None:
                        packed = self._report_long_wait(context.principal, pid, packed, now)
                    if packed != wait[0] or wait[1] != peer:  # reported, or a new connection
                        self._drop_wait(wait)
                        waiting[wait_key] = (packed, peer)
                        per_peer[peer] = per_peer.get(peer, 0) + 1
                    continue
                user.producer_ids_throttled += 1
                if len(waiting) >= self._max_waiting_pids:
                    self._drop_wait(waiting.popitem(last=False)[1])
                    self._waits_dropped += 1
                waiting[wait_key] = (now * 4, peer)
                per_peer[peer] = per_peer.get(peer, 0) + 1

    def _report_long_wait(self, principal: str, pid: int, packed: int, now: int) -> int:
        """KIP-91: say so once when a PID has waited half of delivery.timeout.ms (the operator
        can still raise the quota before records fail) and once when it has waited all of it.
        ``packed`` is first rejection ms * 4 + thresholds reported; returns it updated."""
        first_ms, reported = divmod(packed, 4)
        waited_ms = now - first_ms
        for level, threshold_ms in enumerate(
            (self._delivery_timeout_ms // 2, self._delivery_timeout_ms), start=1
        ):
            if reported < level and waited_ms >= threshold_ms:
                reported = level
                assert self._on_long_wait is not None
                self._on_long_wait(principal, pid, waited_ms, threshold_ms)
        return first_ms * 4 + reported

    def on_would_reject(
        self, context: ProduceContext, request: ProduceRequestSummary, rejected: Rejected
    ) -> None:
        """Observe mode: a request enforcement would have rejected was forwarded
        (WouldRejectObserver); no wait starts, the PID is not throttled."""
        user = self._user(_user_key(context.principal), self._now_ms(), context.principal)
        user.produce_requests_would_reject += 1
        user.producer_ids_would_reject += len(rejected.unknown_producer_ids)

    def _user(self, key: str, now: int, principal: str) -> _User:
        users = self._users
        user = users.get(key)
        if user is not None:
            users.move_to_end(key)
            user.last_seen_ms = now
            return user
        self._forget_idle_users(now)
        if len(users) < self._max_user_labels:
            user = users[key] = _User(now, principal)
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
            self._other = _User(0, OTHER_USER)
            self._other_used = False

    def _forget_old_waits(self, now: int) -> None:
        waiting = self._waiting
        horizon = now - self._wait_forget_ms
        while waiting:
            first_ms = next(iter(waiting.values()))[0] // 4
            if first_ms > horizon:
                break
            self._drop_wait(waiting.popitem(last=False)[1])

    # -- scrape --------------------------------------------------------------------------------

    def _label_quota_states(
        self, now: int, step_principals: int
    ) -> Generator[None, None, dict[str, _QuotaAggregate]]:
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
            keys += [(_user_key(name), name) for name in names[start : start + step_principals]]
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
                users[key] = _User(now, name)
                users.move_to_end(key, last=False)
        del keys
        by_label: dict[str, _QuotaAggregate] = {}
        policy = self._quota.policy
        # The names labelled above, so a principal tracked since is not filed under __other__.
        for step in self._quota.snapshot_in_steps(now, step_principals, names):
            yield
            for state in step:
                key = _user_key(state.principal)
                label = key if key in users else OTHER_USER
                aggregate = by_label.get(label)
                observe = policy.observes(state.principal)
                if aggregate is None:
                    by_label[label] = _QuotaAggregate(state, observe)
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
        if prepared is None:
            prepared = _run_to_end(self._prepare(SCRAPE_STEP_PRINCIPALS, SCRAPE_STEP_LABELS))
        now, per_user, waits = prepared
        yield from per_user
        yield from self._collect_frontier(now)
        yield from waits
        yield from self._collect_quota_totals()
        yield from self._collect_traffic()
        yield GaugeMetricFamily(
            "pidgate_user_labels",
            "Users with their own label value in the per-user metrics (capped)",
            value=len(self._users),
        )
        yield from self._collect_operations()

    def _prepare(self, step_principals: int, step_labels: int) -> Generator[None, None, _Prepared]:
        """The part of a scrape that grows with principals and user labels, in steps: the
        quota snapshot per label, the labels, the per-user families and the waits."""
        quota_by_label = yield from self._label_quota_states(self._now_ms(), step_principals)
        now = self._now_ms()  # the quota pass may have taken many turns of the event loop
        self._forget_old_waits(now)
        labelled: list[tuple[str, _User]] = list(self._users.items())
        if self._other_used:
            labelled.append((OTHER_USER, self._other))
        # The waits read live tables: taken in the same step as the labels they are filed under
        # (a user labelled after this step would have waits under no label of this scrape).
        waits = list(self._collect_waits(now, labelled))
        per_user = yield from self._per_user_families(quota_by_label, labelled, step_labels)
        return now, per_user, waits

    def _per_user_families(
        self,
        quota_by_label: dict[str, _QuotaAggregate],
        labelled: list[tuple[str, _User]],
        step_labels: int,
    ) -> Generator[None, None, list[Metric]]:
        """The per-user families, yielding after every ``step_labels`` label values."""
        # KIP-936's three per-user quota metrics.
        rate = GaugeMetricFamily(
            "pidgate_producer_ids_rate",
            "KIP-936 producer_ids_rate: new producer IDs a user may activate per quota window "
            "(unlimited users absent)",
            labels=["user", "principal"],
        )
        tokens = GaugeMetricFamily(
            "pidgate_producer_ids_tokens",
            "KIP-936: new producer IDs the user may activate right now (token bucket level; "
            "__other__ holds the lowest)",
            labels=["user", "principal"],
        )
        layers = GaugeMetricFamily(
            "pidgate_bloom_layers",
            "Live Bloom filter layers holding the user's producer IDs (__other__: the sum)",
            labels=["user", "principal"],
        )
        false_positive = GaugeMetricFamily(
            "pidgate_bloom_false_positive_rate_estimate",
            "Estimated chance that a new producer ID passes as known, free of quota "
            "(__other__: the highest)",
            labels=["user", "principal"],
        )
        observe = GaugeMetricFamily(
            "pidgate_quota_observe",
            "1 when the user is in observe mode (would-be throttles recorded, every request "
            "forwarded), 0 when enforced; __other__: 1 if any user behind it observes",
            labels=["user", "principal"],
        )
        for done, (label, aggregate) in enumerate(quota_by_label.items(), 1):
            observe.add_metric(self._label_values(label), int(aggregate.observe))
            if label != OTHER_USER:  # rates of unrelated users do not aggregate
                rate.add_metric(self._label_values(label), aggregate.rate)
            tokens.add_metric(self._label_values(label), aggregate.tokens)
            layers.add_metric(self._label_values(label), aggregate.layers)
            false_positive.add_metric(self._label_values(label), aggregate.false_positive_rate)
            if done % step_labels == 0:
                yield
        throttle = GaugeMetricFamily(
            "pidgate_producer_ids_throttle_time_seconds",
            "KIP-936's throttle time (ms in the KIP, seconds here): of the user's latest quota "
            "decision "
            "(0 after an admission; __other__: the latest of any user beyond the label cap)",
            labels=["user", "principal"],
        )
        new_ids = CounterMetricFamily(
            "pidgate_producer_ids_new",
            "Producer IDs admitted as new (a token taken each)",
            labels=["user", "principal"],
        )
        rejected_ids = CounterMetricFamily(
            "pidgate_producer_ids_rejected",
            "Producer IDs in rejected Produce requests (a PID retried n times counts n times; "
            "distinct PIDs: pidgate_producer_ids_throttled_total)",
            labels=["user", "principal"],
        )
        throttled_ids = CounterMetricFamily(
            "pidgate_producer_ids_throttled",
            "Distinct producer IDs rejected: counted at a PID's first rejection, not at its "
            "retries",
            labels=["user", "principal"],
        )
        rejected_requests = CounterMetricFamily(
            "pidgate_produce_requests_rejected",
            "Produce requests answered with a throttling error",
            labels=["user", "principal"],
        )
        grandfathered = CounterMetricFamily(
            "pidgate_producer_ids_grandfathered",
            "Producer IDs admitted without a token because the cluster allocated them before "
            "the user's enforcement began (below the PID frontier, or learning mode)",
            labels=["user", "principal"],
        )
        would_reject_ids = CounterMetricFamily(
            "pidgate_producer_ids_would_reject",
            "Observe mode: producer IDs in Produce requests enforcement would have rejected, "
            "forwarded instead (a PID counts at each such request until a token admits it)",
            labels=["user", "principal"],
        )
        would_reject_requests = CounterMetricFamily(
            "pidgate_produce_requests_would_reject",
            "Observe mode: Produce requests enforcement would have rejected (or held), "
            "forwarded instead",
            labels=["user", "principal"],
        )
        for done, (label, user) in enumerate(labelled, 1):
            would_reject_ids.add_metric(self._label_values(label), user.producer_ids_would_reject)
            would_reject_requests.add_metric(
                self._label_values(label), user.produce_requests_would_reject
            )
            throttle.add_metric(self._label_values(label), user.throttle_time_ms / 1000)
            new_ids.add_metric(self._label_values(label), user.new_producer_ids)
            grandfathered.add_metric(self._label_values(label), user.grandfathered_producer_ids)
            rejected_ids.add_metric(self._label_values(label), user.producer_ids_rejected)
            throttled_ids.add_metric(self._label_values(label), user.producer_ids_throttled)
            rejected_requests.add_metric(self._label_values(label), user.produce_requests_rejected)
            if done % step_labels == 0:
                yield
        mode = GaugeMetricFamily(
            "pidgate_grandfather_mode",
            "1 for the user's grandfathering mode now: frontier (PIDs below the frontier pass "
            "free), pending (probe in flight), learning (no frontier: unknown PIDs pass free), "
            "off (grace over); __other__: the most lenient",
            labels=["user", "principal", "mode"],
        )
        for done, (label, aggregate) in enumerate(quota_by_label.items(), 1):
            mode.add_metric([*self._label_values(label), aggregate.grandfather_mode], 1)
            if done % step_labels == 0:
                yield
        return [
            rate,
            tokens,
            throttle,
            new_ids,
            grandfathered,
            rejected_ids,
            throttled_ids,
            rejected_requests,
            would_reject_ids,
            would_reject_requests,
            observe,
            CounterMetricFamily(
                "pidgate_producer_ids_refreshed",
                "Known producer IDs re-added to the newest Bloom layer (seen in decisions that "
                "also admitted a new PID)",
                value=self._producer_ids_refreshed,
            ),
            layers,
            false_positive,
            mode,
        ]

    def _label_values(self, label: str) -> list[str]:
        """``user`` and ``principal`` label values of a label key: one principal is found by
        one string on every surface (``principal`` as in /state and the event log)."""
        user = self._other if label == OTHER_USER else self._users.get(label)
        return [label, user.principal if user is not None else f"User:{label}"]

    def _collect_operations(self) -> Iterator[Metric]:
        """Build information, quota failures and the event log's counters."""
        build = GaugeMetricFamily(
            "pidgate_build_info",
            "pidgate's version and the Python running it (always 1)",
            labels=["version", "python_version", "python_implementation"],
        )
        build.add_metric(
            [__version__, platform.python_version(), platform.python_implementation()], 1
        )
        yield build
        yield CounterMetricFamily(
            "pidgate_quota_failures",
            "Produce requests for which the quota subsystem raised; each went by "
            "proxy.quota_failure_policy (open: forwarded unthrottled)",
            value=self._quota_failures,
        )
        stats = self.event_log_stats() if self.event_log_stats is not None else None
        if stats is not None:
            yield CounterMetricFamily(
                "pidgate_event_log_events_written",
                "PID events written to the event log",
                value=stats.written_events,
            )
            yield CounterMetricFamily(
                "pidgate_event_log_events_dropped",
                "PID events dropped (queue full or a disk error): the event log has gaps",
                value=stats.dropped_events,
            )
            yield CounterMetricFamily(
                "pidgate_event_log_write_errors",
                "Failures writing the event log (each drops the events being written)",
                value=stats.write_errors,
            )

    def _collect_frontier(self, now: int) -> Iterator[Metric]:
        probes = CounterMetricFamily(
            "pidgate_pid_frontier_probes",
            "PID frontier probes (a fresh PID from every broker) by result",
            labels=["result"],
        )
        for result, count in self._frontier_probes.items():
            probes.add_metric([result], count)
        yield probes
        if self._frontier is not None and self._frontier_probed_ms is not None:
            yield GaugeMetricFamily(
                "pidgate_pid_frontier",
                "The latest PID frontier learnt: the smallest fresh PID of every broker",
                value=self._frontier,
            )
            yield GaugeMetricFamily(
                "pidgate_pid_frontier_age_seconds",
                "Seconds since the latest PID frontier was learnt",
                value=max(0, now - self._frontier_probed_ms) / 1000,
            )

    def _collect_waits(self, now: int, labelled: list[tuple[str, _User]]) -> Iterator[Metric]:
        """KIP-91: a throttled producer retries until delivery.timeout.ms (120 s by default),
        then fails its records; how long rejected PIDs have been waiting says whether that
        is happening."""
        users = self._users
        oldest: dict[str, int] = {}
        count: dict[str, int] = {}
        over: dict[str, int] = {}
        over_half: dict[str, int] = {}
        late = now - self._delivery_timeout_ms
        half_late = now - self._delivery_timeout_ms // 2
        for (key, _pid), (packed, _) in self._waiting.items():  # oldest first
            first_ms = packed // 4
            label = key if key in users else OTHER_USER
            if label not in oldest:
                oldest[label] = first_ms
            count[label] = count.get(label, 0) + 1
            if first_ms < half_late:
                over_half[label] = over_half.get(label, 0) + 1
                if first_ms < late:
                    over[label] = over.get(label, 0) + 1
        wait_max = GaugeMetricFamily(
            "pidgate_producer_id_wait_seconds_max",
            "Longest time a currently rejected producer ID has been waiting since its first "
            "rejection (KIP-91: clients fail records after delivery.timeout.ms, 120 s default)",
            labels=["user", "principal"],
        )
        waiting = GaugeMetricFamily(
            "pidgate_producer_ids_waiting",
            "Producer IDs rejected and not admitted since",
            labels=["user", "principal"],
        )
        waiting_over_half = GaugeMetricFamily(
            "pidgate_producer_ids_waiting_over_half_delivery_timeout",
            "Rejected producer IDs waiting longer than half of delivery.timeout.ms (KIP-91, "
            "120 s by default): raise the quota now, or their clients soon fail records",
            labels=["user", "principal"],
        )
        waiting_over = GaugeMetricFamily(
            "pidgate_producer_ids_waiting_over_delivery_timeout",
            "Rejected producer IDs waiting longer than delivery.timeout.ms (KIP-91): their "
            "clients have started failing records",
            labels=["user", "principal"],
        )
        labels = [label for label, _ in labelled]
        if OTHER_USER in oldest and not self._other_used:
            labels.append(OTHER_USER)  # waits of users whose label was freed while idle
        for label in labels:
            first = oldest.get(label)
            wait_max.add_metric(
                self._label_values(label), 0.0 if first is None else (now - first) / 1000
            )
            waiting.add_metric(self._label_values(label), count.get(label, 0))
            waiting_over_half.add_metric(self._label_values(label), over_half.get(label, 0))
            waiting_over.add_metric(self._label_values(label), over.get(label, 0))
        yield wait_max
        yield waiting
        yield waiting_over_half
        yield waiting_over
        yield CounterMetricFamily(
            "pidgate_producer_id_waits_dropped",
            "Rejected producer IDs no longer tracked because the wait table was full "
            "(oldest dropped first)",
            value=self._waits_dropped,
        )

    def _collect_quota_totals(self) -> Iterator[Metric]:
        quota = self._quota
        yield GaugeMetricFamily(
            "pidgate_bloom_filter_bytes",
            "Memory of every Bloom filter layer of every tracked principal (their bits / 8)",
            value=quota.total_bits / 8,
        )
        yield GaugeMetricFamily(
            "pidgate_principals_tracked",
            "Principals with quota state (a Bloom filter and a token bucket)",
            value=quota.principal_count,
        )
        yield CounterMetricFamily(
            "pidgate_principals_evicted",
            "Principals evicted, least recently active first, to keep the memory caps",
            value=quota.evicted_principal_count,
        )

    def _collect_traffic(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "pidgate_requests", "Kafka requests read from clients", labels=["api_key"]
        )
        request_bytes = CounterMetricFamily(
            "pidgate_request_bytes",
            "Bytes of Kafka requests read from clients, size prefix included",
            labels=["api_key"],
        )
        response_bytes = CounterMetricFamily(
            "pidgate_response_bytes",
            "Bytes of Kafka responses sent to clients, size prefix included",
            labels=["api_key"],
        )
        latency = HistogramMetricFamily(
            "pidgate_upstream_latency_seconds",
            "Time from forwarding a request to reading the broker's response",
            labels=["api_key"],
        )
        for slot in range(_API_SLOTS + 1):
            name = api_key_name(slot) if slot < _API_SLOTS else "other"
            if self._requests[slot] or self._response_bytes[slot]:
                requests.add_metric([name], self._requests[slot])
                request_bytes.add_metric([name], self._request_bytes[slot])
                response_bytes.add_metric([name], self._response_bytes[slot])
            counts = self._latency_counts[slot]
            if counts is not None:
                cumulative = 0
                buckets: list[tuple[str, float]] = []
                for bound, n in zip(_BUCKET_LABELS, counts, strict=True):
                    cumulative += n
                    buckets.append((bound, cumulative))
                latency.add_metric([name], buckets, self._latency_sums[slot])
        yield requests
        yield request_bytes
        yield response_bytes
        yield latency
        opened, closed = self._connections_opened, self._connections_closed
        yield GaugeMetricFamily("pidgate_connections", "Open client connections", opened - closed)
        yield CounterMetricFamily(
            "pidgate_connections", "Client connections accepted", value=opened
        )
        errors = CounterMetricFamily(
            "pidgate_protocol_errors",
            "Connections closed for a protocol error, by kind",
            labels=["kind"],
        )
        for kind, n in self._protocol_errors.items():
            errors.add_metric([kind], n)
        yield errors
        reloads = CounterMetricFamily(
            "pidgate_config_reloads", "Configuration reloads by result", labels=["result"]
        )
        for result, n in self._config_reloads.items():
            reloads.add_metric([result], n)
        yield reloads
        yield CounterMetricFamily(
            "pidgate_produce_requests_held",
            "Produce requests answered as rejected, without asking the quota, because they would "
            "have overtaken a rejected batch of the same producer and partition (the client "
            "retries them in order behind it)",
            value=self._produce_held,
        )
        yield from _hold_families_of(self.waiting_room)
        yield CounterMetricFamily(
            "pidgate_observer_errors",
            "Exceptions raised by decision observers (metrics, event log); requests unaffected",
            value=self._observer_errors,
        )


def _hold_families_of(room: WaitingRoom | None) -> Iterator[Metric]:
    """What holding costs and does (issue "patience"): memory held now, and how holds end."""
    held = GaugeMetricFamily(
        "pidgate_produce_held_requests",
        "Produce requests held now for their principal's tokens (their connections not read)",
        value=room.held_requests if room else 0,
    )
    held_bytes = GaugeMetricFamily(
        "pidgate_produce_held_bytes",
        "Bytes of the Produce requests held now (bounded by rejection.max_held_bytes)",
        value=room.held_bytes if room else 0,
    )
    outcomes = CounterMetricFamily(
        "pidgate_produce_holds",
        "Holds ended, by outcome: released (tokens came or the quota changed: forwarded), "
        "expired (answered as throttled with the remaining wait), dropped (client gone)",
        labels=["outcome"],
    )
    for outcome, n in (room.stats.outcomes if room else {}).items():
        outcomes.add_metric([outcome], n)
    seconds = CounterMetricFamily(
        "pidgate_produce_hold_seconds",
        "Seconds Produce requests spent held, summed over ended holds",
        value=room.stats.held_seconds if room else 0.0,
    )
    refused = CounterMetricFamily(
        "pidgate_produce_holds_refused",
        "Throttled Produce requests answered at once because the waiting room was full "
        "(rejection.max_held_requests / max_held_bytes)",
        value=room.stats.refused if room else 0,
    )
    return iter((held, held_bytes, outcomes, seconds, refused))


def _user_key(principal: str) -> str:
    # The quota's own key ("User:alice" → "alice", the kafka-configs entity name), so the
    # label matches what operators alter with kafka-configs --entity-name.
    return user_name(principal)[:_MAX_USER_LABEL_CHARS]
