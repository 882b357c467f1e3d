"""run_in_steps: a step generator driven on a real event loop, the loop let through between
steps; its result, its errors and its cancellation."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Generator

import pytest

from pidgate.proxy.operations.stepping import run_in_steps


def test_other_tasks_run_between_steps_and_the_result_comes_back() -> None:
    events: list[str] = []

    def work() -> Generator[None, None, int]:
        for i in range(5):
            events.append(f"step{i}")
            yield
        return 42

    async def main() -> int:
        stop = asyncio.Event()

        async def other() -> None:
            while not stop.is_set():
                events.append("other")
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        try:
            return await run_in_steps(work())
        finally:
            stop.set()
            await task

    assert asyncio.run(main()) == 42
    steps = [e for e in events if e.startswith("step")]
    assert steps == [f"step{i}" for i in range(5)]
    during = events[events.index("step0") : events.index("step4") + 1]
    assert not any(
        a.startswith("step") and b.startswith("step") for a, b in itertools.pairwise(during)
    )


def test_an_error_in_a_step_reaches_the_caller() -> None:
    def work() -> Generator[None, None, int]:
        yield
        raise ValueError("broken state")

    with pytest.raises(ValueError, match="broken state"):
        asyncio.run(run_in_steps(work()))


def test_a_cancelled_caller_closes_the_steps() -> None:
    closed: list[bool] = []

    def work() -> Generator[None, None, None]:
        try:
            while True:
                yield
        finally:
            closed.append(True)

    async def main() -> None:
        task = asyncio.create_task(run_in_steps(work()))
        for _ in range(3):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert closed == [True]
