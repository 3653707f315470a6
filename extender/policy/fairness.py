"""Hierarchical queue fairness: fair shares, DRF ordering and admission.

Pure functions over plain data. Every resource ("gpu", "gpu/<model>", "cpu" in cores, "memory" in
bytes) is shared independently; only resources present in ``capacity`` are fair-shared, limits
apply to every resource. See docs/queues.md for the semantics with worked examples.

Fair share, per resource, top-down through the queue tree (roots share the cluster capacity, the
children of a queue share that queue's fair share):

1. A queue's demand is what its subtree holds plus what it waits for, capped at its limit; a
   parent's demand is also capped at its own limit, so no subtree is ever given more than any
   ancestor's limit allows.
2. Priority tier by priority tier (highest first), each queue gets min(quota, demand); a tier
   that cannot be fully served splits what is left in proportion to those guarantees.
3. What is still left goes, again tier by tier, to queues that want more, in proportion to their
   over-quota weight (water-filling: a queue that is satisfied drops out and its part is shared
   by the others). Queues with weight 0 only take what positive-weight queues of their tier leave.

Idle capacity is therefore lent to whoever wants it, and the shares of a level's queues add up
to min(pool, total demand).

What the shares are divided from is one value, ``FairShareInputs``: the queues (quotas, limits,
weights, priorities), each queue's usage (its demand), the capacity, and an optional
``WeightAdjustment`` - per queue and resource, a factor on the over-quota weight of step 3, the
place for a rule that varies with time (a decayed-usage fair share). ``FairShareInputs.version``
names everything but the usage; shares kept across calls (``FairShares.update``, the accounting's)
follow usage changes only while it stays the same, and are divided again when it does not.

Cost per resource: one pass down the tree to order the queues, one up for the capped demands, one
down dividing each parent's share among its children (leaves divide nothing); each division sorts
its siblings once (water-filling), so O(n log n) for n queues, whatever the shape of the tree.
Every walk over the tree (these passes, subtree sums, broken ancestries) is a loop, never a
recursion, so a chain of thousands of queues is ordered and divided like a wide tree.

Admission (``FairnessSnapshot.admit``) is work-conserving: a pod is refused only by a limit on its
queue's path, or, when it is not preemptible, by a quota on that path, against what the path's
non-preemptible pods hold (``QueueUsage.non_preemptible``): a queue of quota 8 running 8 of its own
preemptible pods still admits a non-preemptible one, which then preempts one of them. Fair shares
refuse nothing; they decide who gets capacity back (``extender.policy.reclaim``) and in which order.

Queues whose ancestry is broken (unknown parent or a cycle) take no part: their fair share is 0
and admission refuses their pods with the reason, so a misconfiguration is visible, not silent.
Pods go to leaf queues: a queue with children refuses pods of its own, naming them (pods that were
already running there before it got children still count, as an unnamed child with no quota,
weight 1 and priority 0).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from heapq import heapify, heappop, heappush
from itertools import accumulate
from typing import Literal, NamedTuple

from extender.policy.tenancy import OPEN, Tenancy

Resources = Mapping[str, float]

GPU_MODEL_PREFIX = "gpu/"

# Float tolerance for comparisons of shares and amounts (GPU thousandths are far above it).
EPSILON = 1e-9

# overQuotaWeight is 0 (leftovers only) or within [1e-3, 1e3] (the Queue CRD and the parser
# refuse anything else). Two weights then differ by at most 1e6, so the level of water-filling
# (amount / total weight) stays finite for every finite amount, the lightest queue still gets a
# visible part next to the heaviest, and no sum of weights can overflow to infinity (two siblings
# weighing 1e308 made every share 0; a weight of 1e-320 made shares infinite).
MIN_OVER_QUOTA_WEIGHT = 1e-3
MAX_OVER_QUOTA_WEIGHT = 1e3


@dataclass(frozen=True)
class QueueSpec:
    name: str
    parent: str | None = None
    priority: int = 0
    quota: Mapping[str, float] = field(default_factory=dict)  # deserved; missing = no guarantee (0)
    limit: Mapping[str, float] = field(default_factory=dict)  # missing = unlimited
    over_quota_weight: Mapping[str, float] = field(default_factory=dict)  # missing = 1.0
    reclaim_min_runtime_s: float = 0.0  # its pods run this long before reclaim may evict them
    preempt_min_runtime_s: float = 0.0  # ... before a higher-priority pod of the queue may
    tenancy: Tenancy = OPEN  # the namespaces whose pods may use it (extender.policy.tenancy)


@dataclass(frozen=True)
class QueueUsage:
    allocated: Resources  # what the queue's running/bound pods hold
    requested: Resources  # pending demand (not yet allocated)
    # Of `allocated`, what its pods that are not preemptible hold: what a quota guarantees, so
    # what a non-preemptible pod is checked against (its queue's preemptible pods can make room).
    non_preemptible: Resources = field(default_factory=dict)


@dataclass(frozen=True)
class WeightAdjustment:
    """A term on the over-quota weights, for a rule that varies with time: each queue's weight for
    a resource is multiplied by its factor (missing: 1), within the weight bounds, so a factor
    cannot make a weighted queue a leftovers-only one, and a queue of weight 0 stays one.

    ``version`` names what the factors were computed from (a clock tick, a usage epoch): it is
    part of ``FairShareInputs.version``, so shares kept across calls are divided again when it
    changes, and only then."""

    version: Hashable
    factors: Mapping[str, Mapping[str, float]]  # queue -> resource -> factor on its weight

    def weight(self, queue: str, resource: str, weight: float) -> float:
        factor = self.factors.get(queue, {}).get(resource)
        # (A factor that is no finite number >= 0 adjusts nothing: it costs only itself.)
        if factor is None or weight <= 0 or not 0.0 <= factor < float("inf"):
            return weight
        return min(max(weight * factor, MIN_OVER_QUOTA_WEIGHT), MAX_OVER_QUOTA_WEIGHT)


@dataclass(frozen=True, eq=False)
class FairShareInputs:
    """What fair shares are divided from: the queues (quotas, limits, over-quota weights,
    priorities), each queue's usage (its demand: what it holds plus what it waits for), the
    capacity shared, and an optional adjustment of the weights (``WeightAdjustment``)."""

    queues: Sequence[QueueSpec]
    usage: Mapping[str, QueueUsage]
    capacity: Resources
    weight_adjustment: WeightAdjustment | None = None
    # The caller's name for these queues, compared in `version` instead of the specs themselves
    # (cheaper for a caller that keeps one per parse of its Queue objects); None: the specs.
    queues_version: Hashable | None = None

    @property
    def version(self) -> tuple[object, ...]:
        """Everything but the usage that the shares depend on: two inputs of one version divide
        alike for alike usage, so shares kept from one follow the other's usage changes."""
        return (
            tuple(self.queues) if self.queues_version is None else self.queues_version,
            dict(self.capacity),
            None if self.weight_adjustment is None else self.weight_adjustment.version,
        )


@dataclass(frozen=True)
class AdmissionDecision:
    admit: bool
    reason: str  # human-readable, names the queue and the numbers when refusing
    # A bounded label for metrics: within_fair_share, borrowing, over_limit, over_fair_share,
    # unknown_queue or invalid_queue.
    kind: str = ""


_NO_USAGE = QueueUsage(allocated={}, requested={})


def format_amount(resource: str, amount: float) -> str:
    """Render an amount for humans: integers without decimals, memory in binary units."""
    if resource == "memory":
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if abs(amount) >= size and abs(amount / size - round(amount / size)) < 1e-6:
                return f"{round(amount / size)}{unit}"
    if abs(amount - round(amount)) < 1e-6:
        return str(round(amount))
    return f"{amount:.3f}".rstrip("0").rstrip(".")


class _Claimant(NamedTuple):
    """One member of a division of a pool among siblings, for one resource (a tuple: thousands are
    made per recompute)."""

    key: str
    quota: float
    weight: float
    priority: int
    demand: float


def _divide(pool: float, claimants: Sequence[_Claimant]) -> dict[str, float]:
    if not claimants:  # a leaf queue: nothing to divide
        return {}
    shares = {c.key: 0.0 for c in claimants}
    remaining = max(pool, 0.0)
    by_priority: dict[int, list[_Claimant]] = {}
    for claimant in claimants:
        by_priority.setdefault(claimant.priority, []).append(claimant)
    tiers = [by_priority[priority] for priority in sorted(by_priority, reverse=True)]
    for members in tiers:
        guaranteed = {c.key: min(c.quota, c.demand) for c in members}
        wanted = sum(guaranteed.values())
        scale = 1.0 if wanted <= remaining else remaining / wanted
        for key, amount in guaranteed.items():
            shares[key] = amount * scale
        # Never below 0: float error left a tier after a fully served one dividing by zero.
        remaining = max(remaining - wanted * scale, 0.0)
    for members in tiers:
        weighted = [(c, c.weight) for c in members if c.weight > 0]
        leftovers_only = [(c, 1.0) for c in members if c.weight <= 0]
        remaining = _water_fill(remaining, weighted, shares)
        remaining = _water_fill(remaining, leftovers_only, shares)
    return shares


def _water_fill(amount: float, members: Sequence[tuple[_Claimant, float]], shares: dict[str, float]) -> float:
    """Raise members' shares in proportion to weight until amount or their demand runs out.

    O(n log n): members sorted by the level (amount per unit weight) at which each becomes
    satisfied; one pass then raises a common level, setting each member that it reaches to its
    demand and taking it out of the weight that shares the rest. Returns what is left over.
    """
    # (level at which the member is satisfied, position as a tie-break, member, weight)
    unsatisfied = sorted(
        ((c.demand - shares[c.key]) / w, i, c, w)
        for i, (c, w) in enumerate(members)
        if shares[c.key] < c.demand
    )
    if not unsatisfied:
        return amount
    # weight_from[i]: the weight of the members not yet satisfied when the i-th one is reached.
    weight_from = list(accumulate(entry[3] for entry in reversed(unsatisfied)))[::-1]
    level = 0.0
    satisfied = 0
    for index, (saturation, _, claimant, _) in enumerate(unsatisfied):
        if amount <= EPSILON:
            break
        weight = weight_from[index]
        if amount / weight <= saturation - level:
            level += amount / weight
            amount = 0.0
            break
        amount -= (saturation - level) * weight
        level = saturation
        # Set to the demand exactly, so float error cannot keep a satisfied member in.
        shares[claimant.key] = claimant.demand
        satisfied = index + 1
    for _, _, claimant, weight in unsatisfied[satisfied:]:
        shares[claimant.key] += level * weight
    return amount


class QueueTree:
    """The queue hierarchy with subtree usage sums (memoised); broken ancestries are set apart.

    Treat the queues and usage it was built from as frozen while it is in use. The sums are kept
    per queue, and a tree for other usage (`with_usage`) keeps those of the queues under which
    no usage moved: the accounting's next view sums again only the paths of the queues a change
    reached (the same additions in the same order, so the same floats).
    """

    def __init__(self, queues: Sequence[QueueSpec], usage: Mapping[str, QueueUsage]) -> None:
        self.specs: dict[str, QueueSpec] = {}
        for spec in queues:
            self.specs.setdefault(spec.name, spec)
        self.broken: dict[str, str] = broken_ancestries(self.specs)
        self.children: dict[str | None, list[str]] = {}
        for name, spec in self.specs.items():
            if name not in self.broken:
                self.children.setdefault(spec.parent, []).append(name)
        self.usage = usage
        # queue -> (kind, resource) -> the sum over its subtree
        self._sums: dict[str, dict[tuple[str, str], float]] = {}

    def with_usage(self, usage: Mapping[str, QueueUsage], moved: Iterable[str] | None = None) -> QueueTree:
        """The same queues (specs, broken ancestries, children shared) with other usage: what a
        planner's fork asks after each hypothetical move, or the accounting's next view, without
        judging the ancestries again.

        `moved`: the queues whose usage may differ from this tree's (None: any). The subtree sums
        of every other queue with none of them below it are kept (shared: both trees would find
        the same numbers)."""
        tree = QueueTree.__new__(QueueTree)
        tree.specs, tree.broken, tree.children = self.specs, self.broken, self.children
        tree.usage = usage
        tree._sums = {}
        if moved is not None and self._sums:
            tree._sums = dict(self._sums)
            for name in moved:
                tree._sums.pop(name, None)
                if name in self.specs and name not in self.broken:  # (a broken queue is in no subtree)
                    for ancestor in self.path_to_root(name)[1:]:
                        tree._sums.pop(ancestor, None)
        return tree

    def own(self, name: str) -> QueueUsage:
        return self.usage.get(name, _NO_USAGE)

    def subtree(
        self, name: str, kind: Literal["allocated", "requested", "non_preemptible"], resource: str
    ) -> float:
        """Sum of allocated, requested or non-preemptible allocated amounts over a queue and its
        descendants.

        Summed children first with a stack of its own, not by recursion, so a chain of any depth
        is summed (Python's stack held ~500 levels); each sum is the queue's own amount plus its
        children's sums, added in the children's order, the floats of any earlier version."""
        key = (kind, resource)
        sums = self._sums.setdefault(name, {})
        if key in sums:
            return sums[key]
        pending: list[tuple[str, bool]] = [(name, False)]  # (queue, its children already summed)
        while pending:
            queue, children_summed = pending.pop()
            queue_sums = self._sums.setdefault(queue, {})
            if key in queue_sums:
                continue
            children = self.children.get(queue, ())
            if not children_summed:
                pending.append((queue, True))
                pending.extend((child, False) for child in children)
                continue
            own_usage = self.own(queue)
            amounts = (
                own_usage.allocated
                if kind == "allocated"
                else own_usage.requested
                if kind == "requested"
                else own_usage.non_preemptible
            )
            own = amounts.get(resource, 0.0)
            queue_sums[key] = own + sum(self._sums[child][key] for child in children)
        return sums[key]

    def top_down(self) -> list[str]:
        """The queues of sound ancestry from the roots down, level by level: every parent comes
        before its children (reversed, every child before its parent)."""
        order: list[str] = []
        level = self.children.get(None, [])
        while level:
            order.extend(level)
            level = [child for name in level for child in self.children.get(name, ())]
        return order

    def path_to_root(self, name: str) -> list[str]:
        """The queue itself, then its parent, up to its root."""
        path = [name]
        parent = self.specs[name].parent
        while parent is not None:
            path.append(parent)
            parent = self.specs[parent].parent
        return path


def broken_ancestries(specs: Mapping[str, QueueSpec]) -> dict[str, str]:
    """Queues whose parent chain does not end at a root, with the reason. O(queues): a chain stops
    at the first queue already judged."""
    broken: dict[str, str] = {}
    sound: set[str] = set()
    for name in specs:
        if name in broken or name in sound:
            continue
        seen = [name]
        on_path = {name}
        parent = specs[name].parent
        reason = ""
        while parent is not None and parent not in sound:
            if parent in broken:
                reason = broken[parent]
                break
            if parent not in specs:
                reason = f"parent queue '{parent}' of '{seen[-1]}' does not exist"
                break
            if parent in on_path:
                ring = seen[seen.index(parent) :]
                for at, member in enumerate(ring):  # each member names the cycle from itself
                    cycle = " -> ".join([*ring[at:], *ring[:at], member])
                    broken[member] = f"parents form a cycle: {cycle}"
                seen = seen[: len(seen) - len(ring)]
                reason = broken[parent]
                break
            seen.append(parent)
            on_path.add(parent)
            parent = specs[parent].parent
        if reason:
            broken.update(dict.fromkeys(seen, reason))
        else:
            sound.update(seen)
    return broken


class _Division:
    """One resource's fair shares over a tree, with what they were divided from: each queue's own
    amount (allocated plus requested), its capped demand, and its share.

    `update` takes new own amounts of some queues and redoes only what they reach: the demands up
    their paths (stopping where a demand comes out as it was), then - from the roots down - the
    divisions whose inputs changed (a child's demand, the parent's own amount, or the parent's
    share), descending only into children whose share changed. A division is a function of its
    inputs, so the shares are those of a division of the whole tree, to the bit. A new pending
    pod in a cluster whose pools are not all claimed changes one path (about 3 divisions of ~10
    siblings in a tree of 1000 queues); where a pool is contended, a change reaches every queue
    below it, as it must."""

    def __init__(
        self, tree: QueueTree, resource: str, pool: float, adjustment: WeightAdjustment | None
    ) -> None:
        self.tree, self.resource, self.pool = tree, resource, pool
        self.adjustment = adjustment
        children = tree.children
        self.order = tree.top_down()
        self.position = {name: index for index, name in enumerate(self.order)}
        # Per parent, what its division takes of each child's spec (key, quota, weight,
        # priority): all but the demand, the same at every division.
        self._terms: dict[str | None, list[tuple[str, float, float, int]]] = {}
        usages = tree.usage
        self.own = {name: _own(usages.get(name), resource) for name in self.order}
        # Demand bottom-up: a queue's own plus its children's, capped at its limit.
        self.demand: dict[str, float] = {}
        for name in reversed(self.order):
            self.demand[name] = self._capped(name)
        # Shares top-down: each parent divides its share among its children (and its own pods).
        self.shares: dict[str, float] = {}
        for parent in (None, *self.order):
            if parent is None or parent in children:  # a leaf divides nothing
                self._divide_at(parent)

    def _capped(self, name: str) -> float:
        total = self.own[name] + sum(self.demand[child] for child in self.tree.children.get(name, ()))
        return max(0.0, min(total, self.tree.specs[name].limit.get(self.resource, float("inf"))))

    def _divide_at(self, parent: str | None) -> list[str]:
        """Divide `parent`'s share (the pool, for the roots); the children whose share changed."""
        terms = self._terms.get(parent)
        if terms is None:
            specs, resource, adjustment = self.tree.specs, self.resource, self.adjustment
            terms = self._terms[parent] = [
                (
                    child,
                    max(0.0, spec.quota.get(resource, 0.0)),
                    weight if adjustment is None else adjustment.weight(child, resource, weight),
                    spec.priority,
                )
                for child in self.tree.children.get(parent, ())
                for spec in (specs[child],)
                for weight in (spec.over_quota_weight.get(resource, 1.0),)
            ]
        demand = self.demand
        members = [
            _Claimant(key, quota, weight, priority, demand[key]) for key, quota, weight, priority in terms
        ]
        if parent is not None and self.own[parent] > 0:
            # The parent's own pods; queue names are unique, so its name cannot clash with a child's.
            members.append(_Claimant(key=parent, quota=0.0, weight=1.0, priority=0, demand=self.own[parent]))
        changed = []
        shares = self.shares
        for key, share in _divide(self.pool if parent is None else shares[parent], members).items():
            if key != parent and shares.get(key) != share:
                shares[key] = share
                changed.append(key)
        return changed

    def update(self, own: Mapping[str, float]) -> list[str]:
        """New own amounts of some queues (others as they were); the queues whose share changed."""
        specs, children = self.tree.specs, self.tree.children
        dirty: set[str | None] = set()  # divisions to redo: parents (None: the roots')
        for name, amount in own.items():
            if name not in self.own or self.own[name] == amount:
                continue  # not in the tree (broken ancestry, unknown), or unchanged
            self.own[name] = amount
            if name in children:
                dirty.add(name)  # its own pods are a member of its division
            queue: str | None = name
            while queue is not None:
                demand = self._capped(queue)
                if demand == self.demand[queue]:
                    break  # nothing above it changes
                self.demand[queue] = demand
                queue = specs[queue].parent
                dirty.add(queue)
        # The divisions to redo, from the roots down (by position in `order`, the roots' as -1):
        # a heap, so an update costs what it redoes, not a pass over the tree.
        position = self.position
        to_redo = [-1 if parent is None else position[parent] for parent in dirty]
        heapify(to_redo)
        moved: list[str] = []
        while to_redo:
            at = heappop(to_redo)
            changed = self._divide_at(None if at < 0 else self.order[at])
            moved.extend(changed)
            for child in changed:
                if child in children and child not in dirty:
                    dirty.add(child)
                    heappush(to_redo, position[child])
        return moved


def _own(usage: QueueUsage | None, resource: str) -> float:
    """What a queue's own pods hold and wait for."""
    return (
        usage.allocated.get(resource, 0.0) + usage.requested.get(resource, 0.0) if usage is not None else 0.0
    )


class FairShares:
    """Fair shares of every queue (parents included: their whole subtree) for every resource in
    the inputs' capacity, kept up to date as queues' usage changes (`update`): the same numbers as
    dividing the whole tree again (`compute_fair_shares`), for the cost of what the change reaches.
    Inputs of another `version` (queues, capacity, weight adjustment) need new `FairShares`.

    `shares` is never changed in place: an update makes a new outer mapping, sharing the inner
    mappings of queues whose shares stayed (so views built on an earlier one keep theirs)."""

    def __init__(self, inputs: FairShareInputs) -> None:
        self.version = inputs.version  # what `update` keeps as it was
        # The queues' structure, kept; its usage is the one the divisions started from.
        self.tree = tree = QueueTree(inputs.queues, inputs.usage)
        self._queues = tree.specs
        self._divisions = {
            resource: _Division(tree, resource, pool, inputs.weight_adjustment)
            for resource, pool in inputs.capacity.items()
        }
        self.shares: Mapping[str, Mapping[str, float]] = {
            name: {r: division.shares.get(name, 0.0) for r, division in self._divisions.items()}
            for name in tree.specs
        }

    def update(self, usage: Mapping[str, QueueUsage], queues: Iterable[str]) -> None:
        """`queues`' usage is now that of `usage` (every other queue's as it was)."""
        queues = [name for name in queues if name in self._queues]
        moved: set[str] = set()
        for resource, division in self._divisions.items():
            moved.update(division.update({name: _own(usage.get(name), resource) for name in queues}))
        if moved:
            shares = dict(self.shares)
            for name in moved:
                shares[name] = {r: division.shares.get(name, 0.0) for r, division in self._divisions.items()}
            self.shares = shares


def compute_fair_shares(inputs: FairShareInputs) -> dict[str, dict[str, float]]:
    """Fair share of every queue (parents included: their whole subtree) for every resource in capacity."""
    return {name: dict(shares) for name, shares in FairShares(inputs).shares.items()}


def dominant_share(allocated: Iterable[tuple[str, float]], capacity: Resources) -> float:
    """Largest fraction of any resource in play (positive capacity) that the amounts take."""
    return max((amount / capacity[r] for r, amount in allocated if capacity.get(r, 0.0) > 0), default=0.0)


def drf_order(
    queues: Sequence[QueueSpec],
    usage: Mapping[str, QueueUsage],
    fair_shares: Mapping[str, Mapping[str, float]],
    capacity: Resources,
    *,
    tree: QueueTree | None = None,
) -> list[str]:
    """Every queue, most deserving first.

    Queues below their fair share in some resource they wait for come first; then higher
    priority; then lower dominant share (DRF over the resources in ``capacity``); then name.
    Usage is counted over the subtree, so a parent orders by what its whole subtree holds.
    ``tree``: a QueueTree of the same queues and usage, reused across calls to save rebuilding it.
    """
    tree = tree or QueueTree(queues, usage)

    def sort_key(name: str) -> tuple[int, int, float, str]:
        allocated = [(r, tree.subtree(name, "allocated", r)) for r in capacity]
        below = any(
            tree.subtree(name, "requested", r) > EPSILON
            and amount < fair_shares.get(name, {}).get(r, 0.0) - EPSILON
            for r, amount in allocated
        )
        return (0 if below else 1, -tree.specs[name].priority, dominant_share(allocated, capacity), name)

    return sorted(tree.specs, key=sort_key)


@dataclass(frozen=True)
class FairnessSnapshot:
    """Queues, their usage, the capacity and the fair shares at one moment; the queue tree (and
    its subtree sums) is built once, on first use, and shared by every question asked of it.

    ``build`` computes the fair shares; constructing one directly takes them as given (tests,
    and forks whose hypothetical moves leave every queue's demand, hence its share, unchanged).
    """

    specs: Sequence[QueueSpec]
    usage: Mapping[str, QueueUsage]
    capacity: Resources
    fair_shares: Mapping[str, Mapping[str, float]]
    # The tree of these queues and usage when the caller has one (a fork's, the accounting's
    # kept one), else built on first use.
    known_tree: QueueTree | None = field(default=None, compare=False, repr=False)

    @classmethod
    def build(
        cls, specs: Sequence[QueueSpec], usage: Mapping[str, QueueUsage], capacity: Resources
    ) -> FairnessSnapshot:
        specs = tuple(specs)
        return cls(specs, usage, capacity, compute_fair_shares(FairShareInputs(specs, usage, capacity)))

    @cached_property
    def tree(self) -> QueueTree:
        return self.known_tree if self.known_tree is not None else QueueTree(self.specs, self.usage)

    def with_usage(self, usage: Mapping[str, QueueUsage]) -> FairnessSnapshot:
        """The same queues, capacity and fair shares with other usage (a fork's hypothetical
        moves), its tree sharing this one's structure."""
        return FairnessSnapshot(
            self.specs, usage, self.capacity, self.fair_shares, known_tree=self.tree.with_usage(usage)
        )

    def order(self) -> list[str]:
        """Every queue, most deserving first (see ``drf_order``)."""
        return drf_order(self.specs, self.usage, self.fair_shares, self.capacity, tree=self.tree)

    def admit(self, queue: str, request: Resources, *, preemptible: bool = True) -> AdmissionDecision:
        """May a pod of ``queue`` asking for ``request`` be placed now? (work-conserving)

        Refused only when the queue is unusable (unknown, broken ancestry, or not a leaf), when it
        would take the queue or an ancestor past a ``limit``, or - for a pod that is not
        preemptible - the non-preemptible use of the queue or an ancestor past its ``quota``: use
        beyond quota is for pods that reclaim and preemption can take back. Fair shares refuse
        nothing here; reclaim restores them.
        """
        tree = self.tree
        if queue not in tree.specs:
            return AdmissionDecision(False, f"queue '{queue}' does not exist", "unknown_queue")
        if queue in tree.broken:
            return AdmissionDecision(
                False, f"queue '{queue}' is not usable: {tree.broken[queue]}", "invalid_queue"
            )
        children = tree.children.get(queue)
        if children:
            return AdmissionDecision(
                False,
                f"queue '{queue}' has child queues ({', '.join(sorted(children))}): pods go to a leaf queue",
                "not_leaf",
            )
        wanted = {r: amount for r, amount in request.items() if amount > 0}
        for node in tree.path_to_root(queue):
            spec = tree.specs[node]
            owner = "its {}" if node == queue else f"the {{}} of ancestor queue '{node}'"
            for resource, amount in wanted.items():
                held = tree.subtree(node, "allocated", resource)
                limit = spec.limit.get(resource)
                if limit is not None and held + amount > limit + EPSILON:
                    return AdmissionDecision(
                        False,
                        _exceeds(queue, resource, held, amount, owner.format("limit"), limit),
                        "over_limit",
                    )
                if preemptible or not _quota_guards(spec, resource):
                    continue
                # A quota guarantees non-preemptible work: the queue's preemptible pods beyond
                # it can be preempted to make room, so only non-preemptible use counts here.
                guaranteed = tree.subtree(node, "non_preemptible", resource)
                quota = spec.quota.get(resource, 0.0)
                if guaranteed + amount > quota + EPSILON:
                    return AdmissionDecision(
                        False,
                        _exceeds(
                            queue,
                            resource,
                            guaranteed,
                            amount,
                            owner.format("quota"),
                            quota,
                            "non-preemptible ",
                        )
                        + "; only preemptible pods may use more than the quota",
                        "over_quota",
                    )
        borrowing = [
            resource
            for resource, amount in wanted.items()
            if resource in self.capacity
            and tree.subtree(queue, "allocated", resource) + amount
            > self.fair_shares.get(queue, {}).get(resource, 0.0) + EPSILON
        ]
        if borrowing:
            why = (
                "(preemptible: reclaim may take it back)"
                if preemptible
                else "(not preemptible: within its quota for non-preemptible pods)"
            )
            return AdmissionDecision(
                True,
                f"queue '{queue}' borrows idle {', '.join(borrowing)} beyond its fair share {why}",
                "borrowing",
            )
        return AdmissionDecision(
            True, f"queue '{queue}' is within its limits and fair share", "within_fair_share"
        )


def _exceeds(
    queue: str, resource: str, held: float, amount: float, what: str, bound: float, counted: str = ""
) -> str:
    return (
        f"queue '{queue}': {resource} {counted}allocated {format_amount(resource, held)} + request "
        f"{format_amount(resource, amount)} would exceed {what} ({format_amount(resource, bound)})"
    )


def has_quota(spec: QueueSpec, resource: str) -> bool:
    """Whether holding more than `resource`'s quota is borrowing: where the admin set a quota,
    and for GPUs ("gpu") always - an unset GPU quota guarantees none (admission counts it as 0).
    A GPU model's amount (gpu/<model>, counted beside "gpu" for every GPU held) or cpu without a
    quota of its own is not borrowed: a queue within its GPU quota is not borrowing."""
    return resource == "gpu" or resource in spec.quota


def _quota_guards(spec: QueueSpec, resource: str) -> bool:
    """Does the quota rule for non-preemptible pods apply to ``resource`` in this queue?

    GPUs always (a missing GPU quota is 0: a queue without one guarantees no GPU); cpu and memory
    only where the queue declares a quota for them, so a GPU team's pods are not refused for cpu.
    """
    return resource == "gpu" or resource.startswith(GPU_MODEL_PREFIX) or resource in spec.quota
