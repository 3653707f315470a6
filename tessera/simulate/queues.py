"""Queue workloads: a native YAML format replayed through the extender's admission and reclaim.

Format (quantities as in Kubernetes: ``64``, ``500m``, ``512Gi``)::

    name: two-teams                      # optional; names the output files
    reclaimInterval: 1                   # s between reclaim cycles (default 1; 0: no reclaim)
    terminationDelay: 10                 # s an evicted pod takes to go (default 0)
    fairShareHistory: {enabled: true, halfLife: 24h, window: 168h, kValue: 1}  # the cluster-wide
                                         # defaults of fair share over time (default: off)
    until: 604800                        # s: the run ends here (default: when every pod is done)
    nodes:
      - {name: h100, count: 4, model: H100, gpus: 8, cpu: 64, memory: 512Gi}
    queues:                              # spec exactly as in a Queue object (manifests/crds/queues.yaml)
      - name: team-a
        spec: {resources: {gpu: {quota: 16, limit: 24}}, reclaimMinRuntime: 60}
      - name: team-b
        spec: {resources: {gpu: {quota: 16}}}
    jobs:                                # ``count`` pods, one every ``interval`` seconds from ``arrival``
      - {name: a-train, queue: team-a, count: 40, arrival: 0, interval: 1, duration: 600,
         gpus: 1, gpuMilli: 1000, cpu: 4, memory: 32Gi, models: [H100], priority: 0, preemptible: true}

``gpus: 0`` is a pod without GPUs (CPU and memory only). ``preemptible`` unset means what it means
to the extender: priority below 100 (its default ``--non-preemptible-priority``).

``minMembers: m`` (default 1: the pods are independent) makes a job's ``count`` pods one workload
of minimum ``m``, a gang (docs/workloads.md): while fewer than ``m`` of them run, they start
together or not at all - the queue must admit the missing members' summed request, and all of them
must fit, else none starts - and members beyond ``m`` start one by one. Reclaim sees the gang as
the extender does: a member at the minimum is evicted only with all the running members, elastic
ones go first, and a waiting gang is served whole.

The replay plays the three actors of a live cluster, each with the code it runs there:

* **kube-scheduler + the extender's filter.** Whenever something changes, every waiting pod is
  tried in the scheduler's order - priority, then creation time - and starts when the extender's
  admission rule (``extender.policy.admission.admit``: work-conserving, only a limit on its
  queue's path, or a quota against the non-preemptible use for a pod that is not preemptible,
  refuses; a gang is judged whole) admits it and the placement policy finds a node. GPUs held for
  another pod (a reclaim hold: the shares of the very GPUs a plan freed for it) are not offered to
  it, as the filter's ``supply_for`` does; a pod GPUs are held for starts on exactly those GPUs
  once they are free (elsewhere only if they are not and it fits there), as the filter passes it
  only its hold's node.
* **the reclaim loop.** Every ``reclaimInterval`` seconds, ``extender.policy.reclaim.plan`` runs on
  a ``ClusterSnapshot`` of the simulated cluster with the waiting GPU pods the live loop would
  hand it (``extender.policy.admission.waiting_list``: admissible, not already held for), and the
  GPUs held for pods still to start (``HeldGpus``, placed by the planner's fork); each plan's
  victims are evicted and the devices it names held for the pods it serves (the pod it was made
  for, and those riding on what it freed).
* **the pods' controller.** An evicted pod terminates for ``terminationDelay`` seconds, then its
  GPUs are free and it waits again with its original creation time, at the head of its queue; its
  runtime starts over.

Queue usage is kept in the extender's own ``QueueLedger``, one contribution per pod as in the live
picture, each pod's fairness vector and the cluster's capacity counted with the extender's
``fairness_vector``. Everything measured is integrated exactly over the event timeline (the state is
constant between events).
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.kube import validation_problems
from contract.names import GPU_MILLI, TOPOLOGY_PREFERRED_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION
from contract.quantity import parse_quantity
from extender.picture.ledger import Contribution, QueueLedger
from extender.policy.admission import (
    GANG_DOMAIN_TOO_SMALL,
    GANG_NO_DOMAIN,
    GANG_NO_FIT,
    Ask,
    GangState,
    Waiting,
    add_amounts,
    admit,
    fairness_vector,
    waiting_list,
)
from extender.policy.backfill import WaitingGang, gang_ahead, held_back
from extender.policy.deference import OwedPod, collecting_nodes, defers_to, owed_pods
from extender.policy.drf import drf_refusal, host_starved
from extender.policy.fairness import (
    EPSILON,
    FairnessSnapshot,
    FairShareInputs,
    QueueSpec,
    QueueTree,
    WeightAdjustment,
    compute_fair_shares,
)
from extender.policy.history import (
    DEFAULT_UPDATE_PERIOD_S,
    FairShareHistory,
    HistoryParams,
    HistorySettings,
)
from extender.policy.placement import NO_DOMAINS, DomainMap, GpuDemand, WorkloadMix, choose_gpus, fits
from extender.policy.reclaim import (
    PendingPod,
    Plan,
    Rules,
    plan,
    protected_restarts,
    spent_victims,
    takes_past_quota,
)
from extender.policy.snapshot import ClusterSnapshot, HeldGpus, RunningPod, take
from extender.policy.topology import (
    Level,
    Topology,
    TopologyAsk,
    ask_refusal,
    domain_sizes,
    never_held_text,
    plan_in_domain,
)
from extender.policy.workloads import Workload
from extender.queues import (
    FairShareHistoryModel,
    QueueSpecError,
    history_settings,
    parse_queue,
    validate_hierarchy,
)
from extender.rule_flags import DEFAULT_RULE_FLAGS, RuleFlags

from .cluster import Cluster
from .packing import Placer, TieBreak, workload_mix
from .policies import make_policy
from .queue_moves import QueueConsolidator, QueueMoves, QueueMoveStats
from .spells import LONG_SPELL_S, SpellCause, spell_cause
from .trace import SimNode, SimPod

MIB = 2**20
# The extender's defaults: pods at or above this priority are not preemptible unless they say so
# (--non-preemptible-priority), and freed GPUs are held this long for the pod they were freed for.
NON_PREEMPTIBLE_PRIORITY = 100
HOLD_S = 90.0


class WorkloadError(ValueError):
    """A queue workload file that cannot be used; the message says where and why."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NodeGroupModel(_Model):
    name: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)
    model: str = ""
    gpus: int = Field(ge=0)
    cpu: float = 64.0
    memory: float = 512.0 * 2**30
    labels: dict[str, str] = Field(default_factory=dict)
    # Domains per outer topology level: [2, 4] puts the nodes in 2 of the first level's domains,
    # each with 4 of the second's (equal shares of `count`), named <level><i>.
    layout: list[int] = Field(default_factory=list)

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> float:
        return parse_quantity(value)


class QueueModel(_Model):
    name: str = Field(min_length=1)
    spec: dict[str, Any] = Field(default_factory=dict)


class JobModel(_Model):
    name: str = Field(min_length=1)
    queue: str = Field(min_length=1)
    count: int = Field(default=1, ge=1)
    arrival: float = Field(default=0.0, ge=0)
    interval: float = Field(default=0.0, ge=0)
    duration: float = Field(gt=0)
    gpus: int = Field(default=1, ge=0)
    gpu_milli: int = Field(default=GPU_MILLI, alias="gpuMilli", ge=1, le=GPU_MILLI)
    cpu: float = 1.0
    memory: float = float(MIB)
    models: list[str] = Field(default_factory=list)
    priority: int = 0
    preemptible: bool | None = None  # unset: priority below NON_PREEMPTIBLE_PRIORITY
    min_members: int = Field(default=1, alias="minMembers", ge=1)  # above 1: the pods are a gang
    # Topology levels the gang asks for (docs/workloads.md, "Topology-aware gangs").
    topology_required: str = Field(default="", alias="topologyRequired")
    topology_preferred: str = Field(default="", alias="topologyPreferred")

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> float:
        return parse_quantity(value)


class LevelModel(_Model):
    name: str = Field(min_length=1)
    label: str = Field(min_length=1)


class WorkloadModel(_Model):
    name: str = "queues"
    seed: int = 0
    reclaim_interval: float = Field(default=1.0, alias="reclaimInterval", ge=0)
    termination_delay: float = Field(default=0.0, alias="terminationDelay", ge=0)
    topology: list[LevelModel] = Field(default_factory=list)  # outermost first, as --topology-levels
    fair_share_history: FairShareHistoryModel | None = Field(default=None, alias="fairShareHistory")
    until: float | None = Field(default=None, gt=0)  # s: the run ends here, work left or not
    nodes: list[NodeGroupModel] = Field(min_length=1)
    queues: list[QueueModel] = Field(min_length=1)
    jobs: list[JobModel] = Field(min_length=1)


@dataclass(frozen=True)
class QueueWorkload:
    name: str
    seed: int
    nodes: tuple[SimNode, ...]
    queues: tuple[QueueSpec, ...]
    jobs: tuple[JobModel, ...]
    reclaim_interval_s: float = 1.0  # 0: no reclaim loop
    termination_delay_s: float = 0.0
    # Node -> its topology domain, for the gang planners' memos (`DomainMap`; none from YAML: the
    # topology planner keys nothing by domain).
    domains: DomainMap = field(default_factory=dict, hash=False)
    # The topology levels, and each level's node -> domain (from the nodes' labels and layouts).
    topology: Topology = field(default_factory=lambda: Topology(()))
    level_domains: Mapping[str, DomainMap] = field(default_factory=dict, hash=False)
    # Fair share over time: the cluster-wide defaults, and what each queue sets.
    history: HistoryParams = field(default_factory=HistoryParams)
    history_settings: Mapping[str, HistorySettings] = field(default_factory=dict)
    until_s: float | None = None  # the run ends here (None: when every pod is done)


def _layout_labels(group: NodeGroupModel, topology: Topology, source: str) -> list[dict[str, str]]:
    """Each node's labels: the group's, and its domain of each outer level its layout spans."""
    if len(group.layout) > len(topology.levels) or any(n < 1 for n in group.layout):
        raise WorkloadError(
            f"{source}: node group '{group.name}': layout {group.layout} does not fit the topology levels"
        )
    domains = math.prod(group.layout)
    if group.count % domains:
        raise WorkloadError(
            f"{source}: node group '{group.name}': {group.count} nodes do not split into {domains} domains"
        )
    per_domain = group.count // domains
    labelled = []
    for i in range(group.count):
        labels, position = dict(group.labels), i // per_domain
        for level, size in reversed(list(zip(topology.levels, group.layout, strict=False))):
            labels[level.label] = f"{level.name}{position % size}"
            position //= size
        labelled.append(labels)
    return labelled


def parse_workload(data: object, source: str = "workload") -> QueueWorkload:
    try:
        model = WorkloadModel.model_validate(data)
    except ValidationError as error:
        raise WorkloadError(f"{source}: {validation_problems(error, 'workload')}") from error
    topology = Topology(tuple(Level(level.name, level.label) for level in model.topology))
    nodes = tuple(
        SimNode(
            name=f"{group.name}-{i}",
            model=group.model,
            gpus=group.gpus,
            cpu_milli=round(group.cpu * 1000),
            memory_mib=int(group.memory // MIB),
        )
        for group in model.nodes
        for i in range(group.count)
    )
    labels = [labels for group in model.nodes for labels in _layout_labels(group, topology, source)]
    level_domains: dict[str, DomainMap] = {}
    for level in topology.levels:
        found = {
            node.name: topology.domain_of(labelled, level)
            for node, labelled in zip(nodes, labels, strict=True)
        }
        level_domains[level.name] = {name: domain for name, domain in found.items() if domain is not None}
    try:
        queues = tuple(parse_queue({"metadata": {"name": q.name}, "spec": q.spec}) for q in model.queues)
    except QueueSpecError as error:
        raise WorkloadError(f"{source}: {error}") from error
    problems = {name: found for name, found in validate_hierarchy(queues).items() if found}
    if problems:
        raise WorkloadError(
            f"{source}: invalid queue hierarchy: "
            + "; ".join(f"{name}: {', '.join(found)}" for name, found in problems.items())
        )
    known = {q.name for q in queues}
    for job in model.jobs:
        if job.queue not in known:
            raise WorkloadError(f"{source}: job '{job.name}' names unknown queue '{job.queue}'")
        if job.gpus > 1 and job.gpu_milli != GPU_MILLI:
            raise WorkloadError(f"{source}: job '{job.name}': a fraction of a GPU needs gpus: 1")
        asked = {
            TOPOLOGY_REQUIRED_ANNOTATION: job.topology_required,
            TOPOLOGY_PREFERRED_ANNOTATION: job.topology_preferred,
        }
        refusal = ask_refusal(topology, {"metadata": {"annotations": asked}})
        if refusal:
            raise WorkloadError(f"{source}: job '{job.name}': {refusal}")
        if job.min_members > job.count:
            raise WorkloadError(
                f"{source}: job '{job.name}': minMembers {job.min_members} is more than its {job.count} pods"
            )
    defaults = model.fair_share_history.settings() if model.fair_share_history else HistorySettings()
    settings = {
        q.name: found
        for q in model.queues
        for found in (history_settings({"spec": q.spec}),)
        if found is not None
    }
    return QueueWorkload(
        model.name,
        model.seed,
        nodes,
        queues,
        tuple(model.jobs),
        model.reclaim_interval,
        model.termination_delay,
        topology=topology,
        level_domains=level_domains,
        history=HistoryParams(
            enabled=bool(defaults.enabled),
            half_life_s=defaults.half_life_s or None,
            window_s=defaults.window_s or HistoryParams().window_s,
            k=HistoryParams().k if defaults.k is None else defaults.k,
        ),
        history_settings=settings,
        until_s=model.until,
    )


def load_workload(path: Path) -> QueueWorkload:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise WorkloadError(f"{path}: cannot read: {error}") from error
    return parse_workload(data, str(path))


PodState = Literal["waiting", "running", "terminating", "done"]
_Signature = tuple[str, tuple[tuple[str, float], ...], bool]


@dataclass
class _Pod:
    index: int
    job: str
    queue: str
    demand: GpuDemand
    request: dict[str, float]  # its fairness vector before placement (what admission reads)
    priority: int
    preemptible: bool
    created: float  # its place in the scheduler's order; a recreated pod keeps it
    duration: float
    state: PodState = "waiting"
    waiting_since: float = 0.0
    waited_s: float = 0.0  # over all its waits (first arrival, and after each eviction)
    started: float = 0.0  # start of the current run
    ever_started: bool = False
    runs: int = 0  # finish and termination events carry it: those of an earlier run are stale
    node: int = -1
    gpus: tuple[int, ...] = ()
    gang: str = ""  # its job's workload when that is a gang ("": the pod alone)

    @property
    def key(self) -> str:
        return str(self.index)

    @cached_property
    def signature(self) -> _Signature:
        """What admission reads of the pod: pods alike in it are admitted alike."""
        return (self.queue, tuple(sorted(self.request.items())), self.preemptible)

    @property
    def order(self) -> tuple[int, float, int]:
        """kube-scheduler's queue order: higher priority first, then earlier creation."""
        return (-self.priority, self.created, self.index)


@dataclass(frozen=True)
class QueueSample:
    time: float
    queue: str
    allocated_gpu: float
    fair_share_gpu: float
    pending: int
    running: int = 0  # pods holding resources (terminating ones too)


@dataclass(frozen=True)
class EvictionRecord:
    time: float
    goal: str  # reclaim or preempt
    victim: str  # job/index of the evicted pod
    victim_queue: str
    served: str
    served_queue: str
    node: str
    gpus: float
    ran_s: float  # how long the victim had run: work lost
    # The victim started while the pod it was evicted for already waited: the scheduler's order
    # gave the borrower GPUs that reclaim then took back.
    started_while_served_waited: bool = False
    # The served pod takes its queue (or an ancestor) past its GPU quota: the eviction serves
    # share above the guarantee (`extender.policy.reclaim.takes_past_quota`).
    served_past_quota: bool = False


@dataclass
class SpellRecord:
    """A leaf queue's spell below its share that lasted over `LONG_SPELL_S`, and what kept reclaim
    from serving it when it reached that length (`tessera.simulate.spells`)."""

    queue: str
    start: float
    cause: SpellCause
    length_s: float = LONG_SPELL_S  # how long it lasted in all (set when it ends)


@dataclass(frozen=True)
class GangRecord:
    """A gang's first start: how long its first member waited for it, and the domains of each
    topology level its minimum started across."""

    name: str
    size: int  # its minimum
    ask: str  # "required rack", "preferred rack", "-"
    wait_s: float
    spanned: Mapping[str, int]  # level -> domains its members started in


@dataclass
class QueueSummary:
    name: str
    pods: int = 0
    started: int = 0
    finished: int = 0
    mean_wait_s: float = 0.0
    p50_wait_s: float = 0.0
    p95_wait_s: float = 0.0
    max_wait_s: float = 0.0
    wait_gpu_hours: float = 0.0  # each started pod's waits x the GPUs it asks for
    mean_allocated_gpu: float = 0.0
    mean_fair_share_gpu: float = 0.0
    max_allocated_gpu: float = 0.0
    limit_gpu: float | None = None
    utilisation_pct: float = 0.0  # its time-weighted GPUs, % of the cluster's
    below_fair_share_s: float = 0.0  # time a waiting pod of it would have kept it within its share
    longest_below_fair_share_s: float = 0.0  # the longest of those spells, unbroken
    deficit_gpu_s: float = 0.0  # integral of max(0, fair share - allocated)
    evicted: int = 0  # its pods evicted
    evicted_for: int = 0  # pods evicted to serve its pods
    lost_gpu_s: float = 0.0  # work its evicted pods threw away: GPUs x how long each had run
    gpu_hours: float = 0.0  # the GPUs it held, integrated over the run


@dataclass
class QueueRunResult:
    name: str
    policy: str
    reclaim_interval_s: float = 0.0
    termination_delay_s: float = 0.0
    makespan_s: float = 0.0
    utilisation_pct: float = 0.0
    # GPU-seconds idle while a waiting GPU pod, admissible, fitted some node's free resources.
    idle_gpu_s_while_fitting_pod_waits: float = 0.0
    # GPU-seconds idle while no such pod waited, but one fitted a node's free GPUs and would fit
    # its CPU and memory too if they were shared fairly (`_short_of_fair_host`).
    idle_gpu_s_while_host_starved_pod_waits: float = 0.0
    queues: list[QueueSummary] = field(default_factory=list)
    timeline: list[QueueSample] = field(default_factory=list)
    evictions: list[EvictionRecord] = field(default_factory=list)
    plans: int = 0
    gpus_needed: float = 0.0  # by the served pods, over all plans
    max_plan_ratio: float = 0.0  # GPUs evicted / GPUs needed, the worst plan
    # Evictions undone: a pod evicted for a queue whose own pod had been served by evicting
    # from the first pod's queue (served by taking from V, later taken for V).
    ping_pong: int = 0
    refusals: dict[str, int] = field(default_factory=dict)  # reason -> pods refused at least once
    gpu_s_used: float = 0.0  # GPU-seconds held by pods over the run (running and terminating)
    gangs: list[GangRecord] = field(default_factory=list)  # gangs' first starts, when levels exist
    long_spells: list[SpellRecord] = field(default_factory=list)  # leaf queues below share > 60 s
    history: bool = False  # fair share over time was on for some queue
    moves: QueueMoveStats | None = None  # with consolidation (`queue_moves`)

    @property
    def gpus_evicted(self) -> float:
        return sum(e.gpus for e in self.evictions)

    @property
    def late_evictions(self) -> int:
        return sum(1 for e in self.evictions if e.started_while_served_waited)

    @property
    def lost_gpu_s(self) -> float:
        return sum(e.gpus * e.ran_s for e in self.evictions)

    @property
    def lost_pct(self) -> float:
        """Work lost, % of the GPU time used."""
        return 100.0 * self.lost_gpu_s / self.gpu_s_used if self.gpu_s_used else 0.0

    @property
    def lost_past_quota_gpu_s(self) -> float:
        """Of the work lost, what evictions for pods past their queues' quotas lost."""
        return sum(e.gpus * e.ran_s for e in self.evictions if e.served_past_quota)

    @property
    def most_evictions_of_one_pod(self) -> int:
        return max(Counter(e.victim for e in self.evictions).values(), default=0)


def _pods(workload: QueueWorkload) -> list[_Pod]:
    pods: list[_Pod] = []
    for number, job in enumerate(workload.jobs):
        demand = GpuDemand(
            count=job.gpus,
            milli=job.gpu_milli if job.gpus == 1 else GPU_MILLI,
            models=frozenset(job.models),
            cpu_milli=round(job.cpu * 1000),
            memory_mib=int(job.memory // MIB),
        )
        preemptible = job.priority < NON_PREEMPTIBLE_PRIORITY if job.preemptible is None else job.preemptible
        for i in range(job.count):
            arrival = job.arrival + i * job.interval
            pod = _Pod(0, job.name, job.queue, demand, {}, job.priority, preemptible, arrival, job.duration)
            # Not placed yet: its GPUs count in the model it can land on when it names only one.
            model = next(iter(demand.models)) if len(demand.models) == 1 else ""
            pod.request, pod.waiting_since = (
                _vector(demand, [(model, demand.total_milli / GPU_MILLI)]),
                arrival,
            )
            pod.gang = f"{number}/{job.name}" if job.min_members > 1 else ""
            pods.append(pod)
    pods.sort(key=lambda pod: pod.created)
    for index, pod in enumerate(pods):
        pod.index = index
    return pods


def _vector(demand: GpuDemand, gpus: Sequence[tuple[str, float]]) -> dict[str, float]:
    """A pod's fairness vector as the extender's accounting counts it (`fairness_vector`): its
    CPU and memory, and its GPUs (model, amount) - those it asks for while it waits, each GPU it
    holds, of its node's model, once placed."""
    return fairness_vector(
        demand.cpu_milli / 1000, float(demand.memory_mib * MIB), gpus if demand.count else ()
    )


def _percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)]


# The phantom key of the nodes held back for the head gang while a later gang is planned.
_KEPT_FOR_HEAD = "kept-for-head"


class _Event(IntEnum):
    """Kinds of timed events; at equal times they are handled in this order."""

    FINISH = 0
    TERMINATED = 1
    HOLD_EXPIRES = 2
    ARRIVAL = 3


@dataclass(frozen=True)
class _Hold:
    """Freed GPUs kept for one pod (the extender's `GpuInventory.hold`): the devices a plan names."""

    node: int
    gpus: tuple[tuple[int, int], ...]  # (GPU index, thousandths kept)
    expires: float
    cpu_milli: int = 0  # the pod's CPU and memory, kept too when the plan freed them (rule 10)
    memory_mib: int = 0


@dataclass
class _Rest:
    """The rest of a GPU a plan freed for a fraction, kept for its queue's next fractions (rule
    10 of `extender.policy.reclaim`); what they take counts as needed by that plan."""

    queue: str
    node: int
    gpu: int
    milli: int
    expires: float
    plan: int  # its plan's index in `_Replay.plan_gpus`


@dataclass
class _Level:
    """What the metrics integrate, constant from one moment of change to the next."""

    allocated: dict[str, float]
    shares: dict[str, float]
    starved: set[str]
    idle_gpus: float  # counted only while a waiting pod would fit
    host_idle_gpus: float = 0.0  # counted only while one would fit with CPU and memory shared fairly


class _Replay:
    def __init__(
        self,
        workload: QueueWorkload,
        policy_name: str,
        seed: int,
        interval: float,
        delay: float,
        flags: RuleFlags = DEFAULT_RULE_FLAGS,
        mix: WorkloadMix | None = None,
        tie_break: TieBreak = "random",
        gangs_in_order: bool = False,
        hold_back_after_s: float | None = None,
        moves: QueueMoves | None = None,
    ):
        self.pods = _pods(workload)
        # Deference collects a node for an owed pod of several GPUs that fits nowhere
        # (`extender.policy.deference.collecting_nodes`), as the filter does with the option.
        self.collect_for_owed = flags.collect_for_owed
        # A counterfactual the extender does not do: no gang starts while an older one waits.
        self.gangs_in_order = gangs_in_order
        # The oldest waiting gang's nodes are held back from later gangs once it has waited this
        # long (`extender.policy.backfill`; None: never).
        self.hold_back_after_s = hold_back_after_s
        self.nodes = list(workload.nodes)
        self.node_index = {node.name: i for i, node in enumerate(self.nodes)}
        mix = mix or workload_mix([SimPod(p.job, p.demand) for p in self.pods])
        self.cluster = Cluster(self.nodes, mix, workload.domains)
        self.placer = Placer(self.cluster, make_policy(policy_name, mix), random.Random(seed), tie_break)
        # The capacity in the same vocabulary: each node's CPU, memory and GPUs of its model.
        self.capacity: dict[str, float] = {}
        for node in self.nodes:
            vector = fairness_vector(
                node.cpu_milli / 1000, float(node.memory_mib * MIB), [(node.model, node.gpus)]
            )
            add_amounts(self.capacity, vector)
        self.specs = list(workload.queues)
        self.names = [q.name for q in self.specs]
        self.interval, self.delay = interval, delay
        self.rules = flags.applied_to(
            Rules(
                reclaim_min_runtime_s={q.name: q.reclaim_min_runtime_s for q in self.specs},
                preempt_min_runtime_s={q.name: q.preempt_min_runtime_s for q in self.specs},
            )
        )
        self.ledger = QueueLedger()
        # Gang workload -> its minimum (docs/workloads.md), and the workload as admission reads it.
        self.minimums = {
            f"{number}/{job.name}": job.min_members
            for number, job in enumerate(workload.jobs)
            if job.min_members > 1
        }
        self.workloads = {
            gang: Workload(gang, "Job", gang, minimum, "minMembers")
            for gang, minimum in self.minimums.items()
        }
        # Gang -> its topology ask, and the levels' node -> domain maps (by node name).
        self.asks = {
            f"{number}/{job.name}": TopologyAsk(job.topology_required, job.topology_preferred)
            for number, job in enumerate(workload.jobs)
            if job.min_members > 1
        }
        self.level_domains = workload.level_domains
        self.waiting: dict[int, _Pod] = {}
        self.running: dict[int, _Pod] = {}  # running and terminating
        self.holds: dict[int, _Hold] = {}
        self.rests: dict[str, _Rest] = {}
        # Shares out of the cluster while a pass places pods: a held pod's (its index), a rest's.
        self.phantoms: dict[int | str, list[tuple[int, GpuDemand, tuple[int, ...]]]] = {}
        self.plan_gpus: list[list[float]] = []  # per plan carried out: [GPUs evicted, needed]
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, pod, run)
        self.result = QueueRunResult(workload.name, policy_name, interval, delay)
        self.refused: dict[str, set[int]] = {}
        # Reclaim cycles with nothing to do are skipped until the picture changes.
        self.version = 0
        self.fruitless: tuple[int, float] | None = None  # (version, time) of the last empty cycle
        # pod -> the queues whose pods were evicted to serve it (its run on those GPUs)
        self.served_from: dict[int, set[str]] = {}
        self.evicted_at: dict[int, float] = {}  # pod -> when it was last evicted (rule 8's window)
        # pod -> how often it was evicted (rule 14's budget): a recreated pod keeps its index, so
        # its replacement inherits the count, as the live loop's `ReplicaCounts` keeps it.
        self.evictions_of: Counter[int] = Counter()
        self.level = _Level({}, {}, set(), 0.0)
        self.last_time = 0.0
        self.integrals: dict[str, dict[str, float]] = {
            q: {"allocated": 0.0, "share": 0.0, "starved": 0.0, "deficit": 0.0} for q in self.names
        }
        self.max_allocated: dict[str, float] = dict.fromkeys(self.names, 0.0)
        # queue -> how long its current spell below its share has lasted, and its longest spell
        self.below_spell: dict[str, float] = dict.fromkeys(self.names, 0.0)
        self.longest_below: dict[str, float] = dict.fromkeys(self.names, 0.0)
        parents = {q.parent for q in self.specs}
        self.leaves = {q for q in self.names if q not in parents}
        self.open_spell: dict[str, SpellRecord] = {}  # leaf -> its current spell, once over 60 s
        # Fair share over time, as the extender's history controller runs it (None: off).
        settings = workload.history_settings
        enabled = workload.history.enabled or any(s.enabled for s in settings.values())
        # The factors move at most once per reclaim cycle (and per minute), as in the extender,
        # where the reclaim loop reads the shares a minute's update left.
        period = max(DEFAULT_UPDATE_PERIOD_S, interval)
        self.history = FairShareHistory(workload.history, period) if enabled else None
        self.until = math.inf if workload.until_s is None else workload.until_s
        self.result.history = enabled
        self.history_settings = settings
        self.adjustment: WeightAdjustment | None = None
        for pod in self.pods:
            self._push(pod.created, _Event.ARRIVAL, pod)
        self.moves = QueueConsolidator(self, moves) if moves is not None else None

    # ---- the event loop ----------------------------------------------------------------------

    def run(self) -> QueueRunResult:
        tick = 1
        while self.events and self.events[0][0] <= self.until:
            now = self.events[0][0]
            next_cycle = tick * self.interval
            if self.interval and next_cycle < now:
                quiet_until = self._quiet_until()
                if quiet_until > next_cycle:  # every cycle before it would plan nothing: skip them
                    tick = max(tick + 1, math.ceil(min(quiet_until, now) / self.interval))
                    continue
                self._advance(next_cycle)
                tick += 1
                if self._reclaim(next_cycle):
                    self._observe(next_cycle)
                continue
            self._advance(now)
            while self.events and self.events[0][0] == now:
                _, kind, index, run = heapq.heappop(self.events)
                self._handle(_Event(kind), self.pods[index], run, now)
            self._schedule(now)
            if self.interval and next_cycle == now:
                tick += 1
                self._reclaim(now)
            self._observe(now)
        if self.until < math.inf:
            self._advance(self.until)
        self.result.makespan_s = self.last_time
        self.result.moves = self.moves.stats if self.moves is not None else None
        self._summarise()
        return self.result

    def _push(self, time: float, kind: _Event, pod: _Pod) -> None:
        heapq.heappush(self.events, (time, int(kind), pod.index, pod.runs))

    def _handle(self, kind: _Event, pod: _Pod, run: int, now: float) -> None:
        if run != pod.runs:
            return  # an event of an earlier run (the pod was evicted since) or an older hold
        self.version += 1
        if kind is _Event.ARRIVAL:
            self._wait(pod, now)
        elif kind is _Event.FINISH:
            self._free(pod)
            pod.state = "done"
            self.ledger.put(pod.key, None)
            self.served_from.pop(pod.index, None)
        elif kind is _Event.TERMINATED:
            self._free(pod)
            self._wait(pod, now)
        else:
            hold = self.holds.get(pod.index)
            if hold is not None and hold.expires <= now:
                del self.holds[pod.index]
                self.served_from.pop(pod.index, None)  # it never got what was freed for it

    def _wait(self, pod: _Pod, now: float) -> None:
        pod.state, pod.waiting_since = "waiting", now
        self.waiting[pod.index] = pod
        self.ledger.put(
            pod.key, Contribution(pod.queue, "requested", pod.request, preemptible=pod.preemptible)
        )

    def _free(self, pod: _Pod) -> None:
        self.cluster.release(pod.node, pod.demand, pod.gpus)
        del self.running[pod.index]

    # ---- kube-scheduler with the extender's filter -------------------------------------------

    def _schedule(self, now: float) -> None:
        """Passes of the scheduler until none leaves a pod that deferred to an owed pod where
        that pod has started since (the live scheduler retries it then)."""
        while self._schedule_pass(now):
            pass

    def _schedule_pass(self, now: float) -> bool:
        """Every waiting pod in the scheduler's order; each starts if admitted and it fits, not
        on a node where a pod it defers to fits (`extender.policy.deference`). True when a pod
        deferred and something started after it (another pass may place it now)."""
        for index in [i for i, hold in self.holds.items() if hold.expires <= now]:
            del self.holds[index]
        for index in self.holds:
            self._reserve(index)
        for key in [k for k, rest in self.rests.items() if rest.expires <= now]:
            del self.rests[key]
        for key, rest in self.rests.items():
            self._reserve_shares(key, rest.node, ((rest.gpu, rest.milli),))
        # Within a pass usage only grows and free capacity only shrinks: a refusal, or a demand
        # that fitted nowhere (but on a rest of the pod's own queue), stays so for the rest of it
        # (admissions are kept until a start).
        refused: dict[_Signature, str] = {}  # -> the reason
        admitted: set[_Signature] = set()
        unfit: set[GpuDemand] = set()
        # Fair shares follow demand, which starting pods does not change: computed once a pass.
        shares = self._fairness().fair_shares
        admission = self._fairness(shares=shares)
        owed = self._owed(admission)
        deferred = retry = False
        tried: set[str] = set()  # gangs judged in this pass
        gang_waits = False  # (with `gangs_in_order`: an older gang did not start, the later wait)
        behind: list[WaitingGang] = []  # gangs that did not fit in this pass, in order
        for pod in sorted(self.waiting.values(), key=lambda p: p.order):
            if pod.index not in self.waiting:
                continue  # started with its gang
            if pod.gang and self._missing(pod.gang):
                if pod.gang not in tried and not gang_waits:
                    tried.add(pod.gang)
                    waiting = self._waiting_gang(pod.gang)
                    head = (
                        None
                        if self.hold_back_after_s is None
                        else gang_ahead(behind, pod.gang, waiting.order, now, self.hold_back_after_s)
                    )
                    held_nodes = self._held_back(head) if head is not None else []
                    for node in held_nodes:
                        self._reserve_shares(f"{_KEPT_FOR_HEAD}/{node}", node, self._all_shares(node))
                    refusal = self._start_gang(pod.gang, admission, now)
                    for node in held_nodes:
                        self._unreserve(f"{_KEPT_FOR_HEAD}/{node}")
                    if not refusal:
                        admission = self._fairness(shares={})
                        admitted.clear()
                    else:
                        gang_waits = self.gangs_in_order
                        if refusal in (GANG_NO_FIT, GANG_NO_DOMAIN):
                            behind.append(waiting)
                continue
            held = pod.index in self.holds
            if pod.signature in refused:
                self.refused.setdefault(refused[pod.signature], set()).add(pod.index)
                self._release(pod.index)
                continue
            # A rest kept for the pod's queue is room no other pod of that demand had, so a pod
            # a rest may take is tried though an alike pod of another queue fitted nowhere.
            if not held and pod.demand in unfit and not any(self._rests_for(pod)):
                self.refused.setdefault("no_node_fits", set()).add(pod.index)
                continue
            if pod.signature not in admitted:
                decision = admit(admission, Ask(pod.queue, pod.request, pod.preemptible))
                if not decision.admit:
                    refused[pod.signature] = decision.kind
                    self.refused.setdefault(decision.kind, set()).add(pod.index)
                    self._release(pod.index)
                    continue
                admitted.add(pod.signature)
            if held:
                self._unreserve(pod.index)
            deferring = () if held else defers_to(admission, pod.queue, pod.request, pod.preemptible, owed)
            avoid = self._owed_fit(deferring)
            collected = frozenset(self.node_index[o.collecting] for o in deferring if o.collecting)
            placement = (None if held else self._take_rest(pod)) or self._place(pod, avoid, collected)
            if placement is None:
                if held:
                    self._reserve(pod.index)
                elif (avoid is not None or collected) and self._fits_somewhere(pod.demand):
                    self.refused.setdefault("defers_to_owed", set()).add(pod.index)
                    deferred = True
                    continue
                else:
                    unfit.add(pod.demand)  # free capacity only shrinks within a pass
                self.refused.setdefault("no_node_fits", set()).add(pod.index)
                continue
            self.holds.pop(pod.index, None)  # bound: what was held for it is its own now
            self._start(pod, now, placement)
            retry = retry or deferred
            admission = self._fairness(shares=shares)
            admitted.clear()
            if any(o.queue == pod.queue for o in owed):
                owed = self._owed(admission)
        for kept in list(self.phantoms):
            self._unreserve(kept)
        self.placer.forget_gone_states()
        return retry

    def _owed(self, fairness: FairnessSnapshot) -> tuple[OwedPod, ...]:
        """The waiting pods capacity goes to first (`owed_pods`), of those the live filter looks
        at: admitted, nothing held for them, not of a gang still to be admitted whole."""
        incomplete = {p.gang for p in self.waiting.values() if p.gang and self._missing(p.gang)}
        owed = owed_pods(
            fairness,
            (
                OwedPod(pod.key, pod.queue, pod.request, pod.demand)
                for pod in sorted(self._admissible(fairness), key=lambda p: p.order)
                if pod.index not in self.holds and pod.gang not in incomplete
            ),
        )
        if not self.collect_for_owed:
            return owed
        return collecting_nodes(owed, [self.cluster.node_gpus(i) for i in range(len(self.nodes))])

    def _owed_fit(self, deferring: Sequence[OwedPod]) -> Callable[[int], bool] | None:
        """Node states (`Cluster.states` ids) where one of the owed pods `deferring` fits."""
        if not deferring:
            return None
        states = self.cluster.states
        return lambda state: any(fits(states[state].as_node_gpus(), o.demand) for o in deferring)

    def _fits_somewhere(self, demand: GpuDemand) -> bool:
        states = self.cluster.states
        return any(fits(states[state].as_node_gpus(), demand) for state, _ in self.cluster.groups())

    def _missing(self, gang: str) -> int:
        """Members the gang misses to reach its minimum (terminating ones do not run)."""
        running = sum(1 for p in self.running.values() if p.gang == gang and p.state == "running")
        return max(self.minimums[gang] - running, 0)

    def _gang(self, gang: str) -> GangState:
        """The gang as admission reads it: its members that exist are those waiting or running
        (an evicted one is recreated once it has terminated); those running are placed."""
        running = sum(1 for p in self.running.values() if p.gang == gang and p.state == "running")
        waiting = sum(1 for p in self.waiting.values() if p.gang == gang)
        return GangState(self.workloads[gang], self.minimums[gang], running + waiting, running)

    def _waiting_gang(self, gang: str) -> WaitingGang:
        """The gang as the backfill rule reads it (`extender.policy.backfill`)."""
        members = [p for p in self.waiting.values() if p.gang == gang]
        ask = self.asks.get(gang, TopologyAsk())
        level = ask.required or ask.preferred
        return WaitingGang(
            gang,
            (0, min(p.created for p in members), gang),
            members[0].demand,
            self._missing(gang),
            self.level_domains.get(level, NO_DOMAINS) if level else NO_DOMAINS,
            one_domain=bool(ask.required),
        )

    def _held_back(self, head: WaitingGang) -> list[int]:
        """The nodes held back for `head` from the gangs after it (`held_back`), by index."""
        supplies = [self.cluster.node_gpus(i) for i in range(len(self.nodes))]
        return sorted(self.node_index[name] for name in held_back(head, supplies))

    def _all_shares(self, node: int) -> tuple[tuple[int, int], ...]:
        """Every GPU of the node whole, as `_reserve_shares` takes them."""
        return tuple((gpu, GPU_MILLI) for gpu in range(len(self.cluster.free[node])))

    def _start_gang(self, gang: str, admission: FairnessSnapshot, now: float) -> str:
        """Start the members a gang misses, all of them or none (the extender's `admit_gang`):
        "" when they started, else why not (the refusal's kind)."""
        state = self._gang(gang)
        members = sorted((p for p in self.waiting.values() if p.gang == gang), key=lambda p: p.order)
        head = members[0]
        decision = admit(admission, Ask(head.queue, head.request, head.preemptible, state))
        if not decision.admit:
            self.refused.setdefault(decision.kind, set()).update(p.index for p in members)
            return decision.kind
        chosen = members[: state.missing]
        held = [member.index for member in chosen if member.index in self.holds]
        for index in held:
            self._unreserve(index)
        placements = self._place_gang(gang, chosen)
        if placements is None:  # no domain of its required level holds it (now, or ever)
            for index in held:
                self._reserve(index)
            kind = GANG_DOMAIN_TOO_SMALL if self._never_held(gang, chosen) else GANG_NO_DOMAIN
            self.refused.setdefault(kind, set()).update(p.index for p in members)
            return kind
        if len(placements) < len(chosen):  # all or nothing: give back what was placed
            for member, (node, gpus) in zip(chosen, placements, strict=False):
                self.cluster.release(node, member.demand, gpus)
            for index in held:
                self._reserve(index)
            self.refused.setdefault(GANG_NO_FIT, set()).update(p.index for p in members)
            return GANG_NO_FIT
        for member, placement in zip(chosen, placements, strict=True):
            self.holds.pop(member.index, None)
            self._start(member, now, placement)
        self._record_gang(gang, now)
        return ""

    def _place_gang(self, gang: str, chosen: Sequence[_Pod]) -> list[tuple[int, tuple[int, ...]]] | None:
        """Places for the chosen members, each taken from the cluster: with a topology ask, the
        extender's `plan_in_domain` on every node (None: no domain of the required level holds
        them); without, member by member by the placement policy (fewer: they do not all fit)."""
        ask = self.asks.get(gang, TopologyAsk())
        placements: list[tuple[int, tuple[int, ...]]] = []
        if not ask.any or not chosen:
            for member in chosen:
                placement = self._place(member)
                if placement is None:
                    break
                placements.append(placement)
            return placements
        demand = chosen[0].demand
        required = self.level_domains.get(ask.required) if ask.required else None
        if required is not None:  # members already running keep the gang in their domain
            kept = {required.get(self.nodes[p.node].name) for p in self.running.values() if p.gang == gang}
            if kept:
                required = {node: domain for node, domain in required.items() if domain in kept}
        supplies = [self.cluster.node_gpus(i) for i in range(len(self.nodes))]
        preferred = self.level_domains.get(ask.preferred, NO_DOMAINS)
        plan = plan_in_domain(supplies, demand, len(chosen), required, preferred)
        if len(plan.nodes) < len(chosen):
            return None if ask.required else []
        for name in plan.nodes:
            index = self.node_index[name]
            gpus = choose_gpus(self.cluster.node_gpus(index), demand, self.cluster.mix)
            if gpus is None:  # (the plan counted this node's room: a GPU taken twice is a bug)
                raise RuntimeError(f"gang {gang}: planned node {name} has no room")
            self.cluster.place(index, demand, gpus)
            placements.append((index, gpus))
        return placements

    def _never_held(self, gang: str, chosen: Sequence[_Pod]) -> bool:
        """No domain of the gang's required level could hold the chosen members with all its
        GPUs free (the extender's `never_held_text`)."""
        level = self.asks[gang].required
        domains = self.level_domains.get(level)
        if domains is None:  # (planned as one domain, the cluster: `_place_gang`)
            return False
        sizes = domain_sizes(map(self.cluster.node_gpus, range(len(self.nodes))), domains)
        demand = chosen[0].demand
        return bool(never_held_text(level, demand.count * len(chosen) * demand.milli, sizes))

    def _required_domains(self, gang: str) -> DomainMap | None:
        """The domains of the gang's required topology level (None: it requires none)."""
        level = self.asks.get(gang, TopologyAsk()).required
        return self.level_domains.get(level) if level else None

    def _record_gang(self, gang: str, now: float) -> None:
        """A gang's first start, with the domains its running members span at each level."""
        if not self.level_domains or any(record.name == gang for record in self.result.gangs):
            return
        members = [p for p in self.pods if p.gang == gang]
        nodes = {self.nodes[p.node].name for p in members if p.state == "running"}
        ask = self.asks.get(gang, TopologyAsk())
        said = (
            f"required {ask.required}"
            if ask.required
            else f"preferred {ask.preferred}"
            if ask.preferred
            else "-"
        )
        self.result.gangs.append(
            GangRecord(
                gang.split("/", 1)[1],
                self.minimums[gang],
                said,
                now - min(p.created for p in members),
                {
                    level: len({domains.get(n) for n in nodes})
                    for level, domains in self.level_domains.items()
                },
            )
        )

    def _start(self, pod: _Pod, now: float, placement: tuple[int, tuple[int, ...]]) -> None:
        pod.node, pod.gpus = placement
        if self.moves is not None and not pod.ever_started:
            self.moves.started += 1  # the move budget counts first starts
        pod.state, pod.started, pod.ever_started = "running", now, True
        pod.waited_s += now - pod.waiting_since
        pod.runs += 1
        del self.waiting[pod.index]
        self.running[pod.index] = pod
        self.ledger.put(
            pod.key,
            Contribution(pod.queue, "allocated", self._running_vector(pod), preemptible=pod.preemptible),
        )
        self._push(now + pod.duration, _Event.FINISH, pod)
        self.version += 1

    def _place(
        self, pod: _Pod, avoid: Callable[[int], bool] | None = None, collected: frozenset[int] = frozenset()
    ) -> tuple[int, tuple[int, ...]] | None:
        """Where `pod` starts: on exactly the GPUs held for it once they are free, else (none held,
        or its victims still terminating) where the placement policy puts it, on no node state
        `avoid` names nor node `collected` names; None: nowhere."""
        hold = self.holds.get(pod.index)
        if hold is not None:
            gpus = tuple(gpu for gpu, _ in hold.gpus)
            if take(self.cluster.node_gpus(hold.node), pod.demand, gpus) is not None:
                self.cluster.place(hold.node, pod.demand, gpus)
                return hold.node, gpus
        return self.placer.place(pod.demand, avoid, collected)

    def _take_rest(self, pod: _Pod) -> tuple[int, tuple[int, ...]] | None:
        """Where a fraction starts on a rest kept for its queue (rule 11), once free; None: no
        rest of its queue takes it. The plan that freed the rest counts what it takes as needed."""
        for key, rest in self._rests_for(pod):
            self._unreserve(key)
            if take(self.cluster.node_gpus(rest.node), pod.demand, (rest.gpu,)) is None:
                self._reserve_shares(key, rest.node, ((rest.gpu, rest.milli),))
                continue
            self.cluster.place(rest.node, pod.demand, (rest.gpu,))
            self.plan_gpus[rest.plan][1] += pod.demand.milli / GPU_MILLI
            rest.milli -= pod.demand.milli
            if rest.milli > 0:
                self._reserve_shares(key, rest.node, ((rest.gpu, rest.milli),))
            else:
                del self.rests[key]
            return rest.node, (rest.gpu,)
        return None

    def _rests_for(self, pod: _Pod) -> Iterator[tuple[str, _Rest]]:
        """The rests kept for `pod`'s queue that its fraction is no bigger than (rule 11)."""
        if pod.demand.count != 1:
            return
        for key, rest in sorted(self.rests.items()):
            if rest.queue == pod.queue and pod.demand.milli <= rest.milli:
                yield key, rest

    def _reserve(self, index: int) -> None:
        """Take what is held for pod `index` out of the cluster while others are placed: the share
        of each of its GPUs, and the CPU and memory it keeps, as much of each as is free (its
        victims may still be terminating), as the filter's `supply_for` keeps them."""
        hold = self.holds[index]
        self._reserve_shares(index, hold.node, hold.gpus, hold.cpu_milli, hold.memory_mib)

    def _reserve_shares(
        self,
        key: int | str,
        node: int,
        shares: tuple[tuple[int, int], ...],
        cpu_milli: int = 0,
        memory_mib: int = 0,
    ) -> None:
        """Take kept shares out of the cluster: of each GPU, as much of its share as is free (its
        victims may still be terminating), and of the CPU and memory kept with them."""
        free = self.cluster.free[node]
        taken: list[tuple[int, GpuDemand, tuple[int, ...]]] = [
            (node, GpuDemand(1, min(milli, free[gpu])), (gpu,)) for gpu, milli in shares if free[gpu] > 0
        ]
        host = GpuDemand(
            0,
            cpu_milli=min(cpu_milli, max(self.cluster.cpu_free[node], 0)),
            memory_mib=min(memory_mib, max(self.cluster.memory_free[node], 0)),
        )
        if host.cpu_milli or host.memory_mib:
            taken.append((node, host, ()))
        for at, demand, gpus in taken:
            self.cluster.place(at, demand, gpus)
        self.phantoms[key] = taken

    def _release(self, index: int) -> None:
        """Let go of what is held for a pod admission refused (the filter's refusal does): GPUs
        kept for a pod that may not go would idle until the hold expires."""
        if self.holds.pop(index, None) is not None:
            self._unreserve(index)
            self.served_from.pop(index, None)

    def _unreserve(self, key: int | str) -> None:
        for node, demand, gpus in self.phantoms.pop(key, []):
            self.cluster.release(node, demand, gpus)

    def _fairness(self, shares: Mapping[str, Mapping[str, float]] | None = None) -> FairnessSnapshot:
        """Queues with the ledger's usage now; fair shares computed unless given (admission
        reads none)."""
        usage = self.ledger.usage(self.names)
        if shares is None:
            inputs = FairShareInputs(tuple(self.specs), usage, self.capacity, self.adjustment)
            shares = compute_fair_shares(inputs)
        return FairnessSnapshot(tuple(self.specs), usage, self.capacity, shares)

    def _follow_history(self, now: float) -> None:
        """Record what every queue holds now and take the history's weight adjustment (a new
        version is a change of the picture: reclaim may have something to do again)."""
        if self.history is None:
            return
        tree = QueueTree(self.specs, self.ledger.usage(self.names))
        self.history.record(now, tree, self.capacity, self.history_settings)
        # Rule 9's wait never opens for the queues whose shares history moves.
        self.rules = replace(self.rules, history_moves=self.history.moving)
        adjustment = self.history.adjustment(now, tree, self.capacity)
        if adjustment != self.adjustment:
            self.adjustment = adjustment
            self.version += 1

    # ---- the reclaim loop --------------------------------------------------------------------

    def _reclaim(self, now: float) -> bool:
        """One cycle of the extender's reclaim loop; True when it evicted something."""
        self._follow_history(now)
        if self._quiet_until() > now:
            return False
        fairness = self._fairness()
        snapshot = self._snapshot(fairness, now)
        pending = self._pending(fairness)
        plans = plan(snapshot, pending, now, self.rules)
        served_before: list[_Pod] = []  # the pods this cycle's plans served so far (not started)
        for chosen in plans:
            self._carry_out(chosen, now, self._past_quota(chosen, served_before))
            served_before.extend(self.pods[int(key)] for key in chosen.served)
        if plans:
            self.version += 1
            if not self.delay:
                self._schedule(now)
        # The extender's consolidation loop runs after reclaim's, for the pods it did not serve.
        moved = self.moves is not None and self.moves.cycle(self._fairness() if plans else fairness, now)
        if moved:
            self.version += 1
            self._schedule(now)
        if not plans and not moved:
            self.fruitless = (self.version, now)
            return False
        return True

    def _snapshot(self, fairness: FairnessSnapshot, now: float, movable: bool = False) -> ClusterSnapshot:
        """The reclaim loop's view of the simulated cluster now: the picture's snapshot, with the
        holds and kept rests placed and the pods restarted after an eviction spared (rule 8);
        `movable`: every running pod may be moved (the consolidation loop's view, `queue_moves`)."""
        snapshot = ClusterSnapshot(
            {node.name: self.cluster.node_gpus(i) for i, node in enumerate(self.nodes)},
            {pod.key: self._running_pod(pod, movable) for pod in self.running.values() if pod.demand.count},
            fairness,
            self.cluster.mix,
            minimums=self.minimums,
            holds=[
                *(self._held(index, hold) for index, hold in self.holds.items()),
                *(self._kept(key, rest) for key, rest in self.rests.items() if rest.expires > now),
            ],
            domains=self.cluster.domains,
        )
        snapshot.spare(
            protected_restarts(
                snapshot.running.values(), lambda pod: self.evicted_at.get(int(pod.key)), now, self.rules
            )
        )
        snapshot.spare(
            spent_victims(snapshot.running.values(), lambda pod: self.evictions_of[int(pod.key)], self.rules)
        )
        return snapshot

    def _pending(self, fairness: FairnessSnapshot) -> list[PendingPod]:
        """What the live loop hands the planner (`ClusterPicture.waiting_pods`): the waiting GPU
        pods the admission rule's waiting list takes (`waiting_list`), in the scheduler's order."""
        gangs = {gang: self._gang(gang) for gang in {p.gang for p in self.waiting.values() if p.gang}}
        candidates = []
        for pod in sorted(self.waiting.values(), key=lambda p: p.order):
            if not pod.demand.count:
                continue
            gang = gangs.get(pod.gang)
            held = pod.index in self.holds
            candidates.append(Waiting(pod.key, Ask(pod.queue, pod.request, pod.preemptible, gang), held))
        return [
            PendingPod(
                listed.waiting.key,
                pod.queue,
                pod.demand,
                pod.request,
                pod.priority,
                pod.created,
                preemptible=pod.preemptible,
                workload=listed.workload,
                waiting_since=pod.waiting_since,
                domains=self._required_domains(pod.gang) if listed.workload else None,
            )
            for listed in waiting_list(fairness, candidates)
            for pod in (self.pods[int(listed.waiting.key)],)
        ]

    def _running_vector(self, pod: _Pod) -> dict[str, float]:
        """A running pod's fairness vector: each GPU it holds, of its node's model."""
        model = self.nodes[pod.node].model
        return _vector(pod.demand, [(model, pod.demand.milli / GPU_MILLI) for _ in pod.gpus])

    def _held(self, index: int, hold: _Hold) -> HeldGpus:
        """A hold as the planner sees it (a waiting pod: its whole request still counts waiting)."""
        pod = self.pods[index]
        return HeldGpus(
            pod.key,
            pod.queue,
            self.nodes[hold.node].name,
            hold.gpus,
            pod.request,
            pod.gang,
            hold.cpu_milli,
            hold.memory_mib,
        )

    def _kept(self, key: str, rest: _Rest) -> HeldGpus:
        """A rest as the planner sees it: kept for any fraction of its queue."""
        node = self.nodes[rest.node].name
        return HeldGpus(key, rest.queue, node, ((rest.gpu, rest.milli),), for_queue=True)

    def _running_pod(self, pod: _Pod, movable: bool = False) -> RunningPod:
        return RunningPod(
            key=pod.key,
            queue=pod.queue,
            node=self.nodes[pod.node].name,
            gpus=tuple((gpu, pod.demand.milli) for gpu in pod.gpus),
            resources=self._running_vector(pod),
            priority=pod.priority,
            preemptible=pod.preemptible,
            started=pod.started,
            terminating=pod.state == "terminating",
            cpu_milli=pod.demand.cpu_milli,
            memory_mib=pod.demand.memory_mib,
            movable=movable,
            workload=pod.gang,
        )

    def _quiet_until(self) -> float:
        """Until when reclaim cycles would find nothing to do, the picture staying as it is: no
        GPU pod waits, or the last cycle planned nothing on this very picture and no running pod
        gets past a min runtime (or its protection after an eviction), nor a waiting pod past the
        wait of rule 9 or 13, before then. (A time not after the last cycle: no such promise.)"""
        if not any(p.demand.count for p in self.waiting.values()):
            return math.inf
        if self.fruitless is None or self.fruitless[0] != self.version:
            return -math.inf
        ends = self._runtimes_ending_after(self.fruitless[1])
        if self.history is not None and self.history.factors_at is not None:
            ends.append(self.history.factors_at + self.history.update_period_s)  # factors move
        return min(ends, default=math.inf)

    def _runtimes_ending_after(self, since: float) -> list[float]:
        """When running preemptible pods pass their queues' min runtimes (and, restarted after an
        eviction, their protection: rule 8), and waiting pods the waits of rules 9, 13 and 16, for
        those after `since`."""
        # A pod reclaims once it has waited: owed less than itself (rule 9), owed it (rule 13).
        ends = [
            pod.waiting_since + wait
            for pod in self.waiting.values()
            if pod.demand.count
            for wait in (
                self.rules.partly_owed_wait_for(pod.queue),
                self.rules.whole_owed_wait_s,
                self.rules.ratio_after_s,  # rule 16: a plan beyond the ratio
            )
            if pod.waiting_since + wait > since
        ]
        growth, lead = self.rules.victim_lead_per_wait, self.rules.victim_lead_s
        if growth > 0 and lead < math.inf:
            # Rule 15's lead grows with the wait: a pod started at s comes within it of a pod waiting
            # since w at w + (w - lead - s) / growth. Per waiting pod only the first such moment
            # after `since` counts: that of the latest start before w - lead - growth (since - w).
            starts = sorted(
                p.started for p in self.running.values() if p.state == "running" and p.preemptible
            )
            for waiting in self.waiting.values():
                began = waiting.waiting_since
                before = bisect_left(starts, began - lead - growth * (since - began))
                if before:
                    ends.append(began + (began - lead - starts[before - 1]) / growth)
        for pod in self.running.values():
            if pod.state == "running" and pod.preemptible:
                runtimes = [
                    r.get(pod.queue, 0.0)
                    for r in (self.rules.reclaim_min_runtime_s, self.rules.preempt_min_runtime_s)
                ]
                if pod.index in self.evicted_at:
                    runtimes.append(self.rules.recent_victim_s)
                if self.moves is not None:  # it may be moved from then on
                    runtimes.append(self.moves.settings.rules.min_runtime_s)
                ends.extend(end for end in (pod.started + runtime for runtime in runtimes) if end > since)
        return ends

    def _past_quota(self, chosen: Plan, served_before: Sequence[_Pod]) -> bool:
        """Whether the pod `chosen` serves takes its queue past its quota once it runs, the pods
        the cycle's earlier plans served counted as running (they start after the cycle)."""
        fairness = self._fairness({})
        usage = dict(fairness.usage)
        for pod in served_before:
            allocated = dict(usage[pod.queue].allocated)
            add_amounts(allocated, pod.request)
            usage[pod.queue] = replace(usage[pod.queue], allocated=allocated)
        served = self.pods[int(chosen.pod.key)]
        return takes_past_quota(fairness.with_usage(usage), served.queue, served.request)

    def _carry_out(self, chosen: Plan, now: float, past_quota: bool) -> None:
        served = self.pods[int(chosen.pod.key)]
        self.result.plans += 1
        self.plan_gpus.append([chosen.gpus_evicted, chosen.gpus_needed])
        for rest in chosen.rests:
            ((gpu, milli),) = rest.gpus
            node = self.node_index[rest.node]
            self.rests[rest.key] = _Rest(rest.queue, node, gpu, milli, now + HOLD_S, len(self.plan_gpus) - 1)
        for eviction in chosen.evictions:
            victim = self.pods[int(eviction.pod.key)]
            gpus = victim.demand.total_milli / GPU_MILLI
            if served.queue in self.served_from.pop(victim.index, set()):
                self.result.ping_pong += 1
            for key in chosen.served:  # the pod it was made for, and those riding on it
                self.served_from.setdefault(int(key), set()).add(victim.queue)
            self.result.evictions.append(
                EvictionRecord(
                    now,
                    chosen.goal,
                    f"{victim.job}/{victim.index}",
                    victim.queue,
                    f"{served.job}/{served.index}",
                    served.queue,
                    chosen.node,
                    gpus,
                    now - victim.started,
                    victim.started >= served.waiting_since,
                    past_quota,
                )
            )
            victim.state = "terminating"
            victim.runs += 1  # its finish event is void
            self.evicted_at[victim.index] = now
            self.evictions_of[victim.index] += 1
            if self.delay:
                self._push(now + self.delay, _Event.TERMINATED, victim)
            else:
                self._free(victim)
                self._wait(victim, now)
        for hold in chosen.holds:
            held = self.pods[int(hold.key)]
            self.holds[held.index] = _Hold(
                self.node_index[hold.node], hold.gpus, now + HOLD_S, hold.cpu_milli, hold.memory_mib
            )
            self._push(now + HOLD_S, _Event.HOLD_EXPIRES, held)

    # ---- measuring ---------------------------------------------------------------------------

    def _observe(self, now: float) -> None:
        """Record the state after everything at `now` happened; it holds until the next change."""
        self._follow_history(now)
        fairness = self._fairness()
        tree = fairness.tree
        allocated = {q: tree.subtree(q, "allocated", "gpu") for q in self.names}
        shares = {q: fairness.fair_shares.get(q, {}).get("gpu", 0.0) for q in self.names}
        smallest: dict[str, float] = {}  # queue -> the smallest GPU request of its admissible pods
        fitting = False
        verdicts: dict[GpuDemand, bool] = {}
        admissible = self._admissible(fairness)
        for pod in admissible:
            smallest[pod.queue] = min(pod.request["gpu"], smallest.get(pod.queue, math.inf))
            if pod.demand not in verdicts:
                verdicts[pod.demand] = any(
                    fits(self.cluster.states[state].as_node_gpus(), pod.demand)
                    for state, _ in self.cluster.groups()
                )
            fitting = fitting or verdicts[pod.demand]
        for leaf, gpus in list(smallest.items()):
            for ancestor in tree.path_to_root(leaf)[1:]:
                smallest[ancestor] = min(gpus, smallest.get(ancestor, math.inf))
        starved = {q for q, gpus in smallest.items() if allocated[q] + gpus <= shares[q] + EPSILON}
        free_gpus = (self.cluster.capacity_milli - self.cluster.allocated_milli) / GPU_MILLI
        idle = free_gpus if fitting else 0.0
        host_idle = free_gpus if not fitting and self._short_of_fair_host(fairness, admissible) else 0.0
        self.level = _Level(allocated, shares, starved, idle, host_idle)
        for q in self.names:
            if q not in starved:
                self.below_spell[q] = 0.0
                spell = self.open_spell.pop(q, None)
                if spell is not None:
                    spell.length_s = now - spell.start
        pending = Counter(p.queue for p in self.waiting.values())
        running = Counter(p.queue for p in self.running.values())
        for q in self.names:
            self.max_allocated[q] = max(self.max_allocated[q], allocated[q])
            self.result.timeline.append(QueueSample(now, q, allocated[q], shares[q], pending[q], running[q]))

    def _short_of_fair_host(self, fairness: FairnessSnapshot, admissible: Sequence[_Pod]) -> bool:
        """Whether one of the `admissible` waiting GPU pods fits a node's free GPUs, not its free
        CPU or memory, and would fit them if the pods there of the queues CPU and memory would
        be reclaimed from by the DRF rule (`extender.policy.drf.drf_refusal`: the pod's queue below
        its dominant share, theirs above, compared where their paths diverge) gave theirs back."""
        nodes = [self.cluster.node_gpus(index) for index in range(len(self.nodes))]
        short = {
            (pod.queue, pod.signature, pod.demand, index): pod
            for pod in admissible
            for index, node in enumerate(nodes)
            if host_starved(node, pod.demand)
        }
        if not short:
            return False
        least = {"gpu": 1 / GPU_MILLI}  # (as the planner asks which queues could give at all)
        givers: dict[tuple[str, str], bool] = {}
        for pod, index in ((pod, key[3]) for key, pod in short.items()):
            cpu_milli, memory_mib = nodes[index].cpu_free_milli, nodes[index].memory_free_mib
            for other in self.running.values():
                if other.node != index or other.state != "running":
                    continue
                pair = (pod.queue, other.queue)
                if pair not in givers:
                    givers[pair] = not drf_refusal(fairness, pod.queue, pod.request, other.queue, least)
                if givers[pair]:
                    cpu_milli += other.demand.cpu_milli
                    memory_mib += other.demand.memory_mib
            if cpu_milli >= pod.demand.cpu_milli and memory_mib >= pod.demand.memory_mib:
                return True
        return False

    def _admissible(self, fairness: FairnessSnapshot) -> list[_Pod]:
        """Waiting GPU pods that admission lets in now (pods alike in what it reads asked once)."""
        verdicts: dict[_Signature, bool] = {}
        admissible = []
        for pod in self.waiting.values():
            if not pod.demand.count:
                continue
            if pod.signature not in verdicts:
                verdicts[pod.signature] = admit(fairness, Ask(pod.queue, pod.request, pod.preemptible)).admit
            if verdicts[pod.signature]:
                admissible.append(pod)
        return admissible

    def _advance(self, now: float) -> None:
        """Integrate the current level from the last moment of change up to `now`."""
        span = now - self.last_time
        if span <= 0:
            return
        level = self.level
        for q, sums in self.integrals.items():
            sums["allocated"] += level.allocated.get(q, 0.0) * span
            sums["share"] += level.shares.get(q, 0.0) * span
            sums["starved"] += span if q in level.starved else 0.0
            if q in level.starved:
                before = self.below_spell[q]
                self.below_spell[q] += span
                self.longest_below[q] = max(self.longest_below[q], self.below_spell[q])
                if q in self.leaves and before < LONG_SPELL_S <= self.below_spell[q]:
                    self._long_spell(q, self.last_time - before, self.last_time + LONG_SPELL_S - before)
            sums["deficit"] += max(0.0, level.shares.get(q, 0.0) - level.allocated.get(q, 0.0)) * span
        self.result.idle_gpu_s_while_fitting_pod_waits += level.idle_gpus * span
        self.result.idle_gpu_s_while_host_starved_pod_waits += level.host_idle_gpus * span
        self.last_time = now

    def _long_spell(self, queue: str, start: float, now: float) -> None:
        """Record a spell of `queue` below its share reaching `LONG_SPELL_S` at `now` (the state
        is the one since the last change), with what keeps its smallest such pod waiting."""
        fairness = self._fairness()
        pending = [p for p in self._pending(fairness) if p.queue == queue]
        cause: SpellCause = "held"  # the planner lists none of its pods: GPUs are held for them
        if pending:
            smallest = min(pending, key=lambda p: (p.resources.get("gpu", 0.0), p.created, p.key))
            gang = smallest.workload
            unit = [p for p in pending if p.workload == gang] if gang else [smallest]
            cause = spell_cause(self._snapshot(fairness, now), unit, now, self.rules)
        self.open_spell[queue] = SpellRecord(queue, start, cause)
        self.result.long_spells.append(self.open_spell[queue])

    def _summarise(self) -> None:
        result, end = self.result, self.result.makespan_s
        for spell in self.open_spell.values():
            spell.length_s = end - spell.start
        gpu_capacity = self.capacity.get("gpu", 0.0)
        result.refusals = {reason: len(pods) for reason, pods in sorted(self.refused.items())}
        # A plan's needed GPUs include the fractions that took the rest it kept (rule 11).
        result.gpus_needed = sum(needed for _, needed in self.plan_gpus)
        result.max_plan_ratio = max(
            (evicted / needed if needed > 0 else math.inf for evicted, needed in self.plan_gpus), default=0.0
        )
        busy = 0.0
        for q in self.specs:
            mine = [p for p in self.pods if p.queue == q.name]
            waits = [p.waited_s for p in mine if p.ever_started]
            sums = self.integrals[q.name]
            mean_allocated = sums["allocated"] / end if end > 0 else 0.0
            busy += mean_allocated if q.parent is None else 0.0
            result.queues.append(
                QueueSummary(
                    name=q.name,
                    pods=len(mine),
                    started=len(waits),
                    finished=sum(1 for p in mine if p.state == "done"),
                    mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
                    p50_wait_s=_percentile(waits, 50),
                    p95_wait_s=_percentile(waits, 95),
                    max_wait_s=max(waits, default=0.0),
                    wait_gpu_hours=sum(
                        p.waited_s * p.demand.total_milli / GPU_MILLI for p in mine if p.ever_started
                    )
                    / 3600,
                    mean_allocated_gpu=mean_allocated,
                    mean_fair_share_gpu=sums["share"] / end if end > 0 else 0.0,
                    max_allocated_gpu=self.max_allocated[q.name],
                    limit_gpu=q.limit.get("gpu"),
                    utilisation_pct=100.0 * mean_allocated / gpu_capacity if gpu_capacity else 0.0,
                    below_fair_share_s=sums["starved"],
                    longest_below_fair_share_s=self.longest_below[q.name],
                    deficit_gpu_s=sums["deficit"],
                    evicted=sum(1 for e in result.evictions if e.victim_queue == q.name),
                    evicted_for=sum(1 for e in result.evictions if e.served_queue == q.name),
                    lost_gpu_s=sum(e.gpus * e.ran_s for e in result.evictions if e.victim_queue == q.name),
                    gpu_hours=sums["allocated"] / 3600.0,
                )
            )
        result.utilisation_pct = 100.0 * busy / gpu_capacity if gpu_capacity else 0.0
        result.gpu_s_used = busy * end


def run_queue_workload(
    workload: QueueWorkload,
    policy_name: str = "tessera",
    seed: int | None = None,
    *,
    reclaim_interval_s: float | None = None,
    termination_delay_s: float | None = None,
    flags: RuleFlags = DEFAULT_RULE_FLAGS,
    topology_asks: bool = True,
    history: bool | None = None,
    mix: WorkloadMix | None = None,
    tie_break: TieBreak = "random",
    gangs_in_order: bool = False,
    hold_back_after_s: float | None = None,
    moves: QueueMoves | None = None,
) -> QueueRunResult:
    """Replay `workload`; the interval and delay default to the workload's own. `flags`: the
    extender's rule flags (`extender.rule_flags`: the waits before a queue reclaims, rules 9 and
    13; the victim budget and lead, rules 14 and 15; deference collecting a node for an owed pod
    of several GPUs that fits nowhere), by default the extender's defaults. Without
    `topology_asks`, gangs are placed as if they asked no level (the domains they span are still
    reported: the comparison). `history`: fair share over time on (the workload's parameters,
    enabled by default) or off (no queue's settings either: today's shares); None: as the
    workload says. `mix`: the pods placement scores against (default: the workload's own);
    `tie_break`: how placement picks among equally ranked nodes (``packing.Placer``: by default at
    random per seed; "first": the first in the workload's node order, as the timeline replay).
    `gangs_in_order`: a counterfactual, not the extender's behaviour - gangs start in the order
    they came, none while an older one waits (lone pods still go where they fit).
    `hold_back_after_s`: the extender's `--gang-hold-back-after` (`extender.policy.backfill`): once
    the first gang that did not fit has waited this long, later gangs are planned off the nodes
    held back for it (None: off, the extender's default).
    `moves`: the extender's consolidation loop after each reclaim cycle (`queue_moves`; no gangs)."""
    interval = workload.reclaim_interval_s if reclaim_interval_s is None else reclaim_interval_s
    delay = workload.termination_delay_s if termination_delay_s is None else termination_delay_s
    if interval < 0 or delay < 0:
        raise ValueError("the reclaim interval and the termination delay cannot be negative")
    if not topology_asks:
        jobs = tuple(
            job.model_copy(update={"topology_required": "", "topology_preferred": ""})
            for job in workload.jobs
        )
        workload = replace(workload, jobs=jobs)
    if history is not None:
        settings = {name: replace(own, enabled=None) for name, own in workload.history_settings.items()}
        workload = replace(
            workload,
            history=replace(workload.history, enabled=history),
            history_settings=settings if history else {},
        )
    seed = workload.seed if seed is None else seed
    return _Replay(
        workload,
        policy_name,
        seed,
        interval,
        delay,
        flags,
        mix,
        tie_break,
        gangs_in_order,
        hold_back_after_s,
        moves,
    ).run()
