"""The broker-protection benchmark's storm: raw Kafka frames (InitProducerId, Produce,
DescribeProducers) sent on plain sockets, and a storm of restarting idempotent clients, each
on a connection of its own, that get a PID and produce once with it.

Imports kafka-python's protocol classes and the standard library; must not import a benchmark
script, nor pidgate (what it measures runs in other processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin import DescribeProducersRequest, DescribeProducersResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

TOPIC = "pidgate-protection"
#: Versions of the raw requests: accepted by 3.1 and 4.1 alike.
INIT_VERSION = 4
PRODUCE_VERSION = 8
DESCRIBE_PRODUCERS_VERSION = 0
#: Retriable answers to InitProducerId: COORDINATOR_LOAD_IN_PROGRESS (a KRaft broker waiting for
#: its PID block), COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, REQUEST_TIMED_OUT.
RETRIABLE_INIT = frozenset({14, 15, 16, 7})
#: pidgate's answers to a throttled Produce (DESIGN.md "Rejection that every client survives"):
#: 19 NOT_ENOUGH_REPLICAS for a client it cannot name (these raw sockets), 89 for kafka-python.
REJECTION_CODES = frozenset({19, 89})
#: The storm's request.timeout.ms (sent as the Produce's timeout_ms): the 3.1 console producer's.
#: pidgate holds a throttled Produce for two thirds of it (issue "patience"), then rejects it, and
#: the storm producer gives up, as a crash-looping client does; with Java's 30 s each throttled
#: storm producer would be held 20 s and the storm would take hours at this concurrency.
STORM_REQUEST_TIMEOUT_MS = 1500
CLIENT_ID = "pidgate-protection-storm"
_SIZE = struct.Struct(">i")


# -- raw protocol ------------------------------------------------------------------------------


def encode(request: Any, version: int, correlation_id: int = 1) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
    return bytes(request.encode(version=version, header=True, framed=True))


def init_producer_id_frame() -> bytes:
    """InitProducerId with a null transactional id: the broker allocates one PID and keeps no
    state for it until the PID produces. One frame serves every connection (correlation id 1)."""
    request = InitProducerIdRequest(
        version=INIT_VERSION,
        transactional_id=None,
        transaction_timeout_ms=60_000,
        producer_id=-1,
        producer_epoch=-1,
    )
    return encode(request, INIT_VERSION)


def produce_frame(topic: str, partition: int, producer_id: int, epoch: int) -> bytes:
    """An acks=-1 Produce of one record batch (one 20-byte record) of ``producer_id``,
    sequence 0."""
    builder = MemoryRecordsBuilder(
        magic=2,
        compression_type=0,
        batch_size=1 << 16,
        offset=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
    )
    builder.append(timestamp=int(time.time() * 1000), key=None, value=b"storm-%014d" % producer_id)
    builder.close()
    T = ProduceRequest.TopicProduceData
    P = T.PartitionProduceData
    request = ProduceRequest(
        version=PRODUCE_VERSION,
        transactional_id=None,
        acks=-1,
        timeout_ms=STORM_REQUEST_TIMEOUT_MS,
        topic_data=[
            T(name=topic, partition_data=[P(index=partition, records=bytes(builder.buffer()))])
        ],
    )
    return encode(request, PRODUCE_VERSION, correlation_id=2)


def recv_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("connection closed by the peer")
            data += chunk
        return bytes(data)

    (size,) = _SIZE.unpack(exact(4))
    return exact(size)


def init_producer_id_alone(address: tuple[str, int], timeout_s: float = 120.0) -> int:
    """One InitProducerId on its own, retried while the broker answers a retriable error (a
    fresh 4.1 broker: 14 until its first PID block arrives); returns the PID."""
    deadline = time.monotonic() + timeout_s
    frame = init_producer_id_frame()
    while True:
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(frame)
            response = InitProducerIdResponse.decode(
                recv_frame(sock), version=INIT_VERSION, header=True
            )
        if response.error_code == 0:
            return int(response.producer_id)
        if response.error_code not in RETRIABLE_INIT or time.monotonic() > deadline:
            raise RuntimeError(f"InitProducerId answered error {response.error_code}")
        time.sleep(0.2)


def producer_entries(address: tuple[str, int], topic: str, partitions: int) -> list[int]:
    """Producer-state entries per partition, as the broker reports them (DescribeProducers,
    KIP-664: one row per producer with state on the partition)."""
    Topic = DescribeProducersRequest.TopicRequest
    request = DescribeProducersRequest(
        version=DESCRIBE_PRODUCERS_VERSION,
        topics=[Topic(name=topic, partition_indexes=list(range(partitions)))],
    )
    with socket.create_connection(address, timeout=60) as sock:
        sock.sendall(encode(request, DESCRIBE_PRODUCERS_VERSION))
        response = DescribeProducersResponse.decode(
            recv_frame(sock), version=DESCRIBE_PRODUCERS_VERSION, header=True
        )
    counts = [0] * partitions
    for topic_response in response.topics:
        for partition in topic_response.partitions:
            if partition.error_code != 0:
                raise RuntimeError(
                    f"DescribeProducers {topic}-{partition.partition_index}: error "
                    f"{partition.error_code} {partition.error_message}"
                )
            counts[partition.partition_index] = len(partition.active_producers)
    return counts


# -- the storm ---------------------------------------------------------------------------------


@dataclass
class StormResult:
    sent: int = 0  # storm producers that got a PID
    admitted: int = 0  # their Produce answered 0
    rejected: int = 0  # answered with pidgate's throttling code: the producer gave up
    failed: dict[str, int] = field(default_factory=dict)  # anything else, by cause
    init_retries: int = 0
    seconds: float = 0.0

    def fail(self, cause: str) -> None:
        self.failed[cause] = self.failed.get(cause, 0) + 1


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


async def _storm_producer(
    address: tuple[str, int], partition: int, init_frame: bytes, result: StormResult
) -> None:
    """One restarting client: connect, InitProducerId, one Produce, close."""
    for _attempt in range(50):
        reader, writer = await asyncio.open_connection(*address)
        try:
            writer.write(init_frame)
            init = InitProducerIdResponse.decode(
                await _read_frame(reader), version=INIT_VERSION, header=True
            )
            if init.error_code in RETRIABLE_INIT:
                result.init_retries += 1
                await asyncio.sleep(0.1)
                continue
            if init.error_code != 0:
                result.fail(f"init_error_{init.error_code}")
                return
            result.sent += 1
            writer.write(produce_frame(TOPIC, partition, init.producer_id, init.producer_epoch))
            produced = ProduceResponse.decode(
                await _read_frame(reader), version=PRODUCE_VERSION, header=True
            )
            codes = {p.error_code for t in produced.responses for p in t.partition_responses}
            if codes == {0}:
                result.admitted += 1
            elif codes <= REJECTION_CODES:
                result.rejected += 1
            else:
                result.fail("produce_error_" + "_".join(str(c) for c in sorted(codes)))
            return
        finally:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()
    result.fail("init_retries_exhausted")


async def _storm(
    address: tuple[str, int], pids: int, partitions: int, concurrency: int, max_seconds: float
) -> StormResult:
    result = StormResult()
    init_frame = init_producer_id_frame()
    next_index = 0
    started = time.monotonic()
    deadline = started + max_seconds

    async def worker() -> None:
        nonlocal next_index
        while next_index < pids and time.monotonic() < deadline:
            index = next_index
            next_index += 1
            try:
                await asyncio.wait_for(
                    _storm_producer(address, index % partitions, init_frame, result), 60
                )
            except TimeoutError:
                result.fail("timeout")
            except (OSError, ConnectionError, asyncio.IncompleteReadError) as error:
                result.fail(type(error).__name__)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.monotonic() - started
    return result


def run_storm(
    address: tuple[str, int], pids: int, partitions: int, concurrency: int, max_seconds: float
) -> StormResult:
    return asyncio.run(_storm(address, pids, partitions, concurrency, max_seconds))
