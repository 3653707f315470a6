"""Consolidation: which running pods to move so a waiting pod fits, or so whole GPU nodes empty. Pure.

The third goal of the planner (design-next.md, "one planner, three goals"). A cluster that is
fragmented has GPU capacity free in pieces: a whole-GPU pod waits while four GPUs are each half
used. Moving one half next to another frees a whole GPU. A move is an eviction of a pod whose
controller recreates it; the recreated pod is placed by the scheduler like any other.

Rules (each a test in tests/unit/extender/test_consolidation.py):

1. A waiting pod is served only when it fits no node now and its queue admits it (limits; quota
   for a pod that is not preemptible). When it would borrow beyond its queue's fair share, it is
   served only while no other queue below its fair share waits for GPUs: reclaim would take the
   GPUs back, and the moves would have been for nothing.
2. Movers are pods that are `movable` (a controller that recreates them owns them, and they are
   not opted out), preemptible, not terminating, and have run at least `min_runtime_s` - so a pod
   just recreated by a move is not moved again soon.
3. Fewest moves first: for k = 1, 2, ... up to `max_moves_per_pod`, on every node every set of k of
   its movers (the `max_candidates` smallest) is tried on a
   fork: the movers off, the waiting pod placed on the node, then each mover - largest first -
   placed on the node the filter ranks best among nodes with GPUs of the same model and size (its
   own node included, on another GPU). The smallest k with any set where all of that fits wins;
   among its sets, fewest GPUs moved (small fractions before big pods), then lowest priorities,
   then the newest pods. A set with a mover that fits no other node and cannot share its own with
   the waiting pod is skipped without a trial (`_Landings`): in a nearly full cluster that is most
   sets. A node where the waiting pod would not fit with all its candidates off is not searched,
   and the nodes where movers land are found through an index of the nodes by GPU model and
   size, roomiest GPU first.
4. Bounded: at most `max_moves_per_pod` moves serve one pod, `max_moves_per_cycle` per cycle,
   `max_pending` waiting pods are tried, and at most `max_trials` sets of movers (or nodes to
   empty) are tried on forks per cycle (a `Budget`: what it cuts off is counted in it).
6. A gang waiting whole is served only when it requires a topology level (no domain of it has
   room for all its waiting members): the fewest moves that free room for all of them in one
   domain, each mover landing outside it (`plan_domain_moves`), at most `max_moves_per_pod` per
   member and within the cycle's moves; rule 1 judges the members' summed ask. The plan names
   each member's node, where the executor holds its GPUs for the gang. A gang without a level is
   not served (moves for some members start none of it; reclaim serves gangs whole).
7. Consolidation serves what reclaim did not: the fork has the cycle's reclaim plans applied first,
   and each move plan is applied before the next, so no GPU is counted twice.

Work proportional to what changed, not to the pods: the live picture keeps each node's movers
(`ClusterSnapshot.movers`, in the order they are tried), and the caller keeps a `NodeRooms` from
one cycle to the next - each node's candidates, per demand the nodes where it fits with all of
them off and the sets of them that make room - which a cycle brings up to date with the nodes
whose GPUs or movers are other objects than the cycle before (or whose movers came of age). In
the cycle, the nodes the fork changes are formed for it (`_Movers`), and "fits somewhere now" is
answered by the kept `FitIndex` (extender.policy.reclaim). Plans are those of a pass over every
pod and every node (tests/unit/extender/test_planning_shortcuts.py).

Scale-down (`plan_drain`, off unless asked for): while nothing waits, empty whole GPU nodes - the
ones holding the fewest GPUs first - by moving every pod on them elsewhere, with the same movers
(rule 2) and the same placement (rule 3); a node with a pod that may not move stays.

The planner ignores PodDisruptionBudgets: the Eviction API enforces them when the moves are
carried out, and the executor reports a blocked move.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Literal

from contract.names import GPU_MILLI
from extender.policy.drf import gpu_amounts
from extender.policy.fairness import EPSILON, FairnessSnapshot
from extender.policy.placement import GpuDemand, NodeGpus, fits, placement_cost
from extender.policy.reclaim import (
    Budget,
    DemandKey,
    DemandNodes,
    FitIndex,
    PendingPod,
    Plan,
    Search,
    apply_plan,
    place_if_it_fits,
    planning_fork,
    serving_order,
)
from extender.policy.snapshot import (
    ClusterSnapshot,
    RunningPod,
    can_be_victim,
    changed_keys,
    mover_order,
    without,
)

Goal = Literal["consolidate", "drain"]


@dataclass(frozen=True)
class ConsolidationRules:
    min_runtime_s: float = 300.0  # a mover has run at least this long
    max_moves_per_pod: int = 2  # moves to serve one waiting pod
    max_moves_per_cycle: int = 4
    max_candidates: int = 8  # movers tried per node, smallest first (bounds the search)
    max_pending: int = 64  # waiting pods tried per cycle
    max_trials: int = 64  # sets of movers (or nodes to empty) tried on forks per cycle


@dataclass(frozen=True)
class Move:
    pod: RunningPod  # as it runs now
    to_node: str  # where it fits once moved (the scheduler decides where its successor lands)
    message: str  # for the mover's event


@dataclass(frozen=True)
class MovePlan:
    goal: Goal
    node: str  # the node made room on (consolidate) or emptied (drain)
    moves: tuple[Move, ...]
    gpus_freed: float  # GPUs made usable on `node`: the served pod's demand, or the whole node
    pod: PendingPod | None = None  # the pod served (consolidate)
    # A gang served in one domain (`plan_domain_moves`): the domain, and each member with the
    # node it fits on once the moves are done (`pod` is its first member, `node` that one's node).
    domain: str = ""
    members: tuple[tuple[PendingPod, str], ...] = ()

    @property
    def gpus_moved(self) -> float:
        return sum(move.pod.gpus_held for move in self.moves)


def is_mover(pod: RunningPod, now: float, rules: ConsolidationRules) -> bool:
    """Rule 2: may this pod be moved?"""
    return pod.movable and can_be_victim(pod) and now - pod.started >= rules.min_runtime_s


def _demand_of(pod: RunningPod) -> GpuDemand:
    """What a running pod asks for again once recreated: its GPUs, of the share it holds, and the
    CPU and memory it takes where the node tracks them (the simulator's nodes do)."""
    milli = max(milli for _, milli in pod.gpus)
    return GpuDemand(len(pod.gpus), milli, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)


def consolidation_refusal(fairness: FairnessSnapshot, waiting: PendingPod) -> str:
    """Why no pod may be moved for `waiting` ('' when they may): rule 1."""
    decision = fairness.admit(waiting.queue, waiting.resources, preemptible=waiting.preemptible)
    if not decision.admit:
        return decision.reason
    if decision.kind != "borrowing":
        return ""
    tree, shares = fairness.tree, fairness.fair_shares
    for queue, usage in sorted(fairness.usage.items()):
        if queue == waiting.queue or queue not in tree.specs:
            continue
        for resource in gpu_amounts(usage.requested):
            held, fair = tree.subtree(queue, "allocated", resource), shares.get(queue, {}).get(resource, 0.0)
            if held < fair - EPSILON:
                return (
                    f"queue '{waiting.queue}' would borrow beyond its fair share while queue "
                    f"'{queue}' waits below its own: reclaim would take the GPUs back"
                )
    return ""


def _land(
    fork: ClusterSnapshot,
    pod: RunningPod,
    like: str,
    avoid: Collection[str],
    candidates: Iterable[str] | None = None,
) -> str | None:
    """Place a moved pod in the fork where the filter ranks best among nodes with GPUs like those of
    node `like` (among `candidates` when given: every node it may fit); the node, or None when it
    fits nowhere. A moved pod is not moved again this cycle."""
    demand = _demand_of(pod)
    model, memory = fork.nodes[like].model, fork.gpu_memory.get(like, 0)
    best: tuple[tuple[float, ...], str] | None = None
    for name in fork.fitting_nodes(demand, candidates):
        if name in avoid or fork.nodes[name].model != model or fork.gpu_memory.get(name, 0) != memory:
            continue
        cost = placement_cost(fork.nodes[name], demand, fork.mix)
        if cost is not None and (best is None or (cost, name) < best):
            best = (cost, name)
    if best is None or fork.place(replace(pod, movable=False), demand, best[1]) is None:
        return None
    return best[1]


class _Landings:
    """Where movers may land, for one search on one fork. A trial changes only the node made room
    on (which gains room) and the nodes its earlier movers land on (which lose room), so a mover
    lands either on a node where it fits in the fork already or on the node made room on. Nodes
    where its GPUs fit are found once per GPU shape (GPUs, share, model and GPU size of its node),
    whether it fits one of them other than its own (CPU and memory too) once per mover, and a
    group with a mover that can land nowhere is skipped without a trial: in a full cluster, most
    groups."""

    def __init__(self, fork: ClusterSnapshot) -> None:
        self.fork = fork
        self._fitting: dict[tuple[int, int, str, int], list[str]] = {}
        self._elsewhere: dict[str, bool] = {}
        self._by_room: dict[tuple[str, int], list[tuple[int, str]]] | None = None

    def _roomiest(self, model: str, memory: int) -> list[tuple[int, str]]:
        """The nodes with GPUs of this model and size as (most free milli on one GPU, node), most
        first: indexed once per search, so a shape's nodes are found without a scan of all."""
        if self._by_room is None:
            fork, by_room = self.fork, dict[tuple[str, int], list[tuple[int, str]]]()
            for name, supply in fork.nodes.items():
                room = max(supply.free_milli, default=0)
                by_room.setdefault((supply.model, fork.gpu_memory.get(name, 0)), []).append((room, name))
            for nodes in by_room.values():
                nodes.sort(reverse=True)
            self._by_room = by_room
        return self._by_room.get((model, memory), [])

    def candidates(self, pod: RunningPod) -> list[str]:
        """Nodes with GPUs like those of the pod's node where its GPUs fit in the fork."""
        fork = self.fork
        count, milli = len(pod.gpus), max(milli for _, milli in pod.gpus)
        kind = (count, milli, fork.nodes[pod.node].model, fork.gpu_memory.get(pod.node, 0))
        found = self._fitting.get(kind)
        if found is None:
            shape, nodes, found = GpuDemand(count, milli), fork.nodes, []
            for room, name in self._roomiest(kind[2], kind[3]):
                if room < milli:
                    break  # no GPU of this node or the next ones has the room
                if fits(nodes[name], shape):
                    found.append(name)
            self._fitting[kind] = found
        return found

    def _fits_elsewhere(self, pod: RunningPod) -> bool:
        known = self._elsewhere.get(pod.key)
        if known is None:
            demand, nodes = _demand_of(pod), self.fork.nodes
            known = self._elsewhere[pod.key] = any(
                name != pod.node and fits(nodes[name], demand) for name in self.candidates(pod)
            )
        return known

    def may_land(self, group: Sequence[RunningPod], node: str, arriving: GpuDemand) -> bool:
        """False when a mover of `group` can land nowhere: it fits no other node, and its GPUs and
        the arriving pod's cannot both fit `node` with the group off (whatever GPUs each takes), or
        the CPU and memory of the arriving pod and such movers cannot."""
        staying = [pod for pod in group if not self._fits_elsewhere(pod)]
        if not staying:
            return True
        if not self._host_room(node, arriving, staying, group):
            return False
        free = _free_without(self.fork.nodes[node].free_milli, group)
        return all(_both_fit(free, arriving, len(pod.gpus), max(m for _, m in pod.gpus)) for pod in staying)

    def _host_room(
        self, node: str, arriving: GpuDemand, staying: Sequence[RunningPod], gone: Sequence[RunningPod]
    ) -> bool:
        """Do the CPU and memory of the arriving pod and the movers `staying` fit `node` together
        with the pods `gone` off it?"""
        together = GpuDemand(
            0,
            cpu_milli=arriving.cpu_milli + sum(pod.cpu_milli for pod in staying),
            memory_mib=arriving.memory_mib + sum(pod.memory_mib for pod in staying),
        )
        return self.fork.fits_without(node, together, gone)


def _free_without(free_milli: Sequence[int], pods: Iterable[RunningPod]) -> list[int]:
    """A node's free shares per GPU with these of its pods off it."""
    free = list(free_milli)
    for pod in pods:
        for index, milli in pod.gpus:
            free[index] = min(GPU_MILLI, free[index] + milli)
    return free


def _both_fit(free: Sequence[int], first: GpuDemand, count: int, milli: int) -> bool:
    """Can `first` take GPUs of these free shares and `count` GPUs of `milli` still fit? (exact,
    over every choice of GPUs for `first`)"""
    for chosen in combinations(range(len(free)), first.count):
        if all(free[index] >= first.milli for index in chosen):
            left = [share - (first.milli if index in chosen else 0) for index, share in enumerate(free)]
            if sum(1 for share in left if share >= milli) >= count:
                return True
    return False


def _move_message(pod: RunningPod, to_node: str, waiting: PendingPod, node: str) -> str:
    return (
        f"moved to defragment GPUs: pod {waiting.key} of queue '{waiting.queue}' fits no node as the "
        f"GPUs are used; with this pod ({pod.gpus_held:.3g} GPUs) moved off node {node} it fits there, "
        f"and this pod's successor fits on node {to_node}"
    )


_Group = tuple[tuple[float, int, float, str, tuple[str, ...]], str, GpuDemand, tuple[RunningPod, ...]]
Making = tuple[str, GpuDemand, Sequence[RunningPod]]  # a node making room, the demand there, its candidates


class _Room:
    """One state of a node as consolidation reads it: its GPUs, its movers, and its candidates
    (rule 2: the `max_candidates` first movers in `mover_order` that have run long enough and are
    not pinned), with `since` / `until` the span of times in which they stay its candidates."""

    __slots__ = ("_freed", "candidates", "memory", "movers", "since", "supply", "until")

    def __init__(
        self,
        supply: NodeGpus,
        movers: tuple[RunningPod, ...],
        memory: int,
        now: float,
        rules: ConsolidationRules,
        pinned: Collection[str] = frozenset(),
    ) -> None:
        self.supply, self.movers, self.memory, self.since = supply, movers, memory, now
        chosen: list[RunningPod] = []
        until, most, least = math.inf, rules.max_candidates, rules.min_runtime_s
        for pod in movers:
            if len(chosen) == most:
                break  # the movers after these stay out whatever their age
            if pinned and pod.key in pinned:
                continue
            if now - pod.started >= least:
                chosen.append(pod)
            elif pod.started + least - 1e-3 < until:  # a candidate once it has run long enough
                until = pod.started + least - 1e-3  # (a millisecond early: float sums)
        self.candidates, self.until = tuple(chosen), until
        self._freed: NodeGpus | None = None

    def still(self, supply: NodeGpus, movers: tuple[RunningPod, ...], memory: int, now: float) -> bool:
        """Is this the node's room with these GPUs, movers and GPU memory at `now`? (Equal GPUs
        and movers are the same room: it takes them as its own, to be found by identity.)"""
        if not self.since <= now < self.until or self.memory != memory:
            return False
        if not (self.supply is supply or self.supply == supply) or not (
            self.movers is movers or self.movers == movers
        ):
            return False
        self.supply, self.movers = supply, movers
        return True

    def makes_room(self, demand: GpuDemand) -> bool:
        """Does `demand` fit with every candidate off? (else no set of them can make room)"""
        if not self.candidates:
            return False
        if self._freed is None:
            self._freed = without(self.supply, self.candidates)
        return fits(self._freed, demand)

    def groups(self, node: str, demand: GpuDemand, count: int) -> list[_Group]:
        """Every set of `count` candidates whose moving makes room for `demand`, unsorted."""
        return [
            (_group_rank(group, node), node, demand, group)
            for group in combinations(self.candidates, count)
            if fits(without(self.supply, group), demand)
        ]


class NodeRooms:
    """What consolidation found on each node, kept by the caller from one cycle to the next (the
    consolidation executor keeps one; `plan_moves` starts one afresh without it), so a cycle
    looks again only at the nodes that changed since the last.

    Per node of a snapshot's base (as the picture has it, before any fork's changes) a `_Room`:
    valid while the node's GPUs and its movers are the same objects (or equal ones), and no mover
    left out for its age has come of age. Per waiting pod's demand, the nodes whose room fits it
    with all their candidates off, and per node the sets of movers that make room, brought up to
    date with the nodes whose room was formed again since (`_changed`, a log the demands read from
    where they stopped). A demand no waiting pod asked about in a cycle is forgotten at the next;
    all is forgotten when the rules change."""

    def __init__(self) -> None:
        self.fits = FitIndex()  # where waiting pods fit now (reclaim's, kept alike)
        self._setting: tuple[float, int] | None = None  # the rules the rooms follow
        self._rooms: dict[str, _Room] = {}
        self._passing = DemandNodes()  # per demand, the nodes whose room makes room for it
        self._groups: dict[tuple[DemandKey, int], dict[str, tuple[_Room, list[_Group]]]] = {}
        # The base's nodes, movers and GPU memory at the last refresh, and when it was.
        self._seen: tuple[dict[str, NodeGpus], dict[str, tuple[RunningPod, ...]], dict[str, int]]
        self._seen = ({}, {}, {})
        self._now = -math.inf
        self._soonest = math.inf  # the earliest time a room's candidates change (a mover comes of age)

    def refresh(self, snapshot: ClusterSnapshot, now: float, rules: ConsolidationRules) -> None:
        """Bring the rooms in line with the snapshot's base nodes and movers: a node whose GPUs,
        movers or GPU memory are other objects than at the last refresh, or one of whose movers
        came of age, is looked at again - its room formed again (and logged) unless the new
        objects are equal to its own; the others keep theirs. Which nodes changed is found by
        comparing the maps in C (`changed_keys`), not by a pass over the nodes or the pods."""
        setting = (rules.min_runtime_s, rules.max_candidates)
        if setting != self._setting or now < self._now:  # (a clock set back: candidates may go)
            self._setting, self._rooms, self._groups = setting, {}, {}
            self._passing.forget()
            self._seen, self._soonest = ({}, {}, {}), math.inf
        self._now = now
        asked = self._passing.next_snapshot()
        self._groups = {key: known for key, known in self._groups.items() if key[0] in asked}
        nodes, movers, memory = snapshot.base_nodes, snapshot.movers(), snapshot.gpu_memory
        rooms = self._rooms
        seen_nodes, seen_movers, seen_memory = self._seen
        look = changed_keys(seen_nodes, nodes) | changed_keys(seen_movers, movers)
        look |= changed_keys(seen_memory, memory)
        if now >= self._soonest:  # some mover came of age
            look.update(node for node, room in rooms.items() if room.until <= now)
            # (the rooms come of age now are formed again below and bring their own `until`)
            self._soonest = min((room.until for room in rooms.values() if room.until > now), default=math.inf)
        self._seen = (dict(nodes), dict(movers), dict(memory))
        for node in sorted(look):
            pods, supply, room = movers.get(node), nodes.get(node), rooms.get(node)
            if pods is None or supply is None:
                if rooms.pop(node, None) is not None:
                    self._passing.changed(node)
                continue
            if room is not None and room.still(supply, pods, memory.get(node, 0), now):
                continue
            room = rooms[node] = _Room(supply, pods, memory.get(node, 0), now, rules)
            self._soonest = min(self._soonest, room.until)
            self._passing.changed(node)
        self._passing.trim()

    def room(self, node: str) -> _Room | None:
        return self._rooms.get(node)

    def passing(self, key: DemandKey, waiting: PendingPod) -> set[str]:
        """The nodes whose room (base state) fits `waiting` with all their candidates off, kept
        per demand (`DemandNodes`). Read-only for the caller."""
        rooms = self._rooms

        def makes_room(node: str, demand_on: Callable[[int], GpuDemand]) -> bool:
            room = rooms.get(node)
            return room is not None and room.makes_room(demand_on(room.memory))

        return self._passing.passing(key, waiting, rooms, makes_room)

    def groups(self, key: DemandKey, count: int, node: str, room: _Room, demand: GpuDemand) -> list[_Group]:
        """`room.groups`, kept while the node has this room."""
        per_node = self._groups.setdefault((key, count), {})
        known = per_node.get(node)
        if known is None or known[0] is not room:
            known = per_node[node] = (room, room.groups(node, demand, count))
        return known[1]


class _Movers:
    """One cycle's candidates (rule 2) per node, per demand the nodes where it fits with all of a
    node's candidates off (else no set of them can make room) and the sets of candidates that
    make room: the `NodeRooms` kept from the cycles before where the fork holds the base's state
    of a node, and formed for this fork elsewhere - on the nodes the fork changed (reclaim's plans,
    pods terminating or spared) and those of pinned pods.

    Between waiting pods the fork changes in two ways only: a pod placed where it fits already
    (its node loses room) and a move plan (its node gains room and loses the movers it moved, the
    nodes they land on lose room; moved pods move no more). `plan_moves` reports those nodes
    (`touched`), and only they are looked at again for a demand asked about before."""

    def __init__(
        self,
        fork: ClusterSnapshot,
        now: float,
        rules: ConsolidationRules,
        avoid: Collection[str],
        pinned: Collection[str],
        rooms: NodeRooms,
    ) -> None:
        rooms.refresh(fork, now, rules)
        self._rooms, self._now, self._rules, self._avoid, self._pinned = rooms, now, rules, avoid, pinned
        running = fork.running
        # Nodes whose kept room may not be this fork's: changed by it, or holding pinned pods.
        self._own = fork.changed_nodes() | {running[key].node for key in pinned if key in running}
        self._formed: dict[str, _Room] = {}  # rooms of this cycle's forks
        self.touched: list[str] = []  # nodes the fork changed since this cycle's first look
        # demand -> (touched read, nodes making room, `making_room`'s answer)
        self._making: dict[DemandKey, tuple[int, set[str], list[Making]]] = {}
        # (demand, count) -> (`making_room`'s answer it was for, touched read, `groups`' answer)
        self._sets: dict[tuple[DemandKey, int], tuple[list[Making], int, list[_Group]]] = {}

    def _room(self, fork: ClusterSnapshot, node: str) -> _Room:
        """The node's room in `fork`."""
        supply = fork.nodes[node]
        if node not in self._own:
            kept = self._rooms.room(node)
            if kept is not None and kept.supply is supply:
                return kept  # (in a cycle, a node's movers change only with its GPUs)
        room = self._formed.get(node)
        if room is None or room.supply is not supply:
            memory = fork.gpu_memory.get(node, 0)
            room = _Room(supply, fork.movers_on(node), memory, self._now, self._rules, self._pinned)
            self._formed[node] = room
        return room

    def making_room(self, fork: ClusterSnapshot, waiting: PendingPod) -> list[Making]:
        """By node name: the nodes where `waiting` fits with all their candidates off, its demand
        there and the candidates."""
        key = (waiting.demand, waiting.fraction_memory)
        known = self._making.get(key)
        if known is not None and known[0] == len(self.touched):
            return known[2]
        if known is None:  # the kept nodes, and this fork's changed nodes looked at now
            look = fork.changed_nodes() | self._own
            passing = {node for node in self._rooms.passing(key, waiting) if node not in look}
        else:
            look, passing = set(self.touched[known[0] :]), known[1]
        for node in look:
            if node in fork.nodes and node not in self._avoid:
                room = self._room(fork, node)
                if room.makes_room(waiting.demand_on(room.memory)):
                    passing.add(node)
                    continue
            passing.discard(node)
        passing.difference_update(self._avoid)
        answer: list[Making] = []
        for node in sorted(passing):
            room = self._room(fork, node)
            answer.append((node, waiting.demand_on(room.memory), room.candidates))
        self._making[key] = (len(self.touched), passing, answer)
        return answer

    def groups(
        self, fork: ClusterSnapshot, waiting: PendingPod, nodes: list[Making], count: int
    ) -> list[_Group]:
        """Every set of `count` candidates of `nodes` (`making_room`) whose moving makes room for
        `waiting` on their node, best first: per node those of its room, kept while it has it."""
        key = (waiting.demand, waiting.fraction_memory)
        known = self._sets.get((key, count))
        if known is not None and known[0] is nodes and known[1] == len(self.touched):
            return known[2]
        found = sorted(
            group
            for node, demand, _ in nodes
            for group in self._rooms.groups(key, count, node, self._room(fork, node), demand)
        )
        self._sets[(key, count)] = (nodes, len(self.touched), found)
        return found


def _moves_for(
    fork: ClusterSnapshot,
    waiting: PendingPod,
    movers: _Movers,
    budget: int,
    avoid: Collection[str],
    work: Budget,
) -> tuple[MovePlan, ClusterSnapshot] | None:
    """Rule 3: the fewest moves after which `waiting` and every mover fit, with the fork after
    them; or None (also when the cycle's `work` runs out)."""
    nodes = movers.making_room(fork, waiting)
    arriving = RunningPod(waiting.key, waiting.queue, "", (), waiting.resources, waiting.priority)
    landings = _Landings(fork)
    for count in range(1, budget + 1):
        # Every set of `count` movers that makes room, best first; the first whose movers all
        # land elsewhere is the best plan of this size (landing is the costly test).
        for _, node, demand, group in movers.groups(fork, waiting, nodes, count):
            if not landings.may_land(group, node, demand):
                continue
            if not work.spend():
                return None
            trial = fork.fork()
            for pod in group:
                trial.evict(pod.key)
            trial.place(arriving, demand, node)
            moves: list[Move] = []
            for pod in sorted(group, key=mover_order, reverse=True):
                landed = _land(trial, pod, node, avoid, [*landings.candidates(pod), node])
                if landed is None:
                    break
                moves.append(Move(pod, landed, _move_message(pod, landed, waiting, node)))
            else:
                needed = demand.total_milli / GPU_MILLI
                return MovePlan("consolidate", node, tuple(moves), needed, waiting), trial
    return None


def _group_rank(group: Sequence[RunningPod], node: str) -> tuple[float, int, float, str, tuple[str, ...]]:
    """Fewest GPUs moved, then lowest priorities, then the newest pods (then names, for order)."""
    return (
        sum(pod.gpus_held for pod in group),
        sum(pod.priority for pod in group),
        -sum(pod.started for pod in group),
        node,
        tuple(pod.key for pod in group),
    )


def plan_moves(
    snapshot: ClusterSnapshot,
    pending: Sequence[PendingPod],
    now: float,
    rules: ConsolidationRules,
    served: Sequence[Plan] = (),
    avoid: Collection[str] = frozenset(),
    pinned: Collection[str] = frozenset(),
    work: Budget | None = None,
    rooms: NodeRooms | None = None,
) -> list[MovePlan]:
    """This cycle's move plans for waiting pods that reclaim (`served`: its plans of the cycle) did
    not serve, in reclaim's order; nothing is moved off or onto the nodes in `avoid`, and the pods
    in `pinned` (e.g. a budget blocked their move lately) stay. `work`: the cycle's work budget
    (`rules.max_trials` when not given); `rooms`: what the cycles before found on the nodes (kept
    by the caller; a fresh one when not given)."""
    work = work if work is not None else Budget(rules.max_trials)
    fork = planning_fork(snapshot)
    for done in served:
        apply_plan(fork, done)
    served_keys = {key for done in served for key in done.served}  # riders too
    # A demand that fit nowhere is looked for again only where room came free (and with kept
    # rooms, across cycles only where the nodes changed).
    search = Search(fork, rooms.fits if rooms is not None else None)
    movers = _Movers(fork, now, rules, avoid, pinned, rooms if rooms is not None else NodeRooms())
    plans: list[MovePlan] = []
    moves_left = rules.max_moves_per_cycle
    gangs: dict[str, list[PendingPod]] = {}
    for waiting in pending:
        if waiting.workload:
            gangs.setdefault(waiting.workload, []).append(waiting)
    for waiting in serving_order(fork.fairness, pending, rules.max_pending, rules.max_pending):
        if moves_left <= 0:
            break
        if work.trials <= 0:
            work.cut_off += 1
            continue
        if waiting.key in served_keys:
            continue
        if waiting.workload:
            # A gang waiting whole: moves for one member would not start it; one that requires a
            # topology level may have a domain freed for all its members (rule 6), once.
            members = gangs.pop(waiting.workload, [])
            if not members or waiting.domains is None or served_keys.intersection(m.key for m in members):
                continue
            if consolidation_refusal(fork.fairness, _as_one(members)):
                continue
            budget = min(moves_left, rules.max_moves_per_pod * len(members))
            outcome = plan_domain_moves(fork, members, now, rules, budget, avoid, pinned, work)
            if outcome is None:
                continue
            found, fork = outcome
        else:
            placed = place_if_it_fits(fork, waiting, search)
            if placed is not None:
                movers.touched.append(placed)  # it lost room
                continue
            if consolidation_refusal(fork.fairness, waiting):
                continue
            budget = min(moves_left, rules.max_moves_per_pod)
            refused = work.refused
            single = _moves_for(fork, waiting, movers, budget, avoid, work)
            if single is None:
                work.cut_off += work.refused > refused  # its search stopped short
                continue
            found, fork = single
        moved = {node for move in found.moves for node in (move.pod.node, move.to_node)}
        changed = sorted({found.node, *moved, *(node for _, node in found.members)})
        search.touched.extend(changed)
        movers.touched.extend(changed)
        moves_left -= len(found.moves)
        plans.append(found)
    return plans


def _milli(pod: RunningPod) -> int:
    return sum(milli for _, milli in pod.gpus)


def _as_one(members: Sequence[PendingPod]) -> PendingPod:
    """A gang's waiting members as one pod asking what they ask together (for rule 1)."""
    summed: dict[str, float] = {}
    for member in members:
        for resource, amount in member.resources.items():
            summed[resource] = summed.get(resource, 0.0) + amount
    return replace(members[0], resources=summed)


def _arriving(waiting: PendingPod) -> RunningPod:
    return RunningPod(waiting.key, waiting.queue, "", (), waiting.resources, waiting.priority)


def _place_members(
    fork: ClusterSnapshot, members: Sequence[PendingPod], nodes: Sequence[str]
) -> list[tuple[PendingPod, str]] | None:
    """Each member on the fullest node of `nodes` it fits (binpack, as admission plans a gang),
    placed in the fork; None (the fork then part changed: a trial's) when one fits none."""
    placed: list[tuple[PendingPod, str]] = []
    for member in members:
        ranked = sorted(nodes, key=lambda name: (sum(fork.nodes[name].free_milli), name))
        for name in ranked:
            if fork.place(_arriving(member), member.demand_on(fork.gpu_memory.get(name, 0)), name):
                placed.append((member, name))
                break
        else:
            return None
    return placed


def _domain_move_message(pod: RunningPod, to_node: str, workload: str, domain: str, count: int) -> str:
    return (
        f"moved to free one topology domain for gang {workload}: its {count} waiting pods fit no "
        f"domain as the GPUs are used; with this pod ({pod.gpus_held:.3g} GPUs) moved out of {domain} "
        f"they fit there, and this pod's successor fits on node {to_node}"
    )


def plan_domain_moves(
    fork: ClusterSnapshot,
    members: Sequence[PendingPod],
    now: float,
    rules: ConsolidationRules,
    budget: int,
    avoid: Collection[str] = frozenset(),
    pinned: Collection[str] = frozenset(),
    work: Budget | None = None,
) -> tuple[MovePlan, ClusterSnapshot] | None:
    """The fewest moves (at most `budget`) that free room in one domain of a gang's required
    level (`members[0].domains`) for all its waiting `members`, each mover landing outside that
    domain; with the fork after them (the members placed in it). None when a domain holds them
    already (admission places them: nothing to move), when no set does, or when `work` runs out.

    Movers are those of rule 2 (moved by `is_mover`, not `pinned`, no gang's member, not on a
    node in `avoid`); of each domain the `max_candidates` that hold most GPUs are tried (most
    GPUs freed per move: the fewest moves), and for k = 1, 2, ... every set of k of them whose
    GPUs with the domain's free ones make up what the members ask is tried on a fork, best first
    by `_group_rank` (fewest GPUs moved, lowest priorities, newest) across the domains; the first
    where every member fits in the domain and every mover lands outside it wins.

    2 racks x 2 nodes x 4 GPUs, one-GPU pods: r1 holds 5 (3 free), r2 2 (6 free); a gang of 8
    one-GPU members requiring a rack: no rack holds 8; r2 short by 2 is freed by moving its 2 pods
    into r1's 3 free GPUs (2 moves), r1 would need 5 moved (more than the budget)."""
    domains = members[0].domains if members else None
    if domains is None:
        return None
    work = work if work is not None else Budget(rules.max_trials)
    nodes_of: dict[str, list[str]] = {}
    for node, domain in sorted(domains.items()):
        if node in fork.nodes and node not in avoid:
            nodes_of.setdefault(domain, []).append(node)
    asked = sum(member.demand.total_milli for member in members)
    candidates: dict[str, tuple[RunningPod, ...]] = {}
    short: dict[str, int] = {}  # domain -> milli it lacks for the members (a cheap bound)
    for domain, nodes in nodes_of.items():
        if _place_members(fork.fork(), members, nodes) is not None:
            return None  # a domain holds them now: admission places them there
        movers = [
            pod
            for node in nodes
            for pod in fork.movers_on(node)
            if is_mover(pod, now, rules) and pod.key not in pinned and not pod.workload
        ]
        movers.sort(key=lambda pod: (-pod.gpus_held, mover_order(pod)))
        chosen = tuple(movers[: rules.max_candidates])
        lacking = asked - sum(sum(fork.nodes[node].free_milli) for node in nodes)
        if sum(_milli(pod) for pod in chosen[:budget]) >= lacking:  # (else no set can make it up)
            candidates[domain], short[domain] = chosen, lacking
    workload = members[0].workload
    for count in range(1, budget + 1):
        groups = sorted(
            (_group_rank(group, domain), domain, group)
            for domain, movers in candidates.items()
            for group in combinations(movers, count)
            if sum(map(_milli, group)) >= short[domain]
        )
        for _, domain, group in groups:
            if not work.spend():
                return None
            trial = fork.fork()
            for pod in group:
                trial.evict(pod.key)
            placed = _place_members(trial, members, nodes_of[domain])
            if placed is None:
                continue
            outside = {*avoid, *nodes_of[domain]}
            moves: list[Move] = []
            for pod in sorted(group, key=mover_order, reverse=True):
                landed = _land(trial, pod, pod.node, outside)
                if landed is None:
                    break
                message = _domain_move_message(pod, landed, workload, domain, len(members))
                moves.append(Move(pod, landed, message))
            else:
                freed = asked / GPU_MILLI
                plan = MovePlan(
                    "consolidate", placed[0][1], tuple(moves), freed, members[0], domain, tuple(placed)
                )
                return plan, trial
    return None


def plan_drain(
    snapshot: ClusterSnapshot,
    now: float,
    rules: ConsolidationRules,
    nodes: int,
    avoid: Collection[str] = frozenset(),
    pinned: Collection[str] = frozenset(),
    work: Budget | None = None,
) -> list[MovePlan]:
    """Up to `nodes` GPU nodes to empty (for a node autoscaler to remove), the ones holding the
    fewest GPUs first: every pod on them moved elsewhere, none onto a node in `avoid` or emptied;
    a node with a pod in `pinned` stays. Each node tried costs one trial of `work`."""
    work = work if work is not None else Budget(rules.max_trials)
    fork = planning_fork(snapshot)
    ranked: list[tuple[float, int, str]] = []
    for node, supply in fork.nodes.items():
        on_node = fork.pods_on(node)
        if node in avoid or not supply.free_milli or not on_node:
            continue
        if all(pod.key not in pinned and is_mover(pod, now, rules) for pod in on_node):
            ranked.append((sum(pod.gpus_held for pod in on_node), len(on_node), node))
    emptied = set(avoid)
    plans: list[MovePlan] = []
    moves_left = rules.max_moves_per_cycle
    for _, count, node in sorted(ranked):
        if len(plans) >= nodes:
            break
        if count > moves_left:
            continue
        if not work.spend():
            work.cut_off += 1  # nodes left untried
            break
        trial = fork.fork()
        pods = sorted(trial.pods_on(node), key=mover_order, reverse=True)
        for pod in pods:
            trial.evict(pod.key)
        moves: list[Move] = []
        for pod in pods:
            landed = _land(trial, pod, node, emptied | {node})
            if landed is None:
                break
            message = (
                f"moved to empty GPU node {node} for scale-down; this pod's successor fits on node {landed}"
            )
            moves.append(Move(pod, landed, message))
        else:
            fork = trial
            emptied.add(node)
            moves_left -= len(moves)
            plans.append(MovePlan("drain", node, tuple(moves), float(len(fork.nodes[node].free_milli))))
    return plans
