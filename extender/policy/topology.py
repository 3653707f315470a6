"""Topology-aware gangs: levels of node labels, a workload's ask, and the domain its gang goes to.

**Levels** are defined once for the cluster (the extender's `--topology-levels`, the chart's
`extender.topologyLevels`), outermost first, each a short name and the node label whose value
names a domain of that level: `zone=topology.kubernetes.io/zone,clique=nvidia.com/gpu.clique,
host=kubernetes.io/hostname` by default (the well-known zone and hostname labels, and the NVLink
clique label NVIDIA's GPU feature discovery puts on nodes). A domain is named by its path from
the outermost level (`b1/r2`: rack r2 of block b1), so rack names may repeat across blocks; a
node without the level's label is in no domain of it, and never hosts a gang that requires it.

**Asks**: a workload may *require* a level (all its members inside one domain of it) and *prefer*
one (soft: its members packed into as few domains of it as the required domain allows). They are
read from the pod (its template: every member carries the same), the annotations
`scheduling.tessera.dev/topology-required` / `topology-preferred` naming a level by its name or
its label, and from the workload's PodGroup (`spec.schedulingConstraints.topology[0].key`, a node
label: Kubernetes 1.37's topology-aware workload scheduling), so one manifest works both ways; the
annotation wins. An unknown level is refused at the pod webhook (`ask_refusal`).

**Placement** (`plan_in_domain`), at the gang's admission: among the domains of the required level
that hold all its missing members, the one with the least room left (bin-packing: the emptiest
domains stay whole for larger gangs); inside it, with a preferred level, the sub-domain of least
room that holds them all, else sub-domains by most room first, so most members land together.
No required level: the whole cluster is the one domain. When no domain holds them the plan says
the largest room found, and the gang waits with it ("needs 16 GPUs in one rack; largest rack
has 12 free"), unless no domain of the level has that many GPUs even all free: then waiting
would never end, and it is told it cannot start as asked (`never_held_text`).

**Parts** (subgroups) whose templates ask different levels, or whose members differ in shape (a
CPU-only leader, 8-GPU workers), are planned part by part (`plan_parts`): the parts with a level
inside one domain of the widest of their levels, each part in the tightest domain of its own
level with its own shape, narrowest first; a part without GPUs holds no node.

**Ranking** (`fullest_first`), at prioritize, for a member of a workload with an ask (placed pod
by pod: a reserved gang's members, elastic members, members after a reservation ended): the
candidates' domains at each asked level, the one already holding most of the workload's members
(placed, or GPUs held for them) first; among equals, those whose room holds all its members still
to place, least room first (the tightest that fits, as admission packs), then the others by most
room. So a member goes where its gang is, and a gang with no member yet fills one domain first.

Worked example (racks r1: 2 nodes x 4 free GPUs, r2: 1 node x 4 free; a gang of 4 one-GPU
members requiring a rack): both racks hold 4; r2 has 4 free, r1 8: r2 is chosen, r1 stays whole
for a gang of 8. A gang of 6: only r1 holds it. A gang of 10: none; largest rack has 8 free.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter, eq
from typing import Any

from contract.kube import mapping, meta, sequence
from contract.names import GPU_MILLI, TOPOLOGY_PREFERRED_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION
from extender.memo import ShapeMemo
from extender.policy.placement import (
    MAX_NODE_SCORE,
    NO_DOMAINS,
    DomainMap,
    GpuDemand,
    NodeGpus,
    WorkloadMix,
)
from extender.policy.snapshot import occupy
from extender.policy.workloads import plan_gang


@dataclass(frozen=True)
class Level:
    name: str  # what asks and reasons say ("rack")
    label: str  # the node label whose value names the domain


@dataclass(frozen=True)
class Topology:
    """The cluster's levels, outermost first."""

    levels: tuple[Level, ...]

    def level(self, name_or_label: str) -> Level | None:
        """The level an ask names, by its name or by its node label."""
        return next((lv for lv in self.levels if name_or_label in (lv.name, lv.label)), None)

    def names(self) -> str:
        return ", ".join(level.name for level in self.levels) or "none"

    def domain_of(self, labels: Mapping[str, Any], level: Level) -> str | None:
        """The node's domain at `level`: its path of label values from the outermost level down
        (levels above it the node lacks are skipped); None when it lacks the level's label."""
        path: list[str] = []
        for outer in self.levels:
            value = labels.get(outer.label)
            if isinstance(value, str) and value:
                path.append(value)
            elif outer == level:
                return None
            if outer == level:
                return "/".join(path)
        return None


DEFAULT_TOPOLOGY = Topology(
    (
        Level("zone", "topology.kubernetes.io/zone"),
        Level("clique", "nvidia.com/gpu.clique"),
        Level("host", "kubernetes.io/hostname"),
    )
)


def parse_topology(text: str) -> Topology:
    """`name=label,...` outermost first (a bare label names itself by its last path part).
    Raises ValueError on a repeated name or label, or an empty entry."""
    levels: list[Level] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            raise ValueError(f"empty level in {text!r}")
        name, sep, label = entry.partition("=")
        if not sep:
            name, label = entry.rsplit("/", 1)[-1], entry
        name, label = name.strip(), label.strip()
        if not name or not label:
            raise ValueError(f"level {entry!r}: want name=label")
        if any(name == lv.name or label == lv.label for lv in levels):
            raise ValueError(f"level {entry!r} repeats a name or label")
        levels.append(Level(name, label))
    return Topology(tuple(levels))


@dataclass(frozen=True)
class TopologyAsk:
    """A workload's levels by name ("": none)."""

    required: str = ""
    preferred: str = ""

    @property
    def any(self) -> bool:
        return bool(self.required or self.preferred)


NO_ASK = TopologyAsk()


def podgroup_topology_key(group: Mapping[str, Any] | None) -> str:
    """The node label a PodGroup's scheduling constraints keep its pods within ("": none)."""
    if not group:
        return ""
    constraints = mapping(mapping(group.get("spec")).get("schedulingConstraints"))
    for constraint in sequence(constraints.get("topology")):
        key = mapping(constraint).get("key")
        if isinstance(key, str) and key:
            return key
    return ""


def stated_ask(pod: Mapping[str, Any], group: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """The (required, preferred) levels as written: the pod's annotations, the PodGroup's
    topology key for a required level the annotation leaves unsaid."""
    annotations = mapping(meta(pod).get("annotations"))
    required = annotations.get(TOPOLOGY_REQUIRED_ANNOTATION)
    preferred = annotations.get(TOPOLOGY_PREFERRED_ANNOTATION)
    required = required.strip() if isinstance(required, str) else ""
    preferred = preferred.strip() if isinstance(preferred, str) else ""
    return required or podgroup_topology_key(group), preferred


def ask_refusal(topology: Topology, pod: Mapping[str, Any], group: Mapping[str, Any] | None = None) -> str:
    """Why the pod's topology ask cannot be served ('' when it can, or it asks none): a level
    the cluster does not define, or a preferred level not inside the required one."""
    required, preferred = stated_ask(pod, group)
    for which, asked in (("required", required), ("preferred", preferred)):
        if asked and topology.level(asked) is None:
            return (
                f"topology level {asked!r} ({which}) is not one of the cluster's levels: {topology.names()}"
            )
    if required and preferred:
        outer, inner = topology.level(required), topology.level(preferred)
        if (
            outer is not None
            and inner is not None
            and topology.levels.index(inner) < topology.levels.index(outer)
        ):
            return f"preferred topology level {inner.name!r} is wider than the required level {outer.name!r}"
    return ""


def read_ask(
    topology: Topology, pod: Mapping[str, Any], group: Mapping[str, Any] | None = None
) -> TopologyAsk:
    """The ask by level names; a level the cluster does not define is dropped (the webhook
    refuses such pods; one that slipped past is placed as if it asked nothing of it)."""
    required, preferred = stated_ask(pod, group)
    outer, inner = topology.level(required), topology.level(preferred)
    return TopologyAsk(outer.name if outer else "", inner.name if inner else "")


@dataclass(frozen=True)
class DomainPlan:
    """Where a gang's missing members go: the required level's domain ("" without one) and a
    node per member; or, when no domain holds them, `nodes` empty and the largest room found."""

    domain: str
    nodes: list[str]
    largest_fit: int = 0  # members the roomiest domain holds
    largest_free: int = 0  # whole GPUs free in it


_SHAPE = attrgetter("shape")
_NAME = attrgetter("name")


def _free_gpus(node: NodeGpus) -> int:
    return sum(node.free_milli) // GPU_MILLI


# Each node shape's room for (demand, count), kept across calls by the caller that passes it
# (`plan_in_domain`'s `memo`): the node's own answer, the same in every call.
RoomMemo = ShapeMemo[tuple[GpuDemand, int], tuple[int, int]]


class _Room:
    """Each node's room (members of `demand` it takes, up to `count`; whole GPUs free), memoised
    by shape: it is the node's own answer, the same in every domain, so thousands of nodes cost
    a few placements and a lookup each (across calls too, with a `memo`)."""

    def __init__(self, demand: GpuDemand, count: int, memo: RoomMemo | None = None) -> None:
        self.demand, self.count, self._memo = demand, count, memo
        self._by_shape = memo.table((demand, count)) if memo is not None else {}

    def of(self, node: NodeGpus) -> tuple[int, int]:
        room = self._by_shape.get(node.shape)
        if room is None:
            room = (len(plan_gang([node], self.demand, self.count)), _free_gpus(node))
            if self._memo is not None:
                self._memo.put(self._by_shape, node.shape, room)
            else:
                self._by_shape[node.shape] = room
        return room

    def total(self, nodes: Sequence[NodeGpus]) -> tuple[int, int]:
        rooms = [self.of(node) for node in nodes]
        return min(sum(fit for fit, _ in rooms), self.count), sum(free for _, free in rooms)


def _group(supplies: Sequence[NodeGpus], domains: DomainMap) -> dict[str, list[NodeGpus]]:
    grouped: dict[str, list[NodeGpus]] = defaultdict(list)
    for node in supplies:
        domain = domains.get(node.name)
        if domain is not None:
            grouped[domain].append(node)
    return grouped


def _tightest(supplies: Sequence[NodeGpus], domains: DomainMap, room: _Room) -> tuple[str | None, int, int]:
    """The domain of least room (free GPUs, then name) that holds all `room.count` members; else
    None, with the members and free GPUs of the domain that holds most. Nodes are counted by
    (domain, shape) in C - thousands of nodes, a few shapes per domain - and each pair's room is
    its shape's times its count."""
    shapes = list(map(_SHAPE, supplies))
    one_of = dict(zip(shapes, supplies, strict=True))
    counted = Counter(zip(map(domains.get, map(_NAME, supplies)), shapes, strict=True))
    rooms = {shape: room.of(node) for shape, node in one_of.items()}
    fits: dict[str, int] = defaultdict(int)
    frees: dict[str, int] = defaultdict(int)
    for (domain, shape), nodes in counted.items():
        if domain is not None:
            fit, free = rooms[shape]
            fits[domain] += fit * nodes
            frees[domain] += free * nodes
    holding = [(frees[domain], domain) for domain, fit in fits.items() if fit >= room.count]
    if holding:
        return min(holding)[1], 0, 0
    largest = max(((min(fit, room.count), frees[domain]) for domain, fit in fits.items()), default=(0, 0))
    return None, *largest


def _packed(nodes: Sequence[NodeGpus], room: _Room, preferred: DomainMap) -> list[str]:
    """Nodes for the members inside one required domain, packed by the preferred level: the
    tightest sub-domain that holds them all, else sub-domains of most room first."""
    demand, count = room.demand, room.count
    if not preferred:
        return plan_gang(nodes, demand, count)
    domain, _, _ = _tightest(nodes, preferred, room)
    grouped = _group(nodes, preferred)
    if domain is not None:
        return plan_gang(grouped[domain], demand, count)
    chosen: list[str] = []
    for _, members in sorted(((room.total(ns)[1], d), ns) for d, ns in grouped.items())[::-1]:
        chosen.extend(plan_gang(members, demand, count - len(chosen)))
        if len(chosen) == count:
            return chosen
    outside = [node for node in nodes if preferred.get(node.name) is None]  # (no preferred label)
    return chosen + plan_gang(outside, demand, count - len(chosen))


def plan_in_domain(
    supplies: Sequence[NodeGpus],
    demand: GpuDemand,
    count: int,
    required: DomainMap | None,
    preferred: DomainMap = NO_DOMAINS,
    memo: RoomMemo | None = None,
) -> DomainPlan:
    """Nodes for `count` members of one GPU shape within one domain of the required level
    (`required`: node -> its domain; None: no required level, the cluster is one domain).
    `memo`: each node shape's room, kept by the caller across calls."""
    room = _Room(demand, count, memo)
    if required is None:  # the cluster is one domain
        domain: str | None = ""
        largest_fit, largest_free = room.total(supplies)
        if largest_fit < count:
            domain = None
    else:
        domain, largest_fit, largest_free = _tightest(supplies, required, room)
    if domain is None:
        return DomainPlan("", [], largest_fit, largest_free)
    inside = (
        supplies
        if required is None
        else list(compress(supplies, map(eq, map(required.get, map(_NAME, supplies)), repeat(domain))))
    )  # (selected in C: thousands of nodes)
    return DomainPlan(domain, _packed(inside, room, preferred))


class DomainChoices:
    """The last plan per key, kept across calls: `plan_in_domain` is a function of its inputs
    alone, so a call with the same key and equal supplies gets the plan the last one made. The
    key is the caller's and says all the plan reads besides the supplies: the shape and count
    asked, which level maps and the version they were read at (maps change in place).

    Supplies are compared as lists: a node whose supply did not change is the very object the
    picture handed out last time, so equal lists of thousands of nodes compare by identity, in
    C; a node whose supply changed (a member bound, GPUs held) is a new object and compares by
    value, so a change of free capacity anywhere is a miss. At most `limit` keys are kept, then
    it starts over. Plans handed out are shared: callers copy what they change."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._last: dict[Hashable, tuple[list[NodeGpus], DomainPlan]] = {}

    def plan(self, key: Hashable, supplies: list[NodeGpus], compute: Callable[[], DomainPlan]) -> DomainPlan:
        """The plan for `supplies` under `key`: the last one's when its supplies equal these,
        else `compute()`'s (kept for the next call)."""
        last = self._last.get(key)
        if last is not None and last[0] == supplies:
            return last[1]
        if last is None and len(self._last) >= self.limit:
            self._last.clear()
        plan = compute()
        self._last[key] = (list(supplies), plan)  # (a copy: the caller's list may change)
        return plan


def no_domain_text(level: str, plan: DomainPlan, demand: GpuDemand, count: int) -> str:
    """The wait reason when no domain of `level` holds the gang's missing members."""
    needed = demand.count * count * demand.milli // GPU_MILLI
    gpus = (
        f"{needed} GPUs" if demand.milli == GPU_MILLI else f"{count} pods of {demand.count} x {demand.milli}m"
    )
    return (
        f"needs {gpus} in one {level}; largest {level} has {plan.largest_free} free "
        f"(room for {plan.largest_fit} of its {count} missing pods)"
    )


def domain_sizes(nodes: Iterable[NodeGpus], domains: DomainMap) -> dict[str, int]:
    """Each domain's GPUs in all, free or not (`domains`: node -> its domain; nodes outside
    every domain are left out)."""
    sizes: dict[str, int] = defaultdict(int)
    for node in nodes:
        domain = domains.get(node.name)
        if domain is not None:
            sizes[domain] += len(node.free_milli)
    return dict(sizes)


def never_held_text(level: str, milli: int, sizes: Mapping[str, int]) -> str:
    """Why no domain of `level` can ever hold `milli` thousandths of GPUs, freed or not
    (`sizes`: `domain_sizes`); "" when one could, once enough of its GPUs are free.

    A gang that waits for room would wait forever here: what lets it go is a wider level or
    more GPUs in one domain, and reclaim could free nothing that helps. Racks of 8 and 12 GPUs:
    16 GPUs "needs 16 GPUs in one rack; the largest rack has 12 GPUs in all, so it cannot start
    as asked"; 12 GPUs: "" (r2 holds them once its GPUs are free)."""
    needed = f"{milli // GPU_MILLI} GPUs" if milli % GPU_MILLI == 0 else f"{milli / GPU_MILLI:g} GPUs"
    if not sizes:
        return (
            f"needs {needed} in one {level}; no node with GPUs is in a {level}, so it cannot start as asked"
        )
    largest = max(sizes.values())
    if milli <= largest * GPU_MILLI:
        return ""
    return (
        f"needs {needed} in one {level}; the largest {level} has {largest} GPUs in all, "
        "so it cannot start as asked"
    )


def fullest_first(rooms: Mapping[str, int], members: Mapping[str, int], missing: int) -> dict[str, int]:
    """Each domain's rank for a workload's next member, 0 first (`rooms`: domain -> members of
    its shape the domain's candidates hold; `members`: domain -> its members there; `missing`:
    its members still to place, the asking one among them). Most members first; among equals,
    those that hold all `missing`, least room first; then the others, most room first. Domains
    alike (members, room) share a rank, so the node's own score decides between them.

    r1 holds 6 and 0 members, r2 7 and 1, missing 3: r2 0, r1 1 (members decide). No members,
    r1 6, r2 4: r2 0 (both hold 3, r2 has less room), r1 1. r1 2, r2 1: neither holds 3, r1 0
    (most room), r2 1."""

    def key(domain: str) -> tuple[int, bool, int]:
        room = rooms.get(domain, 0)
        holds_all = room >= missing
        return -members.get(domain, 0), not holds_all, room if holds_all else -room

    keys = {domain: key(domain) for domain in {*rooms, *members}}
    rank_of = {k: rank for rank, k in enumerate(sorted(set(keys.values())))}
    return {domain: rank_of[k] for domain, k in keys.items()}


# The scores of the best domain's nodes (at or above) and of every other node's (below).
_BEST_BAND = MAX_NODE_SCORE // 2


def _spread(
    order: Sequence[tuple[tuple[int, ...], int]], low: int, high: int
) -> dict[tuple[tuple[int, ...], int], int]:
    """high for the first, low for the last, evenly by position between."""
    if len(order) <= 1:
        return dict.fromkeys(order, high)
    last = len(order) - 1
    return {key: low + round((high - low) * (last - i) / last) for i, key in enumerate(order)}


def domain_scores(keys: Mapping[str, tuple[tuple[int, ...], int] | None]) -> dict[str, int]:
    """0..10 per class of nodes from its key: its domains' ranks (`fullest_first`, outermost level
    first) and its own score (0..10, higher better); None: the pod fits none of them (0). Ordered
    by ranks, then own score: at most 11 distinct keys score evenly by position (the order kept
    exactly); more would round whole domains together, so the best domain's keys take 5..10 and
    the others 0..4 - its nodes always above every other's.

    r2 (rank 0) with own scores 10 and 0, r1 (rank 1) with 10 and 0: 10, 7, 3, 0. Twelve racks of
    one kind: the first 10, the other eleven 4 down to 0."""
    order = sorted({key for key in keys.values() if key is not None}, key=lambda key: (key[0], -key[1]))
    if len(order) <= MAX_NODE_SCORE + 1:
        score_of = _spread(order, 0, MAX_NODE_SCORE)
    else:
        best = [key for key in order if key[0] == order[0][0]]
        score_of = _spread(best, _BEST_BAND, MAX_NODE_SCORE) | _spread(order[len(best) :], 0, _BEST_BAND - 1)
    return {name: 0 if key is None else score_of[key] for name, key in keys.items()}


@dataclass(frozen=True)
class PartAsk:
    """One part of a gang as its plan sees it: its missing members, their shape and its own ask."""

    name: str
    count: int  # its missing members
    level: str  # its required level ("": none of its own)
    depth: int  # that level's place among the cluster's levels, outermost 0 (-1: none)
    required: DomainMap | None  # that level's domains (None: no level)
    preferred: DomainMap  # its preferred level's (NO_DOMAINS: none)
    demand: GpuDemand | None  # one member's GPUs (None: none, e.g. a CPU-only leader)

    @property
    def gpus(self) -> int:
        """Whole GPUs its missing members take together."""
        return 0 if self.demand is None else _gpus(self.demand, self.count)


def _gpus(demand: GpuDemand, count: int) -> int:
    return demand.count * count * demand.milli // GPU_MILLI


def never_held_parts_text(
    parts: Sequence[PartAsk], outer: str, sizes_of: Callable[[str], Mapping[str, int]]
) -> str:
    """`never_held_text` of a gang planned part by part (`plan_parts`): the parts with a level
    together in one domain of the widest of them (`outer`), each in one of its own level
    (`sizes_of`: level -> `domain_sizes` of its domains); "" when every ask could be held."""
    stating = [part for part in parts if part.required is not None and part.demand is not None]
    whys = [never_held_text(outer, sum(map(_milli, stating)), sizes_of(outer))] if stating else []
    whys += [
        f"part {part.name}: {why}"
        for part in stating
        if (why := never_held_text(part.level, _milli(part), sizes_of(part.level)))
    ]
    return next(filter(None, whys), "")


def _milli(part: PartAsk) -> int:
    """The thousandths of GPUs a part's missing members take together."""
    return 0 if part.demand is None else part.demand.count * part.count * part.demand.milli


@dataclass(frozen=True)
class PartsPlan:
    """Where each part's missing members go (`nodes`, part after part; "" for a member without
    GPUs) and the domain each part with a level is kept in (part -> (level, domain)); or, when
    they do not all fit, `short` says which part is short and by what (`nodes` empty)."""

    nodes: list[str]
    domains: dict[str, tuple[str, str]]
    by_part: dict[str, list[str]] = field(default_factory=dict)  # part -> its members' nodes
    short: str = ""
    level_short: bool = False  # the short part is short of room in one domain of its level


_NO_MIX = WorkloadMix(demands=())


def plan_parts(
    supplies: Sequence[NodeGpus], parts: Sequence[PartAsk], outer: str, outer_map: DomainMap
) -> PartsPlan:
    """A plan for a gang whose parts ask different levels or differ in shape: each part's members
    inside one domain of its own required level, packed by its preferred one, on nodes that fit
    its own shape; a part stating no level anywhere; a part without GPUs holds no node (with a
    level, it is kept in the domain of the widest level the others are planned in).

    The parts that state a level are kept inside one domain of the widest of them (`outer`, its
    map `outer_map`; "": none states one): its domains that hold them all are tried by least room
    first (bin-packing, as `plan_in_domain`), and in each the parts are planned narrowest level
    first (the hardest to fit), each on what the parts before it left, in the tightest domain of
    its level that holds it; the first domain where every part fits wins.

    Levels rack > host; r1: hosts a, b with 3 free each; r2: c with 4 free, d with 1. A leader
    requiring a rack and 4 workers a host (5 with a level): r2 (5 free) is tried before r1 (6);
    the workers take c, the tightest host that holds 4, and the leader d. With c at 3 free, no
    host of r2 holds 4 and r1's hosts hold 3: "part workers: needs 4 GPUs in one host; largest
    host has 3 free". A CPU-only leader and 2 workers of 4 GPUs requiring a rack, r1 of 3 + 3
    free: no node holds a worker: "its parts with a level together: needs 8 GPUs in one rack;
    largest rack has 6 free (room for 0 of its 2 missing pods)"."""
    candidates: list[tuple[int, str]] = [(0, "")]
    if outer:
        candidates, why = _outer_candidates(
            supplies, [p for p in parts if p.required is not None], outer, outer_map
        )
        if not candidates:
            return PartsPlan([], {}, short=f"its parts with a level together: {why}", level_short=True)
    ordered = sorted(parts, key=lambda part: -part.depth)  # (stable: ties keep their order)
    first_short: PartsPlan | None = None
    for _, domain in candidates:
        inside = frozenset(n.name for n in supplies if not outer or outer_map.get(n.name) == domain)
        planned = _plan_parts_within(supplies, ordered, inside, (outer, domain))
        if not planned.short:
            return planned
        first_short = first_short or planned
    assert first_short is not None
    return first_short


def _outer_candidates(
    supplies: Sequence[NodeGpus], stating: Sequence[PartAsk], outer: str, outer_map: DomainMap
) -> tuple[list[tuple[int, str]], str]:
    """The domains of the widest level that may hold the parts stating a level, by least free
    GPUs first; none: why, with the largest room found. Of one shape, exactly (each domain's room
    for their members, as `plan_in_domain`); of several, each shape's members must fit the domain
    and its free GPUs hold them all (the parts' own plans then decide)."""
    by_shape: dict[GpuDemand, int] = defaultdict(int)
    for part in stating:
        if part.demand is not None:
            by_shape[part.demand] += part.count
    grouped = _group(supplies, outer_map)
    if len(by_shape) <= 1:
        demand, stated = next(iter(by_shape.items()), (None, 0))
        if demand is None:  # (only parts without GPUs state a level: any domain holds them)
            return sorted((sum(map(_free_gpus, nodes)), domain) for domain, nodes in grouped.items()), ""
        room = _Room(demand, stated)
        totals = {domain: room.total(nodes) for domain, nodes in grouped.items()}
        found = sorted((free, domain) for domain, (fit, free) in totals.items() if fit >= stated)
        if found:
            return found, ""
        return [], no_domain_text(outer, plan_in_domain(supplies, demand, stated, outer_map), demand, stated)
    rooms = [_Room(demand, count) for demand, count in by_shape.items()]
    needed = sum(_gpus(demand, count) for demand, count in by_shape.items())
    found = []
    largest = 0
    for domain, nodes in grouped.items():
        free = sum(map(_free_gpus, nodes))
        largest = max(largest, free)
        if free >= needed and all(room.total(nodes)[0] >= room.count for room in rooms):
            found.append((free, domain))
    why = f"needs {needed} GPUs in one {outer}; largest {outer} has {largest} free"
    return sorted(found), "" if found else why


def _plan_parts_within(
    supplies: Sequence[NodeGpus], parts: Sequence[PartAsk], inside: frozenset[str], outer: tuple[str, str]
) -> PartsPlan:
    """The parts in order on `supplies`, those with a level on the nodes `inside` only (of the
    domain `outer`: (level, domain), ("", "") for none)."""
    current = {node.name: node for node in supplies}
    nodes: list[str] = []
    domains: dict[str, tuple[str, str]] = {}
    by_part: dict[str, list[str]] = {}
    for part in parts:
        if part.count <= 0:
            continue
        if part.demand is None:  # no GPUs: it holds no node, kept in the others' outer domain
            if part.required is not None and outer[1]:
                domains[part.name] = outer
            by_part[part.name] = [""] * part.count
            nodes.extend(by_part[part.name])
            continue
        demand = part.demand
        pool = [n for n in current.values() if part.required is None or n.name in inside]
        plan = plan_in_domain(pool, demand, part.count, part.required, part.preferred)
        if len(plan.nodes) < part.count:
            if part.required is not None:
                why = no_domain_text(part.level, plan, demand, part.count)
            else:
                why = f"GPUs free for {plan.largest_fit} of its {part.count} missing pods"
            return PartsPlan([], {}, short=f"part {part.name}: {why}", level_short=part.required is not None)
        if part.required is not None:
            domains[part.name] = (part.level, plan.domain)
        by_part[part.name] = plan.nodes
        for name in plan.nodes:
            after = occupy(current[name], demand, _NO_MIX)
            assert after is not None  # (the plan placed it there)
            current[name] = after[0]
        nodes.extend(plan.nodes)
    return PartsPlan(nodes, domains, by_part)
