"""The scale suite: KAI Scheduler's nightly shape on N simulated GPU nodes (500; ``--full`` 1000).

The nodes are ``bench.e2e``'s: fake Nodes with 8 simulated H100s each, their ResourceSlices
written as the DRA driver publishes them (``bench.e2e.gpu_slices``), no process per node. Behind
them runs one **light kubelet** (``LightKubelet``): a single watch of every bound pod in the
cluster that marks a newly bound pod Running, finishes a graceful deletion at once (an eviction's
victim goes as a kubelet would let a pause container go), and marks the pods the churn finishes
Succeeded, so their claims are released (and a Job's pod would complete its Job). The node agent
(``tessera.dev.nodeagent``) does more (the real driver and its gRPC prepare per node) but lists
each node's pods twice a second: 1000 lists a second at 500 nodes, more than this machine's
control plane serves.

Queues A and B have equal GPU quotas (half the GPUs each). Per contender round, on the same
nodes:

(a) **fill**: queue A submits one single-GPU Job per GPU of the cluster (one pod each, the claim
    from a ResourceClaimTemplate); the clock runs from the first create until every pod is bound.
    Figure: jobs/s. The CPU seconds the scheduler, the extender and the control plane (etcd,
    kube-apiserver, kube-controller-manager; read from ``/proc/<pid>/stat``) spent meanwhile are
    reported beside it;
(b) **reclaim**: with every GPU held by A, half of them borrowed, queue B (within its quota)
    submits one single-GPU Job; the clock runs until its pod is bound. B's Job then goes, A's
    evicted Job's new pod takes the GPU back, and the next sample starts (``--samples``). Figures:
    the average and the p95 (nearest rank) of the samples, and GPUs evicted per GPU reclaimed.

Contenders: the plain kube-scheduler (no extender; A's pods in a PriorityClass of value 10, B's
of 1000, so its priority preemption may act: it cannot free a GPU held through a DRA claim, so its
one sample waits ``PLAIN_RECLAIM_WAIT_S`` and is reported not reached), kube-scheduler + Tessera
(the shipped configuration, the extender in its own process during its rounds), the floor
(``bench.e2e``'s do-nothing extender behind the scheduler configured as Tessera's: what calling
any extender costs the fill; it reclaims as plain does, by priority; ``--no-floor`` leaves it
out) and, when ``hack/build-kai.sh`` built it, KAI Scheduler with its operator's configuration
(``bench.kai``).
``--rounds N`` alternates them (``bench.e2e.compare``); each figure is the median over the rounds,
with its ratio against plain's median in the same run (``--rounds 0``: none, the churn only).

(c) **churn**, after the rounds, with Tessera and then with KAI's default actions when it was
built (``--churn-s``; 600 s at full size): three queues with equal quotas alternate busy and idle
spells (``bench.reclaim``'s churn, the same seed for both), each pod running 10-40 s. The churn's
pods alone never contend at this size (created a few a second, they keep a few hundred of the
thousands of GPUs busy), so each churn starts from a full cluster: a **base** borrower, a queue
with no quota, first fills every GPU with one-GPU pods that outlast the churn and keeps a backlog
pending throughout (``bench.reclaim.ChurnBase``). Every churn pod started within its queue's
quota then reclaims a GPU, mostly from the base, and each GPU that frees goes back to the base
unless a churn queue is owed it. Counted are evictions (of them the base's), evictions undone (a
reclaimed GPU taken back for the queue it came from; target 0), the churn pods' wait from create
to bind (p50, p95), and the work lost (GPU-seconds the evicted pods had run in the churn, against
the GPU time used, the base's included, and per eviction).

Anchors: KAI Scheduler's nightly 500-node suite fills the cluster at about 10 single-GPU jobs/s
(4000 in 6 min 38 s) and averages 13.9 s to reclaim one GPU for a starved queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from extender.kubeapi import JsonObject, KubeError, request
from tessera.dev.nodeagent import running_status
from tessera.simulate.report import format_table

from .e2e import (
    CREATE_CONCURRENCY,
    FLOOR_LABEL,
    FLOOR_SCHEDULER,
    GPUS_PER_NODE,
    PLAIN_SCHEDULER,
    TESSERA_SCHEDULER,
    BenchCluster,
    CpuUse,
    add_floor_flag,
    bench_cluster,
    bench_parser,
    bound_pod_events,
    bounded,
    compare,
    percentile,
    seconds_list,
    watching,
)
from .kai import DEFAULT_ACTIONS
from .reclaim import (
    HIGH,
    KAI_PER_GPU_S,
    LOW,
    PRIORITY_PATH,
    QUEUE_A,
    QUEUE_B,
    ChurnResult,
    _create_queues,
    _submit,
    churn_contest,
    churn_table,
)

log = logging.getLogger(__name__)

DEFAULT_NODES, FULL_NODES = 500, 1000
DEFAULT_SAMPLES = 10
DEFAULT_CHURN_S, FULL_CHURN_S = 120.0, 600.0
CHURN_QUEUES = 3
# A busy churn queue keeps this many pods pending at most: topping up thousands at once would
# stall the churn's loop for a minute of creates.
CHURN_BACKLOG = 200
PLAIN_RECLAIM_WAIT_S = 30.0  # plain's one sample: its preemption cannot free a DRA-claimed GPU
KAI_RECLAIM_WAIT_S = 120.0  # a KAI sample not served by then is reported as such
SMOKE_NODES, SMOKE_SAMPLES, SMOKE_CHURN_S = 5, 2, 10.0
SMOKE_WAIT_S, SMOKE_TIMEOUT_S = 5.0, 60.0  # plain's sample; everything else: a stuck smoke fails in a minute
KAI_NIGHTLY_JOBS_PER_S = 4000 / 398  # 4000 single-GPU jobs on 500 nodes in 6 min 38 s
JOBS_PATH = "/apis/batch/v1/namespaces/{namespace}/jobs"


# -- pure helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleRun:
    """One contender's round: the fill, and the reclaim samples after it."""

    setup: str
    jobs: int
    fill_s: float
    fill_cpu: CpuUse = field(default_factory=CpuUse)
    reclaim_s: tuple[float, ...] = ()  # one per sample; a sample not reached counts its wait
    reached: bool = True  # every sample's pod was bound
    evicted: int = 0  # A's pods gone over all the samples

    @property
    def seconds(self) -> float:  # bench.e2e.Timed: the round's median is by its fill
        return self.fill_s

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.fill_s if self.fill_s > 0 else 0.0

    @property
    def reclaim_mean_s(self) -> float:
        return statistics.fmean(self.reclaim_s) if self.reclaim_s else 0.0

    @property
    def reclaim_p95_s(self) -> float:
        return percentile(self.reclaim_s, 95) if self.reclaim_s else 0.0


@dataclass(frozen=True)
class Figures:
    """One contender's figures: each the median over its rounds (``statistics.median``: the mean of
    the middle two of an even count)."""

    label: str
    rounds: tuple[ScaleRun, ...]

    def _median(self, figure: Callable[[ScaleRun], float]) -> float:
        return statistics.median(figure(run) for run in self.rounds)

    @property
    def jobs_per_s(self) -> float:
        return self._median(lambda run: run.jobs_per_s)

    @property
    def reclaim_mean_s(self) -> float:
        return self._median(lambda run: run.reclaim_mean_s)

    @property
    def reclaim_p95_s(self) -> float:
        return self._median(lambda run: run.reclaim_p95_s)

    @property
    def reached(self) -> bool:
        return all(run.reached for run in self.rounds)

    @property
    def evicted_per_gpu(self) -> float:
        """A's pods evicted per GPU B got, over every round's samples that were served."""
        served = sum(len(run.reclaim_s) for run in self.rounds if run.reached)
        return sum(run.evicted for run in self.rounds if run.reached) / served if served else 0.0

    def cpu(self, part: str) -> float:
        """Median CPU seconds of ``part`` (scheduler_s, extender_s or control_plane_s) per fill."""
        return self._median(lambda run: float(getattr(run.fill_cpu, part)))


@dataclass(frozen=True)
class ScaleResult:
    nodes: int
    samples: int
    contenders: tuple[Figures, ...]  # plain first, then Tessera
    churn: tuple[ChurnResult, ...] = ()  # Tessera's, then KAI's
    loads: tuple[str, ...] = field(default=())  # /proc/loadavg at the start and the end

    @property
    def plain(self) -> Figures:
        return self.contenders[0]

    def figure(self, label: str) -> Figures | None:
        return next((f for f in self.contenders if f.label == label), None)

    @property
    def vs_floor(self) -> float | None:
        """Tessera's fill rate over the do-nothing extender's (None without floor rounds)."""
        floor = self.figure(FLOOR_LABEL)
        if floor is None or not floor.jobs_per_s:
            return None
        return self.contenders[1].jobs_per_s / floor.jobs_per_s


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def scale_table(result: ScaleResult) -> str:
    """The contenders' medians, each with its ratio against plain's; a reclaim not reached reads
    ``not in S`` (its ratio ``-``)."""
    headers = [
        "scheduler",
        "nodes",
        "GPUs",
        "fill s (each round)",
        "jobs/s",
        "vs plain",
        "reclaim avg s",
        "reclaim p95 s",
        "vs plain",
        "evicted / GPU",
        "scheduler CPU s",
        "extender CPU s",
        "control plane CPU s",
        "vs plain",
    ]
    plain = result.plain
    plain_reclaim = plain.reclaim_mean_s if plain.reached else 0.0
    rows = []
    for figures in result.contenders:
        reclaimed = figures.reached
        rows.append(
            [
                figures.label,
                str(result.nodes),
                str(result.nodes * GPUS_PER_NODE),
                f"{statistics.median(r.fill_s for r in figures.rounds):.1f} "
                f"({seconds_list(r.fill_s for r in figures.rounds)})",
                f"{figures.jobs_per_s:.1f}",
                _ratio(figures.jobs_per_s, plain.jobs_per_s),
                f"{figures.reclaim_mean_s:.1f}" if reclaimed else f"not in {figures.reclaim_mean_s:.0f}",
                f"{figures.reclaim_p95_s:.1f}" if reclaimed else "-",
                _ratio(figures.reclaim_mean_s, plain_reclaim) if reclaimed else "-",
                f"{figures.evicted_per_gpu:.2f}" if reclaimed else "-",
                f"{figures.cpu('scheduler_s'):.1f}",
                f"{figures.cpu('extender_s'):.1f}",
                f"{figures.cpu('control_plane_s'):.1f}",
                _ratio(figures.cpu("control_plane_s"), plain.cpu("control_plane_s")),
            ]
        )
    anchor = (
        f"anchor: KAI Scheduler's nightly at 500 nodes: {KAI_NIGHTLY_JOBS_PER_S:.1f} jobs/s to fill, "
        f"{KAI_PER_GPU_S} s average to reclaim one GPU; reclaim: {result.samples} samples per round, "
        f"p95 nearest rank; CPU: during the fill"
    )
    vs_floor = result.vs_floor
    floor_line = (
        f"Tessera / floor, fill: {vs_floor:.2f}x ({FLOOR_LABEL}, the scheduler configured as Tessera's)"
        if vs_floor is not None
        else "Tessera / floor: not measured (--no-floor)"
    )
    return f"{format_table(headers, rows)}\n{floor_line}\n{anchor}"


def figures_json(result: ScaleResult) -> dict[str, float | int]:
    """The headline figures, machine-readable (one line after the table)."""
    out: dict[str, float | int] = {"nodes": result.nodes}
    for figures in result.contenders:
        key = figures.label
        out[f"jobs_per_s ({key})"] = round(figures.jobs_per_s, 2)
        out[f"reclaim_avg_s ({key})"] = round(figures.reclaim_mean_s, 2) if figures.reached else -1
        out[f"reclaim_p95_s ({key})"] = round(figures.reclaim_p95_s, 2) if figures.reached else -1
        out[f"control_plane_cpu_s ({key})"] = round(figures.cpu("control_plane_s"), 1)
    if result.vs_floor is not None:
        out["tessera_vs_floor"] = round(result.vs_floor, 3)
    for churn in result.churn:
        out[f"churn_evictions ({churn.setup})"] = churn.evictions
        out[f"churn_undone ({churn.setup})"] = churn.undone
        out[f"churn_lost_pct ({churn.setup})"] = round(churn.lost_pct, 2)
    return out


# -- the light kubelet -------------------------------------------------------------------------


class LightKubelet:
    """Every fake node's kubelet in one watch: marks bound Pending pods Running, finishes graceful
    deletions at once, and marks pods Succeeded on request (``succeed``). ``workers`` API calls in
    flight at most, so a burst of bindings does not hold up the watch."""

    def __init__(self, bench: BenchCluster, workers: int = 8) -> None:
        self.api = bench.api
        self.workers = workers
        self.work: asyncio.Queue[tuple[str, JsonObject]] = asyncio.Queue()
        self.seen: set[tuple[str, str]] = set()  # (pod uid, what was done): each once

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.workers):
                group.create_task(self._worker())
            group.create_task(self._follow())

    async def _follow(self) -> None:
        async for kind, pod in bound_pod_events(self.api, "/api/v1/pods"):
            if kind == "DELETED":
                continue
            metadata = pod["metadata"]
            phase = (pod.get("status") or {}).get("phase", "Pending")
            action = "finish" if metadata.get("deletionTimestamp") else "start" if phase == "Pending" else ""
            if action and (metadata["uid"], action) not in self.seen:
                self.seen.add((metadata["uid"], action))
                self.work.put_nowait((action, pod))

    async def _worker(self) -> None:
        while True:
            action, pod = await self.work.get()
            metadata = pod["metadata"]
            path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}"
            try:
                if action == "start":
                    await request(
                        self.api,
                        "PATCH",
                        f"{path}/status",
                        body=running_status(pod, pod["spec"]["nodeName"]),
                        content_type="application/merge-patch+json",
                    )
                else:  # the pause container stops at once: the kubelet's final delete
                    await request(self.api, "DELETE", path, query={"gracePeriodSeconds": "0"})
            except KubeError as exc:
                if exc.status not in (404, 409):  # gone, or changed meanwhile: nothing left to do
                    log.warning("light kubelet: %s %s: %s", action, metadata["name"], exc)
            finally:
                self.work.task_done()

    async def succeed(self, namespace: str, names: Sequence[str]) -> None:
        """Marks the pods Succeeded, as a kubelet does when their containers exit 0."""

        async def one(name: str) -> None:
            with contextlib.suppress(KubeError):  # gone meanwhile (evicted): nothing to finish
                await request(
                    self.api,
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                    body={"status": {"phase": "Succeeded"}},
                    content_type="application/merge-patch+json",
                )

        await bounded(CREATE_CONCURRENCY, (functools.partial(one, name) for name in names))


@contextlib.asynccontextmanager
async def light_kubelet(bench: BenchCluster) -> AsyncIterator[LightKubelet]:
    kubelet = LightKubelet(bench)
    task = asyncio.create_task(kubelet.run())
    try:
        yield kubelet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- a round -----------------------------------------------------------------------------------


async def _delete_jobs(bench: BenchCluster, namespace: str, names: Sequence[str]) -> None:
    """Deletes the Jobs one by one (their pods by the garbage collector): one delete-collection
    call of 4000 Jobs outlasts the apiserver's request timeout (504)."""

    async def one(name: str) -> None:
        try:
            await request(
                bench.api,
                "DELETE",
                f"{JOBS_PATH.format(namespace=namespace)}/{name}",
                query={"propagationPolicy": "Background"},
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    await bounded(CREATE_CONCURRENCY, (functools.partial(one, name) for name in names))


async def _scale_round(
    bench: BenchCluster,
    namespace: str,
    scheduler: str,
    samples: int,
    wait_s: float,
    fill_timeout: float,
) -> ScaleRun:
    """Fill, then ``samples`` reclaims of one GPU (each waiting at most ``wait_s``); the Jobs go
    at the end (``compare`` clears the pods). Plain and the floor reclaim by priority only."""
    plain = scheduler in (PLAIN_SCHEDULER, FLOOR_SCHEDULER)
    gpus = len(bench.nodes) * GPUS_PER_NODE
    names = [f"a-{index:05d}" for index in range(gpus)]
    async with watching(bench.api, namespace) as tracker:
        cpu_before = bench.cpu_seconds(scheduler)
        started = time.monotonic()
        await _submit(bench, namespace, scheduler, names, QUEUE_A, LOW if plain else None, jobs=True)
        filled = await tracker.wait_for(
            lambda t: t.per_queue().get(QUEUE_A, 0) >= gpus, fill_timeout, f"A's {gpus} jobs bound"
        )
        cpu = bench.cpu_seconds(scheduler) - cpu_before
        log.info("%s: %d jobs bound after %.1fs", scheduler, gpus, filled - started)
        times: list[float] = []
        reached = True
        evicted_before = list(tracker.deleted.values()).count(QUEUE_A)
        for index in range(samples):
            name = f"b-{index:03d}"
            asked = time.monotonic()
            await _submit(bench, namespace, scheduler, [name], QUEUE_B, HIGH if plain else None, jobs=True)
            try:
                bound = await tracker.wait_for(lambda t: QUEUE_B in t.per_queue(), wait_s, f"B's job {name}")
            except TimeoutError:
                times.append(wait_s)
                reached = False
                break
            times.append(bound - asked)
            log.info("%s: B's job %s bound after %.1fs", scheduler, name, bound - asked)
            # The GPU goes back to A (its evicted Job's new pod) before the next sample.
            await _delete_jobs(bench, namespace, [name])
            b_pods = [pod for pod, queue in tracker.bound.items() if queue == QUEUE_B]
            await bench.delete_pods(namespace, b_pods)
            await tracker.wait_for(
                lambda t: t.per_queue().get(QUEUE_A, 0) >= gpus and QUEUE_B not in t.per_queue(),
                fill_timeout,
                "A to hold every GPU again",
            )
        evicted = list(tracker.deleted.values()).count(QUEUE_A) - evicted_before
    await _delete_jobs(bench, namespace, [*names, *(f"b-{index:03d}" for index in range(len(times)))])
    return ScaleRun(scheduler, gpus, filled - started, cpu, tuple(times), reached, evicted)


async def run_scale(
    nodes: int,
    rounds: int,
    samples: int,
    churn_s: float,
    kai: bool = True,
    floor: bool = True,
    plain_wait_s: float = PLAIN_RECLAIM_WAIT_S,
    fill_timeout: float | None = None,
) -> ScaleResult:
    """The suite on a fresh local control plane. A reclaim sample waits at most ``plain_wait_s``
    for plain and the floor (``floor``: raced), ``KAI_RECLAIM_WAIT_S`` for KAI and ``fill_timeout``
    (default: 2 jobs/s, far slower than any contender here, at least 5 minutes) for Tessera, whose
    miss would be a failure."""
    gpus = nodes * GPUS_PER_NODE
    fill_timeout = fill_timeout or max(300.0, gpus / 2)
    loads = [_loadavg()]
    async with bench_cluster(nodes) as bench, light_kubelet(bench) as kubelet:
        for name, value in ((LOW, 10), (HIGH, 1000)):
            await request(bench.api, "POST", PRIORITY_PATH, body={"metadata": {"name": name}, "value": value})
        queues = await _create_queues(bench, (QUEUE_A, QUEUE_B), gpus // 2)
        variants = [DEFAULT_ACTIONS] if kai and await bench.enable_kai(queues) else []
        waits = {
            PLAIN_SCHEDULER: plain_wait_s,
            FLOOR_SCHEDULER: plain_wait_s,
            TESSERA_SCHEDULER: fill_timeout,
        }

        def scenario(namespace: str, scheduler: str) -> Awaitable[ScaleRun]:
            wait = waits.get(scheduler, KAI_RECLAIM_WAIT_S)
            return _scale_round(bench, namespace, scheduler, samples, wait, fill_timeout)

        contest = await compare(bench, scenario, rounds, variants, floor)
        backlog = min(gpus // CHURN_QUEUES, CHURN_BACKLOG)
        churn = (
            await churn_contest(
                bench,
                (QUEUE_A, QUEUE_B),
                CHURN_QUEUES,
                churn_s,
                backlog,
                bool(variants),
                kubelet.succeed,
                base_fill_timeout=fill_timeout,
            )
            if churn_s > 0
            else []
        )
    loads.append(_loadavg())
    contenders = [
        *((Figures("plain kube-scheduler", contest.plain),) if contest.plain else ()),
        *((Figures("kube-scheduler + Tessera", contest.tessera),) if contest.tessera else ()),
        *((Figures(FLOOR_LABEL, contest.floor),) if contest.floor else ()),
        *(Figures(label, runs) for label, runs in contest.kai.items() if runs),
    ]
    return ScaleResult(nodes, samples, tuple(contenders), tuple(churn), tuple(loads))


def _loadavg() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def main(argv: Sequence[str] | None = None) -> int:
    parser = bench_parser(
        "python -m bench.scale",
        __doc__,
        full=f"{FULL_NODES} nodes and the {FULL_CHURN_S:.0f}-second churn",
        nodes=f"default {DEFAULT_NODES}",
        pods="unused (A fills every GPU with single-GPU jobs)",
        smoke=f"{SMOKE_NODES} nodes, {SMOKE_SAMPLES} reclaim samples waiting {SMOKE_WAIT_S:g} s at most, "
        f"{SMOKE_CHURN_S:g} s of churn",
    )
    parser.add_argument(
        "--samples", type=int, default=DEFAULT_SAMPLES, help=f"reclaims per round (default {DEFAULT_SAMPLES})"
    )
    parser.add_argument(
        "--churn-s",
        type=float,
        help=f"length of the churn (default {DEFAULT_CHURN_S:.0f}; --full {FULL_CHURN_S:.0f}; 0: none)",
    )
    add_floor_flag(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    timeouts: dict[str, float] = {}
    if args.smoke:
        args.nodes, args.rounds, args.samples, args.churn_s = SMOKE_NODES, 1, SMOKE_SAMPLES, SMOKE_CHURN_S
        timeouts = {"plain_wait_s": SMOKE_WAIT_S, "fill_timeout": SMOKE_TIMEOUT_S}
    nodes = args.nodes or (FULL_NODES if args.full else DEFAULT_NODES)
    churn_s = args.churn_s if args.churn_s is not None else (FULL_CHURN_S if args.full else DEFAULT_CHURN_S)
    result = asyncio.run(
        run_scale(nodes, args.rounds, args.samples, churn_s, not args.no_kai, not args.no_floor, **timeouts)
    )
    print(
        f"\n[13] scale: {nodes} nodes x {GPUS_PER_NODE} GPUs (slices written, one light kubelet), "
        f"{args.rounds} round(s); load {' -> '.join(result.loads)}"
    )
    print(scale_table(result) if result.contenders else "no rounds (--rounds 0): the churn only")
    if result.churn:
        first = result.churn[0]
        print(
            f"\nchurn: {first.queues} queues with equal quotas, {first.seconds:.0f} s, the same seed each, "
            f"from every GPU held by a borrower with no quota (the base)"
        )
        print(churn_table(result.churn))
    print(json.dumps(figures_json(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
