"""pidgate's compiled data path against its pure-Python one, whole (issue #25): a client
connection on each, in a process of its own (the path is chosen once per process), fed the same
random programs of valid, split and malformed requests and of valid and corrupted broker
answers (scripts/path_twins.py), must write the same bytes to the client and to the broker,
close at the same moment, owe the same responses, and count the same traffic and quota
decisions, after every operation.

The primitives have twin tests of their own (tests/protocol/test_native.py,
tests/quota/test_compiled.py); this one holds the connection that assembles them to the same
account. Runs in both of CI's passes alike (it sets the path of each process itself).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ...compiled_modules import import_compiled, needs

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import path_twins  # noqa: E402

_speedups, _NOT_BUILT = import_compiled("pidgate.protocol._speedups")
_express, _ = import_compiled("pidgate.proxy.serving._express")
pytestmark = needs(_speedups, _NOT_BUILT, "tests/protocol/test_native.py")

PROGRAMS = 80
OPERATIONS = 300


@pytest.mark.parametrize("seed", [0, 1])
def test_both_paths_do_the_same_with_the_same_bytes(seed: int) -> None:
    compared, coverage = path_twins.compare(PROGRAMS, seed, OPERATIONS)
    assert compared == PROGRAMS * OPERATIONS
    # The programs made each thing happen, on both paths alike (compare checks the pure run
    # counted the same): forwarding, answers, rejections by the quota, refused connections.
    assert coverage["requests forwarded"] > PROGRAMS
    assert coverage["responses from the broker"] > PROGRAMS
    assert coverage["produce requests rejected"] > 0
    assert coverage["connections closed"] > 0
    # Busy producers' requests took the compiled path's express lane (compare checks the pure
    # path's took none), reads of several requests and answers included.
    if _express is not None:
        assert coverage[path_twins.EXPRESS] > PROGRAMS


def test_a_difference_is_found_and_named() -> None:
    """The comparison is live: two different programs' records differ, and the message says
    where and in what."""
    first, _ = path_twins._record_in("compiled", 2, 0, 50)
    other, _ = path_twins._record_in("compiled", 2, 5, 50)

    def full_record(path: str, index: int, step: int) -> list[object]:
        records, _ = path_twins._record_in("compiled", 2, 0 if path == "compiled" else 5, 50, index)
        return list(records[0][1][step])

    with pytest.raises(
        path_twins.PathsDiffer, match=r"program \d+, operation \d+: .* differ in \w"
    ):
        path_twins.compare_records(first, other, full_record, "seeds 0 and 5")
