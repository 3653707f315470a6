"""A pod no real amount describes costs only itself, on the real control plane.

The apiserver accepts cpu "1e400" (a valid quantity); such a pod, in its own namespace, without
a GPU or a queue label, used to make every filter answer 500 until it was deleted.
"""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import request
from tessera.dev.localcluster import LocalCluster
from tests import extender_objects as objects
from tests.integration.extender_harness import gpu_cluster
from tests.integration.test_extender_fairness import converge

pytestmark = pytest.mark.integration


async def test_a_pod_asking_1e400_cpus_does_not_stop_others_from_scheduling(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        team = await env.create_queue("p", resources={"gpu": {"quota": 2}})
        for name, cpu in (("absurd", "1e400"), ("twice-huge", "1e308")):
            poison = objects.pod(namespace, name, cpu=cpu, scheduler=env.scheduler_name)
            del poison["metadata"]["uid"], poison["status"]
            if name == "twice-huge":  # two containers of 1e308 each: the sum is beyond a float
                second = dict(poison["spec"]["containers"][0], name="second")
                poison["spec"]["containers"].append(second)
            await request(k8s, "POST", f"/api/v1/namespaces/{namespace}/pods", body=poison)
        await env.submit(team, 2, "after")
        await converge(env, {team: 2}, {team: 2})
        assert env.service is not None
        # The extender kept serving and stays ready; the odd pods are counted nowhere.
        view = env.service.picture.fairness()
        assert view.usage[team].allocated["gpu"] == 2
        assert all(amount < 1e12 for usage in view.usage.values() for amount in usage.allocated.values())
