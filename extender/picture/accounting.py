"""Queue accounting: what each queue holds and waits for, and the fairness view built on it.

Each pod contributes its fairness vector (GPUs - by model too -, cpu cores, memory bytes) to its
queue, as `allocated` once it runs or is bound (or assumed bound, or reserved by a filter whose
bind has not come yet) and as `requested` while it waits for one of Tessera's schedulers -
unless its namespace may not use its queue (`extender.policy.tenancy`): the filter refuses such a
pod, so it is no demand of that queue (no fair share, no reclaim for it). A pod of another
scheduler (`PodDemand.outside`) waits in no queue, but what it holds is charged to its
namespace's default queue like any pod's - from the moment its claims are allocated, which that
scheduler does before it binds - so quotas and fair shares see every GPU taken. Contributions are
kept in a ledger and only pods that changed - or whose claims, nodes or devices did, or whose
Namespace's labels or queue's tenancy did - are recounted; the fair shares are recomputed only
when something moved.

Contributions are shared: pods with the same queue, bucket, amounts, GPU shape and preemptibility
(most pods of a large cluster repeat a few) hold one `Contribution` object, not one each. What a
pod that is not preemptible holds is also its queue's non-preemptible use, which the quota for
non-preemptible pods is checked against (`FairnessSnapshot.admit`).

Reservations: the scheduler runs the next pod's filter while the previous one is still binding,
so an admission in flight counts against its queue until the bind or `ttl_s`, or a burst could
pass a limit. A gang admitted as a unit (`reserve_gang`) counts its members still to place as
allocated slots, and its pending members count nothing of their own meanwhile (the slots stand for
them); the slots follow the members as they are placed (`extender.picture.gangs`, which the
accounting brings in line with the pods it recounts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any

from contract.kube import mapping, meta
from contract.names import DEFAULT_QUEUE, GPU_MILLI
from extender.picture.demands import PodDemand, PodDemands, claim_names, is_terminal
from extender.picture.gangs import GangReservation, GangReservations, holds_for_itself
from extender.picture.inventory import GpuInventory
from extender.picture.ledger import Bucket, Contribution, QueueLedger
from extender.picture.store import ObjectStore, Stored
from extender.picture.workloads import WorkloadMap
from extender.policy.admission import GangState, fairness_vector
from extender.policy.fairness import (
    FairnessSnapshot,
    FairShareInputs,
    FairShares,
    QueueSpec,
    QueueTree,
    WeightAdjustment,
)
from extender.policy.placement import WorkloadMix
from extender.policy.tenancy import selector_labels, tenancy_refusal
from extender.queues import QueueSpecError, parse_queue

log = logging.getLogger(__name__)


def _tenancy_inputs(queue: Stored | None) -> tuple[object, ...] | None:
    """What of a Queue decides which namespaces' pods may use it: its parent (for its ancestors'
    restrictions), namespaces, namespaceSelector."""
    if queue is None:
        return None
    spec = mapping(queue.get("spec"))
    return spec.get("parent"), spec.get("namespaces"), spec.get("namespaceSelector")


def _restricts(inputs: tuple[object, ...] | None) -> bool:
    """A Queue with either field says who may use it (`namespaces: []` too: nobody)."""
    return inputs is not None and (inputs[1] is not None or inputs[2] is not None)


# Distinct contributions shared between pods; past this many the table starts over (a cluster
# whose pods are all different shares little anyway).
_SHARED_LIMIT = 4096


@dataclass(frozen=True, kw_only=True)
class QueueView(FairnessSnapshot):
    """The fairness snapshot, plus what status and metrics report beside it."""

    invalid: Mapping[str, str]  # Queue objects that failed to parse -> why
    pending_pods: Mapping[str, int]  # queue -> pending pods
    mix: WorkloadMix  # placement demands of the pods seen, weighted by count (placement's target workload)


@dataclass(frozen=True, eq=False)
class _Specs:
    """The Queue objects, parsed: what every view until one of them changes is built on."""

    specs: tuple[QueueSpec, ...]
    version: int  # counts the parses: the specs' name in `FairShareInputs.version`
    names: frozenset[str]
    invalid: Mapping[str, str]  # Queue objects that failed to parse -> why
    by_name: Mapping[str, QueueSpec]
    restricted: bool  # some queue says which namespaces may use it (else tenancy refuses nothing)


@dataclass(frozen=True)
class PodAccount:
    """What the accounting answers about the pod a filter judges, asked at once (`account`)."""

    refusal: str  # why its namespace may not use its queue ('' when it may)
    view: QueueView
    gang: GangState  # its workload, as the recount `view` does first left the reservations
    reservation: GangReservation | None  # its gang's, when admitted whole (`PodContext.reservation`)
    reference_memory: int  # bytes of the largest GPU it could land on
    request: dict[str, float]  # its fairness vector, a fraction sized at `reference_memory`
    # A fraction's vector sized at each GPU size of the cluster (`GpuInventory.gpu_sizes`; {} for
    # a pod of whole GPUs): the filter admits it per GPU size among its candidates.
    requests: Mapping[int, dict[str, float]]


class QueueAccounting:
    def __init__(
        self,
        store: ObjectStore,
        demands: PodDemands,
        inventory: GpuInventory,
        workloads: WorkloadMap,
    ) -> None:
        self.store = store
        self.demands = demands
        self.inventory = inventory
        self.workloads = workloads
        self.ledger = QueueLedger()
        # Pods filter admitted whose bind has not come yet: pod key -> expiry (monotonic), and
        # the wire pod, for a pod the watch has not delivered yet.
        self.reserved: dict[str, float] = {}
        # (expiry, pod key) of every reservation made, soonest first: expiries are found without
        # a pass over the reservations (an entry whose reservation has gone or been renewed since
        # is dropped when its time comes).
        self._expiries: list[tuple[float, str]] = []
        self.reserved_pods: dict[str, Mapping[str, Any]] = {}
        self._dirty: set[str] = set()
        self.gangs = GangReservations(store, demands, inventory, workloads, self.ledger, self.reserved)
        self._all_dirty = True
        self._view: QueueView | None = None
        self._shared: dict[tuple[object, ...], Contribution] = {}
        # Parsed Queue objects (until one changes), and the fair shares and queue tree of the
        # last view: a view whose fair-share inputs are of the same version (the same queues,
        # capacity and weight adjustment) updates them with the queues whose totals moved (none:
        # reused as they are).
        self._specs: _Specs | None = None
        self._parses = 0
        self._restricted = False  # some queue restricted who may use it, when last parsed
        self._shares: tuple[FairShares, QueueTree] | None = None
        # A term on the queues' over-quota weights that varies with time (`adjust_weights`).
        self._weight_adjustment: WeightAdjustment | None = None
        # Told which pods were recounted (None: all), so caches derived from pods follow.
        self.recounted: list[Callable[[Iterable[str] | None], None]] = []
        store.subscribe("Pod", self._pod_changed, self._pods_relisted)
        store.subscribe("Queue", self._queues_changed)
        store.subscribe("Namespace", self._namespace_changed)
        store.subscribe("Node", self._stale)
        store.subscribe("ResourceSlice", self._stale)
        demands.listeners.append(self._pods_moved)
        inventory.listeners.append(self._pods_moved)

    # ---- changes -----------------------------------------------------------------------------

    def _stale(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self._view = None  # capacity or the queues changed

    def _queues_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self._specs = None
        self._view = None
        before, after = _tenancy_inputs(old), _tenancy_inputs(new)
        if before != after and (self._restricted or _restricts(before) or _restricts(after)):
            # Who may wait in which queue changed (a spec edit, rare); while every queue is open
            # a new queue or parent changes nothing of it.
            self._all_dirty = True

    def _namespace_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        """Its labels decide which queues its pods may wait in (queues' namespaceSelector)."""
        if not self._restricted:
            return  # every queue open: labels decide nothing (a restricted queue recounts all)
        if old is not None and new is not None and meta(old).get("labels") == meta(new).get("labels"):
            return
        prefix = f"{key}/"
        self._dirty.update(pod for pod in self.store.kind("Pod") if pod.startswith(prefix))

    def _pods_moved(self, keys: Iterable[str] | None) -> None:
        if keys is None:
            self._all_dirty = True
        else:
            self._dirty.update(keys)

    def _pod_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self._dirty.add(key)
        if new is None or mapping(new.get("spec")).get("nodeName"):
            self._drop_reservation(key)

    def _pods_relisted(self, keys: set[str]) -> None:
        for key in [k for k in self.reserved if k not in keys]:
            self._drop_reservation(key)
        self._all_dirty = True

    def reserve(self, key: str, pod: Mapping[str, Any], ttl_s: float) -> None:
        """Count a pending pod as allocated to its queue until it is bound or `ttl_s` passes."""
        expiry = self.reserved[key] = time.monotonic() + ttl_s
        heappush(self._expiries, (expiry, key))
        self.reserved_pods[key] = pod
        self._dirty.add(key)

    def release(self, key: str) -> None:
        """Undo `reserve` (the pod is being filtered again, so its old admission is void)."""
        if key in self.reserved:
            self._drop_reservation(key)
            self._dirty.add(key)

    def assumed(self, key: str) -> None:
        """The binder bound the pod: it counts as allocated now, by its node, not a reservation."""
        self._drop_reservation(key)
        self._dirty.add(key)

    def adjust_weights(self, adjustment: WeightAdjustment | None) -> None:
        """Divide fair shares under `adjustment` (None: the queues' weights as they are) from the
        next view on. The kept shares are divided again only if its version differs from the one
        they were divided under: a rule gives the adjustment a new version when its factors move."""
        self._weight_adjustment = adjustment
        self._view = None

    def _drop_reservation(self, key: str) -> None:
        self.reserved.pop(key, None)
        self.reserved_pods.pop(key, None)

    def reserve_gang(self, reservation: GangReservation) -> None:
        """A workload's minimum admitted as a unit: hold its slots until its members are placed."""
        self._dirty.update(self.gangs.reserve(reservation))

    # ---- questions ---------------------------------------------------------------------------

    def _holds_before_bind(self, pod: Mapping[str, Any], demand: PodDemand) -> bool:
        """A pod outside Tessera whose claims hold devices before its bind shows: the other
        scheduler allocates them first, then binds (a Tessera pod is reserved by its filter)."""
        return demand.outside and bool(self.inventory.held_devices(demand.namespace, claim_names(pod)))

    def is_pending(self, key: str, pod: Mapping[str, Any]) -> bool:
        """Waits for scheduling by one of Tessera's schedulers (a pod outside waits in no queue)."""
        if self.inventory.pod_node(key, pod) or is_terminal(pod):
            return False
        return not self.demands.is_outside(pod)

    def resources(
        self, key: str, pod: Mapping[str, Any], demand: PodDemand, gpu_memory: int = 0
    ) -> dict[str, float]:
        """The fairness vector of a pod: gpu (and gpu/<model>), cpu cores, memory bytes.

        A pod whose claims are allocated counts the devices it really holds; otherwise what it asks,
        a fraction sized against GPUs of `gpu_memory` bytes (0: the largest it could land on).
        """
        held = self.inventory.held_devices(demand.namespace, claim_names(pod))
        gpus: list[tuple[str, float]] = [(device.model, milli / GPU_MILLI) for _, device, milli in held]
        if not held and demand.wants_gpu:
            amount = demand.gpu_amount_at(gpu_memory or self.inventory.reference_memory(demand.models))
            if len(demand.models) == 1:
                model = next(iter(demand.models))
            elif demand.classic_gpus:
                model = self.inventory.classic_model(self.inventory.pod_node(key, pod))
            else:  # bound: its node's model (its claims' allocation may not have arrived yet)
                model = self.inventory.node_model(self.inventory.pod_node(key, pod))
            gpus.append((model, amount))
        return fairness_vector(demand.cpu, demand.memory, gpus)

    def account(self, key: str, pod: Mapping[str, Any], demand: PodDemand) -> PodAccount:
        """What the filter reads of the accounting about pod `key` (`demand`: its readable demand)."""
        view = self.view()  # recounts first, which brings the gang reservations in line
        gang = self.gangs.state(pod)
        sizes = self.inventory.gpu_sizes() if demand.fractional else ()
        return PodAccount(
            self.tenancy_refusal(demand.queue, demand.namespace),
            view,
            gang,
            None if holds_for_itself(gang) else self.gangs.reservation(gang.workload.key),
            self.inventory.reference_memory(demand.models),
            self.resources(key, pod, demand),
            {size: self.resources(key, pod, demand, size) for size in sizes},
        )

    def view(self) -> QueueView:
        """Queue specs, usage, capacity and fair shares, brought up to date with the picture.

        Only pods that changed (or whose claims, devices or nodes did) are recounted; fair shares
        are re-divided only where a queue's demand changed (`FairShares.update`).
        """
        self._recount()
        if self._view is None:
            self._view = self._compute_view()
        return self._view

    def mix(self) -> WorkloadMix:
        """The workload mix (`QueueView.mix`) without the rest of the view: a score needs only it."""
        self._recount()
        return self.ledger.mix()

    def settle(self) -> None:
        """Recount the pods that changed now, as the next `view` or `mix` would do first."""
        self._recount()

    def _recount(self) -> None:
        """Recount the pods that changed into the ledger (and drop the view when any did)."""
        expiries = self._expiries
        if expiries:
            now = time.monotonic()
            while expiries and expiries[0][0] < now:
                expiry, key = heappop(expiries)
                if self.reserved.get(key) == expiry:
                    self._drop_reservation(key)
                    self._dirty.add(key)
        everything = self._all_dirty
        if everything:
            self.ledger.clear()
            self._dirty = set(self.store.kind("Pod")) | set(self.reserved)
            self._all_dirty = False
            for listener in self.recounted:
                listener(None)
        # Gang reservations follow the pods that changed (their slots are ledger entries too);
        # the pending members of those that ended count as waiting again.
        self._dirty.update(self.gangs.follow(self._dirty, everything))
        if self._dirty:
            for key in self._dirty:
                try:
                    contribution = self._contribution(key)
                except Exception:  # a bulkhead: one pod's odd data must not stop the accounting
                    log.exception("pod %s is not counted", key)
                    contribution = None
                self.ledger.put(key, contribution)
            for listener in self.recounted:
                listener(self._dirty)
            self._dirty.clear()
            self._view = None

    def _contribution(self, key: str) -> Contribution | None:
        pod = self.store.get("Pod", key) or self.reserved_pods.get(key)
        if pod is None or is_terminal(pod):
            return None
        demand = self.demands.of(pod)
        if demand.problem:  # an unreadable pod counts nothing and costs only itself
            log.warning("pod %s is not counted: %s", key, demand.problem)
            return None
        amounts = self.resources(key, pod, demand)
        bucket: Bucket = "none"
        if self.inventory.pod_node(key, pod) or key in self.reserved or self._holds_before_bind(pod, demand):
            bucket = "allocated"
        elif (
            self.is_pending(key, pod)
            and not self.gangs.reserved(self.workloads.workload_key(key))
            and not self.tenancy_refusal(demand.queue, demand.namespace)
        ):
            # (A member of a gang being placed is counted by its slots; a pod whose namespace may
            # not use its queue is refused by the filter, so it is no demand of that queue's.)
            bucket = "requested"
        # Every pod's placement demand (GPUs, CPU, memory) joins the workload mix, GPU-less ones too.
        placement = demand.placement_at(self.inventory.reference_memory(demand.models))
        identity = (demand.queue, bucket, placement, demand.preemptible, *amounts.items())
        shared = self._shared.get(identity)
        if shared is None:
            if len(self._shared) >= _SHARED_LIMIT:
                self._shared.clear()
            shared = self._shared[identity] = Contribution(
                demand.queue, bucket, amounts, placement, demand.preemptible
            )
        return shared

    def _parsed(self) -> _Specs:
        """The Queue objects parsed (again only after one of them changed)."""
        if self._specs is None:
            by_key: dict[str, QueueSpec] = {}
            invalid: dict[str, str] = {}
            for key, obj in self.store.kind("Queue").items():
                try:
                    by_key[key] = parse_queue(obj)
                except QueueSpecError as exc:
                    invalid[key] = str(exc)
            # Pods without a queue label go to the default queue, which need not be declared.
            by_key.setdefault(DEFAULT_QUEUE, QueueSpec(name=DEFAULT_QUEUE))
            restricted = any(not spec.tenancy.open for spec in by_key.values())
            self._parses += 1
            self._specs = _Specs(
                tuple(by_key.values()), self._parses, frozenset(by_key), invalid, by_key, restricted
            )
            self._restricted = restricted
        return self._specs

    def tenancy_refusal(self, queue: str, namespace: str, labels: Mapping[str, Any] | None = None) -> str:
        """Why pods of `namespace` may not use `queue` ('' when they may; extender.policy.tenancy).
        `labels`: the Namespace's, when the caller has them; else the stored Namespace's."""
        specs = self._parsed()
        if not specs.restricted:
            return ""  # every queue open (a cluster of one team): nothing to look up per pod
        if labels is None:
            stored = self.store.get("Namespace", namespace)
            labels = mapping(meta(stored).get("labels")) if stored is not None else None
        return tenancy_refusal(specs.by_name, queue, namespace, selector_labels(namespace, labels))

    def _compute_view(self) -> QueueView:
        """O(queues whose totals moved, and the paths their change reaches) while the queues and
        the capacity stay as they were; O(queues) when they change."""
        specs = self._parsed()
        usage = self.ledger.usage(specs.names)
        moved = self.ledger.take_touched()
        capacity = self.inventory.capacity()
        # Fair shares depend on their inputs' version (the queues, the capacity, the weight
        # adjustment) and each queue's demand (what it holds plus what it waits for), not on how
        # the demand splits. For the same version, the kept shares are given the queues whose
        # totals moved and re-divide what a change of their demand reaches (a new pending pod:
        # its queue's path; a reservation or a bind, which moves a pod from waiting to holding:
        # nothing). The tree keeps the subtree sums of the queues none of the moved ones is under.
        inputs = FairShareInputs(
            specs.specs, usage, capacity, self._weight_adjustment, queues_version=specs.version
        )
        if self._shares is not None and self._shares[0].version == inputs.version:
            shares, tree = self._shares
            if moved:
                shares.update(usage, moved)
                tree = tree.with_usage(usage, moved)
        else:
            shares = FairShares(inputs)
            tree = shares.tree
        self._shares = shares, tree
        return QueueView(
            specs=specs.specs,
            usage=usage,
            capacity=capacity,
            fair_shares=shares.shares,
            known_tree=tree,
            invalid=specs.invalid,
            pending_pods=self.ledger.pending_pods(),
            mix=self.ledger.mix(),
        )
