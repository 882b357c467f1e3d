"""Fleets: pidgate instances sharing ``fleet.id`` share known PIDs and token spending through a
topic on the upstream cluster (issue "fleet"), against the real tansu broker.

Several pidgates in front of one tansu stand for the sidecars or gateways of a cluster: one
tansu has a single partition leader, so a "leader move" is the client's broker connection
moving from one sidecar to another, as it does when a sidecar's broker goes away.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from tests.integration.broker_log import producer_ids_in_log
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    KafkaSocket,
    PidgateProcess,
    create_topic,
    decode_produce,
    init_producer_id,
    produce_frame,
    produce_partition_errors,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration


def produce_once(bootstrap: str, topic: str, producer_id: int, sequence: int = 0) -> int:
    with KafkaSocket(bootstrap, timeout_s=15) as conn:
        conn.sendall(produce_frame(topic, producer_id, 1, base_sequence=sequence))
        return produce_partition_errors(decode_produce(conn.recv_frame(), 8))[0]


def fleet_sidecar(broker: EmbeddedBroker, fleet_id: str, quota: dict[str, Any]) -> BackgroundProxy:
    listen = f"127.0.0.1:{free_port()}"
    return BackgroundProxy(
        proxy_settings(
            broker,
            quota={**quota, "grandfather_grace_ms": 0},
            proxy={
                "mode": "sidecar",
                "listen": listen,
                "advertised_endpoints": {broker.bootstrap: listen},
            },
            fleet={"id": fleet_id, "flush_interval_ms": 50},
        )
    ).start()


def knows(proxy: BackgroundProxy, producer_id: int) -> bool:
    return proxy.call_and_wait(
        lambda: proxy.server.quota.is_known("User:ANONYMOUS", producer_id, _now())
    )


def tokens(proxy: BackgroundProxy) -> float | None:
    return proxy.call_and_wait(lambda: proxy.server.quota.tokens("User:ANONYMOUS", _now()))


def _now() -> int:
    return time.time_ns() // 1_000_000


def test_a_steady_producer_moving_to_another_sidecar_is_not_throttled_there(
    broker: EmbeddedBroker,
) -> None:
    fleet_id = unique_name("failover")
    quota = anonymous_quota(producer_ids_rate=2, window_seconds=600)
    sidecars = [fleet_sidecar(broker, fleet_id, quota) for _ in range(3)]
    try:
        topic = unique_name("fleet-failover")
        create_topic(broker.bootstrap, topic)
        acked: list[bytes] = []
        errors: list[str] = []
        first, rest = sidecars[0], sidecars[1:]
        producer = Producer(
            {
                "bootstrap.servers": f"{first.bootstrap},{rest[0].bootstrap}",
                "enable.idempotence": True,
                "client.id": "steady",
                "linger.ms": 5,
            }
        )

        def on_delivery(error: Any, message: Any) -> None:
            (errors.append(str(error)) if error else acked.append(message.value()))

        sent: list[bytes] = []

        def send(count: int) -> None:
            for _ in range(count):
                sent.append(b"steady-%05d" % len(sent))
                producer.produce(topic, sent[-1], partition=0, on_delivery=on_delivery)
            producer.flush(30)

        send(20)
        assert acked == sent
        (steady_pid,) = producer_ids_in_log(broker.bootstrap, topic, [0])
        serving = [s for s in sidecars if s.server.counters.new_producer_ids_admitted]
        assert len(serving) == 1
        # Every other sidecar learnt the steady PID from the fleet topic.
        for sidecar in sidecars:
            wait_until(lambda s=sidecar: knows(s, steady_pid), 10, "the fleet to share the PID")

        # A storm spends the principal's tokens through the other sidecars.
        storm = [init_producer_id(broker.bootstrap)[0] for _ in range(6)]
        storm_codes = [
            produce_once(sidecars[i % 3].bootstrap, topic, pid) for i, pid in enumerate(storm)
        ]
        assert REJECTED_DEFAULT in storm_codes
        for sidecar in sidecars:
            wait_until(lambda s=sidecar: (tokens(s) or 0) < 1, 10, "every bucket to be spent")

        # The partition's "leader" moves: the sidecar the producer used goes away.
        serving[0].stop()
        send(200)
        assert errors == []
        assert acked == sent
        for sidecar in sidecars:
            if sidecar is not serving[0]:
                assert steady_pid not in sidecar.server.counters.rejected_producer_ids
        moved_to = [s for s in sidecars if s is not serving[0] and s.server.context.connections]
        assert moved_to, "the producer did not move to another sidecar"
        log = producer_ids_in_log(broker.bootstrap, topic, [0])
        assert log[steady_pid] == len(sent)  # every record once
    finally:
        for sidecar in sidecars:
            sidecar.stop()


def test_three_gateways_hold_the_rate_across_the_fleet(broker: EmbeddedBroker) -> None:
    """Clients spread over three gateways in fleet scope: new PIDs admitted fleet-wide stay
    within one burst plus the refill plus the documented overshoot, over several windows."""
    rate, window_s, duration_s, members = 4, 4, 16.0, 3
    fleet_id = unique_name("gateways")
    gateways = [
        BackgroundProxy(
            proxy_settings(
                broker,
                quota={**anonymous_quota(rate, window_s), "grandfather_grace_ms": 0},
                fleet={"id": fleet_id, "flush_interval_ms": 50},
                rejection={"max_throttle_time_ms": 200},
            )
        ).start()
        for _ in range(members)
    ]
    try:
        topic = unique_name("fleet-rate")
        create_topic(broker.bootstrap, topic)
        admitted: list[int] = []
        lock = threading.Lock()
        started = time.monotonic()

        def storm(index: int) -> None:
            gateway = gateways[index % members]
            while time.monotonic() - started < duration_s:
                pid = init_producer_id(broker.bootstrap)[0]  # a new producer each time
                if produce_once(gateway.bootstrap, topic, pid) == 0:
                    with lock:
                        admitted.append(pid)
                time.sleep(0.05)

        threads = [threading.Thread(target=storm, args=(i,)) for i in range(2 * members)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(duration_s + 30)
        elapsed = time.monotonic() - started
        lag_s = max(
            g.call_and_wait(lambda g=g: g.server.fleet.lag_ms if g.server.fleet else 0)
            for g in gateways
        )
        lag_s /= 1000
        per_member = [g.server.counters.new_producer_ids_admitted for g in gateways]
    finally:
        for gateway in gateways:
            gateway.stop()
    quota_bound = rate + rate * elapsed / window_s
    # Members that spend the same refilled token within one lag all admit it, then owe it
    # (bucket debt) and repay it before admitting again: at any time at most (members - 1)
    # tokens, plus the initial bursts collide the same way until repaid ((members - 1) x rate
    # tokens, repaid within members - 1 windows, which this run outlasts).
    overshoot_bound = (members - 1) * (1 + lag_s * rate / window_s)
    print(
        f"FIGURES fleet_rate admitted={len(admitted)} per_member={per_member} "
        f"quota_bound={quota_bound:.1f} overshoot_bound={overshoot_bound:.1f} "
        f"lag_s={lag_s:.3f} elapsed_s={elapsed:.1f}"
    )
    assert len(set(admitted)) == len(admitted)
    assert all(per_member)  # the storm really went through every member
    assert len(admitted) <= quota_bound + overshoot_bound


def _fleet_config(path: Path, fleet_id: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "quota": {
                    **anonymous_quota(producer_ids_rate=2, window_seconds=600),
                    "grandfather_grace_ms": 0,
                },
                "fleet": {"id": fleet_id, "flush_interval_ms": 50},
            }
        )
    )
    return path


def test_a_member_killed_and_restarted_without_state_keeps_known_pids_and_bucket_levels(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    config = _fleet_config(tmp_path / "pidgate.yaml", unique_name("restart"))
    topic = unique_name("fleet-restart")
    create_topic(broker.bootstrap, topic)
    port = free_port()

    def start() -> PidgateProcess:
        return PidgateProcess(
            broker.bootstrap,
            port,
            broker_port_base=free_port() - 111,
            extra_args=("--config", str(config)),
        ).wait_listening(30)

    member = start()
    try:
        known, spender = (init_producer_id(broker.bootstrap)[0] for _ in range(2))
        assert produce_once(member.bootstrap, topic, known) == 0  # token 1 of 2
        assert produce_once(member.bootstrap, topic, spender) == 0  # token 2 of 2
        time.sleep(0.5)  # the fleet thread sends every 50 ms
        member.process.kill()  # SIGKILL: no state file, nothing flushed at exit
        member.process.wait(10)
        member.close()
        member = start()
        fresh = init_producer_id(broker.bootstrap)[0]
        # Known before the kill: still known (no token needed, none left).
        assert produce_once(member.bootstrap, topic, known, sequence=1) == 0
        # The bucket kept its level: empty, so a new PID is throttled.
        assert produce_once(member.bootstrap, topic, fresh) == REJECTED_DEFAULT
    finally:
        member.close()
