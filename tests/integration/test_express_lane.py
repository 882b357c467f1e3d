"""The compiled express lane (issue #25) in front of a real tansu broker, over real sockets.

Proves: a busy producer's steady state (its PID known, the same Produce header, nothing held)
goes through the lane on the compiled path, and nothing a user sees changes: every response
comes back in request order with the broker's answer (offsets one after another: each record
stored once), the metrics count every request, byte and upstream latency exactly at a scrape;
new PIDs inside a pipelined burst are admitted in the lane (the quota's compiled shortcut)
and told to the observers as the Python path tells them: the metrics count them, the event
log has each one's line with its topic and partition; during a grandfathering grace period
the shortcut declines, a burst with a new PID goes the Python way and the lane takes the next;
with ``max_in_flight_requests`` below the burst, reading pauses and resumes and every request
is answered in order. On the pure path (CI's second pass) the same assertions hold with the
lane taking nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.serving.express import COMPILED as EXPRESS_LANE
from tests.integration.conftest import anonymous_quota
from tests.integration.helpers import (
    KafkaSocket,
    admin_address,
    correlation_id_of,
    create_topic,
    decode_produce,
    encode_request,
    http_get,
    init_producer_id,
    produce_request,
    record_batch,
    unique_name,
)
from tests.integration.metrics_text import metric, parse_samples

pytestmark = pytest.mark.integration

VERSION = 9


def _frame(topic: str, producer_id: int, epoch: int, sequence: int, correlation_id: int) -> bytes:
    records = record_batch(producer_id, epoch, base_sequence=sequence)
    return encode_request(produce_request(VERSION, topic, records), VERSION, correlation_id)


def _lane_total(proxy: BackgroundProxy, counter: str) -> int:
    """``counter`` summed over the proxy's open connections: ``express_requests_taken``
    (requests their express lanes took) or ``express_new_producer_ids`` (PIDs admitted there
    as new)."""
    for _ in range(10):  # the proxy's thread may open or close a connection meanwhile
        try:
            return sum(getattr(conn, counter) for conn in list(proxy.server.context.connections))
        except RuntimeError:
            time.sleep(0.01)
    raise AssertionError("the connection set kept changing")


def _lane_requests(proxy: BackgroundProxy) -> int:
    return _lane_total(proxy, "express_requests_taken")


def _answers(conn: KafkaSocket, count: int) -> list[tuple[int, Any, int]]:
    """(correlation id, decoded Produce response, frame bytes) of the next ``count``."""
    answers = []
    for _ in range(count):
        payload = conn.recv_frame()
        answers.append(
            (correlation_id_of(payload), decode_produce(payload, VERSION), 4 + len(payload))
        )
    return answers


def _offsets(answers: list[tuple[int, Any, int]]) -> list[int]:
    offsets = []
    for _, response, _ in answers:
        (partition,) = [p for t in response.responses for p in t.partition_responses]
        assert partition.error_code == 0, partition
        offsets.append(partition.base_offset)
    return offsets


def test_a_busy_producer_goes_through_the_lane_and_every_request_is_counted(start_proxy) -> None:
    proxy = start_proxy(quota=anonymous_quota(10, 3600))
    topic = unique_name("express")
    create_topic(proxy.bootstrap, topic)
    producer_id, epoch = init_producer_id(proxy.bootstrap)
    sent_bytes = 0
    answers: list[tuple[int, Any, int]] = []
    with KafkaSocket(proxy.bootstrap) as conn:
        # One at a time, then bursts of 32 pipelined requests: both shapes of a busy producer.
        for sequence in range(40):
            frame = _frame(topic, producer_id, epoch, sequence, 1000 + sequence)
            conn.sendall(frame)
            sent_bytes += len(frame)
            answers += _answers(conn, 1)
        for burst in range(5):
            frames = [
                _frame(topic, producer_id, epoch, sequence, 1000 + sequence)
                for sequence in range(40 + 32 * burst, 40 + 32 * (burst + 1))
            ]
            conn.sendall(b"".join(frames))
            sent_bytes += sum(len(f) for f in frames)
            answers += _answers(conn, len(frames))
        taken = _lane_requests(proxy)
    answered_bytes = sum(size for _, _, size in answers)
    requests = 40 + 5 * 32
    assert [c for c, *_ in answers] == [1000 + s for s in range(requests)]
    offsets = _offsets(answers)
    assert offsets == list(range(offsets[0], offsets[0] + requests)), "a record stored twice"
    # The first request took the Python path (its PID new, its header not seen yet), and so
    # did the second (the quota finds a principal's very first PID by a scan, then caches
    # where it is); every later one could take the lane.
    assert taken >= requests - 2 if EXPRESS_LANE else taken == 0, taken

    status, text = http_get(admin_address(proxy), "/metrics")
    assert status == 200
    samples = parse_samples(text)
    produce = {"api_key": "Produce"}
    assert metric(samples, "pidgate_requests_total", **produce) == requests
    assert metric(samples, "pidgate_request_bytes_total", **produce) == sent_bytes
    assert metric(samples, "pidgate_response_bytes_total", **produce) == answered_bytes
    assert metric(samples, "pidgate_upstream_latency_seconds_count", **produce) == requests
    assert metric(samples, "pidgate_producer_ids_new_total", user="ANONYMOUS") == 1


def _renumbered(frame: bytes, correlation_id: int) -> bytes:
    return frame[:8] + correlation_id.to_bytes(4, "big") + frame[12:]


@pytest.mark.parametrize("event_log", [True, False], ids=["event-log", "no-reader"])
def test_new_pids_inside_a_burst_are_admitted_in_the_lane_and_told_to_the_observers(
    start_proxy, tmp_path: Path, event_log: bool
) -> None:
    """With the event log on, an observer reads each new PID's request (the lane copies it out
    of its scratch buffer); without it, no told observer reads it (the lane copies nothing) and
    the metrics and the decision counters still count every new PID."""
    # No grace period: the quota's compiled shortcut decides a new PID at once.
    quota = {**anonymous_quota(10, 3600), "grandfather_grace_ms": 0}
    logging = {"event_log": {"directory": str(tmp_path)}} if event_log else {}
    proxy = start_proxy(quota=quota, **logging)
    assert proxy.server.context.gatekeeper.reads_requests is event_log
    topic = unique_name("express-new")
    create_topic(proxy.bootstrap, topic)
    known, known_epoch = init_producer_id(proxy.bootstrap)
    fresh = [init_producer_id(proxy.bootstrap) for _ in range(4)]
    with KafkaSocket(proxy.bootstrap) as conn:
        for sequence in range(2):  # the known PID: admitted, then cached where it is
            conn.sendall(_frame(topic, known, known_epoch, sequence, sequence))
            _offsets(_answers(conn, 1))
        before = _lane_requests(proxy)
        # 16 pipelined: the known PID's, with each fresh PID's first batch among them.
        frames = [_frame(topic, known, known_epoch, 2 + i, 0) for i in range(12)]
        for index, (producer_id, epoch) in enumerate(fresh):
            frames.insert(1 + 3 * index, _frame(topic, producer_id, epoch, 0, 0))
        frames = [_renumbered(frame, 10 + i) for i, frame in enumerate(frames)]
        conn.sendall(b"".join(frames))
        answers = _answers(conn, 16)
        taken = _lane_requests(proxy) - before
        admitted_in_lane = _lane_total(proxy, "express_new_producer_ids")
    assert [c for c, *_ in answers] == list(range(10, 26))
    _offsets(answers)  # every one admitted and stored
    if EXPRESS_LANE:
        assert (taken, admitted_in_lane) == (16, 4)
    else:
        assert (taken, admitted_in_lane) == (0, 0)
    status, text = http_get(admin_address(proxy), "/metrics")
    assert status == 200
    assert metric(parse_samples(text), "pidgate_producer_ids_new_total", user="ANONYMOUS") == 5
    assert proxy.server.counters.new_producer_ids_admitted == 5
    if not event_log:
        return
    # The event log's line for each new PID names its batch's topic and partition: the lane
    # handed the observers the request itself, not only the decision.
    deadline = time.monotonic() + 10
    while True:  # the event log's writer flushes every second
        events = [
            json.loads(line)
            for path in sorted(tmp_path.glob("pidgate-events-*.jsonl"))
            for line in path.read_text().splitlines()
        ]
        admitted = {e["producer_id"]: e for e in events if e["event"] == "admitted_new"}
        if len(admitted) == 5 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert sorted(admitted) == sorted([known] + [pid for pid, _ in fresh])
    for producer_id, epoch in fresh:
        line = admitted[producer_id]
        assert (line["topic"], line["partition"], line["producer_epoch"]) == (topic, 0, epoch)


def test_in_a_grace_period_a_new_pid_sends_its_burst_the_python_way_and_the_lane_takes_the_next(
    start_proxy,
) -> None:
    # During a grandfathering grace period (here an hour) a new PID may pass free: the quota's
    # compiled shortcut leaves the decision to the Python path.
    quota = {**anonymous_quota(10, 3600), "grandfather_grace_ms": 3_600_000}
    proxy = start_proxy(quota=quota)
    topic = unique_name("express-mixed")
    create_topic(proxy.bootstrap, topic)
    known, known_epoch = init_producer_id(proxy.bootstrap)
    fresh, fresh_epoch = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(_frame(topic, known, known_epoch, 0, 1))
        _offsets(_answers(conn, 1))  # known from here on
        conn.sendall(_frame(topic, known, known_epoch, 1, 2))
        _offsets(_answers(conn, 1))
        before = _lane_requests(proxy)
        # 16 pipelined: 15 of the known PID's, with the fresh PID's first batch in the middle.
        frames = [_frame(topic, known, known_epoch, 2 + i, 0) for i in range(15)]
        frames.insert(8, _frame(topic, fresh, fresh_epoch, 0, 0))
        frames = [_renumbered(frame, 10 + i) for i, frame in enumerate(frames)]
        conn.sendall(b"".join(frames))
        mixed = _answers(conn, 16)
        after_mixed = _lane_requests(proxy)
        frames = [_frame(topic, known, known_epoch, 17 + i, 30 + i) for i in range(16)]
        conn.sendall(b"".join(frames))
        steady = _answers(conn, 16)
        after_steady = _lane_requests(proxy)
    assert [c for c, *_ in mixed] == list(range(10, 26))
    assert [c for c, *_ in steady] == list(range(30, 46))
    _offsets(mixed)  # every one admitted and stored
    _offsets(steady)
    if EXPRESS_LANE:
        # The burst carrying a new PID was read whole by the Python path (the lane takes a
        # read only when it can take all of it); the next burst was the lane's again. A burst
        # may reach pidgate in more than one read: the lane takes the reads after the new PID.
        assert after_mixed - before < 16
        assert after_steady - after_mixed == 16
    else:
        assert after_steady == 0
    status, text = http_get(admin_address(proxy), "/metrics")
    assert status == 200
    samples = parse_samples(text)
    assert metric(samples, "pidgate_producer_ids_new_total", user="ANONYMOUS") == 2
    assert metric(samples, "pidgate_requests_total", api_key="Produce") == 2 + 16 + 16


def test_a_burst_past_the_in_flight_limit_is_answered_in_order(start_proxy) -> None:
    proxy = start_proxy(quota=anonymous_quota(10, 3600), proxy={"max_in_flight_requests": 4})
    topic = unique_name("express-in-flight")
    create_topic(proxy.bootstrap, topic)
    producer_id, epoch = init_producer_id(proxy.bootstrap)
    with KafkaSocket(proxy.bootstrap) as conn:
        conn.sendall(_frame(topic, producer_id, epoch, 0, 1))
        _offsets(_answers(conn, 1))
        for burst in range(3):
            frames = [
                _frame(topic, producer_id, epoch, 1 + 40 * burst + i, 100 * (burst + 1) + i)
                for i in range(40)
            ]
            conn.sendall(b"".join(frames))
            answers = _answers(conn, 40)
            assert [c for c, *_ in answers] == [100 * (burst + 1) + i for i in range(40)]
            offsets = _offsets(answers)
            assert offsets == list(range(offsets[0], offsets[0] + 40))
        # Nothing owed and reading on again: the pause for the limit was lifted each time.
        open_conns = list(proxy.server.context.connections)
        assert open_conns
        assert all(c.responses_owed == 0 and not c.reading_paused for c in open_conns)
    status, text = http_get(admin_address(proxy), "/metrics")
    assert status == 200
    assert metric(parse_samples(text), "pidgate_requests_total", api_key="Produce") == 121


def test_a_pipelining_producer_comes_back_to_the_lane_without_draining(start_proxy) -> None:
    """Its requests in flight never all drain: the lane takes over the Python path's plain
    Produce slots (it would never run again otherwise once a new PID sent a read the Python
    way)."""
    proxy = start_proxy(quota=anonymous_quota(10, 3600))
    topic = unique_name("express-pipelined")
    create_topic(proxy.bootstrap, topic)
    known, known_epoch = init_producer_id(proxy.bootstrap)
    fresh, fresh_epoch = init_producer_id(proxy.bootstrap)
    depth, count = 8, 200
    with KafkaSocket(proxy.bootstrap) as conn:
        for sequence in range(2):  # the known PID: admitted, then cached where it is
            conn.sendall(_frame(topic, known, known_epoch, sequence, sequence))
            _offsets(_answers(conn, 1))
        before = _lane_requests(proxy)
        frames = [_frame(topic, fresh, fresh_epoch, 0, 100)] + [
            _frame(topic, known, known_epoch, 2 + i, 101 + i) for i in range(count - 1)
        ]
        conn.sendall(b"".join(frames[:depth]))  # the fresh PID first: a read for Python
        answers = []
        for sent in range(depth, count + depth):
            answers += _answers(conn, 1)
            if sent < count:
                conn.sendall(frames[sent])
        taken = _lane_requests(proxy) - before
    assert [c for c, *_ in answers] == list(range(100, 100 + count))
    _offsets(answers)
    if EXPRESS_LANE:
        # All but the first read's: the next request found only plain Produce slots owed.
        assert taken >= count - 2 * depth, taken
    else:
        assert taken == 0
