"""Reads what actually reached the broker: record-batch headers fetched straight from tansu
(bypassing pidgate) with a hand-built Fetch v4 request, decoded by kafka-python and walked with
pidgate's batch-header reader.
"""

from __future__ import annotations

import socket
import struct
from collections import Counter

from kafka.protocol.consumer.fetch import FetchResponse

from pidgate.protocol.record_batches import BatchHeader, iter_batch_headers

_FETCH_V4_MAX_BYTES = 64 * 1024 * 1024
#: Fetch's error when the broker asked does not lead the partition (any more).
NOT_LEADER_OR_FOLLOWER = 6


class FetchError(AssertionError):
    """The broker answered the Fetch of ``topic``-``partition`` with ``error_code``."""

    def __init__(self, topic: str, partition: int, error_code: int) -> None:
        super().__init__(f"fetch {topic}-{partition}: error {error_code}")
        self.error_code = error_code


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def fetch_batch_headers(
    bootstrap: str, topic: str, partitions: range | list[int]
) -> list[BatchHeader]:
    """Every batch header in ``topic`` from offset 0, read from the broker itself."""
    host, _, port = bootstrap.rpartition(":")
    headers: list[BatchHeader] = []
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for partition in partitions:
            offset = 0
            for correlation_id in range(1, 1000):  # bounded: each round advances the offset
                body = struct.pack(">iiiib", -1, 100, 1, _FETCH_V4_MAX_BYTES, 0)
                body += struct.pack(">i", 1) + _string(topic)
                body += struct.pack(">i", 1) + struct.pack(">iqi", partition, offset, 8 << 20)
                payload = struct.pack(">hhi", 1, 4, correlation_id) + _string("pidgate-test")
                payload += body
                sock.sendall(struct.pack(">i", len(payload)) + payload)
                size = struct.unpack(">i", _recv_exact(sock, 4))[0]
                response = FetchResponse.decode(_recv_exact(sock, size), version=4, header=True)
                data = response.responses[0].partitions[0]
                if data.error_code != 0:
                    raise FetchError(topic, partition, data.error_code)
                batches = list(iter_batch_headers(data.records or b"", allow_partial_tail=True))
                if not batches:
                    break
                headers.extend(batches)
                offset = batches[-1].base_offset + batches[-1].last_offset_delta + 1
    return headers


def producer_ids_in_log(bootstrap: str, topic: str, partitions: range | list[int]) -> Counter[int]:
    """producer_id -> number of records the broker holds from it in ``topic``."""
    counts: Counter[int] = Counter()
    for header in fetch_batch_headers(bootstrap, topic, partitions):
        counts[header.producer_id] += header.records_count
    return counts
