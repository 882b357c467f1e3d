"""Every metric family pidgate exports, declared as data: name, type, HELP text and label names,
plus the label values and bucket bounds they use. These names are a contract: dashboards and
alert rules in deploy/ query them (tests/deploy/test_deploy_files.py checks both sides).

Owns: ``FamilySpec`` and one constant per family, ``OTHER_USER``, ``PER_USER``, the upstream
latency buckets and the api key label values (``api_key_name``).

Must not import: anything of pidgate's (it is pure declarations; the scrape modules and
``ProxyMetrics`` import it), asyncio, socket.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from kafka.protocol.api_key import ApiKey
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

__all__ = [
    "API_SLOTS",
    "LATENCY_BUCKETS_S",
    "LATENCY_BUCKET_LABELS",
    "OTHER_USER",
    "PER_USER",
    "FamilySpec",
    "SampleFamily",
    "api_key_name",
]

MetricType = Literal["counter", "gauge", "histogram"]

#: A family whose samples are (label values, value): what every spec but a histogram builds.
SampleFamily = CounterMetricFamily | GaugeMetricFamily

_SAMPLE_FAMILY_CLASSES: Final[dict[str, type[SampleFamily]]] = {
    "counter": CounterMetricFamily,
    "gauge": GaugeMetricFamily,
}


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One metric family as /metrics declares it (``# HELP`` and ``# TYPE`` lines, label names).
    Counter names go without ``_total``: prometheus_client adds it to the samples."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()

    def labelled(self) -> SampleFamily:
        """An empty counter or gauge family of this spec's labels; the scrape adds its samples."""
        return _SAMPLE_FAMILY_CLASSES[self.type](self.name, self.help, labels=list(self.labels))

    def labelled_histogram(self) -> HistogramMetricFamily:
        """An empty histogram family of this spec's labels."""
        assert self.type == "histogram", self.name
        return HistogramMetricFamily(self.name, self.help, labels=list(self.labels))

    def of(self, value: float) -> SampleFamily:
        """The family of an unlabelled counter or gauge spec, with its one sample."""
        return _SAMPLE_FAMILY_CLASSES[self.type](self.name, self.help, value=value)

    def by_label(self, samples: Iterable[tuple[str, float]]) -> SampleFamily:
        """The family of a one-label spec, one sample per (label value, value)."""
        family = self.labelled()
        for label_value, value in samples:
            family.add_metric([label_value], value)
        return family


def counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> FamilySpec:
    return FamilySpec(name, "counter", help_text, labels)


def gauge(name: str, help_text: str, labels: tuple[str, ...] = ()) -> FamilySpec:
    return FamilySpec(name, "gauge", help_text, labels)


def histogram(name: str, help_text: str, labels: tuple[str, ...] = ()) -> FamilySpec:
    return FamilySpec(name, "histogram", help_text, labels)


#: Label value that aggregates every user beyond ``max_user_labels``.
OTHER_USER: Final = "__other__"
#: The labels of every per-user family: the quota's user name ("User:alice" → "alice", what
#: kafka-configs --entity-name takes) and the principal as /state and the event log name it.
PER_USER: Final = ("user", "principal")

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
LATENCY_BUCKET_LABELS: Final = (*(repr(b) for b in LATENCY_BUCKETS_S), "+Inf")

#: api keys are int16 on the wire; Kafka uses < 100 of them. Counters live in lists indexed by
#: api key (a list index is the cheapest per-request update), the last slot takes anything else.
API_SLOTS: Final = 128

_API_NAMES: Final[dict[int, str]] = {int(key.value): str(key.name) for key in ApiKey}


def api_key_name(api_key: int) -> str:
    """``0`` → ``"Produce"``; keys kafka-python does not name keep their number, keys outside
    the counted range are ``"other"``."""
    if not 0 <= api_key < API_SLOTS:
        return "other"
    return _API_NAMES.get(api_key, str(api_key))


# -- Per user (labels ``PER_USER``); KIP-936's three per-user quota metrics come first.
PRODUCER_IDS_RATE: Final = gauge(
    "pidgate_producer_ids_rate",
    "KIP-936 producer_ids_rate: new producer IDs a user may activate per quota window "
    "(unlimited users absent)",
    PER_USER,
)
PRODUCER_IDS_TOKENS: Final = gauge(
    "pidgate_producer_ids_tokens",
    "KIP-936: new producer IDs the user may activate right now (token bucket level; "
    "__other__ holds the lowest)",
    PER_USER,
)
PRODUCER_IDS_THROTTLE_TIME_SECONDS: Final = gauge(
    "pidgate_producer_ids_throttle_time_seconds",
    "KIP-936's throttle time (ms in the KIP, seconds here): of the user's latest quota "
    "decision (0 after an admission; __other__: the latest of any user beyond the label cap)",
    PER_USER,
)
PRODUCER_IDS_NEW: Final = counter(
    "pidgate_producer_ids_new", "Producer IDs admitted as new (a token taken each)", PER_USER
)
PRODUCER_IDS_GRANDFATHERED: Final = counter(
    "pidgate_producer_ids_grandfathered",
    "Producer IDs admitted without a token because the cluster allocated them before "
    "the user's enforcement began (below the PID frontier, or learning mode)",
    PER_USER,
)
PRODUCER_IDS_REJECTED: Final = counter(
    "pidgate_producer_ids_rejected",
    "Producer IDs in rejected Produce requests (a PID retried n times counts n times; "
    "distinct PIDs: pidgate_producer_ids_throttled_total)",
    PER_USER,
)
PRODUCER_IDS_THROTTLED: Final = counter(
    "pidgate_producer_ids_throttled",
    "Distinct producer IDs rejected: counted at a PID's first rejection, not at its retries",
    PER_USER,
)
PRODUCE_REQUESTS_REJECTED: Final = counter(
    "pidgate_produce_requests_rejected",
    "Produce requests answered with a throttling error",
    PER_USER,
)
PRODUCER_IDS_WOULD_REJECT: Final = counter(
    "pidgate_producer_ids_would_reject",
    "Observe mode: producer IDs in Produce requests enforcement would have rejected, "
    "forwarded instead (a PID counts at each such request until a token admits it)",
    PER_USER,
)
PRODUCE_REQUESTS_WOULD_REJECT: Final = counter(
    "pidgate_produce_requests_would_reject",
    "Observe mode: Produce requests enforcement would have rejected (or held), forwarded instead",
    PER_USER,
)
QUOTA_OBSERVE: Final = gauge(
    "pidgate_quota_observe",
    "1 when the user is in observe mode (would-be throttles recorded, every request "
    "forwarded), 0 when enforced; __other__: 1 if any user behind it observes",
    PER_USER,
)
PRODUCER_IDS_REFRESHED: Final = counter(
    "pidgate_producer_ids_refreshed",
    "Known producer IDs re-added to the newest Bloom layer (seen in decisions that "
    "also admitted a new PID)",
)
BLOOM_LAYERS: Final = gauge(
    "pidgate_bloom_layers",
    "Live Bloom filter layers holding the user's producer IDs (__other__: the sum)",
    PER_USER,
)
BLOOM_FALSE_POSITIVE_RATE_ESTIMATE: Final = gauge(
    "pidgate_bloom_false_positive_rate_estimate",
    "Estimated chance that a new producer ID passes as known, free of quota "
    "(__other__: the highest)",
    PER_USER,
)
GRANDFATHER_MODE: Final = gauge(
    "pidgate_grandfather_mode",
    "1 for the user's grandfathering mode now: frontier (PIDs below the frontier pass "
    "free), pending (probe in flight), learning (no frontier: unknown PIDs pass free), "
    "off (grace over); __other__: the most lenient",
    ("user", "principal", "mode"),
)

# -- The PID frontier (grandfathering).
PID_FRONTIER_PROBES: Final = counter(
    "pidgate_pid_frontier_probes",
    "PID frontier probes (a fresh PID from every broker) by result",
    ("result",),
)
PID_FRONTIER: Final = gauge(
    "pidgate_pid_frontier", "The latest PID frontier learnt: the smallest fresh PID of every broker"
)
PID_FRONTIER_AGE_SECONDS: Final = gauge(
    "pidgate_pid_frontier_age_seconds", "Seconds since the latest PID frontier was learnt"
)

# -- KIP-91: how long rejected producer IDs have been waiting, per user.
PRODUCER_ID_WAIT_SECONDS_MAX: Final = gauge(
    "pidgate_producer_id_wait_seconds_max",
    "Longest time a currently rejected producer ID has been waiting since its first "
    "rejection (KIP-91: clients fail records after delivery.timeout.ms, 120 s default)",
    PER_USER,
)
PRODUCER_IDS_WAITING: Final = gauge(
    "pidgate_producer_ids_waiting", "Producer IDs rejected and not admitted since", PER_USER
)
PRODUCER_IDS_WAITING_OVER_HALF_DELIVERY_TIMEOUT: Final = gauge(
    "pidgate_producer_ids_waiting_over_half_delivery_timeout",
    "Rejected producer IDs waiting longer than half of delivery.timeout.ms (KIP-91, "
    "120 s by default): raise the quota now, or their clients soon fail records",
    PER_USER,
)
PRODUCER_IDS_WAITING_OVER_DELIVERY_TIMEOUT: Final = gauge(
    "pidgate_producer_ids_waiting_over_delivery_timeout",
    "Rejected producer IDs waiting longer than delivery.timeout.ms (KIP-91): their "
    "clients have started failing records",
    PER_USER,
)
PRODUCER_ID_WAITS_DROPPED: Final = counter(
    "pidgate_producer_id_waits_dropped",
    "Rejected producer IDs no longer tracked because the wait table was full "
    "(oldest dropped first)",
)

# -- Quota memory.
BLOOM_FILTER_BYTES: Final = gauge(
    "pidgate_bloom_filter_bytes",
    "Memory of every Bloom filter layer of every tracked principal (their bits / 8)",
)
PRINCIPALS_TRACKED: Final = gauge(
    "pidgate_principals_tracked", "Principals with quota state (a Bloom filter and a token bucket)"
)
PRINCIPALS_EVICTED: Final = counter(
    "pidgate_principals_evicted",
    "Principals evicted, least recently active first, to keep the memory caps",
)

# -- Traffic by api key, connections, errors and reloads.
REQUESTS: Final = counter("pidgate_requests", "Kafka requests read from clients", ("api_key",))
REQUEST_BYTES: Final = counter(
    "pidgate_request_bytes",
    "Bytes of Kafka requests read from clients, size prefix included",
    ("api_key",),
)
RESPONSE_BYTES: Final = counter(
    "pidgate_response_bytes",
    "Bytes of Kafka responses sent to clients, size prefix included",
    ("api_key",),
)
UPSTREAM_LATENCY_SECONDS: Final = histogram(
    "pidgate_upstream_latency_seconds",
    "Time from forwarding a request to reading the broker's response",
    ("api_key",),
)
CONNECTIONS_OPEN: Final = gauge("pidgate_connections", "Open client connections")
CONNECTIONS_ACCEPTED: Final = counter("pidgate_connections", "Client connections accepted")
PROTOCOL_ERRORS: Final = counter(
    "pidgate_protocol_errors", "Connections closed for a protocol error, by kind", ("kind",)
)
CONFIG_RELOADS: Final = counter(
    "pidgate_config_reloads", "Configuration reloads by result", ("result",)
)
PRODUCE_REQUESTS_HELD: Final = counter(
    "pidgate_produce_requests_held",
    "Produce requests answered as rejected, without asking the quota, because they would "
    "have overtaken a rejected batch of the same producer and partition (the client "
    "retries them in order behind it)",
)

# -- Holding (issue "patience"): memory held now, and how holds end.
PRODUCE_HELD_REQUESTS: Final = gauge(
    "pidgate_produce_held_requests",
    "Produce requests held now for their principal's tokens (their connections not read)",
)
PRODUCE_HELD_BYTES: Final = gauge(
    "pidgate_produce_held_bytes",
    "Bytes of the Produce requests held now (bounded by rejection.max_held_bytes)",
)
PRODUCE_HOLDS: Final = counter(
    "pidgate_produce_holds",
    "Holds ended, by outcome: released (tokens came or the quota changed: forwarded), "
    "expired (answered as throttled with the remaining wait), dropped (client gone)",
    ("outcome",),
)
PRODUCE_HOLD_SECONDS: Final = counter(
    "pidgate_produce_hold_seconds", "Seconds Produce requests spent held, summed over ended holds"
)
PRODUCE_HOLDS_REFUSED: Final = counter(
    "pidgate_produce_holds_refused",
    "Throttled Produce requests answered at once because the waiting room was full "
    "(rejection.max_held_requests / max_held_bytes)",
)

# -- The proxy itself.
OBSERVER_ERRORS: Final = counter(
    "pidgate_observer_errors",
    "Exceptions raised by decision observers (metrics, event log); requests unaffected",
)
USER_LABELS: Final = gauge(
    "pidgate_user_labels", "Users with their own label value in the per-user metrics (capped)"
)
BUILD_INFO: Final = gauge(
    "pidgate_build_info",
    "pidgate's version and the Python running it (always 1)",
    ("version", "python_version", "python_implementation"),
)
QUOTA_FAILURES: Final = counter(
    "pidgate_quota_failures",
    "Produce requests for which the quota subsystem raised; each went by "
    "proxy.quota_failure_policy (open: forwarded unthrottled)",
)
EVENT_LOG_EVENTS_WRITTEN: Final = counter(
    "pidgate_event_log_events_written", "PID events written to the event log"
)
EVENT_LOG_EVENTS_DROPPED: Final = counter(
    "pidgate_event_log_events_dropped",
    "PID events dropped (queue full or a disk error): the event log has gaps",
)
EVENT_LOG_WRITE_ERRORS: Final = counter(
    "pidgate_event_log_write_errors",
    "Failures writing the event log (each drops the events being written)",
)
