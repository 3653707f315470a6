"""Queue tenancy on the real control plane: a pod labelled with a queue its namespace may not use
is refused by the API at creation (the pod webhook) and, where the webhook was bypassed, by the
extender's filter called by the real kube-scheduler; a Namespace may not default to such a queue.

This test's webhooks cover pods of its own namespace only (`webhooked`): a pod created in another
namespace reaches the scheduler as it would with failurePolicy Ignore and the webhook down.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from contract.names import NAMESPACE_QUEUE_LABEL
from extender.kubeapi import JsonObject, request
from extender.status import ADMITTED_CONDITION
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import QUEUES_PATH, TEMPLATE, GpuCluster
from tests.integration.test_admission_webhooks import kubectl, webhooked

pytestmark = pytest.mark.integration


def condition(pod: JsonObject, kind: str) -> JsonObject | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


async def tenant_namespace(env: GpuCluster, name: str) -> None:
    """A namespace with the GPU claim template the test's pods use."""
    await request(env.api, "POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    await request(
        env.api,
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{name}/resourceclaimtemplates",
        body=objects.claim_template(name, TEMPLATE, objects.claim_spec(env.driver)),
    )


async def drop_namespace(env: GpuCluster, name: str) -> None:
    # No kubelet finishes a graceful deletion: force the pods.
    await request(env.api, "DELETE", f"/api/v1/namespaces/{name}/pods", query={"gracePeriodSeconds": "0"})
    await request(env.api, "DELETE", f"/api/v1/namespaces/{name}")


def gpu_pod(env: GpuCluster, namespace: str, name: str, queue: str) -> JsonObject:
    pod = objects.pod(namespace, name, queue=queue, template=TEMPLATE, scheduler=env.scheduler_name)
    del pod["metadata"]["uid"], pod["status"]
    return pod


async def test_a_pod_labelled_with_another_namespace_s_queue_is_refused_at_apply_and_at_filter(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace, gpus=4) as env:
        # team-y belongs to namespace y-<suffix>; x-<suffix> is another tenant, outside the
        # webhooks' reach (as if they were bypassed); this test's namespace is a third.
        own, outsider = f"y-{env.suffix}", f"x-{env.suffix}"
        team = env.queue_name("team-y")
        queue: dict[str, Any] = objects.queue(team, resources={"gpu": {"quota": 2}})
        queue["spec"]["namespaces"] = [own]
        await request(env.api, "POST", QUEUES_PATH, body=queue)
        env.queues.append(team)
        for name in (own, outsider):
            await tenant_namespace(env, name)
        try:
            # At apply: the pod webhook refuses it, naming the queue and the namespace.
            applied = await kubectl(
                local_cluster,
                "apply",
                "-f",
                "-",
                input_text=yaml.safe_dump(gpu_pod(env, namespace, "p", team)),
            )
            assert applied.returncode != 0
            assert "denied the request" in applied.stderr
            at_apply = (
                f"namespace '{namespace}' may not use queue '{team}': it takes only pods of namespace {own}"
            )
            assert at_apply in applied.stderr, applied.stderr

            # At filter: created where no webhook looks, the pod reaches kube-scheduler, whose
            # call to the extender's filter fails every node with the same words.
            await request(
                env.api, "POST", f"/api/v1/namespaces/{outsider}/pods", body=gpu_pod(env, outsider, "p", team)
            )
            at_filter = (
                f"namespace '{outsider}' may not use queue '{team}': it takes only pods of namespace {own}"
            )

            async def refused() -> JsonObject | None:
                pod = await request(env.api, "GET", f"/api/v1/namespaces/{outsider}/pods/p")
                scheduled, admitted = condition(pod, "PodScheduled"), condition(pod, ADMITTED_CONDITION)
                if (
                    scheduled
                    and scheduled["status"] == "False"
                    and admitted
                    and admitted["status"] == "False"
                ):
                    return pod
                return None

            pod = await wait_until(refused, timeout=30, what="the outsider's pod refused by the filter")
            assert not pod["spec"].get("nodeName")
            scheduled, admitted = condition(pod, "PodScheduled"), condition(pod, ADMITTED_CONDITION)
            assert scheduled is not None and admitted is not None
            assert scheduled["reason"] == "Unschedulable" and at_filter in scheduled["message"]
            # The pod's condition says the same words, and what would let it go.
            assert admitted["reason"] == "QueueNotAllowed" and admitted["message"].startswith(
                f"{at_filter}; "
            )

            # team-y's own pod, beside it, is admitted and binds; team-y holds that one GPU, and
            # the outsider's pending pod is none of its demand.
            await request(
                env.api, "POST", f"/api/v1/namespaces/{own}/pods", body=gpu_pod(env, own, "p", team)
            )

            async def own_bound() -> bool:
                pod = await request(env.api, "GET", f"/api/v1/namespaces/{own}/pods/p")
                return bool(pod["spec"].get("nodeName"))

            await wait_until(own_bound, timeout=30, what="team-y's own pod bound")

            async def own_gpu_only() -> bool:
                status = (await env.get_queue(team)).get("status") or {}
                return status.get("allocated", {}).get("gpu") == "1" and "gpu" not in status.get(
                    "requested", {}
                )

            await wait_until(
                own_gpu_only, timeout=30, what=f"{team} holding its own pod's GPU, asked for none"
            )
            assert not (await request(env.api, "GET", f"/api/v1/namespaces/{outsider}/pods/p"))["spec"].get(
                "nodeName"
            )

            # The outsider may not make team-y its namespace's default queue either.
            labelled = await kubectl(
                local_cluster,
                "label",
                "namespace",
                outsider,
                f"{NAMESPACE_QUEUE_LABEL}={team}",
                input_text="",
            )
            assert labelled.returncode != 0
            assert f"label {NAMESPACE_QUEUE_LABEL}={team}: {at_filter}" in labelled.stderr, labelled.stderr
            readback = await request(env.api, "GET", f"/api/v1/namespaces/{outsider}")
            assert NAMESPACE_QUEUE_LABEL not in (readback["metadata"].get("labels") or {})
            labelled = await kubectl(
                local_cluster, "label", "namespace", own, f"{NAMESPACE_QUEUE_LABEL}={team}", input_text=""
            )
            assert labelled.returncode == 0, labelled.stderr
            # Closing team-y to every namespace is the admin's right; kubectl warns whom it shuts out.
            closed = await kubectl(
                local_cluster,
                "patch",
                "queues.scheduling.tessera.dev",
                team,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"namespaces": []}}),
                input_text="",
            )
            assert closed.returncode == 0, closed.stderr
            assert (
                f"Warning: label {NAMESPACE_QUEUE_LABEL}={team} of namespace '{own}': namespace '{own}' "
                f"may not use queue '{team}': it takes pods of no namespace"
            ) in closed.stderr, closed.stderr
        finally:
            for name in (own, outsider):
                await drop_namespace(env, name)
