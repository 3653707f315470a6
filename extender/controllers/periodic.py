"""A pass of a controller every few seconds, run only where it may act (the Lease holder, with a
synced picture); a failed pass is logged and the next one runs as usual. `wake` runs the next
pass at once instead of at the end of the interval (the reclaim loop is woken when kube-scheduler
gives up on a pod), but never sooner than `min_gap_s` after the last pass ended, so a stream of
wakes costs at most one pass per gap."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class BackgroundLoop(ABC):
    """A loop run as an asyncio task of its name: `start` it, `stop` cancels it and waits."""

    name: str
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @abstractmethod
    async def _run(self) -> None: ...


class PeriodicPass(BackgroundLoop):
    def __init__(
        self,
        name: str,
        interval_s: float,
        may_act: Callable[[], bool],
        run_once: Callable[[], Awaitable[object]],
        min_gap_s: float = 0.0,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.may_act = may_act
        self.run_once = run_once
        self.min_gap_s = min(min_gap_s, interval_s)
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """Run the next pass now (after `min_gap_s` since the last one), not at the interval's end."""
        self._woken.set()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.min_gap_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self.interval_s - self.min_gap_s)
            self._woken.clear()
            if not self.may_act():
                continue
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s pass failed", self.name)
