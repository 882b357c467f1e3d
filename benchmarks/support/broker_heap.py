"""The broker JVM's live heap, from ``jcmd <pid> GC.class_histogram`` (a full GC first), and the
classes a producer-state entry is made of, per broker code base.

Imports the standard library and the real-Kafka tier's :class:`~tests.realkafka.kafka.KafkaRun`
(the caller puts the repository root on ``sys.path``); must not import a benchmark script.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.realkafka.kafka import KafkaRun

#: The classes a producer-state entry is made of, per broker code base: the entry, its queue of
#: BatchMetadata (with the queue's backing array), and the producers map's node and Long key
#: (3.1: kafka.log.ProducerStateManager, Scala; 4.x: the storage module, Java). Generic classes
#: (Long, Object[], HashMap$Node) also grow elsewhere: the pidgate run shows how little.
STATE_CLASSES = {
    "kafka.log.ProducerStateEntry": (
        "kafka.log.ProducerStateEntry",
        "kafka.log.BatchMetadata",
        "scala.collection.mutable.Queue",
        "[Ljava.lang.Object;",
        "scala.collection.mutable.HashMap$Node",
        "[Lscala.collection.mutable.HashMap$Node;",
        "java.lang.Long",
    ),
    "org.apache.kafka.storage.internals.log.ProducerStateEntry": (
        "org.apache.kafka.storage.internals.log.ProducerStateEntry",
        "org.apache.kafka.storage.internals.log.BatchMetadata",
        "java.util.ArrayDeque",
        "[Ljava.lang.Object;",
        "java.util.HashMap$Node",
        "[Ljava.util.HashMap$Node;",
        "java.lang.Long",
    ),
}


@dataclass
class Heap:
    total: int
    by_class: dict[str, int]  # bytes
    instances: dict[str, int]

    def state_classes(self) -> tuple[str, ...]:
        for entry_class, classes in STATE_CLASSES.items():
            if entry_class in self.by_class:
                return classes
        raise RuntimeError("no ProducerStateEntry class in the broker's heap histogram")

    def state_bytes(self, classes: tuple[str, ...]) -> int:
        return sum(self.by_class.get(name, 0) for name in classes)


def live_heap(java_pid: int) -> Heap:
    """Live objects after a full GC: ``jcmd <pid> GC.class_histogram`` (without -all it
    collects first, so what it lists is what is reachable)."""
    result = subprocess.run(
        ["jcmd", str(java_pid), "GC.class_histogram"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"jcmd {java_pid} GC.class_histogram: {result.stdout}{result.stderr}")
    by_class: dict[str, int] = {}
    instances: dict[str, int] = {}
    total = 0
    for line in result.stdout.splitlines():
        row = re.match(r"\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)", line)
        if row:
            name = row.group(3)  # one name twice: loaded by two class loaders
            by_class[name] = by_class.get(name, 0) + int(row.group(2))
            instances[name] = instances.get(name, 0) + int(row.group(1))
        elif line.startswith("Total"):
            total = int(line.split()[2])
    if not total:
        raise RuntimeError(f"no Total line in jcmd's histogram: {result.stdout[-500:]}")
    return Heap(total, by_class, instances)


def java_pid(kafka: KafkaRun) -> int:
    """The broker's JVM: kafka-server-start.sh execs kafka-run-class.sh, which execs java."""
    pid = kafka.broker_pid(1)
    if pid is None:
        raise RuntimeError("the broker is not running")
    comm = Path(f"/proc/{pid}/comm").read_text().strip()
    if comm != "java":
        raise RuntimeError(f"broker PID {pid} is {comm!r}, not the JVM")
    return pid
