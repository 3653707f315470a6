"""Why a queue stays below its share: the cause of each long spell, for `tessera simulate queues`.

A leaf queue is *below its share* (the `longest below s` column) while one of its waiting,
admissible pods would keep it within its fair share if it ran. The service target of issue 25 is
that such a spell ends within `LONG_SPELL_S` (60 s, simulated). When one lasts longer, the replay
asks, at the moment it reaches that length, what keeps reclaim from serving the queue's smallest
such pod (a gang: with its waiting members), and records the first of these that applies:

* `held`: GPUs are held for it (a plan's victims still terminating, or the hold not yet taken);
* `fits`: it fits the free GPUs now (pods terminating gone, holds placed) and has not started:
  another pod's hold, deference to a more owed queue, or the scheduler's order;
* `waits`: reclaim waits for capacity to free (rules 9 and 13 of `extender.policy.reclaim`);
* `path owed less`: rule 1 refuses every queue above its share, and a queue above the pod's own
  on its path (where the paths diverge) is owed less than the pod: its department is nearly at
  its share while the leaf is owed a whole pod;
* `no giver`: rule 1 refuses every other queue for another reason (none is above its share, or
  each would end as owed as the reclaimer);
* `no node`: some queue may give, but on no node do its victims make room for the pod (a 4-GPU
  pod needs 4 GPUs on one node; victims too young, non-preemptible, a gang at its minimum);
* `planned`: the planner serves it when asked alone: the cycle served other pods first, ran out
  of its budget or evictions, or the pod's victims are still terminating.

Pure: it reads a snapshot and the planner's rules, as the reclaim loop would, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from extender.policy.drf import diverging_paths
from extender.policy.fairness import EPSILON
from extender.policy.reclaim import (
    PendingPod,
    Rules,
    place_if_it_fits,
    plan,
    planning_fork,
    reclaim_refusal,
    reclaims_now,
)
from extender.policy.snapshot import ClusterSnapshot

LONG_SPELL_S = 60.0  # the service target: a queue below its share is served within this

SpellCause = Literal["held", "fits", "waits", "path owed less", "no giver", "no node", "planned"]
SPELL_CAUSES: tuple[SpellCause, ...] = (
    "held",
    "fits",
    "waits",
    "path owed less",
    "no giver",
    "no node",
    "planned",
)


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
    if not reclaims_now(fairness, head, now, rules):
        return "waits"
    if plan(snapshot, unit, now, rules):
        return "planned"
    givers = sorted({p.queue for p in fork.running.values() if p.preemptible and p.queue != head.queue})
    gpus = head.resources.get("gpu", 0.0)
    refused = [q for q in givers if reclaim_refusal(fairness, head.queue, head.resources, q, {"gpu": gpus})]
    if len(refused) < len(givers):
        return "no node"
    tree, shares = fairness.tree, fairness.fair_shares
    for giver in refused:
        diverging = diverging_paths(tree, head.queue, giver)[0][-1]
        owed = shares.get(diverging, {}).get("gpu", 0.0) - tree.subtree(diverging, "allocated", "gpu")
        if diverging != head.queue and owed < gpus - EPSILON:
            return "path owed less"
    return "no giver"
