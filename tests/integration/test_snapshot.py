"""A snapshot of the local control plane (`tessera snapshot`) replayed offline
(`tessera simulate snapshot`): the replay decides as the live extender did on every pending pod,
with the reason code and numbers it wrote on each - a pod refused at its queue's limit, and one
admitted that kube-scheduler found no node for (it waits for GPUs to come free) - and a what-if
edit (a higher limit) admits the refused one."""

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


def live_decision(pod: JsonObject) -> tuple[bool, str, str] | None:
    """(admitted, reason code, numbers) of what the live extender wrote on the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == ADMITTED_CONDITION:
            return (
                condition["status"] == "True",
                *as_written(str(condition["reason"]), str(condition["message"])),
            )
    return None


async def test_a_snapshot_replays_the_live_extenders_refusal_and_a_what_if_admits(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, tmp_path: Path
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        # capped (quota and limit 1) and open (no quota) each run a pod on one of the 2 GPUs; a
        # second pod of capped asks 1 + 1 > its limit 1: refused. A second pod of open is
        # admitted (no limit) but fits no node: kube-scheduler finds none, and the extender
        # writes why it waits.
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 1}})
        open_queue = await env.create_queue("open")
        await env.submit(queue, 1, "first")
        await env.submit(open_queue, 1, "open-first")
        await wait_until(lambda: bound(env, 2), timeout=60, interval=0.2, what="the first pods bound")
        await env.submit(queue, 1, "second")
        await env.submit(open_queue, 1, "open-second")

        async def written() -> dict[str, tuple[bool, str, str]] | None:
            pods = {f"{namespace}/{p['metadata']['name']}": live_decision(p) for p in await env.pods()}
            said = {key: decision for key, decision in pods.items() if decision is not None}
            return said if len(said) == 2 else None

        live = await wait_until(written, timeout=60, interval=0.2, what="both pending pods judged")
        live_code, live_reason = live[f"{namespace}/second-0"][1:]
        assert live_code == "over_limit"
        assert live[f"{namespace}/open-second-0"][:2] == (True, "waiting_for_gpus")
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
        ours = {d["pod"]: d for d in decided["admission"] if d["pod"].startswith(f"{namespace}/")}
        assert {pod: (d["admitted"], d["code"], d["reason"]) for pod, d in ours.items()} == live
        assert ours[f"{namespace}/open-second-0"]["no_node"] is True
        # What if the limit were 2: 1 + 1 <= 2, admitted (and nothing to reclaim: a GPU is free).
        decided = json.loads(await tessera(*replay, "--json", "--limit", f"{queue}=2"))
        (what_if,) = [d for d in decided["admission"] if d["pod"] == f"{namespace}/second-0"]
        assert what_if["admitted"] is True
        text = await tessera(*replay)
        assert f"  {namespace}/second-0 [{queue}]: refused (over_limit): {live_reason}" in text.splitlines()
