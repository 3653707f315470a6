"""Why a pod waits, where users look, on the real control plane: a Job's pods gated at their
queue's limit carry the `QueueAdmitted` condition and an event saying the queue, the numbers and
what would let them go, read as `kubectl describe pod` reads them (the pod's status.conditions,
the events whose involvedObject is the pod); the Job gets one event summing its pods up. Before,
a gated pod had no condition and no event: the reason was an apply-time warning, which a Job's
pods never show. A pod of the default queue, whose fair share is 0 while the quotas cover the
cluster, says that no reclaim will come, where before it said only what kube-scheduler said.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject, request
from extender.status import ADMITTED_CONDITION, OWNER_EVENT
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import TEMPLATE, GpuCluster, gpu_cluster
from tests.integration.test_admission_webhooks import webhooked

pytestmark = pytest.mark.integration

LETS_IT_GO = "waits for the queue's running pods to finish, or for its limit to be raised"


def admitted_condition(pod: JsonObject) -> JsonObject:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == ADMITTED_CONDITION), {})


async def events_about(env: GpuCluster, kind: str, name: str) -> list[JsonObject]:
    """The events `kubectl describe` lists for the object: by involvedObject."""
    listing = await request(
        env.api,
        "GET",
        f"/api/v1/namespaces/{env.namespace}/events",
        query={"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
    )
    return list(listing.get("items") or [])


async def test_a_jobs_pods_gated_at_the_queue_limit_say_why_on_the_pod_and_the_job(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with webhooked(local_cluster, k8s, namespace) as env:
        # 4 free GPUs, queue limit 1: a Job of 2 one-GPU workers (a gang of 2) asks 0 + 2 > 1.
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 1}})
        await env.create_job(queue, "train", 2)

        async def both_say_the_limit() -> list[JsonObject] | None:
            pods = await env.pods()
            said = [p for p in pods if admitted_condition(p).get("reason") == "QueueAtLimit"]
            return said if len(pods) == 2 and len(said) == 2 else None

        pods = await wait_until(both_say_the_limit, timeout=60, interval=0.2, what="2 pods at the limit")
        for pod in pods:
            condition = admitted_condition(pod)
            assert condition["status"] == "False"
            message = condition["message"]
            assert f"queue '{queue}': gpu allocated 0 + request 2 would exceed its limit (1)" in message, (
                message
            )
            assert message.endswith(LETS_IT_GO), message
            assert pod["spec"]["schedulingGates"]  # held by the gate, not Unschedulable

        # The pod's events, as describe lists them: one QueueAtLimit event with the same words.
        name = pods[0]["metadata"]["name"]

        async def pod_event() -> list[JsonObject] | None:
            found = [e for e in await events_about(env, "Pod", name) if e["reason"] == "QueueAtLimit"]
            return found or None

        (event,) = await wait_until(pod_event, timeout=30, interval=0.2, what="the pod's event")
        assert event["message"] == admitted_condition(pods[0])["message"]
        assert event["source"]["component"] == "tessera-extender"

        # The Job: one summary of its pods.
        async def job_event() -> list[JsonObject] | None:
            found = [e for e in await events_about(env, "Job", "train") if e["reason"] == OWNER_EVENT]
            return found or None

        summaries = await wait_until(job_event, timeout=30, interval=0.2, what="the Job's summary event")
        texts = [e["message"] for e in summaries]
        assert any(t.startswith("2 of 2 pods wait: ") and "limit (1)" in t for t in texts), texts
        # Written once per reason: the gate controller's passes since (every 0.25 s) added none.
        assert len([e for e in await events_about(env, "Pod", name) if e["reason"] == "QueueAtLimit"]) == 1

        # kubectl describe prints the event with its reason and message.
        described = await asyncio.to_thread(local_cluster.kubectl, "describe", "pod", name, "-n", namespace)
        assert "QueueAtLimit" in described.stdout and "would exceed its limit (1)" in described.stdout

        # Room for the gang: its gates are lifted and the condition turns True.
        await env.patch_queue(queue, {"resources": {"gpu": {"quota": 1, "limit": 2}}})

        async def admitted() -> bool:
            return all(admitted_condition(p).get("status") == "True" for p in await env.pods())

        await wait_until(admitted, timeout=60, interval=0.2, what="both pods' conditions True")


async def test_a_default_queue_pod_says_its_fair_share_is_zero_and_no_reclaim_comes(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4) as env:
        # team: quota 4 of the 4 GPUs, holding all 4: the default queue's fair share is 0.
        team = await env.create_queue("team", resources={"gpu": {"quota": 4}})
        await env.submit(team, 4, "t")

        async def all_bound() -> bool:
            return (await env.bound_by_queue()).get(team) == 4

        await wait_until(all_bound, timeout=60, interval=0.2, what="team's 4 pods bound")
        # No queue named anywhere: the default queue. No device is free, so kube-scheduler's DRA
        # filter refuses every node before asking the extender.
        pod = objects.pod(namespace, "idle-only", template=TEMPLATE, scheduler=env.scheduler_name)
        del pod["metadata"]["uid"], pod["status"]
        await request(env.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)

        async def explained() -> JsonObject | None:
            got = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/pods/idle-only")
            condition = admitted_condition(got)
            return condition if condition.get("reason") == "FairShareZero" else None

        condition = await wait_until(explained, timeout=60, interval=0.2, what="the FairShareZero condition")
        assert condition["status"] == "True"  # its queue admits it; no GPU is idle for it
        assert condition["message"] == (
            "queue 'default' has fair share 0 GPUs (quotas of the queues that ask cover the cluster); "
            "runs only on idle GPUs and is reclaimed first; no reclaim frees GPUs for it"
        )

        async def its_event() -> list[JsonObject] | None:  # written just after the condition
            found = [e for e in await events_about(env, "Pod", "idle-only") if e["reason"] == "FairShareZero"]
            return found or None

        events = await wait_until(its_event, timeout=30, interval=0.2, what="the FairShareZero event")
        assert [e["message"] for e in events] == [condition["message"]]
