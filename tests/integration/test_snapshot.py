"""A snapshot of the local control plane (`tessera snapshot`) replayed offline
(`tessera simulate snapshot`): the replay refuses the pod the live extender refused, with the
same reason code and numbers it wrote on the pod, and a what-if edit (a higher limit) admits it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject
from extender.policy.waiting import as_written
from extender.status import ADMITTED_CONDITION
from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import gpu_cluster
from tests.integration.test_kubectl_plugin import bound

pytestmark = pytest.mark.integration


async def tessera(*argv: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tessera", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


def live_refusal(pod: JsonObject) -> tuple[str, str] | None:
    """(reason code, numbers) of the refusal the live extender wrote on the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == ADMITTED_CONDITION and condition.get("status") == "False":
            return as_written(str(condition["reason"]), str(condition["message"]))
    return None


async def test_a_snapshot_replays_the_live_extenders_refusal_and_a_what_if_admits(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 1}})
        await env.submit(queue, 1, "first")
        await wait_until(lambda: bound(env, 1), timeout=60, interval=0.2, what="the first pod bound")
        await env.submit(queue, 1, "second")

        async def refused() -> tuple[str, str] | None:
            pods = {p["metadata"]["name"]: p for p in await env.pods()}
            return live_refusal(pods["second-0"]) if "second-0" in pods else None

        live_code, live_reason = await wait_until(refused, timeout=60, interval=0.2, what="the refusal")
        assert live_code == "over_limit"
        snapshot = tmp_path / "cluster.json"
        out = await tessera("snapshot", "--kubeconfig", str(local_cluster.kubeconfig), "-o", str(snapshot))
        assert out.startswith(f"[tessera] snapshot {snapshot}: ")
        replay = [
            "simulate",
            "snapshot",
            str(snapshot),
            "--driver",
            env.driver,
            "--scheduler-name",
            env.scheduler_name,
        ]

        decided = json.loads(await tessera(*replay, "--json"))
        ours = [d for d in decided["admission"] if d["pod"].startswith(f"{namespace}/")]
        assert ours == [
            {
                "pod": f"{namespace}/second-0",
                "queue": queue,
                "admitted": False,
                "code": live_code,
                "reason": live_reason,
            }
        ]
        # What if the limit were 2: 1 + 1 <= 2, admitted (and nothing to reclaim: a GPU is free).
        decided = json.loads(await tessera(*replay, "--json", "--limit", f"{queue}=2"))
        (what_if,) = [d for d in decided["admission"] if d["pod"].startswith(f"{namespace}/")]
        assert what_if["admitted"] is True
        text = await tessera(*replay)
        assert f"  {namespace}/second-0 [{queue}]: refused (over_limit): {live_reason}" in text.splitlines()
