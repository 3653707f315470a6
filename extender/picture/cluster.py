"""The cluster picture: one object composed of parts with one job each.

```
ObjectStore ──(kind, key, old, new)──▶ PodDemands    per-pod parse cache (spec, claims, classes)
     │                         └─────▶ GpuInventory   devices, holders, free GPUs per node, pod nodes
     │                         └─────▶ WorkloadMap    workloads, gang members, owners' minimums
     └────────────────────────────────▶ QueueAccounting ledger, reservations, fairness view
                                          ├─ GangReservations  gangs admitted whole: slots, placed counts
                                          └─(pods recounted)─▶ RunningPods  the planners' running pods
```

Each part subscribes to the kinds it derives from; a change it cannot see directly (a device of a
claim a pod holds) reaches the accounting as "these pods moved". The verbs read the picture
through the few questions below; planners read a `snapshot()`, which they may fork.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.kube import mapping, meta, sequence
from contract.names import DRIVER_NAME, QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from extender.picture.accounting import PodAccount, QueueAccounting, QueueView
from extender.picture.demands import PodDemand, PodDemands, pod_created
from extender.picture.gangs import GangReservation, GangReservations, holds_for_itself, split_by_reservation
from extender.picture.inventory import CandidateKinds, GpuInventory, Hold
from extender.picture.ledger import Contribution
from extender.picture.running import RunningPods
from extender.picture.store import ObjectStore, Stored
from extender.picture.topology import TopologyDomains
from extender.picture.workloads import OwnerRef, WorkloadMap
from extender.policy.admission import Ask, GangState, Waiting, admit, waiting_list
from extender.policy.backfill import DEFAULT_HOLD_BACK_AFTER_S, WaitingGang
from extender.policy.deference import COLLECT_FOR_OWED, OwedPod, collecting_nodes, is_owed, owed_pods
from extender.policy.fairness import WeightAdjustment
from extender.policy.placement import DomainMap, GpuDemand, NodeGpus, WorkloadMix
from extender.policy.reclaim import PendingPod
from extender.policy.snapshot import ClusterSnapshot, HeldGpus
from extender.policy.topology import DEFAULT_TOPOLOGY, Topology, TopologyAsk, domain_sizes
from extender.policy.workloads import Workload

# The reason of kube-scheduler's PodScheduled=False condition after a cycle in which no node fit
# (its own filters, or the extender's refused every node); not after an error ("SchedulerError":
# an extender that timed out, say) nor for a gated pod it does not try ("SchedulingGated").
UNSCHEDULABLE_REASON = "Unschedulable"

# kind -> collection path: what the picture is made of and where the watcher reads it.
WATCHED_PATHS: dict[str, str] = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
    "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "Queue": f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}",
    # Their default-queue label, for pods the admission webhook did not label.
    "Namespace": "/api/v1/namespaces",
    "Job": "/apis/batch/v1/jobs",  # an indexed Job's parallelism is its workload's minimum
}


@dataclass(frozen=True)
class PictureConfig:
    gpu_drivers: frozenset[str] = frozenset({DRIVER_NAME})
    # Pending pods count as queue demand only when addressed to one of these schedulers (empty: any).
    scheduler_names: frozenset[str] = frozenset()
    # Pods at or above this priority are not preemptible unless their label says otherwise.
    non_preemptible_priority: int = 100
    # Node -> its topology domain, for the gang planners (`extender.policy.placement.DomainMap`);
    # empty: no placement rule reads domains yet.
    domains: DomainMap = field(default_factory=dict, hash=False)
    # The topology levels gangs may ask for (`extender.policy.topology`; `--topology-levels`).
    topology: Topology = DEFAULT_TOPOLOGY
    # A gang after the first waiting gang is planned off the nodes held back for it once that
    # one has waited this long (`extender.policy.backfill`; None: never).
    hold_back_after_s: float | None = DEFAULT_HOLD_BACK_AFTER_S
    # Deference collects one node for each owed pod of several GPUs that fits nowhere
    # (`extender.policy.deference.collecting_nodes`; `--collect-for-owed`).
    collect_for_owed: bool = COLLECT_FOR_OWED


def hold_owner(gang: GangState) -> str:
    """The workload whose GPU holds the pod of `gang` sees as its own ('' for none): its gang's,
    unless it is alone or an elastic member above its part's minimum (the holds are for the
    minimum)."""
    return "" if holds_for_itself(gang) else gang.workload.key


@dataclass(frozen=True)
class PodContext:
    """What the filter reads of the picture about the pod it judges, asked at once
    (`ClusterPicture.pod_context`) rather than part by part at each step."""

    key: str
    pod: Mapping[str, Any]
    demand: PodDemand
    gang: GangState  # its workload (a pod alone is a gang of one), brought in line
    reservation: GangReservation | None  # its gang's, when the gang was admitted whole
    reference_memory: int  # bytes of the largest GPU it could land on (sizes its fractions)
    request: dict[str, float]  # its fairness vector, a fraction sized at `reference_memory`
    hold: Hold | None  # the GPUs reclaim holds for it
    view: QueueView  # the queues' fairness it is judged against
    # A fraction's vector sized at each GPU size of the cluster ({} for whole GPUs).
    requests: Mapping[int, dict[str, float]] = field(default_factory=dict)

    @property
    def owner(self) -> str:
        """The workload whose GPU holds the pod sees as its own (`hold_owner`)."""
        return hold_owner(self.gang)

    @property
    def may_defer(self) -> bool:
        """Whether the pod leaves free GPUs to owed waiting pods (`extender.policy.deference`):
        not when GPUs are held for it (they are its own), nor of a gang still to admit whole."""
        return self.gang.admitted and self.hold is None


@dataclass(frozen=True)
class FilterInputs:
    """What one filter call reads of the picture (`ClusterPicture.filter_inputs`), each part
    entered once for it (tests/unit/extender/test_filter_inputs.py counts the entries)."""

    context: PodContext
    refusal: str  # why its namespace may not use its queue ('' when it may)
    names: list[str]  # the candidates it may use: of a gang reserved in a domain, the domain's
    outside: dict[str, str]  # the other candidates, with why
    version: int  # the inventory's version `nodes` were read at (`ClusterPicture.nodes_version`)
    nodes: CandidateKinds  # `names` by kind (none for a pod without GPUs, or refused)
    gpu_memory: Mapping[str, int]  # node -> the memory of its GPUs
    owed: tuple[OwedPod, ...]  # the owed waiting pods (`owed_pods`; none unless `may_defer`)


class ClusterPicture:
    def __init__(self, config: PictureConfig | None = None) -> None:
        self.config = config or PictureConfig()
        # The parts are private: callers ask the questions below, so that what a part keeps and
        # how it is kept exact can change without them (the tests' helpers: tests/unit/extender/
        # pictures.py).
        self._store = ObjectStore(WATCHED_PATHS)
        self._demands = PodDemands(
            self._store,
            self.config.gpu_drivers,
            self.config.non_preemptible_priority,
            self.config.scheduler_names,
        )
        self._inventory = GpuInventory(
            self._store, self._demands, self.config.gpu_drivers, self.config.domains
        )
        self._workloads = WorkloadMap(self._store)
        self._topology = TopologyDomains(self._store, self.config.topology)
        self._accounting = QueueAccounting(self._store, self._demands, self._inventory, self._workloads)
        self._gangs: GangReservations = self._accounting.gangs  # (the accounting keeps them in line)
        # Called after every change (the status writer uses it to notice newly eligible pods).
        self.listeners: list[Callable[[], None]] = []
        # The running pods as the planners see them, kept from one snapshot to the next.
        self._running = RunningPods(
            self._store, self._demands, self._inventory, self._accounting, self._workloads
        )
        # Pending pods kube-scheduler tried and could not place (`scheduler_gave_up`): the
        # planners plan only while one of them waits (`unplaced_waiting`).
        self._unplaced: set[str] = set()
        # Called when kube-scheduler gives up on a pod it had not given up on before (the reclaim
        # loop plans at once instead of at its next interval).
        self.unplaced_listeners: list[Callable[[], None]] = []
        self._unplaced_changes = 0  # counts changes to `_unplaced` (what `owed_pods` is kept by)
        # `owed_pods`' answer, and the view, inventory version and unplaced changes it was read at.
        self._owed_kept: tuple[QueueView, int, int, tuple[OwedPod, ...]] | None = None
        # `waiting_gangs`' answer, and the view, inventory, unplaced and topology versions it was read at.
        self._gangs_kept: tuple[QueueView, int, int, int, tuple[WaitingGang, ...]] | None = None
        # `domain_gpus`' last answer, and the level, topology and inventory versions it was read at.
        self._sizes_kept: tuple[tuple[str, int, int], dict[str, int]] | None = None
        self._store.subscribe("Pod", self._pod_tried)

    # ---- updates -----------------------------------------------------------------------------

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED). Older versions never overwrite newer."""
        if self._store.apply(kind, event_type, obj):
            self._changed()

    def replace(self, kind: str, items: Iterable[Stored], projected: bool = False) -> None:
        """A fresh list of a kind (first sync or relist after 410): what is gone is dropped."""
        self._store.replace(kind, items, projected)
        if self.ready():
            # Count every pod and every node's free GPUs (and their shapes) now, while
            # (re)listing, rather than in the first request after it.
            self.fairness()
            for node in self._store.kind("Node"):
                _ = self.node_gpus(node).shape
        self._changed()

    def assume_bound(self, namespace: str, name: str, node: str) -> None:
        """The binder's optimistic update: count the pod on `node` before the watch says so."""
        key = f"{namespace}/{name}"
        self._inventory.assume(key, node)
        self._accounting.assumed(key)
        self._changed()

    def reserve(self, key: str, pod: Mapping[str, Any], ttl_s: float) -> None:
        self._accounting.reserve(key, pod, ttl_s)

    def release(self, key: str) -> None:
        self._accounting.release(key)

    def reserve_gang(self, reservation: GangReservation) -> None:
        self._accounting.reserve_gang(reservation)

    def hold(
        self,
        key: str,
        node: str,
        demand: GpuDemand,
        ttl_s: float,
        owner: str = "",
        gpus: tuple[tuple[int, int], ...] = (),
        queue: str = "",
    ) -> None:
        """Keep GPUs on `node` for pod `key` (or any pod of `queue`) for `ttl_s` (`Hold`)."""
        self._inventory.hold(key, node, demand, ttl_s, owner, gpus, queue)

    def release_hold(self, key: str) -> None:
        self._inventory.release_hold(key)

    def holds(self) -> Mapping[str, Mapping[str, Hold]]:
        """Node -> pod key -> the GPUs held there for it (expired ones until they are let go)."""
        return self._inventory.holds

    def held_for(self, key: str) -> Hold | None:
        """The GPUs held for pod `key` (None: none)."""
        return self._inventory.held_for(key)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    def _pod_tried(self, key: str, old: Stored | None, new: Stored | None) -> None:
        before = len(self._unplaced)
        if new is not None and scheduler_gave_up(new):
            self._unplaced.add(key)
        else:
            self._unplaced.discard(key)
        self._unplaced_changes += len(self._unplaced) != before
        if len(self._unplaced) > before:
            for listener in self.unplaced_listeners:
                listener()

    # ---- questions ---------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._store.ready()

    def kind(self, kind: str) -> dict[str, Stored]:
        return self._store.kind(kind)

    def get(self, kind: str, key: str) -> Stored | None:
        return self._store.get(kind, key)

    def unsynced(self) -> list[str]:
        """The watched kinds not listed yet (`ready` once there are none)."""
        return sorted(set(WATCHED_PATHS) - self._store.synced)

    @property
    def nodes_version(self) -> int:
        """Moves whenever a node's supply or kind may have changed, or a hold was made or let go:
        what was read of the nodes at one version is still true while it has not moved."""
        return self._inventory.version

    def candidates(self, key: str, names: list[str], owner: str = "", queue: str = "") -> CandidateKinds:
        """The request's nodes by kind for pod `key` (of workload `owner`, in `queue`): see
        `GpuInventory.candidates`."""
        return self._inventory.candidates(key, names, owner, queue)

    def supplies(self, key: str, names: Iterable[str], owner: str = "", queue: str = "") -> list[NodeGpus]:
        """What pod `key` (of workload `owner`, in `queue`) may use of each node of `names`: its
        free GPUs, those held for others taken off."""
        return self._inventory.supplies_for(key, names, owner, queue)

    def node_gpus(self, name: str) -> NodeGpus:
        return self._inventory.node_gpus(name)

    @property
    def gpu_memory(self) -> Mapping[str, int]:
        """Memory of each GPU node's GPUs, which sizes fractional demands there."""
        return self._inventory.gpu_memory

    def demand(self, pod: Mapping[str, Any]) -> PodDemand:
        return self._demands.of(pod)

    def pod_demand(self, pod: Mapping[str, Any]) -> GpuDemand | None:
        """GPUs a pod asks for (None: none); fractions relative to the largest GPU they could land on.

        Raises ValueError for a pod that cannot be read (it costs only its own request)."""
        demand = self._demands.of(pod)
        if demand.problem:
            raise ValueError(demand.problem)
        return demand.gpus_at(self._inventory.reference_memory(demand.models))

    def pod_resources(self, key: str, pod: Mapping[str, Any], gpu_memory: int = 0) -> dict[str, float]:
        """The fairness vector of a pod (see QueueAccounting.resources)."""
        demand = self._demands.of(pod)
        if demand.problem:
            raise ValueError(demand.problem)
        return self._accounting.resources(key, pod, demand, gpu_memory)

    def pod_node(self, key: str, pod: Mapping[str, Any]) -> str:
        return self._inventory.pod_node(key, pod)

    def reference_memory(self, models: frozenset[str]) -> int:
        """Memory of the largest GPU of `models` (any, when empty): what a fraction is sized at
        where the node is not known."""
        return self._inventory.reference_memory(models)

    def pod_context(self, key: str, pod: Mapping[str, Any], demand: PodDemand) -> PodContext:
        """What the filter reads about pod `key`: `demand` (its readable `demand(pod)`), its gang
        and the gang's reservation, the GPU size its fractions are read at, its fairness vector
        there (and at every GPU size), the GPUs held for it and the view it is judged against."""
        return self._context(key, pod, demand, self._accounting.account(key, pod, demand), self.held_for(key))

    def _context(
        self, key: str, pod: Mapping[str, Any], demand: PodDemand, account: PodAccount, hold: Hold | None
    ) -> PodContext:
        return PodContext(
            key,
            pod,
            demand,
            account.gang,
            account.reservation,
            account.reference_memory,
            account.request,
            hold,
            account.view,
            account.requests,
        )

    def filter_inputs(
        self, key: str, pod: Mapping[str, Any], demand: PodDemand, names: list[str]
    ) -> FilterInputs:
        """All the filter reads about pod `key` (`demand`: its readable `demand(pod)`) on the
        candidates `names`, each part asked once: the accounting (its context and tenancy), the
        topology (a reserved gang's domain), the inventory (the candidates by kind, its holds).

        A gang's admission plans it whole on top (its members, their topology asks, the
        candidates' supplies), and a recount of the owed pods reads them one by one; both are
        rare beside the filter calls of pods alone and admitted gangs' members."""
        account = self._accounting.account(key, pod, demand)
        gang = account.gang
        inside, outside = names, dict[str, str]()
        if account.reservation is not None and not account.refusal:
            inside, outside = split_by_reservation(
                account.reservation,
                names,
                gang.part,
                lambda level, domain: self._topology.nodes_in(level, domain),
            )
        wants_nodes = demand.wants_gpu and not account.refusal
        nodes = self._inventory.pod_nodes(key, inside, hold_owner(gang), demand.queue, wants_nodes)
        context = self._context(key, pod, demand, account, nodes.hold)
        owed = self._owed(account.view, nodes.version) if wants_nodes and context.may_defer else ()
        return FilterInputs(
            context, account.refusal, inside, outside, nodes.version, nodes.candidates, nodes.gpu_memory, owed
        )

    def workload(self, pod: Mapping[str, Any]) -> Workload:
        """The pod's workload (`extender.policy.workloads.workload_of`), without its gang's state."""
        return self._workloads.workload(pod)

    def members(self, workload: str) -> Collection[str]:
        """The keys of a gang workload's pods."""
        return self._workloads.members.get(workload, ())

    def gang_reservation(self, workload: str) -> GangReservation | None:
        """The reservation of a gang admitted whole, while its members are being placed."""
        return self._gangs.reservation(workload)

    def gang_nodes(self, workload: str) -> list[str]:
        """The nodes of the gang's members whose GPUs the picture sees taken (one per member)."""
        landed, _ = self._gangs.placed(self.members(workload))
        return landed

    def gang(self, pod: Mapping[str, Any]) -> GangState:
        """The pod's workload: its minimum, members, how many are placed, its reservation."""
        self.settle()  # brings reservations in line with the members
        return self._gangs.state(pod)

    def topology_ask(self, pod: Mapping[str, Any], workload: Workload) -> TopologyAsk:
        """The levels the pod's workload asks for: the pod's annotations, its PodGroup's
        scheduling constraints when the group was read."""
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        group = self._workloads.owners.get(("PodGroup", f"{namespace}/{workload.name}"))
        return self._topology.ask(pod, group if workload.kind == "PodGroup" else None)

    def owners_to_read(self) -> list[OwnerRef]:
        """The owners whose minimum a gang waits for (`read_owner` each), in order."""
        return sorted(self._workloads.wanted)

    def level_domains(self, level: str) -> DomainMap:
        """Node -> its domain at the topology level named (empty for a level the cluster lacks)."""
        return self._topology.domains(level)

    def nodes_in(self, level: str, domain: str) -> set[str]:
        """The nodes of one domain at a topology level."""
        return self._topology.nodes_in(level, domain)

    def domain_gpus(self, level: str) -> dict[str, int]:
        """Each domain of a topology level: its GPUs in all, free or not (`domain_sizes`). Read
        when a gang no domain holds waits: kept while neither the domains nor the GPUs moved."""
        read_at = (level, self._topology.version, self._inventory.version)
        if self._sizes_kept is None or self._sizes_kept[0] != read_at:
            nodes = map(self._inventory.node_gpus, self.gpu_node_names())
            self._sizes_kept = (read_at, domain_sizes(nodes, self._topology.domains(level)))
        return self._sizes_kept[1]

    @property
    def topology_version(self) -> int:
        """Moves whenever a node's domain at some level changes: the level maps read at one
        version are unchanged while it has not moved."""
        return self._topology.version

    def read_owner(self, ref: OwnerRef, obj: Mapping[str, Any] | None) -> None:
        """What the owner reader got (None: unreadable); gangs waiting for it may go now."""
        self._workloads.read(ref, obj)
        self._changed()

    def is_pending(self, key: str, pod: Mapping[str, Any]) -> bool:
        return self._accounting.is_pending(key, pod)

    def fairness(self) -> QueueView:
        return self._accounting.view()

    @property
    def contributions(self) -> Mapping[str, Contribution]:
        """What each counted pod adds to its queue (its bucket and amounts), as last recounted."""
        return self._accounting.ledger.contributions

    def on_recount(self, listener: Callable[[Iterable[str] | None], None]) -> None:
        """Have `listener` told which pods the accounting recounted (None: all of them)."""
        self._accounting.recounted.append(listener)

    def adjust_weights(self, adjustment: WeightAdjustment | None) -> None:
        """Fair shares under `adjustment` from the next view on (`QueueAccounting.adjust_weights`)."""
        self._accounting.adjust_weights(adjustment)

    def tenancy_refusal(self, queue: str, namespace: str, labels: Mapping[str, Any] | None = None) -> str:
        """Why pods of `namespace` may not use `queue` ('' when they may; extender.policy.tenancy).
        `labels`: the Namespace's, when the caller has them; else the picture's."""
        return self._accounting.tenancy_refusal(queue, namespace, labels)

    def settle(self) -> None:
        """Count what changed into the ledger, without the fair shares `fairness` computes too:
        the watcher calls it after a burst of events, ahead of the next request (kube-scheduler
        waits for a filter answer in every pod's cycle, not for a watch event), and the questions
        that read only the ledger call it first."""
        self._accounting.settle()

    def mix(self) -> WorkloadMix:
        """The workload mix placement ranks against (the view's, without computing the rest)."""
        return self._accounting.mix()

    def capacity(self) -> dict[str, float]:
        return self._inventory.capacity()

    def parts(self) -> dict[str, object]:
        """The picture's parts by name, opaque: what a memory profile weighs (`bench.memory`)."""
        return {
            "store": self._store,
            "pod demands": self._demands,
            "GPU inventory": self._inventory,
            "workloads": self._workloads,
            "topology": self._topology,
            "queue accounting": self._accounting,
            "running pods": self._running,
        }

    def gpu_node_names(self) -> list[str]:
        """The nodes the planners and deference look at: every Node, then those only their
        ResourceSlices name (no Node object seen yet)."""
        names = dict.fromkeys(self._store.kind("Node"))
        names.update(dict.fromkeys(self._inventory.node_devices))
        return list(names)

    def snapshot(self) -> ClusterSnapshot:
        """What the planners read: GPU nodes, the pods holding GPUs there, the queues' fairness.

        The running pods come from `RunningPods`, which keeps them between snapshots and reads
        again only the pods the accounting recounted since: a snapshot costs a copy of that map,
        not a pass over every pod.
        """
        view = self.fairness()  # recounts what moved, which marks those pods stale
        nodes = {name: self.node_gpus(name) for name in self.gpu_node_names()}
        feed = self._running.feed(nodes)
        return ClusterSnapshot(
            nodes,
            feed.running,
            view,
            view.mix,
            self._inventory.gpu_memory,
            self._inventory.pods_by_node,
            minimums=feed.minimums,
            terminating=feed.terminating,
            victims=feed.victims,
            movers=feed.movers,
            holds=self._held_gpus(),
            domains=self._inventory.domains,
            part_minimums=feed.part_minimums,
            unaccounted={
                node: shares
                for node in self._inventory.holds
                if (shares := self._inventory.unaccounted_shares(node))
            },
        )

    def _held_gpus(self) -> list[HeldGpus]:
        """Reclaim's holds that name their GPUs, as the planners see them: the pod, its queue,
        the devices, and its fairness vector if its queue still counts it waiting (not when a
        filter's admission already counts it allocated)."""
        contributions = self._accounting.ledger.contributions
        now = time.monotonic()
        held: list[HeldGpus] = []
        for node, on_node in self._inventory.holds.items():
            for key, hold in on_node.items():
                if hold.queue and hold.gpus and hold.expires >= now:  # a freed GPU's rest, any pod's
                    held.append(HeldGpus(key, hold.queue, node, hold.gpus, for_queue=True))
                    continue
                contribution = contributions.get(key)
                if not hold.gpus or hold.expires < now or contribution is None:
                    continue
                waiting = contribution.bucket == "requested"
                amounts = dict(contribution.amounts) if waiting else {}
                host = hold.demand
                held.append(
                    HeldGpus(
                        key,
                        contribution.queue,
                        node,
                        hold.gpus,
                        amounts,
                        hold.owner,
                        host.cpu_milli,
                        host.memory_mib,
                    )
                )
        return held

    def waiting_pods(self) -> list[PendingPod]:
        """Pending GPU pods the planners may serve: those the admission rule admits now and no
        GPUs are held for (`extender.policy.admission.waiting_list`), in the scheduler's order.

        Of a gang not admitted yet, as many waiting members as it misses beyond those GPUs are
        held for, marked with their workload (the planner serves them all or none)."""
        view = self.fairness()
        ledger = self._accounting.ledger
        candidates: list[tuple[tuple[int, float, str], Waiting, PodDemand, GpuDemand]] = []
        levels: dict[str, dict[str, str]] = {}  # gang workload -> part -> its required level ("": none)
        for key in ledger.waiting:
            contribution = ledger.contributions[key]
            placement = contribution.gpu_demand
            if placement is None:
                continue
            pod = self._store.get("Pod", key)
            if pod is None or meta(pod).get("deletionTimestamp"):
                continue
            demand = self._demands.of(pod)
            gang = self._gangs.state(pod)  # `view` above brought the reservations in line
            held = self._inventory.held_for(key) is not None
            if not gang.admitted:
                of_parts = levels.setdefault(gang.workload.key, {})
                if gang.part not in of_parts:
                    of_parts[gang.part] = self.topology_ask(pod, gang.workload).required
            ask = Ask(demand.queue, contribution.amounts, demand.preemptible, gang)
            order = (-demand.priority, pod_created(pod), key)
            candidates.append((order, Waiting(key, ask, held), demand, placement))
        candidates.sort(key=lambda candidate: candidate[0])
        found = {entry.key: (order[1], demand, placement) for order, entry, demand, placement in candidates}
        where = {workload: self._reclaim_domains(parts) for workload, parts in levels.items()}
        waiting: list[PendingPod] = []
        for listed in waiting_list(view, [candidate[1] for candidate in candidates]):
            key = listed.waiting.key
            created, demand, placement = found[key]
            fraction = demand.gpu_requests[0].memory_bytes if demand.fractional else None
            of_gang = listed.waiting.ask.gang
            part = of_gang.part if of_gang is not None and listed.workload else ""
            domains, outer = (
                where[listed.workload].get(part, (None, None)) if listed.workload else (None, None)
            )
            waiting.append(
                PendingPod(
                    key=key,
                    queue=demand.queue,
                    demand=placement,
                    resources=listed.waiting.ask.request,
                    priority=demand.priority,
                    created=created,
                    fraction_memory=fraction,
                    preemptible=demand.preemptible,
                    workload=listed.workload,
                    domains=domains,
                    outer=outer,
                    part=part,
                )
            )
        return waiting

    def _reclaim_domains(
        self, levels: Mapping[str, str]
    ) -> dict[str, tuple[DomainMap | None, DomainMap | None]]:
        """Where reclaim serves each part of a gang (`PendingPod.domains` and `outer`), from the
        parts' required levels (part -> level, "" none; without parts one entry, part ""): all
        alike, the one level's domains; else each part's own inside the widest level's."""
        domains_of = {part: self.level_domains(level) if level else None for part, level in levels.items()}
        if len(set(levels.values())) <= 1:
            return {part: (domains, None) for part, domains in domains_of.items()}
        names = [level.name for level in self.config.topology.levels]
        outer = self.level_domains(min(filter(None, levels.values()), key=names.index))
        return {part: (domains, outer) for part, domains in domains_of.items()}

    def owed_pods(self) -> tuple[OwedPod, ...]:
        """The waiting pods free capacity goes to first (`extender.policy.deference.owed_pods`):
        pending GPU pods kube-scheduler tried and could not place, of queues below their fair
        share, admitted, nothing held for them, not of a gang still to be admitted whole.

        The filter asks for every pod: kept until the view, the inventory or the unplaced pods
        change, and nothing to do while no pod waits unplaced (the common case costs a test)."""
        if not self._unplaced:
            return ()
        return self._owed(self.fairness(), self._inventory.version)

    def _unplaced_gpu_pods(self) -> Iterator[tuple[str, Stored, Contribution, GpuDemand]]:
        """The waiting GPU pods kube-scheduler gave up on, not being deleted: key, pod, its
        contribution and its GPU demand."""
        ledger = self._accounting.ledger
        for key in self._unplaced & ledger.waiting:
            contribution = ledger.contributions[key]
            placement = contribution.gpu_demand
            pod = self._store.get("Pod", key)
            if placement is not None and pod is not None and not meta(pod).get("deletionTimestamp"):
                yield key, pod, contribution, placement

    def _owed(self, view: QueueView, version: int) -> tuple[OwedPod, ...]:
        """`owed_pods` under `view` and the inventory at `version` (the filter's, read already)."""
        if not self._unplaced:
            return ()
        kept = self._owed_kept
        if kept is not None and kept[0] is view and kept[1] == version and kept[2] == self._unplaced_changes:
            return kept[3]
        candidates: list[tuple[tuple[int, float, str], OwedPod]] = []
        for key, pod, contribution, placement in self._unplaced_gpu_pods():
            demand = self._demands.of(pod)
            if not is_owed(view, demand.queue, contribution.amounts) or self._inventory.held_for(key):
                continue
            gang = self._gangs.state(pod)  # (`view` above brought the reservations in line)
            if (
                not gang.admitted
                or not admit(view, Ask(demand.queue, contribution.amounts, demand.preemptible, gang)).admit
            ):
                continue
            order = (-demand.priority, pod_created(pod), key)
            candidates.append((order, OwedPod(key, demand.queue, contribution.amounts, placement)))
        candidates.sort(key=lambda candidate: candidate[0])
        owed = owed_pods(view, (pod for _, pod in candidates))
        if self.config.collect_for_owed and any(pod.demand.count > 1 for pod in owed):
            owed = collecting_nodes(owed, self.supplies("", self.gpu_node_names()))
        self._owed_kept = (view, version, self._unplaced_changes, owed)
        return owed

    def waiting_gangs(self) -> tuple[WaitingGang, ...]:
        """The gangs later gangs are planned around (`extender.policy.backfill`): not admitted
        yet, pods kube-scheduler tried and could not place, their queue admitting them whole
        (`admit`), in the scheduler's order, each with its oldest waiting member's creation. A gang
        with parts is left out: its members differ in shape, and no one shape says what it needs.
        Kept as `owed_pods` is, and with the topology's version (the domains it reads)."""
        if not self._unplaced:
            return ()
        view, version = self.fairness(), self._inventory.version
        at = (self._unplaced_changes, self.topology_version)
        kept = self._gangs_kept
        if kept is not None and kept[0] is view and kept[1] == version and kept[2:4] == at:
            return kept[4]
        found: dict[str, WaitingGang] = {}
        for _key, pod, contribution, placement in self._unplaced_gpu_pods():
            gang = self._gangs.state(pod)  # (`view` above brought the reservations in line)
            if gang.admitted or gang.parts:
                continue
            demand = self._demands.of(pod)
            order = (-demand.priority, pod_created(pod), gang.workload.key)
            if gang.workload.key in found and found[gang.workload.key].order <= order:
                continue
            if not admit(view, Ask(demand.queue, contribution.amounts, demand.preemptible, gang)).admit:
                continue
            ask = self.topology_ask(pod, gang.workload)
            level = ask.required or ask.preferred
            found[gang.workload.key] = WaitingGang(
                gang.workload.key,
                order,
                placement,
                gang.missing,
                self.level_domains(level) if level else {},
                one_domain=bool(ask.required),
            )
        gangs = tuple(sorted(found.values(), key=lambda gang: gang.order))
        self._gangs_kept = (view, version, *at, gangs)
        return gangs

    def unplaced_waiting(self) -> bool:
        """Whether a pending GPU pod waits that kube-scheduler has tried and could not place.

        Reclaim and consolidation plan only while one waits: a pod the scheduler has not tried
        yet (a backlog of new pods) may well fit where it is, and planning for it would be a pass
        over every waiting pod each cycle with nothing to come of it."""
        self.settle()  # brings the ledger's waiting pods up to date
        ledger = self._accounting.ledger
        return any(
            ledger.contributions[key].gpu_demand is not None for key in self._unplaced & ledger.waiting
        )

    def workload_counts(self) -> dict[str, tuple[int, int]]:
        """Per queue: workloads admitted (a pod alone that holds its GPUs, or a gang with its
        minimum placed or reserved) and workloads waiting (pods pending, not admitted)."""
        self.settle()
        placed: Counter[str] = Counter()
        pending: set[str] = set()
        queue_of: dict[str, str] = {}
        sample: dict[str, Stored] = {}
        for key, contribution in self._accounting.ledger.contributions.items():
            pod = self._store.get("Pod", key)
            if pod is None:
                continue  # a gang's slot
            workload = self._workloads.workload_key(key) or key
            queue_of[workload] = contribution.queue
            sample[workload] = pod
            if contribution.bucket == "allocated":
                placed[workload] += 1
            elif contribution.bucket == "requested" or self._gangs.reserved(workload):
                pending.add(workload)
        counts: dict[str, tuple[int, int]] = {}
        for workload, queue in queue_of.items():
            if self._gangs.reserved(workload):
                admitted = True
            elif workload in self._workloads.members:  # a gang: its minimum placed?
                admitted = placed[workload] >= self._workloads.minimum(
                    self._workloads.workload(sample[workload])
                )
            else:
                admitted = placed[workload] > 0
            if not admitted and workload not in pending:
                continue
            done, waiting = counts.get(queue, (0, 0))
            counts[queue] = (done + admitted, waiting + (not admitted))
        return counts


def scheduler_gave_up(pod: Mapping[str, Any]) -> bool:
    """A pending pod kube-scheduler tried and could not place: no node yet, and the condition
    PodScheduled=False, reason Unschedulable, that the scheduler writes after a cycle in which no
    node fit. (A cycle that failed on an error is retried by the scheduler itself: evicting
    others would not place the pod sooner.)"""
    if mapping(pod.get("spec")).get("nodeName"):
        return False
    for condition in sequence(mapping(pod.get("status")).get("conditions")):
        condition = mapping(condition)
        if condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == UNSCHEDULABLE_REASON
    return False
