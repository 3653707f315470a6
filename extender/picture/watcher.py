"""The watcher: keeps a ClusterPicture current from the API server.

It lists every watched kind (in pages), then follows a watch from the list's resourceVersion,
relisting when the server says that version is gone (410) and reconnecting with exponential
backoff on any other error, so the picture survives apiserver restarts. Once the events at hand
are applied, the picture counts what they changed (`ClusterPicture.settle`) before the next
request needs it. After each full list it collects garbage once and freezes the survivors: the
picture is millions of long-lived objects, and left to the collector every full collection would
walk all of them (hundreds of ms in the middle of a request). The picture holds no reference
cycles, so what it drops later is still freed by reference counting. It also hands the C heap's
free memory back to the system: the list's pages of JSON (megabytes each) leave free space in the
heap below what the picture keeps, which would otherwise stay in the process's resident memory
(12 MiB at 1000 nodes / 20,000 pods).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta
from extender.kubeapi import KubeError, request, watch_lines
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.picture.store import Stored, project

log = logging.getLogger(__name__)
# glibc's malloc_trim (absent from other C libraries, where the heap simply keeps its free space).
_malloc_trim = getattr(ctypes.CDLL(None), "malloc_trim", None)


def freeze_after_list() -> None:
    """Collect what a full list left as garbage, then exempt the survivors from later collections
    (see the module docstring): done by the watcher after each list, and by benchmarks that load
    a picture the same way."""
    gc.collect()
    gc.freeze()
    if _malloc_trim is not None:
        _malloc_trim(0)


class ClusterWatcher:
    """Keeps a ClusterPicture current: list then watch every kind, relist on 410, retry on errors."""

    def __init__(
        self, api: ApiClient, picture: ClusterPicture, watch_timeout_s: int = 300, retry_delay_s: float = 1.0
    ) -> None:
        self.api = api
        self.picture = picture
        self.watch_timeout_s = watch_timeout_s
        self.retry_delay_s = retry_delay_s
        self._tasks: list[asyncio.Task[None]] = []
        self._settling = False

    def problem(self) -> str:
        """Which watches stopped for good ('' while all run): a reason to restart the process."""
        dead = [t.get_name() for t in self._tasks if t.done()]
        return f"watches stopped: {', '.join(dead)}" if dead else ""

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(kind, path), name=f"watch-{kind}")
            for kind, path in WATCHED_PATHS.items()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _list(self, kind: str, path: str) -> str:
        items: list[Stored] = []
        query = {"limit": "500"}
        while True:
            page = await request(self.api, "GET", path, query=query)
            # Projected page by page: only one page of whole objects is held at a time.
            items.extend(project(kind, obj) for obj in page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {"limit": "500", "continue": token}
        self.picture.replace(kind, items, projected=True)
        freeze_after_list()
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    async def _run(self, kind: str, path: str) -> None:
        version = ""
        delay = self.retry_delay_s
        while True:
            try:
                if not version:
                    version = await self._list(kind, path)
                    log.info("listed %s: %d objects", kind, len(self.picture.kind(kind)))
                version = await self._watch(kind, path, version)
                delay = self.retry_delay_s
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.status == 404 and kind == "Queue":
                    # The Queue CRD is not installed: no queues, check again later.
                    self.picture.replace(kind, [])
                if exc.status == 410:
                    version = ""
                    continue
                log.warning("watch %s failed: %s; retrying in %.1fs", kind, exc, delay)
            except Exception as exc:  # any transport error: reconnect, keep the picture
                log.warning("watch %s broke: %r; retrying in %.1fs", kind, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _watch(self, kind: str, path: str, version: str) -> str:
        """Follow one watch to its end; returns the version to resume from ('' forces a relist)."""
        query = {
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        async for event in watch_lines(self.api, path, query):
            version = apply_watch_event(self.picture, kind, event, version)
            if not version:
                log.info("watch %s expired (410 Gone); relisting", kind)
                return ""
            self._settle_soon()
        return version

    def _settle_soon(self) -> None:
        """Once the events at hand are applied, let the picture count what they changed
        (`ClusterPicture.settle`): in the time kube-scheduler spends on its own filters, instead of
        in the next filter or prioritize call, which the scheduler waits for."""
        if not self._settling:
            self._settling = True
            asyncio.get_running_loop().call_soon(self._settle)

    def _settle(self) -> None:
        self._settling = False
        try:
            self.picture.settle()
        except Exception:  # the next request counts again, and reports its own failure
            log.exception("counting the changes of the watch events failed")


def apply_watch_event(picture: ClusterPicture, kind: str, event: Mapping[str, Any], version: str) -> str:
    """Apply one watch event; returns the resourceVersion to resume from, '' when it expired (410).

    Bookmarks only move the version on; an ERROR event other than 410 raises KubeError.
    """
    event_type, obj = str(event.get("type")), event.get("object") or {}
    if event_type == "ERROR":
        if obj.get("code") == 410:
            return ""
        raise KubeError(int(obj.get("code") or 500), str(obj.get("message")))
    if event_type != "BOOKMARK":
        picture.apply(kind, event_type, obj)  # projected (copied) by the store
    return str(meta(obj).get("resourceVersion", version))
