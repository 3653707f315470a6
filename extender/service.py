"""The extender process assembled: the cluster picture and its watcher, the status writer, the
binder and the HTTP server, and the admission webhooks' own process, started and stopped
together (the composition root)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass, field

from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from extender.binder import Binder
from extender.controllers.consolidate import ConsolidationOptions, Consolidator
from extender.controllers.endpoint import Advertise, LeaderEndpoint
from extender.controllers.gates import GateController
from extender.controllers.history import HistoryCollector, HistoryKeeper, HistoryOptions
from extender.controllers.lease import LeaderLease
from extender.controllers.outside import BypassReporter
from extender.controllers.owners import OwnerReader
from extender.controllers.reclaim import ReclaimLoop, ReclaimOptions
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.picture.watcher import ClusterWatcher
from extender.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CANDIDATE_NODES, build_app
from extender.serving import SERVER_SETTINGS
from extender.status import StatusWriter, WaitingPods
from extender.webhook import WebhookOptions
from extender.webhook_process import WebhookProcess, WebhookProcessConfig, WebhookTLS

log = logging.getLogger(__name__)


@dataclass
class ServiceOptions:
    host: str = "0.0.0.0"
    port: int = 8888
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_candidate_nodes: int = DEFAULT_MAX_CANDIDATE_NODES
    ssl_context: ssl.SSLContext | None = None
    queue_status_interval_s: float = 2.0
    # Seconds a connection may sit without completing a request (kube-scheduler reconnects).
    idle_timeout_s: float = 15.0
    picture: ClusterPicture = field(default_factory=ClusterPicture)
    # Reclaim and preemption of running pods; None turns the loop off (admission alone).
    reclaim: ReclaimOptions | None = field(default_factory=ReclaimOptions)
    # Moves of running pods to defragment GPUs, in the reclaim loop's cycle after reclaim; None
    # turns them off (and so does a reclaim loop that is off).
    consolidation: ConsolidationOptions | None = field(default_factory=ConsolidationOptions)
    # Leader election among replicas: (namespace, lease name, this replica's identity); None when
    # this is the only instance.
    lease: tuple[str, str, str] | None = None
    lease_duration_s: float = 15.0
    # With a lease: the Service the leader points at itself (its EndpointSlice); None: the
    # scheduler reaches every replica some other way.
    advertise: Advertise | None = None
    # The admission webhooks in their own process on their own port, and (with their gate) the
    # gate controller; None: no webhooks.
    webhooks: WebhookOptions | None = None
    # TLS of the webhook port (the API server calls only https); None: plain HTTP (benchmarks).
    webhook_tls: WebhookTLS | None = None
    # The webhook process's API access: a kubeconfig file; None: the in-cluster service account.
    kubeconfig: str | None = None
    # Fair share over time: the cluster-wide defaults (off unless a queue turns it on).
    history: HistoryOptions = field(default_factory=HistoryOptions)


class ExtenderService:
    """The whole extender in one object: watches, status writer and HTTP server (start/stop)."""

    def __init__(self, api: ApiClient, options: ServiceOptions) -> None:
        self.options = options
        self.picture = options.picture
        self.metrics = ExtenderMetrics(self.picture)
        self.waiting = WaitingPods()
        self.watcher = ClusterWatcher(api, self.picture)
        # Reads the custom resources whose spec states a gang's minimum (every replica).
        self.owners = OwnerReader(api, self.picture)
        self.lease = LeaderLease(api, *options.lease, options.lease_duration_s) if options.lease else None
        if options.advertise and not self.lease:
            raise ValueError("advertising the leader's endpoint needs leader election (a lease)")
        self.endpoint = (
            LeaderEndpoint(api, options.advertise, lambda: self.port, self.lease.is_leader)
            if options.advertise and self.lease
            else None
        )
        self.reclaimer = (
            ReclaimLoop(
                api,
                self.picture,
                self.metrics,
                options.reclaim,
                self.lease.is_leader if self.lease else (lambda: True),
                # (the history keeper is made below; asked each cycle)
                history_moves=lambda: self.history.moving,
            )
            if options.reclaim
            else None
        )
        self.consolidator = (
            Consolidator(api, self.picture, self.metrics, options.consolidation)
            if self.reclaimer and options.consolidation
            else None
        )
        if self.reclaimer and self.consolidator:
            self.reclaimer.follow_ups.append(self.consolidator)
        self.writer = StatusWriter(
            api,
            self.picture,
            self.waiting,
            self.metrics,
            options.queue_status_interval_s,
            self.reclaimer.counts if self.reclaimer else None,
        )
        webhooks = options.webhooks
        self.webhook_process = (
            WebhookProcess(
                WebhookProcessConfig(
                    webhooks,
                    self.picture.config,
                    options.kubeconfig,
                    options.webhook_tls,
                    options.idle_timeout_s,
                    logging.getLogger().getEffectiveLevel(),
                )
            )
            if webhooks
            else None
        )
        self.webhook_port = webhooks.port if webhooks else 0
        self.app = build_app(
            self.picture,
            Binder(api, self.picture, require_filtered=True),
            self.waiting,
            self.metrics,
            options.max_body_bytes,
            health=self.problem,
            max_candidate_nodes=options.max_candidate_nodes,
            relayed_metrics=self.webhook_process.metrics if self.webhook_process else None,
        )
        # Lifts admission gates: only the active replica, like reclaim.
        self.gates = (
            GateController(
                api,
                self.picture,
                self.metrics,
                webhooks.gate_interval_s,
                self.lease.is_leader if self.lease else (lambda: True),
                self.waiting,
            )
            if webhooks and webhooks.gate
            else None
        )
        # Usage history in the Queue status (the Lease holder writes, every replica follows it).
        self.history = HistoryKeeper(
            api, self.picture, options.history, self.lease.is_leader if self.lease else (lambda: True)
        )
        self.metrics.registry.register(HistoryCollector(self.history))
        # Marks pods that hold GPUs outside Tessera (a condition, one Warning event): the active replica.
        self.bypass = BypassReporter(
            api, self.picture, is_leader=self.lease.is_leader if self.lease else (lambda: True)
        )
        # A connection that completes no request within this long - idle, or still sending its
        # headers (a half-sent request) - is closed: nothing holds a connection for long.
        self._runner = web.AppRunner(
            self.app, access_log=None, keepalive_timeout=options.idle_timeout_s, **SERVER_SETTINGS
        )
        self.port = options.port

    def problem(self) -> str:
        """What is broken in the process ('' when all runs): its watches, the webhook process."""
        problems = [self.watcher.problem(), self.webhook_process.problem() if self.webhook_process else ""]
        return "; ".join(p for p in problems if p)

    async def start(self) -> None:
        self.watcher.start()
        self.owners.start()
        self.writer.start()
        self.bypass.start()
        self.history.start()
        if self.lease:
            self.lease.start()
        if self.reclaimer:
            self.reclaimer.start()
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.options.host, self.options.port, ssl_context=self.options.ssl_context
        )
        await site.start()
        sockets = self._runner.addresses
        if sockets:
            self.port = int(sockets[0][1])
        if self.endpoint:  # only once the port is known
            self.endpoint.start()
        if self.webhook_process and self.options.webhooks:
            self.webhook_port = await self.webhook_process.start()
            host = self.options.webhooks.host
            log.info("admission webhooks on %s:%d (own process)", host, self.webhook_port)
        if self.gates:
            self.gates.start()
        log.info(
            "extender listening on %s:%d (TLS %s)",
            self.options.host,
            self.port,
            "on" if self.options.ssl_context else "off",
        )

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the picture (and the webhook process's) is synced."""
        deadline = time.monotonic() + timeout_s
        while not (self.picture.ready() and (self.webhook_process is None or self.webhook_process.ready())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster picture not synced after {timeout_s:.0f}s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.gates:
            await self.gates.stop()
        if self.webhook_process:
            await self.webhook_process.stop()
        if self.endpoint:
            await self.endpoint.stop()
        if self.reclaimer:
            await self.reclaimer.stop()
        if self.lease:
            await self.lease.stop(release=True)
        await self._runner.cleanup()
        await self.bypass.stop()
        await self.history.stop()
        await self.writer.stop()
        await self.owners.stop()
        await self.watcher.stop()
