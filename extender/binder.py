"""The `bind` verb: verify what is asked, post the Binding, then update the cluster picture at once.

Bind holds cluster-wide permission to create `pods/binding`, so it checks every request before
using it (`bind_refusal`): the pod exists with the UID the request names, is pending, not being
deleted, not bound elsewhere, and (when the extender counts only some schedulers) belongs to one
of them; the node exists, is not being deleted, and is not cordoned unless the pod tolerates
that; and, once the filter records what it passed (`FilteredNodes`), the node is one the filter
passed for this very pod. A refusal, a conflict and an apiserver that is slow or unreachable all
come back as ExtenderBindingResult.Error with the reason, within `BIND_DEADLINE_S`, never as an
HTTP error.

kube-scheduler's DRA plugin has written the claims' allocations (PreBind) before it calls bind, so
after a successful Binding the binder reads the pod's claims back and applies them together with
the pod's node: the next filter/prioritize cycle sees the allocation before any watch event does.
Usage is keyed by pod, so binding a pod twice can never count it twice; a second bind to the
same node succeeds, a bind to another node is a conflict reported as an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from contract.kube import pod_claim_refs
from extender.kubeapi import KubeError, request
from extender.picture.cluster import ClusterPicture
from extender.wire import ExtenderBindingArgs

log = logging.getLogger(__name__)

# kube-scheduler gives an extender call 5 s by default (httpTimeout): answer well before, so a
# slow apiserver is reported as a bind error instead of a timeout the scheduler cannot read.
BIND_DEADLINE_S = 4.0
# Each apiserver call of one bind (read the pod, post the Binding, read it back on a conflict).
API_TIMEOUT_S = 2.0
# Claims are read back after a successful Binding only to speed up the picture; never for long.
CLAIM_READ_TIMEOUT_S = 1.0
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TERMINAL_PHASES = ("Succeeded", "Failed")
# The apiserver's own failures and transport errors: reported, never raised to the handler.
API_FAILURES = (KubeError, aiohttp.ClientError, TimeoutError, OSError)


@dataclass
class _Passed:
    # A tuple, not a set: remembered for every pod filtered (thousands of names), read by `in`
    # once per bind; copying pointers costs a fraction of hashing every name into a set.
    nodes: tuple[str, ...]
    expires: float  # monotonic


class FilteredNodes:
    """The nodes the filter passed, per pod UID, for bind to check against.

    Bounded: a record lasts `ttl_s` or until its bind, and past `max_pods` pods or `max_names`
    node names in all the oldest records go. A bind whose record went is refused with a reason,
    and kube-scheduler filters the pod again.
    """

    def __init__(self, ttl_s: float = 120.0, max_pods: int = 2048, max_names: int = 500_000) -> None:
        self.ttl_s = ttl_s
        self.max_pods = max_pods
        self.max_names = max_names
        self._records: OrderedDict[str, _Passed] = OrderedDict()
        self._names = 0

    def remember(self, uid: str, nodes: Collection[str]) -> None:
        """The filter passed `nodes` for the pod with this UID (replaces an earlier record)."""
        self.forget(uid)
        record = _Passed(tuple(nodes), time.monotonic() + self.ttl_s)
        self._records[uid] = record
        self._names += len(record.nodes)
        now = time.monotonic()
        while self._records and (
            len(self._records) > self.max_pods
            or self._names > self.max_names
            or next(iter(self._records.values())).expires < now
        ):
            _, oldest = self._records.popitem(last=False)
            self._names -= len(oldest.nodes)

    def passed(self, uid: str) -> tuple[str, ...] | None:
        """The nodes passed for this pod, or None when there is no live record."""
        record = self._records.get(uid)
        if record is None or record.expires < time.monotonic():
            return None
        return record.nodes

    def forget(self, uid: str) -> None:
        record = self._records.pop(uid, None)
        if record is not None:
            self._names -= len(record.nodes)


def _tolerates_cordon(pod: Mapping[str, Any]) -> bool:
    """Whether the pod tolerates the taint of a cordoned node (as DaemonSet pods do)."""
    for toleration in (pod.get("spec") or {}).get("tolerations") or []:
        if not isinstance(toleration, Mapping):
            continue
        key, operator = toleration.get("key") or "", toleration.get("operator") or "Equal"
        if toleration.get("effect") not in (None, "", "NoSchedule"):
            continue
        if (key == "" and operator == "Exists") or (
            key == UNSCHEDULABLE_TAINT and (operator == "Exists" or not toleration.get("value"))
        ):
            return True
    return False


def bind_refusal(
    args: ExtenderBindingArgs,
    pod: Mapping[str, Any] | None,
    node: Mapping[str, Any] | None,
    *,
    scheduler_names: Collection[str] = (),
    passed: Collection[str] | None = None,
    require_filtered: bool = False,
) -> str:
    """Why this bind must not happen ('' when it may). `pod` and `node` are the current objects
    (None: they do not exist); `passed` the nodes the filter passed for this pod (None: no record)."""
    key = f"{args.PodNamespace}/{args.PodName}"
    if pod is None:
        return f"pod {key} does not exist"
    metadata = pod.get("metadata") or {}
    uid = str(metadata.get("uid") or "")
    if not args.PodUID:
        return f"refusing to bind pod {key}: the request names no pod UID"
    if uid != args.PodUID:
        return f"pod {key} has UID {uid}, not {args.PodUID}: it was replaced"
    if metadata.get("deletionTimestamp"):
        return f"pod {key} is being deleted"
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in TERMINAL_PHASES:
        return f"pod {key} has finished (phase {status.get('phase')})"
    scheduler = str(spec.get("schedulerName") or "default-scheduler")
    if scheduler_names and scheduler not in scheduler_names:
        return f"pod {key} belongs to scheduler {scheduler}, which this extender does not serve"
    if node is None:
        return f"node {args.Node} does not exist"
    if (node.get("metadata") or {}).get("deletionTimestamp"):
        return f"node {args.Node} is being deleted"
    if (node.get("spec") or {}).get("unschedulable") and not _tolerates_cordon(pod):
        return f"node {args.Node} is cordoned (spec.unschedulable) and pod {key} does not tolerate it"
    if require_filtered:
        if passed is None:
            return f"pod {key} (UID {args.PodUID}) was not filtered by this extender recently; retry"
        if args.Node not in passed:
            return f"node {args.Node} is not among the nodes the filter passed for pod {key}"
    return ""


class Binder:
    """`require_filtered`: refuse nodes the filter did not pass for the pod; the filter must then
    call `filtered.remember(uid, passed_nodes)` for every pod it answers."""

    def __init__(self, api: ApiClient, picture: ClusterPicture, *, require_filtered: bool = False) -> None:
        self.api = api
        self.picture = picture
        self.require_filtered = require_filtered
        self.filtered = FilteredNodes()

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error for ExtenderBindingResult.Error."""
        deadline = asyncio.get_running_loop().time() + BIND_DEADLINE_S
        try:
            async with asyncio.timeout_at(deadline):
                error = await self._bind(args)
        except TimeoutError:
            return (
                f"binding pod {args.PodNamespace}/{args.PodName} to node {args.Node}: the apiserver did "
                f"not answer within {BIND_DEADLINE_S:g} s"
            )
        if not error:
            try:
                # Best effort in the time left: the pod is bound whatever happens here.
                async with asyncio.timeout_at(deadline):
                    await self._refresh_claims(args.PodNamespace, args.PodName)
            except TimeoutError:
                log.warning(
                    "reading the claims of %s/%s after bind ran out of time", args.PodNamespace, args.PodName
                )
        return error

    async def _bind(self, args: ExtenderBindingArgs) -> str:
        namespace, name, node = args.PodNamespace, args.PodName, args.Node
        key = f"{namespace}/{name}"
        try:
            pod = await self._current_pod(args)
        except API_FAILURES as exc:
            return f"binding pod {key}: reading the pod failed: {_describe(exc)}"
        bound_to = self.picture.pod_node(key, pod) if pod is not None else ""
        if bound_to and pod is not None and (pod.get("metadata") or {}).get("uid") == args.PodUID:
            # A retried bind to the same node succeeded the first time.
            return "" if bound_to == node else f"pod {key} is already bound to node {bound_to}, not {node}"
        refusal = bind_refusal(
            args,
            pod,
            self.picture.kind("Node").get(node),
            scheduler_names=self.picture.config.scheduler_names,
            passed=self.filtered.passed(args.PodUID),
            require_filtered=self.require_filtered,
        )
        if refusal:
            log.warning("refused to bind %s to %s: %s", key, node, refusal)
            return refusal
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": args.PodUID},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await request(
                self.api,
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                body=binding,
                timeout=API_TIMEOUT_S,
            )
        except KubeError as exc:
            if exc.status == 409:
                return await self._resolve_conflict(namespace, name, node, exc)
            log.warning("binding %s to %s failed: %s", key, node, exc)
            return f"binding pod {key} to node {node} failed: {exc}"
        except API_FAILURES as exc:
            log.warning("binding %s to %s failed: %s", key, node, _describe(exc))
            return f"binding pod {key} to node {node} failed: {_describe(exc)}"
        self.filtered.forget(args.PodUID)
        self.picture.assume_bound(namespace, name, node)
        log.info("bound %s to %s", key, node)
        return ""

    async def _current_pod(self, args: ExtenderBindingArgs) -> Mapping[str, Any] | None:
        """The pod as the picture has it, or from the apiserver when the picture lacks that UID."""
        key = f"{args.PodNamespace}/{args.PodName}"
        known = self.picture.kind("Pod").get(key)
        if known is not None and (known.get("metadata") or {}).get("uid") == args.PodUID:
            return known
        try:
            pod = await request(
                self.api,
                "GET",
                f"/api/v1/namespaces/{args.PodNamespace}/pods/{args.PodName}",
                timeout=API_TIMEOUT_S,
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        self.picture.apply("Pod", "MODIFIED", pod)
        return pod

    async def _resolve_conflict(self, namespace: str, name: str, node: str, conflict: KubeError) -> str:
        """A 409 is success when the pod is already on the requested node (a retried bind)."""
        try:
            pod = await request(
                self.api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}", timeout=API_TIMEOUT_S
            )
        except API_FAILURES as exc:
            return (
                f"binding pod {namespace}/{name} conflicted ({conflict.message}); reading it failed: "
                f"{_describe(exc)}"
            )
        current = (pod.get("spec") or {}).get("nodeName")
        self.picture.apply("Pod", "MODIFIED", pod)
        if current == node:
            return ""
        return f"pod {namespace}/{name} is already bound to node {current}, not {node}: {conflict.message}"

    async def _refresh_claims(self, namespace: str, name: str) -> None:
        pod = self.picture.kind("Pod").get(f"{namespace}/{name}")
        if pod is None:
            return
        claims = self.picture.kind("ResourceClaim")
        for claim_name in (ref.claim for ref in pod_claim_refs(pod) if ref.claim):
            known = claims.get(f"{namespace}/{claim_name}")
            if known is not None and (known.get("status") or {}).get("allocation"):
                continue  # the watch already brought the allocation the scheduler wrote before binding
            try:
                claim = await request(
                    self.api,
                    "GET",
                    f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim_name}",
                    timeout=CLAIM_READ_TIMEOUT_S,
                )
            except API_FAILURES as exc:
                # The watch will bring it; the pod is bound either way.
                log.warning(
                    "reading claim %s/%s after bind failed: %s", namespace, claim_name, _describe(exc)
                )
                continue
            self.picture.apply("ResourceClaim", "MODIFIED", claim)


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"the apiserver did not answer within {API_TIMEOUT_S:g} s"
    return str(error) or type(error).__name__
