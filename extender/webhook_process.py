"""The admission webhooks in a process of their own, so that nothing on their port slows the verbs.

```
extender process                                   webhook process (spawned, its child)
  filter / prioritize / preempt / bind   ◀─pipe─   AdmissionReviews over TLS (client cert optional)
  picture, watches, gate controller       port,     its own picture and watches (read-only use)
  /metrics: its own + the child's         ready,    limits: body, reviews in flight, API reads
  /healthz, /readyz: the child's too      metrics
```

Why a process and not a thread: a review is decoded in C (pydantic-core, msgspec) holding the GIL
for the whole call, ~10-25 ms for a 2 MB review on the 2-core test machine, and a thread running
such decodes back to back held the verbs' event loop up for 14 ms at the median, 34 ms at p99 of
its wake-ups (a worker thread decoding a filter request held it as long as decoding inline). In a
process the operating system shares the CPUs instead, and the child runs niced
(WEBHOOK_NICENESS), so the verbs come first; `python -m bench.webhookflood` measures it.

The price: the child keeps a picture of its own (the API server serves the watches twice and the
pod holds the picture twice: docs/install.md, "Admission webhooks"), and it does not see the
filter's reservations of admitted pods that are not bound yet, so a pod created in the moment
between its queue-mate's filter and bind may go ungated; the filter still holds it to its queue
(as for any pod the webhook could not judge). The gate controller stays in the extender process.

The child never outlives its parent: it stops when its end of the pipe closes, which the parent's
exit closes too. Each REPORT_INTERVAL_S it tells the parent whether its picture is synced, what
is broken in it, and its metrics (the webhook verbs' counters), which the parent serves with its
own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from aiohttp import web
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient

from extender.controllers.owners import OwnerReader
from extender.kubeapi import resolve_environment_once
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.picture.watcher import ClusterWatcher
from extender.serving import SERVER_SETTINGS, server_ssl_context
from extender.webhook import WebhookOptions, webhook_app

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 1.0
# The child's niceness above its parent's (19: the lowest priority). Where both want the pod's
# CPUs, the verbs, which kube-scheduler waits for (5 s at most), get them first; a flood of reviews
# slows only the webhooks (whose failure policy then applies, and the filter still holds every
# pod to its queue). While the verbs wait for the scheduler, the webhooks get all the CPU.
WEBHOOK_NICENESS = 19
# Spawning re-imports the extender (seconds on a busy machine) before the port is open.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


async def api_client(kubeconfig: str | None) -> ApiClient:
    """An API client from a kubeconfig file, else the in-cluster service account."""
    if kubeconfig:
        await kube_config.load_kube_config(config_file=kubeconfig)
    else:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    return resolve_environment_once(ApiClient())


@dataclass(frozen=True)
class WebhookTLS:
    """The webhook port's certificate, and (client_ca_file) the CA whose client certificates it
    requires: the API server's, when it is configured to present one (docs/install.md)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None


@dataclass(frozen=True)
class WebhookProcessConfig:
    """Everything the child needs, picklable (it is spawned, not forked)."""

    options: WebhookOptions
    picture: PictureConfig
    # None: the in-cluster service account.
    kubeconfig: str | None = None
    # None: plain HTTP (benchmarks); the API server calls only https.
    tls: WebhookTLS | None = None
    idle_timeout_s: float = 15.0
    log_level: int = logging.INFO


@dataclass(frozen=True)
class Report:
    ready: bool
    problem: str
    metrics: bytes


def child_main(config: WebhookProcessConfig, parent: Connection) -> None:
    """The child process: serve the webhooks until the parent closes the pipe."""
    os.nice(WEBHOOK_NICENESS)
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s [webhooks] %(message)s"
    )
    try:
        asyncio.run(_serve(config, parent))
    except Exception as exc:  # the parent reports it as the process's problem
        log.exception("the webhook process failed")
        with contextlib.suppress(OSError):  # the parent is gone
            parent.send(("failed", repr(exc)))


async def _serve(config: WebhookProcessConfig, parent: Connection) -> None:
    api = await api_client(config.kubeconfig)
    picture = ClusterPicture(config.picture)
    watcher, owners = ClusterWatcher(api, picture), OwnerReader(api, picture)
    # Counters of the webhook verbs only: the queue gauges are the parent's (this picture's stay empty).
    metrics = ExtenderMetrics(ClusterPicture())
    runner = web.AppRunner(
        webhook_app(api, picture, metrics, config.options),
        access_log=None,
        keepalive_timeout=config.idle_timeout_s,
        **SERVER_SETTINGS,
    )
    tls = config.tls
    ssl_context = server_ssl_context(tls.cert_file, tls.key_file, tls.client_ca_file) if tls else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(parent.fileno(), stop.set)  # the parent closed the pipe, or exited
    watcher.start()
    owners.start()
    await runner.setup()
    try:
        await web.TCPSite(runner, config.options.host, config.options.port, ssl_context=ssl_context).start()
        parent.send(("port", int(runner.addresses[0][1])))
        while not stop.is_set():
            parent.send(("report", Report(picture.ready(), watcher.problem(), metrics.render())))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REPORT_INTERVAL_S)
    finally:
        loop.remove_reader(parent.fileno())
        await runner.cleanup()
        await owners.stop()
        await watcher.stop()
        await api.close()


class WebhookProcess:
    """The parent's handle on the webhook process: start, its port, readiness, problems, metrics."""

    def __init__(self, config: WebhookProcessConfig) -> None:
        self.config = config
        self.port = 0
        self._process: BaseProcess | None = None
        self._pipe: Connection | None = None
        self._report = Report(False, "", b"")
        self._failure = ""
        self._started: asyncio.Future[int] | None = None

    async def start(self) -> int:
        """Spawn the child; its port once it listens (RuntimeError when it fails to start)."""
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        self._process = context.Process(
            target=child_main, args=(self.config, theirs), name="tessera-webhooks", daemon=True
        )
        self._process.start()
        theirs.close()
        self._pipe = mine
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        loop.add_reader(mine.fileno(), self._receive)
        try:
            self.port = await asyncio.wait_for(asyncio.shield(self._started), START_TIMEOUT_S)
        except (TimeoutError, RuntimeError):
            await self.stop()
            raise
        return self.port

    def _receive(self) -> None:
        assert self._pipe is not None
        try:
            message = self._pipe.recv()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._pipe.fileno())
            self._fail("the webhook process exited")
            return
        match message:
            case ("port", int(port)):
                if self._started is not None and not self._started.done():
                    self._started.set_result(port)
            case ("report", Report() as report):
                self._report = report
            case ("failed", str(reason)):
                self._fail(f"the webhook process failed: {reason}")

    def _fail(self, reason: str) -> None:
        self._failure = self._failure or reason
        if self._started is not None and not self._started.done():
            self._started.set_exception(RuntimeError(reason))

    def ready(self) -> bool:
        """Its picture is synced (until then the pod webhook gates nothing)."""
        return self._report.ready and not self.problem()

    def problem(self) -> str:
        """What is broken in the webhook process ('' while it runs well)."""
        if self._failure:
            return self._failure
        if self._process is not None and not self._process.is_alive():
            return f"the webhook process exited (code {self._process.exitcode})"
        return self._report.problem and f"webhook process: {self._report.problem}"

    def metrics(self) -> bytes:
        """Its latest metrics (Prometheus text)."""
        return self._report.metrics

    async def stop(self) -> None:
        """Close the pipe (the child stops) and wait for it; killed if it does not stop in time."""
        if self._pipe is not None:
            asyncio.get_running_loop().remove_reader(self._pipe.fileno())
            self._pipe.close()
            self._pipe = None
        process = self._process
        if process is not None:
            await asyncio.to_thread(process.join, STOP_TIMEOUT_S)
            if process.is_alive():
                log.warning("the webhook process did not stop within %gs: killed", STOP_TIMEOUT_S)
                process.kill()
                await asyncio.to_thread(process.join)
