"""A history change that moves a queue's share materially posts an Event on the Queue
(extender/controllers/history.py), on the real control plane: two queues share a 4-GPU node, the
heavy one holding 3 GPUs and the light one 1, both waiting for more; fair share over time is
turned on for both, and the heavy queue's over-quota weight falls, the light one's rises. The
metrics of the history (its usage, GPU-hours and factors) say the same.

Small parameters keep it to seconds: an update period of 1 s, and a factor allowed to move its
queue's share by its whole share with history off per second (60 per minute; the default 0.1
per minute would take minutes)."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import QUEUE_KIND
from extender.controllers.history import EVENT_REASON, HistoryOptions
from extender.events import CLUSTER_EVENT_NAMESPACE
from extender.kubeapi import JsonObject, request
from extender.service import ExtenderService
from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import GpuCluster, gpu_cluster

pytestmark = pytest.mark.integration


def metric(service: ExtenderService, sample: str, **labels: str) -> float:
    """The value of the one sample of `sample` whose labels include `labels`."""
    (value,) = (
        s.value
        for family in service.metrics.registry.collect()
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    )
    return value


FAST_HISTORY = HistoryOptions(sample_interval_s=0.5, update_period_s=1.0, max_change_per_minute=60.0)


async def history_events(env: GpuCluster, queue: str) -> list[JsonObject]:
    listing = await request(
        env.api,
        "GET",
        f"/api/v1/namespaces/{CLUSTER_EVENT_NAMESPACE}/events",
        query={"fieldSelector": f"involvedObject.kind={QUEUE_KIND},involvedObject.name={queue}"},
    )
    return [e for e in listing.get("items") or [] if e.get("reason") == EVENT_REASON]


async def gpu_shares(env: GpuCluster, *queues: str) -> list[float]:
    statuses = [(await env.get_queue(queue)).get("status") or {} for queue in queues]
    return [float((status.get("fairShare") or {}).get("gpu", "nan")) for status in statuses]


async def test_a_history_change_moves_the_shares_and_posts_an_event_on_each_queue(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, in_process=False) as env:
        heavy, light = await env.create_queue("heavy"), await env.create_queue("light")
        for queue in (heavy, light):
            # No reclaim within the test: what it shows is the shares, not evictions.
            await env.patch_queue(queue, {"reclaimMinRuntime": "1h"})
        await env.start_extender(history=FAST_HISTORY)
        await env.start_scheduler(env.url)

        async def bound(expected: dict[str, int]) -> bool:
            return await env.bound_by_queue() == expected

        await env.submit(heavy, 3, "heavy")
        await wait_until(lambda: bound({heavy: 3}), timeout=30, what="3 pods of the heavy queue bound")
        await env.submit(light, 1, "light")
        await wait_until(lambda: bound({heavy: 3, light: 1}), timeout=30, what="the light queue's pod bound")
        # Both wait for more than the node has: the heavy queue 1 more GPU, the light one 3.
        await env.submit(heavy, 1, "heavy-more")
        await env.submit(light, 3, "light-more")

        async def shares_are(expected: tuple[float, float]) -> bool:
            got = await gpu_shares(env, heavy, light)
            return all(abs(g - e) < 0.01 for g, e in zip(got, expected, strict=True))

        # History off: 4 GPUs beyond quotas of 0, equal weights, both wanting 4: 2 and 2.
        await wait_until(lambda: shares_are((2.0, 2.0)), timeout=30, what="shares 2 / 2 with history off")
        assert not await history_events(env, heavy) and not await history_events(env, light)

        for queue in (heavy, light):
            await env.patch_queue(queue, {"fairShareHistory": {"enabled": True, "halfLife": "1h"}})
        # From then on the heavy queue holds 3 of 4 GPUs, the light one 1: U' = 0.75 and 0.25,
        # P = 0.5 + (0.5 - 0.75) = 0.25 and 0.75: factors 0.5 and 1.5, shares 4 * 0.25 = 1 and 3.
        await wait_until(lambda: shares_are((1.0, 3.0)), timeout=30, what="shares 1 / 3 with history on")

        async def reported(queue: str, factor: str) -> list[JsonObject] | None:
            found = await history_events(env, queue)
            return found if any(f"-> {factor} " in e["message"] for e in found) else None

        # One step, or more should the two patches reach the extender a pass apart: the first
        # Event starts from the factor 1, the last one ends at the target.
        for queue, factor in ((heavy, "x0.50"), (light, "x1.50")):
            found = await wait_until(
                partial(reported, queue, factor), timeout=15, what=f"{factor} on {queue}"
            )
            obj = await env.get_queue(queue)
            for event in found:
                assert event["involvedObject"]["uid"] == obj["metadata"]["uid"]
                assert event["type"] == "Normal"
            assert "gpu: over-quota weight x1.00 -> " in found[0]["message"], found[0]["message"]
            kept = obj["status"]["history"]
            assert kept["weightFactor"]["gpu"] == pytest.approx(float(factor[1:]), abs=0.01)
        described = (await asyncio.to_thread(local_cluster.kubectl, "describe", "queue", heavy)).stdout
        assert EVENT_REASON in described, described

        assert env.service is not None
        for queue, usage, weight_factor in ((heavy, 0.75, 0.5), (light, 0.25, 1.5)):
            labels = {"queue": queue, "resource": "gpu"}
            assert metric(env.service, "tessera_queue_historic_usage", **labels) == pytest.approx(
                usage, abs=0.01
            )
            assert metric(env.service, "tessera_queue_weight_factor", **labels) == pytest.approx(
                weight_factor, abs=0.01
            )
            assert metric(env.service, "tessera_queue_historic_gpu_hours", queue=queue) > 0
