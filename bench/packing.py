"""Benchmark 9: packing on the real control plane beside the simulator's deployed mode.

A slice of the Alibaba trace - ``--nodes`` nodes drawn with the seed from the trace's node list
(their GPU model and count, CPU and memory), and the trace's pods in the paper's shuffled order,
cut at random to ``--arrival`` % of the slice's GPUs (``tessera.simulate.packing.arrivals``) - is
replayed twice in the same order:

(a) **end to end**: each node a fake Node with the trace's allocatable CPU and memory and the
    ResourceSlices the DRA driver publishes for its GPUs (``tessera.simulate.kube``); each pod
    created in turn - GPU pods with a claim from a ResourceClaimTemplate (whole GPUs by count,
    fractions as a memory request, model lists as CEL selectors), GPU-less pods plain - and
    scheduled by kube-scheduler with the shipped profile (``tessera.cli.SCHEDULER_PROFILE``,
    extender weight ``EXTENDER_WEIGHT``) calling the extender (``python -m extender``), the DRA
    allocator in kube-scheduler choosing the devices. The next pod is created once this one is
    bound, or marked unschedulable with every node named ("0/N nodes are available"): resources
    only shrink in this replay, so such a pod never fits later.
(b) **simulated**: ``tessera simulate``'s ``tessera-deployed`` replay of the same nodes and
    arrivals (the baseline measured in the same run), and its ``tessera`` (policy alone) beside.

Reported: GPU allocation at the target arrival (the paper's measure: the mean allocation over
the pods whose arrival rounds to it), the final allocation and the pods placed, and the end to
end figure minus the deployed simulation's (target: within 0.5 point).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes_asyncio.client import ApiClient

from contract.kube import mapping, sequence
from contract.names import GPU_MILLI
from extender.kubeapi import JsonObject, request
from extender.policy.placement import rounded_mix
from tessera.cli import SCHEDULER_PROFILE, extender_config
from tessera.dev.localcluster import REPO_ROOT, LocalCluster, api_client, create_fake_node, free_port
from tessera.simulate.cluster import Cluster
from tessera.simulate.deployed import SHIPPED_PROFILE, STOCK_PROFILE, DeployedPlacer, SchedulerProfile
from tessera.simulate.kube import claim_template, node_slices, pod_object, template_name
from tessera.simulate.packing import allocation_at, arrivals, replay_packing
from tessera.simulate.policies import DEPLOYED
from tessera.simulate.report import format_table
from tessera.simulate.trace import (
    DEFAULT_PODS_FILE,
    NODES_FILE,
    SimNode,
    SimPod,
    default_trace_dir,
    load_nodes,
    load_pods,
)

from . import SMOKE_HELP

log = logging.getLogger(__name__)

SCHEDULER = "tessera"
NAMESPACE = "trace"
RESOURCE_API = "/apis/resource.k8s.io/v1"
CLIENT_QPS = 200
CLIENT_BURST = 400
POD_TIMEOUT_S = 60.0
POLL_S = 0.05
SMOKE_NODES = 6


@dataclass
class EndToEnd:
    """What the cluster did with each arriving pod, in order."""

    capacity_milli: int
    placed: list[bool] = field(default_factory=list)
    samples: list[tuple[float, float]] = field(default_factory=list)  # (arrival %, allocation %)
    seconds: float = 0.0

    def allocation_at(self, target_pct: float) -> float:
        return allocation_at(target_pct, self.samples, self.samples[-1][1] if self.samples else 0.0)


@dataclass(frozen=True)
class PackingRow:
    run: str
    allocation_pct: float
    final_pct: float
    placed: int
    pods: int
    seconds: float


def trace_slice(nodes: Sequence[SimNode], count: int, seed: int) -> list[SimNode]:
    """``count`` nodes of the trace drawn with the seed, in name order."""
    return sorted(random.Random(f"slice:{seed}").sample(list(nodes), count), key=lambda node: node.name)


def _unschedulable(pod: JsonObject) -> bool:
    """Marked unschedulable after a full pass over the nodes (not while its claim is made)."""
    for condition in sequence(mapping(pod.get("status")).get("conditions")):
        condition = mapping(condition)
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "nodes are available" in str(condition.get("message", ""))
    return False


async def _outcome(api: ApiClient, name: str) -> bool:
    """True once the pod is bound, False once it is unschedulable on every node."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    deadline = time.monotonic() + POD_TIMEOUT_S
    while time.monotonic() < deadline:
        pod = await request(api, "GET", path)
        if mapping(pod.get("spec")).get("nodeName"):
            return True
        if _unschedulable(pod):
            return False
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"pod {name} neither bound nor unschedulable after {POD_TIMEOUT_S:.0f} s")


async def install(api: ApiClient, nodes: Sequence[SimNode], pods: Sequence[SimPod]) -> None:
    """Device classes, the nodes with their slices, the namespace and one template per GPU request."""
    for device_class in yaml.safe_load_all((REPO_ROOT / "manifests" / "deviceclasses.yaml").read_text()):
        if device_class:
            await request(api, "POST", f"{RESOURCE_API}/deviceclasses", body=device_class)
    for node in nodes:
        await create_fake_node(
            api, node.name, cpu=f"{node.cpu_milli}m", memory=f"{node.memory_mib}Mi", pods="1000"
        )
        for resource_slice in node_slices(node):
            await request(api, "POST", f"{RESOURCE_API}/resourceslices", body=resource_slice)
    await request(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    templates = {template_name(pod.demand): pod.demand for pod in pods if pod.demand.count}
    for demand in templates.values():
        body = claim_template(NAMESPACE, demand)
        await request(api, "POST", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaimtemplates", body=body)


async def replay_end_to_end(api: ApiClient, nodes: Sequence[SimNode], pods: Sequence[SimPod]) -> EndToEnd:
    """Creates the pods one by one in order, each once the previous one is decided."""
    result = EndToEnd(capacity_milli=GPU_MILLI * sum(node.gpus for node in nodes))
    arrived = allocated = 0
    started = time.perf_counter()
    for index, pod in enumerate(pods):
        name = f"p{index:05d}"
        body = pod_object(NAMESPACE, name, pod.demand, SCHEDULER)
        await request(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=body)
        placed = await _outcome(api, name)
        arrived += pod.gpu_milli
        allocated += pod.gpu_milli if placed else 0
        result.placed.append(placed)
        capacity = result.capacity_milli
        result.samples.append((100.0 * arrived / capacity, round(100.0 * allocated / capacity, 2)))
        if index % 50 == 49:
            log.info("%d/%d pods, allocation %.2f%%", index + 1, len(pods), result.samples[-1][1])
    result.seconds = time.perf_counter() - started
    return result


Choice = tuple[str, tuple[int, ...]] | None  # (node, GPU indexes) a pod got, or None: unscheduled


async def choices(api: ApiClient, count: int) -> list[Choice]:
    """Where each of the ``count`` pods went, and which GPUs the DRA allocator gave its claim."""
    pods = await request(api, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods")
    claims = await request(api, "GET", f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims")
    devices: dict[str, tuple[int, ...]] = {}
    for claim in claims.get("items") or []:
        allocation = mapping(mapping(claim.get("status")).get("allocation"))
        results = sequence(mapping(allocation.get("devices")).get("results"))
        devices[str(mapping(claim.get("metadata")).get("name"))] = tuple(
            int(str(mapping(result).get("device", "")).removeprefix("gpu-")) for result in results
        )
    by_name: dict[str, Choice] = {}
    for pod in pods.get("items") or []:
        node = mapping(pod.get("spec")).get("nodeName")
        if node:
            statuses = sequence(mapping(pod.get("status")).get("resourceClaimStatuses"))
            held = [g for s in statuses for g in devices.get(str(mapping(s).get("resourceClaimName")), ())]
            by_name[str(mapping(pod.get("metadata")).get("name"))] = (str(node), tuple(sorted(held)))
    return [by_name.get(f"p{index:05d}") for index in range(count)]


@dataclass(frozen=True)
class Agreement:
    """How often the deployed model, fed the cluster's own earlier choices, allowed its next one."""

    pods: int
    nodes_agreed: int  # bound where the model's best nodes include it, or unscheduled where it fits nowhere
    placed: int
    devices_agreed: int  # of the placed pods, given the GPUs the model's first fit gives


def agreement(
    nodes: Sequence[SimNode], order: Sequence[SimPod], got: Sequence[Choice], profile: SchedulerProfile
) -> Agreement:
    """Replays the cluster's choices through ``DeployedPlacer``, checking each against the model."""
    cluster = Cluster(nodes, rounded_mix({}))
    placer = DeployedPlacer(cluster, profile, random.Random(0))
    index_of = {node.name: index for index, node in enumerate(nodes)}
    nodes_agreed = placed = devices_agreed = 0
    for pod, choice in zip(order, got, strict=True):
        best = placer.arrive(pod.demand)
        if choice is None:
            nodes_agreed += not best
            continue
        index, gpus = index_of[choice[0]], choice[1]
        nodes_agreed += index in best
        placed += 1
        devices_agreed += gpus == placer.devices(index, pod.demand)
        cluster.place(index, pod.demand, gpus)
    return Agreement(len(order), nodes_agreed, placed, devices_agreed)


def agreement_line(agreed: Agreement) -> str:
    return (
        "the cluster's choices against the model, pod by pod: node among the model's best "
        f"{agreed.nodes_agreed}/{agreed.pods}, "
        f"GPUs the allocator's first fit {agreed.devices_agreed}/{agreed.placed}"
    )


@contextlib.asynccontextmanager
async def deployed_cluster(
    nodes: Sequence[SimNode], pods: Sequence[SimPod], profile: Mapping[str, object]
) -> AsyncIterator[ApiClient]:
    """A local control plane with the slice installed, the extender and the shipped scheduler profile."""
    cluster = LocalCluster(controller_manager_qps=CLIENT_QPS, controller_manager_burst=CLIENT_BURST)
    await asyncio.to_thread(cluster.start)
    try:
        api = await api_client(cluster.kubeconfig)
        async with api:
            await install(api, nodes, pods)
            port = free_port()
            extender = cluster.spawn(
                "tessera-extender",
                [
                    sys.executable,
                    "-m",
                    "extender",
                    f"--kubeconfig={cluster.kubeconfig}",
                    "--listen-address=127.0.0.1",
                    f"--port={port}",
                    f"--scheduler-name={SCHEDULER}",
                ],
            )
            await asyncio.to_thread(
                cluster.wait_healthy, extender, f"http://127.0.0.1:{port}/readyz", tls=False
            )
            await asyncio.to_thread(
                cluster.start_scheduler,
                SCHEDULER,
                [extender_config(port)],
                CLIENT_QPS,
                CLIENT_BURST,
                profile,
            )
            yield api
    finally:
        await asyncio.to_thread(cluster.stop)


# The kube-scheduler profile run end to end, and what the simulator models of it: the chart's, or
# kube-scheduler's default scoring plugins (the extender at the same weight).
SETUPS: dict[str, tuple[Mapping[str, object], SchedulerProfile]] = {
    "shipped": (SCHEDULER_PROFILE, SHIPPED_PROFILE),
    "stock": ({}, STOCK_PROFILE),
}


def simulated_rows(
    nodes: Sequence[SimNode], pods: Sequence[SimPod], seed: int, arrival: float, profile: SchedulerProfile
) -> list[PackingRow]:
    rows = []
    for policy, label in (
        (DEPLOYED, f"simulated, {DEPLOYED} (as deployed)"),
        ("tessera", "simulated, tessera (policy alone)"),
    ):
        result = replay_packing(nodes, pods, policy, seed=seed, target_arrival_pct=arrival, profile=profile)
        rows.append(
            PackingRow(
                label,
                result.allocation_pct,
                result.final_allocation_pct,
                result.pods_placed,
                result.pods_arrived,
                result.seconds,
            )
        )
    return rows


def packing_table(rows: Sequence[PackingRow], arrival: float) -> str:
    headers = ["run", f"GPU alloc % at {arrival:g}% arrival", "final alloc %", "pods placed", "wall s"]
    body = [
        [
            row.run,
            f"{row.allocation_pct:.2f}",
            f"{row.final_pct:.2f}",
            f"{row.placed}/{row.pods}",
            f"{row.seconds:.0f}",
        ]
        for row in rows
    ]
    return format_table(headers, body)


async def run_packing_async(
    nodes: Sequence[SimNode], pods: Sequence[SimPod], seed: int, arrival: float, setup: str = "shipped"
) -> tuple[list[PackingRow], Agreement]:
    scheduler_profile, modelled = SETUPS[setup]
    order = arrivals(nodes, pods, "paper", seed, arrival)
    simulated = simulated_rows(nodes, pods, seed, arrival, modelled)
    async with deployed_cluster(nodes, order, scheduler_profile) as api:
        result = await replay_end_to_end(api, nodes, order)
        got = await choices(api, len(order))
    # The final state, read back from the API, must be what the per-pod outcomes said.
    if [choice is not None for choice in got] != result.placed:
        raise RuntimeError("a pod judged unschedulable was bound later")
    final = sum(pod.gpu_milli for pod, choice in zip(order, got, strict=True) if choice is not None)
    end_to_end = PackingRow(
        "end to end (kube-scheduler + extender + DRA allocator)",
        result.allocation_at(arrival),
        100.0 * final / result.capacity_milli,
        sum(result.placed),
        len(order),
        result.seconds,
    )
    return [end_to_end, *simulated], agreement(nodes, order, got, modelled)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50, help="trace nodes in the slice (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="slice and order (default 0)")
    parser.add_argument("--arrival", type=float, default=130.0, help="arrival target, %% of the slice's GPUs")
    parser.add_argument("--trace-dir", type=Path, default=default_trace_dir(), help="the trace CSVs")
    parser.add_argument(
        "--scheduler-profile",
        choices=sorted(SETUPS),
        default="shipped",
        help="the chart's profile or kube-scheduler's default scoring plugins (default %(default)s)",
    )
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} ({SMOKE_NODES} trace nodes)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes = SMOKE_NODES
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.trace_dir is None:
        print("error: no trace directory found; pass --trace-dir", file=sys.stderr)
        return 2
    nodes = trace_slice(load_nodes(args.trace_dir / NODES_FILE), args.nodes, args.seed)
    pods = load_pods(args.trace_dir / DEFAULT_PODS_FILE)
    rows, agreed = asyncio.run(
        run_packing_async(nodes, pods, args.seed, args.arrival, args.scheduler_profile)
    )
    profile = SETUPS[args.scheduler_profile][1].describe()
    gpus = sum(node.gpus for node in nodes)
    slice_text = f"{args.nodes} trace nodes ({gpus} GPUs), seed {args.seed}"
    print(f"\n[9] packing end to end, {slice_text}, scheduler: {profile}")
    print(packing_table(rows, args.arrival))
    print(
        f"end to end - simulated as deployed: {rows[0].allocation_pct - rows[1].allocation_pct:+.2f} points"
    )
    print(agreement_line(agreed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
