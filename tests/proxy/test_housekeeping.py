"""The periodic chores' loop: first run one interval after the start, then every interval."""

from __future__ import annotations

import asyncio
import contextlib

from pidgate.proxy.housekeeping import run_every


def test_a_chore_runs_every_interval_until_cancelled() -> None:
    runs: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def chore() -> None:
            runs.append(loop.time() - started)

        task = asyncio.ensure_future(run_every(20, chore))
        await asyncio.sleep(0.005)
        assert runs == []  # not at the start: one interval after it
        while len(runs) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert runs[0] >= 0.019
    assert runs[2] >= 0.058
