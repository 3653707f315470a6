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

from collections.abc import Mapping
from dataclasses import dataclass, replace
from itertools import compress, filterfalse
from operator import not_
from typing import Any, NamedTuple

from contract.names import GPU_MILLI
from extender.memo import ShapeMemo
from extender.picture.cluster import ClusterPicture
from extender.picture.demands import PodDemand
from extender.picture.gangs import GangReservation
from extender.policy.admission import GANG, GANG_READING, Ask, GangState, admit, gang_text
from extender.policy.deference import OwedPod, deference_reason, defers_to
from extender.policy.fairness import AdmissionDecision, Resources
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
from extender.policy.topology import no_domain_text, plan_in_domain
from extender.policy.waiting import unplaced
from extender.policy.workloads import plan_gang
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
# A gang whose missing members do not all fit yet (GPUs reclaim freed for it are still coming), or
# whose minimum is still being read from its owner: refusals that keep what reclaim holds for it.
GANG_NO_FIT = "gang_no_fit"
# A gang with a required topology level that no domain of it holds whole (yet).
GANG_NO_DOMAIN = "gang_no_domain"
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
class CandidateKinds:
    """The candidates of a request by kind: nodes alike to placement, judged and scored once."""

    names: list[str]  # the candidates, in the request's order
    kinds: list[str]  # each one's kind
    one_of_kind: dict[str, str]  # kind -> a node of that kind
    supply_of: dict[str, NodeGpus]  # kind -> its free GPUs, CPU and memory
    held: bool = False  # some kinds are nodes with GPUs held (what this pod may use there)

    def keeping(self, reasons: list[str], reason_of: Mapping[str, str]) -> CandidateKinds:
        """Only the candidates whose verdict is '' (`reasons`: each one's; `reason_of`: each kind's)."""
        fits = list(map(not_, reasons))
        return CandidateKinds(
            list(compress(self.names, fits)),
            list(compress(self.kinds, fits)),
            {kind: name for kind, name in self.one_of_kind.items() if not reason_of[kind]},
            {kind: supply for kind, supply in self.supply_of.items() if not reason_of[kind]},
            self.held,
        )


_NO_CANDIDATES = CandidateKinds([], [], {}, {})


def _candidate_kinds(
    picture: ClusterPicture, key: str, names: list[str], owner: str = "", queue: str = ""
) -> CandidateKinds:
    """The candidates' kinds for pod `key` (of workload `owner`, in `queue`). A node with GPUs
    held for some pod is a kind of its own: its supply is what this pod may use there
    (`supply_for`)."""
    inventory = picture.inventory
    kinds = inventory.kinds_for(names)
    held = inventory.held_among(names)
    if held:
        kind_of = dict(zip(names, kinds, strict=True))
        kind_of.update((name, f"held {name}") for name in held)
        kinds = list(map(kind_of.__getitem__, names))
    one_of_kind = dict(zip(kinds, names, strict=True))
    supplies = inventory.supplies_for(key, one_of_kind.values(), owner, queue)
    supply_of = dict(zip(one_of_kind, supplies, strict=True))
    return CandidateKinds(names, kinds, one_of_kind, supply_of, bool(held))


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
    # Its namespace may not use its queue (the webhook that refuses such pods was bypassed).
    refusal = picture.tenancy_refusal(demand.queue, demand.namespace)
    if refusal:
        refused = filter_result(args, [], {})
        refused.FailedAndUnresolvableNodes = dict.fromkeys(names, refusal)
        return FilterDecision(refused, "refused", "queue_not_allowed", demand.queue, False, refusal)
    key = args.pod.key
    gang = picture.gang(pod)
    owner = "" if gang.workload.single else gang.workload.key
    # A member of a gang reserved inside a domain is judged on that domain's nodes only.
    candidates = names
    names, outside = _in_domain(picture, picture.gangs.reservation(owner) if owner else None, names)
    reservation: GangReservation | None = None
    # Nodes of one kind (shape and GPU size) get one verdict: a large cluster has few kinds.
    version = picture.inventory.version  # what the kinds are read at
    nodes = _candidate_kinds(picture, key, names, owner, demand.queue) if demand.wants_gpu else _NO_CANDIDATES
    # A fraction is a larger share of a smaller GPU: admit it per GPU size among the candidates.
    gpu_memory = picture.gpu_memory if demand.fractional else {}  # {}: the size does not matter
    size_of = (
        {kind: gpu_memory.get(name) or 0 for kind, name in nodes.one_of_kind.items()} if gpu_memory else {}
    )
    sizes = sorted(set(size_of.values())) or [0]
    by_size, reservation = queue_admission(picture, names, key, pod, demand, gang, sizes)
    admitted = [d for d in by_size.values() if d.admit]
    decision = admitted[0] if admitted else next(iter(by_size.values()))
    if not decision.admit:
        result = filter_result(args, [], {})
        result.FailedAndUnresolvableNodes = dict.fromkeys(candidates, decision.reason)
        return FilterDecision(
            result, "refused", decision.kind or "refused", demand.queue, False, decision.reason
        )
    if not demand.wants_gpu:
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
    reference = picture.inventory.reference_memory(demand.models)
    at_size = {}
    for size, admission in by_size.items():
        placement = demand.placement_at(size or reference)
        at_size[size] = _AtSize(admission, placement, _MISFITS.table(placement))
    reason_of = {
        kind: _verdict(at_size[size_of.get(kind, 0)], supply) for kind, supply in nodes.supply_of.items()
    }
    owed = _owed_first(picture, key, pod, demand, gang)
    if owed:
        request = picture.accounting.resources(key, pod, demand)
        for kind, supply in nodes.supply_of.items():
            if not reason_of[kind]:
                reason_of[kind] = _deference(picture, demand.queue, request, owed, supply)
    if any(reason_of.values()):
        reasons = list(map(reason_of.__getitem__, nodes.kinds))
        kept = nodes.keeping(reasons, reason_of)
        failed = dict(zip(compress(names, reasons), filter(None, reasons), strict=True))
    else:  # every kind fits (the common case)
        kept, failed = nodes, {}
    passed = kept.names
    if kept.held:
        passed, failed = _to_hold(picture, key, passed, failed)
    if reservation is not None and reservation.domain:  # (admitted just now: its domain known now)
        passed, failed = _to_domain(picture, reservation, passed, failed)
    failed |= outside
    remembered_nodes = None if kept.held else PassedNodes(key, owner, version, kept)
    waits, message = ("", decision.reason) if passed else why_unplaced(picture, key, pod, demand)
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


def why_unplaced(
    picture: ClusterPicture, key: str, pod: Mapping[str, Any], demand: PodDemand
) -> tuple[str, str]:
    """Why an admitted pod no candidate fits waits: its queue's fair share in GPUs against what
    the queue holds and the pod asks (`extender.policy.waiting.unplaced`)."""
    view = picture.fairness()
    share = view.fair_shares.get(demand.queue, {}).get("gpu", 0.0)
    held = view.tree.subtree(demand.queue, "allocated", "gpu")
    asked = picture.accounting.resources(key, pod, demand).get("gpu", 0.0)
    return unplaced(demand.queue, share, held, asked)


def _owed_first(
    picture: ClusterPicture, key: str, pod: Mapping[str, Any], demand: PodDemand, gang: GangState
) -> tuple[OwedPod, ...]:
    """The owed waiting pods this pod defers to where they fit (`extender.policy.deference`):
    none for a pod GPUs are held for (they are its own) or of a gang admitted whole just now."""
    owed = picture.owed_pods()
    if not owed or not gang.admitted or picture.inventory.held_for(key) is not None:
        return ()
    request = picture.accounting.resources(key, pod, demand)
    return defers_to(picture.fairness(), demand.queue, request, demand.preemptible, owed)


def deferred_everywhere(
    picture: ClusterPicture,
    names: list[str],
    key: str,
    pod: Mapping[str, Any],
    demand: PodDemand,
    gang: GangState,
) -> str:
    """Why the filter would leave every node of `names` the admitted pod fits to owed pods
    (`_owed_first`, `_deference`): the first node's reason; '' when it may go to one of them, or
    fits none (then it is not deference that holds it back). The requeue check asks it, so that a
    pod is nudged when the filter would pass it, not while it defers."""
    owed = _owed_first(picture, key, pod, demand, gang) if demand.wants_gpu else ()
    if not owed:
        return ""
    owner = "" if gang.workload.single else gang.workload.key
    nodes = _candidate_kinds(picture, key, names, owner, demand.queue)
    reference = picture.inventory.reference_memory(demand.models)
    gpu_memory = picture.gpu_memory if demand.fractional else {}  # {}: the size does not matter
    request = picture.accounting.resources(key, pod, demand)
    deferred = ""
    for kind, supply in nodes.supply_of.items():
        if _misfit(supply, demand.placement_at(gpu_memory.get(nodes.one_of_kind[kind]) or reference)):
            continue
        why = _deference(picture, demand.queue, request, owed, supply)
        if not why:
            return ""
        deferred = deferred or why
    return deferred


def _deference(
    picture: ClusterPicture, queue: str, request: Resources, owed: tuple[OwedPod, ...], supply: NodeGpus
) -> str:
    """Why the pod (of `queue`, asking `request`) leaves a node to an owed pod that fits its free
    capacity ('' when none fits)."""
    for waiting in owed:
        if not _misfit_in(_MISFITS.table(waiting.demand), supply, waiting.demand):
            return deference_reason(picture.fairness(), queue, request, waiting)
    return ""


def _to_hold(
    picture: ClusterPicture, key: str, passed: list[str], failed: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """A pod reclaim holds GPUs for goes where they are, when it fits there: the other nodes
    that fit fail, so it takes the very GPUs freed for it rather than other free ones (which the
    planner counted on for other pods)."""
    hold = picture.inventory.held_for(key)
    if hold is None or not hold.gpus or hold.node not in passed or len(passed) == 1:
        return passed, failed
    reason = f"GPUs are held for this pod on node {hold.node}"
    return [hold.node], failed | {name: reason for name in passed if name != hold.node}


def _domain_reason(reservation: GangReservation) -> str:
    return f"gang {reservation.workload.key} is placed in {reservation.level} {reservation.domain}"


def _in_domain(
    picture: ClusterPicture, reservation: GangReservation | None, names: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The candidates inside the domain a reserved gang is kept in, and the others with why
    (split in C: thousands of names, and the per-kind work then runs on the domain's few)."""
    if reservation is None or not reservation.domain:
        return names, {}
    inside = picture.topology.nodes_in(reservation.level, reservation.domain).__contains__
    return list(filter(inside, names)), dict.fromkeys(filterfalse(inside, names), _domain_reason(reservation))


def _to_domain(
    picture: ClusterPicture, reservation: GangReservation, passed: list[str], failed: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The pod whose filter admitted its gang into a domain just now goes to that domain's nodes."""
    kept, outside = _in_domain(picture, reservation, passed)
    return kept, failed | outside


def queue_admission(
    picture: ClusterPicture,
    names: list[str],
    key: str,
    pod: Mapping[str, Any],
    demand: PodDemand,
    gang: GangState,
    sizes: list[int],
) -> tuple[dict[int, AdmissionDecision], GangReservation | None]:
    """The admission rule's decision (`extender.policy.admission.admit`) for the pod on the nodes
    `names`, per GPU size among them (`sizes`, bytes; 0: the largest it could land on): a fraction
    is a larger share of a smaller GPU. A gang not admitted yet is judged whole, once for every
    size (`admit_gang`: its queue, and the GPUs of `names`), and may leave a reservation."""
    if not gang.admitted:
        unit, reservation = admit_gang(picture, names, key, pod, demand, gang)
        return dict.fromkeys(sizes, unit), reservation
    view = picture.fairness()
    return {
        memory: admit(
            view,
            Ask(
                demand.queue, picture.accounting.resources(key, pod, demand, memory), demand.preemptible, gang
            ),
        )
        for memory in sizes
    }, None


def admit_gang(
    picture: ClusterPicture,
    names: list[str],
    key: str,
    pod: Mapping[str, Any],
    demand: PodDemand,
    gang: GangState,
) -> tuple[AdmissionDecision, GangReservation | None]:
    """Admit the members a gang still misses, all at once: the admission rule must admit them
    together, and all of them must fit the candidates' GPUs not held for others."""
    amounts = picture.accounting.resources(key, pod, demand)
    queued = admit(picture.fairness(), Ask(demand.queue, amounts, demand.preemptible, gang))
    if not queued.admit:
        return queued, None
    missing = gang.missing
    gpus = demand.gpus_at(picture.inventory.reference_memory(demand.models))
    nodes = [""] * missing
    level = domain = ""
    if gpus is not None:
        supplies = picture.inventory.supplies_for(key, names, gang.workload.key)
        ask = picture.topology_ask(pod, gang.workload)
        plan = None
        if ask.any:
            required = _required_domains(picture, gang, ask.required)
            preferred = picture.topology.domains(ask.preferred) if ask.preferred else NO_DOMAINS
            plan = plan_in_domain(supplies, gpus, missing, required, preferred)
        if plan is not None and len(plan.nodes) == missing:
            planned, level, domain = plan.nodes, ask.required, plan.domain
        elif plan is not None and ask.required:
            why = no_domain_text(ask.required, plan, gpus, missing)
            return AdmissionDecision(
                False, gang_text(gang, f"starts whole or not at all: {why}"), GANG_NO_DOMAIN
            ), None
        else:  # (a preference only, and the gang fits nowhere: said as without one)
            planned = plan_gang(supplies, gpus, missing, picture.inventory.domains)
        if len(planned) < missing:
            text = gang_text(
                gang,
                f"starts whole or not at all: GPUs free for {len(planned)} of its {missing} missing pods "
                f"({describe(gpus)} each)",
            )
            return AdmissionDecision(False, text, GANG_NO_FIT), None
        nodes = planned
    reservation = GangReservation(
        workload=gang.workload,
        queue=demand.queue,
        amounts=amounts,
        demand=gpus,
        preemptible=demand.preemptible,
        nodes=nodes,
        target=gang.minimum,
        level=level,
        domain=domain,
    )
    where = f" in {level} {domain}" if domain else ""
    text = gang_text(gang, f"admitted whole{where}: {missing} pods held for; {queued.reason}")
    return AdmissionDecision(True, text, GANG), reservation


def _required_domains(picture: ClusterPicture, gang: GangState, level: str) -> DomainMap | None:
    """The required level's domains a gang's missing members may go to: all of them, or the one
    its placed members are in (a gang readmitted after its reservation lapsed stays together);
    None without a required level."""
    if not level:
        return None
    domains = picture.topology.domains(level)
    if not gang.placed:
        return domains
    landed, _ = picture.gangs.placed(picture.workloads.members.get(gang.workload.key, ()))
    kept = {domains[node] for node in landed if node in domains}
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
    key = args.pod.key
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
    placement = demand.placement_at(picture.inventory.reference_memory(demand.models))
    # GPUs held for its workload are its own to use, as in filter (its workload only: the gang's
    # state would bring the whole queue view up to date after the filter's reservation).
    workload = picture.workloads.workload(args.Pod)
    owner = "" if workload.single else workload.key
    key = args.pod.key
    nodes = passed.of(key, owner, names, picture.inventory.version) if passed is not None else None
    if nodes is None:
        nodes = _candidate_kinds(picture, key, names, owner, demand.queue)
    strategy = queue_strategy(picture, demand.queue)
    score_of = score_kinds(nodes.supply_of, placement, picture.mix(), strategy)
    return PriorityDecision(names, nodes.kinds, score_of, "scored", strategy)
