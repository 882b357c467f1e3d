"""Keeps an idempotent producer's batches in order when pidgate rejects one of them.

Owns: ``ProduceOrderGuard``, one per client connection, and the sequence arithmetic it needs.
Pure bookkeeping (time is a parameter): no sockets, clocks, logging or metrics; the connection
asks it before the quota is consulted and tells it what became of each Produce request.

Why: an idempotent producer pipelines up to ``max.in.flight`` (5) Produce requests per broker
connection, each partition's batches numbered by a per-(PID, partition) sequence (KIP-98). When a
broker fails batch n with a retriable error, it also fails every later in-flight batch of that
producer and partition (OUT_OF_ORDER_SEQUENCE_NUMBER, since it still expects n), and the client
retries them all in order. pidgate must do the same: when it rejects batch n (no token) and a
token frees before batch n + 1, already read behind it, is judged, admitting n + 1 would send the
broker n + 1 before n. The broker then rejects n + 1 as a sequence gap, librdkafka bumps its
epoch, and around that bump an acknowledged record was seen twice in a partition.

The rule, per connection and per (PID, topic, partition):

- when a Produce request is rejected (for any reason), every PID batch in it is *withheld*: the
  first rejected base sequence is remembered with its epoch;
- a later batch of the same PID, topic and partition whose sequence comes *after* the withheld one
  overtakes it: the whole request is rejected without asking the quota (and its own batches are
  withheld in turn, which is how the rule closes over the other PIDs of a mixed request);
- the batch carrying exactly the withheld sequence is the client's retry: it is judged by the
  quota as usual, and admitting it lifts the hold; a batch *before* it (the client resending
  something older) is judged as usual and leaves the hold in place;
- a batch with another epoch means the client reset that producer's sequences (an epoch bump,
  KIP-360): the hold is stale and dropped.

Sequences are compared modulo 2**31, since Kafka wraps them at Integer.MAX_VALUE.

Why per connection is enough: a client sends one partition's batches to its leader over one
connection, and responses on a connection come back in request order. A retry that arrives on a
new connection (the client reconnected) has nothing behind it from the old one: requests pidgate
had read but not yet forwarded died with that connection and are resent in order by the client,
which is why the guard starts empty on every connection.

Memory: at most ``max_withheld`` entries per connection (oldest dropped first) and none older
than ``withheld_ttl_ms`` (a client gives a batch up after ``delivery.timeout.ms``, KIP-91, so a
hold older than any delivery budget protects nothing).
"""

from __future__ import annotations

from typing import Final

from pidgate.protocol.produce import ProduceRequestSummary

__all__ = ["SEQUENCE_MODULUS", "ProduceOrderGuard", "sequence_after"]

#: Kafka's producer sequences are int32 and wrap to 0 after Integer.MAX_VALUE.
SEQUENCE_MODULUS: Final = 1 << 31
_HALF: Final = 1 << 30

#: A withheld batch: (producer_epoch, base_sequence, withheld_at_ms).
_Withheld = tuple[int, int, int]
#: (producer_id, topic name or topic id, partition index).
_Key = tuple[int, str | bytes | None, int]


def sequence_after(sequence: int, reference: int) -> bool:
    """True when ``sequence`` comes after ``reference`` in Kafka's wrapping sequence space."""
    distance = (sequence - reference) % SEQUENCE_MODULUS
    return 0 < distance < _HALF


def _pid_batches(request: ProduceRequestSummary) -> list[tuple[_Key, int, int]]:
    """(key, epoch, base_sequence) of each partition's first batch per PID (v3+ requests carry
    one batch per partition; a later batch of the same PID there follows the first in order)."""
    found: list[tuple[_Key, int, int]] = []
    seen: set[_Key] = set()
    for topic in request.topics:
        topic_key = topic.name if topic.name is not None else topic.topic_id
        for partition in topic.partitions:
            for batch in partition.batches:
                if batch.producer_id < 0 or batch.base_sequence < 0:
                    continue  # no PID, or no sequence (magic < 2): nothing to keep in order
                key = (batch.producer_id, topic_key, partition.index)
                if key not in seen:
                    seen.add(key)
                    found.append((key, batch.producer_epoch, batch.base_sequence))
    return found


class ProduceOrderGuard:
    """Withheld batches of one client connection (see module docstring)."""

    __slots__ = ("_max_withheld", "_ttl_ms", "dropped", "withheld")

    def __init__(self, max_withheld: int = 4096, withheld_ttl_ms: int = 600_000) -> None:
        if max_withheld < 1:
            raise ValueError(f"max_withheld must be >= 1, got {max_withheld}")
        self._max_withheld = max_withheld
        self._ttl_ms = withheld_ttl_ms
        #: The holds; read-only outside this class (the connection tests it inline, so a
        #: connection with nothing withheld pays no call per request: issue "lean").
        self.withheld: dict[_Key, _Withheld] = {}
        #: Holds dropped because the table was full (each one an ordering no longer protected).
        self.dropped = 0

    def __bool__(self) -> bool:
        """False when nothing is withheld (the connection's hot path reads ``withheld`` itself,
        saving the call)."""
        return bool(self.withheld)

    def __len__(self) -> int:
        return len(self.withheld)

    def withheld_producer_ids(self) -> frozenset[int]:
        return frozenset(key[0] for key in self.withheld)

    def overtakes(self, request: ProduceRequestSummary) -> bool:
        """True when ``request`` carries a batch that would overtake a withheld one: it must be
        rejected like the batch it follows. Drops holds made stale by an epoch change."""
        withheld = self.withheld
        if not withheld:
            return False
        for key, epoch, sequence in _pid_batches(request):
            held = withheld.get(key)
            if held is None:
                continue
            if held[0] != epoch:
                del withheld[key]  # the producer reset its sequences: nothing left to order
            elif sequence_after(sequence, held[1]):
                return True
        return False

    def rejected(self, request: ProduceRequestSummary, now_ms: int) -> None:
        """``request`` was answered with a rejection: withhold each of its PID batches (the
        first rejected sequence per key stays the one the client must retry first)."""
        withheld = self.withheld
        self._expire(now_ms)
        for key, epoch, sequence in _pid_batches(request):
            held = withheld.get(key)
            if held is not None and held[0] == epoch and not sequence_after(held[1], sequence):
                continue  # already withheld at this or an earlier sequence
            if held is not None:
                del withheld[key]  # re-inserted last: the table stays in withholding order
            elif len(withheld) >= self._max_withheld:
                del withheld[next(iter(withheld))]
                self.dropped += 1
            withheld[key] = (epoch, sequence, now_ms)

    def admitted(self, request: ProduceRequestSummary) -> None:
        """``request`` goes to the broker: lift every hold whose retry it carries."""
        withheld = self.withheld
        if not withheld:
            return
        for key, epoch, sequence in _pid_batches(request):
            held = withheld.get(key)
            if held is not None and held[0] == epoch and held[1] == sequence:
                del withheld[key]

    def _expire(self, now_ms: int) -> None:
        withheld = self.withheld
        horizon = now_ms - self._ttl_ms
        while withheld:
            key, held = next(iter(withheld.items()))
            if held[2] > horizon:
                break
            del withheld[key]
