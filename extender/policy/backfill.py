"""Gangs that come later start around the oldest waiting gang, not on the nodes it waits for. Pure.

kube-scheduler tries pods in its own order - priority, then creation - and a gang is admitted
whole the moment all its missing members fit (`extender.verbs.admit_gang`). A large gang that
does not fit yet waits; a smaller one that came after it fits and starts; GPUs that free while
it runs go to the next small gang that fits, and the large one waits on. Strictly in order (no
gang starts while an older one waits) ends that, but idles whatever the oldest gang cannot use.

The rule (backfill with a reservation, as EASY backfill does without run-time estimates): the
**head** of a gang is the first gang before it in the scheduler's order that waits - not admitted
yet, its pods tried and not placed, its queue admitting it whole - and has waited at least the
bound (`gang_ahead`); the nodes it would fill once their pods end are **held back** for it
(`held_back`), and the gang is planned on the other nodes only (`backfill_supplies`). The head
itself plans on every node. Pods alone and members of admitted gangs are not held back: a gang
admitted already keeps its reservation, and what pods alone take is reclaim's and deference's
business.

The nodes held back: taken by most free GPUs first (then name) until they hold all the head's
missing members once empty, so what the head waits for is as little as the free GPUs allow.
Where its ask keeps it in domains (its required level's, else its preferred level's), the
domains of most free GPUs come first, and their nodes by most free; with a required level all
lie in the freest domain that holds the gang once empty. A head that no set of emptied nodes
holds (larger than the cluster, or than every domain of its required level) holds nothing back:
it could never start there.

Off by default (`DEFAULT_HOLD_BACK_AFTER_S`): measured on the simulator's mixed gangs it lowers
the worst seed's wait p95 with a preferred rack over without, but not to the 10% target, and it
lengthens mean waits (docs/workloads.md, "Gangs that come later").

Worked example (tests/unit/extender/test_backfill.py): nodes a, b, c, d of 4 GPUs with 3, 2, 1
and 0 free; the head needs 8 GPUs (2 members of 4). The freest first: a (room for 1 member once
empty), then b (2): a and b are held back. A gang of 2 one-GPU members after it plans on c and d
(1 free): it waits, where without the rule it took c's and one of b's and pushed the head back;
a single one-GPU member still fits on c.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

from contract.names import GPU_MILLI
from extender.policy.placement import DomainMap, GpuDemand, NodeGpus
from extender.policy.workloads import plan_gang

# How long the first waiting gang waits before the nodes it needs are held back from later gangs
# (the extender's `--gang-hold-back-after`): off by default, since no bound measured met the
# topology wait target without clearly longer waits (docs/workloads.md, "Gangs that come later").
DEFAULT_HOLD_BACK_AFTER_S: float | None = None

GangOrder = tuple[int, float, str]  # the scheduler's: (-priority, created, workload)


@dataclass(frozen=True)
class WaitingGang:
    """A gang not admitted yet, with all its members created, as the rule reads it."""

    workload: str
    order: GangOrder  # its place in the scheduler's order (created: its oldest member's)
    demand: GpuDemand  # one missing member's GPUs
    missing: int  # members it misses to reach its minimum
    # Where its ask keeps it: node -> its domain at its required level, else its preferred level.
    domains: DomainMap = field(default_factory=dict, compare=False)
    one_domain: bool = False  # `domains` are a required level's: all members inside one

    @property
    def since(self) -> float:
        """When it began to wait (its oldest member's creation, seconds)."""
        return self.order[1]


def gang_ahead(
    waiting: Iterable[WaitingGang], workload: str, order: GangOrder, now: float, after_s: float
) -> WaitingGang | None:
    """The head the gang `workload` at `order` is planned around: the first of `waiting` before
    it in the scheduler's order that has waited `after_s` or longer at `now` (None: none; a gang
    is never its own head)."""
    for gang in sorted(waiting, key=attrgetter("order")):
        if gang.order >= order:
            return None
        if gang.workload != workload and now - gang.since >= after_s:
            return gang
    return None


def _free_gpus(node: NodeGpus) -> int:
    return sum(node.free_milli) // GPU_MILLI


def _empty(node: NodeGpus) -> NodeGpus:
    """The node with all its GPUs free (its CPU and memory untracked: they free with the pods)."""
    return replace(node, free_milli=(GPU_MILLI,) * len(node.free_milli), host_tracked=False)


def held_back(head: WaitingGang, supplies: Sequence[NodeGpus]) -> frozenset[str]:
    """The nodes kept for `head` (see the module docstring): by domain of most free GPUs, then
    node of most free GPUs (then name), as many as hold its missing members once empty; none
    when no such set exists."""
    room: dict[tuple[str, int], int] = {}  # (GPU model, GPUs) -> members an emptied node holds

    def holds(node: NodeGpus) -> int:
        kind = (node.model, len(node.free_milli))
        if kind not in room:
            room[kind] = len(plan_gang([_empty(node)], head.demand, head.missing))
        return room[kind]

    by_domain: dict[str | None, list[NodeGpus]] = defaultdict(list)
    for node in supplies:
        domain = head.domains.get(node.name)
        if domain is not None or not head.one_domain:
            by_domain[domain].append(node)
    for nodes in by_domain.values():
        nodes.sort(key=lambda n: (-_free_gpus(n), n.name))
    domain_free = {domain: sum(map(_free_gpus, nodes)) for domain, nodes in by_domain.items()}
    ranked = sorted(by_domain, key=lambda d: (-domain_free[d], d or ""))
    if head.one_domain:  # the freest domain that holds it once empty
        groups = [by_domain[d] for d in ranked if sum(map(holds, by_domain[d])) >= head.missing][:1]
    else:
        groups = [[node for d in ranked for node in by_domain[d]]]
    for nodes in groups:
        kept: list[str] = []
        held = 0
        for node in nodes:
            kept.append(node.name)
            held += holds(node)
            if held >= head.missing:
                return frozenset(kept)
    return frozenset()


def backfill_supplies(supplies: Iterable[NodeGpus], kept: frozenset[str]) -> list[NodeGpus]:
    """The supplies a gang after the head is planned on: all but the nodes `kept` for the head."""
    return [node for node in supplies if node.name not in kept]
