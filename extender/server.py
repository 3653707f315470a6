"""The extender's HTTP layer: filter, prioritize and bind for kube-scheduler, plus health and metrics.

Only HTTP lives here: parse the request (a 4xx with the reason when it is malformed or too large:
the body is read by `extender.serving`, which the webhooks' server shares), ask the pure decision
in `extender.verbs`, apply its effects (wait reasons, metrics, the reservation of an admitted pod)
and write the answer. The process is assembled in `extender.service`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import msgspec
from aiohttp import web

from extender.binder import Binder
from extender.metrics import CONTENT_TYPE, ExtenderMetrics, merged_exposition
from extender.picture.cluster import ClusterPicture
from extender.serving import (
    BODY_LIMIT_KEY,
    IN_FLIGHT_KEY,
    METRICS_KEY,
    decoded,
    parse_body,
    read_body,
    timed,
    too_large,
)
from extender.status import WaitingPods
from extender.statusapi import STATUS_PATH, queue_report
from extender.verbs import (
    KEEPS_HOLDS,
    PassedNodes,
    UnreadablePod,
    decide_filter,
    decide_preemption,
    decide_priorities,
)
from extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderPreemptionArgs,
    decode,
    encode,
    passed_names,
)

log = logging.getLogger(__name__)

# The largest request body a verb reads, compressed or not. kube-scheduler sends node names
# (nodeCacheCapable: true, the chart's mode: under 6 MB with a pod as large as the API server takes
# and DEFAULT_MAX_CANDIDATE_NODES of the longest names) or whole Nodes (a NodeList: ~1 KB to ~15 KB
# a node). Decoding holds the event loop (~2-7 ms per MB on the 2-core test machine, in a worker
# thread as much as inline: msgspec keeps the GIL), so the cap also bounds how long one request
# holds the others up.
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
# Candidate nodes a filter or prioritize may name: twice the 5000 nodes Kubernetes supports in one
# cluster, and the scheduler sends at most its nodes (fewer by default: percentageOfNodesToScore).
# A decision over 10,000 names takes 2-9 ms when the picture knows the nodes, ~40 ms of CPU when it
# knows none of them (the slowest case, on the 2-core test machine: docs/extender.md, "The verbs").
DEFAULT_MAX_CANDIDATE_NODES = 10_000
# In names mode a body holds one pod (the API server takes no request over 3 MB) and the names
# (a DNS name is at most 253 characters, quoted, with its comma): a body above this many bytes per
# allowed name is a NodeList, or not the scheduler's.
POD_BYTES = 3 * 2**20
NAME_BYTES = 256
# How long an admitted pod counts against its queue while the scheduler binds it; a pod that
# is not bound by then (its cycle failed after filter) stops counting.
RESERVATION_TTL_S = 15.0

PICTURE_KEY = web.AppKey("picture", ClusterPicture)
WAITING_KEY = web.AppKey("waiting", WaitingPods)
BINDER_KEY = web.AppKey("binder", Binder)
HealthCheck = Callable[[], str]
HEALTH_KEY: web.AppKey[HealthCheck] = web.AppKey("health")
MAX_NODES_KEY = web.AppKey("max_candidate_nodes", int)
Exposition = Callable[[], bytes]
# Metrics of another process (the webhooks'), merged into /metrics.
RELAYED_METRICS_KEY: web.AppKey[Exposition] = web.AppKey("relayed_metrics")


@dataclass
class LastFilter:
    """What the last filter passed, for the prioritize of the same pod that follows it."""

    passed: PassedNodes | None = None


LAST_FILTER_KEY = web.AppKey("last_filter", LastFilter)
# Requests handled at once; kube-scheduler calls one at a time, so more is a flood or a bug.
MAX_IN_FLIGHT = 64


class _NamesShape(msgspec.Struct):
    NodeNames: msgspec.Raw = msgspec.Raw(b"null")  # (msgspec takes no Raw in a union)


_NAMES_SHAPE = msgspec.json.Decoder(_NamesShape)


async def parse_candidates(request: web.Request, verb: str) -> ExtenderArgs:
    """A filter or prioritize request; a 413 when it names more candidate nodes than the app's cap
    (MAX_NODES_KEY), before the decision looks at them.

    A names-mode body larger than POD_BYTES + NAME_BYTES per allowed name is refused after a scan
    that builds none of its names (`_NamesShape`), so an absurd list is never decoded.
    """
    body = await read_body(request, verb)
    max_nodes = request.app[MAX_NODES_KEY]
    if len(body) > POD_BYTES + NAME_BYTES * max_nodes:
        shape = decoded(request, body, _NAMES_SHAPE.decode, verb)
        if bytes(shape.NodeNames) != b"null":
            raise too_large(
                request, verb, f"{len(body)} bytes of node names: more than {max_nodes} candidate nodes"
            )
    args = decoded(request, body, partial(decode, ExtenderArgs), verb)
    count = len(args.candidate_names())
    if count > max_nodes:
        raise too_large(request, verb, f"{count} candidate nodes, more than {max_nodes}")
    return args


def _json(answer: object) -> web.Response:
    return _json_bytes(encode(answer))


def _json_bytes(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def _unreadable_pod(request: web.Request, verb: str, error: ValueError) -> web.HTTPBadRequest:
    """A pod that parses as JSON but holds values that do not (e.g. a bad quantity)."""
    request.app[METRICS_KEY].bad_requests.labels(verb).inc()
    return web.HTTPBadRequest(text=f"malformed {verb} request: unreadable pod: {error}")


async def handle_filter(request: web.Request) -> web.StreamResponse:
    args = await parse_candidates(request, "filter")
    app = request.app
    picture, waiting = app[PICTURE_KEY], app[WAITING_KEY]
    meta = args.pod
    key = meta.key
    if picture.ready():
        picture.release(key)  # a pod filtered again: its earlier admission did not lead to a bind
    try:
        decision = decide_filter(picture, args)
    except UnreadablePod as exc:
        raise _unreadable_pod(request, "filter", exc) from exc
    app[METRICS_KEY].decisions.labels("filter", decision.outcome, decision.reason).inc()
    if decision.admitted is False:
        waiting.refused(
            meta.namespace, meta.name, meta.uid, decision.queue, decision.message, decision.reason
        )
        if decision.reason not in KEEPS_HOLDS:
            # GPUs reclaim held for it would sit idle while admission refuses it: let them go. (Not
            # for a gang waiting for GPUs to come free: those held for it are what it waits for.)
            picture.release_hold(key)
    elif decision.gang is not None:
        waiting.admitted_whole(meta.namespace, meta.name, meta.uid, decision.message)
    elif decision.waits:
        waiting.no_node_fits(
            meta.namespace, meta.name, meta.uid, decision.queue, decision.message, decision.waits
        )
    elif decision.admitted:
        waiting.admitted(meta.namespace, meta.name, meta.uid, decision.message)
    if decision.gang is not None:
        picture.reserve_gang(decision.gang)
    if decision.reserve:
        picture.reserve(key, args.Pod, RESERVATION_TTL_S)
    # bind accepts only these nodes for the pod
    app[BINDER_KEY].filtered.remember(meta.uid, passed_names(decision.result))
    app[LAST_FILTER_KEY].passed = decision.passed
    return _json(decision.result)


async def handle_prioritize(request: web.Request) -> web.StreamResponse:
    args = await parse_candidates(request, "prioritize")
    try:
        decision = decide_priorities(request.app[PICTURE_KEY], args, request.app[LAST_FILTER_KEY].passed)
    except UnreadablePod as exc:
        raise _unreadable_pod(request, "prioritize", exc) from exc
    request.app[METRICS_KEY].decisions.labels("prioritize", decision.outcome, decision.reason).inc()
    return _json_bytes(decision.json())


async def handle_preempt(request: web.Request) -> web.StreamResponse:
    args = await parse_body(request, partial(decode, ExtenderPreemptionArgs), "preempt")
    try:
        decision = decide_preemption(request.app[PICTURE_KEY], args)
    except UnreadablePod as exc:
        raise _unreadable_pod(request, "preempt", exc) from exc
    metrics = request.app[METRICS_KEY]
    for node, why in decision.dropped.items():
        log.info("preemption on %s for %s refused: %s", node, args.pod.name, why)
        metrics.decisions.labels("preempt", "dropped", "queue_rules").inc()
    for _ in decision.result.NodeNameToMetaVictims:
        metrics.decisions.labels("preempt", "kept", "").inc()
    return _json(decision.result)


async def handle_bind(request: web.Request) -> web.StreamResponse:
    args = await parse_body(request, partial(decode, ExtenderBindingArgs), "bind")
    error = await request.app[BINDER_KEY].bind(args)
    request.app[METRICS_KEY].decisions.labels("bind", "error" if error else "bound", "").inc()
    return _json(ExtenderBindingResult(Error=error))


async def handle_healthz(request: web.Request) -> web.StreamResponse:
    """Liveness: every background loop the process needs is still running."""
    problem = request.app[HEALTH_KEY]()
    return web.Response(status=500, text=problem) if problem else web.Response(text="ok")


async def handle_readyz(request: web.Request) -> web.StreamResponse:
    """Readiness: the picture is synced and the decision path answers (fair shares computable)."""
    picture = request.app[PICTURE_KEY]
    if not picture.ready():
        return web.Response(status=503, text=f"not synced yet: {', '.join(picture.unsynced())}")
    try:
        picture.fairness()
    except Exception as exc:
        log.exception("readiness: the decision path fails")
        return web.Response(status=503, text=f"decisions fail: {exc!r}")
    problem = request.app[HEALTH_KEY]()
    return web.Response(status=503, text=problem) if problem else web.Response(text="ok")


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    body = request.app[METRICS_KEY].render()
    if RELAYED_METRICS_KEY in request.app:
        body = merged_exposition(body, request.app[RELAYED_METRICS_KEY]())
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def handle_status(request: web.Request) -> web.StreamResponse:
    waiting = request.app.get(WAITING_KEY)
    return web.json_response(queue_report(request.app[PICTURE_KEY], waiting))


def build_app(
    picture: ClusterPicture,
    binder: Binder,
    waiting: WaitingPods,
    metrics: ExtenderMetrics,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    health: HealthCheck = lambda: "",
    max_candidate_nodes: int = DEFAULT_MAX_CANDIDATE_NODES,
    relayed_metrics: Exposition | None = None,
) -> web.Application:
    """The HTTP app; `health` names what is broken in the process ('' when all runs);
    `relayed_metrics`, another process's metrics to serve with this one's."""
    app = web.Application(client_max_size=max_body_bytes)
    app[BODY_LIMIT_KEY] = max_body_bytes
    app[MAX_NODES_KEY] = max_candidate_nodes
    app[PICTURE_KEY] = picture
    app[HEALTH_KEY] = health
    if relayed_metrics is not None:
        app[RELAYED_METRICS_KEY] = relayed_metrics
    app[IN_FLIGHT_KEY] = asyncio.Semaphore(MAX_IN_FLIGHT)
    app[WAITING_KEY] = waiting
    app[METRICS_KEY] = metrics
    app[BINDER_KEY] = binder
    app[LAST_FILTER_KEY] = LastFilter()
    app.router.add_post("/filter", timed("filter", handle_filter))
    app.router.add_post("/prioritize", timed("prioritize", handle_prioritize))
    app.router.add_post("/preempt", timed("preempt", handle_preempt))
    app.router.add_post("/bind", timed("bind", handle_bind))
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get(STATUS_PATH, handle_status)
    return app


def operations_app(
    picture: ClusterPicture,
    metrics: ExtenderMetrics,
    health: HealthCheck,
    relayed_metrics: Exposition | None = None,
    waiting: WaitingPods | None = None,
) -> web.Application:
    """/metrics, /healthz, /readyz and the queue report (extender.statusapi) on their own port:
    no verb, so no client certificate needed."""
    app = web.Application()
    app[PICTURE_KEY] = picture
    if waiting is not None:
        app[WAITING_KEY] = waiting
    app[METRICS_KEY] = metrics
    app[HEALTH_KEY] = health
    if relayed_metrics is not None:
        app[RELAYED_METRICS_KEY] = relayed_metrics
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    app.router.add_get(STATUS_PATH, handle_status)
    return app
