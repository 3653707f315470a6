"""Capacity that frees on its own goes first to the most owed queue's waiting pod. Pure.

kube-scheduler tries waiting pods in its own order - priority, then creation - blind to queues.
When a GPU frees by itself (a pod finished), the oldest waiting pod takes it, often one of a
queue already above its fair share, while a pod of a queue below its share waits; the reclaim
loop then evicts the newcomer for the owed pod: the work it did is lost, and the eviction is
churn that fairness alone made necessary.

The rule: a preemptible pod of queue Q **defers** to a waiting pod of another queue R on a node
when

* R's pod is waiting, admitted by the admission rule, not held for (no reclaim plan serves it
  already) and not of a gang still to be admitted whole (the planner serves those);
* reclaim would take Q's pod back for R's pod once it started: `reclaim_refusal` with
  ``starting=True`` allows it (rule 1 of `extender.policy.reclaim`: every queue from R up to
  where the paths diverge is owed, every queue from Q up to there would borrow, and ends, the pod
  poorer, less owed than R's side is now);
* R's pod fits the node's free capacity - what Q's pod would take.

Then the filter refuses Q's pod on that node, naming R. Only there and only while R's pod waits
and fits, so nothing idles: a node where no owed pod fits takes Q's pod as before, and once R's
pod is placed (or stops being owed) Q's pod goes. A pod that is not preemptible never defers
(reclaim would not take it back: no churn to avoid), nor a pod GPUs are held for (they are its).

Worked example (tests/unit/extender/test_deference.py): 8 GPUs; a (share 4) holds 5, b (share 4)
holds 2 and waits with a 1-GPU pod; one GPU frees. a's older waiting pod would start there and
bring a to 6 of 4, from which reclaim takes it for b (a ends 1 above its share, b 2 below): so it
defers, and b's pod takes the GPU. With b at 4 of 4 nothing is owed, and a's pod starts.

`owed_pods` is computed once per picture (the filter keeps it per version of the picture; with
no owed pod waiting the rule costs nothing); `defers_to` is asked once per pod filtered, and its
answer's demands fitted per kind of node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender.policy.drf import gpu_amounts
from extender.policy.fairness import EPSILON, FairnessSnapshot, Resources, format_amount
from extender.policy.placement import GpuDemand
from extender.policy.reclaim import reclaim_refusal


@dataclass(frozen=True)
class OwedPod:
    """A waiting pod capacity should go to first: its queue is below its fair share."""

    key: str
    queue: str
    request: Resources  # its fairness vector (what reclaim compares)
    demand: GpuDemand  # what it needs of a node


def owed_pods(fairness: FairnessSnapshot, waiting: Iterable[OwedPod]) -> tuple[OwedPod, ...]:
    """Of `waiting` (admitted, unplaced, not held for), those of queues below their fair share
    on every GPU resource they ask for, the most owed queue first, then in the given order; one
    pod per (queue, request, demand): pods alike defer alike."""
    rank = {queue: place for place, queue in enumerate(fairness.order())}
    kept: dict[tuple[str, tuple[tuple[str, float], ...], GpuDemand], OwedPod] = {}
    for pod in waiting:
        if pod.queue in rank and is_owed(fairness, pod.queue, pod.request):
            kept.setdefault((pod.queue, tuple(sorted(pod.request.items())), pod.demand), pod)
    return tuple(sorted(kept.values(), key=lambda pod: rank[pod.queue]))


def is_owed(fairness: FairnessSnapshot, queue: str, request: Resources) -> bool:
    """Whether `queue` holds less than its fair share of every GPU resource `request` asks for
    (a cheap first test: callers skip the rest of a pod of a queue that is not)."""
    tree, shares = fairness.tree, fairness.fair_shares
    if queue not in tree.specs:
        return False
    return all(
        tree.subtree(queue, "allocated", resource) < shares.get(queue, {}).get(resource, 0.0) - EPSILON
        for resource in gpu_amounts(request)
    )


def defers_to(
    fairness: FairnessSnapshot, queue: str, request: Resources, preemptible: bool, owed: Sequence[OwedPod]
) -> tuple[OwedPod, ...]:
    """The owed pods a pod of `queue` asking `request` defers to where they fit: those reclaim
    would evict it for once it started (most owed first); none for a pod not preemptible."""
    if not preemptible:
        return ()
    return tuple(
        pod
        for pod in owed
        if pod.queue != queue
        and not reclaim_refusal(fairness, pod.queue, pod.request, queue, request, starting=True)
    )


def deference_reason(fairness: FairnessSnapshot, queue: str, owed: OwedPod) -> str:
    """The refusal's text: the queue owed, and both queues' GPUs against their shares."""
    tree, shares = fairness.tree, fairness.fair_shares

    def standing(name: str) -> str:
        held = tree.subtree(name, "allocated", "gpu")
        return f"{format_amount('gpu', held)} of {format_amount('gpu', shares.get(name, {}).get('gpu', 0.0))}"

    return (
        f"free GPUs here go first to a waiting pod of queue '{owed.queue}', below its fair share "
        f"(gpu {standing(owed.queue)}); queue '{queue}' (gpu {standing(queue)}) would borrow them "
        "and reclaim would take them back"
    )
