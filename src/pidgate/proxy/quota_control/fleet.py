"""Fleet sync: pidgate instances (and worker processes) that share ``fleet.id`` share known PIDs
and token spending through one topic on the upstream cluster (issue "fleet").

Why: each process judges with its own Bloom layers and token buckets. A sidecar that a partition
leader just moved to has never seen that producer's PID, and N gateways behind one name give a
principal N times its rate. With a fleet, a PID admitted anywhere is known everywhere, and in
``fleet`` scope every member debits the tokens the others took.

Record format (topic ``fleet.topic``, default ``pidgate-fleet-<fleet.id>``, one partition,
``cleanup.policy=delete``, ``retention.ms`` = two quota windows), key = the principal, value =
compact JSON::

    {"v": 1, "m": "<member>", "p": "<principal>", "n": [new PIDs], "k": [known PIDs], "t": ts_ms}

``n``: PIDs this member admitted as new (one token each); ``k``: PIDs it admitted free
(grandfathered) or re-announces because they stay active. A member batches what it admitted for
``fleet.flush_interval_ms`` (100 ms) into one record per principal, so the topic carries at most
one record per active principal per interval, and its PIDs are bounded by the rate of *new* PIDs
plus each active PID once per half window (``QuotaManager._to_announce``): ~16 bytes a PID.

Consistency: admission stays local and immediate; the others learn within the flush interval
plus the topic's round trip (``pidgate_fleet_lag_seconds``). Two members can spend the same last
tokens in that time: the overshoot is at most ``members × lag × rate / window`` tokens beyond
the quota, per lag interval, measured in tests/integration/test_fleet.py and documented in the
README. A debit never takes a bucket below empty.

A member reads the topic from one window back before it serves (``start`` blocks until caught
up), applying each record at its own timestamp, so a member restarted without a state file knows
every PID the fleet admitted within the window and every bucket's level. Records of this very
process (its ``member`` id has a per-process suffix) are skipped; those of its previous
incarnation are not. A member cut off from the topic keeps enforcing locally, says so
(``pidgate_fleet_connected`` 0, a log line, ``/state``), keeps what it admitted meanwhile (up to
``fleet.max_pending_producer_ids``) and sends it when the topic is back.

Owns: ``FleetRecord`` and its codec, ``FleetOutbox`` (a ``DecisionObserver``), ``FleetSync``
(the reader/writer thread) and its Prometheus collector. Talks to the cluster with kafka-python,
never through pidgate. Must not import the server or connections; never logs ``security``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, TopicAlreadyExistsError
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.kafka_admin import open_admin_client
from pidgate.proxy.logs import get_logger
from pidgate.proxy.quota_control.admission import ProduceContext
from pidgate.proxy.quota_control.cluster_clients import cluster_client_config
from pidgate.proxy.upstream_check import describe_error
from pidgate.quota.manager import Admitted, Decision

__all__ = [
    "FleetError",
    "FleetOutbox",
    "FleetRecord",
    "FleetSync",
    "decode_record",
    "encode_record",
]

RECORD_VERSION = 1
_POLL_MS = 100
_STOP_JOIN_S = 10.0


class FleetError(Exception):
    """The fleet topic could not be set up or caught up with."""


@dataclass(frozen=True, slots=True)
class FleetRecord:
    member: str
    principal: str
    new_producer_ids: tuple[int, ...]
    known_producer_ids: tuple[int, ...]
    ts_ms: int


def encode_record(record: FleetRecord) -> bytes:
    return json.dumps(
        {
            "v": RECORD_VERSION,
            "m": record.member,
            "p": record.principal,
            "n": list(record.new_producer_ids),
            "k": list(record.known_producer_ids),
            "t": record.ts_ms,
        },
        separators=(",", ":"),
    ).encode()


def _pids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(pid, int) and not isinstance(pid, bool) and pid >= 0 for pid in value
    ):
        raise ValueError("producer ids must be a list of non-negative integers")
    return tuple(value)


def decode_record(value: bytes | None) -> FleetRecord | None:
    """The record, or None for anything that is not a fleet record of a known version (a
    newer member's record is skipped rather than misread)."""
    if not value:
        return None
    try:
        document = json.loads(value)
        if not isinstance(document, dict) or document.get("v") != RECORD_VERSION:
            return None
        member, principal, ts_ms = document["m"], document["p"], document["t"]
        if not (isinstance(member, str) and isinstance(principal, str) and principal):
            return None
        if not isinstance(ts_ms, int) or isinstance(ts_ms, bool):
            return None
        return FleetRecord(member, principal, _pids(document["n"]), _pids(document["k"]), ts_ms)
    except (ValueError, KeyError, UnicodeDecodeError):
        return None


class FleetOutbox:
    """What this member admitted, per principal, until the fleet thread sends it: a
    ``DecisionObserver`` on the event loop, drained from the fleet thread (hence the lock)."""

    #: Keeps the decision's PIDs, never reads the request (admission.reads_request).
    reads_request = False

    def __init__(self, member: str, clock_ms: Callable[[], int], max_pending: int) -> None:
        self.member = member
        self._clock_ms = clock_ms
        self._max_pending = max_pending
        self._lock = threading.Lock()
        self._new: dict[str, dict[int, None]] = {}
        self._known: dict[str, dict[int, None]] = {}
        self._pending = 0
        #: PIDs not announced because the outbox was full (the topic unreachable for long).
        self.dropped = 0

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        if not isinstance(decision, Admitted) or not decision.tracked:
            return
        known = decision.grandfathered_producer_ids + decision.announced_producer_ids
        if decision.new_producer_ids:
            self._add(self._new, context.principal, decision.new_producer_ids)
        if known:
            self._add(self._known, context.principal, known)

    def _add(
        self, table: dict[str, dict[int, None]], principal: str, pids: tuple[int, ...]
    ) -> None:
        with self._lock:
            if self._pending + len(pids) > self._max_pending:
                self.dropped += len(pids)
                return
            table.setdefault(principal, {}).update(dict.fromkeys(pids))
            self._pending += len(pids)

    def drain(self) -> list[FleetRecord]:
        with self._lock:
            new, known = self._new, self._known
            self._new, self._known, self._pending = {}, {}, 0
        now_ms = self._clock_ms()
        return [
            FleetRecord(
                self.member,
                principal,
                tuple(new.get(principal, ())),
                tuple(known.get(principal, ())),
                now_ms,
            )
            for principal in {**new, **known}
        ]

    def put_back(self, records: list[FleetRecord]) -> None:
        """Records that could not be sent: kept (bounded) for the next attempt."""
        for record in records:
            if record.new_producer_ids:
                self._add(self._new, record.principal, record.new_producer_ids)
            if record.known_producer_ids:
                self._add(self._known, record.principal, record.known_producer_ids)


class FleetSync:
    """This member's reader and writer of the fleet topic, in one daemon thread.

    ``on_records`` is called from that thread with every other member's records in log order
    (hop to the event loop with ``call_soon_threadsafe``); ``start`` returns once the topic has
    been read up to the end offset found at start."""

    def __init__(
        self,
        bootstrap_servers: list[str],
        topic: str,
        outbox: FleetOutbox,
        on_records: Callable[[list[FleetRecord]], None],
        *,
        window_ms: int,
        flush_interval_ms: int = 100,
        security: dict[str, Any] | None = None,
    ) -> None:
        self._bootstrap = list(bootstrap_servers)
        self._topic = topic
        self._partition = TopicPartition(topic, 0)
        self._outbox = outbox
        self._on_records = on_records
        self._window_ms = window_ms
        self._flush_interval_s = flush_interval_ms / 1000
        self._security = dict(security or {})
        self._log = get_logger().bind(component="fleet", topic=topic, member=outbox.member)
        self._producer: KafkaProducer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._caught_up = threading.Event()
        self._failed: BaseException | None = None
        # -- status, read by metrics and /state (plain values: torn reads are harmless) --
        self.connected = False
        self.records_sent = 0
        self.producer_ids_sent = 0
        self.records_applied = 0
        self.send_errors = 0
        self.lag_ms = 0
        self.catch_up_ms: int | None = None
        self.members_seen: dict[str, int] = {}

    @property
    def member(self) -> str:
        return self._outbox.member

    @property
    def topic(self) -> str:
        return self._topic

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> None:
        started = time.monotonic()
        deadline = started + timeout_s
        try:
            self._ensure_topic(deadline)
            self._producer = KafkaProducer(
                acks="all",
                allow_auto_create_topics=False,
                enable_idempotence=False,  # duplicates are harmless: learning is idempotent
                linger_ms=0,
                max_block_ms=2_000,
                delivery_timeout_ms=30_000,
                **self._client_config(deadline),
            )
            self._thread = threading.Thread(target=self._run, name="pidgate-fleet", daemon=True)
            self._thread.start()
            while not self._caught_up.wait(0.05):
                if self._failed is not None:
                    raise FleetError(f"fleet reader failed: {self._failed}") from None
                if time.monotonic() > deadline:
                    raise FleetError(
                        f"did not catch up with fleet topic {self._topic!r} within {timeout_s}s"
                    )
        except BaseException:
            self.stop()
            raise
        self.catch_up_ms = int((time.monotonic() - started) * 1000)
        self._log.info(
            "fleet_caught_up", catch_up_ms=self.catch_up_ms, records=self.records_applied
        )

    def stop(self) -> None:
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_JOIN_S)
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                self._send(producer)  # what was admitted since the last flush
                producer.flush(timeout=2)
            with contextlib.suppress(Exception):
                producer.close(timeout=2)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        consumer: KafkaConsumer | None = None
        try:
            consumer = KafkaConsumer(
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                allow_auto_create_topics=False,
                **self._client_config(time.monotonic() + 30.0),
            )
            consumer.assign([self._partition])
            self._seek_one_window_back(consumer)
            target = consumer.end_offsets([self._partition]).get(self._partition, 0)
            self.connected = True
            next_flush = time.monotonic()
            while not self._stopping.is_set():
                try:
                    batches = consumer.poll(timeout_ms=_POLL_MS)
                    if not self.connected:
                        self._log.info("fleet_topic_reachable")
                    self.connected = True
                except KafkaError as error:
                    if self.connected:
                        self._log.warning("fleet_topic_unreachable", error=str(error)[:200])
                    self.connected = False
                    self._stopping.wait(0.2)
                    batches = {}
                records = [
                    decoded
                    for messages in batches.values()
                    for message in messages
                    if (decoded := decode_record(message.value)) is not None
                ]
                self._apply(records)
                if not self._caught_up.is_set():
                    position = consumer.position(self._partition)
                    if position is not None and position >= target and not batches:
                        self._caught_up.set()
                if self._caught_up.is_set() and time.monotonic() >= next_flush:
                    next_flush = time.monotonic() + self._flush_interval_s
                    producer = self._producer
                    if producer is not None:
                        self._send(producer)
        except BaseException as error:
            if not self._stopping.is_set():
                self._failed = error
                self._log.error("fleet_reader_failed", error=str(error)[:200])
        finally:
            self.connected = False
            if consumer is not None:
                with contextlib.suppress(Exception):
                    consumer.close(autocommit=False)

    def _seek_one_window_back(self, consumer: KafkaConsumer) -> None:
        """Records older than the window hold nothing a member still needs."""
        since_ms = int(time.time() * 1000) - self._window_ms
        try:
            found = consumer.offsets_for_times({self._partition: since_ms})
            start = found.get(self._partition)
        except Exception:  # a broker without timestamp lookups: read it all, skip old ones
            start = None
            consumer.seek_to_beginning(self._partition)
            return
        if start is None:
            consumer.seek_to_end(self._partition)
        else:
            consumer.seek(self._partition, start.offset)

    def _apply(self, records: list[FleetRecord]) -> None:
        if not records:
            return
        now_ms = int(time.time() * 1000)
        horizon = now_ms - self._window_ms
        others = []
        for record in records:
            self.members_seen[record.member] = record.ts_ms
            if record.member == self.member or record.ts_ms <= horizon:
                continue
            others.append(record)
            self.lag_ms = max(0, now_ms - record.ts_ms)
        if others:
            self.records_applied += len(others)
            self._on_records(others)

    def _send(self, producer: KafkaProducer) -> None:
        records = self._outbox.drain()
        if not records:
            return
        unsent: list[FleetRecord] = []
        for record in records:
            try:
                producer.send(
                    self._topic,
                    key=record.principal.encode(),
                    value=encode_record(record),
                    partition=0,
                ).add_errback(self._send_failed)
                self.records_sent += 1
                self.producer_ids_sent += len(record.new_producer_ids) + len(
                    record.known_producer_ids
                )
            except Exception as error:  # buffer full or no metadata: keep it for later
                self._send_failed(error)
                unsent.append(record)
        if unsent:
            self._outbox.put_back(unsent)

    def _send_failed(self, error: BaseException) -> None:
        self.send_errors += 1
        if self.connected:
            self._log.warning("fleet_send_failed", error=str(error)[:200])

    # -- set-up -------------------------------------------------------------------------------

    def _client_config(self, deadline: float) -> dict[str, Any]:
        return cluster_client_config(
            self._bootstrap, f"pidgate-fleet-{self.member}", deadline, self._security
        )

    def _ensure_topic(self, deadline: float) -> None:
        last_error: BaseException | None = None
        while time.monotonic() < deadline and not self._stopping.is_set():
            admin: KafkaAdminClient | None = None
            try:
                admin = open_admin_client(**self._client_config(deadline))
                with contextlib.suppress(TopicAlreadyExistsError):
                    admin.create_topics(
                        {
                            self._topic: {
                                "num_partitions": 1,
                                "replication_factor": -1,
                                "configs": {
                                    "cleanup.policy": "delete",
                                    "retention.ms": str(2 * self._window_ms),
                                },
                            }
                        },
                        wait_for_metadata=True,
                    )
                return
            except Exception as error:  # not reachable yet: retry until the deadline
                last_error = error
                time.sleep(0.2)
            finally:
                if admin is not None:
                    with contextlib.suppress(Exception):
                        admin.close()
        raise FleetError(
            f"could not set up the fleet topic {self._topic!r} on {self._bootstrap}: "
            f"{describe_error(last_error) if last_error else 'stopped'}"
        )

    # -- observability -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        return {
            "topic": self._topic,
            "member": self.member,
            "connected": self.connected,
            "catch_up_ms": self.catch_up_ms,
            "lag_ms": self.lag_ms,
            "records_sent": self.records_sent,
            "records_applied": self.records_applied,
            "send_errors": self.send_errors,
            "producer_ids_not_announced": self._outbox.dropped,
            "members_seen": {
                member: now_ms - ts for member, ts in sorted(self.members_seen.items())
            },
        }

    def describe(self) -> Iterator[Metric]:
        """Prometheus families (registered by the server through ``FleetCollector``)."""
        yield GaugeMetricFamily(
            "pidgate_fleet_connected",
            "1 while this member reads and writes the fleet topic; 0: enforcing alone",
            value=1 if self.connected else 0,
        )
        yield GaugeMetricFamily(
            "pidgate_fleet_lag_seconds",
            "Age of the last fleet record applied here (another member's admission to here)",
            value=self.lag_ms / 1000,
        )
        yield GaugeMetricFamily(
            "pidgate_fleet_catch_up_seconds",
            "How long this member took to read the fleet topic before serving",
            value=(self.catch_up_ms or 0) / 1000,
        )
        yield CounterMetricFamily(
            "pidgate_fleet_records_sent", "Fleet records written", value=self.records_sent
        )
        yield CounterMetricFamily(
            "pidgate_fleet_producer_ids_sent",
            "Producer IDs announced to the fleet (new, grandfathered or still active)",
            value=self.producer_ids_sent,
        )
        yield CounterMetricFamily(
            "pidgate_fleet_records_applied",
            "Other members' fleet records applied here",
            value=self.records_applied,
        )
        yield CounterMetricFamily(
            "pidgate_fleet_send_errors", "Fleet records not written", value=self.send_errors
        )
        yield CounterMetricFamily(
            "pidgate_fleet_producer_ids_not_announced",
            "Admitted producer IDs never announced because the outbox was full",
            value=self._outbox.dropped,
        )


class FleetCollector:
    """Adapts ``FleetSync.describe`` to prometheus_client's collector protocol."""

    def __init__(self, fleet: FleetSync) -> None:
        self._fleet = fleet

    def collect(self) -> Iterator[Metric]:
        return self._fleet.describe()
