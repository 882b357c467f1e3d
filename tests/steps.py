"""Driving a step generator (``*_in_steps``) to its end in a test, counting its steps."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")


def run_counting_steps(steps: Generator[None, None, T]) -> tuple[T, int]:
    """What ``steps`` returns, and how many times it yielded on the way."""
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result, count
        count += 1
