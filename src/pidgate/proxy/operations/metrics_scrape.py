"""Building the metric families at scrape time, from the counters ``ProxyMetrics`` keeps.

Owns: the per-user counters the request path adds to (``UserCounters``) and the quota
snapshot of one label (``QuotaAggregate``), ``user_key``, and one function per group of
families (per user, frontier, quota memory, traffic, holds, event log, build; the KIP-91 wait
families are built by ``metrics_waits``).
Which family reads which value is declared in tables here; the families themselves (name,
type, HELP, labels) in ``metric_families``. Nothing here runs on the request path.

Must not import: ``metrics`` or ``metrics_waits`` (they call us), asyncio, socket, structlog, the
connection or server modules.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import Any, Final, TypeVar

from prometheus_client.metrics_core import Metric

from pidgate import __version__
from pidgate.proxy.operations import metric_families as families
from pidgate.proxy.operations.metric_families import (
    API_SLOTS,
    LATENCY_BUCKET_LABELS,
    OTHER_USER,
    FamilySpec,
    SampleFamily,
    api_key_name,
)
from pidgate.proxy.quota_control.waiting_room import WaitingRoom
from pidgate.quota.manager import QuotaManager
from pidgate.quota.policy import user_name
from pidgate.quota.principal_table import PrincipalState

__all__ = [
    "QuotaAggregate",
    "UserCounters",
    "empty_families",
    "event_log_families",
    "frontier_families",
    "hold_families",
    "per_user_families",
    "quota_memory_families",
    "traffic_families",
    "user_key",
]

#: Principals come from authentication (SASL, mTLS subject); a label this long is already absurd,
#: and truncating bounds the memory one hostile name can pin.
MAX_USER_LABEL_CHARS: Final = 256

#: The ``user`` and ``principal`` label values of a label key (``ProxyMetrics._label_values``).
LabelValues = Callable[[str], list[str]]


def user_key(principal: str) -> str:
    # The quota's own key ("User:alice" → "alice", the kafka-configs entity name), so the
    # label matches what operators alter with kafka-configs --entity-name.
    return user_name(principal)[:MAX_USER_LABEL_CHARS]


class UserCounters:
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
        self.principal = principal[:MAX_USER_LABEL_CHARS]
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


class QuotaAggregate:
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


_Source = TypeVar("_Source")


def empty_families(
    sources: Iterable[tuple[FamilySpec, _Source]],
) -> list[tuple[SampleFamily, _Source]]:
    """An empty family per spec, each beside where its sample values come from."""
    return [(spec.labelled(), source) for spec, source in sources]


# -- per user ------------------------------------------------------------------------------------

#: Per-user families read from each label's quota snapshot. ``pidgate_producer_ids_rate`` is
#: apart: rates of unrelated users do not aggregate, so ``__other__`` has none.
_FROM_QUOTA: Final[tuple[tuple[FamilySpec, Callable[[QuotaAggregate], float]], ...]] = (
    (families.QUOTA_OBSERVE, lambda quota: int(quota.observe)),
    (families.PRODUCER_IDS_TOKENS, lambda quota: quota.tokens),
    (families.BLOOM_LAYERS, lambda quota: quota.layers),
    (families.BLOOM_FALSE_POSITIVE_RATE_ESTIMATE, lambda quota: quota.false_positive_rate),
)
#: Per-user families read from each label's ``UserCounters``.
_FROM_COUNTERS: Final[tuple[tuple[FamilySpec, Callable[[UserCounters], float]], ...]] = (
    (families.PRODUCER_IDS_WOULD_REJECT, lambda user: user.producer_ids_would_reject),
    (families.PRODUCE_REQUESTS_WOULD_REJECT, lambda user: user.produce_requests_would_reject),
    (families.PRODUCER_IDS_THROTTLE_TIME_SECONDS, lambda user: user.throttle_time_ms / 1000),
    (families.PRODUCER_IDS_NEW, lambda user: user.new_producer_ids),
    (families.PRODUCER_IDS_GRANDFATHERED, lambda user: user.grandfathered_producer_ids),
    (families.PRODUCER_IDS_REJECTED, lambda user: user.producer_ids_rejected),
    (families.PRODUCER_IDS_THROTTLED, lambda user: user.producer_ids_throttled),
    (families.PRODUCE_REQUESTS_REJECTED, lambda user: user.produce_requests_rejected),
)
#: The order of the per-user families on /metrics.
_PER_USER_ORDER: Final = (
    families.PRODUCER_IDS_RATE,
    families.PRODUCER_IDS_TOKENS,
    families.PRODUCER_IDS_THROTTLE_TIME_SECONDS,
    families.PRODUCER_IDS_NEW,
    families.PRODUCER_IDS_GRANDFATHERED,
    families.PRODUCER_IDS_REJECTED,
    families.PRODUCER_IDS_THROTTLED,
    families.PRODUCE_REQUESTS_REJECTED,
    families.PRODUCER_IDS_WOULD_REJECT,
    families.PRODUCE_REQUESTS_WOULD_REJECT,
    families.QUOTA_OBSERVE,
    families.PRODUCER_IDS_REFRESHED,
    families.BLOOM_LAYERS,
    families.BLOOM_FALSE_POSITIVE_RATE_ESTIMATE,
    families.GRANDFATHER_MODE,
)


def per_user_families(
    quota_by_label: dict[str, QuotaAggregate],
    labelled: list[tuple[str, UserCounters]],
    label_values: LabelValues,
    step_labels: int,
    producer_ids_refreshed: int,
) -> Generator[None, None, list[Metric]]:
    """The per-user families, yielding after every ``step_labels`` label values (the label
    values are read as each step reaches them: users may come and go between steps)."""
    rate = families.PRODUCER_IDS_RATE.labelled()
    from_quota = empty_families(_FROM_QUOTA)
    for done, (label, aggregate) in enumerate(quota_by_label.items(), 1):
        values = label_values(label)
        if label != OTHER_USER:
            rate.add_metric(values, aggregate.rate)
        for family, quota_value_of in from_quota:
            family.add_metric(values, quota_value_of(aggregate))
        if done % step_labels == 0:
            yield
    from_counters = empty_families(_FROM_COUNTERS)
    for done, (label, user) in enumerate(labelled, 1):
        values = label_values(label)
        for family, counter_value_of in from_counters:
            family.add_metric(values, counter_value_of(user))
        if done % step_labels == 0:
            yield
    mode = families.GRANDFATHER_MODE.labelled()
    for done, (label, aggregate) in enumerate(quota_by_label.items(), 1):
        mode.add_metric([*label_values(label), aggregate.grandfather_mode], 1)
        if done % step_labels == 0:
            yield
    built = [
        rate,
        mode,
        families.PRODUCER_IDS_REFRESHED.of(producer_ids_refreshed),
        *(family for family, _ in from_quota),
        *(family for family, _ in from_counters),
    ]
    by_name = {family.name: family for family in built}
    return [by_name[spec.name] for spec in _PER_USER_ORDER]


# -- the proxy as a whole -------------------------------------------------------------------------


def frontier_families(
    probes: Mapping[str, int], frontier: int | None, probed_ms: int | None, now_ms: int
) -> Iterator[Metric]:
    """The PID frontier probes by result and, once one succeeded, the latest frontier."""
    yield families.PID_FRONTIER_PROBES.by_label(probes.items())
    if frontier is not None and probed_ms is not None:
        yield families.PID_FRONTIER.of(frontier)
        yield families.PID_FRONTIER_AGE_SECONDS.of(max(0, now_ms - probed_ms) / 1000)


def quota_memory_families(quota: QuotaManager) -> Iterator[Metric]:
    yield families.BLOOM_FILTER_BYTES.of(quota.total_bits / 8)
    yield families.PRINCIPALS_TRACKED.of(quota.principal_count)
    yield families.PRINCIPALS_EVICTED.of(quota.evicted_principal_count)


def traffic_families(
    requests: list[int],
    request_bytes: list[int],
    response_bytes: list[int],
    latency_counts: list[list[int] | None],
    latency_sums: list[float],
) -> Iterator[Metric]:
    """Requests, bytes and upstream latency by api key, from lists indexed by api key (the last
    slot: keys outside the counted range). ``latency_counts``: non-cumulative bucket counts."""
    by_api_key = empty_families(
        (
            (families.REQUESTS, requests),
            (families.REQUEST_BYTES, request_bytes),
            (families.RESPONSE_BYTES, response_bytes),
        )
    )
    latency = families.UPSTREAM_LATENCY_SECONDS.labelled_histogram()
    for slot in range(API_SLOTS + 1):
        name = api_key_name(slot) if slot < API_SLOTS else "other"
        if requests[slot] or response_bytes[slot]:
            for family, counts in by_api_key:
                family.add_metric([name], counts[slot])
        bucket_counts = latency_counts[slot]
        if bucket_counts is not None:
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip(LATENCY_BUCKET_LABELS, bucket_counts, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric([name], buckets, latency_sums[slot])
    yield from (family for family, _ in by_api_key)
    yield latency


def hold_families(room: WaitingRoom | None) -> list[Metric]:
    """What holding costs and does (issue "patience"): memory held now, and how holds end; read
    in one go, so the five agree."""
    return [
        families.PRODUCE_HELD_REQUESTS.of(room.held_requests if room else 0),
        families.PRODUCE_HELD_BYTES.of(room.held_bytes if room else 0),
        families.PRODUCE_HOLDS.by_label((room.stats.outcomes if room else {}).items()),
        families.PRODUCE_HOLD_SECONDS.of(room.stats.held_seconds if room else 0.0),
        families.PRODUCE_HOLDS_REFUSED.of(room.stats.refused if room else 0),
    ]


def build_info_family() -> Metric:
    build = families.BUILD_INFO.labelled()
    build.add_metric([__version__, platform.python_version(), platform.python_implementation()], 1)
    return build


#: The event log's counters (``EventLogStats``), one family each.
_EVENT_LOG_COUNTERS: Final[tuple[tuple[FamilySpec, Callable[[Any], int]], ...]] = (
    (families.EVENT_LOG_EVENTS_WRITTEN, lambda stats: stats.written_events),
    (families.EVENT_LOG_EVENTS_DROPPED, lambda stats: stats.dropped_events),
    (families.EVENT_LOG_WRITE_ERRORS, lambda stats: stats.write_errors),
)


def event_log_families(stats: Any) -> Iterator[Metric]:
    """``stats``: an ``EventLogStats`` (not imported: the event log is a sibling we only read)."""
    for spec, value_of in _EVENT_LOG_COUNTERS:
        yield spec.of(value_of(stats))
