"""The optional shared quota store: a compacted topic on the upstream cluster that every pidgate
instance reads and writes, so a fleet of sidecars agrees on ``producer_ids_rate`` overrides.

Each record is keyed by the user name (``<default>`` for the user-default entity); its value is
JSON ``{"producer_ids_rate": N, "instance": "<writer>", "ts_ms": <wall clock>}`` or a tombstone
(``None``) when the override is removed. Every instance reads the topic from the beginning, with
no consumer group, and applies every record in log order, so the last record for a key wins on
every instance alike; compaction only bounds the topic's size and is not needed for correctness.

The store talks to the upstream cluster directly with kafka-python (never through pidgate, so its
own producer ID is not throttled). Its reader runs in a daemon thread and ``on_change`` is called
from that thread -- for this instance's own writes too, once they are in the log. A caller on an
event loop hops back with ``loop.call_soon_threadsafe``; ``publish`` blocks until the broker
acknowledges, so call it from an executor, not on the loop.

Owns: ``QuotaOverride``, ``SharedQuotaStore``, ``SharedStoreError``. Imports only kafka-python,
``pidgate.proxy.logs``, ``pidgate.proxy.upstream_check`` and ``quota_control.cluster_clients``;
it must not import the server, connections or admission (the server wires it in), nor asyncio.
Never logs the ``security`` settings: they may hold SASL passwords.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import (
    InvalidConfigurationError,
    KafkaError,
    PolicyViolationError,
    TopicAlreadyExistsError,
)

from pidgate.proxy.kafka_admin import open_admin_client
from pidgate.proxy.logs import get_logger
from pidgate.proxy.quota_control.cluster_clients import cluster_client_config
from pidgate.proxy.upstream_check import describe_error

#: The key of the user-default entity (``users.<default>``).
DEFAULT_USER = "<default>"
#: The only config the store sets on the topic it creates.
COMPACT_CONFIG = {"cleanup.policy": "compact"}
#: Prefixes of the kafka-python settings ``security`` may carry; anything else is refused so a
#: caller cannot override acks, idempotence or timeouts by accident.
SECURITY_PREFIXES = ("security_", "sasl_", "ssl_")

#: How long ``send`` may block for metadata or buffer space (the topic's metadata is fetched at
#: start, so it normally does not block at all).
_MAX_BLOCK_MS = 5_000
#: After this, a record ``publish`` gave up on is dropped by the producer instead of landing late.
_DELIVERY_TIMEOUT_MS = 30_000
#: Upper bound on one health probe (a ListOffsets request).
_PROBE_TIMEOUT_MS = 2_000
_RETRY_SLEEP_S = 0.2
#: After the reader has failed this long, it tries to (re)create the topic every so often.
_RECREATE_AFTER_S = 5.0
_STOP_JOIN_S = 10.0
#: ``poll`` returns at most this many records; fewer means the fetched data is drained.
_MAX_POLL_RECORDS = 500
#: kafka-python's admin client logs its whole configuration at DEBUG, passwords included.
_CONFIG_LOGGERS = ("kafka.admin.client",)
_SECRET_MARKERS = ("password", "secret", "token", "keytab", "credential")


class _RedactClientConfig(logging.Filter):
    """Masks secret-looking settings in the configuration dict a kafka-python client logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(isinstance(arg, dict) for arg in args):
            record.args = tuple(_redacted(arg) if isinstance(arg, dict) else arg for arg in args)
        elif isinstance(args, dict):
            record.args = _redacted(args)
        return True


def _redacted(config: dict[Any, Any]) -> dict[Any, Any]:
    return {
        key: "***" if any(m in str(key).lower() for m in _SECRET_MARKERS) else value
        for key, value in config.items()
    }


def _install_log_redaction() -> None:
    for name in _CONFIG_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactClientConfig) for f in logger.filters):
            logger.addFilter(_RedactClientConfig())


class SharedStoreError(Exception):
    """The shared store could not start, or a write was not acknowledged."""


@dataclass(frozen=True)
class QuotaOverride:
    #: User name, or ``"<default>"`` for ``users.<default>``.
    user: str
    #: The quota, or ``None`` when the override is removed.
    producer_ids_rate: int | None


class SharedQuotaStore:
    """One instance's view of, and writer to, the fleet's shared quota topic.

    ``start`` blocks until every record present at start has been passed to ``on_change``;
    afterwards the reader thread delivers new records within about ``poll_timeout_ms``.
    """

    def __init__(
        self,
        bootstrap_servers: list[str],
        topic: str,
        instance_id: str,
        on_change: Callable[[QuotaOverride], None],
        *,
        security: dict[str, Any] | None = None,
        poll_timeout_ms: int = 500,
    ) -> None:
        if not bootstrap_servers:
            raise ValueError("bootstrap_servers is empty")
        if not topic:
            raise ValueError("topic is empty")
        if poll_timeout_ms <= 0:
            raise ValueError("poll_timeout_ms must be positive")
        refused = sorted(k for k in (security or {}) if not k.startswith(SECURITY_PREFIXES))
        if refused:  # names only, never values
            raise ValueError(f"security may only hold {SECURITY_PREFIXES} settings, not {refused}")
        self._bootstrap = list(bootstrap_servers)
        self._topic = topic
        self._partition = TopicPartition(topic, 0)
        self._instance_id = instance_id
        self._on_change = on_change
        self._security: dict[str, Any] = dict(security or {})
        if self._security:
            _install_log_redaction()
        self._poll_timeout_ms = poll_timeout_ms
        self._log = get_logger().bind(component="shared_store", topic=topic, instance=instance_id)

        self._lock = threading.Lock()
        self._latest: dict[str, int] = {}  # user -> rate; removed keys are dropped
        self._producer: KafkaProducer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._caught_up = threading.Event()
        self._settled = threading.Event()  # caught up, or the reader gave up
        self._reader_error: BaseException | None = None
        self._reader_ok = False
        self._started = False

    # -- public API -------------------------------------------------------------------------

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def healthy(self) -> bool:
        """Started, caught up, the reader thread alive and its last broker probe (a
        ListOffsets request, every ``poll_timeout_ms``) answered. A failed ``publish`` is
        reported to its caller, not here."""
        thread = self._thread
        return (
            self._started
            and not self._stopping.is_set()
            and thread is not None
            and thread.is_alive()
            and self._caught_up.is_set()
            and self._reader_ok
        )

    def overrides(self) -> dict[str, int]:
        """The latest rate per user read so far (removed overrides are absent)."""
        with self._lock:
            return dict(self._latest)

    def start(self, timeout_s: float = 30.0) -> None:
        """Ensure the topic exists, start the reader and wait until it has read up to the end
        offsets it found. Raises ``SharedStoreError`` (after stopping what it started) if the
        cluster cannot be reached or the catch-up does not finish within ``timeout_s``."""
        if self._started or self._thread is not None or self._stopping.is_set():
            raise SharedStoreError("a shared store starts once; make a new one after stop()")
        deadline = time.monotonic() + timeout_s
        self._log.info("shared_store_starting", bootstrap=self._bootstrap)
        try:
            self._ensure_topic(deadline)
            self._producer = self._new_producer(deadline)
            self._thread = threading.Thread(
                target=self._read_loop,
                name=f"pidgate-shared-store-reader-{self._instance_id}",
                daemon=True,
            )
            self._thread.start()
            self._settled.wait(max(0.0, deadline - time.monotonic()))
            if self._reader_error is not None:
                raise SharedStoreError(
                    f"shared store reader failed: {self._describe(self._reader_error)}"
                ) from None
            if not self._caught_up.is_set():
                raise SharedStoreError(
                    f"shared store did not catch up on topic {self._topic!r} "
                    f"from {self._bootstrap} within {timeout_s}s"
                )
        except BaseException:
            self.stop()
            raise
        self._started = True
        self._log.info("shared_store_started", overrides=len(self._latest))

    def publish(self, override: QuotaOverride, timeout_s: float = 10.0) -> None:
        """Write ``override`` (a tombstone when its rate is ``None``) and wait for the ack.

        Blocks for up to ``max(timeout_s, 5 s)``. ``SharedStoreError`` means "not confirmed":
        the producer may still deliver the record for up to 30 s afterwards."""
        _validate(override)
        producer = self._producer
        if not self._started or self._stopping.is_set() or producer is None:
            raise SharedStoreError("shared store is not running")
        value: bytes | None = None
        if override.producer_ids_rate is not None:
            value = json.dumps(
                {
                    "producer_ids_rate": override.producer_ids_rate,
                    "instance": self._instance_id,
                    "ts_ms": int(time.time() * 1000),
                },
                separators=(",", ":"),
            ).encode()
        started = time.monotonic()
        try:
            future = producer.send(
                self._topic, key=override.user.encode(), value=value, partition=0
            )
            remaining = timeout_s - (time.monotonic() - started)
            if remaining <= 0:
                raise SharedStoreError(f"publish to {self._topic!r} timed out after {timeout_s}s")
            future.get(timeout=remaining)
        except SharedStoreError:
            raise
        except Exception as error:
            self._log.warning(
                "shared_store_publish_failed", user=override.user, error=self._describe(error)
            )
            raise SharedStoreError(
                f"publish of {override.user!r} to {self._topic!r} not acknowledged: "
                f"{self._describe(error)}"
            ) from None
        self._log.info(
            "shared_store_published",
            user=override.user,
            producer_ids_rate=override.producer_ids_rate,
        )

    def stop(self) -> None:
        """Stop the reader and close the clients; returns within about 15 s even when the
        broker is gone. Idempotent."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(_STOP_JOIN_S)
            if thread.is_alive():
                self._log.warning("shared_store_reader_did_not_stop")
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=2)
        if self._started:
            self._log.info("shared_store_stopped")
        self._started = False

    # -- start-up ---------------------------------------------------------------------------

    def _client_config(self, deadline: float) -> dict[str, Any]:
        return cluster_client_config(
            self._bootstrap, f"pidgate-shared-store-{self._instance_id}", deadline, self._security
        )

    def _ensure_topic(self, deadline: float) -> None:
        """Create the topic (one partition, compacted) unless it exists, retrying until
        ``deadline`` while the cluster is unreachable."""
        last_error: BaseException | None = None
        while time.monotonic() < deadline and not self._stopping.is_set():
            admin: KafkaAdminClient | None = None
            try:
                admin = open_admin_client(**self._client_config(deadline))
                self._create_topic(admin)
                self._check_cleanup_policy(admin)
                return
            except SharedStoreError:
                raise
            except Exception as error:  # unreachable, not ready yet: retry until the deadline
                last_error = error
                self._log.debug("shared_store_cluster_not_ready", error=self._describe(error))
                time.sleep(min(_RETRY_SLEEP_S, max(0.0, deadline - time.monotonic())))
            finally:
                if admin is not None:
                    with contextlib.suppress(Exception):
                        admin.close()
        detail = f": {self._describe(last_error)}" if last_error else ""
        raise SharedStoreError(
            f"could not reach the upstream cluster {self._bootstrap} to set up the shared "
            f"quota topic {self._topic!r}{detail}"
        )

    def _create_topic(self, admin: KafkaAdminClient) -> None:
        def create(configs: dict[str, str]) -> None:
            admin.create_topics(
                {self._topic: {"num_partitions": 1, "replication_factor": -1, "configs": configs}},
                wait_for_metadata=True,
            )

        try:
            create(COMPACT_CONFIG)
            self._log.info("shared_store_topic_created", cleanup_policy="compact")
        except TopicAlreadyExistsError:
            self._log.debug("shared_store_topic_exists")
        except (InvalidConfigurationError, PolicyViolationError) as error:
            self._log.warning(
                "shared_store_compaction_rejected",
                detail="the broker refused cleanup.policy=compact; creating the topic without "
                "it. Quotas stay correct (latest record wins) but the topic is not compacted "
                "and grows with every change; ask an administrator to set cleanup.policy=compact",
                error=self._describe(error),
            )
            with contextlib.suppress(TopicAlreadyExistsError):
                create({})
            self._log.info("shared_store_topic_created", cleanup_policy="broker default")

    def _check_cleanup_policy(self, admin: KafkaAdminClient) -> None:
        """Best effort: warn when an existing topic is known not to be compacted."""
        try:
            described = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, self._topic)], config_filter="all"
            )
            entry = described.get("topic", {}).get(self._topic, {}).get("cleanup.policy", {})
            policy = entry.get("value") if isinstance(entry, dict) else None
        except Exception as error:
            self._log.debug("shared_store_describe_failed", error=self._describe(error))
            return
        if policy is None:
            self._log.info("shared_store_cleanup_policy_unknown")
        elif "compact" not in str(policy):
            self._log.warning(
                "shared_store_topic_not_compacted",
                cleanup_policy=str(policy),
                detail="quotas stay correct (latest record wins) but the topic grows",
            )

    def _new_producer(self, deadline: float) -> KafkaProducer:
        config = self._client_config(deadline)
        producer = KafkaProducer(
            acks="all",
            # An auto-created topic would be neither compacted nor single-partition.
            allow_auto_create_topics=False,
            # Duplicates are harmless (same key, same value) and retries keep order with one
            # request in flight; not idempotent, so the store holds no producer ID of its own
            # and survives a broker that forgot its producer state (UnknownProducerId).
            enable_idempotence=False,
            max_in_flight_requests_per_connection=1,
            max_block_ms=_MAX_BLOCK_MS,
            delivery_timeout_ms=_DELIVERY_TIMEOUT_MS,
            linger_ms=0,
            **config,
        )
        try:
            producer.partitions_for(self._topic)  # fetch metadata now, not on the first send
        except Exception:
            with contextlib.suppress(Exception):
                producer.close(timeout=1)
            raise
        return producer

    def _new_consumer(self) -> KafkaConsumer:
        return KafkaConsumer(
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # also after the topic is recreated (offsets restart)
            max_poll_records=_MAX_POLL_RECORDS,
            allow_auto_create_topics=False,
            **self._client_config(time.monotonic() + 30.0),
        )

    # -- the reader thread ------------------------------------------------------------------

    def _read_loop(self) -> None:
        consumer: KafkaConsumer | None = None
        try:
            consumer = self._new_consumer()
            consumer.assign([self._partition])
            consumer.seek_to_beginning(self._partition)
            target: int | None = None  # the end offset to reach before start() returns
            next_probe = 0.0
            failing_since: float | None = None
            next_ensure = 0.0
            drained = True  # the last poll left nothing buffered in the consumer
            while not self._stopping.is_set():
                batches: dict[Any, Any] = {}
                try:
                    if time.monotonic() >= next_probe:
                        end = self._end_offset(consumer)
                        next_probe = time.monotonic() + self._poll_timeout_ms / 1000
                        if target is None and end is not None:
                            target = end
                            self._log.debug("shared_store_catching_up", end_offset=target)
                    if target is not None and not self._caught_up.is_set():
                        position = consumer.position(self._partition, timeout_ms=_PROBE_TIMEOUT_MS)
                        # Also wait for the buffer to drain: tansu reports the end offset of a
                        # multi-record batch as its base offset + 1.
                        if position is not None and position >= target and drained:
                            self._caught_up.set()
                            self._settled.set()
                    batches = consumer.poll(timeout_ms=self._poll_timeout_ms)
                    drained = sum(map(len, batches.values())) < _MAX_POLL_RECORDS
                except KafkaError as error:  # kafka-python reconnects; keep polling meanwhile
                    if self._reader_ok:
                        self._log.warning("shared_store_read_failed", error=self._describe(error))
                    self._reader_ok = False
                    self._stopping.wait(_RETRY_SLEEP_S)
                for records in batches.values():
                    for record in records:
                        self._apply(record.key, record.value, record.offset)
                if self._reader_ok:
                    failing_since = None
                    continue
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since >= _RECREATE_AFTER_S and now >= next_ensure:
                    # Failing for a while: if the cluster is back but the topic was deleted,
                    # create it again (compacted, one partition) rather than wait forever.
                    next_ensure = now + _RECREATE_AFTER_S
                    with contextlib.suppress(SharedStoreError):
                        self._ensure_topic(now + _PROBE_TIMEOUT_MS / 1000)
        except BaseException as error:
            if not self._stopping.is_set():
                self._reader_error = error
                self._log.error("shared_store_reader_failed", error=self._describe(error))
        finally:
            self._reader_ok = False
            if consumer is not None:
                with contextlib.suppress(Exception):
                    consumer.close(autocommit=False, timeout_ms=2_000)
            self._settled.set()

    def _end_offset(self, consumer: KafkaConsumer) -> int | None:
        """The partition's end offset, or ``None`` when the broker does not answer; doubles as
        the health probe."""
        try:
            ends = consumer.end_offsets([self._partition], timeout_ms=_PROBE_TIMEOUT_MS)
        except KafkaError as error:
            if self._reader_ok:
                self._log.warning("shared_store_unreachable", error=self._describe(error))
            self._reader_ok = False
            return None
        if not self._reader_ok:
            if self._caught_up.is_set():
                self._log.info("shared_store_reachable")
            self._reader_ok = True
        end: int | None = ends.get(self._partition)
        return end

    def _apply(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        override = self._decode(key, value, offset)
        if override is None:
            return
        with self._lock:
            if override.producer_ids_rate is None:
                self._latest.pop(override.user, None)
            else:
                self._latest[override.user] = override.producer_ids_rate
        try:
            self._on_change(override)
        except Exception as error:  # a bad callback must not stop the fleet's updates
            self._log.error(
                "shared_store_on_change_failed",
                user=override.user,
                error=describe_error(error),
            )

    def _decode(self, key: bytes | None, value: bytes | None, offset: int) -> QuotaOverride | None:
        try:
            if key is None:
                raise ValueError("record has no key")
            user = key.decode()
            if not user:
                raise ValueError("empty key")
            if value is None:
                return QuotaOverride(user, None)
            document = json.loads(value)
            rate = document.get("producer_ids_rate") if isinstance(document, dict) else None
            if rate is None:
                return QuotaOverride(user, None)
            if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
                raise ValueError(f"producer_ids_rate is not a non-negative integer: {rate!r}")
            return QuotaOverride(user, rate)
        except (ValueError, UnicodeDecodeError) as error:
            self._log.warning("shared_store_bad_record", offset=offset, error=str(error)[:200])
            return None

    # -- helpers ----------------------------------------------------------------------------

    def _describe(self, error: BaseException | None) -> str:
        """``Type: message`` with every security value scrubbed, for logs and exceptions."""
        if error is None:
            return ""
        text = describe_error(error)[:500]
        for secret in self._security.values():
            if isinstance(secret, str) and len(secret) >= 3:
                text = text.replace(secret, "***")
        return text


def _validate(override: QuotaOverride) -> None:
    if not isinstance(override.user, str) or not override.user:
        raise ValueError("override.user must be a non-empty string")
    rate = override.producer_ids_rate
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate < 0):
        raise ValueError(f"producer_ids_rate must be a non-negative integer or None, not {rate!r}")
