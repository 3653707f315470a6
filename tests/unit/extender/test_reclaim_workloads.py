"""Reclaim and preemption act on whole workloads: a gang at its minimum goes whole or not at all,
members beyond the minimum (elastic) go first. Scenarios: nodes of 4 GPUs, one-GPU running pods."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from contract.names import GPU_MILLI
from extender.policy.consolidation import ConsolidationRules, plan_moves
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import PendingPod, Rules, plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod

NOW = 10_000.0


@dataclass(frozen=True)
class Case:
    name: str
    quotas: dict[str, float]
    running: list[tuple[str, str, str, str]]  # (pod, queue, node, workload or "")
    minimums: dict[str, int]
    pending: list[tuple[str, str, int, str]]  # (pod, queue, GPUs, workload of a gang waiting whole)
    evicted: set[str]
    served: dict[str, str]
    # Of gangs with parts: workload -> part -> its minimum, and each member's part.
    parts: dict[str, dict[str, int]] = field(default_factory=dict)
    part_of: dict[str, str] = field(default_factory=dict)


def build(case: Case, movable: bool = False) -> tuple[ClusterSnapshot, list[PendingPod]]:
    free = {node: [GPU_MILLI] * 4 for node in ("n1", "n2")}
    running: dict[str, RunningPod] = {}
    allocated: dict[str, float] = {}
    for age, (key, queue, node, workload) in enumerate(case.running):
        index = free[node].index(GPU_MILLI)
        free[node][index] = 0
        allocated[queue] = allocated.get(queue, 0.0) + 1
        # Listed first = oldest.
        running[key] = RunningPod(
            key,
            queue,
            node,
            ((index, GPU_MILLI),),
            {"gpu": 1.0},
            started=NOW - 3600 + age,
            workload=workload,
            movable=movable,
            part=case.part_of.get(key, ""),
        )
    requested: dict[str, float] = {}
    pending = []
    for age, (key, queue, gpus, workload) in enumerate(case.pending):
        requested[queue] = requested.get(queue, 0.0) + gpus
        pending.append(
            PendingPod(
                key, queue, GpuDemand(gpus), {"gpu": float(gpus)}, created=NOW + age, workload=workload
            )
        )
    specs = [QueueSpec(name, quota={"gpu": quota}) for name, quota in case.quotas.items()]
    usage = {
        s.name: QueueUsage({"gpu": allocated.get(s.name, 0.0)}, {"gpu": requested.get(s.name, 0.0)})
        for s in specs
    }
    fairness = FairnessSnapshot.build(specs, usage, {"gpu": 8.0})
    nodes = {n: NodeGpus(n, "", tuple(f)) for n, f in free.items()}
    snapshot = ClusterSnapshot(
        nodes, running, fairness, WorkloadMix(demands=()), minimums=case.minimums, part_minimums=case.parts
    )
    return snapshot, pending


def gang(prefix: str, queue: str, workload: str, *nodes: str) -> list[tuple[str, str, str, str]]:
    return [(f"{prefix}{i}", queue, node, workload) for i, node in enumerate(nodes)]


CASES = [
    Case(
        # Queue a runs an 8-pod gang (minimum 8) on all 8 GPUs; b (quota 4) waits for 1 GPU.
        # Shares: a 7, b 1. Pod by pod, reclaim would take one of a's pods and break the gang;
        # whole, a would fall to 0 < 7: the gang stays and b waits for GPUs to come free.
        "a gang at its minimum is not broken for a small pod",
        {"a": 4, "b": 4},
        gang("g", "a", "Job/ns/ja", *["n1"] * 4, *["n2"] * 4),
        {"Job/ns/ja": 8},
        [("b0", "b", 1, "")],
        set(),
        {},
    ),
    Case(
        # A gang of 7 with minimum 6 (one elastic member) and a lone pod s of a, the newest pod of
        # n1. b waits for 1 GPU (shares: a 7, b 1). An elastic member goes, the newest (g6, on n2;
        # on n1 it would be g2), never s, although s is the newest pod: the gang loses what it can
        # spare, s keeps running.
        "elastic members go first",
        {"a": 4, "b": 4},
        [*gang("g", "a", "Job/ns/ja", "n1", "n1", "n1", "n2", "n2", "n2", "n2"), ("s", "a", "n1", "")],
        {"Job/ns/ja": 6},
        [("b0", "b", 1, "")],
        {"g6"},
        {"b0": "n2"},
    ),
    Case(
        # The same gang of 7 as parts: workers g0-g5 (minimum 5) and a leader g6 (minimum 1), the
        # newest pod of n2. Counted as one group, the newest member g6 goes: the leader, and the
        # gang runs without one. By parts, the leader is at its minimum and a worker above its
        # part's is elastic: the newest worker on n2, g5.
        "members above their part's minimum go first, never the part's minimum",
        {"a": 4, "b": 4},
        [*gang("g", "a", "Job/ns/ja", "n1", "n1", "n1", "n2", "n2", "n2", "n2"), ("s", "a", "n1", "")],
        {"Job/ns/ja": 6},
        [("b0", "b", 1, "")],
        {"g5"},
        {"b0": "n2"},
        {"Job/ns/ja": {"workers": 5, "leader": 1}},
        {**{f"g{i}": "workers" for i in range(6)}, "g6": "leader"},
    ),
    Case(
        # b (quota 8) deserves all 8 GPUs and waits for two 4-GPU pods; a (quota 0) runs a gang of
        # 4 (minimum 4) spread 2 + 2. b0 needs a whole node: half the gang would make room on n1,
        # but the gang goes whole (4 GPUs evicted for 4 needed), which also makes room for b1.
        "a gang at its minimum goes whole when the rules allow",
        {"a": 0, "b": 8},
        gang("g", "a", "Job/ns/ja", "n1", "n1", "n2", "n2"),
        {"Job/ns/ja": 4},
        [("b0", "b", 4, ""), ("b1", "b", 4, "")],
        {"g0", "g1", "g2", "g3"},
        {"b0": "n1"},
    ),
    Case(
        # a borrowed all 8 GPUs with 8 lone pods; b (quota 4) waits with a gang of 4 (shares 4 and
        # 4). Every member is planned: a's 4 newest pods go (all on n2), one per member.
        "a waiting gang is served whole",
        {"a": 4, "b": 4},
        [(f"a{i}", "a", "n1" if i < 4 else "n2", "") for i in range(8)],
        {},
        [(f"b{i}", "b", 1, "Job/ns/jb") for i in range(4)],
        {"a4", "a5", "a6", "a7"},
        {"b0": "n2", "b1": "n2", "b2": "n2", "b3": "n2"},
    ),
    Case(
        # The same with a gang of 5: b's share is 4, so its fifth member could not be served; pod
        # by pod, 4 of a's pods would go for a gang that still could not start. Nothing goes.
        "a gang that cannot be served whole evicts nothing",
        {"a": 4, "b": 4},
        [(f"a{i}", "a", "n1" if i < 4 else "n2", "") for i in range(8)],
        {},
        [(f"b{i}", "b", 1, "Job/ns/jb") for i in range(5)],
        set(),
        {},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reclaim_takes_whole_workloads(case: Case) -> None:
    snapshot, pending = build(case)
    plans = plan(snapshot, pending, NOW, Rules())
    assert {e.pod.key for p in plans for e in p.evictions} == case.evicted
    assert {p.pod.key: p.node for p in plans} == case.served
    for p in plans:
        for eviction in p.evictions:
            if eviction.pod.workload and not snapshot.elastic(eviction.pod):
                assert "runs whole or not at all (minimum 4)" in eviction.message


@pytest.mark.parametrize("workload", ["", "Job/ns/jb"])
def test_consolidation_makes_room_for_pods_alone_not_for_a_gang_member(workload: str) -> None:
    # Two nodes with 2 of 4 GPUs free each (movable pods of a, run long enough); b waits for a
    # 4-GPU pod: moving n2's 2 pods onto n1 makes room. For a member of a gang waiting whole,
    # moves for one member would not start the gang: none.
    running = [(f"a{i}", "a", "n1" if i < 2 else "n2", "") for i in range(4)]
    snapshot, _ = build(Case("", {"a": 4, "b": 4}, running, {}, [], set(), {}), movable=True)
    waiting = [PendingPod("b0", "b", GpuDemand(4), {"gpu": 4.0}, workload=workload)]
    moved = plan_moves(snapshot, waiting, NOW, ConsolidationRules())
    assert bool(moved) == (workload == "")
