"""Gangs on the real control plane: indexed Jobs (the job controller makes their pods), the node
agent runs what binds, and the extender admits each Job's minimum whole or not at all.

A Job "finishes" here by its pods being marked Succeeded through the status subresource (the node
agent plays a kubelet whose containers never exit); the job controller then completes the Job and
the resourceclaim controller frees the pods' claims, as on a real cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import datetime

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import NAMESPACE_QUEUE_LABEL, QUEUE_LABEL
from extender.controllers.outside import BYPASS_CONDITION
from extender.kubeapi import JsonObject, request
from extender.picture.cluster import scheduler_gave_up
from extender.status import ADMITTED_CONDITION
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.extender_objects import open_crd
from tests.integration.extender_harness import TEMPLATE, GpuCluster, gpu_cluster
from tests.unit.extender.pictures import owner_read

pytestmark = pytest.mark.integration

JOB_LABEL = "batch.kubernetes.io/job-name"


def live(pod: JsonObject) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


async def bound_by_job(env: GpuCluster) -> Counter[str]:
    """Pods bound and not finished, per Job."""
    return Counter(
        (p["metadata"].get("labels") or {}).get(JOB_LABEL, "")
        for p in await env.pods()
        if p["spec"].get("nodeName") and live(p)
    )


async def running_by_job(env: GpuCluster) -> Counter[str]:
    return Counter(
        p["metadata"]["labels"].get(JOB_LABEL, "")
        for p in await env.pods()
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


async def finish(env: GpuCluster, job: str) -> None:
    """The Job's running pods exit 0."""
    for pod in await env.pods():
        if pod["metadata"]["labels"].get(JOB_LABEL) == job and live(pod):
            name = pod["metadata"]["name"]
            status = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                    }
                ],
            }
            await request(
                env.api,
                "PATCH",
                f"/api/v1/namespaces/{env.namespace}/pods/{name}/status",
                body={"status": status},
                content_type="application/merge-patch+json",
            )


def condition(pod: JsonObject) -> JsonObject:
    return next(
        (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ADMITTED_CONDITION),
        {},
    )


async def test_two_eight_worker_jobs_on_eight_gpus_run_one_after_the_other(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, agent=True) as env:
        # Two queues with quota 4 each, one 8-worker job each: per-pod admission gave 4 + 4.
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 4}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 4}})
        await env.create_job(team_a, "ja", 8)
        await env.create_job(team_b, "jb", 8)
        seen: list[Counter[str]] = []

        async def one_job_runs() -> str | None:
            bound = await bound_by_job(env)
            seen.append(bound)
            running = await running_by_job(env)
            return next((job for job, count in running.items() if count == 8), None)

        first = await wait_until(one_job_runs, timeout=90, interval=0.2, what="one job with 8 running pods")
        second = "jb" if first == "ja" else "ja"
        # Never both at once: while the first was placed, no pod of the second was bound.
        assert all(counts[second] == 0 for counts in seen), seen
        waiting = [p for p in await env.pods() if p["metadata"]["labels"][JOB_LABEL] == second]
        assert len(waiting) == 8 and not any(p["spec"].get("nodeName") for p in waiting)

        async def refused_whole() -> str | None:
            # (A pod filtered while its Job was still creating pods says it waits for its pods.)
            messages = [
                condition(p).get("message", "")
                for p in await env.pods()
                if p["metadata"]["labels"][JOB_LABEL] == second
            ]
            return next((m for m in messages if "starts whole or not at all" in m), None)

        reason = await wait_until(refused_whole, timeout=30, interval=0.2, what=f"{second} refused whole")
        assert f"workload Job/{namespace}/{second} (minimum 8 pods, 0 placed, 8 present)" in reason, reason
        assert "GPUs free for 0 of its 8 missing pods" in reason, reason

        # The Queue status counts the admitted and the waiting workload.
        queue_of = {"ja": team_a, "jb": team_b}

        async def counted() -> bool:
            first_status = (await env.get_queue(queue_of[first])).get("status") or {}
            second_status = (await env.get_queue(queue_of[second])).get("status") or {}
            return (first_status.get("admittedWorkloads"), second_status.get("waitingWorkloads")) == (1, 1)

        await wait_until(counted, timeout=15, what="admittedWorkloads/waitingWorkloads in the Queue status")

        # The first job finishes; the second gets all 8 GPUs (no deadlock, no split).
        seen.clear()
        await finish(env, first)

        async def second_runs() -> bool:
            bound = await bound_by_job(env)
            seen.append(bound)
            return (await running_by_job(env))[second] == 8

        await wait_until(second_runs, timeout=90, interval=0.2, what=f"job {second} with 8 running pods")
        assert all(counts[first] in (0, 8) for counts in seen), seen
        admitted = [
            e
            for e in (await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events"))["items"]
            if e["reason"] == "WorkloadAdmitted"
        ]
        assert {e["message"].split(" ")[1] for e in admitted} == {
            f"Job/{namespace}/ja",
            f"Job/{namespace}/jb",
        }, [e["message"] for e in admitted]


async def test_an_eight_pod_job_is_admitted_whole_or_not_at_all(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, agent=True) as env:
        # Limit 6: six pods would fit the limit and the GPUs, but the job needs 8.
        team = await env.create_queue("t", resources={"gpu": {"limit": 6}})
        await env.create_job(team, "big", 8)

        async def all_refused() -> list[JsonObject] | None:
            pods = await env.pods()
            refused = [p for p in pods if condition(p).get("status") == "False"]
            return pods if len(pods) == 8 and len(refused) == 8 else None

        pods = await wait_until(all_refused, timeout=60, interval=0.2, what="8 pods refused")
        assert not any(p["spec"].get("nodeName") for p in pods)

        async def by_the_limit() -> str | None:
            # (A pod filtered while the Job was still creating pods says it waits for its pods.)
            messages = [condition(p).get("message", "") for p in await env.pods()]
            return next((m for m in messages if "its 8 missing pods together" in m), None)

        message = await wait_until(by_the_limit, timeout=30, interval=0.2, what="the refusal by the limit")
        assert "gpu allocated 0 + request 8 would exceed its limit (6)" in message, message
        assert not any(p["spec"].get("nodeName") for p in await env.pods())

        # Room for the whole job: all 8 run.
        await env.patch_queue(team, {"resources": {"gpu": {"limit": 8}}})

        async def all_run() -> bool:
            return (await running_by_job(env))["big"] == 8

        await wait_until(all_run, timeout=90, interval=0.2, what="8 running pods")
        assert (await env.bound_by_queue()) == {team: 8}


async def test_a_workload_of_min_two_of_four_starts_with_two_and_grows(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        team = await env.create_queue("t")
        # Two GPUs are taken by another workload of the same queue.
        await env.create_replicaset(team, "other", 2)

        async def other_runs() -> bool:
            pods = await env.pods()
            return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running") == 2

        await wait_until(other_runs, timeout=60, interval=0.2, what="2 pods of the ReplicaSet running")
        await env.create_job(team, "elastic", 4, min_members=2)

        async def two_run() -> bool:
            return (await running_by_job(env))["elastic"] == 2

        await wait_until(two_run, timeout=60, interval=0.2, what="the minimum of 2 running")
        # The ReplicaSet goes: the 2 elastic members take its GPUs.
        await request(
            env.api,
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/replicasets/other",
            body={"spec": {"replicas": 0}},
            content_type="application/merge-patch+json",
        )

        async def four_run() -> bool:
            return (await running_by_job(env))["elastic"] == 4

        await wait_until(four_run, timeout=90, interval=0.2, what="all 4 running")
        queue = [p["metadata"]["labels"][QUEUE_LABEL] for p in await env.pods() if live(p)]
        assert Counter(queue) == {team: 4}


async def test_a_waiting_gang_reclaims_borrowed_gpus_whole(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, agent=True) as env:
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 4}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 4}})
        # B is idle: A's lone pods (a ReplicaSet) borrow all 8 GPUs.
        await env.create_replicaset(team_a, "a", 8)

        async def a_runs() -> bool:
            pods = await env.pods()
            return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running") == 8

        await wait_until(a_runs, timeout=90, interval=0.2, what="A's 8 pods running")
        # B's 4-worker job: its fair share is 4, so reclaim serves the 4 workers together.
        await env.create_job(team_b, "jb", 4)

        async def b_runs() -> bool:
            return (await running_by_job(env))["jb"] == 4

        await wait_until(b_runs, timeout=90, interval=0.2, what="B's job with 4 running pods")
        listing = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events")
        reclaimed = [e for e in listing["items"] if e["reason"] == "Reclaimed"]
        assert len(reclaimed) == 4, [e["message"] for e in reclaimed]
        assert Counter(
            p["metadata"]["labels"][QUEUE_LABEL]
            for p in await env.pods()
            if p["spec"].get("nodeName") and live(p)
        ) == {team_a: 4, team_b: 4}


async def test_a_gang_reclaims_gpus_freed_on_two_nodes_and_keeps_them_from_the_replacements(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    """The shape the test above took when it failed (1 run in 4 under load, where A's pods start
    seconds apart): the pods that lose the least work (the youngest) are 2 on each node, so the 4
    plans free 2 GPUs on each. A's ReplicaSet replaces each victim at once; the GPUs are held for
    B's members before the first eviction, so no replacement takes one (held only after the
    cycle's evictions and events, they came too late whenever those API calls were slow, split or
    not), and the gang is admitted whole across both nodes."""
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, agent=True) as env:
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 4}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 4}})
        await env.create_replicaset(team_a, "a", 8)

        async def a_runs() -> list[JsonObject] | None:
            pods = [
                p
                for p in await env.pods()
                if (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
            ]
            return pods if len(pods) == 8 else None

        first = await wait_until(a_runs, timeout=90, interval=0.2, what="A's 8 pods running")
        # Two of A's pods on each node are made the youngest: deleted, their replacements start
        # in a later second than any first pod (start times have whole seconds).
        latest = max(_epoch(p["status"]["startTime"]) for p in first)
        await asyncio.sleep(max(0.0, latest + 1.0 - time.time()))
        by_node: dict[str, list[str]] = {}
        for pod in first:
            by_node.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
        await env.delete_pods([name for names in by_node.values() for name in sorted(names)[:2]])

        async def replaced() -> bool:
            again = await a_runs()
            return again is not None and sum(_epoch(p["status"]["startTime"]) > latest for p in again) == 4

        await wait_until(replaced, timeout=90, interval=0.2, what="A's 4 replacements running")
        await env.create_job(team_b, "jb", 4)

        async def b_runs() -> bool:
            return (await running_by_job(env))["jb"] == 4

        await wait_until(b_runs, timeout=90, interval=0.2, what="B's job with 4 running pods")
        listing = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events")
        planned = [e["message"] for e in listing["items"] if e["reason"] == "ReclaimPlanned"]
        assert {m.split(" on node ")[1].split(" ")[0] for m in planned} == set(env.nodes), planned
        assert Counter(
            (p["metadata"]["labels"][QUEUE_LABEL], p["spec"]["nodeName"])
            for p in await env.pods()
            if p["spec"].get("nodeName") and live(p)
        ) == {(team, node): 2 for team in (team_a, team_b) for node in env.nodes}


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


PYTORCHJOB_CRD = open_crd("kubeflow.org", "PyTorchJob", "pytorchjobs")


async def test_a_pytorchjobs_minimum_comes_from_its_spec(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    # Only the CRD, no operator: the test makes the pods the operator would. The PyTorchJob says
    # 1 master + 3 workers; with 2 of its pods created, the gang is still incomplete (minimum 4
    # from the spec, which the extender reads, not the 2 pods present): none binds.
    await asyncio.to_thread(local_cluster.apply, PYTORCHJOB_CRD)
    await asyncio.to_thread(local_cluster.wait_established, "crd/pytorchjobs.kubeflow.org")
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        team = await env.create_queue("t")
        job = await request(
            env.api,
            "POST",
            f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs",
            body={
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "pt"},
                "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}},
            },
        )
        owner = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "pt",
            "uid": job["metadata"]["uid"],
            "controller": True,
        }

        async def create(names: list[str]) -> None:
            for name in names:
                pod = env.pod(team, name)
                pod["metadata"]["ownerReferences"] = [owner]
                await request(env.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)

        await create(["pt-master-0", "pt-worker-0"])
        assert env.service is not None
        picture = env.service.picture

        async def read_and_refused() -> bool:
            pods = await env.pods()
            refused = [p for p in pods if condition(p).get("status") == "False"]
            return owner_read(picture, "PyTorchJob", f"{namespace}/pt") and len(refused) == 2

        await wait_until(read_and_refused, timeout=60, interval=0.2, what="the spec read, both pods refused")
        assert not any(p["spec"].get("nodeName") for p in await env.pods())
        pod = (await env.pods())[0]
        gang = env.service.picture.gang(pod)
        assert (gang.minimum, gang.members, gang.admitted) == (4, 2, False)

        await create(["pt-worker-1", "pt-worker-2"])

        async def all_run() -> bool:
            pods = await env.pods()
            return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running") == 4

        await wait_until(all_run, timeout=90, interval=0.2, what="the 4 pods of the PyTorchJob running")
    await asyncio.to_thread(local_cluster.kubectl, "delete", "crd/pytorchjobs.kubeflow.org", "--wait=false")


async def test_a_default_scheduler_pod_taking_a_gpu_mid_admission_leaves_the_gang_judged_truly(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    """The live 3 Running + 1 Pending (issue 25): a gang of 4 on 4 GPUs is admitted whole, 3 of its
    members bind, and a default-scheduler pod (which sees no holds) takes the GPU held for the 4th.
    The gang can no longer complete: its reservation ends at once (not after its 60 s hold), the
    picture counts it as it is (3 placed) and lists its 4th member for reclaim; the outside pod is
    charged to its namespace's default queue and marked as bypassing queue ordering, once.

    The members are created with a scheduling gate of the test's, lifted one by one, so that the
    moment between binds is the test's to choose (no pod of Tessera's in its binding cycle: two DRA
    allocators racing for one device is kube-scheduler's business, not the picture's)."""
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        picture = env.service.picture
        team = await env.create_queue("t")
        workload = f"Job/{namespace}/gang"
        await env.create_job(team, "gang", 4, gates=(HOLD_GATE,))

        async def members() -> list[JsonObject] | None:
            pods = [
                p for p in await env.pods() if (p["metadata"].get("labels") or {}).get(JOB_LABEL) == "gang"
            ]
            return sorted(pods, key=lambda p: p["metadata"]["name"]) if len(pods) == 4 else None

        gang = await wait_until(members, timeout=30, what="the gang's 4 pods")
        for pod in gang[:3]:
            await lift(env, pod["metadata"]["name"])

        async def three_bound() -> bool:
            return (await bound_by_job(env))["gang"] == 3 and (picture.gang_reservation(workload) is not None)

        await wait_until(three_bound, timeout=60, interval=0.2, what="3 members bound, the 4th's GPU held")
        # The namespace's default queue is another queue; the pod's label names the gang's (which
        # it may not spend: it passes no admission).
        fallback = await env.create_queue("ns-default")
        await request(
            env.api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}",
            body={"metadata": {"labels": {NAMESPACE_QUEUE_LABEL: fallback}}},
            content_type="application/merge-patch+json",
        )
        foreign = objects.pod(namespace, "outside", queue=team, template=TEMPLATE)
        del foreign["metadata"]["uid"], foreign["status"]
        await request(env.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=foreign)

        async def foreign_runs() -> bool:
            pod = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/pods/outside")
            return (pod.get("status") or {}).get("phase") == "Running"

        await wait_until(foreign_runs, timeout=60, interval=0.2, what="the default-scheduler pod running")

        async def ended() -> bool:
            return not (picture.gang_reservation(workload) is not None)

        await wait_until(ended, timeout=15, what="the reservation ended")
        last = gang[3]["metadata"]["name"]
        await lift(env, last)

        # kube-scheduler's own DRA filter finds no device for it (the extender is not asked); the
        # picture counts the gang as it is - 3 placed, 1 missing - and lists the 4th for reclaim.
        async def unschedulable() -> bool:
            pod = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/pods/{last}")
            return scheduler_gave_up(pod)

        await wait_until(unschedulable, timeout=60, interval=0.2, what=f"{last} unschedulable")
        pod = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/pods/{last}")
        state = picture.gang(pod)
        assert (state.minimum, state.placed, state.members, state.reserved) == (4, 3, 4, False)
        assert [(p.key, p.workload) for p in picture.waiting_pods()] == [(f"{namespace}/{last}", workload)]
        # The outside pod's GPU is its namespace's default queue's, whatever its label says.
        usage = picture.fairness().usage
        assert (usage[fallback].allocated.get("gpu"), usage[team].allocated.get("gpu")) == (1.0, 3.0)

        async def marked() -> JsonObject | None:
            pod = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/pods/outside")
            conditions = (pod.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == BYPASS_CONDITION), None)

        mark = await wait_until(marked, timeout=30, interval=0.2, what="the BypassesQueue condition")
        assert mark["status"] == "True" and f"charged to queue '{fallback}'" in mark["message"]
        listing = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events")
        warnings = [e for e in listing["items"] if e["reason"] == "BypassesQueue"]
        assert [(e["type"], e["involvedObject"]["name"]) for e in warnings] == [("Warning", "outside")]


async def test_a_gang_whose_reclaimed_gpu_a_default_scheduler_pod_took_is_planned_again_at_once(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    """Reclaim frees 2 GPUs for a waiting gang of 2 and holds them. Its victims are kept terminating
    by a finalizer of the test's, so the moment between their ends is the test's: the first ends,
    and a default-scheduler pod (which sees no holds) takes its GPU. The gang now fits 1 of its 2
    members; the hold that lost its GPU is let go at the next cycle (`HoldLost`) and the member
    left without one is planned again - the outside pod is the victim: its queue, the namespace's
    default without quota, holds 1 GPU above its share of 0 - instead of the gang waiting out the
    hold's 90 s. Once the other victim ends, the gang is admitted whole and both members run."""
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 2}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 2}})
        fallback = await env.create_queue("ns-default")
        await request(
            env.api,
            "PATCH",
            f"/api/v1/namespaces/{namespace}",
            body={"metadata": {"labels": {NAMESPACE_QUEUE_LABEL: fallback}}},
            content_type="application/merge-patch+json",
        )
        # a borrows all 4 GPUs with pods no controller replaces, each kept by the finalizer.
        for index in range(4):
            pod = env.pod(team_a, f"a-{index}")
            pod["metadata"]["finalizers"] = [KEEP_FINALIZER]
            await request(env.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)

        async def a_runs() -> bool:
            pods = await env.pods()
            return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running") == 4

        await wait_until(a_runs, timeout=90, interval=0.2, what="a's 4 pods running")
        # b's gang of 2: fair shares 2 / 2, so reclaim evicts 2 of a's pods and holds their GPUs.
        await env.create_job(team_b, "jb", 2)

        async def victims() -> list[str] | None:
            going = sorted(
                p["metadata"]["name"] for p in await env.pods() if p["metadata"].get("deletionTimestamp")
            )
            return going if len(going) == 2 else None

        first, second = await wait_until(victims, timeout=60, interval=0.2, what="2 of a's pods evicted")
        foreign = objects.pod(namespace, "outside", template=TEMPLATE)
        del foreign["metadata"]["uid"], foreign["status"]
        await request(env.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=foreign)
        await let_go(env, first)  # its GPU frees: the gang cannot take it alone, the outside pod does

        async def replanned() -> list[JsonObject] | None:
            listing = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events")
            events = listing["items"]
            lost = [e for e in events if e["reason"] == "HoldLost"]
            evicted = [
                e for e in events if e["reason"] == "Reclaimed" and e["involvedObject"]["name"] == "outside"
            ]
            return lost if lost and evicted else None

        # The outside pod binds and the next cycle lets the hold go and evicts it (so it may be
        # gone before a poll sees it Running): within seconds, well inside the hold's 90 s.
        (lost,) = await wait_until(
            replanned, timeout=30, interval=0.2, what="the lost hold let go, the gang replanned"
        )
        assert lost["involvedObject"]["name"].startswith("jb-")
        await let_go(env, second)

        async def b_runs() -> bool:
            return (await running_by_job(env))["jb"] == 2

        await wait_until(b_runs, timeout=60, interval=0.2, what="b's gang with both members running")
        listing = await request(env.api, "GET", f"/api/v1/namespaces/{namespace}/events")
        planned = Counter(
            e["involvedObject"]["name"] for e in listing["items"] if e["reason"] == "ReclaimPlanned"
        )
        assert sorted(planned.values()) == [1, 2], planned  # the member whose hold was lost: twice


KEEP_FINALIZER = "test.tessera.dev/keep"


async def let_go(env: GpuCluster, name: str) -> None:
    """Remove the test's finalizer from a pod being deleted: its deletion completes."""
    await request(
        env.api,
        "PATCH",
        f"/api/v1/namespaces/{env.namespace}/pods/{name}",
        body={"metadata": {"finalizers": None}},
        content_type="application/merge-patch+json",
    )


HOLD_GATE = "test.tessera.dev/hold"


async def lift(env: GpuCluster, name: str) -> None:
    """Remove the test's scheduling gate from a pod: the scheduler may try it from now on."""
    await request(
        env.api,
        "PATCH",
        f"/api/v1/namespaces/{env.namespace}/pods/{name}",
        body={"spec": {"schedulingGates": None}},
        content_type="application/merge-patch+json",
    )
