"""A pass of a controller every few seconds, run only where it may act (the Lease holder, with a
synced picture); a failed pass is logged and the next one runs as usual."""

from __future__ import annotations

import asyncio
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
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.may_act = may_act
        self.run_once = run_once

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self.may_act():
                continue
            try:
                await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s pass failed", self.name)
