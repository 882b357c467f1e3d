"""The shared quota store against a real tansu broker on loopback: two instances converge on a
quota changed through one, a late instance catches up before ``start`` returns, tombstones
remove overrides, the broker being down at start or while running is handled, ``stop`` is
bounded and leaves no threads, and credentials never reach the logs.

The one fake: tansu accepts any topic config, so the "broker refuses cleanup.policy=compact"
path is exercised by making the admin client raise the error a Kafka broker would return.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import InvalidConfigurationError

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.quota_control.shared_store import (
    DEFAULT_USER,
    QuotaOverride,
    SharedQuotaStore,
    SharedStoreError,
)
from tests.integration.helpers import unique_name, wait_until

pytestmark = pytest.mark.integration

#: Propagation is one poll interval plus a fetch; this bound is generous for a loaded CI box.
CONVERGE_S = 10.0


class Recorder:
    """An ``on_change`` that remembers every call, thread-safely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[QuotaOverride] = []
        self.threads: set[str] = set()

    def __call__(self, override: QuotaOverride) -> None:
        with self._lock:
            self.calls.append(override)
            self.threads.add(threading.current_thread().name)

    def latest(self) -> dict[str, int | None]:
        with self._lock:
            return {call.user: call.producer_ids_rate for call in self.calls}

    def saw(self, user: str, rate: int | None) -> bool:
        latest = self.latest()
        return user in latest and latest[user] == rate


def store_threads() -> list[threading.Thread]:
    """The readers, and kafka-python's threads (named after the store's client id)."""
    return [t for t in threading.enumerate() if t.name.startswith("pidgate-shared-store")]


def reader_threads() -> list[threading.Thread]:
    return [t for t in store_threads() if t.name.startswith("pidgate-shared-store-reader-")]


@pytest.fixture
def make_store(broker: EmbeddedBroker) -> Iterator[Callable[..., SharedQuotaStore]]:
    """``make_store(topic, name, on_change, **kwargs)`` -> a started store, stopped after."""
    made: list[SharedQuotaStore] = []

    def make(
        topic: str,
        name: str,
        on_change: Callable[[QuotaOverride], None],
        bootstrap: str | None = None,
        **kwargs: Any,
    ) -> SharedQuotaStore:
        store = SharedQuotaStore(
            [bootstrap or broker.bootstrap], topic, name, on_change, poll_timeout_ms=200, **kwargs
        )
        made.append(store)
        store.start(timeout_s=20)
        return store

    yield make
    for store in made:
        store.stop()


def test_two_instances_converge_on_a_quota_changed_through_one(
    make_store: Callable[..., SharedQuotaStore],
) -> None:
    topic = unique_name("pidgate-quotas")
    seen_a, seen_b = Recorder(), Recorder()
    a = make_store(topic, "a", seen_a)
    b = make_store(topic, "b", seen_b)
    assert a.healthy and b.healthy

    started = time.monotonic()
    a.publish(QuotaOverride("alice", 50))
    wait_until(lambda: seen_b.saw("alice", 50), CONVERGE_S, "B sees alice=50 published by A")
    print(f"\nA->B propagation: {(time.monotonic() - started) * 1000:.0f} ms")
    # A applies its own write once it is in the log, like everyone else.
    wait_until(lambda: seen_a.saw("alice", 50), CONVERGE_S, "A sees its own alice=50")

    started = time.monotonic()
    b.publish(QuotaOverride("alice", None))
    wait_until(lambda: seen_a.saw("alice", None), CONVERGE_S, "A sees B's removal of alice")
    print(f"B->A removal propagation: {(time.monotonic() - started) * 1000:.0f} ms")
    wait_until(lambda: seen_b.saw("alice", None), CONVERGE_S, "B sees its own removal")

    b.publish(QuotaOverride(DEFAULT_USER, 7))
    wait_until(
        lambda: a.overrides() == b.overrides() == {DEFAULT_USER: 7},
        CONVERGE_S,
        "both caches hold only users.<default>=7",
    )
    # on_change runs on the store's reader thread, never the caller's.
    assert seen_a.threads == {"pidgate-shared-store-reader-a"}
    assert seen_b.threads == {"pidgate-shared-store-reader-b"}


def test_concurrent_writers_converge_on_the_log_order(
    make_store: Callable[..., SharedQuotaStore],
) -> None:
    topic = unique_name("pidgate-quotas")
    seen_a, seen_b = Recorder(), Recorder()
    a = make_store(topic, "a", seen_a)
    b = make_store(topic, "b", seen_b)
    writers = [
        threading.Thread(target=lambda s=s, i=i: s.publish(QuotaOverride("bob", i)))
        for i in range(10)
        for s in (a, b)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(CONVERGE_S)
    wait_until(
        lambda: len(seen_a.calls) == len(seen_b.calls) == 20,
        CONVERGE_S,
        "both instances read all 20 writes",
    )
    # Whatever order the writes landed in, both instances end on the same (last) value.
    assert seen_a.calls == seen_b.calls
    assert a.overrides() == b.overrides()


def test_a_late_instance_has_the_fleets_overrides_when_start_returns(
    make_store: Callable[..., SharedQuotaStore],
) -> None:
    topic = unique_name("pidgate-quotas")
    first = make_store(topic, "first", Recorder())
    for override in [
        QuotaOverride("alice", 50),
        QuotaOverride("bob", 10),
        QuotaOverride(DEFAULT_USER, 5),
        QuotaOverride("bob", None),
        QuotaOverride("alice", 70),
    ]:
        first.publish(override)

    late_seen = Recorder()
    started = time.monotonic()
    late = make_store(topic, "late", late_seen)
    print(f"\nlate instance start() with 5 records: {(time.monotonic() - started) * 1000:.0f} ms")
    # No waiting: start() returned only after reading up to the end offsets.
    assert late.overrides() == {"alice": 70, DEFAULT_USER: 5}
    assert late_seen.latest() == {"alice": 70, "bob": None, DEFAULT_USER: 5}
    assert len(late_seen.calls) == 5  # every record, in log order
    assert late.healthy


def test_a_late_instance_reads_big_batches_fully_before_start_returns(
    broker: EmbeddedBroker, make_store: Callable[..., SharedQuotaStore]
) -> None:
    """More records than one poll returns, written in multi-record batches (tansu reports such
    a batch's end offset as its base offset + 1, so the end offset alone is not enough)."""
    topic = unique_name("pidgate-quotas")
    make_store(topic, "creator", Recorder())
    raw = KafkaProducer(  # a few batches, each bigger than one poll
        bootstrap_servers=[broker.bootstrap], acks="all", linger_ms=500, batch_size=1 << 20
    )
    try:
        futures = [
            raw.send(
                topic,
                key=f"user-{i % 1500}".encode(),
                value=json.dumps({"producer_ids_rate": i}).encode(),
                partition=0,
            )
            for i in range(3000)
        ]
        raw.flush(timeout=20)
        assert all(f.get(timeout=10) for f in futures)
    finally:
        raw.close(timeout=5)

    seen = Recorder()
    started = time.monotonic()
    late = make_store(topic, "late", seen)
    print(
        f"\nlate instance start() with 3000 records: {(time.monotonic() - started) * 1000:.0f} ms"
    )
    assert len(seen.calls) == 3000
    assert late.overrides() == {f"user-{i}": 1500 + i for i in range(1500)}


def test_tombstones_and_foreign_records(
    broker: EmbeddedBroker, make_store: Callable[..., SharedQuotaStore]
) -> None:
    """Records written by something other than pidgate: a raw tombstone removes an override;
    malformed records are skipped without stopping the reader."""
    topic = unique_name("pidgate-quotas")
    seen = Recorder()
    store = make_store(topic, "reader", seen)
    store.publish(QuotaOverride("carol", 30))
    wait_until(lambda: seen.saw("carol", 30), CONVERGE_S, "carol=30")

    raw = KafkaProducer(bootstrap_servers=[broker.bootstrap], acks="all")
    try:
        for key, value in [
            (b"carol", None),  # tombstone
            (None, b'{"producer_ids_rate": 1}'),  # no key
            (b"dave", b"not json"),
            (b"dave", b'{"producer_ids_rate": -3}'),
            (b"dave", b'{"producer_ids_rate": "many"}'),
            (b"\xff\xfe", b'{"producer_ids_rate": 1}'),  # key not UTF-8
            (b"erin", json.dumps({"producer_ids_rate": 12}).encode()),
        ]:
            raw.send(topic, key=key, value=value, partition=0).get(timeout=10)
    finally:
        raw.close(timeout=5)

    wait_until(lambda: seen.saw("erin", 12), CONVERGE_S, "erin=12 after the malformed records")
    assert seen.saw("carol", None)
    assert "dave" not in seen.latest()
    assert store.overrides() == {"erin": 12}
    assert store.healthy


def test_on_change_failures_do_not_stop_the_reader(
    make_store: Callable[..., SharedQuotaStore],
) -> None:
    topic = unique_name("pidgate-quotas")
    seen = Recorder()

    def flaky(override: QuotaOverride) -> None:
        seen(override)
        if override.user == "boom":
            raise RuntimeError("callback bug")

    store = make_store(topic, "flaky", flaky)
    store.publish(QuotaOverride("boom", 1))
    store.publish(QuotaOverride("fine", 2))
    wait_until(lambda: seen.saw("fine", 2), CONVERGE_S, "the record after the failing one")
    assert store.healthy


def test_topic_is_created_compacted_with_one_partition(
    broker: EmbeddedBroker, make_store: Callable[..., SharedQuotaStore]
) -> None:
    topic = unique_name("pidgate-quotas")
    make_store(topic, "creator", Recorder())
    # A second instance finds the topic already there (TopicAlreadyExists is tolerated).
    make_store(topic, "second", Recorder())
    admin = KafkaAdminClient(bootstrap_servers=[broker.bootstrap])
    try:
        (described,) = admin.describe_topics([topic])
        assert len(described["partitions"]) == 1
        configs = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
        )
        assert configs["topic"][topic]["cleanup.policy"]["value"] == "compact"
    finally:
        admin.close()


def test_a_broker_refusing_compaction_is_logged_and_the_store_still_works(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_create = KafkaAdminClient.create_topics

    def refuse_configs(self: KafkaAdminClient, new_topics: Any, *args: Any, **kwargs: Any) -> Any:
        if any(spec.get("configs") for spec in new_topics.values()):
            raise InvalidConfigurationError("cleanup.policy=compact is not allowed")
        return real_create(self, new_topics, *args, **kwargs)

    monkeypatch.setattr(KafkaAdminClient, "create_topics", refuse_configs)
    topic = unique_name("pidgate-quotas")
    seen = Recorder()
    with structlog.testing.capture_logs() as logs:
        store = SharedQuotaStore([broker.bootstrap], topic, "x", seen, poll_timeout_ms=200)
        try:
            store.start(timeout_s=20)
            store.publish(QuotaOverride("alice", 3))
            wait_until(lambda: seen.saw("alice", 3), CONVERGE_S, "alice=3 on the fallback topic")
        finally:
            store.stop()
    rejected = [e for e in logs if e["event"] == "shared_store_compaction_rejected"]
    assert len(rejected) == 1
    assert rejected[0]["log_level"] == "warning"
    assert "cleanup.policy=compact" in rejected[0]["detail"]


def test_broker_down_at_start_fails_clearly_within_the_timeout() -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    store = SharedQuotaStore([nowhere], unique_name("pidgate-quotas"), "x", Recorder())
    started = time.monotonic()
    with pytest.raises(SharedStoreError, match="could not reach the upstream cluster"):
        store.start(timeout_s=2.0)
    elapsed = time.monotonic() - started
    print(f"\nstart() against a closed port gave up after {elapsed:.2f} s")
    assert elapsed < 5.0
    assert not store.healthy
    assert store_threads() == []
    with pytest.raises(SharedStoreError):
        store.publish(QuotaOverride("alice", 1))


def test_broker_down_while_running_then_back() -> None:
    """tansu keeps topics in memory, so the restarted broker has an empty log (it auto-creates
    the topic on the reader's first request); the store must notice the outage, fail writes
    promptly, and work again once the broker is back."""
    broker = EmbeddedBroker().start()
    try:
        topic = unique_name("pidgate-quotas")
        seen = Recorder()
        store = SharedQuotaStore([broker.bootstrap], topic, "x", seen, poll_timeout_ms=200)
        store.start(timeout_s=20)
        try:
            assert store.healthy
            broker.stop()
            started = time.monotonic()
            wait_until(lambda: not store.healthy, 10.0, "healthy turns False with the broker down")
            print(f"\nunhealthy {(time.monotonic() - started) * 1000:.0f} ms after broker stop")

            started = time.monotonic()
            with pytest.raises(SharedStoreError, match=r"not acknowledged|timed out"):
                store.publish(QuotaOverride("alice", 9), timeout_s=1.0)
            elapsed = time.monotonic() - started
            print(f"publish with the broker down failed after {elapsed:.2f} s")
            assert elapsed < 7.0  # timeout_s, or the 5 s max_block_ms at most

            broker.start()
            started = time.monotonic()
            wait_until(lambda: store.healthy, 20.0, "healthy again after the broker restarts")
            print(f"healthy {(time.monotonic() - started) * 1000:.0f} ms after broker restart")
            # tansu re-creates the (in-memory, lost) topic on the clients' first requests and
            # may answer that first write with UnknownError (-1); a caller retries.
            rate = 11
            for attempt in range(10):
                rate = 11 + attempt
                with contextlib.suppress(SharedStoreError):
                    store.publish(QuotaOverride("alice", rate), timeout_s=5.0)
                    break
            wait_until(lambda: seen.saw("alice", rate), CONVERGE_S, "alice after the restart")
        finally:
            started = time.monotonic()
            store.stop()
            assert time.monotonic() - started < 15.0
        assert store_threads() == []
    finally:
        broker.cleanup()


def test_stop_is_bounded_idempotent_and_leaves_no_threads(broker: EmbeddedBroker) -> None:
    before = {t.ident for t in threading.enumerate()}
    stores = [
        SharedQuotaStore([broker.bootstrap], unique_name("pidgate-quotas"), f"s{i}", Recorder())
        for i in range(3)
    ]
    for store in stores:
        store.start(timeout_s=20)
    assert len(reader_threads()) == 3
    started = time.monotonic()
    for store in stores:
        store.stop()
        store.stop()  # idempotent
    elapsed = time.monotonic() - started
    print(f"\nstopping 3 stores took {elapsed * 1000:.0f} ms")
    assert elapsed < 10.0
    assert store_threads() == []
    wait_until(
        lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before,
        5.0,
        "every thread the stores started has ended",
    )
    for store in stores:
        assert not store.healthy
        with pytest.raises(SharedStoreError):
            store.start()


def test_credentials_never_reach_logs_or_errors(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # kafka-python's own logging too
    password = "s3cr3t-pa55word-xyz"
    security = {
        "security_protocol": "PLAINTEXT",  # tansu has no SASL; the values must still stay hidden
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "svc-pidgate",
        "sasl_plain_password": password,
    }
    with pytest.raises(ValueError, match=r"\['acks'\]") as refused:
        SharedQuotaStore([broker.bootstrap], "t", "x", Recorder(), security={"acks": password})
    assert password not in str(refused.value)

    topic = unique_name("pidgate-quotas")
    seen = Recorder()
    with structlog.testing.capture_logs() as logs:
        store = SharedQuotaStore(
            [broker.bootstrap], topic, "x", seen, security=security, poll_timeout_ms=200
        )
        store.start(timeout_s=20)
        try:
            store.publish(QuotaOverride("alice", 4))
            wait_until(lambda: seen.saw("alice", 4), CONVERGE_S, "alice=4 with security set")
        finally:
            store.stop()
        nowhere = SharedQuotaStore(
            [f"127.0.0.1:{free_port()}"], topic, "y", seen, security=security
        )
        with pytest.raises(SharedStoreError) as failed:
            nowhere.start(timeout_s=1.0)
    assert logs, "the store logs its lifecycle"
    assert password not in repr(logs)
    assert password not in caplog.text
    assert password not in str(failed.value)
    assert password not in repr(store.__dict__.get("_log"))
