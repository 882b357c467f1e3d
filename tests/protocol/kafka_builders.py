"""Helpers for protocol tests: build and fully decode messages with kafka-python (the reference)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder


@dataclass(frozen=True)
class BatchSpec:
    magic: int
    compression_type: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    record_count: int


def build_records(batches: list[BatchSpec]) -> bytes:
    out = b""
    for i, spec in enumerate(batches):
        idempotent = spec.magic == 2 and spec.producer_id != -1
        builder = MemoryRecordsBuilder(
            magic=spec.magic,
            compression_type=spec.compression_type,
            batch_size=1 << 20,
            offset=i * 100,
            transactional=spec.transactional and idempotent,
            producer_id=spec.producer_id if idempotent else -1,
            producer_epoch=spec.producer_epoch if idempotent else -1,
            base_sequence=spec.base_sequence if idempotent else -1,
        )
        for r in range(spec.record_count):
            builder.append(timestamp=1_700_000_000_000 + r, key=b"k%d" % r, value=b"v" * (100 + r))
        builder.close()
        out += bytes(builder.buffer())
    return out


def produce_request_body(
    version: int,
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topics: list[tuple[str, bytes, list[tuple[int, bytes | None]]]],
) -> bytes:
    """Encode a ProduceRequest body; topics = [(name, topic_id 16 bytes, [(index, records)])]."""
    T = ProduceRequest.TopicProduceData
    P = T.PartitionProduceData
    topic_data = []
    for name, topic_id, partitions in topics:
        kwargs: dict[str, Any] = {"partition_data": [P(index=i, records=r) for i, r in partitions]}
        if version >= 13:
            kwargs["topic_id"] = uuid.UUID(bytes=topic_id)
        else:
            kwargs["name"] = name
        topic_data.append(T(**kwargs))
    req = ProduceRequest(
        version=version,
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=topic_data,
    )
    return bytes(req.encode(version=version))


def reference_batches(records: bytes | None) -> list[dict[str, Any]]:
    """Batch header fields of a records blob, read with kafka-python's MemoryRecords."""
    if not records:
        return []
    out = []
    mr = MemoryRecords(bytes(records))
    while (batch := mr.next_batch()) is not None:
        entry: dict[str, Any] = {"base_offset": batch.base_offset, "magic": batch.magic}
        if batch.magic == 2:
            entry.update(
                producer_id=batch.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence,
                records_count=batch.records_count,
                is_transactional=batch.is_transactional,
                last_offset_delta=batch.last_offset_delta,
                max_timestamp=batch.max_timestamp,
            )
        out.append(entry)
    return out


def reference_produce(body: bytes, version: int) -> dict[str, Any]:
    """kafka-python's full decode of a ProduceRequest body, flattened for comparison."""
    req = ProduceRequest.decode(body, version=version)
    topics = []
    for t in req.topic_data:
        topics.append(
            {
                "name": t.name if version < 13 else None,
                # kafka-python decodes the all-zero uuid as None
                "topic_id": (t.topic_id.bytes if t.topic_id else bytes(16))
                if version >= 13
                else None,
                "partitions": [
                    {"index": p.index, "batches": reference_batches(p.records)}
                    for p in t.partition_data
                ],
            }
        )
    return {
        "transactional_id": req.transactional_id,
        "acks": req.acks,
        "timeout_ms": req.timeout_ms,
        "topics": topics,
    }


def summary_as_reference(summary: Any) -> dict[str, Any]:
    """Our ProduceRequestSummary in reference_produce()'s shape."""
    topics = []
    for t in summary.topics:
        parts = []
        for p in t.partitions:
            batches = []
            for b in p.batches:
                entry: dict[str, Any] = {"base_offset": b.base_offset, "magic": b.magic}
                if b.magic == 2:
                    entry.update(
                        producer_id=b.producer_id,
                        producer_epoch=b.producer_epoch,
                        base_sequence=b.base_sequence,
                        records_count=b.records_count,
                        is_transactional=b.is_transactional,
                        last_offset_delta=b.last_offset_delta,
                        max_timestamp=b.max_timestamp,
                    )
                batches.append(entry)
            parts.append({"index": p.index, "batches": batches})
        topics.append({"name": t.name, "topic_id": t.topic_id, "partitions": parts})
    return {
        "transactional_id": summary.transactional_id,
        "acks": summary.acks,
        "timeout_ms": summary.timeout_ms,
        "topics": topics,
    }
