"""Benchmark: gangs preferring one rack, live, beside KAI Scheduler (issue 29, item 7).

How many racks does each gang span, and how long does it wait to start, when the same gangs
arrive on the same labelled cluster under kube-scheduler + Tessera and under KAI Scheduler, each
asked in its own API to keep a gang inside one rack?

**The cluster.** A fresh local control plane (``bench.e2e.bench_cluster``) with fake nodes of 8
simulated H100s each (their ResourceSlices written as the DRA driver publishes them) in the
layout of ``tessera.dev.localcluster.node_layout`` (``--layout``, default ``2x4x2``: 2 blocks x
4 racks x 2 nodes, 128 GPUs in 8 racks; ``--full`` ``2x4x4``, 256 GPUs), labelled
``example.com/block`` and ``example.com/rack`` (rack names repeat per block: domains
``block0/rack0`` .. ``block1/rack3``). One light kubelet (``bench.scale.light_kubelet``) marks
bound pods Running and the pods of a gang that has run its time Succeeded, so their claims are
released.

**The workload** (``live_workload``, seeded): ``bench.topologywaits``' draw (``draw_gangs``): gangs
of 2-32 GPUs (2, 4, 6, 8, 12, 16, 24, 32), one, two or four GPUs a member, all members its
minimum, arriving with exponential gaps at ``--load`` times the GPUs the lone pods leave, each
running 200-900 s, every time multiplied by ``--time-scale`` (default 0.1: 20-90 s). First, a
quarter of the GPUs go to lone one-GPU pods of a second queue, each a one-pod Job kept to a node
drawn with the seed (``nodeSelector`` on the hostname; an evicted one comes back pending there),
that run for the whole round: they fragment the racks alike for every contender. Queues:
``train`` (the gangs) with a quota of the GPUs the lone pods leave, ``batch`` (the lone pods)
with theirs; nothing is borrowed, so nothing is reclaimed.

**The contenders**, one after another on the same nodes, each in a fresh namespace:

- kube-scheduler + Tessera as shipped (``tessera.cli.extender_config``, ``SCHEDULER_PROFILE``),
  the extender with ``--topology-levels block=example.com/block,rack=example.com/rack,
  host=kubernetes.io/hostname``; a gang is bare pods labelled ``scheduling.tessera.dev/workload``
  with ``scheduling.tessera.dev/min-members: N`` and ``scheduling.tessera.dev/topology-preferred:
  rack`` (docs/workloads.md, "Topology-aware gangs");
- the same without the ask (the reference: the plain binpack of a gang; ``--no-reference``
  leaves it out);
- KAI Scheduler at its pin (``bench.kai``: its operator's configuration, default actions) with a
  ``Topology`` of the three node labels; a gang is a ``scheduling.run.ai/v2alpha2`` PodGroup
  (``minMember`` N, ``queue``, ``priorityClassName: train`` as its podgrouper gives bare pods,
  ``topologyConstraint: {topology, preferredTopologyLevel: example.com/rack}``) made before its
  pods, which carry ``pod-group-name`` and ``kai.scheduler/skip-podgrouper: "true"``; the lone
  pods' Jobs its podgrouper groups. Skipped with the reason when ``hack/build-kai.sh`` has not
  built it (``--no-kai``: left out).

**The figures**, per contender: gangs started (of those drawn) before ``--timeout`` after the
first; racks spanned per gang (the distinct racks of the nodes its pods were bound to when its
last member bound), mean and max, and the mean over the gangs every contender started; gang time
to start (from the first create of the gang, its PodGroup for KAI, to its last member bound),
mean and p95 (nearest rank); gangs **spread although one rack held them** (over several racks
while, when the gang started, one rack had room for all its members on the GPUs the lone pods
and the gangs still running left: the spread a placement could have avoided then, as against
the spread the history forced); pods of the round the scheduler deleted (evictions: the bench
deletes none before the round ends), lone pods and gang members apart. The ratio line is
Tessera's mean racks per gang over KAI's (the issue's target: at most 1.00x), on every gang each
started and on the gangs both started. ``--rounds N`` alternates the contenders and pools their
gangs.

    python -m bench.topology_live [--seed 0] [--gangs 30] [--load 1.0] [--time-scale 0.1]
                                  [--layout 2x4x2 | --full] [--rounds 1] [--no-kai] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

from contract.names import (
    MIN_MEMBERS_ANNOTATION,
    TOPOLOGY_PREFERRED_ANNOTATION,
    WORKLOAD_LABEL,
)
from extender.kubeapi import request
from extender.policy.topology import parse_topology
from tessera.dev.localcluster import HOSTNAME_LABEL, NodeLayout, node_layout
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .e2e import (
    CREATE_CONCURRENCY,
    GPUS_PER_NODE,
    TESSERA_SCHEDULER,
    BenchCluster,
    alternating,
    bench_cluster,
    bounded,
    gpu_pod,
    kai_running,
    percentile,
    tessera_running,
    watching,
)
from .kai import (
    DEFAULT_ACTIONS,
    KAI_PODGROUPS_PATH,
    KAI_SCHEDULER,
    kai_pod_group,
    kai_topology,
    pod_group_member,
)
from .reclaim import _clear as clear_jobs
from .reclaim import _create_queues, as_job
from .scale import LightKubelet, _loadavg, light_kubelet
from .topologywaits import GANG_GPUS, draw_gangs

log = logging.getLogger(__name__)

LAYOUT, FULL_LAYOUT, SMOKE_LAYOUT = "2x4x2", "2x4x4", "1x2x1"
LONE_SHARE = 0.25  # of the GPUs, to lone one-GPU pods (bench.topologywaits: 32 of 128)
DEFAULT_GANGS, SMOKE_GANGS = 30, 3
SMOKE_SIZES = (2, 4, 6)  # gangs that fit the smoke's 12 free GPUs
DEFAULT_TIME_SCALE, SMOKE_TIME_SCALE = 0.1, 0.01
DEFAULT_TIMEOUT_S, SMOKE_TIMEOUT_S = 600.0, 120.0
LONE_TIMEOUT_S = 120.0
TRAIN, BATCH = "train", "batch"
RACK = "rack"
KAI_TOPOLOGY = "bench-racks"


# -- pure parts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveGang:
    """A gang of the live workload: ``members`` pods of ``per_member`` GPUs, all needed to start;
    it arrives ``arrival_s`` after the first gang and runs ``duration_s`` once started."""

    name: str
    members: int
    per_member: int
    arrival_s: float
    duration_s: float

    @property
    def gpus(self) -> int:
        return self.members * self.per_member

    def pod_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.members)]


@dataclass(frozen=True)
class LonePod:
    """A one-GPU pod kept to ``node`` for the whole round."""

    name: str
    node: str


@dataclass(frozen=True)
class LiveWorkload:
    gangs: tuple[LiveGang, ...]
    lone: tuple[LonePod, ...]

    @property
    def gpu_counts(self) -> set[int]:
        """The GPUs per pod the round's claim templates must offer."""
        return {1, *(gang.per_member for gang in self.gangs)}


def live_workload(
    seed: int,
    nodes: Sequence[str],
    gangs: int,
    load: float = 1.0,
    time_scale: float = DEFAULT_TIME_SCALE,
    sizes: Sequence[int] = GANG_GPUS,
    lone_share: float = LONE_SHARE,
) -> LiveWorkload:
    """The seed's workload on ``nodes`` of GPUS_PER_NODE GPUs (see the module doc): the gangs of
    ``bench.topologywaits.draw_gangs`` with their times scaled and the first arrival at 0, then the
    lone pods' nodes drawn from the same generator, at most GPUS_PER_NODE on a node."""
    lone = round(len(nodes) * GPUS_PER_NODE * lone_share)
    draw = random.Random(seed)
    drawn = draw_gangs(draw, gangs, len(nodes) * GPUS_PER_NODE - lone, load, sizes)
    first = drawn[0].arrival_s if drawn else 0.0
    live = tuple(
        LiveGang(
            f"g{gang.gpus}-{index}",
            gang.members,
            gang.per_member,
            round((gang.arrival_s - first) * time_scale, 2),
            round(gang.duration_s * time_scale, 2),
        )
        for index, gang in enumerate(drawn)
    )
    taken: dict[str, int] = dict.fromkeys(nodes, 0)
    pods: list[LonePod] = []
    for index in range(lone):
        node = draw.choice([name for name in nodes if taken[name] < GPUS_PER_NODE])
        taken[node] += 1
        pods.append(LonePod(f"lone-{index}", node))
    return LiveWorkload(live, tuple(pods))


def rack_domains(layout: NodeLayout) -> dict[str, str]:
    """Each node's rack as a domain path (``block0/rack1``), as the extender names it from the
    layout's levels (``Topology.domain_of``)."""
    topology = parse_topology(layout.levels) if layout.levels else None
    level = topology.level(RACK) if topology else None
    if topology is None or level is None:
        raise ValueError(f"layout without racks: levels {layout.levels!r}")
    domains = {node: topology.domain_of(labels, level) for node, labels in layout.nodes.items()}
    return {node: domain for node, domain in domains.items() if domain is not None}


def racks_spanned(nodes: Iterable[str], rack_of: Mapping[str, str]) -> int:
    """The distinct racks of the nodes a gang's pods were bound to."""
    return len({rack_of[node] for node in nodes})


def free_gpus(
    nodes: Iterable[str], lone: Iterable[LonePod], running: Iterable[tuple[LiveGang, Sequence[str]]]
) -> dict[str, int]:
    """Each node's GPUs left by the lone pods and the gangs `running` (each with its members'
    nodes)."""
    free = dict.fromkeys(nodes, GPUS_PER_NODE)
    for pod in lone:
        free[pod.node] -= 1
    for gang, placed in running:
        for node in placed:
            free[node] -= gang.per_member
    return free


def rack_free(free: Mapping[str, int], rack_of: Mapping[str, str], per_member: int = 1) -> dict[str, int]:
    """Each rack's room for members of `per_member` GPUs on the nodes' `free` GPUs (1: its free
    GPUs), by rack name."""
    per_rack: dict[str, int] = {}
    for node, gpus in free.items():
        per_rack[rack_of[node]] = per_rack.get(rack_of[node], 0) + gpus // per_member
    return dict(sorted(per_rack.items()))


def largest_rack_room(free: Mapping[str, int], rack_of: Mapping[str, str], per_member: int) -> int:
    """The most members of `per_member` GPUs one rack holds, on the nodes' `free` GPUs."""
    return max(rack_free(free, rack_of, per_member).values(), default=0)


RECENT_END_S = 10.0  # a gang that ended this recently may hold its GPUs until its claims go


@dataclass(frozen=True)
class GangStart:
    """A gang that started: its GPUs, how long it waited, the racks its pods landed in, and the
    most of its members one rack held when it started (the GPUs the lone pods and the gangs still
    running left it; -1: not known)."""

    name: str
    gpus: int
    waited_s: float
    racks: int
    rack_room: int = -1
    members: int = 0

    @property
    def spread_needlessly(self) -> bool:
        """Over several racks although one held all its members when it started."""
        return self.racks > 1 and self.rack_room >= self.members > 0


@dataclass(frozen=True)
class Contender:
    label: str
    scheduler: str  # TESSERA_SCHEDULER or KAI_SCHEDULER
    asks: bool  # each gang prefers one rack
    configuration: str


@dataclass(frozen=True)
class ContenderRun:
    """One contender's gangs (over every round it ran): those drawn, those started, and the pods
    of its rounds the scheduler deleted: lone pods (their Jobs make them again) and gang members."""

    contender: Contender
    drawn: int
    started: tuple[GangStart, ...]
    evicted_lone: int = 0
    evicted_members: int = 0

    @property
    def racks_mean(self) -> float:
        return statistics.fmean(g.racks for g in self.started) if self.started else 0.0

    @property
    def racks_max(self) -> int:
        return max((g.racks for g in self.started), default=0)

    @property
    def wait_mean_s(self) -> float:
        return statistics.fmean(g.waited_s for g in self.started) if self.started else 0.0

    @property
    def wait_p95_s(self) -> float:
        return percentile([g.waited_s for g in self.started], 95) if self.started else 0.0

    @property
    def spread_needlessly(self) -> int:
        """Gangs over several racks although one held them all when they started."""
        return sum(g.spread_needlessly for g in self.started)

    def racks_mean_of(self, names: set[str]) -> float:
        """Mean racks spanned over the gangs named (each started in every round: pooled)."""
        racks = [g.racks for g in self.started if g.name in names]
        return statistics.fmean(racks) if racks else 0.0


def pooled(runs: Sequence[ContenderRun]) -> ContenderRun:
    """One contender's rounds as one run: gangs drawn and started, and evictions, summed."""
    return ContenderRun(
        runs[0].contender,
        sum(run.drawn for run in runs),
        tuple(g for run in runs for g in run.started),
        sum(run.evicted_lone for run in runs),
        sum(run.evicted_members for run in runs),
    )


def started_by_all(runs: Sequence[ContenderRun]) -> set[str]:
    """The gangs every contender started (in every round it ran)."""
    if not runs:
        return set()

    def always(run: ContenderRun) -> set[str]:
        counts: dict[str, int] = {}
        for gang in run.started:
            counts[gang.name] = counts.get(gang.name, 0) + 1
        rounds = max(counts.values(), default=0)
        return {name for name, count in counts.items() if count == rounds}

    return set.intersection(*(always(run) for run in runs))


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def tessera_vs_kai(runs: Sequence[ContenderRun]) -> tuple[float, float] | None:
    """Tessera's (with the ask) mean racks per gang over KAI's: on every gang each started, and
    on the gangs both started; None without both (or with KAI at 0)."""
    tessera = next((r for r in runs if r.contender.scheduler == TESSERA_SCHEDULER and r.contender.asks), None)
    kai = next((r for r in runs if r.contender.scheduler == KAI_SCHEDULER), None)
    if tessera is None or kai is None or not kai.racks_mean:
        return None
    both = started_by_all([tessera, kai])
    on_both = kai.racks_mean_of(both)
    return tessera.racks_mean / kai.racks_mean, tessera.racks_mean_of(both) / on_both if on_both else 0.0


def live_table(runs: Sequence[ContenderRun]) -> str:
    """One row per contender, then the ratio line Tessera / KAI (or why it is missing)."""
    common = started_by_all(runs)
    headers = [
        "contender",
        "gangs started",
        "racks/gang mean",
        "max",
        f"mean on the {len(common)} all started",
        "start mean s",
        "start p95 s",
        "spread, one rack held it",
        "evicted: lone pods",
        "gang pods",
    ]
    rows = [
        [
            run.contender.label,
            f"{len(run.started)} / {run.drawn}",
            f"{run.racks_mean:.2f}",
            str(run.racks_max),
            f"{run.racks_mean_of(common):.2f}",
            f"{run.wait_mean_s:.1f}",
            f"{run.wait_p95_s:.1f}",
            str(run.spread_needlessly),
            str(run.evicted_lone),
            str(run.evicted_members),
        ]
        for run in runs
    ]
    ratio = tessera_vs_kai(runs)
    if ratio is None:
        line = "Tessera / KAI racks per gang: not measured (KAI did not race)"
    else:
        met = "yes" if ratio[0] <= 1.0 else "no"
        line = (
            f"Tessera / KAI racks per gang: {ratio[0]:.2f}x (every gang each started), "
            f"{ratio[1]:.2f}x (the gangs both started); target at most 1.00x: {met}"
        )
    return f"{format_table(headers, rows)}\n{line}"


def gangs_table(workload: LiveWorkload, runs: Sequence[ContenderRun]) -> str:
    """Each gang: its shape and arrival, then racks spanned and seconds to start per contender
    (the first round's; ``-``: not started; ``*`` after the racks: spread although one rack held
    all its members when it started)."""
    headers = ["gang", "GPUs", "members x GPUs", "arrives s"]
    for run in runs:
        short = run.contender.label.removeprefix("kube-scheduler + ")
        headers += [f"{short}: racks", "start s"]
    rows = []
    for gang in workload.gangs:
        row = [gang.name, str(gang.gpus), f"{gang.members} x {gang.per_member}", f"{gang.arrival_s:.1f}"]
        for run in runs:
            start = next((g for g in run.started if g.name == gang.name), None)
            if start:
                row += [f"{start.racks}{'*' if start.spread_needlessly else ''}", f"{start.waited_s:.1f}"]
            else:
                row += ["-", "-"]
        rows.append(row)
    return format_table(headers, rows)


def figures_json(runs: Sequence[ContenderRun], layout: str, seed: int) -> dict[str, object]:
    """The headline figures, machine-readable (one line after the tables)."""
    out: dict[str, object] = {"layout": layout, "seed": seed}
    for run in runs:
        key = run.contender.label
        out[f"gangs_started ({key})"] = len(run.started)
        out[f"racks_mean ({key})"] = round(run.racks_mean, 3)
        out[f"racks_max ({key})"] = run.racks_max
        out[f"start_mean_s ({key})"] = round(run.wait_mean_s, 2)
        out[f"start_p95_s ({key})"] = round(run.wait_p95_s, 2)
        out[f"evicted_lone ({key})"] = run.evicted_lone
        out[f"evicted_gang_members ({key})"] = run.evicted_members
    ratio = tessera_vs_kai(runs)
    if ratio is not None:
        out["tessera_vs_kai_racks"] = round(ratio[0], 3)
        out["tessera_vs_kai_racks_both_started"] = round(ratio[1], 3)
    return out


def tessera_contender(levels: str, asks: bool) -> Contender:
    ask = (
        f"members annotated {TOPOLOGY_PREFERRED_ANNOTATION}: {RACK}"
        if asks
        else "no topology annotation (the plain binpack of a gang)"
    )
    return Contender(
        f"kube-scheduler + Tessera, {'preferred rack' if asks else 'no ask'}",
        TESSERA_SCHEDULER,
        asks,
        "the shipped scheduler configuration (tessera.cli.extender_config, SCHEDULER_PROFILE), "
        f"the extender as shipped with --topology-levels {levels}; a gang: bare pods labelled "
        f"{WORKLOAD_LABEL}, {MIN_MEMBERS_ANNOTATION}: N, {ask}",
    )


def kai_contender(version: str, labels: Sequence[str], rack_label: str) -> Contender:
    return Contender(
        f"KAI Scheduler {version.split()[0]}, preferred rack",
        KAI_SCHEDULER,
        True,
        f"{version}, {DEFAULT_ACTIONS.label.removeprefix('KAI Scheduler, ')} as its operator configures "
        f"it at the pin (bench.kai); Topology {KAI_TOPOLOGY} levels {', '.join(labels)}; a gang: PodGroup "
        f"scheduling.run.ai/v2alpha2 minMember N, queue {TRAIN}, priorityClassName train, "
        f"topologyConstraint {{topology: {KAI_TOPOLOGY}, preferredTopologyLevel: {rack_label}}}; "
        "members annotated pod-group-name and kai.scheduler/skip-podgrouper: true",
    )


# -- a round -----------------------------------------------------------------------------------


async def _create_lone(
    bench: BenchCluster, namespace: str, contender: Contender, lone: Sequence[LonePod]
) -> None:
    """Each lone pod as a one-pod Job (``bench.reclaim.as_job``) kept to its node: a pod the
    scheduler evicts comes back pending there, as a real job's would."""
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"

    async def one(pod: LonePod) -> None:
        body = gpu_pod(namespace, pod.name, contender.scheduler, BATCH)
        body["spec"]["nodeSelector"] = {HOSTNAME_LABEL: pod.node}
        await request(bench.api, "POST", path, body=as_job(body))

    await bounded(CREATE_CONCURRENCY, (functools.partial(one, pod) for pod in lone))


async def _create_gang(
    bench: BenchCluster, namespace: str, contender: Contender, gang: LiveGang, rack_label: str
) -> None:
    """The gang's pods (KAI: its PodGroup first, preferring the rack level ``rack_label``), as the
    module doc says each contender asks."""
    if contender.scheduler == KAI_SCHEDULER:
        group = kai_pod_group(
            namespace, gang.name, TRAIN, gang.members, KAI_TOPOLOGY if contender.asks else None, rack_label
        )
        await request(bench.api, "POST", KAI_PODGROUPS_PATH.format(namespace=namespace), body=group)

    async def one(name: str) -> None:
        body = gpu_pod(namespace, name, contender.scheduler, TRAIN, gang.per_member)
        metadata = body["metadata"]
        if contender.scheduler == KAI_SCHEDULER:
            body = pod_group_member(body, gang.name)
        else:
            metadata["labels"][WORKLOAD_LABEL] = gang.name
            annotations = {MIN_MEMBERS_ANNOTATION: str(gang.members)}
            if contender.asks:
                annotations[TOPOLOGY_PREFERRED_ANNOTATION] = RACK
            metadata["annotations"] = annotations
        await request(bench.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=body)

    await bounded(CREATE_CONCURRENCY, (functools.partial(one, name) for name in gang.pod_names()))


async def run_contender(
    bench: BenchCluster,
    kubelet: LightKubelet,
    namespace: str,
    contender: Contender,
    workload: LiveWorkload,
    rack_of: Mapping[str, str],
    rack_label: str,
    timeout_s: float,
) -> ContenderRun:
    """One round: the lone pods placed and bound, then each gang created at its arrival; a gang
    whose last member is bound has started, runs its time and is marked Succeeded. The round ends
    when every gang started or ``timeout_s`` after the first gang's arrival."""
    started: list[GangStart] = []
    finishing: list[asyncio.Task[None]] = []
    running: dict[str, tuple[LiveGang, list[str]]] = {}  # gang -> its members' nodes, until it ends
    ended_at: dict[str, float] = {}  # gang -> when its pods were marked Succeeded (for the log)
    async with watching(bench.api, namespace) as tracker:
        lone = len(workload.lone)
        await _create_lone(bench, namespace, contender, workload.lone)
        await tracker.wait_for(
            lambda t: t.per_queue().get(BATCH, 0) >= lone, LONE_TIMEOUT_S, f"{lone} lone pods bound"
        )
        first = time.monotonic()
        deadline = first + timeout_s

        async def finish(gang: LiveGang) -> None:
            await asyncio.sleep(gang.duration_s)
            await kubelet.succeed(namespace, gang.pod_names())
            running.pop(gang.name, None)  # (its GPUs counted busy until its pods have ended)
            ended_at[gang.name] = time.monotonic()

        async def start(gang: LiveGang) -> None:
            await asyncio.sleep(max(0.0, first + gang.arrival_s - time.monotonic()))
            names = set(gang.pod_names())
            created = time.monotonic()
            await _create_gang(bench, namespace, contender, gang, rack_label)
            try:
                bound = await tracker.wait_for(
                    lambda t: names <= t.bound.keys(), deadline - time.monotonic(), f"gang {gang.name}"
                )
            except TimeoutError:
                log.info("%s: gang %s not started by the deadline", contender.label, gang.name)
                return
            placed = [tracker.nodes[name] for name in sorted(names)]
            racks = racks_spanned(placed, rack_of)
            free = free_gpus(rack_of, workload.lone, running.values())
            room = largest_rack_room(free, rack_of, gang.per_member)
            running[gang.name] = (gang, placed)
            start_record = GangStart(gang.name, gang.gpus, bound - created, racks, room, gang.members)
            started.append(start_record)
            if start_record.spread_needlessly:
                log.info(
                    "%s: gang %s (%d x %d GPUs) spread over %d racks although one rack held %d of "
                    "its members; free GPUs per rack then: %s; gangs running: %s; ended in the last "
                    "%g s (s ago): %s",
                    contender.label,
                    gang.name,
                    gang.members,
                    gang.per_member,
                    racks,
                    room,
                    rack_free(free, rack_of),
                    sorted(running),
                    RECENT_END_S,
                    {
                        name: round(bound - ended, 1)
                        for name, ended in ended_at.items()
                        if 0 <= bound - ended <= RECENT_END_S
                    },
                )
            log.info(
                "%s: gang %s started after %.1fs in %d rack(s)",
                contender.label,
                gang.name,
                bound - created,
                racks,
            )
            finishing.append(asyncio.create_task(finish(gang)))

        try:
            await asyncio.gather(*(start(gang) for gang in workload.gangs))
        finally:
            for task in finishing:
                task.cancel()
            await asyncio.gather(*finishing, return_exceptions=True)
        evicted = list(tracker.deleted.values())
    order = {gang.name: index for index, gang in enumerate(workload.gangs)}
    return ContenderRun(
        contender,
        len(workload.gangs),
        tuple(sorted(started, key=lambda g: order[g.name])),
        evicted.count(BATCH),
        evicted.count(TRAIN),
    )


@contextlib.asynccontextmanager
async def contender_running(bench: BenchCluster, contender: Contender) -> AsyncIterator[None]:
    """The contender's processes for as long as the block: the extender, or KAI's five."""
    running = (
        kai_running(bench, DEFAULT_ACTIONS)
        if contender.scheduler == KAI_SCHEDULER
        else tessera_running(bench)
    )
    async with running:
        yield


async def run_live(
    layout_text: str,
    seed: int,
    gangs: int,
    load: float,
    time_scale: float,
    timeout_s: float,
    rounds: int = 1,
    kai: bool = True,
    reference: bool = True,
    sizes: Sequence[int] = GANG_GPUS,
) -> tuple[LiveWorkload, list[ContenderRun], tuple[str, str]]:
    """The race on a fresh local control plane: the workload, each contender's pooled run, and
    the load average at the start and the end."""
    layout = node_layout(layout_text)
    rack_of = rack_domains(layout)
    workload = live_workload(seed, list(layout.nodes), gangs, load, time_scale, sizes)
    levels = parse_topology(layout.levels).levels
    rack_label = next(level.label for level in levels if level.name == RACK)
    loads = [_loadavg()]
    async with bench_cluster(layout) as bench, light_kubelet(bench) as kubelet:
        bench.extender_args = ["--topology-levels", layout.levels]
        free = len(layout.nodes) * GPUS_PER_NODE - len(workload.lone)
        queues = [
            *await _create_queues(bench, [TRAIN], free),
            *await _create_queues(bench, [BATCH], len(workload.lone)),
        ]
        await asyncio.to_thread(bench.start_scheduler, TESSERA_SCHEDULER, True)
        contenders = [tessera_contender(layout.levels, True)]
        if reference:
            contenders.append(tessera_contender(layout.levels, False))
        if kai and await bench.enable_kai(queues) and bench.kai is not None:
            labels = [level.label for level in levels]
            await bench.kai.install_topology(bench.api, kai_topology(KAI_TOPOLOGY, labels))
            contenders.append(kai_contender(bench.kai.version, labels, rack_label))
        runs: dict[str, list[ContenderRun]] = {c.label: [] for c in contenders}
        for contender in alternating(rounds, contenders):
            prefix = "kai" if contender.scheduler == KAI_SCHEDULER else "tessera"
            namespace = await bench.new_namespace(prefix, workload.gpu_counts)
            async with contender_running(bench, contender):
                run = await run_contender(
                    bench, kubelet, namespace, contender, workload, rack_of, rack_label, timeout_s
                )
            runs[contender.label].append(run)
            await clear_jobs(bench, namespace)
    loads.append(_loadavg())
    return workload, [pooled(runs[c.label]) for c in contenders], (loads[0], loads[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.topology_live",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--layout", help=f"BLOCKSxRACKSxNODES of {GPUS_PER_NODE} GPUs (default {LAYOUT})")
    parser.add_argument("--full", action="store_true", help=f"the layout {FULL_LAYOUT} (256 GPUs in 8 racks)")
    parser.add_argument("--seed", type=int, default=0, help="the workload's draw (default 0)")
    parser.add_argument(
        "--gangs", type=int, default=DEFAULT_GANGS, help=f"gangs drawn (default {DEFAULT_GANGS})"
    )
    parser.add_argument("--load", type=float, default=1.0, help="offered load of the gangs (default 1.0)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help=f"live seconds per second of the draw (default {DEFAULT_TIME_SCALE}: gangs run 20-90 s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds after the first gang's arrival a round ends (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds per contender, alternating, pooled (default 1)"
    )
    parser.add_argument(
        "--no-kai", action="store_true", help="leave out KAI Scheduler even when it was built"
    )
    parser.add_argument("--no-reference", action="store_true", help="leave out Tessera without the ask")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_HELP}; layout {SMOKE_LAYOUT}, {SMOKE_GANGS} gangs of "
        f"{'/'.join(map(str, SMOKE_SIZES))} GPUs, no reference",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args.layout = args.layout or (FULL_LAYOUT if args.full else LAYOUT)
    sizes: Sequence[int] = GANG_GPUS
    if args.smoke:
        args.layout, args.gangs, args.rounds, args.no_reference = SMOKE_LAYOUT, SMOKE_GANGS, 1, True
        args.time_scale, args.timeout, sizes = SMOKE_TIME_SCALE, SMOKE_TIMEOUT_S, SMOKE_SIZES
    workload, runs, loads = asyncio.run(
        run_live(
            args.layout,
            args.seed,
            args.gangs,
            args.load,
            args.time_scale,
            args.timeout,
            args.rounds,
            kai=not args.no_kai,
            reference=not args.no_reference,
            sizes=sizes,
        )
    )
    layout = node_layout(args.layout)
    racks = len(set(rack_domains(layout).values()))
    print(
        f"\n[topology live] gangs preferring one rack: layout {args.layout} "
        f"({len(layout.nodes)} nodes x {GPUS_PER_NODE} GPUs, {racks} racks), seed {args.seed}, "
        f"{len(workload.gangs)} gangs at load {args.load:g}, {len(workload.lone)} lone 1-GPU pods, "
        f"time scale {args.time_scale:g}, {args.rounds} round(s); load {' -> '.join(loads)}"
    )
    print(live_table(runs))
    print("\nconfiguration:")
    for run in runs:
        print(f"  {run.contender.label}: {run.contender.configuration}")
    print()
    print(gangs_table(workload, runs))
    print(json.dumps(figures_json(runs, args.layout, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
