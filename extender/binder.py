"""The `bind` verb: post the Binding, then update the cluster picture at once.

kube-scheduler's DRA plugin has written the claims' allocations (PreBind) before it calls bind, so
after a successful Binding the binder reads the pod's claims back and applies them together with
the pod's node: the next filter/prioritize cycle sees the allocation before any watch event does.
Usage is keyed by pod, so binding a pod twice can never count it twice; a second bind to the
same node succeeds, a bind to another node is a conflict reported as an error.
"""

from __future__ import annotations

import logging

from kubernetes_asyncio.client import ApiClient

from contract.kube import pod_claim_refs
from extender.kubeapi import KubeError, request
from extender.picture.cluster import ClusterPicture
from extender.wire import ExtenderBindingArgs

log = logging.getLogger(__name__)


class Binder:
    def __init__(self, api: ApiClient, state: ClusterPicture) -> None:
        self.api = api
        self.state = state

    async def bind(self, args: ExtenderBindingArgs) -> str:
        """Bind the pod; returns "" on success, else the error for ExtenderBindingResult.Error."""
        namespace, name, node = args.PodNamespace, args.PodName, args.Node
        key = f"{namespace}/{name}"
        known = self.state.kind("Pod").get(key)
        if known is not None and (args.PodUID and known["metadata"].get("uid") != args.PodUID):
            known = None  # a different pod of the same name: let the API decide
        bound_to = self.state.pod_node(key, known) if known is not None else ""
        if bound_to:
            return "" if bound_to == node else f"pod {key} is already bound to node {bound_to}, not {node}"
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                **({"uid": args.PodUID} if args.PodUID else {}),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await request(
                self.api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=binding
            )
        except KubeError as exc:
            if exc.status == 409:
                return await self._resolve_conflict(namespace, name, node, exc)
            log.warning("binding %s to %s failed: %s", key, node, exc)
            return f"binding pod {key} to node {node} failed: {exc}"
        self.state.assume_bound(namespace, name, node)
        await self._refresh_claims(namespace, name)
        log.info("bound %s to %s", key, node)
        return ""

    async def _resolve_conflict(self, namespace: str, name: str, node: str, conflict: KubeError) -> str:
        """A 409 is success when the pod is already on the requested node (a retried bind)."""
        try:
            pod = await request(self.api, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeError as exc:
            return f"binding pod {namespace}/{name} conflicted ({conflict.message}); reading it failed: {exc}"
        current = (pod.get("spec") or {}).get("nodeName")
        self.state.apply("Pod", "MODIFIED", pod)
        if current == node:
            return ""
        return f"pod {namespace}/{name} is already bound to node {current}, not {node}: {conflict.message}"

    async def _refresh_claims(self, namespace: str, name: str) -> None:
        pod = self.state.kind("Pod").get(f"{namespace}/{name}")
        if pod is None:
            return
        claims = self.state.kind("ResourceClaim")
        for claim_name in (ref.claim for ref in pod_claim_refs(pod) if ref.claim):
            known = claims.get(f"{namespace}/{claim_name}")
            if known is not None and (known.get("status") or {}).get("allocation"):
                continue  # the watch already brought the allocation the scheduler wrote before binding
            try:
                claim = await request(
                    self.api,
                    "GET",
                    f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim_name}",
                )
            except KubeError as exc:
                # The watch will bring it; the pod is bound either way.
                log.warning("reading claim %s/%s after bind failed: %s", namespace, claim_name, exc)
                continue
            self.state.apply("ResourceClaim", "MODIFIED", claim)
