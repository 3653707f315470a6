"""The admission webhooks, served on their own TLS port by a process of their own
(`extender.webhook_process`).

```
kube-apiserver ─POST /mutate-pods──────────▶ owners (GET up the controller chain), Namespace
   AdmissionReview (CREATE of a Pod)           resolve_queue ─ the queue label; schedulerName
                                                tenancy_refusal ─ may its namespace use the queue?
                                                gate_reason(picture's fairness view) ─ the gate
               ◀─ allowed + JSON Patch (+ a warning naming why the pod is gated), or refused
kube-apiserver ─POST /validate-queues──────▶ the stored Queues (GET) ─ queue_problems ─ allowed?
                                                (+ warnings: namespaces whose default queue it shuts out)
kube-apiserver ─POST /validate-resourceclaims▶ claim_config_problems (GpuConfig) ─ allowed?
kube-apiserver ─POST /validate-namespaces──▶ its default-queue label: a queue it may use? ─ allowed?
```

HTTP only, like `extender.server`: a malformed review gets a 400 with the reason (and costs only
itself); the decisions are the pure functions of `extender.admission` and `extender.policy`.
Limits of their own: a review body (MAX_REVIEW_BYTES), reviews handled at once
(MAX_REVIEWS_IN_FLIGHT, then 503s), API reads at once (MAX_API_READS) and each review's time
spent reading (`lookup_timeout_s`). The mutating webhook refuses a pod for one reason only: its
namespace may not use its queue (`extender.policy.tenancy`, the message naming both). Whatever it
cannot look up (an owner it may not read, an API error, a picture not yet synced) it leaves out,
and the extender's filter still holds the pod to its queue - and refuses it the same way if its
namespace may not use it. Every replica serves the webhooks (each keeps the whole picture); only
the active one lifts gates (`extender.controllers.gates`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.kube import controller_of, mapping, meta, sequence, validation_problems
from contract.names import (
    ADMISSION_GATE,
    DRIVER_NAME,
    NAMESPACE_QUEUE_LABEL,
    NAMESPACE_SCHEDULER_LABEL,
    QUEUE_GROUP,
    QUEUE_LABEL,
    QUEUE_PLURAL,
    QUEUE_VERSION,
)
from extender import kubeapi
from extender.admission import (
    QueueChoice,
    claim_config_problems,
    gate_reason,
    pod_patch,
    queue_problems,
    resolve_queue,
)
from extender.controllers.gates import ahead_of, gang_of, waiting_ungated
from extender.kubeapi import JsonObject, KubeError
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.policy.admission import Ask
from extender.policy.topology import ask_refusal
from extender.policy.workloads import subgroup_refusal
from extender.queues import defaults_shut_out
from extender.serving import BODY_LIMIT_KEY, IN_FLIGHT_KEY, METRICS_KEY, parse_body, timed

log = logging.getLogger(__name__)

MUTATE_PODS_PATH = "/mutate-pods"
VALIDATE_QUEUES_PATH = "/validate-queues"
VALIDATE_CLAIMS_PATH = "/validate-resourceclaims"
VALIDATE_NAMESPACES_PATH = "/validate-namespaces"
# Owners above this many levels are not read (Pod -> ReplicaSet -> Deployment is two).
MAX_OWNER_DEPTH = 4
# An AdmissionReview carries one object and, for an UPDATE, its old version: the API server takes
# no request over 3 MB, and etcd stores no object over 1.5 MiB.
MAX_REVIEW_BYTES = 4 * 2**20
# Reviews answered at once; more get a 503 at once (the API server's failurePolicy then applies)
# rather than queueing past its timeout.
MAX_REVIEWS_IN_FLIGHT = 16
# API reads (owners, a Namespace, the Queues) in flight at once, over all reviews: a flood of
# reviews costs the API server at most this many requests at a time.
MAX_API_READS = 8
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_KIND = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,62}$")
_API_VERSION = re.compile(r"^([a-z0-9.-]+/)?v[0-9a-z]+$")


@dataclass(frozen=True)
class WebhookOptions:
    host: str = "0.0.0.0"
    port: int = 8443  # 0: pick a free one
    # Give pods of Namespaces labelled scheduling.tessera.dev/use-scheduler=true this scheduler
    # (the chart's own profile); None: leave schedulerName alone.
    scheduler_name: str | None = None
    # Put the admission gate on pods their queue holds back (the gate controller lifts it).
    gate: bool = True
    # Seconds between the gate controller's passes over gated pods.
    gate_interval_s: float = 1.0
    # DRA drivers whose opaque configs in ResourceClaims must be valid GpuConfigs.
    config_drivers: frozenset[str] = field(default_factory=lambda: frozenset({DRIVER_NAME}))
    # Seconds the pod webhook spends reading owners and the Namespace; past it, it decides with
    # what it has (the API server's own timeout for the webhook is longer).
    lookup_timeout_s: float = 2.0


class GroupVersionKind(BaseModel):
    group: str = ""
    version: str
    kind: str


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    namespace: str = ""
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    object: dict[str, Any] | None = None


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore")

    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


def _review(body: bytes) -> AdmissionReview:
    """An AdmissionReview from JSON; a ValueError naming the first problems when it is not one."""
    try:
        return AdmissionReview.model_validate_json(body)
    except ValidationError as exc:
        raise ValueError(validation_problems(exc, "body", limit=5)) from exc


def review_answer(
    uid: str,
    problems: list[str] | None = None,
    patch: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
) -> JsonObject:
    """The AdmissionReview response: refused with the problems, or allowed (with a JSON Patch)."""
    response: JsonObject = {"uid": uid, "allowed": not problems}
    if problems:
        response["status"] = {"code": 422, "reason": "Invalid", "message": "; ".join(problems)}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def owner_path(namespace: str, owner: Mapping[str, Any]) -> str | None:
    """The API path of a namespaced owner reference (None: not a readable reference).

    The resource is the kind in lower case plus "s", which holds for every owner kind that makes
    pods in practice (replicasets, jobs, cronjobs, jobsets, pytorchjobs, rayclusters, ...).
    """
    api_version, kind, name = owner.get("apiVersion"), owner.get("kind"), owner.get("name")
    if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
        return None
    if not (
        _API_VERSION.match(api_version) and _KIND.match(kind) and _NAME.match(name) and _NAME.match(namespace)
    ):
        return None
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/namespaces/{namespace}/{kind.lower()}s/{name}"


class PodAdmission:
    """What the pod webhook reads beyond the pod: owners and Namespaces (API), the picture."""

    def __init__(self, api: ApiClient, picture: ClusterPicture, options: WebhookOptions) -> None:
        self.api = api
        self.picture = picture
        self.options = options
        self.reads = asyncio.Semaphore(MAX_API_READS)

    async def read(self, path: str) -> JsonObject:
        """GET `path`, one of at most MAX_API_READS at a time, within the lookup timeout."""
        async with self.reads:
            return await kubeapi.request(self.api, "GET", path, timeout=self.options.lookup_timeout_s)

    async def owner_labels(self, namespace: str, pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Labels of the pod's controllers, its own first; stops at one it cannot read."""
        chain: list[Mapping[str, Any]] = []
        current: Mapping[str, Any] = pod
        for _ in range(MAX_OWNER_DEPTH):
            path = owner_path(namespace, controller_of(current))
            if path is None:
                break
            try:
                current = await self.read(path)
            except KubeError as exc:  # forbidden (a kind the chart grants no get on) or gone
                log.debug("owner %s not read: %s", path, exc)
                break
            chain.append(mapping(meta(current).get("labels")))
        return chain

    async def namespace_labels(self, namespace: str) -> Mapping[str, Any]:
        if not _NAME.match(namespace):
            return {}  # not a namespace name: nothing to read (and no path to build from it)
        stored = self.picture.get("Namespace", namespace)
        if stored is None:  # created a moment ago: the watch has not delivered it yet
            stored = await self.read(f"/api/v1/namespaces/{namespace}")
        return mapping(meta(stored).get("labels"))

    async def mutate(self, pod: JsonObject, namespace: str) -> PodVerdict:
        """The patch for a pod being created, warnings for the user, and the outcome (metrics);
        or why it is refused: its namespace may not use its queue."""
        owners: list[Mapping[str, Any]] = []
        namespace_labels: Mapping[str, Any] = {}
        read_namespace = False
        try:
            async with asyncio.timeout(self.options.lookup_timeout_s):
                namespace_labels = await self.namespace_labels(namespace)
                read_namespace = True
                if not mapping(meta(pod).get("labels")).get(QUEUE_LABEL):
                    owners = await self.owner_labels(namespace, pod)
        except (TimeoutError, KubeError, OSError) as exc:
            log.warning("pod admission in %s decides without all lookups: %r", namespace, exc)
        choice = resolve_queue(mapping(meta(pod).get("labels")), owners, namespace_labels)
        # No label for a pod that names no queue anywhere: it is counted in the default queue
        # anyway, and a label would make every pod of the cluster one that Tessera holds back.
        queue = choice.queue if choice.source != "default" else None
        spec = mapping(pod.get("spec"))
        scheduler = (
            self.options.scheduler_name
            if self.options.scheduler_name
            and str(namespace_labels.get(NAMESPACE_SCHEDULER_LABEL, "")).lower() == "true"
            and spec.get("schedulerName") in (None, "", "default-scheduler")
            else None
        )
        stored = _patched(pod, namespace, queue, scheduler)
        # Judged with the Namespace's labels as read; without them the filter judges it instead.
        refusal = self.tenancy_refusal(stored, choice, namespace_labels) if read_namespace else ""
        # A topology level the cluster does not define could never be served: refused at once.
        refusal = refusal or ask_refusal(self.picture.config.topology, pod)
        # So could parts (subgroups) stated wrong: a gang whose parts do not add up never starts.
        refusal = refusal or subgroup_refusal(pod)
        if refusal:
            return PodVerdict([], [], "refused", refusal)
        patch = pod_patch(pod, queue, scheduler, gate=False)
        reason = self.gate_reason(stored) if self.options.gate else ""
        if reason:
            patch = pod_patch(pod, queue, scheduler, gate=True)
            return PodVerdict(
                patch,
                [f"held back by the scheduling gate {ADMISSION_GATE} until it is admissible: {reason}"],
                "gated",
            )
        return PodVerdict(patch, [], "labelled" if patch else "unchanged")

    def tenancy_refusal(
        self, pod: JsonObject, choice: QueueChoice, namespace_labels: Mapping[str, Any]
    ) -> str:
        """Why the pod's namespace may not use its queue ('' when it may, or cannot be told yet).

        Only pods Tessera holds to a queue are judged, as in the filter: those naming one (on
        themselves, an owner or their Namespace) and GPU pods, which fall in the default queue."""
        picture = self.picture
        if not picture.ready():
            return ""  # the Queues are not all known yet: the filter judges the pod
        if choice.source == "default" and not picture.demand(pod).wants_gpu:
            return ""
        return picture.tenancy_refusal(choice.queue, str(meta(pod).get("namespace", "")), namespace_labels)

    def gate_reason(self, pod: JsonObject) -> str:
        """Why the pod should wait gated ('' when it should not, or when that cannot be told)."""
        picture = self.picture
        key = f"{meta(pod).get('namespace')}/{meta(pod).get('name') or meta(pod).get('generateName', '')}"
        if not picture.ready() or not picture.is_pending(key, pod):
            return ""  # not synced, bound already, or for a scheduler Tessera does not serve
        demand = picture.demand(pod)
        if demand.problem or not (demand.wants_gpu or demand.labelled):
            return ""
        view = picture.fairness()
        gang = gang_of(picture, pod, creating=True)  # not in the picture yet: counted in
        ahead = ahead_of(picture, gang, waiting_ungated(picture).get(demand.queue, {}))
        return gate_reason(
            view, Ask(demand.queue, picture.pod_resources(key, pod), demand.preemptible, gang, ahead)
        )


@dataclass(frozen=True)
class PodVerdict:
    """The pod webhook's answer: a JSON Patch and warnings, or a refusal (then nothing else)."""

    patch: list[dict[str, Any]]
    warnings: list[str]
    outcome: str  # metric label: refused, gated, labelled, unchanged
    refusal: str = ""


def _patched(pod: JsonObject, namespace: str, queue: str | None, scheduler: str | None) -> JsonObject:
    """The pod as it will be stored (namespace, queue label, scheduler), to read its demand."""
    metadata = {**meta(pod), "namespace": namespace}
    if queue is not None:
        metadata["labels"] = {**mapping(metadata.get("labels")), QUEUE_LABEL: queue}
    spec = dict(mapping(pod.get("spec")))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {**pod, "metadata": metadata, "spec": spec}


ADMISSION_KEY = web.AppKey("pod_admission", PodAdmission)
OPTIONS_KEY = web.AppKey("webhook_options", WebhookOptions)
PICTURE_KEY = web.AppKey("webhook_picture", ClusterPicture)


def _answer(answer: JsonObject) -> web.Response:
    return web.Response(text=json.dumps(answer), content_type="application/json")


async def handle_mutate_pod(request: web.Request) -> web.StreamResponse:
    review = await parse_body(request, _review, "mutate_pods")
    req = review.request
    pod = req.object
    if req.operation != "CREATE" or req.kind.kind != "Pod" or pod is None:
        return _answer(review_answer(req.uid))
    verdict = await request.app[ADMISSION_KEY].mutate(pod, req.namespace)
    request.app[METRICS_KEY].decisions.labels("mutate_pods", verdict.outcome, "").inc()
    if verdict.refusal:
        return _answer(review_answer(req.uid, [verdict.refusal]))
    return _answer(review_answer(req.uid, patch=verdict.patch, warnings=verdict.warnings))


async def handle_validate_queue(request: web.Request) -> web.StreamResponse:
    review = await parse_body(request, _review, "validate_queues")
    req = review.request
    if req.operation not in ("CREATE", "UPDATE") or req.object is None:
        return _answer(review_answer(req.uid))
    path = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
    try:  # the stored Queues, not the picture's: one created a moment ago may be this one's parent
        others = sequence((await request.app[ADMISSION_KEY].read(path)).get("items"))
    except (KubeError, OSError, TimeoutError) as exc:
        log.warning("queue admission reads the picture's Queues: %r", exc)
        others = list(request.app[PICTURE_KEY].kind("Queue").values())
    stored = [mapping(q) for q in others]
    problems = queue_problems(req.object, stored)
    request.app[METRICS_KEY].decisions.labels(
        "validate_queues", "refused" if problems else "allowed", ""
    ).inc()
    if problems:
        return _answer(review_answer(req.uid, problems))
    namespaces = {
        key: mapping(meta(obj).get("labels"))
        for key, obj in request.app[PICTURE_KEY].kind("Namespace").items()
    }
    return _answer(review_answer(req.uid, warnings=defaults_shut_out(req.object, stored, namespaces)))


async def handle_validate_claim(request: web.Request) -> web.StreamResponse:
    review = await parse_body(request, _review, "validate_claims")
    req = review.request
    if req.operation not in ("CREATE", "UPDATE") or req.object is None:
        return _answer(review_answer(req.uid))
    obj = {**req.object, "kind": req.kind.kind}
    problems = claim_config_problems(obj, request.app[OPTIONS_KEY].config_drivers)
    request.app[METRICS_KEY].decisions.labels(
        "validate_claims", "refused" if problems else "allowed", ""
    ).inc()
    return _answer(review_answer(req.uid, problems))


async def handle_validate_namespace(request: web.Request) -> web.StreamResponse:
    """A Namespace's default-queue label must name a queue the namespace may use (judged with
    the labels it is being given; a queue not known yet is not judged: its pods will be)."""
    review = await parse_body(request, _review, "validate_namespaces")
    req = review.request
    if req.operation not in ("CREATE", "UPDATE") or req.object is None:
        return _answer(review_answer(req.uid))
    picture = request.app[PICTURE_KEY]
    name = str(meta(req.object).get("name", ""))
    labels = mapping(meta(req.object).get("labels"))
    queue = labels.get(NAMESPACE_QUEUE_LABEL)
    refusal = picture.tenancy_refusal(str(queue), name, labels) if queue and picture.ready() else ""
    problems = [f"label {NAMESPACE_QUEUE_LABEL}={queue}: {refusal}"] if refusal else []
    request.app[METRICS_KEY].decisions.labels(
        "validate_namespaces", "refused" if problems else "allowed", ""
    ).inc()
    return _answer(review_answer(req.uid, problems))


def webhook_app(
    api: ApiClient, picture: ClusterPicture, metrics: ExtenderMetrics, options: WebhookOptions
) -> web.Application:
    """The webhooks' HTTP app (its own port: the API server presents no scheduler certificate)."""
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app[BODY_LIMIT_KEY] = MAX_REVIEW_BYTES
    app[METRICS_KEY] = metrics
    app[IN_FLIGHT_KEY] = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)
    app[PICTURE_KEY] = picture
    app[OPTIONS_KEY] = options
    app[ADMISSION_KEY] = PodAdmission(api, picture, options)
    app.router.add_post(MUTATE_PODS_PATH, timed("mutate_pods", handle_mutate_pod))
    app.router.add_post(VALIDATE_QUEUES_PATH, timed("validate_queues", handle_validate_queue))
    app.router.add_post(VALIDATE_CLAIMS_PATH, timed("validate_claims", handle_validate_claim))
    app.router.add_post(VALIDATE_NAMESPACES_PATH, timed("validate_namespaces", handle_validate_namespace))
    return app
