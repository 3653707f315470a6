"""The extender's HTTP service: filter, prioritize and bind for kube-scheduler, plus health and metrics.

Filter and prioritize read only the in-memory cluster picture (no API call) and cost O(nodes in
the request). Filter first asks fairness whether the pod's queue may take what it asks for; a
refusal fails every node with the reason (FailedAndUnresolvableNodes: preempting pods on a node
cannot fix a queue's share). An admitted pod then keeps only the nodes whose free GPUs fit it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from pydantic import BaseModel, ValidationError

from contract.kube import object_key, validation_problems
from contract.names import GPU_MILLI, QUEUE_LABEL
from extender.binder import Binder
from extender.demand import pod_classic_gpus, to_gpu_demand
from extender.metrics import CONTENT_TYPE, ExtenderMetrics
from extender.policy.fairness import check_admission
from extender.policy.placement import GpuDemand, NodeGpus, Strategy, fits, score_nodes
from extender.state import WATCHED_KINDS, ClusterState, ClusterWatcher, pod_queue
from extender.status import StatusWriter, WaitingPods
from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    filter_result,
    host_priorities_json,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 64 * 2**20  # a NodeList of thousands of nodes still fits
NOT_READY = "tessera extender is still syncing its cluster picture; retry"
# How long an admitted pod counts against its queue while the scheduler binds it; a pod that
# is not bound by then (its cycle failed after filter) stops counting.
RESERVATION_TTL_S = 15.0

STATE_KEY = web.AppKey("state", ClusterState)
WAITING_KEY = web.AppKey("waiting", WaitingPods)
METRICS_KEY = web.AppKey("metrics", ExtenderMetrics)
BINDER_KEY = web.AppKey("binder", Binder)
ModelT = TypeVar("ModelT", bound=BaseModel)


def _describe(demand: GpuDemand) -> str:
    if demand.count == 1 and demand.milli < GPU_MILLI:
        return f"{demand.milli / GPU_MILLI:.3g} of a GPU"
    return f"{demand.count} GPU{'s' if demand.count != 1 else ''}"


class _DemandPerNode:
    """A fractional demand is relative to the memory of the GPUs of the node being considered;
    computed once per GPU size seen in the request."""

    def __init__(self, state: ClusterState, pod: dict[str, Any], demand: GpuDemand) -> None:
        self.demand = demand
        self.fractional = demand.count == 1 and demand.milli < GPU_MILLI
        self.requests = state.pod_gpu_requests(pod) if self.fractional else []
        self.classic = pod_classic_gpus(pod)
        self.by_memory: dict[int, GpuDemand] = {}

    def at(self, memory: int) -> GpuDemand:
        if not memory:
            return self.demand
        if memory not in self.by_memory:
            self.by_memory[memory] = to_gpu_demand(self.requests, self.classic, memory) or self.demand
        return self.by_memory[memory]


def _misfit(supply: NodeGpus, demand: GpuDemand) -> str:
    """Why `demand` does not fit on the node ('' when it fits)."""
    if fits(supply, demand):
        return ""
    free = sum(supply.free_milli) / GPU_MILLI
    models = f" of model {'/'.join(sorted(demand.models))}" if demand.models else ""
    return (
        f"not enough free GPU for {_describe(demand)}{models} "
        f"({free:.3g} free over {len(supply.free_milli)} GPUs, model '{supply.model}')"
    )


def decide_filter(
    state: ClusterState, waiting: WaitingPods, metrics: ExtenderMetrics, args: ExtenderArgs
) -> ExtenderFilterResult:
    names = args.candidate_names()
    if not state.ready():
        metrics.decisions.labels("filter", "error", "not_ready").inc()
        return ExtenderFilterResult(Error=NOT_READY)
    pod = args.Pod.raw()
    meta = args.Pod.metadata
    demand = state.pod_demand(pod)
    if demand is None and QUEUE_LABEL not in meta.labels:
        # Neither a GPU pod nor one that names a queue: not ours to hold back.
        metrics.decisions.labels("filter", "passed", "no_gpu").inc()
        return filter_result(args, names, {})
    queue, key = pod_queue(pod), object_key(pod)
    state.release(key)  # a pod filtered again: its earlier admission did not lead to a bind
    view = state.fairness()
    decision = check_admission(
        queue, state.pod_resources(key, pod), view.specs, view.usage, view.fair_shares, view.capacity
    )
    if not decision.admit:
        waiting.refused(meta.namespace, meta.name, meta.uid, queue, decision.reason)
        metrics.decisions.labels("filter", "refused", decision.kind or "refused").inc()
        result = filter_result(args, [], {})
        result.FailedAndUnresolvableNodes = dict.fromkeys(names, decision.reason)
        return result
    waiting.admitted(meta.namespace, meta.name, meta.uid, decision.reason)
    if demand is None:
        return filter_result(args, names, {})
    per_node = _DemandPerNode(state, pod, demand)
    passed: list[str] = []
    failed: dict[str, str] = {}
    # Nodes of one shape and GPU size get one verdict: a large cluster has few distinct ones.
    verdicts: dict[tuple[int, str], str] = {}
    gpu_memory = state.gpu_memory if per_node.fractional else {}  # {}: the size does not matter
    for name in names:
        supply = state.node_gpus(name)
        memory = gpu_memory.get(name, 0)
        reason = verdicts.get((memory, supply.shape))
        if reason is None:
            reason = verdicts[memory, supply.shape] = _misfit(supply, per_node.at(memory))
        if reason:
            failed[name] = reason
        else:
            passed.append(name)
    if passed:
        state.reserve(key, pod, RESERVATION_TTL_S)
    metrics.decisions.labels("filter", "admitted", "fits" if passed else "no_gpu_fit").inc()
    return filter_result(args, passed, failed)


def queue_strategy(state: ClusterState, queue: str) -> Strategy:
    obj = state.kind("Queue").get(queue) or {}
    return "spread" if (obj.get("spec") or {}).get("placement") == "spread" else "binpack"


def decide_priorities(state: ClusterState, metrics: ExtenderMetrics, args: ExtenderArgs) -> dict[str, int]:
    """The score of every candidate node."""
    names = args.candidate_names()
    pod = args.Pod.raw()
    demand = state.pod_demand(pod) if state.ready() else None
    if demand is None:
        metrics.decisions.labels("prioritize", "neutral", "no_gpu" if state.ready() else "not_ready").inc()
        return dict.fromkeys(names, 0)
    supplies: list[NodeGpus] = [state.node_gpus(name) for name in names]
    strategy = queue_strategy(state, pod_queue(pod))
    scores = score_nodes(supplies, demand, state.fairness().mix, strategy)
    metrics.decisions.labels("prioritize", "scored", strategy).inc()
    return scores


async def _parse(request: web.Request, model: type[ModelT], verb: str) -> ModelT:
    """The request body as a model; a 4xx with the reason when it is too large or malformed."""
    metrics = request.app[METRICS_KEY]
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.bad_requests.labels(verb).inc()
        raise
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        metrics.bad_requests.labels(verb).inc()
        problems = validation_problems(exc, "body", limit=5)
        raise web.HTTPBadRequest(text=f"malformed {verb} request: {problems}") from exc


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _timed(verb: str, handler: Handler) -> Handler:
    async def timed(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            request.app[METRICS_KEY].latency.labels(verb).observe(time.perf_counter() - started)

    return timed


def _json(model: BaseModel) -> web.Response:
    return _json_text(model.model_dump_json())


def _json_text(text: str) -> web.Response:
    return web.Response(text=text, content_type="application/json")


def _unreadable_pod(request: web.Request, verb: str, error: ValueError) -> web.HTTPBadRequest:
    """A pod that parses as JSON but holds values that do not (e.g. a bad quantity)."""
    request.app[METRICS_KEY].bad_requests.labels(verb).inc()
    return web.HTTPBadRequest(text=f"malformed {verb} request: unreadable pod: {error}")


async def handle_filter(request: web.Request) -> web.StreamResponse:
    args = await _parse(request, ExtenderArgs, "filter")
    app = request.app
    try:
        return _json(decide_filter(app[STATE_KEY], app[WAITING_KEY], app[METRICS_KEY], args))
    except ValueError as exc:
        raise _unreadable_pod(request, "filter", exc) from exc


async def handle_prioritize(request: web.Request) -> web.StreamResponse:
    args = await _parse(request, ExtenderArgs, "prioritize")
    try:
        scores = decide_priorities(request.app[STATE_KEY], request.app[METRICS_KEY], args)
        return _json_text(host_priorities_json(args.candidate_names(), scores))
    except ValueError as exc:
        raise _unreadable_pod(request, "prioritize", exc) from exc


async def handle_bind(request: web.Request) -> web.StreamResponse:
    args = await _parse(request, ExtenderBindingArgs, "bind")
    error = await request.app[BINDER_KEY].bind(args)
    request.app[METRICS_KEY].decisions.labels("bind", "error" if error else "bound", "").inc()
    return _json(ExtenderBindingResult(Error=error))


async def handle_healthz(request: web.Request) -> web.StreamResponse:
    return web.Response(text="ok")


async def handle_readyz(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    if state.ready():
        return web.Response(text="ok")
    missing = sorted(set(WATCHED_KINDS) - state.synced)
    return web.Response(status=503, text=f"not synced yet: {', '.join(missing)}")


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[METRICS_KEY].render(), headers={"Content-Type": CONTENT_TYPE})


def build_app(
    state: ClusterState,
    binder: Binder,
    waiting: WaitingPods,
    metrics: ExtenderMetrics,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes)
    app[STATE_KEY] = state
    app[WAITING_KEY] = waiting
    app[METRICS_KEY] = metrics
    app[BINDER_KEY] = binder
    app.router.add_post("/filter", _timed("filter", handle_filter))
    app.router.add_post("/prioritize", _timed("prioritize", handle_prioritize))
    app.router.add_post("/bind", _timed("bind", handle_bind))
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    return app


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    """TLS for the scheduler link; with a client CA, only clients with a cert it signed get in."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass
class ServiceOptions:
    host: str = "0.0.0.0"
    port: int = 8888
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    ssl_context: ssl.SSLContext | None = None
    queue_status_interval_s: float = 2.0
    state: ClusterState = field(default_factory=ClusterState)


class ExtenderService:
    """The whole extender in one object: watches, status writer and HTTP server (start/stop)."""

    def __init__(self, api: ApiClient, options: ServiceOptions) -> None:
        self.options = options
        self.state = options.state
        self.metrics = ExtenderMetrics(self.state)
        self.waiting = WaitingPods()
        self.watcher = ClusterWatcher(api, self.state)
        self.writer = StatusWriter(
            api, self.state, self.waiting, self.metrics, options.queue_status_interval_s
        )
        self.app = build_app(
            self.state, Binder(api, self.state), self.waiting, self.metrics, options.max_body_bytes
        )
        self._runner = web.AppRunner(self.app, access_log=None)
        self.port = options.port

    async def start(self) -> None:
        self.watcher.start()
        self.writer.start()
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.options.host, self.options.port, ssl_context=self.options.ssl_context
        )
        await site.start()
        sockets = self._runner.addresses
        if sockets:
            self.port = int(sockets[0][1])
        log.info(
            "extender listening on %s:%d (TLS %s)",
            self.options.host,
            self.port,
            "on" if self.options.ssl_context else "off",
        )

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.state.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster picture not synced after {timeout_s:.0f}s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self.writer.stop()
        await self.watcher.stop()
