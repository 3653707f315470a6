"""The running-pod feed for planners: the pods holding GPUs as the planners see them.

Reclaim, consolidation and preemption plan on a `ClusterSnapshot` of the running pods
(`extender.policy.snapshot.RunningPod`: queue, node, the GPU indexes held, fairness vector,
priority, movable...). Building that list from every pod for every snapshot would be a pass over
the cluster each planning cycle, so this part keeps it from one snapshot to the next and reads
again only the pods the accounting recounted since (it listens to `QueueAccounting.recounted`;
told "all", it starts over at the next `feed`). Kept the same way, per change of one pod:

- `terminating`: the kept pods being deleted;
- `victims`: per queue, per node, how many kept pods could be victims (the planners' candidate
  nodes), so no snapshot counts them by a pass over the pods;
- `movers`: per node, the kept pods consolidation could move, in its order; a node's tuple is
  replaced on change, never changed, so the snapshots share them.

Pods with classic GPUs (`nvidia.com/gpu` of a device plugin) are the exception: which GPUs of its
node a pod holds is the device plugin's secret, so the used ones are handed out in turn, and a
node with such pods (`_classic_nodes`) is redone in every feed.

Interface: `feed(nodes)`, what the planners read now (the caller, `ClusterPicture.snapshot`, has
the accounting recount first, which marks the moved pods stale). Exact, not approximate: the unit
tests compare each feed with a fresh picture's after random events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from contract.kube import controller_of, mapping, meta
from contract.names import GPU_MILLI, MOVABLE_ANNOTATION, RECREATING_OWNER_KINDS
from extender.picture.accounting import QueueAccounting
from extender.picture.demands import PodDemands, claim_names, is_terminal, pod_started
from extender.picture.inventory import GpuInventory
from extender.picture.store import ObjectStore
from extender.picture.workloads import WorkloadMap
from extender.policy.placement import NodeGpus
from extender.policy.snapshot import RunningPod, could_move, count_victims, keep_movers, mover_order
from extender.policy.workloads import part_of


@dataclass(frozen=True)
class PlannerFeed:
    """The running pods of one snapshot, and what is derived from them (copies: a planner's fork
    may change none of what is kept)."""

    running: dict[str, RunningPod]
    terminating: set[str]  # keys of `running` being deleted
    victims: dict[str, dict[str, int]]  # queue -> node -> how many of its pods could be victims
    movers: dict[str, tuple[RunningPod, ...]]  # node -> the pods that could move, in `mover_order`
    minimums: dict[str, int]  # gang workload with running members -> its minimum
    part_minimums: dict[str, dict[str, int]]  # such a workload with parts -> each part's minimum


class RunningPods:
    def __init__(
        self,
        store: ObjectStore,
        demands: PodDemands,
        inventory: GpuInventory,
        accounting: QueueAccounting,
        workloads: WorkloadMap,
    ) -> None:
        self._store = store
        self._demands = demands
        self._inventory = inventory
        self._accounting = accounting
        self._workloads = workloads
        # The pods holding GPUs but classic ones, kept between feeds (None: rebuild from every pod).
        self._running: dict[str, RunningPod] | None = None
        self._classic_nodes: set[str] = set()  # nodes with pods holding classic GPUs
        self._stale: set[str] = set()  # pods the accounting recounted since the last feed
        self._terminating: set[str] = set()  # keys in `_running` of pods being deleted
        self._victims: dict[str, dict[str, int]] = {}  # (`PlannerFeed.victims` of `_running`)
        self._movers: dict[str, tuple[RunningPod, ...]] = {}  # (`PlannerFeed.movers` of `_running`)
        accounting.recounted.append(self._forget)

    def feed(self, nodes: Mapping[str, NodeGpus]) -> PlannerFeed:
        """The running pods on `nodes` (the GPU nodes, by name) as the planners see them now:
        the kept ones brought up to date with the pods recounted since, plus the pods with
        classic GPUs, their nodes redone."""
        if self._running is None:
            self._running, self._classic_nodes, self._terminating, self._victims = {}, set(), set(), {}
            self._movers = {}
            stale = [(key, node) for node, keys in self._inventory.pods_by_node.items() for key in keys]
        else:
            stale = [(key, self._node_of(key)) for key in self._stale]
        self._stale = set()
        live = self._running
        for key, node in stale:
            gone = live.pop(key, None)
            if gone is not None:
                count_victims(self._victims, gone, -1)
                keep_movers(self._movers, gone, -1)
            self._terminating.discard(key)
            if node:
                entry, classic_gpus = self._running_pod(key, node)
                if classic_gpus:
                    self._classic_nodes.add(node)
                elif entry is not None:
                    live[key] = entry
                    count_victims(self._victims, entry, 1)
                    keep_movers(self._movers, entry, 1)
                    if entry.terminating:
                        self._terminating.add(key)
        running = dict(live)
        terminating = set(self._terminating)
        victims = {queue: dict(per_node) for queue, per_node in self._victims.items()}
        movers = dict(self._movers)
        for node in list(self._classic_nodes):
            if not self._add_classic(running, node, nodes.get(node), terminating):
                self._classic_nodes.discard(node)
        for node in self._classic_nodes:  # their pods are in `running` only
            on_node = [
                running[key]
                for key in self._inventory.pods_by_node.get(node, ())
                if key in running and running[key].node == node
            ]
            for pod in on_node:
                if pod.key not in live:
                    count_victims(victims, pod, 1)
            movable = sorted((pod for pod in on_node if could_move(pod)), key=mover_order)
            movers.pop(node, None)
            if movable:
                movers[node] = tuple(movable)
        minimums, part_minimums = self._minimums(running)
        return PlannerFeed(running, terminating, victims, movers, minimums, part_minimums)

    def _minimums(
        self, running: Mapping[str, RunningPod]
    ) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """The minimum of each gang workload with running members, and of those with parts each
        part's (found from the gangs' members, not by a pass over every running pod)."""
        minimums: dict[str, int] = {}
        part_minimums: dict[str, dict[str, int]] = {}
        workloads = self._workloads
        for workload, members in workloads.members.items():
            for key in sorted(members):
                pod = running.get(key)
                obj = self._store.get("Pod", key) if pod is not None and pod.workload == workload else None
                if obj is not None:
                    found = workloads.workload(obj)
                    minimums[workload] = workloads.minimum(found)
                    if found.parts:
                        part_minimums[workload] = dict(found.parts)
                    break
        return minimums, part_minimums

    def _node_of(self, key: str) -> str:
        pod = self._store.get("Pod", key)
        return self._inventory.pod_node(key, pod) if pod is not None else ""

    def _add_classic(
        self, running: dict[str, RunningPod], node: str, supply: NodeGpus | None, terminating: set[str]
    ) -> bool:
        """Add the pods of `node` that hold classic GPUs to `running` (and to `terminating` those
        being deleted); False when it has none."""
        classic: list[int] | None = None
        found = False
        for key in self._inventory.pods_by_node.get(node, ()):
            entry, classic_gpus = self._running_pod(key, node)
            if not classic_gpus or entry is None:
                continue
            # Which classic GPUs a pod holds is the device plugin's secret: the used ones are
            # the last of the node's list, handed to its classic pods in turn.
            if classic is None:
                classic = self._classic_indexes(node, supply)
            taken, classic = classic[:classic_gpus], classic[classic_gpus:]
            running[key] = replace(entry, gpus=entry.gpus + tuple((i, GPU_MILLI) for i in taken))
            if entry.terminating:
                terminating.add(key)
            found = True
        return found

    def _forget(self, keys: Iterable[str] | None) -> None:
        if keys is None:
            self._running, self._stale = None, set()
        elif self._running is not None:  # (none kept yet: the next feed reads every pod)
            self._stale.update(keys)

    def _running_pod(self, key: str, node: str) -> tuple[RunningPod | None, int]:
        """The pod as planners see it (None: it holds no GPU), and its classic GPU count."""
        pod = self._store.get("Pod", key)
        if pod is None or is_terminal(pod):
            return None, 0
        demand = self._demands.of(pod)
        if demand.problem or not demand.wants_gpu:
            return None, 0
        held = self._inventory.held_devices(demand.namespace, claim_names(pod))
        contribution = self._accounting.ledger.contributions.get(key)
        host = demand.placement_at(0)  # its CPU and memory, given back to the node on eviction
        workload = self._workloads.workload_key(key)
        # Partitions (index -1) are no GPU of their own: evicting them frees no whole GPU.
        running = RunningPod(
            key=key,
            queue=demand.queue,
            node=node,
            gpus=tuple((device.index, round(milli)) for _, device, milli in held if device.index >= 0),
            # The amounts its contribution counts (shared by pods that count alike), when counted.
            resources=contribution.amounts if contribution else self._accounting.resources(key, pod, demand),
            priority=demand.priority,
            preemptible=demand.preemptible,
            started=pod_started(pod),
            terminating=bool(meta(pod).get("deletionTimestamp")),
            # A gang's member is never moved: its workload would run below its minimum meanwhile.
            movable=is_movable(pod) and not workload,
            workload=workload,
            part=part_of(pod) if workload else "",
            cpu_milli=host.cpu_milli,
            memory_mib=host.memory_mib,
        )
        return running, demand.classic_gpus

    def _classic_indexes(self, node: str, supply: NodeGpus | None) -> list[int]:
        """The node's used classic GPUs (the last of its GPU list)."""
        if supply is None:
            return []
        used = [i for i, free in enumerate(supply.free_milli) if free == 0]
        return used[len(used) - self._classic_used(node) :]

    def _classic_used(self, node: str) -> int:
        return sum(self._demands.of(pod).classic_gpus for pod in self._inventory.pods_on_node(node))


def is_movable(pod: Mapping[str, Any]) -> bool:
    """Owned by a controller that recreates it when evicted, and not opted out by annotation."""
    annotations = mapping(meta(pod).get("annotations"))
    if str(annotations.get(MOVABLE_ANNOTATION, "")).lower() == "false":
        return False
    return controller_of(pod).get("kind") in RECREATING_OWNER_KINDS
