"""The order guard: a rejected batch is never overtaken by a later batch of the same producer and
partition on the same connection; the client's retry of the rejected batch lifts the hold."""

from __future__ import annotations

import pytest

from pidgate.protocol.produce import PartitionProduce, ProduceRequestSummary, TopicProduce
from pidgate.protocol.record_batches import BatchHeader
from pidgate.proxy.serving.ordering import SEQUENCE_MODULUS, ProduceOrderGuard, sequence_after

Batch = tuple[str, int, int, int, int]  # topic, partition, pid, epoch, base_sequence


def produce(*batches: Batch) -> ProduceRequestSummary:
    """A Produce request with one batch per (topic, partition), in the order given."""
    topics: dict[str, list[PartitionProduce]] = {}
    for topic, partition, pid, epoch, sequence in batches:
        header = BatchHeader(
            base_offset=0,
            batch_length=100,
            magic=2,
            attributes=0,
            last_offset_delta=0,
            base_timestamp=0,
            max_timestamp=0,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            records_count=1,
        )
        topics.setdefault(topic, []).append(PartitionProduce(partition, (header,)))
    return ProduceRequestSummary(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topics=tuple(TopicProduce(name, None, tuple(parts)) for name, parts in topics.items()),
    )


def test_an_empty_guard_holds_nothing_back() -> None:
    guard = ProduceOrderGuard()
    assert not guard
    assert not guard.overtakes(produce(("t", 0, 7, 0, 526)))


def test_a_later_batch_of_a_rejected_producer_and_partition_is_held_back() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    # 527 was already in flight behind 526: forwarding it would show the broker a gap.
    assert guard.overtakes(produce(("t", 0, 7, 0, 527)))
    assert guard.overtakes(produce(("t", 0, 7, 0, 530)))


def test_the_retry_of_the_rejected_batch_is_judged_and_lifts_the_hold_when_admitted() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    guard.rejected(produce(("t", 0, 7, 0, 527)), now_ms=1)  # the held one was rejected too
    retry = produce(("t", 0, 7, 0, 526))
    assert not guard.overtakes(retry)
    # Judged and rejected again (still no token): the hold stays at 526.
    guard.rejected(retry, now_ms=2)
    assert guard.overtakes(produce(("t", 0, 7, 0, 527)))
    # Judged and admitted: 527 may follow.
    guard.admitted(retry)
    assert not guard
    assert not guard.overtakes(produce(("t", 0, 7, 0, 527)))


def test_an_earlier_batch_is_judged_normally_and_leaves_the_hold() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    older = produce(("t", 0, 7, 0, 525))
    assert not guard.overtakes(older)
    guard.admitted(older)
    assert guard.overtakes(produce(("t", 0, 7, 0, 527)))


def test_rejecting_an_earlier_batch_moves_the_hold_back_to_it() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    guard.rejected(produce(("t", 0, 7, 0, 525)), now_ms=1)
    # 526 must now wait for 525's retry.
    assert guard.overtakes(produce(("t", 0, 7, 0, 526)))
    guard.admitted(produce(("t", 0, 7, 0, 525)))
    assert not guard.overtakes(produce(("t", 0, 7, 0, 526)))


def test_other_partitions_topics_and_producers_are_not_held() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    assert not guard.overtakes(produce(("t", 1, 7, 0, 900)))  # same PID, other partition
    assert not guard.overtakes(produce(("u", 0, 7, 0, 900)))  # same PID, other topic
    assert not guard.overtakes(produce(("t", 0, 8, 0, 900)))  # other PID, same partition


def test_one_overtaking_batch_holds_the_whole_request_and_withholds_its_other_batches() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    # PID 9 is known and fine on partition 3, but it shares a request with 7's overtaker: the
    # request is answered with a rejection, so 9's batch 50 is withheld in turn, or 9's batch
    # 51 behind it would overtake it.
    mixed = produce(("t", 0, 7, 0, 527), ("t", 3, 9, 0, 50))
    assert guard.overtakes(mixed)
    guard.rejected(mixed, now_ms=1)
    assert guard.overtakes(produce(("t", 3, 9, 0, 51)))
    assert guard.withheld_producer_ids() == {7, 9}
    # The client retries in order; each retry lifts its own hold when admitted.
    guard.admitted(produce(("t", 3, 9, 0, 50)))
    assert guard.withheld_producer_ids() == {7}
    assert guard.overtakes(produce(("t", 0, 7, 0, 527), ("t", 3, 9, 0, 51)))
    guard.admitted(produce(("t", 0, 7, 0, 526)))
    assert not guard


def test_a_pid_known_on_one_partition_and_withheld_on_another() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 10), ("t", 1, 7, 0, 20)), now_ms=0)
    # The retry may come regrouped: partition 1 alone first.
    retry_1 = produce(("t", 1, 7, 0, 20))
    assert not guard.overtakes(retry_1)
    guard.admitted(retry_1)
    assert not guard.overtakes(produce(("t", 1, 7, 0, 21)))
    assert guard.overtakes(produce(("t", 0, 7, 0, 11)))


def test_an_epoch_bump_drops_the_stale_hold() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, 526)), now_ms=0)
    # KIP-360: the client bumped the epoch and restarted the sequence at 0.
    assert not guard.overtakes(produce(("t", 0, 7, 1, 0)))
    assert not guard


def test_batches_without_pid_or_sequence_are_never_held() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, -1, -1, -1)), now_ms=0)
    assert not guard
    assert not guard.overtakes(produce(("t", 0, -1, -1, -1)))


@pytest.mark.parametrize(
    ("sequence", "reference", "after"),
    [
        (527, 526, True),
        (526, 526, False),
        (525, 526, False),
        (0, SEQUENCE_MODULUS - 1, True),  # wrapped past Integer.MAX_VALUE
        (SEQUENCE_MODULUS - 1, 0, False),
        (5, SEQUENCE_MODULUS - 3, True),
    ],
)
def test_sequences_compare_modulo_2_to_the_31(sequence: int, reference: int, after: bool) -> None:
    assert sequence_after(sequence, reference) is after


def test_a_wrapped_sequence_still_overtakes() -> None:
    guard = ProduceOrderGuard()
    guard.rejected(produce(("t", 0, 7, 0, SEQUENCE_MODULUS - 1)), now_ms=0)
    assert guard.overtakes(produce(("t", 0, 7, 0, 0)))


def test_memory_is_bounded_oldest_hold_dropped_first() -> None:
    guard = ProduceOrderGuard(max_withheld=3)
    for pid in range(5):
        guard.rejected(produce(("t", 0, pid, 0, 0)), now_ms=pid)
    assert len(guard) == 3
    assert guard.dropped == 2
    assert guard.withheld_producer_ids() == {2, 3, 4}


def test_holds_older_than_the_ttl_are_forgotten() -> None:
    guard = ProduceOrderGuard(withheld_ttl_ms=1000)
    guard.rejected(produce(("t", 0, 7, 0, 5)), now_ms=0)
    guard.rejected(produce(("t", 0, 8, 0, 5)), now_ms=1500)
    assert guard.withheld_producer_ids() == {8}
    assert not guard.overtakes(produce(("t", 0, 7, 0, 6)))
