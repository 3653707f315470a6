"""Consolidation on the real control plane: four simulated one-GPU H100 nodes (the node agent: the
real DRA driver and the kubelet stand-in, so pods run and evictions finish), the controller
manager's Deployment and ReplicaSet controllers, kube-scheduler with the extender in this process.

A Deployment's four half-GPU pods are spread one per GPU; a whole-GPU pod then fits nowhere,
though two GPUs are free in pieces. The consolidation loop moves one half (the fewest moves),
the ReplicaSet recreates it, the scheduler packs it next to another half, and the whole-GPU pod
runs on the GPU made whole. The test prints the moves and the seconds it took.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from contract.names import QUEUE_LABEL
from extender.controllers.consolidate import ConsolidationOptions
from extender.controllers.reclaim import ReclaimOptions
from extender.kubeapi import JsonObject, request
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.policy.topology import DEFAULT_TOPOLOGY, Topology
from extender.service import ExtenderService, ServiceOptions
from tessera.dev.localcluster import LocalCluster, SchedulerHandle, api_client, delete_nodes, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import QUEUE_CRD, QUEUES_PATH
from tests.integration.extender_harness import _ignore_missing as ignore_missing

# Fixtures shared with the driver tests: a unique driver name, its DeviceClasses (the shipped ones,
# renamed), a short directory for the unix sockets.
from tests.integration.test_dra_prepare import (  # noqa: F401
    SHIPPED_PROFILES,
    ChildProcess,
    device_classes,
    driver,
    short_dir,
    slices_published,
)

NODES = 4
HALVES = "app=halves"  # the Deployment's pods
MERGE_PATCH = "application/merge-patch+json"
HALF = "40Gi"  # of an 80Gi H100


@dataclass
class Env:
    api: ApiClient
    namespace: str
    queue: str
    scheduler: str
    nodes: list[str]
    service: ExtenderService

    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    async def pods(self, selector: str = "") -> list[JsonObject]:
        query = {"labelSelector": selector} if selector else None
        listing = await request(self.api, "GET", self.pods_path(), query=query)
        return list(listing.get("items") or [])

    async def running(self, selector: str) -> list[JsonObject]:
        return [
            p
            for p in await self.pods(selector)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    async def cordon(self, unschedulable: set[str]) -> None:
        for node in self.nodes:
            body = {"spec": {"unschedulable": node in unschedulable}}
            await request(
                self.api,
                "PATCH",
                f"/api/v1/nodes/{node}",
                body=body,
                content_type="application/merge-patch+json",
            )

    def pod_spec(self, template: str) -> JsonObject:
        return {
            "schedulerName": self.scheduler,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": "main", "image": "registry.invalid/cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        }


def claim_template(namespace: str, name: str, device_class: str, memory: str | None = None) -> JsonObject:
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    spec = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def deployment(env: Env, name: str, replicas: int, template: str = "half") -> JsonObject:
    labels = {"app": name, QUEUE_LABEL: env.queue}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": env.namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels}, "spec": env.pod_spec(template)},
        },
    }


@asynccontextmanager
async def consolidation_cluster(
    cluster: LocalCluster,
    api: ApiClient,
    namespace: str,
    gpu_driver: str,
    workdir: Path,
    topology: Topology = DEFAULT_TOPOLOGY,
) -> AsyncIterator[Env]:
    """Four one-GPU nodes run by the node agent, a queue, claim templates, the extender (reclaim
    and consolidation every 0.5 s, pods movable at once; the cluster's `topology` levels) and a
    scheduler calling it."""
    suffix = uuid.uuid4().hex[:6]
    nodes = [f"consol-{suffix}-{i}" for i in range(NODES)]
    profile = yaml.safe_load((SHIPPED_PROFILES / "h100x8.yaml").read_text())
    profile["gpus"][0]["count"] = 1
    profile_path = workdir / "h100x1.yaml"
    profile_path.write_text(yaml.safe_dump(profile))
    agent = ChildProcess(
        [
            "-m", "tessera.dev.nodeagent", "--kubeconfig", str(cluster.kubeconfig),
            "--profile", str(profile_path), "--driver-name", gpu_driver, "--state-dir", str(workdir),
            "--create-nodes", *(arg for node in nodes for arg in ("--node-name", node)),
        ],
        workdir / "agent.log",
    )  # fmt: skip
    queue = f"consol-{suffix}"
    scheduler: SchedulerHandle | None = None
    service: ExtenderService | None = None
    agent.start()
    try:
        await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(QUEUE_CRD))
        await asyncio.to_thread(cluster.wait_established, "crd/queues.scheduling.tessera.dev")
        await request(
            api, "POST", QUEUES_PATH, body=objects.queue(queue, resources={"gpu": {"quota": NODES}})
        )
        templates = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        await request(
            api, "POST", templates, body=claim_template(namespace, "half", f"fractional-{gpu_driver}", HALF)
        )
        await request(api, "POST", templates, body=claim_template(namespace, "whole", gpu_driver))
        for node in nodes:
            await wait_until(
                partial(slices_published, api, gpu_driver, node), timeout=60, what=f"slices of {node}"
            )
        scheduler_name = f"tessera-{suffix}"
        picture = ClusterPicture(
            PictureConfig(
                gpu_drivers=frozenset({gpu_driver}),
                scheduler_names=frozenset({scheduler_name}),
                topology=topology,
            )
        )
        service = ExtenderService(
            await api_client(cluster.kubeconfig),
            ServiceOptions(
                host="127.0.0.1",
                port=0,
                picture=picture,
                queue_status_interval_s=0.5,
                reclaim=ReclaimOptions(interval_s=0.5),
                consolidation=ConsolidationOptions(min_runtime_s=0.0, replace_timeout_s=60.0),
            ),
        )
        await service.start()
        await service.wait_ready()
        extender = {
            "urlPrefix": f"http://127.0.0.1:{service.port}",
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "preemptVerb": "preempt",
            "weight": 1,
            "nodeCacheCapable": True,
            "enableHTTPS": False,
        }
        scheduler = await asyncio.to_thread(cluster.start_scheduler, scheduler_name, [extender])
        yield Env(api, namespace, queue, scheduler_name, nodes, service)
    finally:
        if scheduler is not None:
            scheduler.stop()
        if service is not None:
            await service.stop()
            await service.watcher.api.close()
        await ignore_missing(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/halves", api)
        await ignore_missing(f"/apis/apps/v1/namespaces/{namespace}/deployments/halves", api)
        await ignore_missing(f"/api/v1/namespaces/{namespace}/pods", api)
        await ignore_missing(f"{QUEUES_PATH}/{queue}", api)
        agent.stop()
        await delete_nodes(api, nodes)


def gpu_of(pod: JsonObject) -> str:
    return str(pod["spec"].get("nodeName"))


async def spread_halves(env: Env) -> dict[str, str]:
    """The Deployment's halves one per GPU (binpack would pair them): only node i is schedulable
    while replica i is placed. Returns pod name -> node."""
    deployments = f"/apis/apps/v1/namespaces/{env.namespace}/deployments"
    for count in range(1, NODES + 1):
        await env.cordon(set(env.nodes) - {env.nodes[count - 1]})
        if count == 1:
            await request(env.api, "POST", deployments, body=deployment(env, "halves", 1))
        else:
            scale = {"spec": {"replicas": count}}
            await request(env.api, "PATCH", f"{deployments}/halves", body=scale, content_type=MERGE_PATCH)
        await wait_until(partial(_count_is, env, HALVES, count), timeout=90, what=f"{count} halves running")
    await env.cordon(set())
    spread = {p["metadata"]["name"]: gpu_of(p) for p in await env.running(HALVES)}
    assert sorted(spread.values()) == sorted(env.nodes), "one half per GPU"
    return spread


async def submit_whole(env: Env) -> None:
    """A whole-GPU pod: two GPUs are free, in halves; it fits nowhere until one half moves."""
    whole = {"metadata": {"name": "whole", "labels": {QUEUE_LABEL: env.queue}}, "spec": env.pod_spec("whole")}
    await request(env.api, "POST", env.pods_path(), body=whole)


def sample(env: Env, name: str, **labels: str) -> float:
    return env.service.metrics.registry.get_sample_value(f"tessera_consolidation_{name}", labels) or 0.0


async def event_reasons(env: Env) -> set[tuple[str, str]]:
    events = await request(env.api, "GET", f"/api/v1/namespaces/{env.namespace}/events")
    return {(e["involvedObject"]["name"], e["reason"]) for e in events.get("items") or []}


# Unexplained (issue 25 stop note): timed out waiting for the replacement metric in 1 of 5 full
# CI runs on the loaded 2-core machine; passed 4 of 4 alone. One rerun, until found.
@pytest.mark.flaky(reruns=1)
async def test_one_half_moves_and_the_whole_gpu_pod_runs(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,  # noqa: F811
    device_classes: None,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    async with consolidation_cluster(local_cluster, k8s, namespace, driver, short_dir) as env:
        before = await spread_halves(env)
        started = time.monotonic()
        await submit_whole(env)
        node = await wait_until(
            partial(_running_node, env, "whole"), timeout=120, what="the whole-GPU pod Running"
        )
        seconds = time.monotonic() - started

        # The Deployment is whole again, its four halves packed on the three other GPUs.
        after = await wait_until(
            partial(_count_is, env, HALVES, NODES), timeout=60, what="four halves running"
        )
        placed = [gpu_of(p) for p in after]
        assert node not in placed
        assert sorted(placed.count(n) for n in set(placed)) == [1, 1, 2]
        moved = sorted(set(before) - {p["metadata"]["name"] for p in after})

        async def successor_reported() -> bool:
            return sample(env, "replacements_total", outcome="replaced") == 1

        await wait_until(successor_reported, timeout=30, what="the move's successor reported")
        moves = sample(env, "moves_total", goal="consolidate", outcome="evicted")
        assert moves == 1 and len(moved) == 1
        assert sample(env, "plans_total", goal="consolidate", result="carried_out") == 1
        assert sample(env, "gpus_freed_total", goal="consolidate") == 1.0
        reasons = await event_reasons(env)
        assert (moved[0], "Moved") in reasons
        assert ("whole", "ConsolidationPlanned") in reasons
        print(
            f"\nconsolidation: {moves:.0f} move(s) ({moved[0]} off {before[moved[0]]}); the whole-GPU pod "
            f"ran on {node} {seconds:.1f}s after it was created; halves now on {sorted(placed)}"
        )


async def test_a_move_a_disruption_budget_blocks_is_reported_not_forced(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,  # noqa: F811
    device_classes: None,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    async with consolidation_cluster(local_cluster, k8s, namespace, driver, short_dir) as env:
        before = await spread_halves(env)
        # All four halves must stay available: the disruption controller allows no eviction.
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "halves"},
            "spec": {"minAvailable": NODES, "selector": {"matchLabels": {"app": "halves"}}},
        }
        budgets = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        await request(k8s, "POST", budgets, body=budget)

        async def budget_counted() -> bool:
            status = (await request(k8s, "GET", f"{budgets}/halves")).get("status") or {}
            return status.get("currentHealthy") == NODES and status.get("disruptionsAllowed") == 0

        await wait_until(budget_counted, timeout=60, what="the budget's status")
        await submit_whole(env)

        async def blocked() -> bool:
            return sample(env, "plans_total", goal="consolidate", result="blocked") >= 1

        await wait_until(blocked, timeout=60, what="a blocked move plan")
        reasons = await event_reasons(env)
        assert ("whole", "MoveBlocked") in reasons
        assert sample(env, "moves_total", goal="consolidate", outcome="evicted") == 0
        # Nothing was forced: the same four halves run where they ran; the hold was released.
        assert {p["metadata"]["name"]: gpu_of(p) for p in await env.running(HALVES)} == before
        assert env.service.picture.held_for(f"{namespace}/whole") is None


async def test_scale_down_empties_gpu_nodes_whose_pods_fit_elsewhere(
    local_cluster: LocalCluster,
    k8s: ApiClient,
    namespace: str,
    driver: str,  # noqa: F811
    device_classes: None,  # noqa: F811
    short_dir: Path,  # noqa: F811
) -> None:
    async with consolidation_cluster(local_cluster, k8s, namespace, driver, short_dir) as env:
        await spread_halves(env)
        # Scale-down is off by default; turned on once the halves are spread, with nothing waiting:
        # the four halves fit on two GPUs, so two nodes empty, one per cycle.
        consolidator = env.service.consolidator
        assert consolidator is not None
        consolidator.options = replace(consolidator.options, drain_nodes=1)
        started = time.monotonic()

        async def two_nodes_empty() -> list[str] | None:
            running = await env.running(HALVES)
            used = {gpu_of(p) for p in running}
            return sorted(used) if len(running) == NODES and len(used) == 2 else None

        used = await wait_until(two_nodes_empty, timeout=90, what="four halves on two nodes")
        seconds = time.monotonic() - started

        async def successors_reported() -> bool:
            return sample(env, "replacements_total", outcome="replaced") == 2

        await wait_until(successors_reported, timeout=30, what="both moves' successors reported")
        moves = sample(env, "moves_total", goal="drain", outcome="evicted")
        assert moves == 2
        assert sample(env, "gpus_freed_total", goal="drain") == 2.0
        emptied = sorted(set(env.nodes) - set(used))
        assert set(emptied) <= consolidator.draining_nodes()  # held whole, for the autoscaler
        print(f"\nscale-down: {moves:.0f} move(s) emptied {emptied} in {seconds:.1f}s; halves on {used}")


async def _count_is(env: Env, selector: str, count: int) -> list[JsonObject] | None:
    found = await env.running(selector)
    return found if len(found) == count else None


async def _running_node(env: Env, name: str) -> str | None:
    for pod in await env.pods():
        if pod["metadata"]["name"] == name and pod["status"].get("phase") == "Running":
            return gpu_of(pod)
    return None
