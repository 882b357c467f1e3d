"""ProxyMetrics: exact values after real quota decisions, read back through prometheus_client's
own parser; bounded label sets and memory; KIP-91 wait tracking on an injected clock."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.operations.metric_families import LATENCY_BUCKETS_S, OTHER_USER, api_key_name
from pidgate.proxy.operations.metrics import ProxyMetrics
from pidgate.proxy.quota_control.admission import Gatekeeper, ProduceContext
from pidgate.quota.manager import Admitted, Decision, QuotaManager, Rejected
from pidgate.quota.policy import QuotaPolicy
from tests.steps import run_counting_steps

REQUEST = ProduceRequestSummary(transactional_id=None, acks=-1, timeout_ms=30_000, topics=())
PER_USER_FAMILIES = (
    "pidgate_producer_ids_rate",
    "pidgate_producer_ids_tokens",
    "pidgate_producer_ids_throttle_time_seconds",
    "pidgate_producer_ids_new_total",
    "pidgate_producer_ids_rejected_total",
    "pidgate_produce_requests_rejected_total",
    "pidgate_bloom_layers",
    "pidgate_bloom_false_positive_rate_estimate",
    "pidgate_producer_id_wait_seconds_max",
    "pidgate_producer_ids_waiting",
    "pidgate_producer_ids_waiting_over_half_delivery_timeout",
    "pidgate_producer_ids_waiting_over_delivery_timeout",
)


class Clock:
    def __init__(self, now_ms: int = 1_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def context(principal: str) -> ProduceContext:
    return ProduceContext(
        principal=principal, client_id="c", client_software_name="librdkafka", peer="127.0.0.1:1"
    )


def decide(
    quota: QuotaManager, metrics: ProxyMetrics, clock: Clock, principal: str, pids: Iterable[int]
) -> Decision:
    """What the Gatekeeper does, on the test's clock: observers hear rejections and admissions
    of new PIDs."""
    decision = quota.admit(principal, frozenset(pids), clock.now_ms)
    if isinstance(decision, Rejected) or decision.new_producer_ids:
        metrics.on_decision(context(principal), REQUEST, decision)
    return decision


def scrape(metrics: ProxyMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}, parsed from the rendered text."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(metrics.render().decode("utf-8")):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def per_user(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str
) -> dict[str, float]:
    return {dict(labels)["user"]: value for labels, value in samples.get(name, {}).items()}


def new_setup(
    clock: Clock | None = None, **kwargs: int
) -> tuple[QuotaManager, ProxyMetrics, Clock]:
    clock = clock or Clock()
    quota = QuotaManager(
        QuotaPolicy(
            window_ms=60_000,
            window_num=2,
            default_producer_ids_rate=2,
            user_producer_ids_rates={"bob": 5},
        )
    )
    return quota, ProxyMetrics(quota, clock, **kwargs), clock


def test_quota_decisions_export_exact_per_user_values() -> None:
    quota, metrics, clock = new_setup()
    assert decide(quota, metrics, clock, "User:alice", [1, 2]) == Admitted((1, 2), 0)
    assert isinstance(decide(quota, metrics, clock, "User:alice", [3]), Rejected)
    last = decide(quota, metrics, clock, "User:alice", [3, 4])  # PID 3 retried, with PID 4
    assert isinstance(last, Rejected)
    assert last.unknown_producer_ids == (3, 4)
    assert isinstance(decide(quota, metrics, clock, "User:bob", [10]), Admitted)

    s = scrape(metrics)
    snapshot = {state.principal: state for state in quota.snapshot(clock.now_ms)}
    assert per_user(s, "pidgate_producer_ids_rate") == {"alice": 2, "bob": 5}
    assert per_user(s, "pidgate_producer_ids_tokens") == {"alice": 0.0, "bob": 4.0}
    assert per_user(s, "pidgate_producer_ids_throttle_time_seconds") == {
        "alice": last.throttle_time_ms / 1000,
        "bob": 0,
    }
    assert per_user(s, "pidgate_producer_ids_new_total") == {"alice": 2, "bob": 1}
    assert per_user(s, "pidgate_produce_requests_rejected_total") == {"alice": 2, "bob": 0}
    assert per_user(s, "pidgate_producer_ids_rejected_total") == {"alice": 3, "bob": 0}
    assert per_user(s, "pidgate_bloom_layers") == {
        "alice": snapshot["User:alice"].layer_count,
        "bob": snapshot["User:bob"].layer_count,
    }
    assert per_user(s, "pidgate_bloom_false_positive_rate_estimate") == {
        "alice": snapshot["User:alice"].estimated_false_positive_rate,
        "bob": snapshot["User:bob"].estimated_false_positive_rate,
    }
    assert s["pidgate_bloom_filter_bytes"][()] == quota.total_bits / 8 > 0
    assert s["pidgate_principals_tracked"][()] == 2
    assert s["pidgate_principals_evicted_total"][()] == 0
    # PIDs 3 and 4 are waiting (3 since the first rejection), nothing for long yet.
    assert per_user(s, "pidgate_producer_ids_waiting") == {"alice": 2, "bob": 0}
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"alice": 0.0, "bob": 0.0}


def test_admission_resets_throttle_time_and_counts_refreshes() -> None:
    _, metrics, _ = new_setup()
    ctx = context("User:carol")
    metrics.on_decision(ctx, REQUEST, Rejected(1500, (1,)))
    assert per_user(scrape(metrics), "pidgate_producer_ids_throttle_time_seconds") == {"carol": 1.5}
    metrics.on_decision(ctx, REQUEST, Admitted((1,), 4))
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_throttle_time_seconds") == {"carol": 0}
    assert s["pidgate_producer_ids_refreshed_total"][()] == 4
    # carol is not limited by this policy's quota manager: no rate series for her.
    assert "carol" not in per_user(s, "pidgate_producer_ids_rate")


def test_unlimited_users_have_no_rate_series() -> None:
    quota = QuotaManager(QuotaPolicy(user_producer_ids_rates={"limited": 1}))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock)
    decide(quota, metrics, clock, "User:free", [1, 2, 3])  # untracked: observers hear nothing
    decide(quota, metrics, clock, "User:limited", [1])
    assert per_user(scrape(metrics), "pidgate_producer_ids_rate") == {"limited": 1}


def test_real_gatekeeper_drives_the_observer() -> None:
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1))
    metrics = ProxyMetrics(quota, Clock())
    gate = Gatekeeper(quota, [metrics])

    def request(pid: int) -> ProduceRequestSummary:
        batch = BatchHeader(0, 100, 2, 0, 0, 0, 0, pid, 0, 0, 1)
        partition = PartitionProduce(index=0, batches=(batch,))
        topic = TopicProduce(name="t", topic_id=None, partitions=(partition,))
        return ProduceRequestSummary(None, 1, 1000, (topic,))

    gate.check(context("User:dan"), request(1))
    gate.check(context("User:dan"), request(2))
    s = scrape(metrics)
    assert gate.observer_errors == 0
    assert per_user(s, "pidgate_producer_ids_new_total") == {"dan": 1}
    assert per_user(s, "pidgate_produce_requests_rejected_total") == {"dan": 1}


def test_traffic_counters_and_latency_histogram() -> None:
    _, metrics, _ = new_setup()
    metrics.connection_opened()
    metrics.connection_opened()
    metrics.connection_closed()
    metrics.request(0, 1000)
    metrics.request(0, 500)
    metrics.request(3, 40)
    metrics.request(9999, 7)  # not a key we count by name
    metrics.request(-5, 3)
    metrics.response(0, 60, 0.0002)
    metrics.response(0, 60, 0.003)
    metrics.response(0, 20, None)  # answered by pidgate itself: bytes, no latency
    metrics.response(3, 900, 20.0)  # beyond the last bucket
    metrics.protocol_error("malformed_frame")
    metrics.protocol_error("malformed_frame")
    metrics.config_reloaded(True)
    metrics.config_reloaded(False)
    metrics.config_reloaded(False)
    metrics.observer_error()
    s = scrape(metrics)

    def by_api(name: str) -> dict[str, float]:
        return {dict(labels)["api_key"]: v for labels, v in s[name].items()}

    assert by_api("pidgate_requests_total") == {"Produce": 2, "Metadata": 1, "other": 2}
    assert by_api("pidgate_request_bytes_total") == {"Produce": 1500, "Metadata": 40, "other": 10}
    assert by_api("pidgate_response_bytes_total") == {"Produce": 140, "Metadata": 900, "other": 0}
    buckets = {
        (dict(labels)["api_key"], dict(labels)["le"]): v
        for labels, v in s["pidgate_upstream_latency_seconds_bucket"].items()
    }
    assert len(buckets) == 2 * (len(LATENCY_BUCKETS_S) + 1)
    assert buckets[("Produce", "0.0001")] == 0
    assert buckets[("Produce", "0.00025")] == 1
    assert buckets[("Produce", "0.0025")] == 1
    assert buckets[("Produce", "0.005")] == 2
    assert buckets[("Produce", "+Inf")] == 2
    assert buckets[("Metadata", "10.0")] == 0
    assert buckets[("Metadata", "+Inf")] == 1
    assert by_api("pidgate_upstream_latency_seconds_count") == {"Produce": 2, "Metadata": 1}
    assert by_api("pidgate_upstream_latency_seconds_sum") == pytest.approx(
        {"Produce": 0.0032, "Metadata": 20.0}
    )
    assert s["pidgate_connections"][()] == 1
    assert s["pidgate_connections_total"][()] == 2
    assert s["pidgate_protocol_errors_total"] == {(("kind", "malformed_frame"),): 2}
    assert s["pidgate_config_reloads_total"] == {
        (("result", "success"),): 1,
        (("result", "failure"),): 2,
    }
    assert s["pidgate_observer_errors_total"][()] == 1


def test_api_key_names() -> None:
    assert api_key_name(0) == "Produce"
    assert api_key_name(18) == "ApiVersions"
    assert api_key_name(22) == "InitProducerId"
    assert api_key_name(120) == "120"
    assert api_key_name(-1) == api_key_name(32767) == "other"


def test_protocol_error_kinds_are_bounded() -> None:
    _, metrics, _ = new_setup()
    for i in range(500):
        metrics.protocol_error(f"kind-{i}")
    kinds = scrape(metrics)["pidgate_protocol_errors_total"]
    assert len(kinds) <= 65
    assert sum(kinds.values()) == 500


def test_each_instance_has_its_own_registry() -> None:
    quota, first, _ = new_setup()
    second = ProxyMetrics(quota, Clock())
    first.request(0, 1)
    assert first.registry is not second.registry
    assert "pidgate_requests_total" in scrape(first)
    assert "pidgate_requests_total" not in scrape(second)
    assert REGISTRY.get_sample_value("pidgate_requests_total", {"api_key": "Produce"}) is None


def test_label_cardinality_stays_capped_with_10k_principals() -> None:
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock, max_user_labels=1000)
    users = 10_000
    for i in range(users):
        principal = f"User:synthetic-{i}"
        assert isinstance(decide(quota, metrics, clock, principal, [i * 10]), Admitted)
        assert isinstance(decide(quota, metrics, clock, principal, [i * 10 + 1]), Rejected)
    metrics.on_decision(context("User:" + "x" * 10_000), REQUEST, Rejected(5, (1,)))
    s = scrape(metrics)
    for name in PER_USER_FAMILIES:
        labels = per_user(s, name)
        assert 0 < len(labels) <= 1000 + 1, name
        assert all(len(label) <= 256 for label in labels), name
    new = per_user(s, "pidgate_producer_ids_new_total")
    assert OTHER_USER in new
    # Aggregation keeps totals: nothing is lost by capping, only attributed to __other__.
    assert sum(new.values()) == users
    assert sum(per_user(s, "pidgate_produce_requests_rejected_total").values()) == users + 1
    assert sum(per_user(s, "pidgate_producer_ids_waiting").values()) == users + 1
    assert sum(per_user(s, "pidgate_bloom_layers").values()) == sum(
        state.layer_count for state in quota.snapshot(clock.now_ms)
    )
    assert OTHER_USER not in per_user(s, "pidgate_producer_ids_rate")
    assert s["pidgate_principals_tracked"][()] == users
    assert s["pidgate_user_labels"][()] == 1000


def _without_process_metrics(body: bytes) -> list[bytes]:
    # process_* (CPU seconds, memory) changes between two renders; everything else must not.
    return [line for line in body.splitlines() if not line.startswith(b"process_")]


#: The families of a scrape, in order (process_* aside), as the render before scrapes were
#: cut into steps gave them (checked against that tree when the steps came in).
FAMILY_ORDER = (
    "pidgate_producer_ids_rate",
    "pidgate_producer_ids_tokens",
    "pidgate_producer_ids_throttle_time_seconds",
    "pidgate_producer_ids_new",
    "pidgate_producer_ids_grandfathered",
    "pidgate_producer_ids_rejected",
    "pidgate_producer_ids_throttled",
    "pidgate_produce_requests_rejected",
    "pidgate_producer_ids_would_reject",
    "pidgate_produce_requests_would_reject",
    "pidgate_quota_observe",
    "pidgate_producer_ids_refreshed",
    "pidgate_bloom_layers",
    "pidgate_bloom_false_positive_rate_estimate",
    "pidgate_grandfather_mode",
    "pidgate_pid_frontier_probes",
    "pidgate_producer_id_wait_seconds_max",
    "pidgate_producer_ids_waiting",
    "pidgate_producer_ids_waiting_over_half_delivery_timeout",
    "pidgate_producer_ids_waiting_over_delivery_timeout",
    "pidgate_producer_id_waits_dropped",
    "pidgate_bloom_filter_bytes",
    "pidgate_principals_tracked",
    "pidgate_principals_evicted",
    "pidgate_requests",
    "pidgate_request_bytes",
    "pidgate_response_bytes",
    "pidgate_upstream_latency_seconds",
    "pidgate_connections",
    "pidgate_connections",
    "pidgate_protocol_errors",
    "pidgate_config_reloads",
    "pidgate_produce_requests_held",
    "pidgate_produce_held_requests",
    "pidgate_produce_held_bytes",
    "pidgate_produce_holds",
    "pidgate_produce_hold_seconds",
    "pidgate_produce_holds_refused",
    "pidgate_observer_errors",
    "pidgate_user_labels",
    "pidgate_build_info",
    "pidgate_quota_failures",
)


def test_a_scrape_in_steps_renders_what_one_go_renders() -> None:
    """render_in_steps (what /metrics drives, letting the loop run between steps) is render()
    cut into steps: 2,500 principals over 300 labels give the same body, in at least a step
    per 300 principals in each of its two passes and one per 50 label values."""
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock, max_user_labels=300)
    for i in range(2_500):
        decide(quota, metrics, clock, f"User:u{i}", [i + 1])
    decide(quota, metrics, clock, "User:u7", [1_000_000])  # one rejection among them
    clock.now_ms += 1_000
    whole = metrics.render()
    stepped, steps = run_counting_steps(
        metrics.render_in_steps(step_principals=300, step_labels=50)
    )
    assert _without_process_metrics(stepped) == _without_process_metrics(whole)
    assert steps >= 2 * 9 + 301 // 50
    families = [
        f.name
        for f in text_string_to_metric_families(stepped.decode("utf-8"))
        if not f.name.startswith("process_")
    ]
    assert tuple(families) == FAMILY_ORDER
    samples = scrape(metrics)
    assert len(per_user(samples, "pidgate_producer_ids_new_total")) == 300 + 1  # + __other__
    assert sum(per_user(samples, "pidgate_producer_ids_new_total").values()) == 2_500
    assert sum(per_user(samples, "pidgate_produce_requests_rejected_total").values()) == 1


def test_a_principal_that_comes_or_goes_mid_scrape_is_counted_as_its_step_finds_it() -> None:
    """Decisions go on between the steps of a scrape: a principal evicted before the step that
    reaches it is left out, one tracked since the scrape began waits for the next scrape, and
    a PID rejected meanwhile is counted under its user's label, never a negative wait."""
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1, max_principals=41))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock)
    for i in range(40):
        decide(quota, metrics, clock, f"User:u{i}", [i + 1])
    steps = metrics.render_in_steps(step_principals=10, step_labels=10)
    for _ in range(4):  # the names pass: every principal's label assigned
        next(steps)
    # Tracked without a decision reaching the metrics (as a fleet member learns PIDs): not
    # part of this scrape, rather than filed under __other__ by the states pass.
    quota.admit("User:learned", [555], clock.now_ms)
    for _ in range(2):  # the states of u0..u9 and u10..u19
        next(steps)
    clock.now_ms += 500
    for i in range(20):  # u0..u19 active again: u20..u29 are now the idlest
        decide(quota, metrics, clock, f"User:u{i}", [i + 1])
    for i in range(10):  # ten more principals evict u20..u29, before their step
        decide(quota, metrics, clock, f"User:late{i}", [i + 100])
    assert isinstance(decide(quota, metrics, clock, "User:u35", [999]), Rejected)
    body, _ = run_counting_steps(steps)
    samples = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    layers = {s.labels["user"]: s.value for s in samples["pidgate_bloom_layers"].samples}
    assert layers.keys() == {f"u{i}" for i in range(20)} | {f"u{i}" for i in range(30, 40)}
    new = {s.labels["user"]: s.value for s in samples["pidgate_producer_ids_new"].samples}
    assert new["late0"] == 1  # its decision was counted; its quota state waits a scrape
    waiting = {s.labels["user"]: s.value for s in samples["pidgate_producer_ids_waiting"].samples}
    assert {user: count for user, count in waiting.items() if count} == {"u35": 1}
    wait_max = {
        s.labels["user"]: s.value for s in samples["pidgate_producer_id_wait_seconds_max"].samples
    }
    assert wait_max["u35"] == 0.0 and min(wait_max.values()) >= 0.0
    assert samples["pidgate_principals_tracked"].samples[0].value == 41
    next_scrape = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert "late0" in {s.labels["user"] for s in next_scrape["pidgate_bloom_layers"].samples}


@pytest.mark.parametrize("steps", [{"step_principals": 0}, {"step_labels": 0}])
def test_a_scrape_step_must_hold_something(steps: dict[str, int]) -> None:
    _, metrics, _ = new_setup()
    with pytest.raises(ValueError, match="must be >= 1"):
        run_counting_steps(metrics.render_in_steps(**steps))


def test_idle_users_are_removed_and_free_their_label() -> None:
    _, metrics, clock = new_setup(max_user_labels=2, user_idle_ms=1_000)
    # Synthetic decisions: these users have no quota state, so only decisions keep them.
    metrics.on_decision(context("User:a"), REQUEST, Admitted((1,), 0))
    metrics.on_decision(context("User:b"), REQUEST, Admitted((2,), 0))
    metrics.on_decision(context("User:c"), REQUEST, Admitted((3,), 0))
    assert set(per_user(scrape(metrics), "pidgate_producer_ids_new_total")) == {
        "a",
        "b",
        OTHER_USER,
    }
    clock.now_ms += 600
    metrics.on_decision(context("User:b"), REQUEST, Admitted((4,), 0))
    clock.now_ms += 600  # a idle for 1200 ms, b for 600 ms, __other__ for 1200 ms
    metrics.on_decision(context("User:d"), REQUEST, Admitted((5,), 0))
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_new_total") == {"b": 2, "d": 1}
    clock.now_ms += 5_000
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_new_total") == {}
    assert s["pidgate_user_labels"][()] == 0


def test_users_the_quota_still_tracks_stay_until_the_quota_forgets_them() -> None:
    quota = QuotaManager(QuotaPolicy(window_ms=10_000, window_num=1, default_producer_ids_rate=5))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock, user_idle_ms=1_000)
    decide(quota, metrics, clock, "User:steady", [1])
    clock.now_ms += 5_000  # idle for metrics, but its Bloom layer is still live
    assert per_user(scrape(metrics), "pidgate_producer_ids_new_total") == {"steady": 1}
    clock.now_ms += 20_000
    assert quota.expire(clock.now_ms) == 1
    clock.now_ms += 1_001
    assert per_user(scrape(metrics), "pidgate_producer_ids_new_total") == {}


def test_restored_quota_state_gets_labels_without_any_decision() -> None:
    quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=3))
    clock = Clock()
    quota.admit("User:restored", {1}, clock.now_ms)
    metrics = ProxyMetrics(quota, clock)
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_tokens") == {"restored": 2.0}
    assert per_user(s, "pidgate_producer_ids_new_total") == {"restored": 0}


def test_decisions_of_principals_in_turn_are_each_counted_as_their_own_user() -> None:
    """The label key of the last principal decided is kept for the next decision (a storm is
    told one new PID at a time): principals in turn, and one named both ways, each count as
    their own user."""
    _, metrics, _ = new_setup()
    for principal, pids in [
        ("User:alice", (1,)),
        ("User:alice", (2, 3)),
        ("User:bob", (4,)),
        ("User:alice", (5,)),
        ("bob", (6,)),  # the quota's key for "User:bob": the same user
        ("User:carol", (7,)),
    ]:
        metrics.on_decision(context(principal), REQUEST, Admitted(pids, 0))
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_new_total") == {"alice": 4, "bob": 2, "carol": 1}


def test_kip91_wait_tracking() -> None:
    _, metrics, clock = new_setup(user_idle_ms=3_600_000)
    alice = context("User:alice")
    metrics.on_decision(alice, REQUEST, Rejected(1000, (7, 8)))
    clock.now_ms += 60_000
    metrics.on_decision(alice, REQUEST, Rejected(1000, (7,)))  # retry: wait keeps its start
    metrics.on_decision(alice, REQUEST, Rejected(1000, (9,)))
    clock.now_ms += 70_000  # 7 and 8 waited 130 s, 9 waited 70 s
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"alice": 130.0}
    assert per_user(s, "pidgate_producer_ids_waiting") == {"alice": 3}
    assert per_user(s, "pidgate_producer_ids_waiting_over_half_delivery_timeout") == {"alice": 3}
    assert per_user(s, "pidgate_producer_ids_waiting_over_delivery_timeout") == {"alice": 2}

    metrics.on_decision(alice, REQUEST, Admitted((7, 8), 0))  # admitted: no longer waiting
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"alice": 70.0}
    assert per_user(s, "pidgate_producer_ids_waiting_over_delivery_timeout") == {"alice": 0}

    clock.now_ms += 600_000  # 9 was given up on long ago: forgotten after 2x the timeout
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_waiting") == {"alice": 0}
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"alice": 0.0}


def test_a_long_wait_is_reported_once_past_half_and_once_past_the_delivery_timeout() -> None:
    reports: list[tuple[str, int, int, int]] = []
    quota = QuotaManager(QuotaPolicy(window_ms=60_000, window_num=2, default_producer_ids_rate=1))
    clock = Clock()
    metrics = ProxyMetrics(quota, clock, on_long_wait=lambda *report: reports.append(report))
    alice = context("User:alice")
    metrics.on_decision(alice, REQUEST, Rejected(3000, (7,)))
    for _ in range(80):  # a retry every 3 s (the capped throttle) for 240 s
        clock.now_ms += 3_000
        metrics.on_decision(alice, REQUEST, Rejected(3000, (7,)))
    assert reports == [
        ("User:alice", 7, 60_000, 60_000),
        ("User:alice", 7, 120_000, 120_000),
    ]
    # A PID that never waited that long is never reported.
    metrics.on_decision(alice, REQUEST, Rejected(3000, (8,)))
    clock.now_ms += 59_000
    metrics.on_decision(alice, REQUEST, Rejected(3000, (8,)))
    assert len(reports) == 2


def test_waits_are_per_user() -> None:
    _, metrics, clock = new_setup()
    metrics.on_decision(context("User:a"), REQUEST, Rejected(10, (1,)))
    clock.now_ms += 10_000
    metrics.on_decision(context("User:b"), REQUEST, Rejected(10, (1,)))  # same PID, other user
    metrics.on_decision(context("User:b"), REQUEST, Admitted((1,), 0))
    clock.now_ms += 1_000
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"a": 11.0, "b": 0.0}


def test_wait_table_is_bounded_oldest_dropped_first() -> None:
    _, metrics, clock = new_setup(max_waiting_pids=3)
    for pid in range(5):
        metrics.on_decision(context("User:a"), REQUEST, Rejected(10, (pid,)))
        clock.now_ms += 1_000
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_waiting") == {"a": 3}
    assert s["pidgate_producer_id_waits_dropped_total"][()] == 2
    # PIDs 0 and 1 were dropped: the longest wait is PID 2's (rejected 3 s before the scrape).
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"a": 3.0}


def test_constructor_rejects_unbounded_settings() -> None:
    quota = QuotaManager(QuotaPolicy())
    with pytest.raises(ValueError):
        ProxyMetrics(quota, Clock(), max_user_labels=0)
    with pytest.raises(ValueError):
        ProxyMetrics(quota, Clock(), max_waiting_pids=0)


def test_distinct_rejected_pids_are_counted_apart_from_retries() -> None:
    _, metrics, _ = new_setup()
    alice = context("User:alice")
    metrics.on_decision(alice, REQUEST, Rejected(1000, (7, 8)))
    metrics.on_decision(alice, REQUEST, Rejected(1000, (7, 8)))  # the same two, retried
    metrics.on_decision(alice, REQUEST, Rejected(1000, (9,)))
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_rejected_total") == {"alice": 5}
    assert per_user(s, "pidgate_producer_ids_throttled_total") == {"alice": 3}
    assert per_user(s, "pidgate_produce_requests_rejected_total") == {"alice": 3}


def test_waits_end_with_their_clients_connection() -> None:
    """A producer that went away is not waiting: the waiting gauges (and the critical alert
    on them) drop when the connection its PIDs were last rejected on closes."""
    _, metrics, clock = new_setup()
    first = ProduceContext("User:alice", "c", None, peer="127.0.0.1:1001")
    second = ProduceContext("User:alice", "c", None, peer="127.0.0.1:1002")
    metrics.on_decision(first, REQUEST, Rejected(1000, (7, 8)))
    metrics.on_decision(second, REQUEST, Rejected(1000, (9,)))
    metrics.on_decision(second, REQUEST, Rejected(1000, (8,)))  # 8 retried on the second
    clock.now_ms += 130_000
    assert per_user(scrape(metrics), "pidgate_producer_ids_waiting_over_delivery_timeout") == {
        "alice": 3
    }
    metrics.connection_opened()
    metrics.connection_closed("127.0.0.1:1001")  # 7 goes; 8 waits on the second connection
    assert per_user(scrape(metrics), "pidgate_producer_ids_waiting") == {"alice": 2}
    metrics.connection_closed("127.0.0.1:1002")
    s = scrape(metrics)
    assert per_user(s, "pidgate_producer_ids_waiting") == {"alice": 0}
    assert per_user(s, "pidgate_producer_id_wait_seconds_max") == {"alice": 0.0}
    metrics.connection_closed("127.0.0.1:1003")  # a connection without waits: nothing to do


def test_process_build_quota_failure_and_event_log_metrics() -> None:
    from pidgate import __version__
    from pidgate.proxy.operations.event_log import EventLogStats

    _, metrics, _ = new_setup()
    s = scrape(metrics)
    assert s["process_resident_memory_bytes"][()] > 0
    ((labels, value),) = s["pidgate_build_info"].items()
    assert dict(labels)["version"] == __version__ and value == 1
    assert s["pidgate_quota_failures_total"][()] == 0
    assert "pidgate_event_log_events_dropped_total" not in s  # no event log configured
    metrics.quota_failure()
    metrics.event_log_stats = lambda: EventLogStats(10, 2, 1, 1, 0, 5)
    s = scrape(metrics)
    assert s["pidgate_quota_failures_total"][()] == 1
    assert s["pidgate_event_log_events_written_total"][()] == 10
    assert s["pidgate_event_log_events_dropped_total"][()] == 2
    assert s["pidgate_event_log_write_errors_total"][()] == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_check_metrics_is_clean() -> None:
    from pidgate.proxy.operations.event_log import EventLogStats

    quota, metrics, clock = new_setup()
    decide(quota, metrics, clock, "User:alice", [1, 2, 3])
    metrics.on_decision(context("User:alice"), REQUEST, Rejected(1000, (4,)))
    metrics.connection_opened()
    metrics.request(0, 100)
    metrics.response(0, 60, 0.002)
    metrics.protocol_error("oversized_frame")
    metrics.config_reloaded(True)
    metrics.event_log_stats = lambda: EventLogStats(10, 2, 1, 1, 0, 5)
    done = subprocess.run(
        ["promtool", "check", "metrics"],
        input=metrics.render(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr).decode()
