"""The extender's HTTP layer: filter, prioritize and bind for kube-scheduler, plus health and metrics.

Only HTTP lives here: parse the request (a 4xx with the reason when it is malformed or too large),
ask the pure decision in `extender.verbs`, apply its effects (wait reasons, metrics, the
reservation of an admitted pod) and write the answer. The process is assembled in
`extender.service`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from aiohttp import web

from extender.binder import Binder
from extender.metrics import CONTENT_TYPE, ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.status import WaitingPods
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

DEFAULT_MAX_BODY_BYTES = 64 * 2**20  # a NodeList of thousands of nodes still fits
# kube-scheduler gives up on an extender after 5 s: a body still arriving after this is not its.
BODY_TIMEOUT_S = 5.0
# Bodies above this are decoded in a worker thread, so an absurd body never stalls the requests
# beside it. A thread costs a third more than decoding inline, so the NodeLists of real clusters
# (5000 nodes: 5.6 MB, ~0.2 s) stay on the loop.
OFF_LOOP_BYTES = 8 * 2**20
# How long an admitted pod counts against its queue while the scheduler binds it; a pod that
# is not bound by then (its cycle failed after filter) stops counting.
RESERVATION_TTL_S = 15.0

PICTURE_KEY = web.AppKey("picture", ClusterPicture)
WAITING_KEY = web.AppKey("waiting", WaitingPods)
METRICS_KEY = web.AppKey("metrics", ExtenderMetrics)
BINDER_KEY = web.AppKey("binder", Binder)
HealthCheck = Callable[[], str]
HEALTH_KEY: web.AppKey[HealthCheck] = web.AppKey("health")
IN_FLIGHT_KEY = web.AppKey("in_flight", asyncio.Semaphore)


@dataclass
class LastFilter:
    """What the last filter passed, for the prioritize of the same pod that follows it."""

    passed: PassedNodes | None = None


LAST_FILTER_KEY = web.AppKey("last_filter", LastFilter)
# Requests handled at once; kube-scheduler calls one at a time, so more is a flood or a bug.
MAX_IN_FLIGHT = 64
T = TypeVar("T")


async def parse_body(request: web.Request, decode_body: Callable[[bytes], T], verb: str) -> T:
    """The request body, decoded by `decode_body`; a 4xx with the reason when it is too large, slow or
    malformed (`decode_body` raises a ValueError naming the problem: msgspec's and pydantic's errors
    are ValueErrors).

    A body that takes longer than BODY_TIMEOUT_S to arrive is dropped (a half-sent request holds
    nothing for long), and a large one is decoded off the event loop, so one big request never
    stalls the small ones beside it.
    """
    metrics = request.app[METRICS_KEY]
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # (no task per request, as wait_for makes)
            body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.bad_requests.labels(verb).inc()
        raise
    except TimeoutError as exc:
        metrics.bad_requests.labels(verb).inc()
        message = f"malformed {verb} request: body not received within {BODY_TIMEOUT_S:g}s"
        raise web.HTTPRequestTimeout(text=message) from exc
    except web.HTTPException:
        raise
    except Exception as exc:  # undecodable content encoding, broken chunking: the client's fault
        metrics.bad_requests.labels(verb).inc()
        raise web.HTTPBadRequest(text=f"malformed {verb} request: body could not be read: {exc}") from exc
    try:
        if len(body) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(decode_body, body)
        return decode_body(body)
    except ValueError as exc:
        metrics.bad_requests.labels(verb).inc()
        raise web.HTTPBadRequest(text=f"malformed {verb} request: {exc}") from exc


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def timed(verb: str, handler: Handler) -> Handler:
    """Time a verb, and bound how many requests are handled at once (a flood gets 503s quickly
    instead of queueing until the scheduler's 5 s timeout for everyone)."""

    async def bounded(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        in_flight = request.app[IN_FLIGHT_KEY]
        if in_flight.locked():
            request.app[METRICS_KEY].bad_requests.labels(verb).inc()
            raise web.HTTPServiceUnavailable(text=f"{verb}: {MAX_IN_FLIGHT} requests in flight; retry")
        async with in_flight:
            try:
                return await handler(request)
            finally:
                request.app[METRICS_KEY].latency.labels(verb).observe(time.perf_counter() - started)

    return bounded


def _json(answer: object) -> web.Response:
    return _json_bytes(encode(answer))


def _json_bytes(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


def _unreadable_pod(request: web.Request, verb: str, error: ValueError) -> web.HTTPBadRequest:
    """A pod that parses as JSON but holds values that do not (e.g. a bad quantity)."""
    request.app[METRICS_KEY].bad_requests.labels(verb).inc()
    return web.HTTPBadRequest(text=f"malformed {verb} request: unreadable pod: {error}")


async def handle_filter(request: web.Request) -> web.StreamResponse:
    args = await parse_body(request, partial(decode, ExtenderArgs), "filter")
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
            picture.inventory.release_hold(key)
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
    args = await parse_body(request, partial(decode, ExtenderArgs), "prioritize")
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
        missing = sorted(set(WATCHED_PATHS) - picture.store.synced)
        return web.Response(status=503, text=f"not synced yet: {', '.join(missing)}")
    try:
        picture.fairness()
    except Exception as exc:
        log.exception("readiness: the decision path fails")
        return web.Response(status=503, text=f"decisions fail: {exc!r}")
    problem = request.app[HEALTH_KEY]()
    return web.Response(status=503, text=problem) if problem else web.Response(text="ok")


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    return web.Response(body=request.app[METRICS_KEY].render(), headers={"Content-Type": CONTENT_TYPE})


def build_app(
    picture: ClusterPicture,
    binder: Binder,
    waiting: WaitingPods,
    metrics: ExtenderMetrics,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    health: HealthCheck = lambda: "",
) -> web.Application:
    """The HTTP app; `health` names what is broken in the process ('' when all runs)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[PICTURE_KEY] = picture
    app[HEALTH_KEY] = health
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
    return app


def operations_app(picture: ClusterPicture, metrics: ExtenderMetrics, health: HealthCheck) -> web.Application:
    """/metrics, /healthz and /readyz on their own port: no verb, so no client certificate needed."""
    app = web.Application()
    app[PICTURE_KEY] = picture
    app[METRICS_KEY] = metrics
    app[HEALTH_KEY] = health
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    return app


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None) -> ssl.SSLContext:
    """TLS for the scheduler link; with a client CA, only clients with a cert it signed get in."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        context.load_verify_locations(client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
