"""Why a queue stays below its share: the cause of each long spell, for `tessera simulate queues`.

A leaf queue is *below its share* (the `longest below s` column) while one of its waiting,
admissible pods would keep it within its fair share if it ran. The service target of issue 25 is
that such a spell ends within `LONG_SPELL_S` (60 s, simulated). When one lasts longer, the replay
asks, at the moment it reaches that length, what keeps reclaim from serving the queue's smallest
such pod (a gang: with its waiting members), and records the first of these that applies (in
this order):

* `held`: GPUs are held for it (a plan's victims still terminating, or the hold not yet taken);
* `fits`: it fits the free GPUs now (pods terminating gone, holds placed) and has not started:
  another pod's hold, deference to a more owed queue, or the scheduler's order;
* `host owed less`: its queue is owed less than the pod in CPU or memory (its fair share of
  them less what it holds, against what the pod asks): by DRF it is not owed that pod, and it
  waits for capacity as a queue owed less than a pod's GPUs does (the CPU hog of `cpu-starved`,
  evicted for a pod of another queue, then owed 14 cores for its 16-core pod);
* `waits`: reclaim waits for capacity to free (rules 9 and 13 of `extender.policy.reclaim`);
* `planned`: the planner serves it when asked alone: the cycle served other pods first, ran out
  of its budget or evictions, or the pod's victims are still terminating;
* `no borrower`: no other queue holds more than its share: what the queue is owed lies free, but
  in no shape its pod fits (cores or GPUs stranded on several nodes), and nothing may be evicted;
* `no node`: on no node would every borrower's pod that may be evicted (preemptible, run long
  enough, not just restarted) make room for it: too few GPUs of borrowers on one node for a
  multi-GPU pod, or its victims too young;
* `ratio`: the pods rule 1 allows (each judged with its own GPUs) make room on a node, but the
  planner finds no plan: more GPUs evicted than rule 4 allows (a 2-GPU victim for a 1-GPU pod),
  a gang at its minimum among them, or more nodes than it searches;
* `path owed less`: on some node the borrowers' evictable pods would make room, but rule 1
  refuses some of them because a queue above the pod's own on its path (up to where the paths
  diverge) is owed less than the pod: its department is nearly at its share while the leaf is
  owed a pod;
* `refused`: the same, refused for another reason (the victim's queue would end as owed as the
  reclaimer is now, or, a victim bigger than the pod, more).

Pure: it reads a snapshot and the planner's rules, as the reclaim loop would, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

from extender.policy.drf import diverging_paths
from extender.policy.fairness import EPSILON, FairnessSnapshot
from extender.policy.reclaim import (
    PendingPod,
    Rules,
    place_if_it_fits,
    plan,
    planning_fork,
    reclaim_refusal,
    reclaims_now,
)
from extender.policy.snapshot import ClusterSnapshot, RunningPod

LONG_SPELL_S = 60.0  # the service target: a queue below its share is served within this

SpellCause = Literal[
    "held",
    "fits",
    "host owed less",
    "waits",
    "planned",
    "no borrower",
    "no node",
    "ratio",
    "path owed less",
    "refused",
]
SPELL_CAUSES: tuple[SpellCause, ...] = get_args(SpellCause)


def spell_cause(
    snapshot: ClusterSnapshot, unit: Sequence[PendingPod], now: float, rules: Rules
) -> SpellCause:
    """Why `unit` (a pod, or a gang's waiting members) of a queue below its share is not served:
    the first cause of the module docstring that applies."""
    head = unit[0]
    fork = planning_fork(snapshot)
    if len(unit) == 1 and place_if_it_fits(fork, head) is not None:
        return "fits"
    fairness = snapshot.fairness
    tree = fairness.tree
    for resource in ("cpu", "memory"):
        owed = fairness.fair_shares.get(head.queue, {}).get(resource, 0.0) - tree.subtree(
            head.queue, "allocated", resource
        )
        if fairness.capacity.get(resource, 0.0) > 0 and owed < head.resources.get(resource, 0.0) - EPSILON:
            return "host owed less"
    if not reclaims_now(fairness, head, now, rules):
        return "waits"
    if plan(snapshot, unit, now, rules):
        return "planned"
    gpus = head.resources.get("gpu", 0.0)
    holding = {p.queue for p in fork.running.values()} - {head.queue}
    borrowers = {q for q in holding if tree.subtree(q, "allocated", "gpu") > _share(fairness, q) + EPSILON}
    if not borrowers:
        return "no borrower"
    if not _room(fork, head, lambda pod: pod.queue in borrowers, now, rules):
        return "no node"

    def allowed(pod: RunningPod) -> bool:
        return not reclaim_refusal(fairness, head.queue, head.resources, pod.queue, pod.resources)

    if _room(fork, head, allowed, now, rules):
        return "ratio"
    for refused in sorted(borrowers):
        diverging = diverging_paths(tree, head.queue, refused)[0][-1]
        owed = _share(fairness, diverging) - tree.subtree(diverging, "allocated", "gpu")
        if diverging != head.queue and owed < gpus - EPSILON:
            return "path owed less"
    return "refused"


def _room(
    fork: ClusterSnapshot, pod: PendingPod, gives: Callable[[RunningPod], bool], now: float, rules: Rules
) -> bool:
    """Whether, on some node, evicting every pod that reclaim may evict and that `gives` would
    make room for `pod`."""
    for node in fork.nodes:
        trial = fork.fork()
        for running in trial.pods_on(node):
            old_enough = now - running.started >= rules.reclaim_min_runtime_s.get(running.queue, 0.0)
            if gives(running) and running.preemptible and not running.terminating and old_enough:
                trial.evict(running.key)
        if trial.fitting_nodes(pod.demand_on(trial.gpu_memory.get(node, 0)), [node]):
            return True
    return False


def _share(fairness: FairnessSnapshot, queue: str) -> float:
    return fairness.fair_shares.get(queue, {}).get("gpu", 0.0)
