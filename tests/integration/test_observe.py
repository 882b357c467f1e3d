"""Observe mode (issue #26) over real sockets against tansu: pidgate decides as enforcement
would, forwards every Produce, and records the would-be rejections in the event log, /metrics
and /state; switched live per principal and for the default user (``pidgate quotas set
--observe/--enforce``, SIGHUP), observe -> enforce starts from the warmed state, and the mode
survives a restart with ``state.path``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from structlog.testing import capture_logs

from pidgate.cli import main
from pidgate.config import LoggingSettings
from pidgate.demo.broker import EmbeddedBroker
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.logs import configure_logging
from pidgate.proxy.operations.event_format import EVENT_FIELDS
from tests.integration.conftest import proxy_settings
from tests.integration.helpers import (
    KafkaSocket,
    admin_address,
    create_topic,
    decode_produce,
    http_get,
    init_producer_id,
    produce_frame,
    produce_partition_errors,
    unique_name,
    wait_until,
)
from tests.integration.metrics_text import metric, parse_samples
from tests.integration.test_holding import hold_stats

pytestmark = pytest.mark.integration

RATE = 2
PRODUCERS = 8
HOUR_S = 3600
ANONYMOUS = {"user": "ANONYMOUS", "principal": "User:ANONYMOUS"}
#: What pidgate answers a throttled client that names no software (rejection.error_codes).
THROTTLED = [19]


def quota(mode: str = "enforce", rate: int = RATE) -> dict[str, Any]:
    """``rate`` new PIDs per hour for ANONYMOUS (no refill within a test)."""
    return {
        "producer.id.quota.window.size.seconds": HOUR_S,
        "mode": mode,
        "users": {"ANONYMOUS": {"producer_ids_rate": rate}},
    }


def storm(bootstrap: str, topic: str, message_timeout_ms: int) -> list[list[str]]:
    """PRODUCERS confluent-kafka producers (each a new PID), 3 records each: their errors."""
    errors: list[list[str]] = [[] for _ in range(PRODUCERS)]

    def one(index: int) -> None:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "client.id": f"observed-{index}",
                "message.timeout.ms": message_timeout_ms,
            }
        )
        for record in range(3):
            producer.produce(
                topic,
                f"{index}-{record}".encode(),
                on_delivery=lambda e, _m, i=index: errors[i].append(str(e)) if e else None,
            )
        producer.flush(60)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    return errors


def read_events(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("pidgate-events-*.jsonl"))
        for line in path.read_text().splitlines()
    ]


def run_storm(
    broker: EmbeddedBroker, directory: Path, mode: str, rejection: dict[str, Any]
) -> tuple[list[list[str]], list[dict[str, Any]], str, dict[str, Any], BackgroundProxy]:
    """The same storm under ``mode``: (delivery errors, events, /metrics, /state, the proxy)."""
    settings = proxy_settings(
        broker, quota=quota(mode), rejection=rejection, event_log={"directory": str(directory)}
    )
    with BackgroundProxy(settings) as proxy:
        topic = unique_name(f"storm-{mode}")
        create_topic(proxy.bootstrap, topic)
        errors = storm(proxy.bootstrap, topic, message_timeout_ms=4000)
        time.sleep(1.5)  # the event log's writer flushes every second
        admin = admin_address(proxy)
        metrics_text = http_get(admin, "/metrics")[1]
        state = json.loads(http_get(admin, "/state")[1])
        if mode == "observe":
            assert hold_stats(proxy) == {
                "held": 0, "held_bytes": 0, "refused": 0, "released": 0, "expired": 0,
                "dropped": 0,
            }  # fmt: skip
    return errors, read_events(directory), metrics_text, state, proxy


def pids(events: list[dict[str, Any]], kind: str) -> set[int]:
    return {e["producer_id"] for e in events if e["event"] == kind}


def test_an_observed_storm_delivers_everything_and_records_what_enforcement_rejects(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # Observe, with holding on as by default: nothing is held, nothing rejected.
    errors, events, metrics_text, state, _ = run_storm(broker, tmp_path / "observe", "observe", {})
    assert errors == [[] for _ in range(PRODUCERS)], errors
    admitted, would_reject = pids(events, "admitted_new"), pids(events, "would_reject")
    assert not pids(events, "rejected")
    assert len(admitted) == RATE  # the tokens went to the first PIDs, as enforced
    assert len(would_reject) == PRODUCERS - RATE
    assert not admitted & would_reject  # no token came within the hour
    for event in events:
        assert tuple(event) == EVENT_FIELDS
        if event["event"] == "would_reject":
            assert event["principal"] == "User:ANONYMOUS"
            assert event["throttle_ms"] > 0 and event["tokens"] is not None
            assert event["client_id"].startswith("observed-")
            assert event["topic"].startswith("storm-observe")
    would_reject_events = sum(e["event"] == "would_reject" for e in events)

    samples = parse_samples(metrics_text)
    assert metric(samples, "pidgate_producer_ids_would_reject_total", **ANONYMOUS) == (
        would_reject_events
    )
    requests = metric(samples, "pidgate_produce_requests_would_reject_total", **ANONYMOUS)
    assert PRODUCERS - RATE <= requests <= would_reject_events
    assert metric(samples, "pidgate_quota_observe", **ANONYMOUS) == 1
    assert metric(samples, "pidgate_produce_requests_rejected_total", **ANONYMOUS) == 0
    assert metric(samples, "pidgate_producer_ids_new_total", **ANONYMOUS) == RATE

    assert state["quotas"]["mode"] == "observe"
    (principal,) = state["principals"]
    assert principal["principal"] == "User:ANONYMOUS" and principal["user"] == "ANONYMOUS"
    assert principal["mode"] == "observe"
    assert principal["would_reject_producer_ids"] == would_reject_events
    assert principal["would_reject_requests"] == requests

    # The same storm enforced (rejected at once, given up after 4 s): the same PIDs admitted,
    # the same number rejected.
    errors, events, metrics_text, state, _ = run_storm(
        broker, tmp_path / "enforce", "enforce", {"max_hold_ms": 0, "max_throttle_time_ms": 500}
    )
    assert sum(1 for e in errors if e) == PRODUCERS - RATE
    assert len(pids(events, "admitted_new")) == RATE
    assert len(pids(events, "rejected")) == len(would_reject)
    assert not pids(events, "would_reject")
    assert state["quotas"]["mode"] == "enforce"
    assert metric(parse_samples(metrics_text), "pidgate_quota_observe", **ANONYMOUS) == 0


# -- live switching, one new PID at a time over raw sockets ----------------------------------


def produce_new_pid(proxy: BackgroundProxy, topic: str, correlation_id: int) -> list[int]:
    """A fresh PID from the cluster, then one Produce with it: its partition error codes."""
    pid, _ = init_producer_id(proxy.bootstrap)
    return produce_with(proxy, topic, pid, correlation_id)


def produce_with(
    proxy: BackgroundProxy, topic: str, pid: int, correlation_id: int, sequence: int = 0
) -> list[int]:
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(produce_frame(topic, pid, correlation_id, base_sequence=sequence))
        return produce_partition_errors(decode_produce(conn.recv_frame(), 8))


def quotas(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["quotas", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def principal_state(admin: str) -> dict[str, Any]:
    """The one principal of /state at ``admin`` (admin_address, read before any reload), with
    the global mode."""
    state = json.loads(http_get(admin, "/state")[1])
    (principal,) = state["principals"]
    return dict(principal, global_mode=state["quotas"]["mode"])


@pytest.fixture(autouse=True)
def _logs_to_stderr() -> None:
    """The in-process pidgate logs to stderr as in production, so stdout is the command's."""
    configure_logging(LoggingSettings(format="json"))


def test_quotas_set_switches_a_user_and_the_default_user_live(
    start_proxy: Callable[..., BackgroundProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    # One new PID per hour, answered at once when throttled (holding off): a rejection is seen.
    proxy = start_proxy(quota=quota("enforce", rate=1), rejection={"max_hold_ms": 0})
    admin = admin_address(proxy)
    server = ["--bootstrap-server", proxy.bootstrap]
    topic = unique_name("observe-live")
    create_topic(proxy.bootstrap, topic)
    assert produce_new_pid(proxy, topic, 1) == [0]  # the one token
    assert produce_new_pid(proxy, topic, 2) == THROTTLED  # enforced: rejected

    quotas(capsys, "set", *server, "--user", "ANONYMOUS", "--observe")
    forwarded, _ = init_producer_id(proxy.bootstrap)
    with capture_logs() as logged:
        assert produce_with(proxy, topic, forwarded, 3) == [0]  # observed: forwarded
    (would,) = [line for line in logged if line["event"] == "pid_would_throttle"]
    assert (would["principal"], would["producer_ids"]) == ("User:ANONYMOUS", [forwarded])
    assert quotas(capsys, "describe", *server, "--user", "ANONYMOUS") == (
        "Quota configs for user-principal 'ANONYMOUS' are producer_ids_rate=1, "
        "producer_ids_observe=1\n"
    )
    observed = principal_state(admin)
    assert (observed["mode"], observed["global_mode"]) == ("observe", "enforce")
    assert observed["would_reject_producer_ids"] == 1

    # Back to enforce: the PID forwarded while observed took no token and is not known, so
    # its next request is decided again, and rejected.
    quotas(capsys, "set", *server, "--user", "ANONYMOUS", "--enforce")
    assert produce_with(proxy, topic, forwarded, 4, sequence=1) == THROTTLED
    assert principal_state(admin)["mode"] == "enforce"

    # The user's own mode removed, the default user's observe applies to it.
    quotas(capsys, "delete", *server, "--user", "ANONYMOUS", "--mode")
    quotas(capsys, "set", *server, "--default", "--observe")
    assert produce_new_pid(proxy, topic, 5) == [0]
    assert quotas(capsys, "describe", *server) == (
        "Quota configs for the default user-principal are producer_ids_observe=1\n"
        "Quota configs for user-principal 'ANONYMOUS' are producer_ids_rate=1\n"
    )
    assert principal_state(admin)["global_mode"] == "observe"
    quotas(capsys, "delete", *server, "--default", "--mode")
    assert produce_new_pid(proxy, topic, 6) == THROTTLED
    assert quotas(capsys, "describe", *server) == (
        "Quota configs for user-principal 'ANONYMOUS' are producer_ids_rate=1\n"
    )


def test_a_sighup_reload_switches_the_mode_and_runtime_overrides_win(
    start_proxy: Callable[..., BackgroundProxy],
    broker: EmbeddedBroker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = start_proxy(quota=quota("enforce", rate=1), rejection={"max_hold_ms": 0})
    admin = admin_address(proxy)
    topic = unique_name("observe-hup")
    create_topic(proxy.bootstrap, topic)
    assert produce_new_pid(proxy, topic, 1) == [0]
    assert produce_new_pid(proxy, topic, 2) == THROTTLED

    def reload(mode: str) -> None:  # what SIGHUP does, with the file edited
        settings = proxy_settings(broker, quota=quota(mode, rate=1))
        proxy.call_and_wait(lambda: proxy.server.reload(settings))

    reload("observe")
    assert produce_new_pid(proxy, topic, 3) == [0]
    reload("enforce")
    assert produce_new_pid(proxy, topic, 4) == THROTTLED
    # A runtime override wins over the file, also across a reload.
    quotas(capsys, "set", "--bootstrap-server", proxy.bootstrap, "--default", "--enforce")
    reload("observe")
    assert produce_new_pid(proxy, topic, 5) == THROTTLED
    assert principal_state(admin)["global_mode"] == "enforce"


def test_observe_then_enforce_holds_the_next_new_pid_beyond_the_observed_tokens(
    start_proxy: Callable[..., BackgroundProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    # Holding on, as by default: enforced, a throttled Produce is held.
    proxy = start_proxy(quota=quota("observe", rate=2))
    topic = unique_name("observe-warm")
    create_topic(proxy.bootstrap, topic)
    first = [init_producer_id(proxy.bootstrap)[0] for _ in range(3)]
    assert [produce_with(proxy, topic, pid, n) for n, pid in enumerate(first)] == [[0]] * 3
    assert hold_stats(proxy)["held"] == 0  # observed: the third was forwarded, not held

    quotas(capsys, "set", "--bootstrap-server", proxy.bootstrap, "--default", "--enforce")
    # The two PIDs admitted while observing stay known: forwarded at once.
    assert produce_with(proxy, topic, first[0], 10, sequence=1) == [0]
    assert produce_with(proxy, topic, first[1], 11, sequence=1) == [0]
    # The next new PID finds the bucket the observed run emptied: held for its token.
    late, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as conn:
        conn.sendall(produce_frame(topic, late, 12))
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "the new PID held")
    wait_until(lambda: hold_stats(proxy)["held"] == 0, 5, "the hold dropped at hang-up")


def test_the_mode_set_live_survives_a_restart_with_the_state_file(
    broker: EmbeddedBroker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = {"path": str(tmp_path / "pidgate.state")}
    topic = unique_name("observe-restart")

    def start() -> BackgroundProxy:
        settings = proxy_settings(
            broker, quota=quota("enforce", rate=1), rejection={"max_hold_ms": 0}, state=state
        )
        return BackgroundProxy(settings).start()

    proxy = start()
    try:
        create_topic(proxy.bootstrap, topic)
        quotas(
            capsys, "set", "--bootstrap-server", proxy.bootstrap, "--user", "ANONYMOUS", "--observe"
        )
        known, _ = init_producer_id(proxy.bootstrap)
        assert produce_with(proxy, topic, known, 1) == [0]  # the token
        assert produce_new_pid(proxy, topic, 2) == [0]  # observed
    finally:
        proxy.stop()  # saves the state
    proxy = start()
    admin = admin_address(proxy)
    try:
        assert quotas(capsys, "describe", "--bootstrap-server", proxy.bootstrap) == (
            "Quota configs for user-principal 'ANONYMOUS' are producer_ids_rate=1, "
            "producer_ids_observe=1\n"
        )
        assert produce_new_pid(proxy, topic, 3) == [0]  # still observed
        assert principal_state(admin)["mode"] == "observe"
        quotas(
            capsys, "set", "--bootstrap-server", proxy.bootstrap, "--user", "ANONYMOUS", "--enforce"
        )
        assert produce_with(proxy, topic, known, 4, sequence=1) == [
            0
        ]  # still known after the restart
        assert produce_new_pid(proxy, topic, 5) == THROTTLED  # and the bucket still empty
    finally:
        proxy.stop()


def test_switching_a_principal_to_observe_releases_its_held_produce(
    start_proxy: Callable[..., BackgroundProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = start_proxy(quota=quota("enforce", rate=1))  # holding on, as by default
    topic = unique_name("observe-release")
    create_topic(proxy.bootstrap, topic)
    assert produce_new_pid(proxy, topic, 1) == [0]
    held, _ = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap, timeout_s=15) as conn:
        conn.sendall(produce_frame(topic, held, 2))
        wait_until(lambda: hold_stats(proxy)["held"] == 1, 5, "held: 1")
        quotas(
            capsys, "set", "--bootstrap-server", proxy.bootstrap, "--user", "ANONYMOUS", "--observe"
        )
        # Forwarded to the broker, which accepts it: no throttle, no error.
        response = decode_produce(conn.recv_frame(), 8)
    assert produce_partition_errors(response) == [0] and response.throttle_time_ms == 0
    assert hold_stats(proxy)["released"] == 1
