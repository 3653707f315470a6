"""Benchmark 5: reclaim on the real local control plane, beside kube-scheduler's own preemption.

N fake nodes, run by the node agent (``tessera-node-agent`` in its own process: the DRA driver on
the ``h100x8`` profile publishing each node's slices, and the kubelet stand-in running pods and
finishing their deletions).
Queues A and B have equal GPU quotas (half the GPUs each). Queue A fills every GPU with
long-running single-GPU pods; once all of them run, queue B submits as many pods as its fair
share (half the GPUs). The clock runs from B's submission until B holds its fair share (pods
bound). Two setups take turns on the same nodes (``--rounds``: a, b, b, a, ...; medians):

(a) plain kube-scheduler with priority preemption: A's pods in a PriorityClass of value 10, B's in
    one of value 1000, no extender: the stock DefaultPreemption picks and deletes the victims.
    It cannot do so for GPUs taken through DRA claims (its DynamicResources filter reports "cannot
    allocate all claims" as unresolvable, so preemption "is not helpful"; a probe shows it), so
    these rounds run on as many nodes with 8 classic device-plugin GPUs (``nvidia.com/gpu``),
    which exist only during them, their pods run by the kubelet stand-in. The pods select those
    nodes by label (``CLASSIC_NODE_LABEL``): the shipped DeviceClass maps ``nvidia.com/gpu``
    (``extendedResourceName``), so from Kubernetes 1.37 the stock scheduler would otherwise also
    place a classic GPU pod on a DRA node through a claim it makes itself, and A would spill onto
    the DRA nodes, out of reach of the preemption measured here;
(b) kube-scheduler + Tessera (``python -m extender``, reclaim on, 1-second cycle), all pods at
    priority 0 (preemptible): the reclaim loop evicts through the Eviction API and holds the
    freed GPUs for B's pods.

(c) KAI Scheduler (``bench.kai``), when ``hack/build-kai.sh`` built it: its own processes, the
    same queues mirrored as KAI Queues, the same pods with its scheduler name and queue label (no
    PriorityClass: KAI gives bare pods its preemptible ``train`` class), run twice per round:
    with its default actions and without consolidation.

Reported per setup: seconds until B holds its share, seconds per reclaimed GPU (that time over
the GPUs B needed), GPUs evicted / GPUs needed (pods deleted by the scheduler once B holds its
share and every victim's deletion is finished), and evictions undone (B's own pods evicted:
placements the scheduler made for B and took back). ``--slices`` picks how the node agent's
driver publishes the GPUs (consumable capacity or whole devices; default: what the apiserver
supports); the table says which layout the run used. ``--jobs`` submits every pod as the template
of a one-pod Job instead, so an evicted pod comes back as a pending pod of its queue (as a user's
training jobs do); the figures count the deleted pods either way.

Then a churn phase (``--churn-seconds``, ``--churn-queues``), with Tessera and then, when it was
built, with KAI's default actions, the same seed for both: every queue alternates between busy
spells (keeping a backlog of pending pods whose runtimes are random) and idle spells, so queues
keep borrowing and reclaiming from each other. Counted: evictions; evictions undone - the pod a
reclaim served later evicted in its turn for the queue the GPUs were taken from (ping-pong; target
0); and reverse reclaims - a queue X that lost a pod to Y later reclaiming from Y at all, which is
also right whenever the queues' demands changed in between (in this churn they change all the
time), so it is reported, not targeted. Each eviction and the pod it served are read from the
scheduler's own events: Tessera's `Reclaimed` event on the victim names the pod served; KAI's
`Evict` event on the victim's PodGroup (`pg-<pod>-<uid>` for a bare pod) names the preemptor's
PodGroup in its `evictor-pod-group-name` annotation.

Anchors: KAI Scheduler averages 13.9 s per reclaimed GPU at 500 nodes, and once evicted 376 GPUs
to serve a 48-GPU request (ratio 7.8). Targets: under 2 s per GPU, ratio <= 1.1.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import functools
import json
import logging
import math
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contract.names import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from dra_driver.config import SharingModeSetting
from extender.kubeapi import JsonObject, request
from extender.policy.fairness import QueueSpec
from extender.queues import queue_object
from tessera.dev.localcluster import LocalCluster, create_fake_node, wait_until
from tessera.dev.nodeagent import (
    KubeletStandIn,
    Registrar,
    run_kubelet_stand_in,
)
from tessera.simulate.report import format_table

from .e2e import (
    CLIENT_BURST,
    CLIENT_QPS,
    CREATE_CONCURRENCY,
    GPUS_PER_NODE,
    PLAIN_SCHEDULER,
    PROFILE,
    SLICES_PATH,
    TESSERA_SCHEDULER,
    BenchCluster,
    BoundPods,
    Rounds,
    _admin_client,
    alternating,
    bench_parser,
    bounded,
    gpu_pod,
    kai_running,
    percentile,
    seconds_list,
    slice_layout,
    watching,
)
from .kai import DEFAULT_ACTIONS, KAI_SCHEDULER, NO_CONSOLIDATION, KaiVariant

log = logging.getLogger(__name__)

QUEUES_PATH = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
PRIORITY_PATH = "/apis/scheduling.k8s.io/v1/priorityclasses"
LOW, HIGH = "bench-low", "bench-high"  # for the plain scheduler's preemption only
QUEUE_A, QUEUE_B = "bench-reclaim-a", "bench-reclaim-b"
KAI_PER_GPU_S = 13.9
KAI_WORST = (376, 48)
RECLAIMED_FOR = re.compile(r"reclaimed for queue '([^']+)' \(pod [^/]+/([^)]+)\)")
PLANNED_RATIO = re.compile(r"\(([\d.]+) GPUs for ([\d.]+) needed\)")
CLASSIC_GPU = "nvidia.com/gpu"
# On the classic-GPU nodes only; the classic pods select it (see (a) above).
CLASSIC_NODE_LABEL = ("bench.tessera.dev/gpus", "device-plugin")
DRA_PROBE_S = 30.0
ROUND_TIMEOUT_S = 300.0
# A stuck smoke fails in a minute: its round of 8 GPUs takes a few seconds.
SMOKE_PROBE_S, SMOKE_CHURN_S, SMOKE_TIMEOUT_S = 5.0, 10.0, 60.0
JOB_BACKOFF_LIMIT = 1000
KAI_B_TIMEOUT_S = 120.0  # a KAI round whose B is not served by then is reported as such


# -- pure helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReclaimRun:
    """One round: seconds from B's submission until B held `needed` GPUs (or the timeout, with
    `reached` false); pods the scheduler deleted, and how many of those were B's own."""

    setup: str
    needed: int
    seconds: float
    evicted: int
    undone: int = 0
    reached: bool = True

    @property
    def per_gpu_s(self) -> float:
        return self.seconds / self.needed if self.needed else 0.0

    @property
    def ratio(self) -> float:
        return self.evicted / self.needed if self.needed else 0.0


@dataclass(frozen=True)
class ReclaimResult(Rounds[ReclaimRun]):
    nodes: int
    dra_probe: str  # what plain priority preemption did for a pod whose GPU comes from a DRA claim
    slices: str = "consumable capacity"  # how the driver published the GPUs (bench.e2e.slice_layout)
    workload: str = "bare pods"  # or "one-pod Jobs"


@dataclass(frozen=True)
class Eviction:
    """A reclaim eviction as its event tells it: when, which pod of which queue, for which pod of
    which queue."""

    at: float
    victim: str
    victim_queue: str
    served: str
    for_queue: str
    message: str = ""  # the event's, with the victim queue's fair share and holdings then
    action: str = "reclaim"  # KAI's evictor action: reclaim, preempt or consolidation


def by_action(evictions: Sequence[Eviction]) -> str:
    """How many evictions each action made, most first: "reclaim 60, consolidation 281"."""
    counts = Counter(eviction.action for eviction in evictions)
    return ", ".join(f"{action} {count}" for action, count in counts.most_common())


def undone_pairs(evictions: Sequence[Eviction]) -> list[tuple[Eviction, Eviction]]:
    """Evictions undone, each with the one that undid it: the pod served by the first was evicted
    later for the queue it took from."""
    return [
        (first, later)
        for first in evictions
        for later in evictions
        if later.victim == first.served and later.for_queue == first.victim_queue
    ]


def undone(evictions: Sequence[Eviction]) -> int:
    return len({id(first) for first, _ in undone_pairs(evictions)})


def reverse_reclaims(evictions: Sequence[Eviction]) -> int:
    """Evictions from X for Y followed, at any later time, by a reclaim from Y for X."""
    return sum(
        any(
            later.at >= first.at
            and later.victim_queue == first.for_queue
            and later.for_queue == first.victim_queue
            for later in evictions
        )
        for first in evictions
    )


@dataclass(frozen=True)
class ChurnResult:
    setup: str  # which scheduler ran it
    seconds: float
    queues: int
    submitted: int
    completed: int
    evictions: int
    undone: int
    reverse: int
    max_ratio: float | None  # the largest GPUs evicted / GPUs needed of one plan (None: not told)
    undone_pairs: tuple[tuple[Eviction, Eviction], ...] = ()
    actions: str = ""  # evictions by action (`by_action`)
    lost_gpu_s: float = 0.0  # GPU-seconds the evicted pods had run (single-GPU pods): work lost
    done_gpu_s: float = 0.0  # GPU-seconds of the pods that ran their whole runtime
    held_gpu_s: float = 0.0  # GPU-seconds of the pods still running at the end, up to then
    waits_s: tuple[float, ...] = ()  # each churn queue's pod bound: from its create to its bind
    base_evictions: int = 0  # of `evictions`, the base borrower's pods (ChurnBase; 0 without)

    @property
    def lost_pct(self) -> float:
        """Work lost as a share of the GPU time the churn's pods used (lost + done + held)."""
        used = self.lost_gpu_s + self.done_gpu_s + self.held_gpu_s
        return 100 * self.lost_gpu_s / used if used else 0.0

    @property
    def lost_per_eviction_s(self) -> float:
        """GPU-seconds an evicted pod had run, on average."""
        return self.lost_gpu_s / self.evictions if self.evictions else 0.0

    def wait_s(self, pct: float) -> float:
        """The churn queues' pods' time from create to bind at the ``pct`` percentile (nearest
        rank); 0 when none bound."""
        return percentile(self.waits_s, pct) if self.waits_s else 0.0


CHURN_BASE_QUEUE = "bench-churn-base"


@dataclass(frozen=True)
class ChurnBase:
    """A borrower that holds every GPU when the churn's clock starts: at hundreds of nodes the
    churn's short pods, created a few per second, never fill the cluster, and nothing would
    contend (``bench.scale``). Its queue has no quota, so every pod a churn queue starts within
    its quota reclaims one of the base's; its ``pods`` one-GPU pods run past the churn's end, and
    it keeps ``backlog`` pending throughout, so a GPU that frees goes back to it unless a churn
    queue's pod is owed it. The fill waits ``fill_timeout`` seconds at most."""

    queue: str
    pods: int
    backlog: int
    fill_timeout: float


def reclaim_table(result: ReclaimResult) -> str:
    headers = [
        "setup",
        "GPUs",
        "B needs",
        "B holds its share after s",
        "each round s",
        "s per reclaimed GPU",
        "GPUs evicted / needed",
        "evictions undone",
        "time / plain's",
    ]
    rows = [
        [
            label,
            str(result.nodes * GPUS_PER_NODE),
            str(run.needed),
            f"{run.seconds:.1f}" if run.reached else f"not in {run.seconds:.0f}",
            seconds_list(r.seconds for r in runs),
            f"{run.per_gpu_s:.2f}",
            f"{run.evicted} / {run.needed} = {run.ratio:.2f}",
            f"{run.undone} (each round {', '.join(str(r.undone) for r in runs)})",
            f"{run.seconds / result.plain.seconds:.2f}x" if result.plain.seconds > 0 else "-",
        ]
        for label, run, runs in (
            ("kube-scheduler priority preemption (classic GPUs)", result.plain, result.plain_runs),
            ("kube-scheduler + Tessera reclaim (DRA claims)", result.tessera, result.tessera_runs),
            *((f"{label} (DRA claims)", run, runs) for label, (run, runs) in result.kai.items()),
        )
    ]
    anchor = (
        f"anchors: KAI Scheduler {KAI_PER_GPU_S} s per reclaimed GPU at 500 nodes; worst case "
        f"{KAI_WORST[0]} GPUs evicted for a {KAI_WORST[1]}-GPU request ({KAI_WORST[0] / KAI_WORST[1]:.1f}). "
        "Targets: < 2 s per GPU, ratio <= 1.1"
    )
    probe = f"plain priority preemption with DRA claims: {result.dra_probe}"
    slices = f"DRA slices: {result.slices}; workload: {result.workload}"
    return f"{format_table(headers, rows)}\n{slices}\n{probe}\n{anchor}"


def _evictions_cell(result: ChurnResult) -> str:
    """Evictions, by action when told, and how many were of the base's pods when it ran."""
    notes = [result.actions] if result.actions else []
    if result.base_evictions:
        notes.append(f"{result.base_evictions} of the base")
    return f"{result.evictions} ({'; '.join(notes)})" if notes else str(result.evictions)


def churn_table(results: Sequence[ChurnResult]) -> str:
    """One row per contender of the same churn, then each evictions-undone pair."""
    headers = [
        "setup",
        "queues",
        "seconds",
        "pods submitted",
        "pods completed",
        "evictions",
        "undone (ping-pong)",
        "reverse reclaims",
        "pod wait p50 / p95 s",
        "max plan ratio",
        "work lost GPU-s",
        "per eviction s",
    ]
    rows = [
        [
            result.setup,
            str(result.queues),
            f"{result.seconds:.0f}",
            str(result.submitted),
            str(result.completed),
            _evictions_cell(result),
            str(result.undone),
            str(result.reverse),
            f"{result.wait_s(50):.1f} / {result.wait_s(95):.1f}" if result.waits_s else "-",
            "-" if result.max_ratio is None else f"{result.max_ratio:.2f}",
            f"{result.lost_gpu_s:.0f} ({result.lost_pct:.1f}%)",
            f"{result.lost_per_eviction_s:.1f}",
        ]
        for result in results
    ]
    pairs = [
        f"  {result.setup} undone: {first.victim} at {first.at:.0f} ({first.message})\n"
        f"     by: {later.victim} at {later.at:.0f} ({later.message})"
        for result in results
        for first, later in result.undone_pairs
    ]
    return "\n".join([format_table(headers, rows), *pairs])


# -- the cluster -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def reclaim_cluster(nodes: int, slices: SharingModeSetting = "auto") -> AsyncIterator[BenchCluster]:
    """A fresh local control plane whose `nodes` GPU nodes run the node agent (one process for
    all; its driver publishes `slices`); torn down on exit."""
    cluster = LocalCluster(controller_manager_qps=CLIENT_QPS, controller_manager_burst=CLIENT_BURST)
    await asyncio.to_thread(cluster.start)
    try:
        api = await _admin_client(cluster.kubeconfig, CREATE_CONCURRENCY + 8)
        async with api:
            bench = BenchCluster(cluster, api)
            await bench.install(nodes, publish_slices=False)
            with tempfile.TemporaryDirectory(prefix="tbr-", dir="/tmp") as state:
                agent = cluster.spawn(
                    "node-agent",
                    [
                        sys.executable, "-m", "tessera.dev.nodeagent", f"--kubeconfig={cluster.kubeconfig}",
                        f"--profile={PROFILE}", f"--state-dir={state}", "--log-level=WARNING",
                        f"--sharing-mode={slices}",
                        *(f"--node-name={node}" for node in bench.nodes),
                    ],
                )  # fmt: skip

                async def published() -> bool:
                    if agent.process.poll() is not None:
                        raise RuntimeError(f"the node agent exited:\n{agent.log_tail()}")
                    listing = await request(api, "GET", SLICES_PATH)
                    return len({s["spec"]["nodeName"] for s in listing.get("items") or []}) == nodes

                try:
                    await wait_until(published, timeout=120, what="every node agent's slices")
                    yield bench
                finally:  # before its state directory goes
                    agent.stop()
                    cluster.components.remove(agent)
    finally:
        await asyncio.to_thread(cluster.stop)


async def _create_queues(bench: BenchCluster, names: Sequence[str], quota: int) -> list[QueueSpec]:
    """Tessera queues with a GPU quota each; their specs, for KAI's mirror."""
    for name in names:
        body = queue_object(name, {"resources": {"gpu": {"quota": quota}}})
        await request(bench.api, "POST", QUEUES_PATH, body=body)
    return [QueueSpec(name, quota={"gpu": quota}) for name in names]


async def _submit(
    bench: BenchCluster,
    namespace: str,
    scheduler: str,
    names: Sequence[str],
    queue: str,
    priority_class: str | None,
    classic: bool = False,
    jobs: bool = False,
) -> None:
    """Single-GPU pods: a DRA claim from the template, or with `classic` one classic GPU on a
    classic-GPU node (never a DRA node's claim made for it); with `jobs`, each pod the template of
    a Job of the same name (an evicted pod comes back pending)."""
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs" if jobs else f"/api/v1/namespaces/{namespace}/pods"

    async def create(name: str) -> None:
        body = gpu_pod(namespace, name, scheduler, queue)
        if classic:
            body = classic_gpu_pod(body)
        spec = body["spec"]
        # The default graceful termination (30 s), which the node agent finishes as a kubelet does.
        del spec["terminationGracePeriodSeconds"]
        if priority_class:
            spec["priorityClassName"] = priority_class
        await request(bench.api, "POST", path, body=as_job(body) if jobs else body)

    await bounded(CREATE_CONCURRENCY, (functools.partial(create, name) for name in names))


def classic_gpu_pod(pod: JsonObject) -> JsonObject:
    """`pod` with one classic device-plugin GPU instead of its claim, kept to the classic-GPU nodes
    (CLASSIC_NODE_LABEL): the shipped DeviceClass would otherwise let the scheduler serve the GPU
    on a DRA node through a claim of its own."""
    spec = {key: value for key, value in pod["spec"].items() if key != "resourceClaims"}
    main, *others = spec["containers"]
    resources = {key: value for key, value in main["resources"].items() if key != "claims"}
    resources["limits"] = {CLASSIC_GPU: "1"}
    spec["containers"] = [{**main, "resources": resources}, *others]
    spec["nodeSelector"] = dict([CLASSIC_NODE_LABEL])
    return {**pod, "spec": spec}


def as_job(pod: JsonObject) -> JsonObject:
    """A Job running `pod` once: the pod as its template (restartPolicy Never, its annotations
    kept), its labels on the Job too (KAI reads the queue from the top owner), retried whatever
    evictions it suffers."""
    metadata = pod["metadata"]
    labels = metadata.get("labels") or {}
    template_metadata: JsonObject = {"labels": labels}
    if metadata.get("annotations"):
        template_metadata["annotations"] = metadata["annotations"]
    template = {"metadata": template_metadata, "spec": {**pod["spec"], "restartPolicy": "Never"}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": metadata["name"], "namespace": metadata["namespace"], "labels": labels},
        "spec": {"backoffLimit": JOB_BACKOFF_LIMIT, "template": template},
    }


async def _clear(bench: BenchCluster, namespace: str) -> None:
    """The round's Jobs (their pods left behind), then every pod and claim (BenchCluster.clear)."""
    await request(
        bench.api,
        "DELETE",
        f"/apis/batch/v1/namespaces/{namespace}/jobs",
        query={"propagationPolicy": "Orphan"},
    )
    await bench.clear(namespace)


async def _all_running(bench: BenchCluster, namespace: str, count: int) -> bool:
    pods = await request(bench.api, "GET", f"/api/v1/namespaces/{namespace}/pods", timeout=60.0)
    running = [p for p in pods.get("items") or [] if (p.get("status") or {}).get("phase") == "Running"]
    return len(running) >= count


@contextlib.asynccontextmanager
async def classic_nodes(bench: BenchCluster, count: int, kubelets: bool = True) -> AsyncIterator[list[str]]:
    """`count` nodes with 8 classic GPUs each, labelled CLASSIC_NODE_LABEL, run by the kubelet
    stand-in (``kubelets``; False: a light kubelet watching the whole cluster runs their pods
    already), for as long as the block; their names."""
    names = [f"classic-{index:04d}" for index in range(count)]
    stop = asyncio.Event()
    with tempfile.TemporaryDirectory(prefix="tbc-", dir="/tmp") as registry:
        for name in names:
            await create_fake_node(bench.api, name, labels=dict([CLASSIC_NODE_LABEL]))
            capacity = {CLASSIC_GPU: str(GPUS_PER_NODE)}
            await request(
                bench.api,
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                body={"status": {"capacity": capacity, "allocatable": capacity}},
                content_type="application/merge-patch+json",
            )
        stand_ins = [
            asyncio.create_task(
                run_kubelet_stand_in(KubeletStandIn(bench.api, name, Registrar(Path(registry))), stop)
            )
            for name in names
            if kubelets
        ]
        try:
            yield names
        finally:
            stop.set()
            await asyncio.gather(*stand_ins, return_exceptions=True)
            for name in names:
                await request(bench.api, "DELETE", f"/api/v1/nodes/{name}")


# -- borrow then reclaim -----------------------------------------------------------------------


async def _reclaim_round(
    bench: BenchCluster,
    namespace: str,
    scheduler: str,
    timeout: float,
    b_timeout: float | None = None,
    jobs: bool = False,
) -> ReclaimRun:
    """One round; B's wait ends after `b_timeout` (default `timeout`) with the run marked not
    reached instead of failing (KAI's rounds: a contender that never gets there is a figure)."""
    plain = scheduler == PLAIN_SCHEDULER
    gpus = len(bench.nodes) * GPUS_PER_NODE
    needed = gpus // 2
    a_names = [f"a-{index:05d}" for index in range(gpus)]
    async with watching(bench.api, namespace) as tracker:
        await _submit(bench, namespace, scheduler, a_names, QUEUE_A, LOW if plain else None, plain, jobs)
        await tracker.wait_for(lambda t: t.per_queue().get(QUEUE_A, 0) >= gpus, timeout, "A to fill the GPUs")
        await wait_until(
            lambda: _all_running(bench, namespace, gpus), timeout=timeout, what="A's pods running"
        )
        started = time.monotonic()
        b_names = [f"b-{index:05d}" for index in range(needed)]
        await _submit(bench, namespace, scheduler, b_names, QUEUE_B, HIGH if plain else None, plain, jobs)
        try:
            reached = await tracker.wait_for(
                lambda t: t.per_queue().get(QUEUE_B, 0) >= needed,
                b_timeout or timeout,
                f"B to hold {needed} GPUs",
            )
        except TimeoutError:
            if b_timeout is None:
                raise
            reached = 0.0

        def settled(t: BoundPods) -> bool:  # every victim's deletion finished
            return sum(t.per_queue().values()) <= gpus

        await tracker.wait_for(settled, timeout, "the victims to be gone")
        gone = list(tracker.deleted.values())  # nothing else deletes pods during the round
    evicted_a, evicted_b = gone.count(QUEUE_A), gone.count(QUEUE_B)
    seconds = reached - started if reached else float(b_timeout or timeout)
    run = ReclaimRun(scheduler, needed, seconds, evicted_a + evicted_b, evicted_b, reached=bool(reached))
    log.info(
        "%s: B held %d GPUs after %.1fs (%s), %d pods evicted, %d of them B's",
        scheduler,
        needed,
        run.seconds,
        "reached" if run.reached else "NOT reached",
        run.evicted,
        run.undone,
    )
    return run


async def _rounds(
    bench: BenchCluster, rounds: int, timeout: float, kai: Sequence[KaiVariant], jobs: bool = False
) -> tuple[list[ReclaimRun], list[ReclaimRun], dict[str, list[ReclaimRun]]]:
    """The rounds of every contender, alternating (``bench.e2e.alternating``); the plain
    scheduler's on classic-GPU nodes that exist only during them."""
    plain: list[ReclaimRun] = []
    tessera: list[ReclaimRun] = []
    kai_runs: dict[str, list[ReclaimRun]] = {variant.label: [] for variant in kai}
    contenders: list[KaiVariant | str] = [PLAIN_SCHEDULER, TESSERA_SCHEDULER, *kai]
    for contender in alternating(rounds, contenders):
        namespace = await bench.new_namespace("kai" if isinstance(contender, KaiVariant) else contender)
        if isinstance(contender, KaiVariant):
            async with kai_running(bench, contender):
                kai_runs[contender.label].append(
                    await _reclaim_round(bench, namespace, KAI_SCHEDULER, timeout, KAI_B_TIMEOUT_S, jobs)
                )
            await _clear(bench, namespace)
        elif contender == TESSERA_SCHEDULER:
            await asyncio.to_thread(bench.start_extender, TESSERA_SCHEDULER)
            try:
                tessera.append(await _reclaim_round(bench, namespace, TESSERA_SCHEDULER, timeout, jobs=jobs))
            finally:
                await asyncio.to_thread(bench.stop_extender)
            await _clear(bench, namespace)
        else:
            async with classic_nodes(bench, len(bench.nodes)):
                plain.append(await _reclaim_round(bench, namespace, PLAIN_SCHEDULER, timeout, jobs=jobs))
                await _clear(bench, namespace)
    return plain, tessera, kai_runs


async def _dra_preemption_probe(bench: BenchCluster, wait_s: float) -> str:
    """Plain priority preemption with DRA claims: A (low priority) fills the GPUs, one pod of B
    (high priority) comes; what the scheduler said about it after `wait_s` seconds, or that it
    was bound."""
    gpus = len(bench.nodes) * GPUS_PER_NODE
    namespace = await bench.new_namespace("probe")
    try:
        async with watching(bench.api, namespace) as tracker:
            names = [f"a-{index:05d}" for index in range(gpus)]
            await _submit(bench, namespace, PLAIN_SCHEDULER, names, QUEUE_A, LOW)
            await tracker.wait_for(lambda t: len(t.bound) >= gpus, 300, "A to fill the GPUs")
            await _submit(bench, namespace, PLAIN_SCHEDULER, ["b-00000"], QUEUE_B, HIGH)
            try:
                await tracker.wait_for(lambda t: "b-00000" in t.bound, wait_s, "B's pod")
                return "bound: preemption worked"
            except TimeoutError:
                pass
        listing = await request(
            bench.api,
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": "reason=FailedScheduling,involvedObject.name=b-00000"},
        )
        messages = [e["message"] for e in listing.get("items") or []]
        return f"not bound after {wait_s:.0f} s: {messages[-1] if messages else 'no event'}"
    finally:
        await bench.clear(namespace)


# -- churn -------------------------------------------------------------------------------------


@dataclass
class Spells:
    """A queue's busy and idle spells: busy 20-45 s, idle 5-20 s."""

    rng: random.Random
    busy: bool = True
    until: float = 0.0

    def update(self, now: float) -> bool:
        if now >= self.until:
            if self.until:
                self.busy = not self.busy
            self.until = now + (self.rng.uniform(20, 45) if self.busy else self.rng.uniform(5, 20))
        return self.busy


async def _events(bench: BenchCluster, namespace: str, reason: str) -> list[JsonObject]:
    listing = await request(
        bench.api,
        "GET",
        f"/api/v1/namespaces/{namespace}/events",
        query={"fieldSelector": f"reason={reason}"},
        timeout=60.0,
    )
    return list(listing.get("items") or [])


def _stamp(event: JsonObject) -> float:
    return _epoch(event.get("firstTimestamp") or event.get("eventTime") or "")


async def tessera_evictions(bench: BenchCluster, namespace: str, queue_of: dict[str, str]) -> list[Eviction]:
    """The extender's evictions, from its `Reclaimed` events on the victims (they name the pod
    served and its queue)."""
    evictions = []
    for event in await _events(bench, namespace, "Reclaimed"):
        victim = event["involvedObject"]["name"]
        served = RECLAIMED_FOR.search(event["message"])
        if victim in queue_of and served is not None:
            evictions.append(
                Eviction(
                    _stamp(event),
                    victim,
                    queue_of[victim],
                    served.group(2),
                    served.group(1),
                    event["message"],
                )
            )
    return evictions


# KAI names a bare pod's PodGroup `pg-<pod>-<pod uid>`.
KAI_POD_GROUP = re.compile(r"^pg-(.+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def kai_pod_of(pod_group: str) -> str | None:
    """The bare pod a KAI PodGroup stands for, by its name (None: not such a name)."""
    match = KAI_POD_GROUP.match(pod_group)
    return match.group(1) if match else None


async def kai_evictions(bench: BenchCluster, namespace: str, queue_of: dict[str, str]) -> list[Eviction]:
    """KAI's evictions, from its `Evict` events on the victims' PodGroups: the annotation
    `evictor-pod-group-name` names the preemptor's PodGroup (its action, reclaim, preempt or
    consolidation, in `evictor-action-type`)."""
    evictions = []
    for event in await _events(bench, namespace, "Evict"):
        annotations = (event.get("metadata") or {}).get("annotations") or {}
        victim = kai_pod_of(event["involvedObject"]["name"])
        served = kai_pod_of(annotations.get("evictor-pod-group-name", ""))
        if victim in queue_of and served in queue_of:
            assert victim is not None and served is not None
            action = annotations.get("evictor-action-type", "?")
            message = f"{action}: {event.get('message', '')}"
            evictions.append(
                Eviction(_stamp(event), victim, queue_of[victim], served, queue_of[served], message, action)
            )
    return evictions


async def tessera_plan_ratio(bench: BenchCluster, namespace: str) -> float | None:
    """The largest GPUs evicted / GPUs needed of one plan, from the `ReclaimPlanned` events."""
    ratios = [
        float(match.group(1)) / float(match.group(2))
        for event in await _events(bench, namespace, "ReclaimPlanned")
        if (match := PLANNED_RATIO.search(event["message"]))
    ]
    return max(ratios, default=0.0)


async def untold_plan_ratio(bench: BenchCluster, namespace: str) -> float | None:
    """KAI's events give a victim's gang size, not what its plan needed."""
    return None


@dataclass(frozen=True)
class ChurnContender:
    """Who runs a churn: the pods' scheduler, and how its evictions and plans are read back."""

    setup: str
    scheduler: str
    evictions: Callable[[BenchCluster, str, dict[str, str]], Awaitable[list[Eviction]]]
    plan_ratio: Callable[[BenchCluster, str], Awaitable[float | None]]


TESSERA_CHURN = ChurnContender(
    "kube-scheduler + Tessera", TESSERA_SCHEDULER, tessera_evictions, tessera_plan_ratio
)
KAI_CHURN = ChurnContender(DEFAULT_ACTIONS.label, KAI_SCHEDULER, kai_evictions, untold_plan_ratio)


async def _churn(
    bench: BenchCluster,
    namespace: str,
    queues: Sequence[str],
    seconds: float,
    backlog: int,
    seed: int,
    complete: Callable[[str, Sequence[str]], Awaitable[None]] | None = None,
    contender: ChurnContender = TESSERA_CHURN,
    base: ChurnBase | None = None,
) -> ChurnResult:
    """The churn, its pods for `contender`'s scheduler; a pod that ran its runtime is completed by
    `complete(namespace, names)` (default: deleted, as a finished bare pod's owner would). With
    `base`, its borrower fills every GPU before the clock starts."""
    complete = complete or bench.delete_pods
    rng = random.Random(seed)
    spells = {queue: Spells(random.Random(rng.random())) for queue in queues}
    queue_of: dict[str, str] = {}
    runtime: dict[str, float] = {}
    created: dict[str, float] = {}
    first_bound: dict[str, float] = {}
    gone_at: dict[str, float] = {}  # when a bound pod that did not finish was seen gone
    finished: set[str] = set()

    async def top_up(queue: str, pending_at_most: int, runtime_of: Callable[[], float]) -> None:
        pending = sum(1 for n, q in queue_of.items() if q == queue and n not in first_bound)
        fresh = [f"{queue[-1]}-{len(queue_of) + i:05d}" for i in range(pending_at_most - pending)]
        for name in fresh:
            queue_of[name] = queue
            runtime[name] = runtime_of()
            created[name] = time.monotonic()
        if fresh:
            await _submit(bench, namespace, contender.scheduler, fresh, queue, None)

    async with watching(bench.api, namespace) as tracker:
        if base is not None:
            asked = time.monotonic()
            await top_up(base.queue, base.pods, lambda: math.inf)
            filled = await tracker.wait_for(
                lambda t: t.per_queue().get(base.queue, 0) >= base.pods,
                base.fill_timeout,
                f"the base's {base.pods} pods bound",
            )
            log.info("%s: the base holds every GPU after %.1fs", contender.setup, filled - asked)
        deadline = time.monotonic() + seconds
        while (now := time.monotonic()) < deadline:
            for name in list(tracker.bound):
                first_bound.setdefault(name, now)
            for name in tracker.deleted.keys() - finished - gone_at.keys():
                gone_at[name] = now
            for queue, spell in spells.items():
                if spell.update(now):
                    await top_up(queue, backlog, lambda: rng.uniform(10, 40))
            if base is not None:
                await top_up(base.queue, base.backlog, lambda: math.inf)
            done = [
                n
                for n, at in first_bound.items()
                if n in tracker.bound and n not in finished and now - at >= runtime[n]
            ]
            finished.update(done)
            await complete(namespace, done)
            await asyncio.sleep(0.5)
        stop = time.monotonic()
        held = [n for n in tracker.bound if n in first_bound and n not in finished]
        bound_at = dict(tracker.bound_at)
    evictions = await contender.evictions(bench, namespace, queue_of)
    max_ratio = await contender.plan_ratio(bench, namespace)
    end = time.monotonic()
    victims = {eviction.victim for eviction in evictions}
    in_churn = set(queues)
    return ChurnResult(
        contender.setup,
        seconds,
        len(queues),
        len(queue_of),
        len(finished),
        len(evictions),
        undone(evictions),
        reverse_reclaims(evictions),
        max_ratio,
        tuple(undone_pairs(evictions)),
        actions=by_action(evictions),
        lost_gpu_s=sum(gone_at.get(v, end) - first_bound[v] for v in victims if v in first_bound),
        done_gpu_s=sum(runtime[name] for name in finished),
        held_gpu_s=sum(stop - first_bound[name] for name in held),
        waits_s=tuple(
            bound_at[name] - created[name]
            for name, queue in queue_of.items()
            if queue in in_churn and name in bound_at
        ),
        base_evictions=sum(eviction.victim_queue == base.queue for eviction in evictions) if base else 0,
    )


async def churn_contest(
    bench: BenchCluster,
    replaced: Sequence[str],
    queues: int,
    seconds: float,
    backlog: int,
    kai: bool,
    complete: Callable[[str, Sequence[str]], Awaitable[None]] | None = None,
    base_fill_timeout: float | None = None,
) -> list[ChurnResult]:
    """The same churn (seed 1) with Tessera, then with KAI's default actions when `kai`, each in a
    namespace of its own, on `queues` queues that share the GPUs equally. They take the place of
    the rounds' queues `replaced` (in KAI's mirror too), so the quotas sum to the cluster in both,
    as the rounds' did: KAI does not reclaim for a queue within its quota while quotas add up to
    more than the cluster. With `base_fill_timeout`, each churn starts from a cluster that a
    borrower with no quota fills (`ChurnBase`, the queue CHURN_BASE_QUEUE), waiting that long at
    most."""
    gpus = len(bench.nodes) * GPUS_PER_NODE
    names = [f"bench-churn-{chr(ord('a') + i)}" for i in range(queues)]
    for name in replaced:
        await request(bench.api, "DELETE", f"{QUEUES_PATH}/{name}")
    specs = await _create_queues(bench, names, gpus // queues)
    base = None
    if base_fill_timeout is not None:
        specs += await _create_queues(bench, [CHURN_BASE_QUEUE], 0)
        base = ChurnBase(CHURN_BASE_QUEUE, gpus, backlog, base_fill_timeout)
    if kai and bench.kai is not None:
        await bench.kai.replace_queues(bench.api, replaced, specs)
    results = []
    for contender in (TESSERA_CHURN, *((KAI_CHURN,) if kai else ())):
        namespace = await bench.new_namespace("churn")
        run = _churn(bench, namespace, names, seconds, backlog, 1, complete, contender, base)
        if contender is KAI_CHURN:
            async with kai_running(bench, DEFAULT_ACTIONS):
                results.append(await run)
        else:
            await asyncio.to_thread(bench.start_extender, TESSERA_SCHEDULER)
            try:
                results.append(await run)
            finally:
                await asyncio.to_thread(bench.stop_extender)
        await bench.clear(namespace)
    return results


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) if stamp else 0.0


# -- the benchmark -----------------------------------------------------------------------------


async def run_reclaim_async(
    nodes: int,
    rounds: int,
    churn_seconds: float,
    churn_queues: int,
    timeout: float = ROUND_TIMEOUT_S,
    kai: bool = True,
    slices: SharingModeSetting = "auto",
    jobs: bool = False,
    probe_s: float = DRA_PROBE_S,
) -> tuple[ReclaimResult, list[ChurnResult]]:
    """The benchmark on a fresh cluster; `timeout`: the longest wait of a round (A filling the
    GPUs, B its share, the victims going); `probe_s`: the DRA probe's wait."""
    gpus = nodes * GPUS_PER_NODE
    async with reclaim_cluster(nodes, slices) as bench:
        layout = slice_layout((await request(bench.api, "GET", SLICES_PATH)).get("items") or [])
        for name, value in ((LOW, 10), (HIGH, 1000)):
            await request(bench.api, "POST", PRIORITY_PATH, body={"metadata": {"name": name}, "value": value})
        queues = await _create_queues(bench, (QUEUE_A, QUEUE_B), gpus // 2)
        variants = [DEFAULT_ACTIONS, NO_CONSOLIDATION] if kai and await bench.enable_kai(queues) else []
        await asyncio.to_thread(bench.start_scheduler, PLAIN_SCHEDULER)
        await asyncio.to_thread(bench.start_scheduler, TESSERA_SCHEDULER, True)
        probe = await _dra_preemption_probe(bench, probe_s)
        log.info("plain priority preemption with DRA claims: %s", probe)
        plain, tessera, kai_runs = await _rounds(bench, rounds, timeout, variants, jobs)
        churn = (
            await churn_contest(
                bench, (QUEUE_A, QUEUE_B), churn_queues, churn_seconds, gpus // churn_queues, bool(variants)
            )
            if churn_seconds > 0
            else []
        )
    result = ReclaimResult(
        tuple(plain),
        tuple(tessera),
        nodes=nodes,
        dra_probe=probe,
        slices=layout,
        workload="one-pod Jobs" if jobs else "bare pods",
        kai_runs={label: tuple(runs) for label, runs in kai_runs.items()},
    )
    return result, churn


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.reclaim",
        __doc__,
        full="a larger cluster (16 nodes, 128 GPUs) and the issue's 10-minute churn with 3 queues",
        nodes="default 4",
        pods="unused (A fills every GPU, B asks for half)",
        smoke=(
            f"1 node, {SMOKE_CHURN_S:g} s of churn, the DRA probe waits {SMOKE_PROBE_S:g} s "
            "(--jobs and --slices still apply)"
        ),
    )
    parser.add_argument(
        "--churn-seconds", type=float, help="length of the churn phase (default 60; --full 600)"
    )
    parser.add_argument(
        "--churn-queues", type=int, default=3, choices=(2, 3), help="queues in the churn (default 3)"
    )
    parser.add_argument(
        "--slices",
        default="auto",
        choices=("auto", "consumable-capacity", "whole-device"),
        help="how the node agent's driver publishes the GPUs (default: what the apiserver supports)",
    )
    parser.add_argument(
        "--jobs",
        action="store_true",
        help="A's and B's pods as one-pod Jobs (evicted pods come back pending)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("dra_driver", "tessera.dev.nodeagent"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.smoke:
        args.nodes, args.rounds, args.churn_seconds = 1, 1, SMOKE_CHURN_S
    nodes = args.nodes or (16 if args.full else 4)
    churn_seconds = args.churn_seconds if args.churn_seconds is not None else (600.0 if args.full else 60.0)
    result, churn = asyncio.run(
        run_reclaim_async(
            nodes,
            args.rounds,
            churn_seconds,
            args.churn_queues,
            kai=not args.no_kai,
            slices=args.slices,
            jobs=args.jobs,
            timeout=SMOKE_TIMEOUT_S if args.smoke else ROUND_TIMEOUT_S,
            probe_s=SMOKE_PROBE_S if args.smoke else DRA_PROBE_S,
        )
    )
    print(
        f"\n[5] reclaim on the local control plane with the node agent: {nodes} nodes x {GPUS_PER_NODE} GPUs"
    )
    print(reclaim_table(result))
    figures: dict[str, float | int] = {
        "plain_s": round(result.plain.seconds, 2),
        "tessera_s": round(result.tessera.seconds, 2),
        "tessera_s_per_gpu": round(result.tessera.per_gpu_s, 3),
        "tessera_evicted_ratio": round(result.tessera.ratio, 3),
        "plain_evicted_ratio": round(result.plain.ratio, 3),
    }
    for label, (run, _) in result.kai.items():
        figures[f"kai_s ({label})"] = round(run.seconds, 2)
        figures[f"kai_evicted_ratio ({label})"] = round(run.ratio, 3)
    if churn:
        first = churn[0]
        print(f"\nchurn: {first.queues} queues with equal quotas, {first.seconds:.0f} s, the same seed each")
        print(churn_table(churn))
        tessera_churn, *kai_churn = churn
        figures.update(
            churn_evictions=tessera_churn.evictions,
            churn_undone=tessera_churn.undone,
            churn_reverse=tessera_churn.reverse,
        )
        for kai_run in kai_churn:
            figures[f"kai_churn_evictions ({DEFAULT_ACTIONS.label})"] = kai_run.evictions
            figures[f"kai_churn_undone ({DEFAULT_ACTIONS.label})"] = kai_run.undone
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
