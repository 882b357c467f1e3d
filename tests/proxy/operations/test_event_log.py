"""Tests for pidgate.proxy.operations.event_log: real files in tmp dirs, read back line by line.

The writer is a background thread, so tests wait for it by polling a condition (with a generous
deadline that only guards against hangs; nothing asserts on elapsed time). Time rotation and
file names use an injected wall clock (``FakeClock``).
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.operations.event_format import EVENT_FIELDS, event_file_name
from pidgate.proxy.operations.event_format import OpenEventFile as _OpenFile
from pidgate.proxy.operations.event_log import EventLog
from pidgate.proxy.quota_control.admission import Gatekeeper, ProduceContext
from pidgate.quota.manager import Admitted, QuotaManager, QuotaPolicy, Rejected

T0_S = 1_700_000_000.0  # 2023-11-14T22:13:20Z
NOW_MS = 1_700_000_123_456
NAME = re.compile(r"^pidgate-events-(?P<instance>.+)-(\d{8}T\d{6})-(\d+)\.jsonl(\.gz)?$")


class FakeClock:
    """Wall seconds that only move when the test says so (thread-safe enough: a float)."""

    def __init__(self, start: float = T0_S) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Stands in for the structlog logger: keeps the warnings."""

    def __init__(self) -> None:
        self.logged: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.logged.append((event, fields))


def wait_until(condition: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    """Poll until ``condition`` holds; fail (never hang) if it does not within the deadline."""
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.002)


def batch(producer_id: int, epoch: int = 0, transactional: bool = False) -> BatchHeader:
    return BatchHeader(
        base_offset=0,
        batch_length=100,
        magic=2,
        attributes=0x10 if transactional else 0,
        last_offset_delta=0,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
        records_count=1,
    )


def produce(*partitions: tuple[str | None, int, list[BatchHeader]]) -> ProduceRequestSummary:
    topics: dict[str | None, list[PartitionProduce]] = {}
    for topic, index, batches in partitions:
        topics.setdefault(topic, []).append(PartitionProduce(index, tuple(batches)))
    return ProduceRequestSummary(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topics=tuple(TopicProduce(name, None, tuple(parts)) for name, parts in topics.items()),
    )


@dataclass(frozen=True, slots=True)
class ContextWithNode:
    """What ProduceContext looks like once it carries the broker node (read via getattr)."""

    principal: str
    client_id: str | None
    client_software_name: str | None
    peer: str
    node_id: int | None


CONTEXT = ProduceContext("User:alice", "orders-app", "apache-kafka-java", "10.0.0.1:5000")


def read_events(directory: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in sorted(directory.iterdir(), key=lambda p: int(NAME.match(p.name)[3])):  # type: ignore[index]
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="ascii") as f:
            events.extend(json.loads(line) for line in f)
    return events


def make_log(directory: Path, **kwargs: Any) -> EventLog:
    defaults: dict[str, Any] = {
        "instance": "proxy-a",
        "now_ms": lambda: NOW_MS,
        "tokens_for": lambda principal, now_ms: 7.5,
        "clock_s": FakeClock(),
        "flush_interval_ms": 20,
    }
    defaults.update(kwargs)
    return EventLog(directory, **defaults)


def test_admitted_rejected_and_init_events_have_exactly_the_design_fields(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []

    def tokens_for(principal: str, now_ms: int) -> float:
        calls.append((principal, now_ms))
        return 2.25

    log = make_log(tmp_path, tokens_for=tokens_for)
    request = produce(
        ("orders", 3, [batch(-1), batch(11, epoch=2)]),
        ("payments", 0, [batch(12, transactional=True), batch(11, epoch=9)]),
    )
    context = ContextWithNode("User:alice", "orders-app", "apache-kafka-java", "peer", 2)
    log.on_decision(context, request, Admitted(new_producer_ids=(11, 12), refreshed_count=1))  # type: ignore[arg-type]
    log.on_decision(CONTEXT, produce(("orders", 1, [batch(13)])), Rejected(250, (13,)))
    log.record_init_producer_id(
        "User:bob", None, "librdkafka", 99, 0, transactional=True, ts_ms=NOW_MS + 5
    )
    assert log.close(timeout_s=10)

    events = read_events(tmp_path)
    assert [list(e) for e in events] == [list(EVENT_FIELDS)] * 4
    common = {"ts_ms": NOW_MS, "principal": "User:alice", "client_id": "orders-app"}
    assert events == [
        {
            **common,
            "event": "admitted_new",
            "producer_id": 11,
            "producer_epoch": 2,
            "client_software": "apache-kafka-java",
            "topic": "orders",
            "partition": 3,
            "node_id": 2,
            "instance": "proxy-a",
            "throttle_ms": None,
            "tokens": 2.25,
            "request_id": 1,
            "transactional": False,
        },
        {
            **common,
            "event": "admitted_new",
            "producer_id": 12,
            "producer_epoch": 0,
            "client_software": "apache-kafka-java",
            "topic": "payments",
            "partition": 0,
            "node_id": 2,
            "instance": "proxy-a",
            "throttle_ms": None,
            "tokens": 2.25,
            "request_id": 1,
            "transactional": True,
        },
        {
            **common,
            "event": "rejected",
            "producer_id": 13,
            "producer_epoch": 0,
            "client_software": "apache-kafka-java",
            "topic": "orders",
            "partition": 1,
            "node_id": None,  # plain ProduceContext: no node known
            "instance": "proxy-a",
            "throttle_ms": 250,
            "tokens": 2.25,
            "request_id": 2,
            "transactional": False,
        },
        {
            "ts_ms": NOW_MS + 5,
            "event": "init_producer_id",
            "principal": "User:bob",
            "producer_id": 99,
            "producer_epoch": 0,
            "client_id": None,
            "client_software": "librdkafka",
            "topic": None,
            "partition": None,
            "node_id": None,
            "instance": "proxy-a",
            "throttle_ms": None,
            "tokens": None,
            "request_id": 3,
            "transactional": True,
        },
    ]
    assert calls == [("User:alice", NOW_MS), ("User:alice", NOW_MS)]
    assert (log.written_events, log.dropped_events, log.write_errors) == (4, 0, 0)


def test_one_file_named_after_instance_utc_time_and_sequence(tmp_path: Path) -> None:
    log = make_log(tmp_path, instance="eu-1")
    log.record_init_producer_id("User:a", "c", None, 1, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=10)
    assert [p.name for p in tmp_path.iterdir()] == ["pidgate-events-eu-1-20231114T221320-0.jsonl"]
    assert event_file_name("x", T0_S, 7, gzip=True) == "pidgate-events-x-20231114T221320-7.jsonl.gz"


def test_file_names_have_no_character_a_hadoop_filesystem_rejects(tmp_path: Path) -> None:
    """The default instance is ``host:port``; Hadoop (so Spark) rejects a colon in a file
    name, so the name carries ``_`` instead while the events keep the real instance."""
    log = make_log(tmp_path, instance="127.0.0.1:29192")
    log.record_init_producer_id("User:a", "c", None, 1, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=10)
    [path] = tmp_path.iterdir()
    assert path.name == "pidgate-events-127.0.0.1_29192-20231114T221320-0.jsonl"
    assert json.loads(path.read_text())["instance"] == "127.0.0.1:29192"
    assert event_file_name("[::1]:9092 a", T0_S, 0, gzip=False) == (
        "pidgate-events-___1__9092_a-20231114T221320-0.jsonl"
    )


def test_events_without_pids_to_report_write_nothing_and_take_no_request_id(
    tmp_path: Path,
) -> None:
    log = make_log(tmp_path)
    request = produce(("t", 0, [batch(5)]))
    log.on_decision(CONTEXT, request, Admitted((), refreshed_count=1))  # refresh only
    log.on_decision(CONTEXT, request, Admitted((), 0, tracked=False))  # unlimited principal
    log.on_decision(CONTEXT, request, Admitted((5,), 0))
    assert log.close(timeout_s=10)
    assert [(e["producer_id"], e["request_id"]) for e in read_events(tmp_path)] == [(5, 1)]


def test_request_id_is_shared_within_a_request_and_increases_across_requests(
    tmp_path: Path,
) -> None:
    log = make_log(tmp_path)
    for n in range(50):
        pids = tuple(range(n * 10, n * 10 + 1 + n % 4))
        request = produce(("t", 0, [batch(pid) for pid in pids]))
        decision = Admitted(pids, 0) if n % 2 else Rejected(10, pids)
        log.on_decision(CONTEXT, request, decision)
    assert log.close(timeout_s=10)
    by_request: dict[int, set[int]] = {}
    for event in read_events(tmp_path):
        by_request.setdefault(event["request_id"], set()).add(event["producer_id"])
    assert sorted(by_request) == list(range(1, 51))
    for n in range(50):
        assert by_request[n + 1] == set(range(n * 10, n * 10 + 1 + n % 4))


def test_real_gatekeeper_and_quota_manager_tokens(tmp_path: Path) -> None:
    """End to end through the Gatekeeper: tokens are the bucket after the decision."""
    manager = QuotaManager(QuotaPolicy(default_producer_ids_rate=2))

    def tokens_for(principal: str, now_ms: int) -> float | None:
        states = {s.principal: s.tokens for s in manager.snapshot(now_ms)}
        return states.get(principal)

    log = make_log(tmp_path, tokens_for=tokens_for, now_ms=lambda: int(time.time() * 1000))
    gate = Gatekeeper(manager, [log])
    for pid in (1, 2, 3):
        gate.check(CONTEXT, produce(("t", pid, [batch(pid)])))
    assert log.close(timeout_s=10)
    events = read_events(tmp_path)
    assert [(e["event"], e["producer_id"], e["partition"]) for e in events] == [
        ("admitted_new", 1, 1),
        ("admitted_new", 2, 2),
        ("rejected", 3, 3),
    ]
    assert events[0]["tokens"] == pytest.approx(1.0, abs=0.01)
    assert events[1]["tokens"] == pytest.approx(0.0, abs=0.01)
    assert events[2]["throttle_ms"] > 0
    assert gate.observer_errors == 0


def test_rotation_by_size(tmp_path: Path) -> None:
    log = make_log(tmp_path, rotate_bytes=1000)
    for pid in range(40):
        log.on_decision(CONTEXT, produce(("t", 0, [batch(pid)])), Admitted((pid,), 0))
    assert log.close(timeout_s=10)
    files = sorted(tmp_path.iterdir(), key=lambda p: int(NAME.match(p.name)[3]))  # type: ignore[index]
    assert len(files) > 5
    assert all(p.stat().st_size <= 1000 for p in files)
    assert [NAME.match(p.name)[3] for p in files] == [str(i) for i in range(len(files))]  # type: ignore[index]
    assert [e["producer_id"] for e in read_events(tmp_path)] == list(range(40))
    assert log.files_rotated == len(files) - 1  # the last one was closed by close()
    assert log.written_events == 40


def test_a_line_larger_than_rotate_bytes_still_gets_written(tmp_path: Path) -> None:
    log = make_log(tmp_path, rotate_bytes=10)
    for pid in range(3):
        log.record_init_producer_id("User:a", None, None, pid, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=10)
    assert len(list(tmp_path.iterdir())) == 3
    assert [e["producer_id"] for e in read_events(tmp_path)] == [0, 1, 2]


def test_rotation_by_time_while_writing_and_when_idle(tmp_path: Path) -> None:
    clock = FakeClock()
    log = make_log(tmp_path, clock_s=clock, rotate_interval_s=60)
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    wait_until(lambda: log.written_events == 1, "the first event")
    clock.now += 59
    log.record_init_producer_id("User:a", None, None, 2, 0, transactional=False, ts_ms=2)
    wait_until(lambda: log.written_events == 2, "the second event")
    assert len(list(tmp_path.iterdir())) == 1 and log.files_rotated == 0

    clock.now += 1  # the file is 60 s old: closed even though nothing new arrives
    wait_until(lambda: log.files_rotated == 1, "the idle file to be closed")
    assert log.current_path is None
    assert [e["producer_id"] for e in read_events(tmp_path)] == [1, 2]

    log.record_init_producer_id("User:a", None, None, 3, 0, transactional=False, ts_ms=3)
    wait_until(lambda: log.written_events == 3, "the third event")
    clock.now += 3600
    log.record_init_producer_id("User:a", None, None, 4, 0, transactional=False, ts_ms=4)
    assert log.close(timeout_s=10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "pidgate-events-proxy-a-20231114T221320-0.jsonl",
        "pidgate-events-proxy-a-20231114T221420-1.jsonl",
        "pidgate-events-proxy-a-20231114T231420-2.jsonl",
    ]
    assert [e["producer_id"] for e in read_events(tmp_path)] == [1, 2, 3, 4]
    assert log.files_rotated == 2


def test_gzip_files_read_back_with_gzip_open(tmp_path: Path) -> None:
    log = make_log(tmp_path, gzip=True, rotate_bytes=4000)
    for pid in range(100):
        log.on_decision(CONTEXT, produce(("t", pid % 3, [batch(pid)])), Rejected(5, (pid,)))
    assert log.close(timeout_s=10)
    files = list(tmp_path.iterdir())
    assert len(files) > 1 and all(p.name.endswith(".jsonl.gz") for p in files)
    for path in files:
        with gzip.open(path, "rt") as f:
            assert all(json.loads(line)["event"] == "rejected" for line in f)
    assert sorted(e["producer_id"] for e in read_events(tmp_path)) == list(range(100))


def test_gzip_file_is_readable_up_to_the_last_flush_while_still_open(tmp_path: Path) -> None:
    log = make_log(tmp_path, gzip=True)
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    wait_until(lambda: log.written_events == 1, "the event")
    path = log.current_path
    assert path is not None

    def flushed() -> bool:
        with open(path, "rb") as raw:
            data = raw.read()
        decompressor = __import__("zlib").decompressobj(31)
        return b'"producer_id":1,' in decompressor.decompress(data)

    wait_until(flushed, "a sync flush of the open gzip file")
    assert log.close(timeout_s=10)


def test_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    existing = tmp_path / event_file_name("proxy-a", T0_S, 0, gzip=False)
    existing.write_text("keep me\n")
    log = make_log(tmp_path)
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=10)
    assert existing.read_text() == "keep me\n"
    assert (tmp_path / event_file_name("proxy-a", T0_S, 1, gzip=False)).exists()


def test_slow_disk_drops_and_counts_events_and_never_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow disk, simulated with a mock (allowed here): ``EventLog._write``, the one place
    bytes go to disk, is replaced by a version that blocks until the test opens a gate. While
    the writer is stuck, 10 000 events must all be accepted or dropped without the caller ever
    waiting (if on_decision blocked, this test would hang: the gate only opens afterwards)."""
    gate = threading.Event()
    entered = threading.Event()
    real_write = EventLog._write

    def stuck_write(self: EventLog, current: _OpenFile, data: bytes) -> None:
        entered.set()
        gate.wait()
        real_write(self, current, data)

    monkeypatch.setattr(EventLog, "_write", stuck_write)
    log = make_log(tmp_path, max_queued_events=100)
    log.record_init_producer_id("User:a", None, None, 0, 0, transactional=False, ts_ms=1)
    assert entered.wait(10), "the writer never reached the disk"

    request_ids_before = 1
    queue_sizes = []
    for pid in range(1, 10_001):
        log.on_decision(CONTEXT, produce(("t", 0, [batch(pid)])), Admitted((pid,), 0))
        queue_sizes.append(log.queued_events)
    # A request with more events than the free space is dropped whole.
    log.on_decision(
        CONTEXT, produce(("t", 0, [batch(p) for p in (70_001, 70_002)])), Rejected(1, (1, 2))
    )
    assert max(queue_sizes) == 100
    assert log.stats().peak_queued_events == 100
    assert log.dropped_events == 10_000 - 100 + 2
    assert log.written_events == 0

    gate.set()
    assert log.close(timeout_s=10)
    events = read_events(tmp_path)
    assert [e["producer_id"] for e in events] == list(range(0, 101))
    assert log.written_events == 101
    assert log.written_events + log.dropped_events == 1 + 10_000 + 2
    assert events[1]["request_id"] == request_ids_before + 1


def test_disk_errors_are_counted_logged_rarely_and_never_raised(tmp_path: Path) -> None:
    recorder = Recorder()
    logged = recorder.logged
    target = tmp_path / "events"
    log = make_log(target, logger=recorder, flush_interval_ms=1)
    target.rmdir()
    target.write_text("not a directory any more")  # every open now fails

    def dropped(count: int) -> Callable[[], bool]:
        return lambda: log.dropped_events == count

    for pid in range(5):
        log.record_init_producer_id("User:a", None, None, pid, 0, transactional=False, ts_ms=1)
        wait_until(dropped(pid + 1), "the event to be dropped")
    assert log.close(timeout_s=10)
    assert log.written_events == 0
    assert log.write_errors >= 1
    assert len(logged) == 1  # once per error_log_interval_s (60 s)
    assert logged[0][0] == "event_log_write_failed"
    assert logged[0][1]["operation"] == "open"


def test_a_failing_write_abandons_the_file_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mock (allowed here): ``EventLog._write`` fails once with ENOSPC, then works again."""
    real_write = EventLog._write
    failures = [OSError(28, "No space left on device")]

    def flaky_write(self: EventLog, current: _OpenFile, data: bytes) -> None:
        if failures:
            raise failures.pop()
        real_write(self, current, data)

    monkeypatch.setattr(EventLog, "_write", flaky_write)
    log = make_log(tmp_path, flush_interval_ms=5, logger=Recorder())
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    wait_until(lambda: log.dropped_events == 1, "the failed event")
    wait_until(lambda: time.monotonic() >= log._retry_after_s, "the retry pause")

    log.record_init_producer_id("User:a", None, None, 2, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=10)
    assert (log.write_errors, log.dropped_events, log.written_events) == (1, 1, 1)
    assert [e["producer_id"] for e in read_events(tmp_path)] == [2]


def test_close_drains_the_queue_and_later_events_are_dropped(tmp_path: Path) -> None:
    log = make_log(tmp_path, flush_interval_ms=60_000)  # only close() flushes
    for pid in range(5000):
        log.on_decision(CONTEXT, produce(("t", 0, [batch(pid)])), Admitted((pid,), 0))
    assert log.close(timeout_s=30)
    assert log.close(timeout_s=1)  # idempotent
    assert log.queued_events == 0
    assert [e["producer_id"] for e in read_events(tmp_path)] == list(range(5000))
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    assert log.dropped_events == 1 and log.written_events == 5000


def test_close_is_bounded_when_the_disk_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mock (allowed here): ``EventLog._write`` blocks until released, as on a hung disk."""
    gate = threading.Event()
    real_write = EventLog._write

    def hung_write(self: EventLog, current: _OpenFile, data: bytes) -> None:
        gate.wait()
        real_write(self, current, data)

    monkeypatch.setattr(EventLog, "_write", hung_write)
    log = make_log(tmp_path)
    log.record_init_producer_id("User:a", None, None, 1, 0, transactional=False, ts_ms=1)
    wait_until(lambda: log.queued_events == 0, "the writer to take the event")
    log.record_init_producer_id("User:a", None, None, 2, 0, transactional=False, ts_ms=1)
    assert log.close(timeout_s=0.05) is False
    assert log.dropped_events == 1  # the queued one; the one in the writer's hands is pending
    gate.set()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rotate_bytes": 0},
        {"rotate_interval_s": 0},
        {"max_queued_events": 0},
        {"flush_interval_ms": 0},
        {"instance": ""},
        {"instance": "a/b"},
    ],
)
def test_invalid_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make_log(tmp_path, **kwargs)


def test_non_finite_tokens_become_null(tmp_path: Path) -> None:
    log = make_log(tmp_path, tokens_for=lambda principal, now_ms: float("inf"))
    log.on_decision(CONTEXT, produce(("t", 0, [batch(1)])), Admitted((1,), 0))
    assert log.close(timeout_s=10)
    assert read_events(tmp_path)[0]["tokens"] is None
