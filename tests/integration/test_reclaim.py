"""Reclaim on the real control plane: borrowed GPUs taken back through the Eviction API.

Every node runs the node agent (DRA driver on a simulated profile, kubelet stand-in), so pods
really run, an evicted pod goes through its graceful termination and is removed by the agent, and
PodDisruptionBudgets apply (the Eviction API ignores budgets for pods that are not running).
Queue A's pods come from a ReplicaSet, which replaces every evicted pod at once: the replacements
compete with queue B for the freed GPUs, which the extender holds for B.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import QUEUE_LABEL
from extender.kubeapi import JsonObject, KubeError, request
from extender.service import ExtenderService
from tessera.dev.localcluster import LocalCluster, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import GpuCluster, gpu_cluster, stop_service

pytestmark = pytest.mark.integration

EVICTIONS = "tessera_reclaim_evictions_total"
CYCLES = "tessera_reclaim_cycle_duration_seconds_count"


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def metric(service: ExtenderService, sample: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    return sum(
        s.value
        for family in service.metrics.registry.collect()
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )


async def running(env: GpuCluster) -> dict[str, JsonObject]:
    """Pods the agent runs and nobody is deleting, by name."""
    return {
        p["metadata"]["name"]: p
        for p in await env.pods()
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def by_queue(pods: dict[str, JsonObject]) -> dict[str, int]:
    return dict(Counter(p["metadata"]["labels"][QUEUE_LABEL] for p in pods.values()))


async def wait_running(
    env: GpuCluster, expected: dict[str, int], timeout: float = 90
) -> dict[str, JsonObject]:
    async def reached() -> dict[str, JsonObject] | None:
        pods = await running(env)
        return pods if by_queue(pods) == expected else None

    try:
        return await wait_until(reached, timeout=timeout, interval=0.2, what=f"running pods {expected}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; running now {by_queue(await running(env))}") from exc


async def events(env: GpuCluster, reason: str) -> list[JsonObject]:
    listing = await request(
        env.api,
        "GET",
        f"/api/v1/namespaces/{env.namespace}/events",
        query={"fieldSelector": f"reason={reason}"},
    )
    return list(listing.get("items") or [])


def subjects(found: list[JsonObject]) -> Counter[str]:
    """How many events each pod got."""
    return Counter(e["involvedObject"]["name"] for e in found)


async def queue_counts(env: GpuCluster, queue: str) -> tuple[Any, Any]:
    status = (await env.get_queue(queue)).get("status") or {}
    return status.get("reclaimedPods"), status.get("evictedPods")


async def more_cycles(service: ExtenderService, count: int) -> None:
    """Wait until the reclaim loop has planned `count` more cycles."""
    target = metric(service, CYCLES) + count

    async def ran() -> bool:
        return metric(service, CYCLES) >= target

    await wait_until(ran, timeout=30, interval=0.2, what=f"{count} more reclaim cycles")


async def test_borrowed_gpus_are_reclaimed_through_the_eviction_api_and_never_twice(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 4}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 4}})

        # B is idle: A's preemptible pods (priority 0) borrow B's quota and fill all 8 GPUs.
        await env.create_replicaset(team_a, "a", 8)
        first_a = set(await wait_running(env, {team_a: 8}))

        submitted = time.monotonic()
        b_pods = await env.submit(team_b, 4, "b")
        now_running = await wait_running(env, {team_a: 4, team_b: 4})
        reclaimed_after = time.monotonic() - submitted
        print(f"\nqueue B held its fair share (4 GPUs) {reclaimed_after:.1f}s after submitting")
        assert reclaimed_after < 30

        # Exactly 4 of A's pods were evicted, each once; the other 4 run on.
        reclaimed = subjects(await events(env, "Reclaimed"))
        assert sum(reclaimed.values()) == 4 and set(reclaimed.values()) == {1}, reclaimed
        assert set(reclaimed) <= first_a
        assert set(now_running) & first_a == first_a - set(reclaimed)
        message = (await events(env, "Reclaimed"))[0]["message"]
        assert f"queue '{team_b}'" in message and f"queue '{team_a}'" in message, message
        planned = subjects(await events(env, "ReclaimPlanned"))
        assert planned == dict.fromkeys(b_pods, 1), planned

        async def counted() -> bool:
            return await queue_counts(env, team_b) == (4, 0) and await queue_counts(env, team_a) == (0, 4)

        await wait_until(counted, timeout=15, what="reclaimedPods/evictedPods in the Queue status")

        # The ReplicaSet replaced the 4 evicted pods; they wait (A holds its fair share), and
        # further cycles evict nothing: neither B's pods nor A's again.
        async def replaced() -> bool:
            pods = await env.pods()
            waiting = [
                p for p in pods if p["metadata"]["name"] not in first_a and not p["spec"].get("nodeName")
            ]
            return len(waiting) == 4

        await wait_until(replaced, timeout=30, what="4 replacement pods of A pending")
        await more_cycles(env.service, 5)
        assert metric(env.service, EVICTIONS) == 4
        assert metric(env.service, EVICTIONS, outcome="evicted", queue=team_a) == 4
        assert subjects(await events(env, "Reclaimed")) == reclaimed
        assert by_queue(await running(env)) == {team_a: 4, team_b: 4}


async def test_half_gpu_pods_take_back_one_gpu_per_two_of_them(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 2}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 2}})
        half = objects.claim_template(namespace, "half-gpu", objects.claim_spec(env.driver, memory="40Gi"))
        templates = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        await request(env.api, "POST", templates, body=half)
        # A borrowed all 4 GPUs; B (share 2) submits 4 half-GPU pods (40Gi of 80Gi): it needs
        # 2 GPUs. Each plan evicts one of A's pods and holds both halves of that very GPU for
        # B's pods, so A's replacements (whole GPUs) cannot take a freed GPU back: 2 evictions
        # for 2 GPUs, no pod evicted twice.
        await env.create_replicaset(team_a, "a", 4)
        first_a = set(await wait_running(env, {team_a: 4}))
        await env.submit(team_b, 4, "b", template="half-gpu")
        await wait_running(env, {team_a: 2, team_b: 4})
        reclaimed = subjects(await events(env, "Reclaimed"))
        assert sum(reclaimed.values()) == 2 and set(reclaimed.values()) == {1}, reclaimed
        assert set(reclaimed) <= first_a
        await more_cycles(env.service, 5)
        assert metric(env.service, EVICTIONS) == 2
        assert by_queue(await running(env)) == {team_a: 2, team_b: 4}


async def test_a_pod_disruption_budget_blocks_an_eviction_and_is_reported(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 2}})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 2}})
        await env.create_replicaset(team_a, "a", 4)
        first_a = set(await wait_running(env, {team_a: 4}))
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "a", "namespace": namespace},
            "spec": {"minAvailable": 4, "selector": {"matchLabels": {"app": "a"}}},
        }
        pdb_path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        await request(k8s, "POST", pdb_path, body=budget)

        async def budget_current() -> bool:  # the disruption controller has counted the pods
            status = (await request(k8s, "GET", f"{pdb_path}/a")).get("status") or {}
            return status.get("observedGeneration") == 1 and status.get("currentHealthy") == 4

        await wait_until(budget_current, timeout=30, what="the budget's status")

        (b_pod,) = await env.submit(team_b, 1, "b")

        async def blocked() -> list[JsonObject] | None:
            found = await events(env, "EvictionBlocked")
            names = subjects(found)
            return found if b_pod in names and names.keys() & first_a else None

        found = await wait_until(blocked, timeout=30, what="EvictionBlocked on the victim and on B's pod")
        assert all("PodDisruptionBudget" in e["message"] and e["type"] == "Warning" for e in found)

        # A blocked victim is left alone for a while: the next cycles try the others, once each.
        async def all_tried() -> bool:
            return subjects(await events(env, "EvictionBlocked")).keys() >= first_a

        await wait_until(all_tried, timeout=30, what="every pod of A tried once")
        await more_cycles(env.service, 3)
        tried = subjects(await events(env, "EvictionBlocked"))
        assert all(tried[name] == 1 for name in first_a), tried
        # The Eviction API refused: A's pods all run, none is being deleted, B's pod waits.
        assert set(await running(env)) == first_a
        assert metric(env.service, EVICTIONS, outcome="blocked") >= 1
        assert metric(env.service, EVICTIONS, outcome="evicted") == 0
        assert not await events(env, "Reclaimed")

        # Without the budget the same reclaim goes through.
        await request(k8s, "DELETE", f"{pdb_path}/a")
        await wait_running(env, {team_a: 3, team_b: 1})
        assert sum(subjects(await events(env, "Reclaimed")).values()) == 1


async def test_reclaim_waits_for_the_victim_queues_min_runtime(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    min_runtime = 15
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        team_a = await env.create_queue("a", resources={"gpu": {"quota": 2}})
        await env.patch_queue(team_a, {"reclaimMinRuntime": f"{min_runtime}s"})
        team_b = await env.create_queue("b", resources={"gpu": {"quota": 2}})
        await env.create_replicaset(team_a, "a", 4)
        started = {
            name: _seconds(pod["status"]["startTime"])
            for name, pod in (await wait_running(env, {team_a: 4})).items()
        }
        await env.submit(team_b, 2, "b")
        submitted = time.time()
        # B waited while A's pods were young: it asked long before any of them could be evicted.
        assert submitted < min(started.values()) + min_runtime - 5
        await wait_running(env, {team_a: 2, team_b: 2}, timeout=min_runtime + 60)

        victims = await events(env, "Reclaimed")
        assert len(victims) == 2
        for event in victims:
            ran = _seconds(event["firstTimestamp"]) - started[event["involvedObject"]["name"]]
            # Event and start times have one-second resolution.
            assert ran >= min_runtime - 1, f"{event['involvedObject']['name']} evicted after {ran:.0f}s"
        assert metric(env.service, EVICTIONS) == 2


async def test_an_urgent_pod_preempts_one_of_its_own_queues_batch_pods(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    # 4 GPUs; queue a (quota 4) runs 4 of its own priority-0 batch pods. A pod of priority 1000
    # (a PriorityClass; not preemptible: above --non-preemptible-priority) arrives. The quota
    # guarantees non-preemptible work: a's non-preemptible pods hold 0, 0 + 1 <= 4, so it is
    # admitted (before: 4 + 1 > 4, refused over_quota until a batch pod ended) and one batch pod
    # makes room for it - the scheduler's preemption, which the extender's preempt verb allows
    # within a queue, or the reclaim loop's; whichever comes first. The ReplicaSet's replacement
    # waits (a holds its quota) and nothing more is evicted.
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True) as env:
        assert env.service is not None
        team = await env.create_queue("a", resources={"gpu": {"quota": 4}})
        await env.create_replicaset(team, "batch", 4)
        batch = set(await wait_running(env, {team: 4}))
        classes = "/apis/scheduling.k8s.io/v1/priorityclasses"
        urgent_class = f"urgent-{env.suffix}"
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 1000}
        await request(k8s, "POST", classes, body={**body, "metadata": {"name": urgent_class}})
        try:
            pod = env.pod(team, "urgent")
            pod["spec"]["priorityClassName"] = urgent_class
            submitted = time.monotonic()

            async def created() -> bool:
                # The apiserver's priority admission reads PriorityClasses from its informer,
                # which may not have seen the class just created (403 "no PriorityClass").
                try:
                    await request(k8s, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
                except KubeError as error:
                    if error.status == 403 and "no PriorityClass" in error.message:
                        return False
                    raise
                return True

            await wait_until(created, timeout=30, interval=0.2, what="the urgent pod created")

            async def urgent_runs() -> dict[str, JsonObject] | None:
                pods = await running(env)
                return pods if "urgent" in pods and len(pods) == 4 else None

            now_running = await wait_until(
                urgent_runs, timeout=60, interval=0.2, what="the urgent pod running"
            )
            print(f"\nthe urgent pod ran {time.monotonic() - submitted:.1f}s after submitting")
            assert time.monotonic() - submitted < 30
            # One batch pod made room; its replacement waits and no further cycle evicts anything.
            assert len(batch - set(now_running)) == 1
            await more_cycles(env.service, 3)
            assert set(await running(env)) == set(now_running)
        finally:
            await request(k8s, "DELETE", f"{classes}/{urgent_class}")


async def test_only_the_lease_holder_evicts(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(
        local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, agent=True, in_process=False
    ) as env:
        lease_name = f"tessera-extender-{env.suffix}"
        first = await env.start_extender(lease=(namespace, lease_name, "first"))

        async def leads(service: ExtenderService) -> bool:
            return service.lease is not None and service.lease.is_leader()

        await wait_until(lambda: leads(first), timeout=15, what="the first replica to hold the Lease")
        second = await env.new_extender(lease=(namespace, lease_name, "second"))
        try:
            await env.start_scheduler(env.url)
            team_a = await env.create_queue("a", resources={"gpu": {"quota": 2}})
            team_b = await env.create_queue("b", resources={"gpu": {"quota": 2}})
            await env.create_replicaset(team_a, "a", 4)
            await wait_running(env, {team_a: 4})
            await env.submit(team_b, 2, "b")
            await wait_running(env, {team_a: 2, team_b: 2})

            assert metric(first, EVICTIONS) == 2
            assert metric(second, EVICTIONS) == 0 and metric(second, CYCLES) == 0
            assert not await leads(second)
            lease = await request(
                k8s, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name}"
            )
            assert lease["spec"]["holderIdentity"] == "first"

            # The holder goes away without a word: the other takes over once the Lease expires.
            await env.stop_extender()
            await wait_until(lambda: leads(second), timeout=40, what="the second replica to take the Lease")
        finally:
            await stop_service(second)


async def test_a_pod_short_of_cpu_reclaims_it_from_the_queue_above_its_dominant_share(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    # One fake node of 8 GPUs and 64 cores. A's ReplicaSet of 4 pods of <1 GPU, 16 cores> holds
    # every core; B submits 4 pods of <1 GPU, 2 cores>: kube-scheduler finds no node with the
    # cores, beside 4 idle GPUs. GPU shares 4 / 4 (A holds exactly its share: the GPU rule takes
    # nothing); cores: B asks 8 and is given them, A 56 - A holds 64: dominant share 64/56 > 1,
    # B's 0. DRF (docs/queues.md, "CPU and memory (DRF)") evicts one of A's pods: 16 cores free,
    # B's 4 pods take 8 of them and 4 GPUs. A's replacement (16 cores) waits: 8 are free, and
    # A (3 of 4 GPUs, 48 of 56 cores) is below its dominant share, not above B's.
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=8, agent=True) as env:
        assert env.service is not None
        team_a = await env.create_queue("a")
        team_b = await env.create_queue("b")
        await env.create_replicaset(team_a, "a", 4, cpu="16")
        first_a = set(await wait_running(env, {team_a: 4}))
        await env.submit(team_b, 4, "b", cpu="2")
        await wait_running(env, {team_a: 3, team_b: 4})
        reclaimed = await events(env, "Reclaimed")
        assert len(reclaimed) == 1 and reclaimed[0]["involvedObject"]["name"] in first_a
        assert "short of CPU or memory" in reclaimed[0]["message"], reclaimed[0]["message"]
        await more_cycles(env.service, 5)
        assert metric(env.service, EVICTIONS, goal="drf", outcome="evicted") == 1
        assert metric(env.service, EVICTIONS) == 1
        assert by_queue(await running(env)) == {team_a: 3, team_b: 4}
