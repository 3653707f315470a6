"""The scheduler verbs' decisions: filter, prioritize and preempt, as pure functions of the picture.

They read the cluster picture (no API call, no mutation) and return what to answer and what the
server should do about it (a wait reason to report, a reservation to make, a metric label); the
server applies those effects and speaks HTTP. Both cost O(nodes in the request).

Filter first refuses a pod whose namespace may not use its queue (`extender.policy.tenancy`; the
pod webhook refuses it at creation, but a webhook with failurePolicy Ignore can be bypassed), then
asks the admission rule (`extender.policy.admission.admit`, with the queue's fairness snapshot)
whether the pod may take what it asks for; a refusal fails every node with the reason
(FailedAndUnresolvableNodes: preempting pods on a node cannot fix a queue's share, nor who may use
it). An admitted pod then keeps only the nodes whose free GPUs fit it: its supply on a node is the
node less the GPUs reclaim holds there for other pods (the shares of the very devices a plan
freed). A pod GPUs are held for keeps only its hold's node when it fits there, so it takes the
GPUs freed for it, not free ones the planner counted on for other pods.

A pod of a gang whose minimum is neither placed nor admitted is admitted with its whole gang or
not at all, once its controller has created at least the minimum: the queue is asked for the
members still missing at once (their summed demand against
limits and quotas), and their GPUs must all fit among the candidates, not counting GPUs held for
other pods and gangs (`extender.policy.workloads.plan_gang`). Admitted, the decision carries a
gang reservation (slots counted against the queue, GPUs held on the planned nodes) which the
members that follow pass through; refused, every node fails with the numbers.

Preempt sees the victims kube-scheduler's own priority preemption proposes per node - blind to
queues - and keeps a node only if every victim there may go by the reclaim rules
(`extender.policy.reclaim.reclaim_refusal`): no GPUs taken from a queue at or below its fair
share on behalf of one above it, never a pod that is not preemptible, and never a gang's member
that its workload needs to keep its minimum (the scheduler proposes victims per node; a gang
spans nodes, so only Tessera's reclaim loop takes gangs, whole). A node is dropped whole
rather than thinned: the scheduler does not re-check that fewer victims still make room.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import compress
from types import MappingProxyType
from typing import Any, NamedTuple

from contract.names import GPU_MILLI
from extender.memo import ShapeMemo
from extender.picture.cluster import ClusterPicture, PodContext
from extender.picture.demands import PodDemand, pod_created
from extender.picture.gangs import GangReservation, PartSlots, split_by_reservation
from extender.picture.inventory import CandidateKinds
from extender.policy.admission import (
    GANG,
    GANG_DOMAIN_TOO_SMALL,
    GANG_NO_DOMAIN,
    GANG_NO_FIT,
    GANG_READING,
    Ask,
    GangState,
    admit,
    gang_text,
    unplaced_part_text,
)
from extender.policy.backfill import backfill_supplies, gang_ahead, held_back
from extender.policy.deference import OwedPod, collecting_reason, deference_reason, defers_to
from extender.policy.fairness import AdmissionDecision
from extender.policy.placement import (
    NO_DOMAINS,
    DomainMap,
    GpuDemand,
    NodeGpus,
    Strategy,
    fits,
    score_kinds,
)
from extender.policy.reclaim import reclaim_refusal
from extender.policy.topology import (
    NO_ASK,
    DomainChoices,
    DomainPlan,
    PartAsk,
    RoomMemo,
    TopologyAsk,
    domain_scores,
    fullest_first,
    never_held_parts_text,
    never_held_text,
    no_domain_text,
    plan_in_domain,
    plan_parts,
)
from extender.policy.waiting import QUEUE_NOT_ALLOWED, unplaced
from extender.policy.workloads import part_of, plan_gang
from extender.wire import (
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
    filter_result,
    host_priorities_json,
)

NOT_READY = "tessera extender is still syncing its cluster picture; retry"
# Refusals that keep what reclaim holds for a gang: its missing members do not all fit yet (GPUs
# reclaim freed for it are still coming), no domain holds them, or its minimum is being read.
KEEPS_HOLDS = frozenset({GANG_NO_FIT, GANG_NO_DOMAIN, GANG_READING})


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
    gang: GangReservation | None = None  # its workload's minimum, admitted as a unit
    passed: PassedNodes | None = None  # the nodes passed, by kind, for the prioritize that follows
    # Admitted, but no candidate fits: why it waits (`extender.policy.waiting.unplaced`), with
    # `message` saying it; "": it does not wait.
    waits: str = ""


@dataclass(frozen=True)
class PriorityDecision:
    hosts: list[str]  # the candidates, in the request's order
    kinds: list[str]  # the kind of each (scored alike)
    score_of: dict[str, int]  # kind -> score
    outcome: str
    reason: str

    @property
    def scores(self) -> dict[str, int]:
        return dict(zip(self.hosts, map(self.score_of.__getitem__, self.kinds), strict=True))

    def json(self) -> bytes:
        """The answer, a HostPriorityList."""
        return host_priorities_json(self.hosts, self.kinds, self.score_of)


def _neutral(names: list[str], reason: str) -> PriorityDecision:
    """Every candidate scored 0."""
    return PriorityDecision(names, [""] * len(names), {"": 0}, "neutral", reason)


def describe(demand: GpuDemand) -> str:
    if demand.count == 1 and demand.milli < GPU_MILLI:
        return f"{demand.milli / GPU_MILLI:.3g} of a GPU"
    return f"{demand.count} GPU{'s' if demand.count != 1 else ''}"


# Why a demand does not fit a node of a shape, kept across requests (nodes whose CPU and memory
# are partly used have many shapes; each costs microseconds to judge). Bounded: starts over.
_MISFITS: ShapeMemo[GpuDemand, str] = ShapeMemo(100_000)
# Members of a shape (up to a count) a node holds, by node shape: prioritize's domain rooms.
_ROOMS: ShapeMemo[tuple[GpuDemand, int], int] = ShapeMemo(100_000)
# Members of a gang's shape, and whole GPUs free, per node shape, for the domain choice at a
# gang's admission (`plan_in_domain`).
_DOMAIN_ROOMS: RoomMemo = ShapeMemo(100_000)
# The last domain plan per gang shape and ask (`DomainChoices`): a gang that waits, or whose
# admitting filter the scheduler calls again, is not planned again over thousands of nodes
# while neither their supplies nor their domains changed. Each kept plan keeps its call's list of
# supplies (8 bytes a node: 40 KB at 5000 nodes), so a few dozen: as many as gangs of distinct
# shapes and asks wait at once, and keys of an old topology version go at the next start-over.
_DOMAIN_CHOICES = DomainChoices(64)


def _misfit(supply: NodeGpus, demand: GpuDemand) -> str:
    """Why `demand` does not fit on the node ('' when it fits); all it reads of the node is in
    its shape."""
    return _misfit_in(_MISFITS.table(demand), supply, demand)


def _misfit_in(table: dict[str, str], supply: NodeGpus, demand: GpuDemand) -> str:
    """`_misfit` with the demand's table of `_MISFITS` at hand (a lookup per node kind)."""
    found = table.get(supply.shape)
    return _MISFITS.put(table, supply.shape, _judge(supply, demand)) if found is None else found


def _judge(supply: NodeGpus, demand: GpuDemand) -> str:
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


@dataclass(frozen=True)
class PassedNodes:
    """The nodes a filter passed for a pod, by kind, as the inventory stood (`version`).

    kube-scheduler asks prioritize about exactly the nodes the filter passed, right after it: the
    prioritize of the same pod (and workload) over the same names reads their kinds from here
    while no node's supply changed, instead of looking every name up again. Not kept when GPUs
    are held on some candidate (what the pod may use there is judged at each call).
    """

    key: str
    owner: str
    version: int
    nodes: CandidateKinds

    def of(self, key: str, owner: str, names: list[str], version: int) -> CandidateKinds | None:
        """The kinds of `names` for pod `key` of `owner`, if these are they and still true."""
        if (self.key, self.owner, self.version) != (key, owner, version) or self.nodes.names != names:
            return None
        return self.nodes


class _AtSize(NamedTuple):
    """How a pod is judged on the nodes of one GPU size: its queue's admission there, and what
    it asks of a node (with the verdicts of that demand by node shape, `_MISFITS`)."""

    admission: AdmissionDecision
    placement: GpuDemand
    misfits: dict[str, str]


def _verdict(at_size: _AtSize, supply: NodeGpus) -> str:
    """Why the pod may not go to a node of this supply ('' when it may)."""
    if not at_size.admission.admit:
        return at_size.admission.reason
    return _misfit_in(at_size.misfits, supply, at_size.placement)


def decide_filter(picture: ClusterPicture, args: ExtenderArgs) -> FilterDecision:
    """Which candidate nodes can take the pod now, and why the others cannot."""
    names = args.candidate_names()
    if not picture.ready():
        return FilterDecision(ExtenderFilterResult(Error=NOT_READY), "error", "not_ready")
    pod = args.Pod
    demand = picture.demand(pod)
    if demand.problem:
        raise UnreadablePod(f"unreadable pod: {demand.problem}")
    if not demand.wants_gpu and not demand.labelled:
        # Neither a GPU pod nor one that names a queue: not ours to hold back.
        return FilterDecision(filter_result(args, names, {}), "passed", "no_gpu")
    key = args.pod.key
    # One question of the picture: the rest of the decision reads what it answered.
    inputs = picture.filter_inputs(key, pod, demand, names)
    # Its namespace may not use its queue (the webhook that refuses such pods was bypassed).
    if inputs.refusal:
        refused = filter_result(args, [], {})
        refused.FailedAndUnresolvableNodes = dict.fromkeys(names, inputs.refusal)
        return FilterDecision(refused, "refused", "queue_not_allowed", demand.queue, False, inputs.refusal)
    context = inputs.context
    owner, gang = context.owner, context.gang
    # A member of a gang reserved inside a domain is judged on that domain's nodes only.
    candidates = names
    names, outside = inputs.names, inputs.outside
    reservation: GangReservation | None = None
    # Nodes of one kind (shape and GPU size) get one verdict: a large cluster has few kinds.
    version, nodes = inputs.version, inputs.nodes  # (the kinds as read at that version)
    # A fraction is a larger share of a smaller GPU: admit it per GPU size among the candidates.
    gpu_memory = inputs.gpu_memory if demand.fractional else {}  # {}: the size does not matter
    size_of = (
        {kind: gpu_memory.get(name) or 0 for kind, name in nodes.one_of_kind.items()} if gpu_memory else {}
    )
    sizes = sorted(set(size_of.values())) or [0]
    by_size, reservation = queue_admission(picture, names, context, sizes)
    admitted = [d for d in by_size.values() if d.admit]
    decision = admitted[0] if admitted else next(iter(by_size.values()))
    if not decision.admit:
        result = filter_result(args, [], {})
        result.FailedAndUnresolvableNodes = dict.fromkeys(candidates, decision.reason)
        return FilterDecision(
            result, "refused", decision.kind or "refused", demand.queue, False, decision.reason
        )
    if not demand.wants_gpu:
        if reservation is not None:  # (admitted just now: a part without GPUs may be kept in a domain)
            names, outside = _to_domain(picture, reservation, names, outside, gang.part)
        return FilterDecision(
            filter_result(args, names, outside),
            "admitted",
            "no_gpu",
            demand.queue,
            True,
            decision.reason,
            gang=reservation,
        )
    # The per-node part is lookups done by `map` and `compress` in C (thousands of nodes per call).
    reference = context.reference_memory
    at_size = {}
    for size, admission in by_size.items():
        placement = demand.placement_at(size or reference)
        at_size[size] = _AtSize(admission, placement, _MISFITS.table(placement))
    reason_of = {
        kind: _verdict(at_size[size_of.get(kind, 0)], supply) for kind, supply in nodes.supply_of.items()
    }
    owed = _owed_first(inputs.owed, context)
    if owed:
        for kind, supply in nodes.supply_of.items():
            if not reason_of[kind]:
                reason_of[kind] = _deference(context, owed, supply)
    if any(reason_of.values()):
        reasons = list(map(reason_of.__getitem__, nodes.kinds))
        kept = nodes.keeping(reasons, reason_of)
        failed = dict(zip(compress(names, reasons), filter(None, reasons), strict=True))
    else:  # every kind fits (the common case)
        kept, failed = nodes, {}
    passed = kept.names
    collected = _collected(context, owed, passed)
    if collected:
        passed = [name for name in passed if name not in collected]
        failed = failed | collected
    if kept.held:
        passed, failed = _to_hold(context, passed, failed)
    if reservation is not None:  # (admitted just now: its domain known now)
        passed, failed = _to_domain(picture, reservation, passed, failed, gang.part)
    failed |= outside
    remembered_nodes = None if kept.held or collected else PassedNodes(key, owner, version, kept)
    waits, message = ("", decision.reason) if passed else why_unplaced(context)
    return FilterDecision(
        filter_result(args, passed, failed),
        "admitted",
        "fits" if passed else "no_gpu_fit",
        demand.queue,
        True,
        message,
        reserve=bool(passed),
        gang=reservation,
        passed=remembered_nodes,
        waits=waits,
    )


def unschedulable(pod: Mapping[str, Any]) -> bool:
    """kube-scheduler tried the pod and found no node (PodScheduled False, Unschedulable)."""
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def waiting_decision(
    picture: ClusterPicture,
    nodes: list[str],
    key: str,
    pod: Mapping[str, Any],
    demand: PodDemand,
    gangs: dict[str, AdmissionDecision],
) -> tuple[AdmissionDecision, PodContext]:
    """The admission decision for a pending pod, every node of `nodes` a candidate: refused when
    its queue may not take pods of its namespace, else the admission rule's. A gang not admitted
    yet is judged whole once, for all its members (`gangs`: its workload's decision). With the
    pod's context, for `why_unplaced` when it is admitted."""
    refusal = picture.tenancy_refusal(demand.queue, demand.namespace)
    context = picture.pod_context(key, pod, demand)
    gang = context.gang
    if refusal:
        return AdmissionDecision(False, refusal, QUEUE_NOT_ALLOWED), context
    if not gang.admitted and gang.workload.key in gangs:
        return gangs[gang.workload.key], context
    decision = queue_admission(picture, nodes, context, [0])[0][0]
    if not gang.admitted:
        gangs[gang.workload.key] = decision
    return decision, context


def why_unplaced(context: PodContext) -> tuple[str, str]:
    """Why an admitted pod no candidate fits waits: its queue's fair share in GPUs against what
    the queue holds and the pod asks (`extender.policy.waiting.unplaced`)."""
    view = context.view
    queue = context.demand.queue
    share = view.fair_shares.get(queue, {}).get("gpu", 0.0)
    held = view.tree.subtree(queue, "allocated", "gpu")
    return unplaced(queue, share, held, context.request.get("gpu", 0.0))


def _owed_first(owed: tuple[OwedPod, ...], context: PodContext) -> tuple[OwedPod, ...]:
    """Of the `owed` waiting pods, those this pod defers to where they fit
    (`extender.policy.deference`): none unless it may defer (`PodContext.may_defer`: not a pod
    GPUs are held for, they are its own, nor of a gang admitted whole just now)."""
    if not owed or not context.may_defer:
        return ()
    demand = context.demand
    return defers_to(context.view, demand.queue, context.request, demand.preemptible, owed)


def deferred_everywhere(picture: ClusterPicture, names: list[str], context: PodContext) -> str:
    """Why the filter would leave every node of `names` the admitted pod fits to owed pods
    (`_owed_first`, `_collected`, `_deference`): the first node's reason; '' when it may go to one of them, or
    fits none (then it is not deference that holds it back). The requeue check asks it, so that a
    pod is nudged when the filter would pass it, not while it defers."""
    demand = context.demand
    owed = _owed_first(picture.owed_pods(), context) if demand.wants_gpu else ()
    if not owed:
        return ""
    reference = context.reference_memory
    gpu_memory = picture.gpu_memory if demand.fractional else {}  # {}: the size does not matter
    deferred = ""
    collected = _collected(context, owed, names)
    for name, why in collected.items():  # (a node collected for an owed pod: left to it if it fits)
        supply = picture.supplies(context.key, [name], context.owner, demand.queue)[0]
        if not _misfit(supply, demand.placement_at(gpu_memory.get(name) or reference)):
            deferred = deferred or why
    nodes = picture.candidates(
        context.key, [name for name in names if name not in collected], context.owner, demand.queue
    )
    for kind, supply in nodes.supply_of.items():
        if _misfit(supply, demand.placement_at(gpu_memory.get(nodes.one_of_kind[kind]) or reference)):
            continue
        why = _deference(context, owed, supply)
        if not why:
            return ""
        deferred = deferred or why
    return deferred


def _collected(context: PodContext, owed: tuple[OwedPod, ...], names: list[str]) -> dict[str, str]:
    """The nodes of `names` collected for an owed pod this pod defers to (`collecting_nodes`:
    one per owed pod of several GPUs that fits no node), with why it leaves them."""
    collected: dict[str, str] = {}
    for waiting in owed:
        if waiting.collecting:
            collected.setdefault(
                waiting.collecting,
                collecting_reason(context.view, context.demand.queue, context.request, waiting),
            )
    if not collected:
        return {}
    return {name: collected[name] for name in names if name in collected}


def _deference(context: PodContext, owed: tuple[OwedPod, ...], supply: NodeGpus) -> str:
    """Why the pod leaves a node to an owed pod that fits its free capacity ('' when none fits)."""
    for waiting in owed:
        if not _misfit_in(_MISFITS.table(waiting.demand), supply, waiting.demand):
            return deference_reason(context.view, context.demand.queue, context.request, waiting)
    return ""


def _to_hold(
    context: PodContext, passed: list[str], failed: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A pod reclaim holds GPUs for goes where they are, when it fits there: the other nodes
    that fit fail, so it takes the very GPUs freed for it rather than other free ones (which the
    planner counted on for other pods)."""
    hold = context.hold
    if hold is None or not hold.gpus or hold.node not in passed or len(passed) == 1:
        return passed, failed
    reason = f"GPUs are held for this pod on node {hold.node}"
    return [hold.node], failed | {name: reason for name in passed if name != hold.node}


def _to_domain(
    picture: ClusterPicture,
    reservation: GangReservation,
    passed: list[str],
    failed: dict[str, str],
    part: str,
) -> tuple[list[str], dict[str, str]]:
    """The pod whose filter admitted its gang into a domain just now goes to that domain's nodes."""
    kept, outside = split_by_reservation(reservation, passed, part, picture.nodes_in)
    return kept, failed | outside


def queue_admission(
    picture: ClusterPicture, names: list[str], context: PodContext, sizes: list[int]
) -> tuple[dict[int, AdmissionDecision], GangReservation | None]:
    """The admission rule's decision (`extender.policy.admission.admit`) for the pod on the nodes
    `names`, per GPU size among them (`sizes`, bytes; 0: the largest it could land on): a fraction
    is a larger share of a smaller GPU. A gang not admitted yet is judged whole, once for every
    size (`admit_gang`: its queue, and the GPUs of `names`), and may leave a reservation."""
    demand, gang = context.demand, context.gang
    if not gang.admitted:
        unit, reservation = admit_gang(picture, names, context)
        return dict.fromkeys(sizes, unit), reservation
    view = context.view
    return {
        memory: admit(view, Ask(demand.queue, _request_at(context, memory), demand.preemptible, gang))
        for memory in sizes
    }, None


def _request_at(context: PodContext, gpu_memory: int) -> dict[str, float]:
    """The pod's fairness vector with a fraction sized at GPUs of `gpu_memory` bytes (0: the
    largest it could land on, the context's own)."""
    return context.requests[gpu_memory] if gpu_memory else context.request


def admit_gang(
    picture: ClusterPicture, names: list[str], context: PodContext
) -> tuple[AdmissionDecision, GangReservation | None]:
    """Admit the members a gang still misses, all at once: the admission rule must admit them
    together, and all of them must fit the candidates' GPUs not held for others."""
    demand, gang = context.demand, context.gang
    amounts = context.request
    queued = admit(context.view, Ask(demand.queue, amounts, demand.preemptible, gang))
    if not queued.admit:
        return queued, None
    missing = gang.missing
    gpus = demand.gpus_at(context.reference_memory)
    planned = _GangPlan([""] * missing)
    by_parts = _part_asks(picture, gang, context)
    if by_parts is not None or gpus is not None:
        candidates = picture.supplies(context.key, names, gang.workload.key)
        supplies, head = _around_head(picture, context, candidates)
        if by_parts is not None:  # its parts ask levels of their own, or differ in shape
            planned = _plan_by_parts(picture, gang, supplies, *by_parts)
        elif gpus is not None:
            planned = _plan_whole(picture, gang, context.pod, supplies, gpus)
        if planned.refusal is not None:
            return _behind(planned.refusal, head), None
    level, domain = planned.level, planned.domain
    reservation = GangReservation(
        workload=gang.workload,
        queue=demand.queue,
        amounts=amounts,
        demand=gpus,
        preemptible=demand.preemptible,
        nodes=planned.nodes,
        target=gang.minimum,
        level=level,
        domain=domain,
        part_domains=planned.part_domains,
        part_nodes=planned.part_nodes,
        part_slots=planned.part_slots,
    )
    where = f" in {level} {domain}" if domain else ""
    if planned.part_domains:
        where = " with " + ", ".join(f"part {p} in {lv} {d}" for p, (lv, d) in planned.part_domains.items())
    text = gang_text(gang, f"admitted whole{where}: {missing} pods held for; {queued.reason}")
    return AdmissionDecision(True, text, GANG), reservation


def _around_head(
    picture: ClusterPicture, context: PodContext, supplies: list[NodeGpus]
) -> tuple[list[NodeGpus], str]:
    """The supplies the gang is planned on: without the nodes held back for the first gang
    before it that waits (`extender.policy.backfill`), and why ("": none held back)."""
    after_s = picture.config.hold_back_after_s
    waiting = picture.waiting_gangs() if after_s is not None else ()
    if not waiting or after_s is None:
        return supplies, ""
    demand, workload = context.demand, context.gang.workload.key
    order = (-demand.priority, pod_created(context.pod), workload)
    now = time.time()
    head = gang_ahead(waiting, workload, order, now, after_s)
    if head is None:
        return supplies, ""
    kept = held_back(head, supplies)
    if not kept:
        return supplies, ""
    waited = now - head.since
    why = f"{len(kept)} nodes held back for workload {head.workload}, ahead of it, waiting {waited:.0f} s"
    return backfill_supplies(supplies, kept), why


def _behind(refusal: AdmissionDecision, held: str) -> AdmissionDecision:
    """A gang's refusal, saying the nodes held back for an older gang when there were some."""
    return replace(refusal, reason=f"{refusal.reason} ({held})") if held else refusal


class _GangPlan(NamedTuple):
    """A gang's missing members planned: a node each ("" for a member without GPUs), the domain
    they are kept in, or per part (its domain, its members' nodes); or why not (`refusal`)."""

    nodes: list[str]
    level: str = ""
    domain: str = ""
    part_domains: Mapping[str, tuple[str, str]] = MappingProxyType({})
    part_nodes: Mapping[str, frozenset[str]] = MappingProxyType({})
    part_slots: Mapping[str, PartSlots] = MappingProxyType({})
    refusal: AdmissionDecision | None = None


def _refused(gang: GangState, why: str, code: str) -> _GangPlan:
    return _GangPlan(
        [], refusal=AdmissionDecision(False, gang_text(gang, f"starts whole or not at all: {why}"), code)
    )


def _plan_whole(
    picture: ClusterPicture,
    gang: GangState,
    pod: Mapping[str, Any],
    supplies: list[NodeGpus],
    gpus: GpuDemand,
) -> _GangPlan:
    """The missing members as one group with the pod's topology ask (`plan_in_domain`; without
    an ask, or with a preference only where none holds them, the plain binpack)."""
    missing = gang.missing
    ask = picture.topology_ask(pod, gang.workload)
    if ask.any:
        kept = _kept_domains(picture, gang, ask.required)
        preferred = picture.level_domains(ask.preferred) if ask.preferred else NO_DOMAINS

        def planned_anew() -> DomainPlan:
            required = _required_domains(picture, ask.required, kept)
            return plan_in_domain(supplies, gpus, missing, required, preferred, _DOMAIN_ROOMS)

        choice = (picture.topology_version, gpus, missing, ask, kept)
        plan = _DOMAIN_CHOICES.plan(choice, supplies, planned_anew)
        if len(plan.nodes) == missing:  # (the plan may be shared: the reservation gets a copy)
            return _GangPlan(list(plan.nodes), ask.required, plan.domain)
        if ask.required:
            milli = gpus.count * missing * gpus.milli
            never = (
                never_held_text(ask.required, milli, picture.domain_gpus(ask.required))
                if kept is None
                else ""
            )
            if never:
                return _refused(gang, never, GANG_DOMAIN_TOO_SMALL)
            why = no_domain_text(ask.required, plan, gpus, missing)
            return _refused(gang, f"{why}{_short(gang, plan.largest_fit)}", GANG_NO_DOMAIN)
    planned = plan_gang(supplies, gpus, missing, picture.config.domains)
    if len(planned) < missing:
        why = (
            f"GPUs free for {len(planned)} of its {missing} missing pods ({describe(gpus)} each)"
            f"{_short(gang, len(planned))}"
        )
        return _refused(gang, why, GANG_NO_FIT)
    return _GangPlan(planned)


class _PartShape(NamedTuple):
    """What one member of a part asks: its GPUs at the reference size, its fairness vector."""

    gpus: GpuDemand | None
    amounts: Mapping[str, float]


def _part_shapes(picture: ClusterPicture, gang: GangState, context: PodContext) -> dict[str, _PartShape]:
    """Each part's shape, read off one of its members (the asking pod's part: its own); a part
    whose pods cannot be read is left out (the filter refuses those pods with the reason)."""
    shapes = {gang.part: _PartShape(context.demand.gpus_at(context.reference_memory), context.request)}
    pods = picture.kind("Pod")
    for key in sorted(picture.members(gang.workload.key)):
        member = pods.get(key)
        if member is None or (name := part_of(member)) in shapes:
            continue
        demand = picture.demand(member)
        if not demand.problem:
            gpus = demand.gpus_at(picture.reference_memory(demand.models))
            shapes[name] = _PartShape(gpus, picture.pod_resources(key, member))
    return shapes


def _part_asks(
    picture: ClusterPicture, gang: GangState, context: PodContext
) -> tuple[list[PartAsk], dict[str, _PartShape]] | None:
    """Each part's missing members with the topology ask and the shape of its own pods (the pod
    asking: its own; another part: one of its members), when the parts do not all ask alike or
    are not all alike in shape, with each part's shape; else None."""
    if not gang.parts:
        return None
    pods = picture.kind("Pod")
    asks: dict[str, TopologyAsk] = {gang.part: picture.topology_ask(context.pod, gang.workload)}
    for key in sorted(picture.members(gang.workload.key)):
        member = pods.get(key)
        if member is not None and (name := part_of(member)) not in asks:
            asks[name] = picture.topology_ask(member, gang.workload)
    shapes = _part_shapes(picture, gang, context)
    own = shapes[gang.part].gpus
    alike_asks = len({asks.get(part.name, NO_ASK) for part in gang.parts}) == 1
    if alike_asks and all(shapes.get(part.name, shapes[gang.part]).gpus == own for part in gang.parts):
        return None
    topology = picture.config.topology
    parts: list[PartAsk] = []
    for part in gang.parts:
        ask = asks.get(part.name, NO_ASK)
        level = topology.level(ask.required) if ask.required else None
        parts.append(
            PartAsk(
                part.name,
                part.missing,
                ask.required,
                topology.levels.index(level) if level is not None else -1,
                picture.level_domains(ask.required) if ask.required else None,
                picture.level_domains(ask.preferred) if ask.preferred else NO_DOMAINS,
                shapes.setdefault(part.name, shapes[gang.part]).gpus,
            )
        )
    return parts, shapes


def _plan_by_parts(
    picture: ClusterPicture,
    gang: GangState,
    supplies: list[NodeGpus],
    parts: list[PartAsk],
    shapes: Mapping[str, _PartShape],
) -> _GangPlan:
    """The missing members part by part, each in a domain of its own level with its own shape,
    those with a level inside one domain of the widest (`plan_parts`). Parts of different shapes
    get slots of their own (`PartSlots`): each holds its members' GPUs and counts their requests."""
    stating = [part for part in parts if part.required is not None]
    outer = min(stating, key=lambda part: part.depth).level if stating else ""
    plan = plan_parts(supplies, parts, outer, picture.level_domains(outer) if outer else NO_DOMAINS)
    if plan.short and plan.level_short:
        never = never_held_parts_text(parts, outer, picture.domain_gpus)
        return (
            _refused(gang, never, GANG_DOMAIN_TOO_SMALL)
            if never
            else _refused(gang, plan.short, GANG_NO_DOMAIN)
        )
    if plan.short:
        return _refused(gang, plan.short, GANG_NO_FIT)
    part_nodes = {
        part.name: frozenset(plan.by_part[part.name])
        for part in parts
        if part.demand is not None and part.name in plan.by_part
    }
    part_slots: dict[str, PartSlots] = {}
    if len({part.demand for part in parts}) > 1:
        part_slots = {
            state.name: PartSlots(
                state.minimum, part.demand, shapes[state.name].amounts, list(plan.by_part.get(state.name, []))
            )
            for state, part in zip(gang.parts, parts, strict=True)
        }
    return _GangPlan(plan.nodes, part_domains=plan.domains, part_nodes=part_nodes, part_slots=part_slots)


def _short(gang: GangState, fitting: int) -> str:
    """The part a plan with room for `fitting` pods leaves short, said after the counts."""
    short = unplaced_part_text(gang, fitting)
    return f"; {short}" if short else ""


def _kept_domains(picture: ClusterPicture, gang: GangState, level: str) -> frozenset[str] | None:
    """The required level's domains a gang's missing members may go to: the ones its placed
    members are in (a gang readmitted after its reservation lapsed stays together); None: any."""
    if not level or not gang.placed:
        return None
    domains = picture.level_domains(level)
    return frozenset(domains[node] for node in picture.gang_nodes(gang.workload.key) if node in domains)


def _required_domains(picture: ClusterPicture, level: str, kept: frozenset[str] | None) -> DomainMap | None:
    """The required level's map, of the `kept` domains only (None: all of them); None without a
    required level."""
    if not level:
        return None
    domains = picture.level_domains(level)
    if kept is None:
        return domains
    return {node: domain for node, domain in domains.items() if domain in kept}


@dataclass(frozen=True)
class PreemptionDecision:
    result: ExtenderPreemptionResult
    dropped: dict[str, str]  # node -> why its proposed victims may not go


def decide_preemption(picture: ClusterPicture, args: ExtenderPreemptionArgs) -> PreemptionDecision:
    """The proposed nodes whose victims all may be evicted for this pod, unchanged."""
    proposals = args.victim_uids()
    if not picture.ready():
        return PreemptionDecision(ExtenderPreemptionResult(), dict.fromkeys(proposals, NOT_READY))
    pod = args.Pod
    demand = picture.demand(pod)
    if demand.problem:
        raise UnreadablePod(f"unreadable pod: {demand.problem}")
    request = picture.pod_resources(args.pod.key, pod)
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
            elif victim.workload and not fork.elastic(victim):
                why = (
                    f"pod {victim.key} is one of the {len(fork.members(victim.workload))} running pods of "
                    f"workload {victim.workload}, its minimum: evicting it would break the gang"
                )
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


def decide_priorities(
    picture: ClusterPicture, args: ExtenderArgs, passed: PassedNodes | None = None
) -> PriorityDecision:
    """The score of every candidate node (0..10), GPU-less pods included: their CPU and memory
    strand GPUs as much as a fraction does (neutral 0 only while syncing or for an unreadable pod).
    `passed`: what the last filter passed, read instead of the inventory when it is this pod's and
    these nodes' (`PassedNodes`)."""
    names = args.candidate_names()
    if not picture.ready():
        return _neutral(names, "not_ready")
    demand = picture.demand(args.Pod)
    if demand.problem:  # filter refused it with the reason; nothing to rank
        return _neutral(names, "unreadable")
    placement = demand.placement_at(picture.reference_memory(demand.models))
    # GPUs held for its workload are its own to use, as in filter (its workload only: the gang's
    # state would bring the whole queue view up to date after the filter's reservation).
    workload = picture.workload(args.Pod)
    owner = "" if workload.single else workload.key
    key = args.pod.key
    nodes = passed.of(key, owner, names, picture.nodes_version) if passed is not None else None
    if nodes is None:
        nodes = picture.candidates(key, names, owner, demand.queue)
    strategy = queue_strategy(picture, demand.queue)
    score_of = score_kinds(nodes.supply_of, placement, picture.mix(), strategy)
    ask = NO_ASK if workload.single else picture.topology_ask(args.Pod, workload)
    if ask.any:
        return _ranked_by_domains(picture, workload.key, ask, nodes, placement, score_of, strategy)
    return PriorityDecision(names, nodes.kinds, score_of, "scored", strategy)


def _ranked_by_domains(
    picture: ClusterPicture,
    workload: str,
    ask: TopologyAsk,
    nodes: CandidateKinds,
    placement: GpuDemand,
    score_of: Mapping[str, int],
    strategy: Strategy,
) -> PriorityDecision:
    """The candidates of a member of a workload with a topology ask ranked by their domains at
    its required level, then its preferred one (`fullest_first`: where most of its members are,
    else the tightest that holds the rest), each node's own score deciding inside a domain. A
    host's kind is then its kind and its domains' ranks (still few: kinds x ranks)."""
    members = picture.members(workload)
    landed = picture.gang_nodes(workload)
    reservation = picture.gang_reservation(workload)
    # (its slots once the reservation followed its members; until then the nodes it planned)
    where = landed + ((reservation.slots or list(reservation.nodes)) if reservation is not None else [])
    missing = max(len(members) - len(landed), 1)
    fitting: dict[str, int] = {}  # kind -> members it holds
    rooms_of_shape = _ROOMS.table((placement, missing))
    for kind, supply in nodes.supply_of.items():
        room = rooms_of_shape.get(supply.shape)
        if room is None:
            room = _ROOMS.put(rooms_of_shape, supply.shape, len(plan_gang([supply], placement, missing)))
        fitting[kind] = room
    # Per level, each host's domain rank; the per-host work is lookups by `map` and `zip` in C
    # (thousands of names), the rest per (domain, kind) pair.
    columns: list[list[int]] = []
    for level in filter(None, (ask.required, ask.preferred)):
        domains = picture.level_domains(level)
        of_host = list(map(domains.get, nodes.names))
        rooms: dict[str, int] = defaultdict(int)
        for (domain, kind), hosts in Counter(zip(of_host, nodes.kinds, strict=True)).items():
            if domain is not None:
                rooms[domain] += fitting[kind] * hosts
        ranked = fullest_first(rooms, Counter(filter(None, map(domains.get, where))), missing)
        rank_of: dict[str | None, int] = dict(ranked.items())
        rank_of[None] = len(ranked)  # (a host outside every domain of the level: after them all)
        columns.append(list(map(rank_of.__getitem__, of_host)))
    composite: dict[tuple[Any, ...], str] = {}  # (kind, its ranks...) -> a class of its own
    keys: dict[str, tuple[tuple[int, ...], int] | None] = {}  # class -> (ranks, own score); None: no fit
    for pair in set(zip(nodes.kinds, *columns, strict=True)):
        kind, ranks = pair[0], tuple(pair[1:])
        composite[pair] = name = f"{kind} {ranks}"
        keys[name] = (ranks, score_of[kind]) if fitting[kind] else None
    kinds = list(map(composite.__getitem__, zip(nodes.kinds, *columns, strict=True)))
    return PriorityDecision(nodes.names, kinds, domain_scores(keys), "scored", strategy)
