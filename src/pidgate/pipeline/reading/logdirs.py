"""Broker log directories: discovery of partitions, segments and producer snapshots, and a
generator of realistic log directories for tests and benchmarks.

Layout (Kafka's ``LogManager``/``LogFileUtils``): a log dir (``log.dirs`` entry, with a
``meta.properties`` naming the broker) holds one folder per partition, ``<topic>-<partition>``;
a partition folder holds segments ``<base offset, 20 digits>.log`` (with ``.index``,
``.timeindex``, ``.txnindex`` beside them) and producer snapshots
``<offset, 20 digits>.snapshot``. Folders being deleted or moved (``<topic>-<p>.<id>-delete``,
``-future``, ``-stray``) do not match ``<topic>-<partition>`` and are skipped.

Paths are local (or ``file:`` URIs): segment files are read with Python's own file API on the
executors, so on a cluster the log dirs must be reachable under the same path from every
executor (run the job on the broker host, or on a shared mount).

Must not import pyspark, nor another pipeline module than
:mod:`~pidgate.pipeline.reading.segments`.
"""

from __future__ import annotations

import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from pidgate.pipeline.reading.segments import (
    BatchSpec,
    ControlMarker,
    offset_from_file_name,
    segment_file_name,
    write_segment,
)

__all__ = [
    "GeneratedLogs",
    "PartitionDir",
    "SegmentFile",
    "broker_name",
    "discover_partitions",
    "generate_log_dirs",
    "list_segments",
    "list_snapshots",
    "local_path",
    "parse_partition_dir_name",
]

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_SEGMENT = re.compile(r"^\d{20}\.log$")
_SNAPSHOT = re.compile(r"^\d{20}\.snapshot$")


@dataclass(frozen=True, slots=True)
class PartitionDir:
    """One ``<topic>-<partition>`` folder and the log dir (broker) holding it."""

    log_dir: str
    broker: str
    topic: str
    partition: int
    path: str


@dataclass(frozen=True, slots=True)
class SegmentFile:
    base_offset: int
    path: str
    size: int


def local_path(uri: str) -> str:
    """A plain path for a local path or ``file:`` URI; ValueError for other schemes."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme in ("",) or len(parsed.scheme) == 1:
        return uri
    raise ValueError(
        f"{uri}: log dirs are read with local file APIs on the executors; use a local path "
        "(or a mount reachable under the same path from every executor)"
    )


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` for ``<topic>-<partition>``, else None."""
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return match.group("topic"), int(match.group("partition"))


def broker_name(log_dir: str) -> str:
    """``node.id``/``broker.id`` from the log dir's ``meta.properties``, else the folder name."""
    meta = Path(log_dir) / "meta.properties"
    try:
        for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() in ("node.id", "broker.id"):
                return value.strip()
    except OSError:
        pass
    return Path(log_dir).name or log_dir


def _has_segments(path: Path) -> bool:
    try:
        return any(_SEGMENT.match(entry.name) for entry in os.scandir(path))
    except OSError:
        return False


def discover_partitions(path: str) -> list[PartitionDir]:
    """Partition folders under ``path``: a log dir holding ``<topic>-<partition>`` folders, or a
    single partition folder (one that directly holds ``.log`` segments). Sorted."""
    root = Path(local_path(path))
    if not root.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    parsed = parse_partition_dir_name(root.name)
    if parsed is not None and _has_segments(root):
        log_dir = str(root.parent)
        return [PartitionDir(log_dir, broker_name(log_dir), parsed[0], parsed[1], str(root))]
    broker = broker_name(str(root))
    found: list[PartitionDir] = []
    for entry in os.scandir(root):
        if not entry.is_dir():
            continue
        parsed = parse_partition_dir_name(entry.name)
        if parsed is not None:
            found.append(PartitionDir(str(root), broker, parsed[0], parsed[1], entry.path))
    return sorted(found, key=lambda p: (p.topic, p.partition))


def list_segments(partition_path: str) -> list[SegmentFile]:
    """The ``.log`` segments of a partition folder, by base offset."""
    segments = [
        SegmentFile(offset_from_file_name(e.name), e.path, e.stat().st_size)
        for e in os.scandir(partition_path)
        if e.is_file() and _SEGMENT.match(e.name)
    ]
    return sorted(segments, key=lambda s: s.base_offset)


def list_snapshots(partition_path: str) -> dict[int, str]:
    """``{offset: path}`` of the producer snapshots of a partition folder."""
    return {
        offset_from_file_name(e.name): e.path
        for e in os.scandir(partition_path)
        if e.is_file() and _SNAPSHOT.match(e.name)
    }


# ---------------------------------------------------------------------------------------------
# Generator


@dataclass(frozen=True)
class GeneratedLogs:
    """What :func:`generate_log_dirs` wrote."""

    log_dirs: list[str]
    partitions: int
    segment_files: int
    batches: int
    bytes_written: int
    producer_ids: int
    newest_timestamp: int


@dataclass
class _Producer:
    producer_id: int
    transactional: bool
    birth: int
    death: int


@dataclass
class _ProducerPartitionState:
    epoch: int = 0
    sequence: int = 0
    txn_open: bool = False
    txn_batches_left: int = 0
    coordinator_epoch: int = 0


@dataclass
class _PartitionGen:
    rng: random.Random
    producers: list[_Producer]
    states: dict[int, _ProducerPartitionState] = field(default_factory=dict)
    next_offset: int = 0


def _make_producers(
    rng: random.Random, idempotent: int, transactional: int, start_ms: int, span_ms: int
) -> list[_Producer]:
    specs: list[tuple[int, int, bool]] = []
    for i in range(idempotent + transactional):
        birth = start_ms + rng.randrange(max(span_ms, 1))
        lifetime = rng.randint(max(span_ms // 20, 1), max(span_ms // 2, 1))
        specs.append((birth, birth + lifetime, i >= idempotent))
    specs.sort()
    # PIDs grow with time, as blocks handed out by the controller do (KIP-730).
    return [_Producer(1000 + n, txn, birth, death) for n, (birth, death, txn) in enumerate(specs)]


def _next_batch(
    gen: _PartitionGen,
    timestamp: int,
    values: list[bytes],
    plain_fraction: float,
) -> BatchSpec:
    rng = gen.rng
    offset = gen.next_offset
    alive = [p for p in gen.producers if p.birth <= timestamp <= p.death]
    deltas = [rng.randrange(0, 50) for _ in values]
    if not alive or rng.random() < plain_fraction:
        spec = BatchSpec(offset, timestamp, values, deltas)
        gen.next_offset = spec.last_offset + 1
        return spec
    producer = rng.choice(alive)
    state = gen.states.setdefault(producer.producer_id, _ProducerPartitionState())
    if producer.transactional and state.txn_open and state.txn_batches_left == 0:
        commit = rng.random() < 0.85
        spec = BatchSpec(
            offset,
            timestamp,
            producer_id=producer.producer_id,
            producer_epoch=state.epoch,
            marker=ControlMarker(commit, state.coordinator_epoch),
        )
        state.txn_open = False
        if not commit and rng.random() < 0.3:  # aborted after a fencing/timeout: epoch bump
            state.epoch += 1
            state.sequence = 0
        if rng.random() < 0.05:  # the transaction coordinator moved
            state.coordinator_epoch += 1
        gen.next_offset = offset + 1
        return spec
    if producer.transactional and not state.txn_open:
        state.txn_open = True
        state.txn_batches_left = rng.randint(1, 4)
    spec = BatchSpec(
        offset,
        timestamp,
        values,
        deltas,
        producer_id=producer.producer_id,
        producer_epoch=state.epoch,
        base_sequence=state.sequence,
        transactional=producer.transactional,
    )
    state.sequence = (state.sequence + len(values)) % 2**31
    if producer.transactional:
        state.txn_batches_left -= 1
    gen.next_offset = spec.last_offset + 1
    return spec


def generate_log_dirs(
    root: str,
    *,
    brokers: int = 2,
    topics: int = 2,
    partitions: int = 3,
    segments_per_partition: int = 3,
    batches_per_segment: int = 40,
    idempotent_producers: int = 30,
    transactional_producers: int = 5,
    plain_fraction: float = 0.1,
    records_per_batch: int = 3,
    payload_bytes: int = 32,
    start_ms: int = 1_700_000_000_000,
    span_ms: int = 3 * 86_400_000,
    seed: int = 0,
) -> GeneratedLogs:
    """Write ``brokers`` log dirs ``<root>/broker-<n>`` (with ``meta.properties``) holding
    ``topics`` x ``partitions`` partitions (each on one broker), each with
    ``segments_per_partition`` segments of ``batches_per_segment`` RecordBatch v2 batches.

    Producers live for a random part of ``span_ms`` (so PIDs appear and expire over time);
    each batch comes from a producer alive at its timestamp: idempotent producers (sequences per
    partition), transactional producers (transactions of 1-4 batches closed by COMMIT/ABORT
    markers, occasional epoch bumps after aborts, coordinator epoch changes, and transactions
    left open at the end), or, with ``plain_fraction``, a plain batch without a PID. Record
    timestamps jitter, so batch max timestamps are not monotonic. Every record carries
    ``payload_bytes`` (one shared random payload: generation is I/O bound, for scale runs use
    few records with big payloads). No producer snapshots are written. Deterministic for a seed.
    """
    rng = random.Random(seed)
    base = Path(root)
    payload = rng.randbytes(payload_bytes)
    values = [payload] * records_per_batch
    producers = _make_producers(
        rng, idempotent_producers, transactional_producers, start_ms, span_ms
    )
    log_dirs: list[str] = []
    for b in range(brokers):
        log_dir = base / f"broker-{b}"
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "meta.properties").write_text(
            f"version=1\ncluster.id=pidgate-generated\nnode.id={b}\n", encoding="utf-8"
        )
        log_dirs.append(str(log_dir))
    total_batches = segments_per_partition * batches_per_segment
    written = 0
    files = 0
    batches = 0
    newest = start_ms
    n = 0
    for t in range(topics):
        for p in range(partitions):
            part_dir = Path(log_dirs[n % brokers]) / f"topic-{t}-{p}"
            n += 1
            part_dir.mkdir(exist_ok=True)
            gen = _PartitionGen(random.Random(rng.getrandbits(64)), producers)
            step = span_ms / max(total_batches, 1)
            for s in range(segments_per_partition):
                specs: list[BatchSpec] = []
                for i in range(batches_per_segment):
                    k = s * batches_per_segment + i
                    jitter = gen.rng.randrange(-120_000, 5_000)  # CreateTime skew
                    timestamp = start_ms + int(k * step) + jitter
                    specs.append(_next_batch(gen, timestamp, values, plain_fraction))
                path = part_dir / segment_file_name(specs[0].base_offset)
                written += write_segment(path, specs)
                newest = max(newest, max(spec.max_timestamp for spec in specs))
                files += 1
                batches += len(specs)
    return GeneratedLogs(
        log_dirs=log_dirs,
        partitions=topics * partitions,
        segment_files=files,
        batches=batches,
        bytes_written=written,
        producer_ids=len(producers),
        newest_timestamp=newest,
    )
