"""`kubectl tessera` on the real control plane: the queue table, why a pod waits, its place in
line and who holds which GPU, read from the API and the extender's `/status/queues`; and the
plugin run as a process, with the extender unreachable (the report is optional for `queues`).
Two clusters: a queue at its limit (a lone pod refused), and a queue tree with a borrowing child
on quarter GPUs and a gang held back whole (the tree, the gang's state, fractions, a line of 2)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject
from extender.status import ADMITTED_CONDITION
from tessera.dev.localcluster import LocalCluster, wait_until
from tessera.kubectl import Options, run
from tests.integration.extender_harness import QUARTER_TEMPLATE, GpuCluster, gpu_cluster

pytestmark = pytest.mark.integration


def refused(pod: JsonObject) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == ADMITTED_CONDITION and c.get("status") == "False" for c in conditions)


async def plugin(*argv: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import sys; from tessera.kubectl import main; sys.exit(main(sys.argv[1:]))",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    return process.returncode or 0, out.decode(), err.decode()


async def test_the_plugin_explains_a_pod_held_at_its_queues_limit(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        # Limit 1 GPU: the first pod runs on one of the 2 GPUs; the second asks 1 + 1 > 1.
        queue = await env.create_queue("capped", resources={"gpu": {"quota": 1, "limit": 1}})
        await env.submit(queue, 1, "first")
        await wait_until(lambda: bound(env, 1), timeout=60, interval=0.2, what="the first pod bound")
        await env.submit(queue, 1, "second")

        async def second_refused() -> bool | None:
            return any(p["metadata"]["name"] == "second-0" and refused(p) for p in await env.pods()) or None

        await wait_until(second_refused, timeout=60, interval=0.2, what="the second pod refused")
        options = Options(str(local_cluster.kubeconfig), env.url, "unused", "unused", namespace, env.driver)

        async def queue_row() -> list[str] | None:
            lines, note = await run(k8s, options, "queues", "")
            assert note == ""
            row = next(line.split() for line in lines if line.startswith(queue))
            return row if row[5] == "1" else None  # the Queue status written with allocated 1

        # QUEUE PRIO QUOTA LIMIT WEIGHT ALLOC FAIR BORROWED PENDING WAITING PODS
        row = await wait_until(queue_row, timeout=30, interval=0.2, what="the queue's status")
        assert row[2:6] == ["1", "1", "1", "1"] and row[7] == "0" and row[-1] == "1"

        why, _ = await run(k8s, options, "why", "second-0")
        assert why[0] == f"pod {namespace}/second-0: Pending, not bound"
        assert any(line.startswith("admission: waiting (QueueAtLimit): ") for line in why), why
        assert (
            "  would let it run: waits for the queue's running pods to finish, or for its limit to be raised"
            in why
        )
        assert f"place in line: 1 of 1 pending in queue {queue} (no room planned for it yet)" in why
        assert any(line.startswith("events (newest last):") for line in why), why

        position, _ = await run(k8s, options, "position", "second-0")
        assert (
            position[0]
            == f"pod {namespace}/second-0: 1 of 1 pending in queue {queue} (order: priority, then creation)"
        )
        assert position[2].split()[:2] == ["1", "*"] and position[2].split()[-1] == "over_limit"

        gpus, _ = await run(k8s, options, "gpus", "")
        held = [line for line in gpus if f"{namespace}/first-0" in line]
        assert len(held) == 1 and held[0].split()[0] == env.nodes[0] and held[0].split()[4] == "1.00", gpus
        assert len(gpus) == 3  # the header and the node's 2 GPUs

        # As a process, the extender unreachable: the table still comes, its pods column unknown.
        code, out, err = await plugin(
            "queues", "--kubeconfig", str(local_cluster.kubeconfig), "--extender-url", "http://127.0.0.1:9"
        )
        assert code == 0, err
        assert next(line for line in out.splitlines() if line.startswith(queue)).endswith("?")
        assert "no report from the extender (http://127.0.0.1:9)" in err
        # `position` needs the report: it says so and fails.
        code, out, err = await plugin(
            "position", "second-0", "-n", namespace, "--kubeconfig", str(local_cluster.kubeconfig),
            "--extender-url", "http://127.0.0.1:9",
        )  # fmt: skip
        assert code == 1 and "no report from the extender" in err and out == ""


async def bound(env: GpuCluster, count: int) -> bool | None:
    return sum((await env.bound_by_queue()).values()) == count or None


async def test_the_plugin_shows_a_tree_a_gang_held_whole_and_quarter_gpus(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2, shareable=True) as env:
        # org holds two children: x (quota 0: all it holds is borrowed) runs two quarter GPUs;
        # y (quota 1, limit 1) gets a Job of 2 whole GPUs admitted only whole (min-members 2):
        # 0 allocated + 2 asked > its limit 1, so both pods wait.
        org = await env.create_queue("org")
        x = await env.create_queue("x", parent=org, resources={"gpu": {"quota": 0}})
        y = await env.create_queue("y", parent=org, resources={"gpu": {"quota": 1, "limit": 1}})
        await env.submit(x, 2, "quarter", template=QUARTER_TEMPLATE)
        await wait_until(lambda: bound(env, 2), timeout=60, interval=0.2, what="the quarter pods bound")
        await env.create_job(y, "gang", parallelism=2, min_members=2)

        async def gang_refused() -> list[str] | None:
            held = sorted(p["metadata"]["name"] for p in await env.pods() if refused(p))
            return held if len(held) == 2 else None

        gang = await wait_until(gang_refused, timeout=60, interval=0.2, what="the gang refused")
        options = Options(str(local_cluster.kubeconfig), env.url, "unused", "unused", namespace, env.driver)

        async def tree() -> dict[str, list[str]] | None:
            lines, _ = await run(k8s, options, "queues", "")
            # QUEUE PRIO QUOTA LIMIT WEIGHT ALLOC FAIR BORROWED PENDING WAITING PODS
            rows = {line.split()[0]: line.split() for line in lines[1:] if line.split()[0] in (org, x, y)}
            # y: 2 GPUs pending, asked by one waiting workload (the gang): the Queue status, which
            # the extender writes a moment after the report lists the gang's 2 pods.
            return rows if rows.get(y, [""])[8:] == ["2", "1", "2"] else None

        rows = await wait_until(tree, timeout=30, interval=0.2, what="y's gang in its status and the report")
        lines, _ = await run(k8s, options, "queues", "")
        ours = [line for line in lines[1:] if line.split()[0] in (org, x, y)]
        # The children indented under their parent, by name.
        assert [line.split()[0] for line in ours] == [org, x, y]
        assert [line[: len(line) - len(line.lstrip())] for line in ours] == ["", "  ", "  "]
        # x: 2 x 0.25 = 0.5 allocated, all of it beyond its quota of 0.
        assert rows[x][2] == "0" and rows[x][5] == "0.5" and rows[x][7] == "0.5", rows[x]
        # y: quota 1, limit 1, nothing allocated.
        assert rows[y][2:6] == ["1", "1", "1", "0"], rows[y]
        # org: what its children hold, 0.5, all borrowed (it has no quota of its own).
        assert rows[org][5] == "0.5" and rows[org][7] == "0.5", rows[org]

        # The gang's pods in their queue's line: equal priority, so by creation (then name).
        positions = {pod: (await run(k8s, options, "position", pod))[0] for pod in gang}
        ahead, last = sorted(gang, key=lambda pod: "2 of 2" in positions[pod][0])
        order = f"pending in queue {y} (order: priority, then creation)"
        assert positions[ahead][0] == f"pod {namespace}/{ahead}: 1 of 2 {order}"
        assert positions[last][0] == f"pod {namespace}/{last}: 2 of 2 {order}"
        # The header, then the pod ahead of it and itself, marked.
        assert [row.split()[:2] for row in positions[last][2:]] == [["1", f"{namespace}/{ahead}"], ["2", "*"]]

        why, _ = await run(k8s, options, "why", last)
        assert why[0] == f"pod {namespace}/{last}: Pending, not bound"
        assert any(line.startswith("admission: waiting (QueueAtLimit): ") for line in why), why
        assert "workload: Job gang: 2 pods, 0 bound, admitted whole at 2 (min-members)" in why, why
        assert f"place in line: 2 of 2 pending in queue {y} (no room planned for it yet)" in why, why

        gpus, _ = await run(k8s, options, "gpus", "")
        # NODE GPU MODEL... MEMORY USED HELD BY: both quarters on one GPU (placement keeps the
        # other whole), each 20Gi of 80Gi = 0.25, 0.50 used in all.
        shared = [line for line in gpus if f"{namespace}/quarter-" in line]
        assert len(shared) == 1, gpus
        assert shared[0].count(" 0.25") == 2 and " 0.50 " in shared[0], shared[0]
        assert len(gpus) == 3  # the header and the node's 2 GPUs
