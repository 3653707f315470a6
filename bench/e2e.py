"""Benchmark 2: time until P single-GPU pods are bound on the real local control plane.

N fake nodes carry 8 simulated H100s each, published as the DRA driver publishes them
(``dra_driver.slices.build_slices`` over the ``h100x8`` profile, written directly in bulk), with
the DeviceClasses of ``manifests/deviceclasses.yaml``. P pods, each with one GPU from a
ResourceClaimTemplate, are created concurrently; the clock runs from the first create until the
last pod has ``spec.nodeName``. Two kube-schedulers with the same client QPS/burst take turns on the
same nodes: (a) plain, (b) calling the Tessera extender (``python -m extender`` in its own process;
filter and prioritize, nodeCacheCapable; it runs only during (b)), configured as the chart ships
Tessera's scheduler (``tessera.cli.extender_config`` and ``SCHEDULER_PROFILE``: weight 5, every
feasible node scored, the CPU/memory spreading scores off; kube-scheduler binds). (c) The same
scheduler configuration calling a do-nothing extender (``bench.servers fast-floor``): what any
extender costs before it does any work (``--no-floor`` leaves it out). Between the runs every
pod is force-deleted and the run waits until its claims are gone, so each run finds the same
free capacity. ``--rounds N`` alternates a, b, c, c, b, a, ... and reports each scheduler's
median round, so a change in background load hits all alike; the CPU seconds the scheduler, the
extender and the control plane spent during each run, and the apiserver's requests per pod, are
reported too. When ``hack/build-kai.sh`` built it, KAI Scheduler races as a further contender
on the same nodes with the same pods (``bench.kai``; its pods in Tessera's default queue,
mirrored), its processes running only during its rounds.

The local kube-controller-manager runs with the same client QPS/burst: with its default 20 QPS,
creating the claims from the templates would pace both runs alike and hide the schedulers.

Anchor: KAI Scheduler's published scale test fills 500 nodes with 4000 single-GPU jobs in
6 min 38 s (about 10 pods/s). ``--profile-extender FILE`` (or TESSERA_BENCH_PROFILE_EXTENDER)
runs the extender under cProfile and prints its top functions after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import logging
import math
import os
import pstats
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, NamedTuple, Protocol, TypeVar

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import kube_config
from prometheus_client.parser import text_string_to_metric_families

from contract.names import DEFAULT_QUEUE, DRIVER_NAME, QUEUE_LABEL
from dra_driver.profiles.nvidia.simulated import PROFILE_DIR, SimulatedDiscovery
from dra_driver.slices import NodeRef, SharingMode, build_slices
from extender.kubeapi import JsonObject, KubeError, request, request_bytes, watch_lines
from extender.policy.fairness import QueueSpec
from tessera.cli import INSTALL_FIRST, SCHEDULER_PROFILE, extender_config
from tessera.dev.localcluster import (
    REPO_ROOT,
    LocalCluster,
    NodeLayout,
    SchedulerHandle,
    create_fake_node,
    free_port,
    wait_until,
)
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import ServerProcess
from .kai import DEFAULT_ACTIONS, KAI_SCHEDULER, Kai, KaiVariant, find_kai, kai_pod, skip_reason

log = logging.getLogger(__name__)

PROFILE = PROFILE_DIR / "h100x8.yaml"
DEVICE_CLASS = "gpu.tessera.dev"
TEMPLATE = "one-gpu"
GPUS_PER_NODE = 8
RESOURCE_API = "/apis/resource.k8s.io/v1"
SLICES_PATH = f"{RESOURCE_API}/resourceslices"
CLIENT_QPS = 500
CLIENT_BURST = 1000
SAME_CLIENT = KaiVariant(
    f"KAI Scheduler, client QPS/burst {CLIENT_QPS}/{CLIENT_BURST}", client=(CLIENT_QPS, CLIENT_BURST)
)
CREATE_CONCURRENCY = 48
SMOKE_NODES, SMOKE_PODS = 2, 16
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
PLAIN_SCHEDULER = "bench-plain"
TESSERA_SCHEDULER = "bench-tessera"
FLOOR_SCHEDULER = "bench-floor"
FLOOR_LABEL = "kube-scheduler + do-nothing extender"
FLOOR_LEAVES_OUT = ("preemptVerb",)  # what a do-nothing extender does not serve
PROFILE_ENV = "TESSERA_BENCH_PROFILE_EXTENDER"
KAI_ANCHOR = (
    "KAI Scheduler's published scale test: 500 nodes, 4000 single-GPU jobs in 6 min 38 s (10.1 pods/s)"
)


# -- pure helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds the scheduler, the extender and the control plane it shares the machine with
    (etcd, kube-apiserver, kube-controller-manager) spent during one run."""

    scheduler_s: float = 0.0
    extender_s: float = 0.0
    control_plane_s: float = 0.0

    def __sub__(self, before: CpuUse) -> CpuUse:
        return CpuUse(
            self.scheduler_s - before.scheduler_s,
            self.extender_s - before.extender_s,
            self.control_plane_s - before.control_plane_s,
        )


@dataclass(frozen=True)
class BindRun:
    """One scheduler's run: pods submitted and bound, and when (seconds from the first create)."""

    scheduler: str
    pods: int
    created_s: float
    bound_s: float
    cpu: CpuUse = CpuUse()
    # The apiserver's requests during the run by "VERB resource[/subresource]", all clients.
    api_calls: Mapping[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.bound_s

    @property
    def pods_per_s(self) -> float:
        return self.pods / self.bound_s if self.bound_s > 0 else 0.0


class Timed(Protocol):
    @property
    def seconds(self) -> float: ...


R = TypeVar("R")
T = TypeVar("T", bound=Timed)
C = TypeVar("C")


def median_run(runs: Sequence[T]) -> T:
    """The run with the median time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]


@dataclass(frozen=True)
class Rounds(Generic[T]):
    """Every run of each contender; the figures are those of each one's median round. KAI's runs
    are keyed by the label of the way it ran (``bench.kai.KaiVariant``); none when it was not built."""

    plain_runs: tuple[T, ...]
    tessera_runs: tuple[T, ...]
    kai_runs: Mapping[str, tuple[T, ...]] = field(default_factory=dict, kw_only=True)

    @property
    def plain(self) -> T:
        return median_run(self.plain_runs)

    @property
    def tessera(self) -> T:
        return median_run(self.tessera_runs)

    @property
    def kai(self) -> dict[str, tuple[T, tuple[T, ...]]]:
        """Per KAI variant: its median run and all of its runs."""
        return {label: (median_run(runs), runs) for label, runs in self.kai_runs.items() if runs}


def seconds_list(values: Iterable[float]) -> str:
    return ", ".join(f"{value:.1f}" for value in values)


@dataclass(frozen=True)
class E2EResult(Rounds[BindRun]):
    nodes: int
    pods: int
    qps: int
    burst: int
    # The rounds of the scheduler configured as Tessera's but calling a do-nothing extender.
    floor_runs: tuple[BindRun, ...] = field(default=(), kw_only=True)

    @property
    def floor(self) -> BindRun | None:
        return median_run(self.floor_runs) if self.floor_runs else None

    def contenders(self) -> list[tuple[str, BindRun, tuple[BindRun, ...]]]:
        """Label, median run and every run of each contender, plain first."""
        floor = [(FLOOR_LABEL, self.floor, self.floor_runs)] if self.floor is not None else []
        return [
            ("plain kube-scheduler", self.plain, self.plain_runs),
            ("kube-scheduler + Tessera", self.tessera, self.tessera_runs),
            *floor,
            *((label, run, runs) for label, (run, runs) in self.kai.items()),
        ]

    @property
    def ratio(self) -> float:
        """Throughput with the extender over throughput without, median rounds (the do-nothing
        extender's own ratio, `floor`, bounds it on a machine the control plane saturates)."""
        return self.tessera.pods_per_s / self.plain.pods_per_s if self.plain.pods_per_s else 0.0

    @property
    def vs_floor(self) -> float | None:
        """Tessera's throughput over the do-nothing extender's, median rounds: what Tessera's own
        work costs behind the same scheduler configuration (None without floor rounds)."""
        if self.floor is None or not self.floor.pods_per_s:
            return None
        return self.tessera.pods_per_s / self.floor.pods_per_s


def e2e_table(result: E2EResult) -> str:
    headers = [
        "scheduler",
        "nodes",
        "GPUs",
        "pods",
        "all created s",
        "all bound s",
        "each round s",
        "pods/s",
        "scheduler CPU s",
        "extender CPU s",
        "control plane CPU s",
        "vs plain",
        "vs floor",
    ]
    floor = result.floor
    rows = [
        [
            label,
            str(result.nodes),
            str(result.nodes * GPUS_PER_NODE),
            str(run.pods),
            f"{run.created_s:.1f}",
            f"{run.bound_s:.1f}",
            seconds_list(r.bound_s for r in runs),
            f"{run.pods_per_s:.1f}",
            f"{run.cpu.scheduler_s:.1f}",
            f"{run.cpu.extender_s:.1f}",
            f"{run.cpu.control_plane_s:.1f}",
            f"{run.pods_per_s / result.plain.pods_per_s:.2f}x" if result.plain.pods_per_s else "-",
            f"{run.pods_per_s / floor.pods_per_s:.2f}x" if floor is not None and floor.pods_per_s else "-",
        ]
        for label, run, runs in result.contenders()
    ]
    vs_floor = result.vs_floor
    floor_line = (
        f"Tessera / floor: {vs_floor:.2f}x (floor: {FLOOR_LABEL}, the scheduler configured as Tessera's)"
        if vs_floor is not None
        else "Tessera / floor: not measured (the do-nothing extender was left out: --no-floor)"
    )
    anchor = (
        f"anchor: {KAI_ANCHOR}; client QPS/burst {result.qps}/{result.burst} for both kube-schedulers "
        f"and the controller-manager; KAI with its operator's (scheduler CPU: its five processes)"
    )
    return f"{format_table(headers, rows)}\n{floor_line}\n{anchor}"


def api_calls_table(result: E2EResult, least_per_pod: float = 0.05) -> str:
    """The apiserver's requests per bound pod in each median round, by verb and resource (kinds
    under ``least_per_pod`` in every column left out): where one scheduler costs the control
    plane more work than the other."""
    runs = [(label.removeprefix("kube-scheduler + "), run) for label, run, _ in result.contenders()]
    kinds = sorted({kind for _, run in runs for kind in run.api_calls})
    rows = [
        [kind, *(f"{run.api_calls.get(kind, 0) / run.pods:.2f}" for _, run in runs)]
        for kind in kinds
        if any(run.api_calls.get(kind, 0) / run.pods >= least_per_pod for _, run in runs)
    ]
    rows.append(["all", *(f"{sum(run.api_calls.values()) / run.pods:.2f}" for _, run in runs)])
    return format_table(["apiserver requests per pod", *(label for label, _ in runs)], rows)


REQUESTS_METRIC = "apiserver_request_total"


def api_request_counts(metrics_text: str) -> Counter[str]:
    """Requests served so far by "VERB resource[/subresource]", from the apiserver's /metrics."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(metrics_text):
        if family.name != REQUESTS_METRIC.removesuffix("_total"):
            continue
        for sample in family.samples:
            if sample.name != REQUESTS_METRIC:
                continue
            labels = sample.labels
            kind = "/".join(part for part in (labels.get("resource"), labels.get("subresource")) if part)
            counts[f"{labels.get('verb', '?')} {kind or '-'}"] += int(sample.value)
    return counts


def claim_template(gpus: int) -> str:
    """The name of the namespace's ResourceClaimTemplate of ``gpus`` whole GPUs (TEMPLATE for one;
    ``BenchCluster.new_namespace`` makes those its ``gpu_counts`` name)."""
    return TEMPLATE if gpus == 1 else f"gpus-{gpus}"


def gpu_pod(namespace: str, name: str, scheduler: str, queue: str | None = None, gpus: int = 1) -> JsonObject:
    """A pause pod holding ``gpus`` whole GPUs through a claim made from ``claim_template(gpus)``;
    for KAI the same pod with KAI's scheduler name and queue label (a pod without a queue is in the
    default queue)."""
    labels = {QUEUE_LABEL: queue} if queue else {}
    container = {
        "name": "main",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "claims": [{"name": "gpu"}]},
    }
    pod: JsonObject = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "schedulerName": scheduler,
            "containers": [container],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template(gpus)}],
        },
    }
    return kai_pod(pod, queue or DEFAULT_QUEUE) if scheduler == KAI_SCHEDULER else pod


SLICE_LAYOUT = "consumable capacity (h100x8 profile, written as the driver publishes it)"


def slice_layout(slices: Iterable[JsonObject]) -> str:
    """How the driver published its GPUs: shareable by capacity, or whole devices only."""
    devices = [device for s in slices for device in (s.get("spec") or {}).get("devices") or []]
    shared = any(device.get("allowMultipleAllocations") for device in devices)
    return "consumable capacity" if shared else "whole devices"


def gpu_slices(node: str) -> list[JsonObject]:
    """The ResourceSlices the simulated DRA driver publishes for one h100x8 node."""
    gpus = SimulatedDiscovery.from_file(PROFILE, node).inventory()
    return build_slices(NodeRef(node), DRIVER_NAME, gpus, SharingMode.CONSUMABLE_CAPACITY, generation=1)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile_summary(path: Path, top: int = 30) -> str:
    """The functions that took the most cumulative time in a cProfile dump."""
    out = io.StringIO()
    pstats.Stats(str(path), stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- the cluster -------------------------------------------------------------------------------


async def bounded(concurrency: int, calls: Iterable[Callable[[], Awaitable[object]]]) -> None:
    """Runs the calls with at most ``concurrency`` in flight; the first error is raised."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Awaitable[object]]) -> None:
        async with semaphore:
            await call()

    await asyncio.gather(*(one(call) for call in calls))


async def bound_pod_events(api: ApiClient, path: str) -> AsyncIterator[tuple[str, JsonObject]]:
    """(event type, pod) for every change of a bound pod under `path` (a pods collection), for
    ever: a watch the server ends is resumed where it stopped; bookmarks are left out."""
    version = ""
    while True:
        query = {"fieldSelector": "spec.nodeName!=", "allowWatchBookmarks": "true"}
        if version:
            query["resourceVersion"] = version
        async for event in watch_lines(api, path, query):
            pod = event.get("object") or {}
            version = (pod.get("metadata") or {}).get("resourceVersion", version)
            if event.get("type") != "BOOKMARK" and pod.get("kind") == "Pod":
                yield event["type"], pod


@dataclass
class BoundPods:
    """Bound pods of one namespace, from a watch of pods with spec.nodeName set; and the bound
    pods that were deleted since the watch began."""

    bound: dict[str, str] = field(default_factory=dict)  # pod name -> queue label ("" without)
    nodes: dict[str, str] = field(default_factory=dict)  # pod name -> the node it was bound to
    deleted: dict[str, str] = field(default_factory=dict)  # likewise, once gone
    bound_at: dict[str, float] = field(default_factory=dict)  # pod name -> when first seen bound (monotonic)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def per_queue(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for queue in self.bound.values():
            counts[queue] = counts.get(queue, 0) + 1
        return counts

    async def follow(self, api: ApiClient, namespace: str) -> None:
        async for kind, pod in bound_pod_events(api, f"/api/v1/namespaces/{namespace}/pods"):
            name = pod["metadata"]["name"]
            async with self.changed:
                queue = (pod["metadata"].get("labels") or {}).get(QUEUE_LABEL, "")
                if kind == "DELETED":
                    self.bound.pop(name, None)
                    self.deleted[name] = queue
                else:
                    self.bound[name] = queue
                    self.nodes[name] = pod["spec"]["nodeName"]
                    self.bound_at.setdefault(name, time.monotonic())
                self.changed.notify_all()

    async def wait_for(self, condition: Callable[[BoundPods], bool], timeout: float, what: str) -> float:
        """Waits until ``condition`` holds; returns the monotonic time it first did."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: condition(self)), timeout)
            except TimeoutError as exc:
                raise TimeoutError(
                    f"timed out after {timeout:.0f}s waiting for {what}; bound now {self.per_queue()}"
                ) from exc
        return time.monotonic()


class BenchCluster:
    """A LocalCluster with GPU nodes, and the schedulers and extender the benchmarks compare."""

    def __init__(self, cluster: LocalCluster, api: ApiClient) -> None:
        self.cluster = cluster
        self.api = api
        self.nodes: list[str] = []
        self.extender_profile: Path | None = None
        self.extender_port = free_port()
        self.floor_port = free_port()
        self.floor: ServerProcess | None = None  # the do-nothing extender, during its rounds
        self.schedulers: dict[str, SchedulerHandle] = {}
        self.kai: Kai | None = None
        self.extender_args: list[str] = []  # flags the extender gets beyond its address and scheduler

    async def install(self, nodes: int | NodeLayout, publish_slices: bool = True) -> None:
        """The manifests, and `nodes` fake GPU nodes (a count: gpu-0000 ...; a layout: its nodes
        with its topology labels); their slices too unless node agents publish them."""
        for manifest in INSTALL_FIRST:
            await asyncio.to_thread(self.cluster.apply, REPO_ROOT / manifest)
        await asyncio.to_thread(self.cluster.wait_established, "crd/queues.scheduling.tessera.dev")
        if isinstance(nodes, NodeLayout):
            labels = nodes.nodes
        else:
            labels = {f"gpu-{index:04d}": {} for index in range(nodes)}
        self.nodes = list(labels)

        async def add_node(node: str) -> None:
            await create_fake_node(self.api, node, labels.get(node))
            for resource_slice in gpu_slices(node) if publish_slices else ():
                await request(self.api, "POST", SLICES_PATH, body=resource_slice)

        await bounded(16, (functools.partial(add_node, node) for node in self.nodes))

    def start_scheduler(self, name: str, with_extender: bool = False) -> None:
        """A kube-scheduler of profile ``name``; ``with_extender``: configured as the chart ships
        Tessera's (``tessera.cli``: the extender entry, weight 5, and the profile's scoring). The
        floor's scheduler is configured the same, its extender entry without the verb a
        do-nothing extender does not serve (preempt)."""
        if name == FLOOR_SCHEDULER:
            entry = extender_config(self.floor_port)
            floor_entry = {key: value for key, value in entry.items() if key not in FLOOR_LEAVES_OUT}
            handle = self.cluster.start_scheduler(
                name, [floor_entry], qps=CLIENT_QPS, burst=CLIENT_BURST, profile=SCHEDULER_PROFILE
            )
        elif with_extender:
            handle = self.cluster.start_scheduler(
                name,
                [extender_config(self.extender_port)],
                qps=CLIENT_QPS,
                burst=CLIENT_BURST,
                profile=SCHEDULER_PROFILE,
            )
        else:
            handle = self.cluster.start_scheduler(name, qps=CLIENT_QPS, burst=CLIENT_BURST)
        self.schedulers[name] = handle

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.extender_port}"

    def start_extender(self, scheduler: str) -> None:
        """``python -m extender`` in its own process (under cProfile when asked), on extender_port."""
        port = self.extender_port
        profiler = ["-m", "cProfile", "-o", str(self.extender_profile)] if self.extender_profile else []
        extender = self.cluster.spawn(
            "tessera-extender",
            [
                sys.executable,
                *profiler,
                "-m",
                "extender",
                f"--kubeconfig={self.cluster.kubeconfig}",
                "--listen-address=127.0.0.1",
                f"--port={port}",
                f"--scheduler-name={scheduler}",
                *self.extender_args,
            ],
        )
        self.cluster.wait_healthy(extender, f"{self.extender_url}/readyz", tls=False)

    async def enable_kai(self, queues: Sequence[QueueSpec]) -> bool:
        """Installs KAI (its objects, ``queues`` mirrored) when it was built; else says why not."""
        install = find_kai()
        if install is None:
            print(skip_reason(), flush=True)
            return False
        self.kai = Kai(self.cluster, install)
        await self.kai.install(self.api, queues)
        log.info("KAI Scheduler %s installed from %s", install.version, install.directory)
        return True

    def cpu_seconds(self, scheduler: str) -> CpuUse:
        """CPU time used so far by the scheduler ``scheduler`` (KAI: its processes together), by
        the extender, if running, and by the control plane."""
        control_plane = sum(
            process_cpu_seconds(c.process.pid) for c in self.cluster.components if c.name in CONTROL_PLANE
        )
        if scheduler == KAI_SCHEDULER:
            kai = self.kai.components if self.kai else []
            return CpuUse(sum(process_cpu_seconds(c.process.pid) for c in kai), control_plane_s=control_plane)
        extenders = [c.process.pid for c in self.cluster.components if c.name == "tessera-extender"]
        if scheduler == FLOOR_SCHEDULER and self.floor is not None:
            extenders = [self.floor.process.pid]
        return CpuUse(
            process_cpu_seconds(self.schedulers[scheduler].component.process.pid),
            sum(map(process_cpu_seconds, extenders)),
            control_plane,
        )

    async def api_requests(self) -> Counter[str]:
        """The apiserver's requests served so far (``api_request_counts``)."""
        return api_request_counts((await request_bytes(self.api, "GET", "/metrics")).decode())

    def stop_extender(self) -> None:
        """Stops the extender (SIGTERM: a clean exit, so cProfile writes its file)."""
        for component in [c for c in self.cluster.components if c.name == "tessera-extender"]:
            component.stop(timeout=30)
            self.cluster.components.remove(component)

    async def new_namespace(self, prefix: str, gpu_counts: Iterable[int] = (1,)) -> str:
        """A fresh namespace with a ResourceClaimTemplate of each count of whole GPUs
        (``claim_template``)."""
        namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
        await request(self.api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        for gpus in sorted(set(gpu_counts)):
            exactly = {"deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": gpus}
            spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
            await request(
                self.api,
                "POST",
                f"{RESOURCE_API}/namespaces/{namespace}/resourceclaimtemplates",
                body={"metadata": {"name": claim_template(gpus)}, "spec": {"spec": spec}},
            )
        return namespace

    async def submit(
        self, namespace: str, scheduler: str, names: Sequence[str], queue: str | None = None
    ) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods"
        pods = [gpu_pod(namespace, name, scheduler, queue) for name in names]
        await bounded(
            CREATE_CONCURRENCY, (functools.partial(request, self.api, "POST", path, body=pod) for pod in pods)
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Force deletion: no kubelet runs on fake nodes to finish a graceful one."""
        try:
            await request(
                self.api,
                "DELETE",
                f"/api/v1/namespaces/{namespace}/pods/{name}",
                query={"gracePeriodSeconds": "0"},
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def delete_pods(self, namespace: str, names: Iterable[str]) -> None:
        await bounded(
            CREATE_CONCURRENCY, (functools.partial(self.delete_pod, namespace, name) for name in names)
        )

    async def clear(self, namespace: str, timeout: float = 600.0) -> None:
        """Deletes every pod, waits until their claims are gone (the GPUs free), drops the namespace.

        Pod by pod: one delete-collection call of thousands of pods outlasts the request timeout."""
        pods = await request(self.api, "GET", f"/api/v1/namespaces/{namespace}/pods", timeout=120.0)
        await self.delete_pods(namespace, [pod["metadata"]["name"] for pod in pods.get("items") or []])

        async def claims_gone() -> bool:
            claims = await request(
                self.api, "GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", query={"limit": "1"}
            )
            return not claims.get("items")

        await wait_until(claims_gone, timeout=timeout, interval=0.5, what=f"the claims of {namespace} to go")
        await request(self.api, "DELETE", f"/api/v1/namespaces/{namespace}")


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``pct`` % of the values at or
    below it (p95 of 10 samples is the 10th smallest, of 20 the 19th)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


@contextlib.asynccontextmanager
async def watching(api: ApiClient, namespace: str) -> AsyncIterator[BoundPods]:
    tracker = BoundPods()
    task = asyncio.create_task(tracker.follow(api, namespace))
    try:
        yield tracker
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _admin_client(kubeconfig: Path, connections: int) -> ApiClient:
    configuration = Configuration()
    await kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = connections
    return ApiClient(configuration)


@contextlib.asynccontextmanager
async def bench_cluster(
    nodes: int | NodeLayout, extender_profile: Path | None = None
) -> AsyncIterator[BenchCluster]:
    """A fresh local control plane with ``nodes`` GPU nodes (a count or a labelled layout); torn
    down on exit."""
    cluster = LocalCluster(controller_manager_qps=CLIENT_QPS, controller_manager_burst=CLIENT_BURST)
    await asyncio.to_thread(cluster.start)
    try:
        api = await _admin_client(cluster.kubeconfig, CREATE_CONCURRENCY + 8)
        async with api:
            bench = BenchCluster(cluster, api)
            bench.extender_profile = extender_profile
            await bench.install(nodes)
            yield bench
    finally:
        await asyncio.to_thread(cluster.stop)


def alternating(rounds: int, contenders: Sequence[C]) -> Iterator[C]:
    """Each contender once per round, forwards in even rounds and backwards in odd ones
    (a, b, c, c, b, a, a, ...), so a change in background load hits all alike."""
    for round_index in range(rounds):
        yield from (contenders if round_index % 2 == 0 else reversed(contenders))


@contextlib.asynccontextmanager
async def kai_running(bench: BenchCluster, variant: KaiVariant) -> AsyncIterator[None]:
    """KAI's processes (``bench.enable_kai`` first), for as long as the block: one contender's round."""
    if bench.kai is None:
        raise RuntimeError("KAI is not installed on this cluster (BenchCluster.enable_kai)")
    await asyncio.to_thread(bench.kai.start, variant)
    try:
        yield
    finally:
        await asyncio.to_thread(bench.kai.stop)


@contextlib.asynccontextmanager
async def tessera_running(bench: BenchCluster, scheduler: str = TESSERA_SCHEDULER) -> AsyncIterator[None]:
    """The Tessera extender (``BenchCluster.start_extender``) for the scheduler ``scheduler``, for
    as long as the block: one round of Tessera's."""
    await asyncio.to_thread(bench.start_extender, scheduler)
    try:
        yield
    finally:
        await asyncio.to_thread(bench.stop_extender)


@contextlib.asynccontextmanager
async def floor_running(bench: BenchCluster) -> AsyncIterator[None]:
    """The do-nothing extender (``bench.servers fast-floor``) on ``bench.floor_port``, for as long
    as the block: one round of the floor's scheduler."""
    bench.floor = await asyncio.to_thread(ServerProcess, "fast-floor", 0, 0, port=bench.floor_port)
    try:
        yield
    finally:
        await asyncio.to_thread(bench.floor.stop)
        bench.floor = None


class Contest(NamedTuple, Generic[R]):
    """Every run of each contender of ``compare``."""

    plain: tuple[R, ...]
    tessera: tuple[R, ...]
    kai: dict[str, tuple[R, ...]]  # by KaiVariant label
    floor: tuple[R, ...]


async def compare(
    bench: BenchCluster,
    scenario: Callable[[str, str], Awaitable[R]],
    rounds: int = 1,
    kai: Sequence[KaiVariant] = (),
    floor: bool = False,
) -> Contest[R]:
    """Runs ``scenario(namespace, scheduler)`` ``rounds`` times with each contender, in the order
    plain, Tessera, the floor (``floor``: the scheduler configured as Tessera's, calling a
    do-nothing extender), KAI variants, then backwards (so a change in background load hits all
    alike), clearing up after every run. The extender runs (and is profiled) only during the
    Tessera runs, the floor's only during its runs, KAI's processes only during KAI's (``kai``: its
    variants, when ``bench.enable_kai`` found it)."""
    await asyncio.to_thread(bench.start_scheduler, PLAIN_SCHEDULER)
    await asyncio.to_thread(bench.start_scheduler, TESSERA_SCHEDULER, True)
    if floor:
        await asyncio.to_thread(bench.start_scheduler, FLOOR_SCHEDULER)
    runs: dict[str, list[R]] = {PLAIN_SCHEDULER: [], TESSERA_SCHEDULER: [], FLOOR_SCHEDULER: []}
    kai_runs: dict[str, list[R]] = {variant.label: [] for variant in kai}
    schedulers = [PLAIN_SCHEDULER, TESSERA_SCHEDULER, *([FLOOR_SCHEDULER] if floor else [])]
    contenders: list[KaiVariant | str] = [*schedulers, *kai]
    for contender in alternating(rounds, contenders):
        namespace = await bench.new_namespace("kai" if isinstance(contender, KaiVariant) else contender)
        if isinstance(contender, KaiVariant):
            async with kai_running(bench, contender):
                kai_runs[contender.label].append(await scenario(namespace, KAI_SCHEDULER))
        elif contender == FLOOR_SCHEDULER:
            async with floor_running(bench):
                runs[contender].append(await scenario(namespace, contender))
        elif contender == TESSERA_SCHEDULER:
            async with tessera_running(bench):
                runs[contender].append(await scenario(namespace, contender))
        else:
            runs[contender].append(await scenario(namespace, contender))
        await bench.clear(namespace)
    return Contest(
        tuple(runs[PLAIN_SCHEDULER]),
        tuple(runs[TESSERA_SCHEDULER]),
        {label: tuple(done) for label, done in kai_runs.items()},
        tuple(runs[FLOOR_SCHEDULER]),
    )


# -- benchmark 2 -------------------------------------------------------------------------------


async def _bind_all(
    bench: BenchCluster, namespace: str, scheduler: str, pods: int, timeout: float
) -> BindRun:
    names = [f"p-{index:05d}" for index in range(pods)]
    async with watching(bench.api, namespace) as tracker:
        requests_before = await bench.api_requests()
        cpu_before = bench.cpu_seconds(scheduler)
        started = time.monotonic()
        await bench.submit(namespace, scheduler, names)
        created = time.monotonic()
        done = await tracker.wait_for(lambda t: len(t.bound) >= pods, timeout, f"{pods} bound pods")
        cpu = bench.cpu_seconds(scheduler) - cpu_before
        requests = await bench.api_requests() - requests_before
    run = BindRun(scheduler, pods, created - started, done - started, cpu, dict(requests))
    log.info(
        "%s: %d pods created in %.1fs, all bound after %.1fs", scheduler, pods, run.created_s, run.bound_s
    )
    return run


async def run_e2e(
    nodes: int,
    pods: int,
    rounds: int = 1,
    timeout: float = 900.0,
    extender_profile: Path | None = None,
    kai: bool = True,
    kai_extra: Sequence[KaiVariant] = (),
    floor: bool = True,
) -> E2EResult:
    """Benchmark 2 on a fresh local control plane (started and stopped here); with several
    ``rounds`` the figures are those of the median round of each scheduler. KAI races too when
    hack/build-kai.sh built it (and ``kai``), with its defaults and in the ``kai_extra`` variants;
    the do-nothing extender too (``floor``)."""
    if pods > nodes * GPUS_PER_NODE:
        raise ValueError(f"{pods} pods do not fit {nodes} nodes x {GPUS_PER_NODE} GPUs")
    async with bench_cluster(nodes, extender_profile) as bench:
        # The pods have no queue label: Tessera's default queue, mirrored for KAI.
        installed = kai and await bench.enable_kai([QueueSpec(DEFAULT_QUEUE)])
        variants = [DEFAULT_ACTIONS, *kai_extra] if installed else []
        contest = await compare(
            bench,
            lambda namespace, scheduler: _bind_all(bench, namespace, scheduler, pods, timeout),
            rounds,
            variants,
            floor,
        )
    return E2EResult(
        contest.plain,
        contest.tessera,
        nodes=nodes,
        pods=pods,
        qps=CLIENT_QPS,
        burst=CLIENT_BURST,
        kai_runs=contest.kai,
        floor_runs=contest.floor,
    )


def profile_path(argument: str | None) -> Path | None:
    chosen = argument or os.environ.get(PROFILE_ENV)
    return Path(chosen).resolve() if chosen else None


def add_floor_flag(parser: argparse.ArgumentParser) -> None:
    """``--no-floor``, for the benchmarks that race the do-nothing extender (``compare(floor=True)``)."""
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="leave out the do-nothing extender (the scheduler configured as Tessera's, no work behind it)",
    )


def bench_parser(
    prog: str, description: str | None, full: str, nodes: str, pods: str, smoke: str
) -> argparse.ArgumentParser:
    """The options the cluster benchmarks share: sizes, rounds, whether KAI races, the smoke
    (`smoke`: its sizes; one round whatever ``--rounds`` says)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help=full)
    parser.add_argument("--nodes", type=int, help=f"GPU nodes ({GPUS_PER_NODE} GPUs each); {nodes}")
    parser.add_argument("--pods", type=int, help=pods)
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs per scheduler, alternating; the median counts (default 1)"
    )
    parser.add_argument(
        "--no-kai", action="store_true", help="leave out KAI Scheduler even when hack/build-kai.sh built it"
    )
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP}; {smoke}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.e2e",
        __doc__,
        full="the issue's size: 500 nodes, 4000 pods",
        nodes="default 100",
        pods="single-GPU pods; default 800",
        smoke=f"{SMOKE_NODES} nodes, {SMOKE_PODS} pods",
    )
    parser.add_argument(
        "--profile-extender", metavar="FILE", help=f"cProfile the extender (or ${PROFILE_ENV})"
    )
    parser.add_argument(
        "--kai-client-qps",
        action="store_true",
        help=f"also race KAI with the kube-schedulers' client QPS/burst ({CLIENT_QPS}/{CLIENT_BURST})",
    )
    add_floor_flag(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.smoke:
        args.nodes, args.pods, args.rounds = SMOKE_NODES, SMOKE_PODS, 1
    nodes = args.nodes or (500 if args.full else 100)
    pods = args.pods or (4000 if args.full else 800)
    profile = profile_path(args.profile_extender)
    extra = [SAME_CLIENT] if args.kai_client_qps else []
    result = asyncio.run(
        run_e2e(
            nodes,
            pods,
            args.rounds,
            extender_profile=profile,
            kai=not args.no_kai,
            kai_extra=extra,
            floor=not args.no_floor,
        )
    )
    print(
        f"\n[2] end to end on the local control plane: {nodes} nodes x {GPUS_PER_NODE} GPUs, "
        f"{pods} single-GPU pods"
    )
    print(e2e_table(result))
    print(f"DRA slices: {SLICE_LAYOUT}")
    print(api_calls_table(result))
    if profile is not None and profile.exists():
        print(f"\nextender profile, last Tessera round ({profile}):\n{profile_summary(profile)}")
    print(
        json.dumps(
            {
                "plain_pods_per_s": round(result.plain.pods_per_s, 2),
                "tessera_pods_per_s": round(result.tessera.pods_per_s, 2),
                "ratio": round(result.ratio, 3),
                **(
                    {
                        "floor_pods_per_s": round(result.floor.pods_per_s, 2),
                        "floor_ratio": round(result.floor.pods_per_s / result.plain.pods_per_s, 3),
                        "tessera_vs_floor": round(result.vs_floor or 0.0, 3),
                    }
                    if result.floor is not None and result.plain.pods_per_s
                    else {}
                ),
                **{
                    f"kai_pods_per_s ({label})": round(run.pods_per_s, 2)
                    for label, (run, _) in result.kai.items()
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
