"""The admission webhooks on the real control plane: the API server calls the extender over TLS.

The webhooks of each test cover only its namespace and its Queues (names ending in its suffix),
so the other tests on the shared control plane never reach them.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from contract.names import ADMISSION_GATE, NAMESPACE_QUEUE_LABEL, NAMESPACE_SCHEDULER_LABEL, QUEUE_LABEL
from extender.kubeapi import JsonObject, request
from extender.webhook import MUTATE_PODS_PATH, WebhookOptions
from extender.webhook_process import WebhookTLS
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import QUEUES_PATH, TEMPLATE, GpuCluster, gpu_cluster

pytestmark = pytest.mark.integration


@asynccontextmanager
async def webhooked(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, gpus: int = 4
) -> AsyncIterator[GpuCluster]:
    """A GPU cluster whose in-process extender also serves the webhooks, registered for this test."""
    async with gpu_cluster(
        local_cluster, k8s, namespace, nodes=1, gpus_per_node=gpus, in_process=False
    ) as env:
        cert = local_cluster.webhook_certificate(f"extender-{env.suffix}")
        await env.start_extender(
            webhooks=WebhookOptions(
                host="127.0.0.1",
                port=0,
                scheduler_name=env.scheduler_name,
                config_drivers=frozenset({env.driver}),
                gate_interval_s=0.25,
            ),
            webhook_tls=WebhookTLS(str(cert.cert_path), str(cert.key_path)),
        )
        await env.start_scheduler(env.url)
        assert env.service is not None
        name = f"tessera-{env.suffix}"
        configurations = local_cluster.register_webhooks(
            f"https://127.0.0.1:{env.service.webhook_port}",
            name,
            namespaces=[namespace],
            queue_suffix=env.suffix,
        )
        try:
            yield env
        finally:
            for configuration in configurations:
                local_cluster.kubectl("delete", configuration["kind"], name, "--ignore-not-found")


async def kubectl(cluster: LocalCluster, *args: str, input_text: str) -> subprocess.CompletedProcess[str]:
    """kubectl off the event loop: the extender answering its admission runs on this loop."""
    return await asyncio.to_thread(cluster.kubectl, *args, check=False, input_text=input_text)


async def create_pod(env: GpuCluster, pod: JsonObject) -> JsonObject:
    return await request(env.api, "POST", f"/api/v1/namespaces/{env.namespace}/pods", body=pod)


async def get_pod(env: GpuCluster, name: str) -> JsonObject:
    return await request(env.api, "GET", f"/api/v1/namespaces/{env.namespace}/pods/{name}")


def scheduled_condition(pod: JsonObject) -> JsonObject | None:
    return next(
        (c for c in pod.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"), None
    )


async def test_a_pod_of_a_queue_at_its_limit_waits_gated_until_the_queue_has_room(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        # 4 free GPUs, but the queue may hold 1: the second pod waits for quota, not capacity.
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 1}})
        (first,) = await env.submit(queue, 1, "first")

        async def bound(name: str) -> bool:
            return bool((await get_pod(env, name))["spec"].get("nodeName"))

        await wait_until(lambda: bound(first), timeout=30, what="the first pod bound")
        second = await create_pod(env, env.pod(queue, "second"))
        assert second["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]

        # kube-scheduler reports the gate, not Unschedulable: autoscalers see nothing to add.
        async def gated_condition() -> JsonObject | None:
            condition = scheduled_condition(await get_pod(env, "second"))
            return condition if condition and condition["reason"] == "SchedulingGated" else None

        condition = await wait_until(gated_condition, timeout=30, what="the SchedulingGated condition")
        assert condition["status"] == "False"
        pod = await get_pod(env, "second")
        assert not pod["spec"].get("nodeName")
        assert all(c.get("reason") != "Unschedulable" for c in pod["status"].get("conditions") or [])

        # Room again: the gate controller lifts the gate and the pod binds.
        await env.delete_pods([first])
        await wait_until(lambda: bound("second"), timeout=30, what="the second pod bound once ungated")
        assert not (await get_pod(env, "second"))["spec"].get("schedulingGates")


async def test_a_gang_waits_gated_until_its_queue_takes_it_whole_then_all_its_pods_bind(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        # 4 free GPUs, an indexed Job of 4 one-GPU workers (a gang of 4), a queue limit of 2:
        # incomplete, then 4 x 1 = 4 > 2, so every worker waits gated, none Unschedulable.
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 2}})
        await env.create_job(queue, "train", 4)

        def gated(pod: JsonObject) -> bool:
            return {"name": ADMISSION_GATE} in (pod["spec"].get("schedulingGates") or [])

        async def all_gated() -> list[JsonObject] | None:
            pods = await env.pods()
            reported = [p for p in pods if (scheduled_condition(p) or {}).get("reason") == "SchedulingGated"]
            return pods if len(pods) == 4 and all(gated(p) for p in pods) and len(reported) == 4 else None

        pods = await wait_until(all_gated, timeout=60, interval=0.2, what="4 gated workers")
        assert not any(p["spec"].get("nodeName") for p in pods)
        assert not any(
            c.get("reason") == "Unschedulable" for p in pods for c in p["status"].get("conditions") or []
        )

        # Room for the whole gang: the gate controller lifts all four gates and all four bind.
        await env.patch_queue(queue, {"resources": {"gpu": {"quota": 1, "limit": 4}}})

        async def all_bound() -> bool:
            pods = await env.pods()
            return len(pods) == 4 and all(p["spec"].get("nodeName") and not gated(p) for p in pods)

        await wait_until(all_bound, timeout=60, interval=0.2, what="4 workers ungated and bound")


async def test_pods_get_their_queue_from_their_top_owner_or_the_namespace_default(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        team = await env.create_queue("team", resources={"gpu": {"quota": 2}})
        batch = await env.create_queue("batch", resources={"gpu": {"quota": 2}})
        # The namespace names its default queue and opts in to Tessera's scheduler profile.
        await request(
            env.api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}",
            body={"metadata": {"labels": {NAMESPACE_QUEUE_LABEL: team, NAMESPACE_SCHEDULER_LABEL: "true"}}},
            content_type="application/merge-patch+json",
        )
        assert env.service is not None
        picture = env.service.picture

        async def picture_has_labels() -> bool:
            stored = picture.get("Namespace", namespace) or {}
            return bool(stored.get("metadata", {}).get("labels", {}).get(NAMESPACE_QUEUE_LABEL) == team)

        await wait_until(picture_has_labels, timeout=10, what="the picture seeing the Namespace's labels")
        # A pod that names neither queue nor scheduler.
        bare = objects.pod(namespace, "bare", template=TEMPLATE)
        del bare["metadata"]["uid"], bare["status"]
        created = await create_pod(env, bare)
        assert created["metadata"]["labels"][QUEUE_LABEL] == team
        assert created["spec"]["schedulerName"] == env.scheduler_name

        # A Job labelled with its queue; its pod template names none: the pods inherit the Job's.
        template = env.pod(batch, "job")
        template["metadata"]["labels"].pop(QUEUE_LABEL)
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "train", "namespace": namespace, "labels": {QUEUE_LABEL: batch}},
            "spec": {
                "completions": 1,
                "template": {
                    "metadata": {"labels": template["metadata"]["labels"]},
                    "spec": {**template["spec"], "restartPolicy": "Never"},
                },
            },
        }
        await request(env.api, "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", body=job)

        async def job_pod_queue() -> str | None:
            pods = [p for p in await env.pods() if p["metadata"]["name"].startswith("train-")]
            return pods[0]["metadata"]["labels"].get(QUEUE_LABEL) if pods else None

        assert await wait_until(job_pod_queue, timeout=30, what="the Job's pod") == batch

        # Two owners up: the Deployment's label reaches the pod through its ReplicaSet (which
        # carries only the template's labels).
        serving = objects.pod(namespace, "serving", scheduler=env.scheduler_name)
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serving", "namespace": namespace, "labels": {QUEUE_LABEL: batch}},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "serving"}},
                "template": {"metadata": {"labels": {"app": "serving"}}, "spec": serving["spec"]},
            },
        }
        deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        await request(env.api, "POST", deployments, body=deployment)

        async def serving_pod_queue() -> str | None:
            pods = [p for p in await env.pods() if p["metadata"]["name"].startswith("serving-")]
            return pods[0]["metadata"]["labels"].get(QUEUE_LABEL) if pods else None

        try:
            assert await wait_until(serving_pod_queue, timeout=30, what="the Deployment's pod") == batch
        finally:
            await request(
                env.api, "DELETE", f"{deployments}/serving", body={"propagationPolicy": "Background"}
            )

        # The Queue status counts each where it belongs (1 GPU each, once bound).
        async def allocated(queue: str) -> bool:
            status = (await env.get_queue(queue)).get("status") or {}
            return bool(status.get("allocated", {}).get("gpu") == "1")

        await wait_until(lambda: allocated(team), timeout=30, what=f"{team} counting the bare pod")
        await wait_until(lambda: allocated(batch), timeout=30, what=f"{batch} counting the Job's pod")
        await request(env.api, "DELETE", f"/apis/batch/v1/namespaces/{namespace}/jobs/train")


async def test_a_pod_the_webhook_missed_is_counted_in_its_namespace_default_queue(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    """The webhooks of this test cover only `namespace`: a pod elsewhere gets no label, and the
    picture applies its Namespace's default queue itself."""
    async with webhooked(local_cluster, k8s, namespace) as env:
        team = await env.create_queue("team", resources={"cpu": {"quota": 1}})
        elsewhere = f"{namespace}-x"
        labels = {NAMESPACE_QUEUE_LABEL: team}
        await request(
            env.api, "POST", "/api/v1/namespaces", body={"metadata": {"name": elsewhere, "labels": labels}}
        )
        try:
            pod = objects.pod(elsewhere, "missed", cpu="250m", scheduler=env.scheduler_name)
            del pod["metadata"]["uid"], pod["status"]
            created = await request(env.api, "POST", f"/api/v1/namespaces/{elsewhere}/pods", body=pod)
            assert QUEUE_LABEL not in created["metadata"].get("labels", {})

            async def counted() -> bool:
                status = (await env.get_queue(team)).get("status") or {}
                return bool(status.get("allocated", {}).get("cpu") == "250m")

            await wait_until(counted, timeout=30, what=f"{team} counting the unlabelled pod's cpu")
        finally:  # no kubelet finishes a graceful deletion: force it
            pods = f"/api/v1/namespaces/{elsewhere}/pods"
            await request(env.api, "DELETE", pods, query={"gracePeriodSeconds": "0"})
            await request(env.api, "DELETE", f"/api/v1/namespaces/{elsewhere}")


BAD_CONFIG = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Magic"}}


async def test_a_bad_gpu_config_is_refused_by_kubectl_apply_naming_the_field(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        spec = objects.claim_spec(env.driver)
        spec["devices"]["config"] = [{"opaque": {"driver": env.driver, "parameters": BAD_CONFIG}}]
        template = objects.claim_template(namespace, "bad", spec)
        claim = objects.claim(namespace, "bad", spec)
        for obj, field in ((template, "spec.spec.devices.config[0]"), (claim, "spec.devices.config[0]")):
            result = await kubectl(local_cluster, "apply", "-f", "-", input_text=yaml.safe_dump(obj))
            assert result.returncode != 0
            assert "denied the request" in result.stderr
            assert f"{field}.opaque.parameters: sharing.strategy" in result.stderr, result.stderr
        # The same config with a valid strategy is applied.
        spec["devices"]["config"][0]["opaque"]["parameters"] = {**BAD_CONFIG, "sharing": {"strategy": "MPS"}}
        result = await kubectl(
            local_cluster,
            "apply",
            "-f",
            "-",
            input_text=json.dumps(objects.claim_template(namespace, "good", spec)),
        )
        assert result.returncode == 0, result.stderr


async def test_invalid_queues_are_refused_by_the_api_and_a_malformed_review_costs_only_itself(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        parent, child = env.queue_name("org"), env.queue_name("team")
        env.queues += [parent, child]
        # Parent and child in one apply, parent first: the child's parent is found at the API.
        both = [
            objects.queue(parent, resources={"gpu": {"quota": 4}}),
            objects.queue(child, parent=parent, resources={"gpu": {"quota": 2}}),
        ]
        applied = await kubectl(local_cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(both))
        assert applied.returncode == 0, applied.stderr

        async def refused(obj: dict[str, Any]) -> str:
            result = await kubectl(local_cluster, "apply", "-f", "-", input_text=yaml.safe_dump(obj))
            assert result.returncode != 0, f"{obj['metadata']['name']} was admitted"
            return result.stderr

        stray = env.queue_name("stray")
        assert f"parent queue 'nowhere' of '{stray}' does not exist" in await refused(
            objects.queue(stray, parent="nowhere")
        )
        # org -> team -> org.
        assert "parents form a cycle" in await refused(objects.queue(parent, parent=child))
        assert "limit must not be below quota" in await refused(
            objects.queue(stray, resources={"gpu": {"quota": 2, "limit": 1}})
        )
        # team's quota 6 above org's 4 is caused by this write: refused with org named.
        assert f"queue '{parent}' (because of this change)" in await refused(
            objects.queue(child, parent=parent, resources={"gpu": {"quota": 6}})
        )
        listing = await request(env.api, "GET", QUEUES_PATH)
        assert stray not in {q["metadata"]["name"] for q in listing["items"]}

        # Garbage to the webhook port: a 400 with the reason, and the next review is answered.
        assert env.service is not None
        assert local_cluster.ca is not None
        context = ssl.create_default_context(cafile=str(local_cluster.ca.cert_path))
        async with aiohttp.ClientSession() as session:
            url = f"https://127.0.0.1:{env.service.webhook_port}{MUTATE_PODS_PATH}"
            async with session.post(
                url, data=b'{"apiVersion": "admission.k8s.io/v1"', ssl=context
            ) as response:
                assert response.status == 400
                assert "malformed mutate_pods request" in await response.text()
            review = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "u", "kind": {"version": "v1", "kind": "Pod"}, "operation": "DELETE"},
            }
            async with session.post(url, data=json.dumps(review), ssl=context) as response:
                assert response.status == 200 and (await response.json())["response"]["allowed"] is True
