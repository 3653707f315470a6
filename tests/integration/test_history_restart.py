"""Fair share over time survives a leader change (extender/controllers/history.py), on the real
control plane: two extender processes with leader election behind the scheduler; a queue holds
GPUs while the leader writes its decayed usage into the Queue's status; the leader is killed
(SIGKILL), and the standby, once it holds the Lease, carries on from that status."""

from __future__ import annotations

import signal
import time

from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject, request
from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import gpu_cluster
from tests.integration.test_failover import (
    GPU_MARKER,
    LEASE_DURATION_S,
    ServiceRouter,
    _gpu_pod,
    bound,
    replicas,
)

UPDATE_PERIOD_S = 2.0
HELD = 3  # GPUs the queue holds throughout
HALF_LIFE_S = 3600.0


async def test_a_new_leader_has_the_history_of_the_old_one(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, in_process=False) as env:
        lease, service = f"history-{env.suffix}", f"tessera-history-{env.suffix}"
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        await request(
            k8s,
            "POST",
            f"/api/v1/namespaces/{namespace}/services",
            body={
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service},
                "spec": {"ports": [{"name": "extender", "port": 8888, "protocol": "TCP"}]},
            },
        )
        history_spec = {"enabled": True, "halfLife": "1h"}
        queue, other = await env.create_queue("kept"), await env.create_queue("other")
        for name in (queue, other):
            await env.patch_queue(name, {"fairShareHistory": history_spec})
        router = ServiceRouter(k8s, namespace, service)
        await router.start()
        try:
            async with replicas(env, lease, service, f"--history-update-period={UPDATE_PERIOD_S:g}") as pair:
                await env.start_scheduler(
                    f"http://127.0.0.1:{router.port}",
                    managedResources=[{"name": GPU_MARKER, "ignoredByScheduler": True}],
                    ignorable=False,
                )

                async def holder_pid() -> int | None:
                    holder = (await request(k8s, "GET", lease_path))["spec"].get("holderIdentity") or ""
                    return next(
                        (
                            r.component.process.pid
                            for r in pair
                            if holder.endswith(f"-{r.component.process.pid}")
                        ),
                        None,
                    )

                leader_pid = await wait_until(holder_pid, timeout=60, what="a Lease holder")
                leader = next(r for r in pair if r.component.process.pid == leader_pid)
                for index in range(HELD):
                    await request(
                        k8s,
                        "POST",
                        f"/api/v1/namespaces/{namespace}/pods",
                        body=_gpu_pod(env, queue, f"held-{index}"),
                    )

                async def all_bound() -> bool:
                    return bound(await env.pods(), "held-") == HELD

                await wait_until(all_bound, timeout=60, what=f"{HELD} GPU pods bound")
                bound_at = time.time()

                async def history(after: float, hours: float = 0.0) -> JsonObject | None:
                    kept = ((await env.get_queue(queue)).get("status") or {}).get("history") or {}
                    written = float(kept.get("updated") or 0) > after
                    return kept if written and float(kept.get("gpuHours") or 0) > hours else None

                # A history of 36 GPU-s at least (0.01 h), so that a new leader that lost it shows.
                before = await wait_until(
                    lambda: history(bound_at + UPDATE_PERIOD_S, 0.01), timeout=60, what="the leader's history"
                )
                leader.component.process.send_signal(signal.SIGKILL)
                killed_at = time.time()

                async def taken_over() -> bool:
                    pid = await holder_pid()
                    return pid is not None and pid != leader_pid

                await wait_until(
                    taken_over, timeout=3 * LEASE_DURATION_S, what="the standby holding the Lease"
                )
                after = await wait_until(
                    lambda: history(killed_at), timeout=3 * LEASE_DURATION_S, what="the new leader's history"
                )
                # The old history decayed to the new update, plus HELD GPUs held all along:
                # nothing lost beyond the rounding of the status (0.001 h) and one update period.
                span_s = float(after["updated"]) - float(before["updated"])
                decay = 0.5 ** (span_s / HALF_LIFE_S)
                expected = float(before["gpuHours"]) * decay + HELD * span_s / 3600.0
                tolerance = HELD * UPDATE_PERIOD_S / 3600.0 + 0.001
                print(
                    {"before": before["gpuHours"], "after": after["gpuHours"], "expected": round(expected, 4)}
                )
                assert abs(float(after["gpuHours"]) - expected) <= tolerance
                assert after["buckets"] and after["windowSeconds"] == before["windowSeconds"]
        finally:
            await router.stop()
            await request(k8s, "DELETE", f"/api/v1/namespaces/{namespace}/services/{service}")
