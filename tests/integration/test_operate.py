"""Operating pidgate (issue 4): metrics, admin HTTP, live quota administration through the
KIP-546 client-quota APIs, state across restarts, SIGHUP reloads and rate-limited logs.

Real parts only: a tansu broker, pidgate in a background thread or as a ``python -m pidgate``
subprocess, confluent-kafka producers and raw loopback sockets speaking kafka-python's protocol
classes. tansu has no client-quota APIs, so pidgate answers ``producer_ids_rate`` itself.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from pidgate.config import Settings
from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.protocol.headers import parse_request_header
from pidgate.protocol.produce import ProduceRequestSummary, parse_produce_request
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.quota_control import room as server_module
from pidgate.proxy.quota_control.admission import Admitted, ProduceContext, Rejected
from pidgate.quota.policy import QuotaPolicy
from pidgate.quota.state.load import load_state
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    UNSUPPORTED_VERSION,
    KafkaSocket,
    PidgateProcess,
    admin_address,
    advertised_versions,
    create_topic,
    decode_produce,
    decode_response,
    encode_request,
    http_get,
    init_producer_id,
    produce_frame,
    produce_partition_errors,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import Samples, metric, parse_samples

pytestmark = pytest.mark.integration

INVALID_REQUEST = 42
DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49
MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2
RATE_KEY = "producer_ids_rate"
HOUR_S = 3600


# -- settings, HTTP, metrics -------------------------------------------------------------------


def operate_settings(
    broker: EmbeddedBroker,
    *,
    quota: dict[str, Any] | None = None,
    admin: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    proxy: dict[str, Any] | None = None,
) -> Settings:
    """conftest's ``proxy_settings`` with the admin and state sections."""
    return proxy_settings(
        broker, quota=quota, proxy=proxy, admin=admin, **({"state": state} if state else {})
    )


def get_state(admin: str) -> dict[str, Any]:
    status, body = http_get(admin, "/state")
    assert status == 200, body
    state = json.loads(body)
    assert isinstance(state, dict)
    return state


def scrape(admin: str) -> Samples:
    """Every sample of /metrics by sample name (``..._total``, ``..._count``, ...)."""
    status, text = http_get(admin, "/metrics")
    assert status == 200, text
    return parse_samples(text)


# -- Kafka requests on raw sockets ---------------------------------------------------------------


def produce_once(
    bootstrap: str, topic: str, producer_id: int, base_sequence: int = 0, correlation_id: int = 7
) -> int:
    """One acks=-1 Produce v8 with one idempotent batch of ``producer_id`` on a fresh
    connection (a rejection mutes its connection, KIP-219); the partition's error code."""
    with KafkaSocket(bootstrap) as conn:
        conn.sendall(produce_frame(topic, producer_id, correlation_id, base_sequence=base_sequence))
        (code,) = produce_partition_errors(decode_produce(conn.recv_frame(), 8))
    return int(code)


def ask(address: str, request: Any, response_cls: Any, version: int, correlation_id: int) -> Any:
    with KafkaSocket(address) as conn:
        conn.sendall(encode_request(request, version, correlation_id, client_id="kafka-configs"))
        payload = conn.recv_frame()
    response = decode_response(response_cls, payload, version)
    return response


QuotaOp = tuple[str, float, bool]  # key, value, remove


def alter_quotas(
    address: str,
    entries: list[tuple[str | None, list[QuotaOp]]],
    version: int = 1,
    validate_only: bool = False,
) -> list[tuple[int, str | None, list[tuple[str, str | None]]]]:
    """AlterClientQuotas for user entities (name None = the default user); per entry
    (error_code, error_message, entity as [(type, name)])."""
    Req = AlterClientQuotasRequest
    request = Req(
        entries=[
            Req.EntryData(
                entity=[Req.EntryData.EntityData(entity_type="user", entity_name=name)],
                ops=[
                    Req.EntryData.OpData(key=key, value=value, remove=remove)
                    for key, value, remove in ops
                ],
            )
            for name, ops in entries
        ],
        validate_only=validate_only,
    )
    response = ask(address, request, AlterClientQuotasResponse, version, 31)
    return [
        (
            int(entry.error_code),
            entry.error_message,
            [(e.entity_type, e.entity_name) for e in entry.entity],
        )
        for entry in response.entries
    ]


def describe_quotas(
    address: str, match_type: int, match: str | None = None, version: int = 1
) -> dict[str | None, dict[str, float]]:
    """DescribeClientQuotas on the user entity type: {user name or None: {key: value}}."""
    Req = DescribeClientQuotasRequest
    request = Req(
        components=[Req.ComponentData(entity_type="user", match_type=match_type, match=match)],
        strict=False,
    )
    response = ask(address, request, DescribeClientQuotasResponse, version, 32)
    assert response.error_code == 0, (response.error_code, response.error_message)
    described: dict[str | None, dict[str, float]] = {}
    for entry in response.entries:
        entity = [(e.entity_type, e.entity_name) for e in entry.entity]
        assert len(entity) == 1 and entity[0][0] == "user", entity
        described[entity[0][1]] = {v.key: float(v.value) for v in entry.values}
    return described


def rate_op(value: float) -> QuotaOp:
    return (RATE_KEY, value, False)


REMOVE_RATE: QuotaOp = (RATE_KEY, 0.0, True)


# -- 1. metrics and the admin endpoint -----------------------------------------------------------


def short_lived_producer(bootstrap: str, topic: str, name: str, outcome: dict[str, Any]) -> None:
    """An idempotent librdkafka producer that sends one record and gives up after 3 s."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "client.id": name,
            "message.timeout.ms": 3000,
        }
    )
    producer.produce(
        topic, f"{name}-record".encode(), on_delivery=lambda e, _m: outcome.update({name: e})
    )
    producer.flush(15)


def test_metrics_after_a_throttling_scenario_and_the_admin_endpoints(
    broker: EmbeddedBroker, start_proxy: Callable[..., BackgroundProxy]
) -> None:
    # A short mute (KIP-219) so the connections of producers that gave up close soon after: a
    # muted connection is not read, so its client's EOF is only seen when the mute ends.
    proxy = start_proxy(
        quota=anonymous_quota(producer_ids_rate=2, window_seconds=60),
        rejection={"max_throttle_time_ms": 500},
    )
    admin = admin_address(proxy)
    topic = unique_name("metrics")
    create_topic(proxy.bootstrap, topic)

    outcome: dict[str, Any] = {}
    threads = [
        threading.Thread(
            target=short_lived_producer,
            args=(proxy.bootstrap, topic, f"short-{i}", outcome),
            daemon=True,
        )
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(25)
    assert not any(thread.is_alive() for thread in threads)
    delivered = [name for name, error in outcome.items() if error is None]
    assert len(outcome) == 4 and len(delivered) == 2, outcome  # 2 PIDs fit, 2 time out

    samples = scrape(admin)
    user = {"user": "ANONYMOUS"}
    assert metric(samples, "pidgate_producer_ids_rate", **user) == 2
    assert metric(samples, "pidgate_producer_ids_new_total", **user) == 2
    assert metric(samples, "pidgate_produce_requests_rejected_total", **user) > 0
    assert metric(samples, "pidgate_producer_ids_rejected_total", **user) >= 2
    assert metric(samples, "pidgate_producer_ids_tokens", **user) < 1
    assert metric(samples, "pidgate_producer_ids_throttle_time_seconds", **user) > 0
    # Two producers' PIDs were rejected (each several times) and never admitted; their waits
    # end when their connections close (checked below).
    assert metric(samples, "pidgate_producer_ids_throttled_total", **user) == 2
    assert metric(samples, "pidgate_producer_ids_waiting", **user) <= 2
    assert metric(samples, "pidgate_bloom_layers", **user) >= 1
    assert metric(samples, "pidgate_principals_tracked") == 1
    assert metric(samples, "pidgate_requests_total", api_key="Produce") > 0
    assert metric(samples, "pidgate_requests_total", api_key="InitProducerId") >= 4
    assert metric(samples, "pidgate_upstream_latency_seconds_count", api_key="Produce") > 0
    assert metric(
        samples, "pidgate_upstream_latency_seconds_bucket", api_key="Produce", le="+Inf"
    ) == (metric(samples, "pidgate_upstream_latency_seconds_count", api_key="Produce"))
    assert metric(samples, "pidgate_connections_total") >= 4 * 2  # bootstrap + broker each
    assert metric(samples, "pidgate_config_reloads_total", result="success") == 0

    # The connections gauge follows open client connections.
    wait_until(lambda: metric(scrape(admin), "pidgate_connections") == 0, 15, "producers closed")
    # The producers that gave up are gone: nothing is waiting any more, so the waiting alerts
    # clear at once instead of after the 10-minute forget horizon.
    assert metric(scrape(admin), "pidgate_producer_ids_waiting", **user) == 0
    with KafkaSocket(proxy.bootstrap):
        wait_until(lambda: metric(scrape(admin), "pidgate_connections") == 1, 10, "one open")
    wait_until(lambda: metric(scrape(admin), "pidgate_connections") == 0, 10, "closed again")

    assert http_get(admin, "/healthz")[0] == 200
    assert http_get(admin, "/readyz")[0] == 200  # tansu accepts connections

    state = get_state(admin)
    assert state["quotas"]["producer_ids_rate"] == {"ANONYMOUS": 2}
    assert state["quotas"]["window_seconds"] == 60
    (anonymous,) = [p for p in state["principals"] if p["principal"] == "User:ANONYMOUS"]
    assert anonymous["producer_ids_rate"] == 2
    assert anonymous["tokens"] < 1
    assert anonymous["layers"] >= 1 and anonymous["bits"] > 0
    assert state["memory"]["principals_tracked"] == 1

    # A pidgate whose upstream is a closed port is alive but not ready.
    dead_port = free_port()
    orphan = start_proxy(proxy={"upstream": [f"127.0.0.1:{dead_port}"]})
    orphan_admin = admin_address(orphan)
    assert http_get(orphan_admin, "/healthz")[0] == 200
    assert http_get(orphan_admin, "/readyz") == (
        503,
        f"not ready: no upstream broker answered at 127.0.0.1:{dead_port} (connection refused)\n",
    )


def produce_summary(producer_id: int) -> ProduceRequestSummary:
    """What pidgate's connection would hand the gatekeeper for one idempotent batch."""
    payload = produce_frame("synthetic", producer_id, 1)[4:]
    header = parse_request_header(payload)
    return parse_produce_request(payload[header.header_bytes :], header.api_version)


def test_user_label_cardinality_is_capped_with_10k_principals(broker: EmbeddedBroker) -> None:
    settings = operate_settings(
        broker,
        quota={"users": {"<default>": {RATE_KEY: 1}}},
        admin={"max_user_labels": 100},
    )
    principals = 10_000
    with BackgroundProxy(settings) as proxy:
        summaries = [produce_summary(1_000_000 + 2 * i) for i in range(2)]
        decisions: dict[str, int] = defaultdict(int)
        done = threading.Event()
        errors: list[BaseException] = []

        def drive() -> None:  # on the proxy's loop, like a connection would
            try:
                gatekeeper = proxy.server.context.gatekeeper
                first, second = summaries
                for i in range(principals):
                    context = ProduceContext(
                        principal=f"User:u{i}",
                        client_id=f"synthetic-{i}",
                        client_software_name=None,
                        peer="127.0.0.1:1",
                    )
                    for summary in (first, second):  # one PID fits the quota, the next not
                        decisions[type(gatekeeper.check(context, summary)).__name__] += 1
            except BaseException as error:
                errors.append(error)
            finally:
                done.set()

        proxy.call(drive)
        assert done.wait(25), "the synthetic principals took too long"
        assert errors == []
        assert decisions == {Admitted.__name__: principals, Rejected.__name__: principals}

        samples = scrape(admin_address(proxy))
        per_user = {
            name: {labels["user"] for labels, _ in series}
            for name, series in samples.items()
            if any("user" in labels for labels, _ in series)
        }
        for name in (
            "pidgate_producer_ids_rate",
            "pidgate_producer_ids_tokens",
            "pidgate_producer_ids_throttle_time_seconds",
            "pidgate_producer_ids_new_total",
            "pidgate_produce_requests_rejected_total",
        ):
            assert name in per_user, name
        for name, users in per_user.items():
            assert len(users) <= 101, (name, len(users))
        assert "__other__" in per_user["pidgate_producer_ids_new_total"]
        assert metric(samples, "pidgate_user_labels") <= 100
        assert metric(samples, "pidgate_principals_tracked") == principals
        # Nothing is lost by aggregating: every principal's decision is in some label's count.
        new_total = sum(v for _, v in samples["pidgate_producer_ids_new_total"])
        rejected = sum(v for _, v in samples["pidgate_produce_requests_rejected_total"])
        assert new_total == principals and rejected == principals


# -- 2. AlterClientQuotas / DescribeClientQuotas ------------------------------------------------


def test_client_quota_apis_change_and_read_producer_ids_rate(
    broker: EmbeddedBroker, start_proxy: Callable[..., BackgroundProxy]
) -> None:
    # Unlimited at first. Grandfathering off: this test counts as new every PID allocated after
    # a change returns, while with it a PID allocated during the PID frontier probe that
    # follows the change (milliseconds) would pass free (docs/grandfathering.md).
    proxy = start_proxy(
        quota={"producer.id.quota.window.size.seconds": HOUR_S, "grandfather_grace_ms": 0}
    )
    address = proxy.bootstrap
    admin = admin_address(proxy)
    topic = unique_name("quota-api")
    create_topic(address, topic)

    versions = advertised_versions(address)
    assert versions[DESCRIBE_CLIENT_QUOTAS] == (0, 1)
    assert versions[ALTER_CLIENT_QUOTAS] == (0, 1)
    for version in (0, 1):
        assert describe_quotas(address, MATCH_ANY, version=version) == {}

    def new_pid() -> int:
        return init_producer_id(address)[0]

    # validate_only: a valid change is accepted and nothing changes.
    for version in (0, 1):
        result = alter_quotas(address, [("ANONYMOUS", [rate_op(1)])], version, validate_only=True)
        assert result == [(0, None, [("user", "ANONYMOUS")])]
    assert describe_quotas(address, MATCH_ANY) == {}
    assert get_state(admin)["quotas"]["producer_ids_rate"] == {}
    known = new_pid()
    for _ in range(3):  # still unlimited
        assert produce_once(address, topic, new_pid()) == 0
    assert produce_once(address, topic, known) == 0

    # Set producer_ids_rate=1 for ANONYMOUS (v0), read it back (exact and any; v0 and v1).
    assert alter_quotas(address, [("ANONYMOUS", [rate_op(1)])], version=0) == [
        (0, None, [("user", "ANONYMOUS")])
    ]
    for version in (0, 1):
        assert describe_quotas(address, MATCH_EXACT, "ANONYMOUS", version) == {
            "ANONYMOUS": {RATE_KEY: 1.0}
        }
        assert describe_quotas(address, MATCH_ANY, version=version) == {
            "ANONYMOUS": {RATE_KEY: 1.0}
        }
    assert describe_quotas(address, MATCH_EXACT, "alice") == {}
    assert get_state(admin)["quotas"]["producer_ids_rate"] == {"ANONYMOUS": 1}

    # The next new PID takes the one token; the one after is throttled.
    assert produce_once(address, topic, new_pid()) == 0
    throttled = new_pid()
    assert produce_once(address, topic, throttled) == REJECTED_DEFAULT

    # Bad values get the broker's INVALID_REQUEST with a message, and change nothing.
    for version in (0, 1):
        for bad in (-1.0, 1.5):
            ((code, message, entity),) = alter_quotas(
                address, [("ANONYMOUS", [rate_op(bad)])], version
            )
            assert code == INVALID_REQUEST and message and RATE_KEY in message, (bad, message)
            assert entity == [("user", "ANONYMOUS")]
    assert describe_quotas(address, MATCH_EXACT, "ANONYMOUS") == {"ANONYMOUS": {RATE_KEY: 1.0}}

    # Mixed with a broker key, against a broker without client-quota APIs: the entity fails as
    # a whole (UNSUPPORTED_VERSION) and its producer_ids_rate is not applied (all or nothing).
    ((code, message, _),) = alter_quotas(
        address, [("ANONYMOUS", [rate_op(50), ("producer_byte_rate", 1024.0, False)])]
    )
    assert code == UNSUPPORTED_VERSION and message, message
    assert describe_quotas(address, MATCH_EXACT, "ANONYMOUS") == {"ANONYMOUS": {RATE_KEY: 1.0}}
    assert produce_once(address, topic, throttled) == REJECTED_DEFAULT

    # The default user entity (entity_name null).
    assert alter_quotas(address, [(None, [rate_op(7)])], version=0) == [(0, None, [("user", None)])]
    assert describe_quotas(address, MATCH_DEFAULT, version=0) == {None: {RATE_KEY: 7.0}}
    assert describe_quotas(address, MATCH_ANY) == {
        None: {RATE_KEY: 7.0},
        "ANONYMOUS": {RATE_KEY: 1.0},
    }
    assert get_state(admin)["quotas"]["producer_ids_rate"] == {"<default>": 7, "ANONYMOUS": 1}

    # Removing both: ANONYMOUS is unlimited again.
    assert alter_quotas(address, [(None, [REMOVE_RATE]), ("ANONYMOUS", [REMOVE_RATE])]) == [
        (0, None, [("user", None)]),
        (0, None, [("user", "ANONYMOUS")]),
    ]
    assert describe_quotas(address, MATCH_ANY) == {}
    assert produce_once(address, topic, throttled) == 0
    for _ in range(3):
        assert produce_once(address, topic, new_pid()) == 0
    assert get_state(admin)["quotas"]["producer_ids_rate"] == {}


# -- 3. restart --------------------------------------------------------------------------------


def test_throttled_principal_and_known_pids_survive_a_restart(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    state_path = tmp_path / "pidgate-state.bin"
    state = {"path": str(state_path), "persist_interval_ms": 200}
    quota = anonymous_quota(producer_ids_rate=1, window_seconds=HOUR_S)
    topic = unique_name("restart")

    first = BackgroundProxy(operate_settings(broker, quota=quota, state=state)).start()
    try:
        create_topic(first.bootstrap, topic)
        known = init_producer_id(first.bootstrap)[0]
        throttled = init_producer_id(first.bootstrap)[0]
        assert produce_once(first.bootstrap, topic, known) == 0
        assert produce_once(first.bootstrap, topic, throttled) == REJECTED_DEFAULT
        assert alter_quotas(first.bootstrap, [("alice", [rate_op(3)])]) == [
            (0, None, [("user", "alice")])
        ]
    finally:
        first.stop()  # saves the state
    assert state_path.is_file()

    with BackgroundProxy(operate_settings(broker, quota=quota, state=state)) as second:
        # Still throttled, and the PID it knew is still known (no token needed).
        assert produce_once(second.bootstrap, topic, throttled) == REJECTED_DEFAULT
        assert produce_once(second.bootstrap, topic, known, base_sequence=1) == 0
        assert second.server.counters.new_producer_ids_admitted == 0
        # The runtime override survived too; the config file's quota is still in force.
        assert describe_quotas(second.bootstrap, MATCH_ANY) == {
            "ANONYMOUS": {RATE_KEY: 1.0},
            "alice": {RATE_KEY: 3.0},
        }
        state_view = get_state(admin_address(second))
        assert state_view["quotas"]["overrides"] == {"alice": 3}
        (anonymous,) = state_view["principals"]
        assert anonymous["principal"] == "User:ANONYMOUS" and anonymous["tokens"] < 1


def test_the_state_file_is_rewritten_while_serving_with_what_was_admitted_since(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The periodic save (copied a step of principals at a time, the loop let through between
    steps) writes a state a restart can load, and the next save holds what came after."""
    state_path = tmp_path / "pidgate-state.bin"
    state = {"path": str(state_path), "persist_interval_ms": 200}
    quota = anonymous_quota(producer_ids_rate=5, window_seconds=HOUR_S)
    topic = unique_name("periodic-save")

    def saved_knows(producer_id: int) -> bool:
        if not state_path.is_file():
            return False
        now_ms = time.time_ns() // 1_000_000
        policy = QuotaPolicy(window_ms=HOUR_S * 1000, default_producer_ids_rate=5)
        restored, _ = load_state(state_path.read_bytes(), policy, now_ms)
        return restored.is_known("User:ANONYMOUS", producer_id, now_ms)

    with BackgroundProxy(operate_settings(broker, quota=quota, state=state)) as proxy:
        create_topic(proxy.bootstrap, topic)
        first, second = init_producer_id(proxy.bootstrap)[0], init_producer_id(proxy.bootstrap)[0]
        assert produce_once(proxy.bootstrap, topic, first) == 0
        wait_until(lambda: saved_knows(first), 10, "a save that knows the first PID")
        assert produce_once(proxy.bootstrap, topic, second) == 0
        # Saved again while serving, not only at shutdown:
        wait_until(lambda: saved_knows(second), 10, "a later save that knows the second PID")


def test_a_save_still_being_written_at_stop_never_replaces_the_final_one(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A periodic save that is slow to write (a slow disk, made here by a sleep before the real
    write: a timing no real part can show on demand) is still writing when pidgate stops; the
    final save, which holds a PID admitted after it, must be what stays on disk."""
    state_path = tmp_path / "pidgate-state.bin"
    state = {"path": str(state_path), "persist_interval_ms": 300}
    quota = anonymous_quota(producer_ids_rate=5, window_seconds=HOUR_S)
    topic = unique_name("slow-save")
    real_write = server_module.write_encoded
    writing, written = threading.Event(), threading.Event()

    def slow_write(save: Any, settings: Settings) -> None:
        writing.set()
        time.sleep(1.5)
        real_write(save, settings)
        written.set()

    monkeypatch.setattr(server_module, "write_encoded", slow_write)
    proxy = BackgroundProxy(operate_settings(broker, quota=quota, state=state)).start()
    try:
        create_topic(proxy.bootstrap, topic)
        late = init_producer_id(proxy.bootstrap)[0]
        assert writing.wait(10), "no periodic save began"
        assert produce_once(proxy.bootstrap, topic, late) == 0  # after that save was copied
    finally:
        proxy.stop()
    assert written.wait(10), "the periodic save never finished"
    now_ms = time.time_ns() // 1_000_000
    policy = QuotaPolicy(window_ms=HOUR_S * 1000, default_producer_ids_rate=5)
    restored, _ = load_state(state_path.read_bytes(), policy, now_ms)
    assert restored.is_known("User:ANONYMOUS", late, now_ms)


def test_corrupt_state_file_starts_clean_with_a_warning(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    state_path = tmp_path / "state.bin"
    state_path.write_bytes(b"\x00not a pidgate state file\xff" * 10)
    config = tmp_path / "pidgate.yaml"
    config.write_text(
        "state:\n"
        f"  path: {json.dumps(str(state_path))}\n"
        "  persist_interval_ms: 200\n"
        "quota:\n"
        f"  producer.id.quota.window.size.seconds: {HOUR_S}\n"
        "  users: {ANONYMOUS: {producer_ids_rate: 1}}\n"
    )
    topic = unique_name("corrupt")
    create_topic(broker.bootstrap, topic)
    process = PidgateProcess(broker.bootstrap, free_port(), extra_args=("--config", str(config)))
    try:
        process.wait_listening()
        wait_until(
            lambda: any(e.get("event") == "state_file_corrupt" for e in process.log_events()),
            10,
            "state_file_corrupt logged",
        )
        (event,) = [e for e in process.log_events() if e.get("event") == "state_file_corrupt"]
        assert event["path"] == str(state_path) and event["level"] == "warning"
        assert Path(event["kept_as"]).is_file()  # the evidence is kept
        # Started clean: a full bucket, so the first new PID is admitted and the next is not.
        assert produce_once(process.bootstrap, topic, init_producer_id(process.bootstrap)[0]) == 0
        second = init_producer_id(process.bootstrap)[0]
        assert produce_once(process.bootstrap, topic, second) == REJECTED_DEFAULT
        # And the periodic save replaced the corrupt file with a good one.
        wait_until(state_path.is_file, 5, "state file rewritten")
        assert process.terminate() == 0
    finally:
        process.close()


# -- 4. SIGHUP ----------------------------------------------------------------------------------


def quota_config(rate: int) -> str:
    return (
        "quota:\n"
        f"  producer.id.quota.window.size.seconds: {HOUR_S}\n"
        f"  users: {{ANONYMOUS: {{producer_ids_rate: {rate}}}}}\n"
    )


def test_sighup_reloads_quotas_and_keeps_the_old_config_when_the_file_is_broken(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    config = tmp_path / "pidgate.yaml"
    config.write_text(quota_config(5))
    topic = unique_name("sighup")
    create_topic(broker.bootstrap, topic)
    process = PidgateProcess(broker.bootstrap, free_port(), extra_args=("--config", str(config)))
    admin = f"127.0.0.1:{process.admin_port}"

    def reloads(result: str) -> float:
        return metric(scrape(admin), "pidgate_config_reloads_total", result=result)

    def effective() -> dict[str, int]:
        rates: dict[str, int] = get_state(admin)["quotas"]["producer_ids_rate"]
        return rates

    try:
        process.wait_listening()
        wait_until(lambda: http_get(admin, "/healthz")[0] == 200, 10, "admin HTTP up")
        assert effective() == {"ANONYMOUS": 5}
        assert reloads("success") == 0 and reloads("failure") == 0

        config.write_text(quota_config(1))
        os.kill(process.pid, signal.SIGHUP)
        wait_until(lambda: reloads("success") == 1, 10, "reload counted")
        assert effective() == {"ANONYMOUS": 1}
        assert any(e.get("event") == "config_reloaded" for e in process.log_events())
        # The new limit is in force: one new PID, then throttled.
        assert produce_once(process.bootstrap, topic, init_producer_id(process.bootstrap)[0]) == 0
        throttled = init_producer_id(process.bootstrap)[0]
        assert produce_once(process.bootstrap, topic, throttled) == REJECTED_DEFAULT

        # A broken file (bad YAML, then an invalid value): the old config stays, still running.
        for broken in ("quota: [unclosed\n", quota_config(1).replace(": 1}", ": -3}")):
            assert "-3" in broken or "unclosed" in broken
            expected_failures = reloads("failure") + 1
            config.write_text(broken)
            os.kill(process.pid, signal.SIGHUP)
            wait_until(
                lambda: reloads("failure") == expected_failures,  # noqa: B023 - waited here
                10,
                "failure counted",
            )
            assert process.process.poll() is None
            assert effective() == {"ANONYMOUS": 1}
        assert reloads("success") == 1
        failed = [e for e in process.log_events() if e.get("event") == "config_reload_failed"]
        assert len(failed) == 2 and all(e["level"] == "error" for e in failed)
        assert produce_once(process.bootstrap, topic, throttled) == REJECTED_DEFAULT
        assert process.terminate() == 0
    finally:
        process.close()


# -- 5. bounded logs ----------------------------------------------------------------------------


def test_a_storm_of_rejections_writes_a_bounded_number_of_log_lines(
    broker: EmbeddedBroker,
) -> None:
    topic = unique_name("log-storm")
    create_topic(broker.bootstrap, topic)
    process = PidgateProcess(
        broker.bootstrap,
        free_port(),
        extra_args=("--producer-ids-rate", "ANONYMOUS=0", "--quota-window-seconds", str(HOUR_S)),
        # Answered at once, not held: 300 rejections in a row, each logged or counted.
        env={"PIDGATE_REJECTION_MAX_HOLD_MS": "0"},
    )
    storm = 300
    try:
        process.wait_listening()
        started = time.monotonic()
        # Fresh PIDs, never seen by the broker: pidgate rejects them before forwarding.
        codes = [
            produce_once(process.bootstrap, topic, 5_000_000 + i, correlation_id=i)
            for i in range(storm)
        ]
        elapsed = time.monotonic() - started
        assert codes == [REJECTED_DEFAULT] * storm
        samples = scrape(f"127.0.0.1:{process.admin_port}")
        assert metric(samples, "pidgate_produce_requests_rejected_total", user="ANONYMOUS") == storm

        def throttled_lines() -> list[dict[str, Any]]:
            return [e for e in process.log_events() if e.get("event") == "pid_throttled"]

        wait_until(lambda: len(throttled_lines()) >= 1, 5, "a pid_throttled line")
        # Default limit: 5 lines per (event, key) per 10 s window; one window per 10 s elapsed.
        windows = int(elapsed // 10) + 1
        lines = throttled_lines()
        assert 1 <= len(lines) <= 5 * windows + 1, (len(lines), elapsed)
        assert all(line["principal"] == "User:ANONYMOUS" for line in lines)
        assert process.terminate() == 0
    finally:
        process.close()
