"""Queue workloads: a native YAML format replayed through the fairness and placement code.

Format (quantities as in Kubernetes: ``64``, ``500m``, ``512Gi``)::

    name: two-teams                      # optional; names the output files
    nodes:
      - {name: h100, count: 4, model: H100, gpus: 8, cpu: 64, memory: 512Gi}
    queues:                              # spec exactly as in a Queue object (manifests/crds/queues.yaml)
      - name: team-a
        spec: {resources: {gpu: {quota: 16, limit: 24}}}
      - name: team-b
        spec: {resources: {gpu: {quota: 16}}}
    jobs:                                # ``count`` pods, one every ``interval`` seconds from ``arrival``
      - {name: a-train, queue: team-a, count: 40, arrival: 0, interval: 1, duration: 600,
         gpus: 1, gpuMilli: 1000, cpu: 4, memory: 32Gi, models: [H100]}

Event-driven: pods arrive, and whenever something changes the scheduler loop runs as the extender
would decide - queues in DRF order, each queue's oldest pending pod admitted by the same
``FairnessSnapshot`` the extender asks and, if admitted, placed by the placement policy - until
nothing more can start. Pods run for their duration and then free their GPUs. Queue usage is kept
in the extender's own ``QueueLedger``, fed one contribution per pod as in the live picture.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.kube import validation_problems
from contract.names import GPU_MILLI
from contract.quantity import parse_quantity
from extender.picture.ledger import Contribution, QueueLedger
from extender.policy.fairness import FairnessSnapshot, QueueSpec
from extender.policy.placement import GpuDemand
from extender.queues import QueueSpecError, parse_queue, validate_hierarchy

from .cluster import Cluster
from .packing import Placer, workload_mix
from .policies import make_policy
from .trace import SimNode, SimPod

MIB = 2**20


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

    @field_validator("cpu", "memory", mode="before")
    @classmethod
    def _quantity(cls, value: object) -> float:
        return parse_quantity(value)


class WorkloadModel(_Model):
    name: str = "queues"
    seed: int = 0
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


def parse_workload(data: object, source: str = "workload") -> QueueWorkload:
    try:
        model = WorkloadModel.model_validate(data)
    except ValidationError as error:
        raise WorkloadError(f"{source}: {validation_problems(error, 'workload')}") from error
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
    return QueueWorkload(model.name, model.seed, nodes, queues, tuple(model.jobs))


def load_workload(path: Path) -> QueueWorkload:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise WorkloadError(f"{path}: cannot read: {error}") from error
    return parse_workload(data, str(path))


@dataclass
class _Pod:
    index: int
    job: str
    queue: str
    demand: GpuDemand
    arrival: float
    duration: float
    start: float | None = None
    node: int = -1
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class QueueSample:
    time: float
    queue: str
    allocated_gpu: float
    fair_share_gpu: float
    pending: int


@dataclass
class QueueSummary:
    name: str
    pods: int = 0
    started: int = 0
    mean_wait_s: float = 0.0
    p95_wait_s: float = 0.0
    mean_allocated_gpu: float = 0.0
    mean_fair_share_gpu: float = 0.0
    max_allocated_gpu: float = 0.0
    limit_gpu: float | None = None


@dataclass
class QueueRunResult:
    name: str
    policy: str
    makespan_s: float = 0.0
    utilisation_pct: float = 0.0
    queues: list[QueueSummary] = field(default_factory=list)
    timeline: list[QueueSample] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)


def _pods(workload: QueueWorkload) -> list[_Pod]:
    pods: list[_Pod] = []
    for job in workload.jobs:
        demand = GpuDemand(
            count=job.gpus,
            milli=job.gpu_milli if job.gpus == 1 else GPU_MILLI,
            models=frozenset(job.models),
            cpu_milli=round(job.cpu * 1000),
            memory_mib=int(job.memory // MIB),
        )
        pods.extend(
            _Pod(0, job.name, job.queue, demand, job.arrival + i * job.interval, job.duration)
            for i in range(job.count)
        )
    pods.sort(key=lambda pod: pod.arrival)
    for index, pod in enumerate(pods):
        pod.index = index
    return pods


def _request(pod: _Pod, node_model: str | None) -> dict[str, float]:
    """The pod's resources in the fairness vocabulary (GPUs, cores, bytes)."""
    gpus = pod.demand.total_milli / GPU_MILLI
    request = {"gpu": gpus, "cpu": pod.demand.cpu_milli / 1000, "memory": float(pod.demand.memory_mib * MIB)}
    model = (
        node_model
        if node_model is not None
        else (next(iter(pod.demand.models)) if len(pod.demand.models) == 1 else None)
    )
    if model and gpus:
        request[f"gpu/{model}"] = gpus
    return request


def _capacity(nodes: Sequence[SimNode]) -> dict[str, float]:
    capacity: dict[str, float] = {"gpu": 0.0, "cpu": 0.0, "memory": 0.0}
    for node in nodes:
        capacity["gpu"] += node.gpus
        capacity["cpu"] += node.cpu_milli / 1000
        capacity["memory"] += float(node.memory_mib * MIB)
        if node.model and node.gpus:
            capacity[f"gpu/{node.model}"] = capacity.get(f"gpu/{node.model}", 0.0) + node.gpus
    return capacity


def _percentile(values: Sequence[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(pct / 100 * len(ordered)) - 1)]


def run_queue_workload(
    workload: QueueWorkload, policy_name: str = "tessera", seed: int | None = None
) -> QueueRunResult:
    pods = _pods(workload)
    nodes = list(workload.nodes)
    mix = workload_mix([SimPod(p.job, p.demand) for p in pods])
    cluster = Cluster(nodes, mix)
    rng = random.Random(workload.seed if seed is None else seed)
    placer = Placer(cluster, make_policy(policy_name, mix), rng)
    capacity = _capacity(nodes)
    queues = list(workload.queues)
    names = [q.name for q in queues]
    ledger = QueueLedger()
    pending: dict[str, deque[_Pod]] = {q.name: deque() for q in queues}
    result = QueueRunResult(name=workload.name, policy=policy_name)
    events: list[tuple[float, int, int]] = []  # (time, 0 = finish / 1 = arrival, pod index)
    for index, pod in enumerate(pods):
        heapq.heappush(events, (pod.arrival, 1, index))

    def schedule(now: float) -> Mapping[str, Mapping[str, float]]:
        blocked: set[str] = set()
        while True:
            fairness = FairnessSnapshot.build(queues, ledger.usage(names), capacity)
            order = [q for q in fairness.order() if pending[q] and q not in blocked]
            if not order:
                return fairness.fair_shares
            queue = order[0]
            pod = pending[queue][0]
            decision = fairness.admit(queue, _request(pod, None))
            placement = placer.place(pod.demand) if decision.admit else None
            if placement is None:
                reason = decision.kind if not decision.admit else "no_node_fits"
                result.refusals[reason] = result.refusals.get(reason, 0) + 1
                blocked.add(queue)  # its head waits; later pods of the queue wait behind it
                continue
            pending[queue].popleft()
            pod.start, (pod.node, pod.gpus) = now, placement
            ledger.put(str(pod.index), Contribution(queue, "allocated", _request(pod, nodes[pod.node].model)))
            heapq.heappush(events, (now + pod.duration, 0, pod.index))

    now = 0.0
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, index = heapq.heappop(events)
            pod = pods[index]
            if kind == 1:
                pending[pod.queue].append(pod)
                ledger.put(str(index), Contribution(pod.queue, "requested", _request(pod, None)))
            else:
                cluster.release(pod.node, pod.demand, pod.gpus)
                ledger.put(str(index), None)
        shares = schedule(now)
        placer.forget_gone_states()
        for q in queues:
            result.timeline.append(
                QueueSample(
                    now,
                    q.name,
                    ledger.allocated.get(q.name, {}).get("gpu", 0.0),
                    shares[q.name].get("gpu", 0.0),
                    len(pending[q.name]),
                )
            )
    result.makespan_s = now
    _summarise(result, pods, queues, capacity.get("gpu", 0.0))
    return result


def _time_weighted_mean(samples: Sequence[QueueSample], attribute: str, end: float) -> float:
    if end <= 0 or not samples:
        return 0.0
    total = 0.0
    for current, following in zip(samples, [*samples[1:], None], strict=True):
        until = following.time if following is not None else end
        total += float(getattr(current, attribute)) * (until - current.time)
    return total / end


def _summarise(
    result: QueueRunResult, pods: Sequence[_Pod], queues: Sequence[QueueSpec], gpu_capacity: float
) -> None:
    end = result.makespan_s
    busy = 0.0
    for q in queues:
        mine = [p for p in pods if p.queue == q.name]
        waits = [p.start - p.arrival for p in mine if p.start is not None]
        samples = [s for s in result.timeline if s.queue == q.name]
        summary = QueueSummary(
            name=q.name,
            pods=len(mine),
            started=len(waits),
            mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
            p95_wait_s=_percentile(waits, 95),
            mean_allocated_gpu=_time_weighted_mean(samples, "allocated_gpu", end),
            mean_fair_share_gpu=_time_weighted_mean(samples, "fair_share_gpu", end),
            max_allocated_gpu=max((s.allocated_gpu for s in samples), default=0.0),
            limit_gpu=q.limit.get("gpu"),
        )
        busy += summary.mean_allocated_gpu
        result.queues.append(summary)
    result.utilisation_pct = 100.0 * busy / gpu_capacity if gpu_capacity else 0.0
