"""Topology-aware gangs as scenarios: nodes with labels and gangs with levels in, the chosen
domain and the nodes held out (`extender.policy.topology`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from contract.names import TOPOLOGY_PREFERRED_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION
from extender.policy.placement import GpuDemand, NodeGpus
from extender.policy.reclaim import Rules, plan
from extender.policy.topology import (
    DEFAULT_TOPOLOGY,
    DomainChoices,
    DomainPlan,
    Level,
    Topology,
    ask_refusal,
    domain_scores,
    domain_sizes,
    fullest_first,
    never_held_text,
    no_domain_text,
    parse_topology,
    plan_in_domain,
    read_ask,
)
from tests.unit.extender.test_reclaim_workloads import NOW, Case, build

LAYOUT = parse_topology("block=example.com/block,rack=example.com/rack,host=kubernetes.io/hostname")
BLOCK, RACK, HOST = LAYOUT.levels
ONE_GPU = GpuDemand(1)


def node(name: str, free: int, total: int = 4) -> NodeGpus:
    return NodeGpus(name, "h100", (1000,) * free + (0,) * (total - free))


def labels(block: str, rack: str, host: str) -> dict[str, str]:
    return {BLOCK.label: block, RACK.label: rack, HOST.label: host}


# name -> (block, rack, free GPUs of 4)
CLUSTER = {
    "a1": ("b1", "r1", 4),
    "a2": ("b1", "r1", 4),  # rack b1/r1: 8 free
    "b1": ("b1", "r2", 4),  # rack b1/r2: 4 free
    "c1": ("b2", "r1", 3),
    "c2": ("b2", "r1", 2),  # rack b2/r1 (same rack name, other block): 5 free
}
SUPPLIES = [node(name, free) for name, (_, _, free) in CLUSTER.items()]


def level_map(level: Level) -> dict[str, str]:
    found = {name: LAYOUT.domain_of(labels(b, r, name), level) for name, (b, r, _) in CLUSTER.items()}
    return {name: domain for name, domain in found.items() if domain is not None}


def test_domains_are_paths_from_the_outermost_level() -> None:
    assert level_map(RACK) == {"a1": "b1/r1", "a2": "b1/r1", "b1": "b1/r2", "c1": "b2/r1", "c2": "b2/r1"}
    assert level_map(BLOCK)["c1"] == "b2"
    # A node without the rack label is in no rack; a missing outer level is skipped.
    assert LAYOUT.domain_of({HOST.label: "x"}, RACK) is None
    assert LAYOUT.domain_of({RACK.label: "r9"}, RACK) == "r9"


@pytest.mark.parametrize(
    ("members", "domain", "nodes"),
    [
        # 4 fit in b1/r1 (8 free), b1/r2 (4) and b2/r1 (5): the least room left is b1/r2.
        (4, "b1/r2", ["b1"] * 4),
        # 5: b1/r1 (8) and b2/r1 (5) hold it; b2/r1 has less room. Fullest node first: c2 (2), c1.
        (5, "b2/r1", ["c2", "c2", "c1", "c1", "c1"]),
        # 6: only b1/r1 holds 6.
        (6, "b1/r1", ["a1"] * 4 + ["a2"] * 2),
    ],
)
def test_a_gang_requiring_a_rack_takes_the_fitting_rack_with_least_room(
    members: int, domain: str, nodes: list[str]
) -> None:
    plan = plan_in_domain(SUPPLIES, ONE_GPU, members, level_map(RACK))
    assert (plan.domain, plan.nodes) == (domain, nodes)


def test_without_a_fitting_domain_the_plan_says_the_largest_room() -> None:
    # 9 members: racks have 8, 4 and 5 free; none holds 9 (the cluster as a whole has 17).
    plan = plan_in_domain(SUPPLIES, ONE_GPU, 9, level_map(RACK))
    assert plan.nodes == []
    assert (plan.largest_fit, plan.largest_free) == (8, 8)
    assert no_domain_text("rack", plan, ONE_GPU, 9) == (
        "needs 9 GPUs in one rack; largest rack has 8 free (room for 8 of its 9 missing pods)"
    )
    # Two GPUs per member: 4 members need 8 GPUs in one rack: b1/r1 holds them exactly.
    assert plan_in_domain(SUPPLIES, GpuDemand(2), 4, level_map(RACK)).domain == "b1/r1"
    # Without a required level the cluster is one domain: 9 fit.
    assert len(plan_in_domain(SUPPLIES, ONE_GPU, 9, None).nodes) == 9


def test_a_gang_larger_than_every_domain_in_all_is_told_it_cannot_start_as_asked() -> None:
    # Racks in all, free or not (4 GPUs a node): b1/r1 8, b1/r2 4, b2/r1 8; a node outside every
    # rack counts in none.
    sizes = domain_sizes([*SUPPLIES, node("bare", 4)], level_map(RACK))
    assert sizes == {"b1/r1": 8, "b1/r2": 4, "b2/r1": 8}
    # 8 GPUs: b1/r1 holds them once its GPUs are free (it has 8 free; b2/r1 has 5 free of 8).
    assert never_held_text("rack", 8 * 1000, sizes) == ""
    # 9 GPUs: no rack has 9 in all. The plan says "largest rack has 8 free" as for a gang
    # waiting for room; this says why waiting does not help.
    assert never_held_text("rack", 9 * 1000, sizes) == (
        "needs 9 GPUs in one rack; the largest rack has 8 GPUs in all, so it cannot start as asked"
    )
    # 17 halves: 8.5 GPUs of shares, more than 8.
    assert never_held_text("rack", 17 * 500, sizes).startswith("needs 8.5 GPUs in one rack;")
    # A level no node with GPUs carries.
    assert never_held_text("zone", 1000, {}) == (
        "needs 1 GPUs in one zone; no node with GPUs is in a zone, so it cannot start as asked"
    )


def test_nodes_without_the_required_label_host_no_gang_that_requires_it() -> None:
    plan = plan_in_domain([node("bare", 4)], ONE_GPU, 1, {})
    assert (plan.nodes, plan.largest_fit) == ([], 0)


def test_the_preferred_level_packs_members_inside_the_required_domain() -> None:
    # Required block b1 (a1, a2, b1: 12 free), preferred host: 4 members fit on one host; the
    # tightest host (all have 4) by name: a1. Without the preferred level plain binpack agrees.
    blocks, hosts = level_map(BLOCK), level_map(HOST)
    plan = plan_in_domain(SUPPLIES, ONE_GPU, 10, blocks, hosts)
    # 10 members: only b1 (12 free) holds them (b2 has 5). No host holds 10: hosts of most room
    # first (4, 4, 4 by name descending), so the members fill whole hosts.
    assert plan.domain == "b1"
    assert sorted(plan.nodes) == ["a1"] * 2 + ["a2"] * 4 + ["b1"] * 4
    # Preferred rack inside block b2 with 5 members: rack b2/r1 holds them all.
    assert plan_in_domain(SUPPLIES, ONE_GPU, 5, blocks, level_map(RACK)).nodes == [
        "c2",
        "c2",
        "c1",
        "c1",
        "c1",
    ]


def test_preferred_rack_without_a_required_level_lands_in_one_rack_when_one_holds_it() -> None:
    # 4 members, no required level, preferred rack: b1/r2 holds them with the least room.
    # Plain binpack would start on the fullest nodes c2 and c1 (2 + 3 free): two nodes, one rack
    # by luck; with 6 members it would spread to a1 (another rack), the preference keeps b1/r1.
    racks = level_map(RACK)
    assert plan_in_domain(SUPPLIES, ONE_GPU, 4, None, racks).nodes == ["b1"] * 4
    six = plan_in_domain(SUPPLIES, ONE_GPU, 6, None, racks).nodes
    assert {racks[n] for n in six} == {"b1/r1"}


class CountingPlans:
    """Rack plans through a `DomainChoices`, counting those made anew."""

    def __init__(self, limit: int = 10) -> None:
        self.choices, self.made = DomainChoices(limit), 0

    def plan(
        self, supplies: list[NodeGpus], members: int, version: int = 1, demand: GpuDemand = ONE_GPU
    ) -> DomainPlan:
        def anew() -> DomainPlan:
            self.made += 1
            return plan_in_domain(supplies, demand, members, level_map(RACK))

        return self.choices.plan((version, demand, members), supplies, anew)


def test_the_domain_choice_is_kept_while_supplies_and_domains_stay() -> None:
    plans = CountingPlans()
    first = plans.plan(SUPPLIES, 4)  # b1/r2 (4 free), made: 1
    # The same nodes, in a list of its own (each call gets a fresh list): kept, made still 1.
    assert plans.plan(list(SUPPLIES), 4) is first and plans.made == 1
    # Equal by value, not the same objects (the picture read a node anew): kept, made 1.
    assert plans.plan([replace(n) for n in SUPPLIES], 4) is first and plans.made == 1


@pytest.mark.parametrize(
    ("change", "domain"),
    [
        # The topology version moved (a node relabelled): planned anew, b1/r2 still the tightest.
        ({"version": 2}, "b1/r2"),
        # b1 lost a GPU (3 free; a member bound there): b1/r2 no longer holds 4, and of b1/r1 (8)
        # and b2/r1 (5) the tighter is b2/r1.
        ({"supplies": [node(n.name, 3) if n.name == "b1" else n for n in SUPPLIES]}, "b2/r1"),
        # A node gone from the candidates (the filter found it full): b1/r2 has no node left.
        ({"supplies": [n for n in SUPPLIES if n.name != "b1"]}, "b2/r1"),
        # Another ask: 5 members (b2/r1 holds 5 with least room), 2 GPUs each (b1/r1 holds 8).
        ({"members": 5}, "b2/r1"),
        ({"demand": GpuDemand(2)}, "b1/r1"),
    ],
)
def test_the_domain_choice_is_made_anew_when_anything_it_read_changed(
    change: dict[str, Any], domain: str
) -> None:
    plans = CountingPlans()
    assert plans.plan(SUPPLIES, 4).domain == "b1/r2"
    asked = {"supplies": SUPPLIES, "members": 4, **change}
    assert plans.plan(**asked).domain == domain
    assert plans.made == 2
    # The change is kept in turn: asked again, nothing is planned.
    plans.plan(**asked)
    assert plans.made == 2


def test_domain_choices_start_over_at_their_limit() -> None:
    # Limit 2: plans for 4 and 5 members are kept; a third key (6) starts over, so 4 is made
    # again (made: 4, 5, 6, 4 = 4 plans), while 6 stays kept.
    plans = CountingPlans(limit=2)
    for members in (4, 5, 6, 4, 6):
        plans.plan(SUPPLIES, members)
    assert plans.made == 4


@pytest.mark.parametrize(
    ("rooms", "members", "missing", "ranks"),
    [
        # The rack holding a member first, though r1 (room 6) would be tighter: 1 member > 0.
        ({"r1": 6, "r2": 7}, {"r2": 1}, 3, {"r2": 0, "r1": 1}),
        # More members beat fewer: r1 holds 2 of them, r2 1 (room plays no part).
        ({"r1": 1, "r2": 7}, {"r1": 2, "r2": 1}, 3, {"r1": 0, "r2": 1}),
        # No members yet, both hold the 3 missing: least room first (r2 4 < r1 6).
        ({"r1": 6, "r2": 4}, {}, 3, {"r2": 0, "r1": 1}),
        # Only r2 (5) holds 3; r1 (2) does not, and comes after though it is tighter.
        ({"r1": 2, "r2": 5}, {}, 3, {"r2": 0, "r1": 1}),
        # Neither holds 3: most room first, so most of them land together (r1 2 > r2 1).
        ({"r1": 2, "r2": 1}, {}, 3, {"r1": 0, "r2": 1}),
        # Alike (room 4, no members): one rank, the nodes' own scores decide.
        ({"r1": 4, "r2": 4}, {}, 2, {"r1": 0, "r2": 0}),
        # A rack with members but no candidate room still counts them (its room is 0).
        ({"r1": 4}, {"r2": 3}, 2, {"r2": 0, "r1": 1}),
    ],
)
def test_members_rank_domains_where_their_gang_is_then_the_tightest_that_holds_the_rest(
    rooms: dict[str, int], members: dict[str, int], missing: int, ranks: dict[str, int]
) -> None:
    assert fullest_first(rooms, members, missing) == ranks


@pytest.mark.parametrize(
    ("keys", "scores"),
    [
        # 4 distinct keys (at most 11): evenly by position, r2's nodes first, then r1's, each by its
        # own score: 10, 10*2/3 = 7, 10/3 = 3, 0.
        (
            {"c": ((0,), 10), "d": ((0,), 0), "a": ((1,), 10), "b": ((1,), 0)},
            {"c": 10, "d": 7, "a": 3, "b": 0},
        ),
        # A class the pod fits none of scores 0 whatever its domain.
        ({"c": ((0,), 10), "x": None, "a": ((1,), 0)}, {"c": 10, "x": 0, "a": 0}),
        # 30 racks (ranks 0..29) of one kind: evenly, rack 1 would score 10 * 28/29 = 9.7 -> 10,
        # tied with rack 0; banded, rack 0 takes 10 alone, the other 29 4 down to 0 (4 * (29-i)/28).
        (
            {f"r{i}": ((i,), 10) for i in range(30)},
            {"r0": 10, **{f"r{i}": round(4 * (29 - i) / 28) for i in range(1, 30)}},
        ),
        # The best rank shared by two classes: both in the 5..10 band, by their own scores.
        (
            {"a": ((0,), 10), "b": ((0,), 3), **{f"r{i}": ((i,), 10) for i in range(1, 12)}},
            {"a": 10, "b": 5, **{f"r{i}": round(4 * (11 - i) / 10) for i in range(1, 12)}},
        ),
    ],
)
def test_the_best_domains_nodes_score_above_every_others(
    keys: dict[str, tuple[tuple[int, ...], int] | None], scores: dict[str, int]
) -> None:
    assert domain_scores(keys) == scores


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": annotations}}


def podgroup(key: str) -> dict[str, Any]:
    return {"spec": {"schedulingConstraints": {"topology": [{"key": key}]}}}


@pytest.mark.parametrize(
    ("annotations", "group", "required", "preferred", "refusal"),
    [
        ({TOPOLOGY_REQUIRED_ANNOTATION: "rack"}, None, "rack", "", ""),
        # By its label, and the preferred level inside the required one.
        (
            {TOPOLOGY_REQUIRED_ANNOTATION: "example.com/block", TOPOLOGY_PREFERRED_ANNOTATION: "host"},
            None,
            "block",
            "host",
            "",
        ),
        # The PodGroup's topology key (KEP-5732) is the required level when no annotation says one.
        ({}, podgroup("example.com/rack"), "rack", "", ""),
        ({TOPOLOGY_REQUIRED_ANNOTATION: "block"}, podgroup("example.com/rack"), "block", "", ""),
        # Unknown levels are refused, and so is a preference wider than the requirement.
        (
            {TOPOLOGY_REQUIRED_ANNOTATION: "nvlink"},
            None,
            "",
            "",
            "topology level 'nvlink' (required) is not one of the cluster's levels: block, rack, host",
        ),
        (
            {},
            podgroup("example.com/row"),
            "",
            "",
            "topology level 'example.com/row' (required) is not one of the cluster's levels: "
            "block, rack, host",
        ),
        (
            {TOPOLOGY_REQUIRED_ANNOTATION: "rack", TOPOLOGY_PREFERRED_ANNOTATION: "block"},
            None,
            "rack",
            "block",
            "preferred topology level 'block' is wider than the required level 'rack'",
        ),
    ],
)
def test_asks_are_read_from_annotations_and_the_podgroup(
    annotations: dict[str, str], group: dict[str, Any] | None, required: str, preferred: str, refusal: str
) -> None:
    ask = read_ask(LAYOUT, pod(annotations), group)
    assert (ask.required, ask.preferred) == (required, preferred)
    assert ask_refusal(LAYOUT, pod(annotations), group) == refusal


def test_levels_parse_and_default_to_the_well_known_labels() -> None:
    assert [lv.label for lv in DEFAULT_TOPOLOGY.levels] == [
        "topology.kubernetes.io/zone",
        "nvidia.com/gpu.clique",
        "kubernetes.io/hostname",
    ]
    assert parse_topology("example.com/rack") == Topology((Level("rack", "example.com/rack"),))
    for bad in ("", "rack=a,rack=b", "a=x,b=x", "=x"):
        with pytest.raises(ValueError):
            parse_topology(bad)


@pytest.mark.parametrize("required", [True, False])
def test_reclaim_frees_gpus_for_a_gang_inside_one_domain(required: bool) -> None:
    # Racks: n1 (r1), n2 (r2), 4 GPUs each. a runs 3 pods on n1 (1 free) and 2 on n2 (2 free);
    # b waits with a gang of 3 one-GPU pods requiring a rack, then a lone pod: b's fair share is
    # 4, a's 4, so a may lose 1 of its 5. Without the rack, the gang fits the 3 free GPUs across
    # both racks (no plan) and the lone pod takes a's GPU. Inside one rack: r2 (most free) holds
    # 2 of the gang, a third GPU there is freed by evicting one of a's pods on n2, and the lone
    # pod takes n1's free GPU.
    running = [(f"a{i}", "a", "n1" if i < 3 else "n2", "") for i in range(5)]
    pending = [(f"g{i}", "b", 1, "Workload/ns/g") for i in range(3)] + [("lone", "b", 1, "")]
    snapshot, waiting = build(Case("", {"a": 4, "b": 4}, running, {}, pending, set(), {}))
    racks = {"n1": "r1", "n2": "r2"}
    waiting = [replace(p, domains=racks if required and p.workload else None) for p in waiting]
    plans = plan(snapshot, waiting, NOW, Rules())
    served = {p.pod.key: (p.node, sorted(e.pod.node for e in p.evictions)) for p in plans}
    if required:
        assert served == {"g2": ("n2", ["n2"])}
    else:
        assert set(served) == {"lone"}


@pytest.mark.parametrize("by_part", [True, False])
def test_reclaim_for_a_gang_of_parts_frees_gpus_inside_each_parts_own_domain(by_part: bool) -> None:
    # One rack (r1) of hosts n1 and n2, 4 GPUs each. a runs 2 pods on n2 (its oldest) and 3 on
    # n1 (1 free, n2 2 free); b waits with a leader (no level) and 3 workers requiring one host
    # (`leader=1,workers=3`), all one-GPU; b's fair share is 4, a's 4: a may lose 1 of its 5.
    # Part by part: the workers (a level) first, inside one host, the most free first: n2 holds
    # 2, a third GPU there is freed by evicting a's newest pod on n2 (a1); the leader, anywhere,
    # takes n1's free GPU. Planned as one group with the level of the first listed member (the
    # leader's: none), the fourth GPU is freed anywhere - a's newest, a4 on n1 - and no host then
    # holds the 3 workers (n1 2 free, n2 2): the gang waits after the eviction.
    running = [(f"a{i}", "a", "n2" if i < 2 else "n1", "") for i in range(5)]
    pending = [("leader", "b", 1, "Workload/ns/lw")] + [(f"w{i}", "b", 1, "Workload/ns/lw") for i in range(3)]
    snapshot, waiting = build(Case("", {"a": 4, "b": 4}, running, {}, pending, set(), {}))
    hosts = {"n1": "r1/n1", "n2": "r1/n2"}
    if by_part:  # as the picture lists them: each part's own level, the widest of them
        waiting = [
            replace(p, part="leader", outer=hosts)
            if p.key == "leader"
            else replace(p, part="workers", domains=hosts, outer=hosts)
            for p in waiting
        ]
    plans = plan(snapshot, waiting, NOW, Rules())
    evicted = sorted(e.pod.key for p in plans for e in p.evictions)
    assert evicted == (["a1"] if by_part else ["a4"])
