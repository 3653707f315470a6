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
   size, roomiest GPU first. The nodes making room and their sets are kept for the cycle
   (`_Movers`) and formed again only where the fork changed.
4. Bounded: at most `max_moves_per_pod` moves serve one pod, `max_moves_per_cycle` per cycle,
   `max_pending` waiting pods are tried, and at most `max_trials` sets of movers (or nodes to
   empty) are tried on forks per cycle (a `Budget`: what it cuts off is counted in it). The
   movers by node, and per demand the nodes and sets of movers that make room, are found once
   per cycle and looked at again only where the fork changed (`_Movers`), not per waiting pod.
5. Consolidation serves what reclaim did not: the fork has the cycle's reclaim plans applied first,
   and each move plan is applied before the next, so no GPU is counted twice.

Scale-down (`plan_drain`, off unless asked for): while nothing waits, empty whole GPU nodes - the
ones holding the fewest GPUs first - by moving every pod on them elsewhere, with the same movers
(rule 2) and the same placement (rule 3); a node with a pod that may not move stays.

The planner ignores PodDisruptionBudgets: the Eviction API enforces them when the moves are
carried out, and the executor reports a blocked move.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Literal

from contract.names import GPU_MILLI
from extender.policy.fairness import EPSILON, FairnessSnapshot
from extender.policy.placement import GpuDemand, NodeGpus, fits, placement_cost
from extender.policy.reclaim import (
    Budget,
    PendingPod,
    Plan,
    Search,
    apply_plan,
    gpu_amounts,
    place_if_it_fits,
    planning_fork,
    serving_order,
)
from extender.policy.snapshot import ClusterSnapshot, RunningPod, can_be_victim

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


def _mover_order(pod: RunningPod) -> tuple[float, int, float, str]:
    return (pod.gpus_held, pod.priority, -pod.started, pod.key)  # small, low priority, new first


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


class _Movers:
    """A cycle's movers (rule 2) by node, smallest first, and per demand the nodes where it fits
    with all of a node's candidates off (else no set of them can make room), kept from one
    waiting pod to the next instead of a pass over every running pod and every node per pod.

    Between waiting pods the fork changes in two ways only: a pod placed where it fits already
    (its node loses room) and a move plan (its node gains room and loses the movers it moved, the
    nodes they land on lose room; moved pods move no more). So for a demand, a node that failed
    can pass later only if it is the node of a later plan (`gained`), and a node that passed is
    checked again only when the fork holds another state of it (another `NodeGpus`)."""

    def __init__(
        self,
        fork: ClusterSnapshot,
        now: float,
        rules: ConsolidationRules,
        avoid: Collection[str],
        pinned: Collection[str],
    ) -> None:
        by_node: dict[str, list[RunningPod]] = {}
        min_runtime = rules.min_runtime_s
        for pod in fork.movable_pods():  # in no order: each node's are sorted below
            # is_mover: movable_pods are movable, preemptible, not terminating and hold GPUs.
            if now - pod.started >= min_runtime and pod.node not in avoid and pod.key not in pinned:
                by_node.setdefault(pod.node, []).append(pod)
        self._by_node = {node: sorted(pods, key=_mover_order) for node, pods in by_node.items()}
        self._max_candidates = rules.max_candidates
        self._gained: list[str] = []
        # (demand, fraction memory) -> (len(_gained) when looked, node -> its state where it passed)
        self._room: dict[tuple[GpuDemand, int | None], tuple[int, dict[str, NodeGpus]]] = {}
        # (demand, fraction memory, count) -> node -> (its state then, its groups making room)
        self._groups: dict[tuple[GpuDemand, int | None, int], dict[str, tuple[NodeGpus, list[_Group]]]] = {}

    def moved(self, done: MovePlan) -> None:
        """The fork after `done`: its movers are gone from its node, which gained room."""
        moved = {move.pod.key for move in done.moves}
        self._by_node[done.node] = [pod for pod in self._by_node.get(done.node, ()) if pod.key not in moved]
        self._gained.append(done.node)

    def making_room(
        self, fork: ClusterSnapshot, waiting: PendingPod
    ) -> list[tuple[str, GpuDemand, list[RunningPod]]]:
        """By node name: the nodes where `waiting` fits with all their candidates off, its demand
        there and the candidates (the `max_candidates` smallest movers)."""
        key = (waiting.demand, waiting.fraction_memory)
        nodes, gpu_memory = fork.nodes, fork.gpu_memory
        known = self._room.get(key)
        passed: dict[str, NodeGpus] = {}
        if known is None:
            look, gained = list(self._by_node), set()
        else:
            since, passed = known
            gained = set(self._gained[since:])
            look = list(dict.fromkeys([*passed, *gained]))
        passing: dict[str, NodeGpus] = {}
        for node in look:
            supply = nodes[node]
            if node not in gained and passed.get(node) is supply:
                passing[node] = supply  # the same state and movers as when it passed
                continue
            candidates = self._by_node.get(node, [])[: self._max_candidates]
            demand = waiting.demand_on(gpu_memory.get(node, 0))
            if candidates and fork.fits_without(node, demand, candidates):
                passing[node] = supply
        self._room[key] = (len(self._gained), passing)
        return [
            (node, waiting.demand_on(gpu_memory.get(node, 0)), self._by_node[node][: self._max_candidates])
            for node in sorted(passing)
        ]

    def groups(
        self,
        fork: ClusterSnapshot,
        waiting: PendingPod,
        nodes: list[tuple[str, GpuDemand, list[RunningPod]]],
        count: int,
    ) -> list[_Group]:
        """Every set of `count` candidates of `nodes` (`making_room`) whose moving makes room for
        `waiting` on their node, best first. A node's sets are those found before while the fork
        holds the same state of it (its movers change only with it)."""
        key = (waiting.demand, waiting.fraction_memory, count)
        known = self._groups.get(key, {})
        found: dict[str, tuple[NodeGpus, list[_Group]]] = {}
        for node, demand, candidates in nodes:
            supply = fork.nodes[node]
            before = known.get(node)
            if before is not None and before[0] is supply:
                found[node] = before
            else:
                found[node] = (
                    supply,
                    [
                        (_group_rank(group, node), node, demand, group)
                        for group in combinations(candidates, count)
                        if fork.fits_without(node, demand, group)
                    ],
                )
        self._groups[key] = found
        return sorted(group for _, groups in found.values() for group in groups)


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
            for pod in sorted(group, key=_mover_order, reverse=True):
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
) -> list[MovePlan]:
    """This cycle's move plans for waiting pods that reclaim (`served`: its plans of the cycle) did
    not serve, in reclaim's order; nothing is moved off or onto the nodes in `avoid`, and the pods
    in `pinned` (e.g. a budget blocked their move lately) stay. `work`: the cycle's work budget
    (`rules.max_trials` when not given)."""
    work = work if work is not None else Budget(rules.max_trials)
    fork = planning_fork(snapshot)
    for done in served:
        apply_plan(fork, done)
    served_keys = {done.pod.key for done in served}
    search = Search(fork)  # demands that fit nowhere are looked for again only where room came free
    movers = _Movers(fork, now, rules, avoid, pinned)
    plans: list[MovePlan] = []
    moves_left = rules.max_moves_per_cycle
    for waiting in serving_order(fork.fairness, pending, rules.max_pending):
        if moves_left <= 0:
            break
        if work.trials <= 0:
            work.cut_off += 1
            continue
        if waiting.workload:
            continue  # a member of a gang waiting whole: moves for one member would not start it
        if waiting.key in served_keys or place_if_it_fits(fork, waiting, search):
            continue
        if consolidation_refusal(fork.fairness, waiting):
            continue
        budget = min(moves_left, rules.max_moves_per_pod)
        refused = work.refused
        outcome = _moves_for(fork, waiting, movers, budget, avoid, work)
        if outcome is None:
            work.cut_off += work.refused > refused  # its search stopped short
            continue
        found, fork = outcome
        search.touched.extend(sorted({found.node, *(move.to_node for move in found.moves)}))
        movers.moved(found)
        moves_left -= len(found.moves)
        plans.append(found)
    return plans


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
        pods = sorted(trial.pods_on(node), key=_mover_order, reverse=True)
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
