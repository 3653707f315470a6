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
  poorer, less owed than R's side is now) - or, for CPU or memory both pods ask, `drf_refusal`
  with ``starting=True`` does (rule 10, dominant-resource fairness: R's side below its dominant
  share and within its GPU share with the pod, Q's side above its dominant share with Q's pod
  and still above R's side without it);
* R's pod fits the node's free capacity - what Q's pod would take.

The owed pods are tried most owed first, by the measure reclaim's DRF rule uses: higher queue
priority first (as `FairnessSnapshot.order`), then the lower dominant share - held over fair
share, the largest over GPUs, CPU and memory (`extender.policy.drf.dominant_share`) - then
`FairnessSnapshot.order`'s rank (held over capacity, then name). So where CPU and memory are
in play, the queue deference serves first is the one DRF counts as most owed, not the one that
merely holds least of the cluster: b at 1 of 4 GPUs and 14 of 16 cores (dominant share 0.88)
comes after c at 2 of 4 GPUs and 8 of 48 cores (0.5), though b holds less of the cluster
(0.22 of its cores against c's 0.25 of its GPUs).

Then the filter refuses Q's pod on that node, naming R. Only there and only while R's pod waits
and fits, so nothing idles: a node where no owed pod fits takes Q's pod as before, and once R's
pod is placed (or stops being owed) Q's pod goes. A pod that is not preemptible never defers
(reclaim would not take it back: no churn to avoid), nor a pod GPUs are held for (they are its).

Worked example (tests/unit/extender/test_deference.py): 8 GPUs; a (share 4) holds 5, b (share 4)
holds 2 and waits with a 1-GPU pod; one GPU frees. a's older waiting pod would start there and
bring a to 6 of 4, from which reclaim takes it for b (a ends 1 above its share, b 2 below): so it
defers, and b's pod takes the GPU. With b at 4 of 4 nothing is owed, and a's pod starts. The
CPU-starved shape (one node, 8 GPUs, 64 cores; a's pods <1 GPU, 16 cores>, b's <1 GPU, 2
cores>, shares 4 / 4 GPUs, 48 / 16 cores): a at 3 pods, one of a's ended, a's waiting pod would
bring a to 4 of 4 GPUs, 64 of 48 cores (dominant share 1.33), from which rule 10 takes it back
for b (0): it defers, though the GPU rule alone would let it start (a at its GPU share).

**Collecting a node for an owed pod of several GPUs** (`collecting_nodes`; where the caller
asks: the filter's `--collect-for-owed`, the simulator's; `COLLECT_FOR_OWED` by default). An owed
2- or 4-GPU pod seldom fits anywhere: GPUs free one at a time, spread over the nodes, and the
rule above hands each to a borrower, since the owed pod does not fit there; reclaim later evicts
several pods for it. So for each owed pod of more than one GPU that fits no node now, ONE node is
chosen to collect for it: of the nodes that could hold it once empty (its GPU models, at least
its GPU count), the one with the most whole GPUs free - the fewest it still misses, each at
least one eviction - then the most free CPU, then memory, then the first in the given order. A
pod that defers to the owed pod where it fits defers on that node too, so departures accumulate
there; once the owed pod fits, the rule above keeps them for it, and reclaim's choice of the
node needing the fewest evicted GPUs finds the node collected, missing only k - f of its k GPUs.
Bounded: at most one node per owed pod (per queue and demand, as `owed_pods` keeps), chosen
afresh from what is free each time, so none when no such pod waits; pods that would not be taken
back for it (not preemptible, of a queue owed too, of its own queue) still go there. Worked
example (tests/unit/extender/test_deference.py, the node choice's table): n0 with 2 of 8 GPUs
free and n1 with 3, a 4-GPU owed pod: n1 collects (it misses 1, n0 2); n1 and n2 with 3 free
each, n2 with more CPU free: n2.

`owed_pods` is computed once per picture (the filter keeps it per version of the picture; with
no owed pod waiting the rule costs nothing); `defers_to` is asked once per pod filtered, and its
answer's demands fitted per kind of node.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from extender.policy.drf import dominant_share, dominant_text, drf_refusal, gpu_amounts, standings
from extender.policy.fairness import EPSILON, FairnessSnapshot, Resources, format_amount
from extender.policy.placement import GpuDemand, NodeGpus, fits
from extender.policy.reclaim import reclaim_refusal

# Whether deference collects a node for an owed pod of several GPUs by default (`collecting_nodes`;
# the extender's `--collect-for-owed`, the simulator's).
COLLECT_FOR_OWED = False

# The resources other than GPUs that reclaim's DRF rule frees for a host-starved pod.
HOST_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class OwedPod:
    """A waiting pod capacity should go to first: its queue is below its fair share."""

    key: str
    queue: str
    request: Resources  # its fairness vector (what reclaim compares)
    demand: GpuDemand  # what it needs of a node
    collecting: str = ""  # the node collected for it (`collecting_nodes`; '' none)


def owed_pods(fairness: FairnessSnapshot, waiting: Iterable[OwedPod]) -> tuple[OwedPod, ...]:
    """Of `waiting` (admitted, unplaced, not held for), those of queues below their fair share
    on every GPU resource they ask for, the most owed queue first (see the module docstring),
    then in the given order; one pod per (queue, request, demand): pods alike defer alike."""
    rank = {queue: place for place, queue in enumerate(fairness.order())}
    kept: dict[tuple[str, tuple[tuple[str, float], ...], GpuDemand], OwedPod] = {}
    for pod in waiting:
        if pod.queue in rank and is_owed(fairness, pod.queue, pod.request):
            kept.setdefault((pod.queue, tuple(sorted(pod.request.items())), pod.demand), pod)
    specs = fairness.tree.specs
    owed_first = {
        queue: (-specs[queue].priority, dominant_share(fairness, queue), rank[queue])
        for queue in {pod.queue for pod in kept.values()}
    }
    return tuple(sorted(kept.values(), key=lambda pod: owed_first[pod.queue]))


def collecting_nodes(owed: Sequence[OwedPod], nodes: Sequence[NodeGpus]) -> tuple[OwedPod, ...]:
    """`owed` with, for each pod of more than one GPU that fits none of `nodes` (their free
    capacity as a borrower's pod sees it), the node chosen to collect for it (`collecting_node`;
    the module docstring). The others unchanged, so with no such pod nothing is collected."""
    return tuple(
        replace(pod, collecting=collecting_node(pod.demand, nodes))
        if pod.demand.count > 1 and not any(fits(node, pod.demand) for node in nodes)
        else pod
        for pod in owed
    )


def collecting_node(demand: GpuDemand, nodes: Sequence[NodeGpus]) -> str:
    """The node to collect for `demand` (of several whole GPUs): of those with its GPU models and
    at least its GPU count, the one with the most GPUs wholly free (it misses the fewest: each
    missing GPU costs reclaim at least one eviction), then the most free CPU, then memory, then
    the first of `nodes`; '' when no node could hold it."""
    best, best_rank = "", (-1, 0, 0)
    for node in nodes:
        if len(node.free_milli) < demand.count or (demand.models and node.model not in demand.models):
            continue
        free = sum(1 for milli in node.free_milli if milli >= demand.milli)
        rank = (free, node.cpu_free_milli, node.memory_free_mib)
        if rank > best_rank:
            best, best_rank = node.name, rank
    return best


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
        and (
            _gpus_taken_back(fairness, queue, request, pod) or _drf_takes_back(fairness, queue, request, pod)
        )
    )


def _gpus_taken_back(fairness: FairnessSnapshot, queue: str, request: Resources, owed: OwedPod) -> bool:
    """Rule 1 of reclaim would evict the pod of `queue` for `owed` once it ran."""
    return not reclaim_refusal(fairness, owed.queue, owed.request, queue, request, starting=True)


def _drf_takes_back(fairness: FairnessSnapshot, queue: str, request: Resources, owed: OwedPod) -> bool:
    """Rule 10 of reclaim (DRF) would evict the pod of `queue` for `owed` once it ran: only where
    the pod would take `queue` above its fair share of CPU or memory that `owed` asks for too (DRF
    frees a host-starved pod's CPU or memory; GPUs above a share are rule 1's)."""
    over = standings(fairness, queue, request)
    short = any(
        over.get(resource, 0.0) > 1 + EPSILON and owed.request.get(resource, 0.0) > 0
        for resource in HOST_RESOURCES
    )
    return short and not drf_refusal(fairness, owed.queue, owed.request, queue, request, starting=True)


def deference_reason(fairness: FairnessSnapshot, queue: str, request: Resources, owed: OwedPod) -> str:
    """The refusal's text: the queue owed, and both queues' GPUs against their shares - or, when
    only DRF would take the pod back, both queues' dominant shares (the pod's with it)."""
    if not _gpus_taken_back(fairness, queue, request, owed):
        return (
            f"free capacity here goes first to a waiting pod of queue '{owed.queue}', at "
            f"{dominant_text(fairness, owed.queue)}; queue '{queue}' would go to "
            f"{dominant_text(fairness, queue, request)}, above its fair share, and reclaim would "
            "take it back"
        )
    tree, shares = fairness.tree, fairness.fair_shares

    def standing(name: str) -> str:
        held = tree.subtree(name, "allocated", "gpu")
        return f"{format_amount('gpu', held)} of {format_amount('gpu', shares.get(name, {}).get('gpu', 0.0))}"

    return (
        f"free GPUs here go first to a waiting pod of queue '{owed.queue}', below its fair share "
        f"(gpu {standing(owed.queue)}); queue '{queue}' (gpu {standing(queue)}) would borrow them "
        "and reclaim would take them back"
    )


def collecting_reason(fairness: FairnessSnapshot, queue: str, request: Resources, owed: OwedPod) -> str:
    """The refusal's text on the node collected for `owed` (`collecting_nodes`)."""
    return (
        f"node collects GPUs for a waiting {owed.demand.count}-GPU pod that fits no node yet: "
        + deference_reason(fairness, queue, request, owed)
    )
