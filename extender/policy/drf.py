"""Dominant-resource fairness in reclaim: a GPU pod starved of CPU or memory. Pure.

The reclaim rule of `extender.policy.reclaim` (rule 1) looks at GPUs: a queue below its fair share
of GPUs takes them back from a queue above its own. A GPU pod can also wait next to idle GPUs
because the node's CPU or memory is gone: one node, 8 GPUs, 64 cores; queue a's pods of
<1 GPU, 16 cores> hold 4 GPUs and every core, b's pods of <1 GPU, 2 cores> wait. With both
wanting 8 GPUs the GPU shares are 4 / 4: a holds exactly its share, so rule 1 takes nothing from
it, and b waits forever beside 4 idle GPUs. Dominant-resource fairness (Ghodsi et al., NSDI'11)
says a is over-served - it holds far more than its part of the CPU - and this module says when a
pod may take that back (rule 10 of the reclaim module).

**Dominant share.** For a queue X and each resource r in play - `gpu`, `cpu`, `memory`, those with
capacity in the cluster - X's standing in r is what its subtree holds divided by its fair share
of r (`fairness.fair_shares`, the hierarchical water-filling: quotas, weights, limits, priority
tiers and the hierarchy are in it). X's **dominant share** D(X) is the largest of these: D < 1, the
queue is below its fair share of every resource; D > 1, it holds more than its share of at least
one. (A resource held with a fair share of 0 counts as infinitely over; one neither held nor
shared, as 0.)

Why divide by the fair share, not by the cluster's capacity weighted by the queue's weight (the
paper's weighted DRF)? The fair share already says what each queue deserves of each resource
with every rule of docs/queues.md applied, and it is what rule 1 compares against; capacity over
weight ignores quotas, limits and how much a queue asks for (a queue wanting 2 cores of 64 would
look below its share forever), and the two rules would disagree about who is owed. With shares,
1 is the line everywhere: at its share in its dominant resource, a queue has what it deserves.

Worked example (`tests/unit/extender/test_drf.py`, `tessera/simulate/examples/cpu-starved.yaml`):
one node, 8 GPUs, 64 cores; a wants 8 pods of <1 GPU, 16 cores>, b 8 of <1 GPU, 2 cores>.
Fair shares: GPUs 4 / 4; cores: b asks 16 and gets them, a the other 48. a runs 4 pods: GPUs
4 / 4 = 1, cores 64 / 48 = 1.33, so D(a) = 1.33; b runs none: D(b) = 0. Evicting one of a's pods
leaves a at 3 / 4 GPUs and 48 / 48 cores, D = 1, above b's 0: b's pod takes its place, and with
the 16 cores freed b's next pods fill the idle GPUs (2 cores each): a 3 pods, b 5, 8 of 8 GPUs,
58 of 64 cores. a's evicted pod (a at D = 1, not below) takes nothing back; nor can rule 1 serve
it (a is owed a GPU, but b's pods free 2 cores each and b falls below its own GPU share before
16 are free); nor does it take the cores back when they free: the plan's hold keeps b's pod's
GPU and its 2 cores, and b's next pods take the rest. With quotas: a (gpu quota 6) and b (quota 2), both
wanting 8: GPU shares 6 / 2; a's 4 pods stand at 4 / 6 GPUs and 64 / 48 cores, D(a) = 1.33
still: the CPU decides.

**The rule** (`drf_refusal`). A pod of queue R that fits no node, but on some node fits the free
GPUs and not the free CPU or memory (`host_starved`), may take victims of queue V when, with R'
and V' the children of their lowest common ancestor on each path (as in rule 1):

1. every queue from R up to R' is below its dominant share (D < 1), and stays within its fair
   share of the GPU resources the pod asks for once it has them; the pod raises D(R') (it asks
   for some of R''s dominant resource: a pod of GPUs and cores does not raise a dominant share
   made by memory);
2. every queue X from V up to V' is above its dominant share (D(X) > 1), and ends, the victims'
   resources t poorer, still above R' as it is now: D(X - t) > D(R'). Never inverts, in
   dominant shares: both sides end better off than the worse off of the two was (R' because
   its D rises, 1), so the sorted dominant shares rise lexicographically with every such
   reclaim - what changes below D(R') only rises, what falls stays above it (max-min, as rule 1
   argues for GPUs) - and no sequence of them comes back to where it started.

Pods of a queue within its share of every resource (D <= 1) are never taken (2). The second half
of 1 keeps the two rules from undoing each other: rule 1 takes only from a queue above its GPU
share, and a DRF reclaim leaves its reclaimer within it, so no GPU reclaim takes back what a DRF
reclaim gave (and a GPU reclaim's victim, above its GPU share, is not a queue below its dominant
share: no DRF reclaim serves it from its reclaimer at once). It also says what DRF is for: giving
a queue the CPU or memory it is owed beside GPUs it is owed, never GPUs beyond its share.

In the example: b (D = 0) takes a pod of a (D 1.33, ending at 1 > 0) and ends at 1 of 4 GPUs.
Had b asked for one pod only, its GPU share would be 1 (a 4, 3 left unassigned): b ends at 1 of
1, within it, and is served as well, leaving a 1 GPU below a share that only the idle GPUs make
up - the case the GPU rule alone, comparing GPU surpluses (a would end as owed as b was), refuses.

A GPU-only cluster never gets here: nothing is host-starved there, and DRF is tried only for a
pod that neither rule 1 nor preemption could serve, so every plan such a cluster gets is the
one it got before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from extender.policy.fairness import (
    EPSILON,
    GPU_MODEL_PREFIX,
    FairnessSnapshot,
    QueueTree,
    Resources,
    format_amount,
)
from extender.policy.placement import GpuDemand, NodeGpus, fits

# The resources dominant shares are taken over (a GPU model's pool counts as `gpu`).
DRF_RESOURCES = ("gpu", "cpu", "memory")


def gpu_amounts(resources: Mapping[str, float]) -> dict[str, float]:
    """The GPU resources of a fairness vector (`gpu` and `gpu/<model>`) with an amount."""
    return {r: a for r, a in resources.items() if (r == "gpu" or r.startswith(GPU_MODEL_PREFIX)) and a > 0}


def diverging_paths(tree: QueueTree, a: str, b: str) -> tuple[list[str], list[str]]:
    """The paths from `a` and from `b` up to (not including) their lowest common ancestor."""
    path_a, path_b = tree.path_to_root(a), tree.path_to_root(b)
    common = set(path_a) & set(path_b)
    return [q for q in path_a if q not in common], [q for q in path_b if q not in common]


def standings(fairness: FairnessSnapshot, queue: str, change: Resources | None = None) -> dict[str, float]:
    """Per resource in play, what `queue`'s subtree holds (`change` added: negative, taken off)
    over its fair share."""
    tree, shares = fairness.tree, fairness.fair_shares.get(queue, {})
    found: dict[str, float] = {}
    for resource in DRF_RESOURCES:
        if fairness.capacity.get(resource, 0.0) <= 0:
            continue
        held = tree.subtree(queue, "allocated", resource) + (change or {}).get(resource, 0.0)
        fair = shares.get(resource, 0.0)
        if held <= EPSILON:
            found[resource] = 0.0
        else:
            found[resource] = held / fair if fair > EPSILON else math.inf
    return found


def dominant_share(fairness: FairnessSnapshot, queue: str, change: Resources | None = None) -> float:
    """D(queue): the largest of its standings (0 when it holds nothing), `change` added."""
    return max(standings(fairness, queue, change).values(), default=0.0)


def host_starved(node: NodeGpus, demand: GpuDemand) -> bool:
    """The pod's GPUs fit the node's free GPUs, its CPU or memory does not fit what is free."""
    gpus_only = GpuDemand(demand.count, demand.milli, demand.models)
    return demand.count > 0 and fits(node, gpus_only) and not fits(node, demand)


def dominant_text(fairness: FairnessSnapshot, queue: str, change: Resources | None = None) -> str:
    """`queue`'s dominant share and the resource that makes it, for messages."""
    found = standings(fairness, queue, change)
    if not found:
        return "dominant share 0"
    resource = max(found, key=lambda r: found[r])
    held = fairness.tree.subtree(queue, "allocated", resource) + (change or {}).get(resource, 0.0)
    fair = fairness.fair_shares.get(queue, {}).get(resource, 0.0)
    return (
        f"dominant share {_ratio(found[resource])} ({resource} {format_amount(resource, held)} of "
        f"{format_amount(resource, fair)})"
    )


def _ratio(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.2f}"


def drf_victim_text(fairness: FairnessSnapshot, queue: str) -> str:
    """Why `queue` gives: for the victim's event."""
    return f"queue '{queue}' holds more than its fair share of a resource: {dominant_text(fairness, queue)}"


def drf_refusal(
    fairness: FairnessSnapshot,
    reclaimer: str,
    request: Resources,
    victim: str,
    taken: Resources,
    starting: bool = False,
) -> str:
    """Why a host-starved pod of `reclaimer` asking `request` may not take `taken` (the victims'
    fairness vectors, summed) from `victim` ('' when it may): the rule of the module docstring.
    `starting`: `taken` is a pod of `victim` about to start, not counted in its queue yet - would
    the rule take it back once it ran? (`extender.policy.deference`)"""
    tree = fairness.tree
    if reclaimer == victim or reclaimer not in tree.specs or victim not in tree.specs:
        return "reclaim is between queues"
    up_reclaimer, up_victim = diverging_paths(tree, reclaimer, victim)
    shares = fairness.fair_shares
    wanted = gpu_amounts(request)
    for queue in up_reclaimer:
        if dominant_share(fairness, queue) >= 1 - EPSILON:
            return f"queue '{queue}' is not below its dominant share ({dominant_text(fairness, queue)})"
        for resource, amount in wanted.items():
            held, fair = tree.subtree(queue, "allocated", resource), shares.get(queue, {}).get(resource, 0.0)
            if held + amount > fair + EPSILON:
                return (
                    f"queue '{queue}' would end above its fair share of {resource} "
                    f"({format_amount(resource, held)} + {format_amount(resource, amount)} of "
                    f"{format_amount(resource, fair)}): a GPU reclaim could take it back"
                )
    diverging = up_reclaimer[-1]  # R'
    owed_dominant = dominant_share(fairness, diverging)
    if dominant_share(fairness, diverging, request) <= owed_dominant + EPSILON:
        return (
            f"the pod would not raise the dominant share of queue '{diverging}' "
            f"({dominant_text(fairness, diverging)}): it asks for none of that resource"
        )
    # Before the move (`starting`: the pod running) and after it (`starting`: as things are now).
    before, left = (
        (dict(taken), None) if starting else (None, {resource: -amount for resource, amount in taken.items()})
    )
    for queue in up_victim:
        if dominant_share(fairness, queue, before) <= 1 + EPSILON:
            return (
                f"queue '{queue}' is not above its dominant share ({dominant_text(fairness, queue, before)})"
            )
        if dominant_share(fairness, queue, left) <= owed_dominant + EPSILON:
            return (
                f"queue '{queue}' would end at {dominant_text(fairness, queue, left)}, no more than queue "
                f"'{diverging}' now ({dominant_text(fairness, diverging)}): no fairer"
            )
    return ""
