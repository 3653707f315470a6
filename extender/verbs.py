"""The scheduler verbs' decisions: filter, prioritize and preempt, as pure functions of the picture.

They read the cluster picture (no API call, no mutation) and return what to answer and what the
server should do about it (a wait reason to report, a reservation to make, a metric label); the
server applies those effects and speaks HTTP. Both cost O(nodes in the request).

Filter first asks the queue's fairness snapshot whether the pod may take what it asks for; a
refusal fails every node with the reason (FailedAndUnresolvableNodes: preempting pods on a node
cannot fix a queue's share). An admitted pod then keeps only the nodes whose free GPUs fit it.

Preempt sees the victims kube-scheduler's own priority preemption proposes per node - blind to
queues - and keeps a node only if every victim there may go by the reclaim rules
(`extender.policy.reclaim.reclaim_refusal`): no GPUs taken from a queue at or below its fair
share on behalf of one above it, and never a pod that is not preemptible. A node is dropped whole
rather than thinned: the scheduler does not re-check that fewer victims still make room.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from contract.names import GPU_MILLI
from extender.picture.cluster import ClusterPicture
from extender.policy.placement import GpuDemand, NodeGpus, Strategy, fits, score_nodes
from extender.policy.reclaim import reclaim_refusal
from extender.wire import (
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    filter_result,
)

NOT_READY = "tessera extender is still syncing its cluster picture; retry"


class UnreadablePod(ValueError):
    """The pod in the request holds values that parse as JSON but mean nothing (e.g. a bad quantity)."""


@dataclass(frozen=True)
class FilterDecision:
    result: ExtenderFilterResult
    outcome: str  # metric label: passed, refused, admitted, error
    reason: str  # metric label: why (bounded set)
    # For the wait-reason reporter: the pod's queue and, when it was judged, what was decided.
    queue: str = ""
    admitted: bool | None = None
    message: str = ""
    reserve: bool = False  # count the pod against its queue until it is bound


@dataclass(frozen=True)
class PriorityDecision:
    scores: dict[str, int]
    outcome: str
    reason: str


def describe(demand: GpuDemand) -> str:
    if demand.count == 1 and demand.milli < GPU_MILLI:
        return f"{demand.milli / GPU_MILLI:.3g} of a GPU"
    return f"{demand.count} GPU{'s' if demand.count != 1 else ''}"


def _misfit(supply: NodeGpus, demand: GpuDemand) -> str:
    """Why `demand` does not fit on the node ('' when it fits)."""
    if fits(supply, demand):
        return ""
    if fits(supply, replace(demand, cpu_milli=0, memory_mib=0)):
        return (
            f"not enough free CPU or memory beside the GPUs ({demand.cpu_milli}m CPU and "
            f"{demand.memory_mib}Mi asked, {supply.cpu_free_milli}m and {supply.memory_free_mib}Mi free)"
        )
    free = sum(supply.free_milli) / GPU_MILLI
    models = f" of model {'/'.join(sorted(demand.models))}" if demand.models else ""
    return (
        f"not enough free GPU for {describe(demand)}{models} "
        f"({free:.3g} free over {len(supply.free_milli)} GPUs, model '{supply.model}')"
    )


def decide_filter(picture: ClusterPicture, args: ExtenderArgs) -> FilterDecision:
    """Which candidate nodes can take the pod now, and why the others cannot."""
    names = args.candidate_names()
    if not picture.ready():
        return FilterDecision(ExtenderFilterResult(Error=NOT_READY), "error", "not_ready")
    pod = args.Pod.raw()
    demand = picture.demand(pod)
    if demand.problem:
        raise UnreadablePod(f"unreadable pod: {demand.problem}")
    if not demand.wants_gpu and not demand.labelled:
        # Neither a GPU pod nor one that names a queue: not ours to hold back.
        return FilterDecision(filter_result(args, names, {}), "passed", "no_gpu")
    key = f"{args.Pod.metadata.namespace}/{args.Pod.metadata.name}"
    view = picture.fairness()
    # A fraction is a larger share of a smaller GPU: admit it per GPU size among the candidates.
    gpu_memory = picture.gpu_memory if demand.fractional else {}  # {}: the size does not matter
    by_size = {
        memory: view.admit(
            demand.queue,
            picture.accounting.resources(key, pod, demand, memory),
            preemptible=demand.preemptible,
        )
        for memory in (sorted({gpu_memory.get(name, 0) for name in names}) if gpu_memory else [0])
    }
    admitted = [d for d in by_size.values() if d.admit]
    decision = admitted[0] if admitted else next(iter(by_size.values()))
    if not decision.admit:
        result = filter_result(args, [], {})
        result.FailedAndUnresolvableNodes = dict.fromkeys(names, decision.reason)
        return FilterDecision(
            result, "refused", decision.kind or "refused", demand.queue, False, decision.reason
        )
    if not demand.wants_gpu:
        return FilterDecision(
            filter_result(args, names, {}), "admitted", "no_gpu", demand.queue, True, decision.reason
        )
    passed: list[str] = []
    failed: dict[str, str] = {}
    # Nodes of one shape and GPU size get one verdict: a large cluster has few distinct ones.
    verdicts: dict[tuple[int, str], str] = {}
    reference = picture.inventory.reference_memory(demand.models)
    supplies = picture.inventory.supplies_for(key, names)
    for name, supply in zip(names, supplies, strict=True):
        memory = gpu_memory.get(name, 0) if gpu_memory else 0
        if not by_size[memory].admit:
            failed[name] = by_size[memory].reason
            continue
        reason = verdicts.get((memory, supply.shape))
        if reason is None:
            reason = verdicts[memory, supply.shape] = _misfit(
                supply, demand.placement_at(memory or reference)
            )
        if reason:
            failed[name] = reason
        else:
            passed.append(name)
    return FilterDecision(
        filter_result(args, passed, failed),
        "admitted",
        "fits" if passed else "no_gpu_fit",
        demand.queue,
        True,
        decision.reason,
        reserve=bool(passed),
    )


@dataclass(frozen=True)
class PreemptionDecision:
    result: ExtenderPreemptionResult
    dropped: dict[str, str]  # node -> why its proposed victims may not go


def decide_preemption(picture: ClusterPicture, args: ExtenderPreemptionArgs) -> PreemptionDecision:
    """The proposed nodes whose victims all may be evicted for this pod, unchanged."""
    proposals = args.victim_uids()
    if not picture.ready():
        return PreemptionDecision(ExtenderPreemptionResult(), dict.fromkeys(proposals, NOT_READY))
    pod = args.Pod.raw()
    demand = picture.demand(pod)
    if demand.problem:
        raise UnreadablePod(f"unreadable pod: {demand.problem}")
    key = f"{args.Pod.metadata.namespace}/{args.Pod.metadata.name}"
    request = picture.accounting.resources(key, pod, demand)
    keys_by_uid = {str((p.get("metadata") or {}).get("uid")): k for k, p in picture.kind("Pod").items()}
    snapshot = picture.snapshot()
    kept: dict[str, MetaVictims] = {}
    dropped: dict[str, str] = {}
    for node, (uids, violations) in proposals.items():
        fork = snapshot.fork()
        why = ""
        for uid in uids:
            victim = fork.running.get(keys_by_uid.get(uid, ""))
            if victim is None:
                continue  # holds no GPU (or is unknown): nothing of Tessera's to guard
            if not victim.preemptible:
                why = f"pod {victim.key} is not preemptible"
            elif victim.queue != demand.queue:
                why = reclaim_refusal(fork.fairness, demand.queue, request, victim.queue, victim.resources)
            if why:
                break
            fork.evict(victim.key)
        if why:
            dropped[node] = why
        else:
            kept[node] = MetaVictims(Pods=[MetaPod(UID=uid) for uid in uids], NumPDBViolations=violations)
    return PreemptionDecision(ExtenderPreemptionResult(NodeNameToMetaVictims=kept), dropped)


def queue_strategy(picture: ClusterPicture, queue: str) -> Strategy:
    obj = picture.kind("Queue").get(queue) or {}
    return "spread" if (obj.get("spec") or {}).get("placement") == "spread" else "binpack"


def decide_priorities(picture: ClusterPicture, args: ExtenderArgs) -> PriorityDecision:
    """The score of every candidate node (0..10), GPU-less pods included: their CPU and memory
    strand GPUs as much as a fraction does (neutral 0 only while syncing or for an unreadable pod)."""
    names = args.candidate_names()
    if not picture.ready():
        return PriorityDecision(dict.fromkeys(names, 0), "neutral", "not_ready")
    demand = picture.demand(args.Pod.raw())
    if demand.problem:  # filter refused it with the reason; nothing to rank
        return PriorityDecision(dict.fromkeys(names, 0), "neutral", "unreadable")
    placement = demand.placement_at(picture.inventory.reference_memory(demand.models))
    key = f"{args.Pod.metadata.namespace}/{args.Pod.metadata.name}"
    supplies = picture.inventory.supplies_for(key, names)
    strategy = queue_strategy(picture, demand.queue)
    scores = score_nodes(supplies, placement, picture.fairness().mix, strategy)
    return PriorityDecision(scores, "scored", strategy)
