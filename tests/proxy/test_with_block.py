"""A ``with`` block ends what it was given, whether the block raised or not."""

from __future__ import annotations

import pytest

from pidgate.proxy.with_block import WithBlock


class _Door(WithBlock):
    def __init__(self) -> None:
        self.closed = 0

    def _on_exit(self) -> None:
        self.closed += 1


def test_the_block_gets_the_thing_and_its_end_ends_it() -> None:
    door = _Door()
    with door as entered:
        assert entered is door
        assert door.closed == 0
    assert door.closed == 1


def test_an_error_in_the_block_still_ends_it_and_propagates() -> None:
    door = _Door()
    with pytest.raises(RuntimeError, match="inside"), door:
        raise RuntimeError("inside")
    assert door.closed == 1
