"""Grandfathering (issue 11): producers that existed before a principal's enforcement began are
never throttled, a storm that starts afterwards is held to the quota from its first second.

Real parts: a tansu broker, pidgate in a background thread or as a ``python -m pidgate``
subprocess (killed with SIGKILL), confluent-kafka (librdkafka) idempotent producers and raw
loopback sockets. The multi-broker cases use scripted brokers (tests/integration/sasl_broker.py
without SASL, listing each other in Metadata), since one tansu process is one broker and
separate tansu processes are separate clusters; they hand out PIDs from blocks of our choosing.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control.pid_frontier import probe_frontier
from tests.integration.conftest import proxy_settings
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    PidgateProcess,
    admin_address,
    create_topic,
    http_get,
    init_producer_id,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import metric, parse_samples
from tests.integration.sasl_broker import ScriptedSaslBroker
from tests.integration.test_operate import alter_quotas, produce_once, rate_op

pytestmark = pytest.mark.integration

HOUR_S = 3600
STEADY = 6
RATE = 2
STORM = 8
NOT_ENOUGH_REPLICAS = 19  # what librdkafka is answered with when throttled (retriable for it)


def get_state(admin: str) -> dict[str, Any]:
    status, body = http_get(admin, "/state")
    assert status == 200, body
    state: dict[str, Any] = json.loads(body)
    return state


def samples(admin: str) -> Any:
    status, text = http_get(admin, "/metrics")
    assert status == 200
    return parse_samples(text)


# -- steady producers and a storm ---------------------------------------------------------------


class SteadyProducers:
    """``count`` long-lived idempotent librdkafka producers, each sending one record every 20 ms
    from its own thread until stopped (bounded: at most ``max_s``). Records every delivery time
    and every delivery error."""

    def __init__(self, bootstrap: str, topic: str, count: int, max_s: float = 90.0) -> None:
        self.bootstrap, self.topic, self.max_s = bootstrap, topic, max_s
        self.stop_event = threading.Event()
        self.stopped_at = float("inf")
        self.lock = threading.Lock()
        self.delivered: dict[int, list[float]] = {i: [] for i in range(count)}
        self.errors: dict[int, list[str]] = {i: [] for i in range(count)}
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=f"steady-{i}", daemon=True)
            for i in range(count)
        ]

    def __enter__(self) -> SteadyProducers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.stop_event.is_set():
            self.stop()
        for thread in self.threads:
            thread.join(30)

    def _run(self, index: int) -> None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "client.id": f"steady-{index}",
                "linger.ms": 5,
                "reconnect.backoff.max.ms": 200,
            }
        )

        def delivered(error: Any, _message: Any) -> None:
            with self.lock:
                if error is None:
                    self.delivered[index].append(time.monotonic())
                else:
                    self.errors[index].append(str(error))

        deadline = time.monotonic() + self.max_s
        sent = 0
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            producer.produce(self.topic, b"steady-%d-%d" % (index, sent), on_delivery=delivered)
            sent += 1
            producer.poll(0.02)
        producer.flush(30)

    def deliveries(self) -> int:
        with self.lock:
            return sum(len(times) for times in self.delivered.values())

    def each_delivered_since(self, since: float, count: int) -> bool:
        """Whether every producer has had ``count`` deliveries at or after ``since``."""
        with self.lock:
            return all(
                sum(1 for t in times if t >= since) >= count for times in self.delivered.values()
            )

    def wait_all_delivering(self, timeout_s: float = 30.0) -> None:
        def all_delivering() -> bool:
            with self.lock:
                return all(len(times) >= 5 for times in self.delivered.values())

        wait_until(all_delivering, timeout_s, "every steady producer delivering")

    def stop(self) -> None:
        self.stopped_at = time.monotonic()
        self.stop_event.set()

    def longest_stall_s(self, since: float) -> float:
        """Per producer, the longest time without a delivery between ``since`` and the moment
        the producers were told to stop; the maximum over producers."""
        until = self.stopped_at
        worst = 0.0
        with self.lock:
            for times in self.delivered.values():
                points = [since, *(t for t in times if since <= t <= until), until]
                worst = max(worst, *(b - a for a, b in itertools.pairwise(points)))
        return worst

    def all_errors(self) -> list[str]:
        with self.lock:
            return [e for errors in self.errors.values() for e in errors]


def storm(bootstrap: str, topic: str, count: int = STORM) -> dict[str, Any]:
    """``count`` new idempotent producers at once, one record each, giving up after 3 s;
    name -> delivery error (None: delivered)."""
    outcome: dict[str, Any] = {}

    def one(name: str) -> None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "client.id": name,
                "message.timeout.ms": 3000,
            }
        )
        producer.produce(topic, name.encode(), on_delivery=lambda e, _m: outcome.update({name: e}))
        producer.flush(15)

    threads = [threading.Thread(target=one, args=(f"storm-{i}",)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcome


def assert_storm_held_to_the_quota(outcome: dict[str, Any], new_admitted: int) -> None:
    delivered = [name for name, error in outcome.items() if error is None]
    assert len(outcome) == STORM
    assert len(delivered) <= RATE, outcome
    assert new_admitted <= RATE
    assert len(delivered) >= 1  # the quota's tokens were there for it


# -- 1. quota activation ------------------------------------------------------------------------


def test_quota_activation_never_throttles_running_producers_and_holds_a_new_storm(
    broker: EmbeddedBroker,
) -> None:
    topic = unique_name("activate")
    settings = proxy_settings(broker, quota={"producer.id.quota.window.size.seconds": HOUR_S})
    with BackgroundProxy(settings) as proxy:
        admin = admin_address(proxy)
        create_topic(proxy.bootstrap, topic)
        with SteadyProducers(proxy.bootstrap, topic, STEADY) as steady:
            steady.wait_all_delivering()
            # Unlimited so far: not tracked. Now a quota smaller than the producer count.
            activated_at = time.monotonic()
            assert alter_quotas(proxy.bootstrap, [(None, [rate_op(RATE)])]) == [
                (0, None, [("user", None)])
            ]
            # A storm of new producers, started at once (no waiting for anything).
            outcome = storm(proxy.bootstrap, topic)
            storm_done = time.monotonic()
            time.sleep(1.5)
            steady.stop()
        state = get_state(admin)
        metrics = samples(admin)
    assert steady.all_errors() == []
    assert steady.longest_stall_s(activated_at) < 1.0
    assert_storm_held_to_the_quota(outcome, proxy.server.counters.new_producer_ids_admitted)
    assert storm_done - activated_at < 20
    assert metric(metrics, "pidgate_producer_ids_grandfathered_total", user="ANONYMOUS") == STEADY
    (anonymous,) = state["principals"]
    assert anonymous["grandfather_mode"] == "frontier", anonymous
    assert anonymous["frontier"] is not None


# -- 2. cold start after SIGKILL ------------------------------------------------------------------


def test_restart_after_sigkill_without_state_never_throttles_running_producers(
    broker: EmbeddedBroker,
) -> None:
    topic = unique_name("cold")
    create_topic(broker.bootstrap, topic)
    listen_port, base = free_port(), free_port() - TANSU_NODE_ID  # same ports after restart
    first = PidgateProcess(broker.bootstrap, listen_port, broker_port_base=base)
    second: PidgateProcess | None = None
    try:
        first.wait_listening()
        with SteadyProducers(first.bootstrap, topic, STEADY) as steady:
            steady.wait_all_delivering()
            os.kill(first.pid, signal.SIGKILL)  # no state file, no shutdown
            first.process.wait(10)
            second = PidgateProcess(
                broker.bootstrap,
                listen_port,
                broker_port_base=base,
                extra_args=(
                    "--default-producer-ids-rate",
                    str(RATE),
                    "--quota-window-seconds",
                    str(HOUR_S),
                ),
            ).wait_listening()
            admin = f"127.0.0.1:{second.admin_port}"
            # The producers reconnect (each of them: a sum over all could count one still
            # reconnecting as stalled); from then on no stall and no rejection.
            back = time.monotonic()
            wait_until(lambda: steady.each_delivered_since(back, 6), 20, "each delivering")
            settled = time.monotonic()
            outcome = storm(second.bootstrap, topic)
            time.sleep(1.5)
            steady.stop()
        assert settled - back < 10
        metrics = samples(admin)
        state = get_state(admin)
    finally:
        first.close()
        if second is not None:
            second.close()
    assert steady.all_errors() == []
    assert steady.longest_stall_s(settled) < 1.0
    assert metric(metrics, "pidgate_producer_ids_grandfathered_total", user="ANONYMOUS") == STEADY
    assert metric(metrics, "pidgate_producer_ids_new_total", user="ANONYMOUS") <= RATE
    (anonymous,) = state["principals"]
    assert anonymous["grandfather_mode"] == "frontier"
    assert state["grandfather"]["last_probe"]["brokers"].keys() == {str(TANSU_NODE_ID)}
    assert_storm_held_to_the_quota(
        outcome, int(metric(metrics, "pidgate_producer_ids_new_total", user="ANONYMOUS"))
    )


# -- 3. a forged PID below the frontier, after the grace ---------------------------------------


def test_a_forged_pid_below_the_frontier_is_charged_after_the_grace(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = unique_name("forged")
    create_topic(broker.bootstrap, topic)
    old = init_producer_id(broker.bootstrap)[0]  # a producer that existed before pidgate
    forged = [init_producer_id(broker.bootstrap)[0] for _ in range(2)]  # allocated, never used
    grace_ms = 1500
    settings = proxy_settings(
        broker,
        quota={
            "producer.id.quota.window.size.seconds": HOUR_S,
            "users": {"ANONYMOUS": {"producer_ids_rate": 1}},
            "grandfather_grace_ms": grace_ms,
        },
        event_log={"directory": str(tmp_path)},
    )
    with BackgroundProxy(settings) as proxy:
        frontier = get_state(admin_address(proxy))["grandfather"]["last_probe"]["frontier"]
        assert old < forged[0] < forged[1] < frontier
        assert produce_once(proxy.bootstrap, topic, old) == 0  # in the grace: free
        time.sleep(grace_ms / 1000 + 0.2)
        # After the grace, unseen PIDs below the frontier pay like any new one.
        assert produce_once(proxy.bootstrap, topic, forged[0]) == 0  # the only token
        assert produce_once(proxy.bootstrap, topic, forged[1]) == REJECTED_DEFAULT
        assert produce_once(proxy.bootstrap, topic, old, base_sequence=1) == 0  # still known
        state = get_state(admin_address(proxy))
    (anonymous,) = state["principals"]
    assert anonymous["grandfather_mode"] == "off"
    events = [
        json.loads(line)
        for path in sorted(tmp_path.iterdir())
        for line in path.read_text().splitlines()
    ]
    kinds = {(e["event"], e["producer_id"]) for e in events}
    assert ("admitted_grandfathered", old) in kinds
    assert ("admitted_new", forged[0]) in kinds and ("rejected", forged[1]) in kinds
    assert not any(
        e["event"] == "admitted_grandfathered" and e["producer_id"] != old for e in events
    )


# -- 4. several brokers holding different PID blocks --------------------------------------------


@contextmanager
def scripted_cluster(firsts: list[int], steps: list[int] | None = None) -> Iterator[list[Any]]:
    """Scripted brokers (no SASL) with node ids 1..n, each handing out PIDs from its own block
    (``firsts``), each listing all the others in Metadata."""
    steps = steps or [1] * len(firsts)
    with ExitStack() as stack:
        brokers = [
            stack.enter_context(
                ScriptedSaslBroker(
                    require_sasl=False, node_id=i + 1, first_producer_id=first, pid_step=step
                )
            )
            for i, (first, step) in enumerate(zip(firsts, steps, strict=True))
        ]
        for broker in brokers:
            broker.peers = [peer for peer in brokers if peer is not broker]
        yield brokers


def start_in_front(
    cluster: list[Any], upstream: Any, mode: str, rate: int
) -> Callable[[], BackgroundProxy]:
    def start() -> BackgroundProxy:
        settings = proxy_settings(
            upstream,
            proxy={
                "mode": mode,
                "broker_ports": {b.node_id: free_port() for b in cluster},
            },
            quota={
                "producer.id.quota.window.size.seconds": HOUR_S,
                "users": {"ANONYMOUS": {"producer_ids_rate": rate}},
            },
        )
        return BackgroundProxy(settings).start()

    return start


@pytest.mark.parametrize("mode", ["gateway", "sidecar"])
def test_no_pid_allocated_after_the_probe_is_grandfathered_across_brokers(mode: str) -> None:
    with scripted_cluster([1000, 5000, 9000]) as cluster:
        # Producers that existed before pidgate: two from each broker's block.
        before = {b.node_id: [init_producer_id(b.bootstrap)[0] for _ in range(2)] for b in cluster}
        # The sidecar fronts broker 2 only, yet must probe all three.
        upstream = cluster[1] if mode == "sidecar" else cluster[0]
        proxy = start_in_front(cluster, upstream, mode, rate=1)()
        try:
            admin = admin_address(proxy)
            probe = get_state(admin)["grandfather"]["last_probe"]
            assert set(probe["brokers"]) == {"1", "2", "3"}
            assert probe["frontier"] == 1002  # broker 1's next PID: the slowest block
            # Every broker hands out more PIDs after the probe.
            after = [init_producer_id(b.bootstrap)[0] for b in cluster for _ in range(3)]
            codes_after = [produce_once(proxy.bootstrap, "t", pid) for pid in after]
            codes_before = {
                node: [produce_once(proxy.bootstrap, "t", pid) for pid in pids]
                for node, pids in before.items()
            }
            metrics = samples(admin)
        finally:
            proxy.stop()
    # Not one PID allocated after the probe was grandfathered: one token, then rejections.
    assert codes_after == [0] + [REJECTED_DEFAULT] * (len(after) - 1)
    # Before the probe: broker 1's are below the frontier (free); brokers 2 and 3 held higher
    # blocks, so theirs are charged (the documented, conservative limit): no token left.
    assert codes_before == {
        1: [0, 0],
        2: [REJECTED_DEFAULT] * 2,
        3: [REJECTED_DEFAULT] * 2,
    }
    assert metric(metrics, "pidgate_producer_ids_grandfathered_total", user="ANONYMOUS") == 2


def test_a_broker_that_does_not_allocate_in_order_gives_learning_mode_loudly() -> None:
    with scripted_cluster([1000, 100_000], steps=[1, -1]) as cluster:
        result = probe_frontier([cluster[0].bootstrap], timeout_ms=5000)
        assert result.frontier is None and "increasing order" in result.reason, result
        proxy = start_in_front(cluster, cluster[0], "gateway", rate=0)()
        try:
            admin = admin_address(proxy)
            new_pid = init_producer_id(cluster[0].bootstrap)[0]
            assert produce_once(proxy.bootstrap, "t", new_pid) == 0  # learning: admitted
            state = get_state(admin)
            metrics = samples(admin)
        finally:
            proxy.stop()
    (anonymous,) = state["principals"]
    assert anonymous["grandfather_mode"] == "learning"
    assert "increasing order" in anonymous["grandfather_reason"]
    assert metric(metrics, "pidgate_grandfather_mode", user="ANONYMOUS", mode="learning") == 1
    assert metric(metrics, "pidgate_pid_frontier_probes_total", result="failed") == 1


def test_tansu_allocates_pids_from_one_increasing_counter(broker: EmbeddedBroker) -> None:
    """How tansu 0.6 allocates PIDs (recorded for the README): one cluster-wide counter,
    increasing by one per InitProducerId, also under concurrent requests."""
    first = init_producer_id(broker.bootstrap)[0]
    seen: list[int] = []
    lock = threading.Lock()

    def ask(n: int) -> None:
        for _ in range(n):
            pid = init_producer_id(broker.bootstrap)[0]
            with lock:
                seen.append(pid)

    threads = [threading.Thread(target=ask, args=(25,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(seen) == list(range(first + 1, first + 101))  # no gap, no repeat
    sequential = [init_producer_id(broker.bootstrap)[0] for _ in range(10)]
    assert sequential == list(range(first + 101, first + 111))
    result = probe_frontier([broker.bootstrap])
    assert result.per_broker == {TANSU_NODE_ID: (first + 111, first + 112)}
    assert result.frontier == first + 111


def test_the_probe_uses_the_shared_store_sasl_settings_and_fails_loudly_without_them() -> None:
    """A SASL_PLAINTEXT upstream (scripted, tansu has no SASL): without credentials there is no
    frontier (learning mode, with the reason); with the shared store's ``security`` settings the
    probe authenticates and learns it."""
    with ScriptedSaslBroker({"pidgate": "pw-probe"}, mechanisms=("PLAIN",)) as broker:
        without = probe_frontier([broker.bootstrap], timeout_ms=1500)
        assert without.frontier is None and without.reason, without
        security = {
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "pidgate",
            "sasl_plain_password": "pw-probe",
        }
        with_credentials = probe_frontier([broker.bootstrap], security=security)
        assert with_credentials.frontier == 1000, with_credentials  # the broker's first PID
        assert ("pidgate", "PLAIN", True) in {tuple(e) for e in broker.auth_log}


def test_an_unreachable_cluster_gives_no_frontier_within_the_timeout() -> None:
    """Nothing listens on the port (bound, never accepting would be a hang; refused is the
    common case): no frontier, a reason, and the probe keeps to its time limit."""
    started = time.monotonic()
    result = probe_frontier([f"127.0.0.1:{free_port()}"], timeout_ms=800)
    assert result.frontier is None and result.reason.startswith("cannot reach"), result
    assert time.monotonic() - started < 5
