"""The node-to-domain map of the gang planners (`extender.policy.placement.DomainMap`): empty by
default, so every memo is keyed as before; given, the memos that merge nodes of one shape keep
nodes of different domains apart - the filter's gang plan, the inventory's node kinds, and the
simulator's node states - and reclaim's snapshot (and its forks) carry the map."""

from __future__ import annotations

from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from extender.policy.placement import NO_DOMAINS, DomainMap, GpuDemand, NodeGpus, domain_shape, node_supply
from extender.policy.snapshot import occupy
from extender.policy.workloads import plan_gang
from tessera.simulate.cluster import Cluster
from tessera.simulate.packing import workload_mix
from tessera.simulate.trace import SimNode
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"
ONE = GpuDemand(1)


def four_free(name: str) -> NodeGpus:
    return node_supply(name, "H100", (1000,) * 4, None)


# (domains) -> do nodes a and b, of one shape, share a memo key?
KEYS: list[tuple[DomainMap, bool]] = [
    (NO_DOMAINS, True),  # no map: the shape alone, as before
    ({"a": "rack-1", "b": "rack-1"}, True),  # one domain: interchangeable
    ({"a": "rack-1", "b": "rack-2"}, False),  # two domains: kept apart
    ({"a": "rack-1"}, False),  # a in a domain, b in none
]


@pytest.mark.parametrize(("domains", "shared"), KEYS)
def test_same_shaped_nodes_share_a_key_only_within_a_domain(domains: DomainMap, shared: bool) -> None:
    a, b = four_free("a"), four_free("b")
    assert a.shape == b.shape
    assert (domain_shape(a, domains) == domain_shape(b, domains)) is shared
    if "b" not in domains:
        assert domain_shape(b, domains) == b.shape  # a node in no domain: keyed as before


def counted_occupy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def counting(node: NodeGpus, *args: Any) -> Any:
        calls.append(node.name)
        return occupy(node, *args)

    monkeypatch.setattr("extender.policy.workloads.occupy", counting)
    return calls


@pytest.mark.parametrize(
    ("domains", "tries_of_b"),
    [
        # a takes 4 one-GPU members (4 fits, the 5th try fails); b, of a's shape, takes the other
        # 2 from a's count without a try of its own.
        (NO_DOMAINS, 0),
        # b in another domain: its count is found on b itself (4 fits, the 5th try fails).
        ({"a": "rack-1", "b": "rack-2"}, 5),
    ],
)
def test_the_gang_plan_finds_a_count_per_shape_and_domain(
    monkeypatch: pytest.MonkeyPatch, domains: DomainMap, tries_of_b: int
) -> None:
    calls = counted_occupy(monkeypatch)
    assert plan_gang([four_free("a"), four_free("b")], ONE, 6, domains) == ["a"] * 4 + ["b"] * 2
    assert calls.count("a") == 5 and calls.count("b") == tries_of_b


def picture_of(domains: DomainMap) -> ClusterPicture:
    objs = objects.two_nodes_of_two_gpus(CLASS)
    picture = ClusterPicture(PictureConfig(domains=domains))
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


@pytest.mark.parametrize(("domains", "shared"), KEYS)
def test_the_inventorys_node_kinds_keep_domains_apart(domains: DomainMap, shared: bool) -> None:
    # Nodes a and b: 2 free GPUs each, the same shape and GPU memory.
    picture = picture_of(domains)
    kind_a, kind_b = picture.candidates("ns/p", ["a", "b"]).kinds
    assert (kind_a == kind_b) is shared


def test_reclaims_snapshot_and_its_forks_carry_the_pictures_map() -> None:
    domains = {"a": "rack-1", "b": "rack-2"}
    snapshot = picture_of(domains).snapshot()
    assert snapshot.domains == domains and snapshot.fork().fork().domains == domains
    assert picture_of(NO_DOMAINS).snapshot().domains == {}


@pytest.mark.parametrize(("domains", "states"), [(NO_DOMAINS, 1), ({"a": "rack-1", "b": "rack-2"}, 2)])
def test_the_simulators_node_states_keep_domains_apart(domains: DomainMap, states: int) -> None:
    # Two idle nodes alike: one state (placed by one verdict) without a map, one per domain with.
    nodes = [SimNode(name, "H100", 4, 32_000, 256 * 1024) for name in ("a", "b")]
    cluster = Cluster(nodes, workload_mix([]), domains)
    assert len(dict(cluster.groups())) == states
