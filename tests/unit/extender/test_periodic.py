"""PeriodicPass: a pass every interval, or at once when woken (no sooner than its gap after the
last pass), only where it may act."""

from __future__ import annotations

import asyncio

from extender.controllers.periodic import PeriodicPass

HOUR = 3600.0


async def test_a_woken_pass_runs_without_waiting_for_the_interval() -> None:
    ran = asyncio.Event()
    passes: list[int] = []

    async def run_once() -> None:
        passes.append(len(passes))
        ran.set()

    loop = PeriodicPass("test", HOUR, lambda: True, run_once, min_gap_s=0.0)
    loop.start()
    try:
        loop.wake()
        await asyncio.wait_for(ran.wait(), 30)  # an hour's interval: only the wake runs it
        assert passes == [0]
        ran.clear()
        loop.wake()  # woken again after a pass: one more
        await asyncio.wait_for(ran.wait(), 30)
        assert passes == [0, 1]
    finally:
        await loop.stop()


async def test_wakes_while_the_pass_may_not_act_run_nothing() -> None:
    """A wake that finds the loop not leading (or the picture unsynced) is used up, as an interval
    is: the pass is not run, and nothing is left over for later."""
    may_act = False
    checked = asyncio.Event()
    passes: list[int] = []

    def leading() -> bool:
        checked.set()
        return may_act

    async def run_once() -> None:
        passes.append(len(passes))

    loop = PeriodicPass("test", HOUR, leading, run_once)
    loop.start()
    try:
        loop.wake()
        await asyncio.wait_for(checked.wait(), 30)
        assert passes == []
    finally:
        await loop.stop()


def test_the_gap_is_never_longer_than_the_interval() -> None:
    async def run_once() -> None:
        return None

    assert PeriodicPass("test", 1.0, lambda: True, run_once, min_gap_s=5.0).min_gap_s == 1.0
