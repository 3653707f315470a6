"""Topology-aware gangs through the filter verb and the pod webhook: labelled nodes and gangs with
levels in, the chosen domain, the held nodes and the filter's verdicts out.

The cluster: racks r1 (nodes a, b) and r2 (node c), 2 GPUs each; indexed Jobs of one-GPU pods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from contract.names import MIN_MEMBERS_ANNOTATION, TOPOLOGY_PREFERRED_ANNOTATION, TOPOLOGY_REQUIRED_ANNOTATION
from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.policy.topology import parse_topology
from extender.policy.waiting import wait_reason
from extender.server import build_app
from extender.status import WaitingPods
from extender.webhook import MUTATE_PODS_PATH, WebhookOptions, webhook_app
from tests import extender_objects as objects
from tests.unit.extender.pictures import reserved_gangs
from tests.unit.extender.serving import serve
from tests.unit.extender.test_gangs import job, member, running_member
from tests.unit.extender.test_server import CLASS, Extender, args
from tests.unit.extender.test_webhook import Webhooks

RACK = "example.com/rack"
TOPOLOGY = parse_topology(f"rack={RACK},host=kubernetes.io/hostname")
RACKS = {"a": "r1", "b": "r1", "c": "r2"}
NODES = list(RACKS)


@pytest.fixture
async def extender() -> AsyncIterator[Extender]:
    picture, waiting, api = ClusterPicture(PictureConfig(topology=TOPOLOGY)), WaitingPods(), ApiClient()
    app = build_app(picture, Binder(api, picture), waiting, ExtenderMetrics(picture))
    async with serve(app) as client:
        yield Extender(client, picture, waiting, api)
    await api.close()


def rack_node(name: str, rack: str) -> dict[str, Any]:
    return objects.node(name, labels={RACK: rack, "kubernetes.io/hostname": name})


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *(rack_node(name, rack) for name, rack in RACKS.items()),
        *(objects.gpu_slice(name, 2) for name in RACKS),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team"),
        *extra,
    ]


def gang(name: str, size: int, required: str = "rack", preferred: str = "") -> list[dict[str, Any]]:
    pods = [member(name, i) for i in range(size)]
    for pod in pods:
        if required:
            pod["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = required
        if preferred:
            pod["metadata"]["annotations"][TOPOLOGY_PREFERRED_ANNOTATION] = preferred
    return pods


async def test_a_gang_requiring_a_rack_is_held_in_the_fitting_rack_of_least_room(extender: Extender) -> None:
    # 2 members: r1 (4 free) and r2 (2 free) both hold them; r2 has less room and is chosen, so
    # r1 stays whole. (Without the ask, binpack by name would have held a's 2 GPUs.)
    pods = gang("ja", 2)
    extender.sync(cluster(job("ja", 2), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    reservation = extender.picture.gang_reservation("Job/ns/ja")
    assert reservation is not None
    assert (reservation.level, reservation.domain, list(reservation.nodes)) == ("rack", "r2", ["c", "c"])
    assert result["NodeNames"] == ["c"]
    assert "admitted whole in rack r2" in extender.waiting.reports["ns/ja-0"].reason
    # The other member passes only r2's node; r1's fail naming the domain.
    _, result = await extender.call("filter", args(pods[1], NODES))
    assert result["NodeNames"] == ["c"]
    assert result["FailedNodes"]["a"] == "gang Job/ns/ja is placed in rack r2"


async def test_a_gang_no_rack_holds_yet_waits_naming_the_level_and_the_largest_room(
    extender: Extender,
) -> None:
    # 3 members on 4 free GPUs: a filler job runs on a's 2 GPUs, so r1 has 2 free (b) and r2 2
    # (c). They fit the cluster, and r1 has 4 GPUs in all, but no rack has 3 free now. Without
    # the ask the gang would be admitted over both racks.
    pods = gang("three", 3)
    fillers = [obj for i in range(2) for obj in running_member("f", i, "team", "a", f"gpu-{i}")]
    extender.sync(cluster(job("three", 3), job("f", 2), *pods, *fillers))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == []
    reason = result["FailedAndUnresolvableNodes"]["b"]
    assert "needs 3 GPUs in one rack; largest rack has 2 free (room for 2 of its 3 missing pods)" in reason
    assert reserved_gangs(extender.picture) == []
    report = extender.waiting.reports["ns/three-0"]
    assert report.code == "gang_no_domain" and wait_reason(report.code).condition == "WaitingForGangDomain"
    # The fillers end: r1 has 4 free and holds the gang.
    extender.sync(cluster(job("three", 3), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    reservation = extender.picture.gang_reservation("Job/ns/three")
    assert reservation is not None and reservation.domain == "r1"


async def test_a_gang_larger_than_every_rack_says_it_cannot_start_as_asked(extender: Extender) -> None:
    # 5 members on 6 free GPUs: they fit the cluster, but r1 has 4 GPUs in all and r2 2, so no
    # rack could hold them even with every GPU free: waiting for room would be waiting forever,
    # and the reason says what would let it go instead.
    pods = gang("big", 5)
    extender.sync(cluster(job("big", 5), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == []
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert (
        "needs 5 GPUs in one rack; the largest rack has 4 GPUs in all, so it cannot start as asked" in reason
    )
    assert reserved_gangs(extender.picture) == []
    report = extender.waiting.reports["ns/big-0"]
    assert report.code == "gang_domain_too_small"
    assert wait_reason(report.code).condition == "GangLargerThanDomain"

    # Node c is moved into rack r1 (its label changes): r1 has 6 GPUs, the gang is admitted there.
    # The move is a new topology version, so the domain choice the gang's last try made (none
    # holds it) is not kept; a label no level reads leaves the version as it was.
    version = extender.picture.topology_version
    relabelled = rack_node("c", "r2")
    relabelled["metadata"]["labels"]["example.com/team"] = "vision"
    extender.picture.apply("Node", "MODIFIED", relabelled)
    assert extender.picture.topology_version == version
    moved = cluster(job("big", 5), *pods)
    moved[2] = rack_node("c", "r1")
    extender.sync(moved)
    assert extender.picture.topology_version != version
    assert extender.picture.level_domains("rack") == {"a": "r1", "b": "r1", "c": "r1"}
    _, result = await extender.call("filter", args(pods[0], NODES))
    reservation = extender.picture.gang_reservation("Job/ns/big")
    assert reservation is not None and reservation.domain == "r1"


async def test_a_preferred_rack_packs_a_gang_without_requiring_one(extender: Extender) -> None:
    # Preferred rack only, 2 members: the tightest rack that holds them is r2 (2 free, r1 4);
    # plain binpack breaks the tie of equal nodes by name and would hold a's GPUs instead.
    pods = gang("pref", 2, required="", preferred="rack")
    extender.sync(cluster(job("pref", 2), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    reservation = extender.picture.gang_reservation("Job/ns/pref")
    assert reservation is not None
    assert (reservation.domain, list(reservation.nodes)) == ("", ["c", "c"])
    # A preference binds nothing: the other member passes every node with room.
    _, result = await extender.call("filter", args(pods[1], NODES))
    assert result["NodeNames"] == NODES
    # Prioritize steers it to the rack its gang's GPUs are held in: c (r2) 10, r1's a and b below.
    # (Binpack alone scores all three alike: each has 2 GPUs this member may use.)
    _, ranked = await extender.call("prioritize", args(pods[1], NODES))
    ranks = scores(ranked)
    assert ranks["c"] == 10 and ranks["a"] < 10 and ranks["b"] < 10


async def test_a_gang_no_rack_holds_spills_over_racks_when_it_only_prefers_one(extender: Extender) -> None:
    # 5 members preferring a rack: none holds 5, so racks of most room first: r1 (a, b), then c.
    spill = gang("spill", 5, required="", preferred="rack")
    extender.sync(cluster(job("spill", 5), *spill))
    await extender.call("filter", args(spill[0], NODES))
    held = extender.picture.gang_reservation("Job/ns/spill")
    assert held is not None and sorted(held.nodes) == ["a", "a", "b", "b", "c"]


def racks_of_four(racks: dict[str, str], *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *(rack_node(name, rack) for name, rack in racks.items()),
        *(objects.gpu_slice(name, 4) for name in racks),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team"),
        *extra,
    ]


def scores(ranked: list[dict[str, Any]]) -> dict[str, int]:
    return {entry["Host"]: entry["Score"] for entry in ranked}


async def test_prioritize_puts_a_member_in_the_rack_its_gang_is_in(extender: Extender) -> None:
    # Racks r1 (a, b) and r2 (c, d), 4 GPUs each. Workload w (4 members, minimum 1, preferring a
    # rack): w-0 runs on c; a filler of another job takes 2 GPUs on a. Free: a 2, b 4, c 3, d 4.
    # Binpack alone ranks the fullest node first: a (2 free) 10, c (3) 5, b and d (4) 0 - w-1
    # would open rack r1. With the preference r2 (1 member) comes first: c 10 (the fuller of r2),
    # d, then r1's a, then b.
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
    pods = gang("w", 4, required="", preferred="rack")
    for pod in pods:
        pod["metadata"]["annotations"][MIN_MEMBERS_ANNOTATION] = "1"
    running, claim = running_member("w", 0, "team", "c", "gpu-0")
    running["metadata"]["annotations"] = pods[0]["metadata"]["annotations"]
    fillers = [*running_member("f", 0, "team", "a", "gpu-0"), *running_member("f", 1, "team", "a", "gpu-1")]
    extender.sync(racks_of_four(racks, job("w", 4), job("f", 2), running, claim, *pods[1:], *fillers))
    _, ranked = await extender.call("prioritize", args(pods[1], list(racks)))
    ranks = scores(ranked)
    assert ranks["c"] > ranks["d"] > ranks["a"] > ranks["b"]
    assert ranks["c"] == 10 and ranks["b"] == 0
    # The filler's job asks nothing: its pods are ranked by binpack alone, a (2 free) first.
    _, ranked = await extender.call("prioritize", args(member("f", 2), list(racks)))
    assert scores(ranked)["a"] == 10


async def test_prioritize_fills_the_tightest_rack_that_holds_the_rest_of_a_gang(extender: Extender) -> None:
    # No member placed yet (3 members, minimum 1, preferring a rack; a filler took 3 GPUs on a):
    # free a 1, b 4 (r1: 5), c 4, d 4 (r2: 8). Both racks hold the 3: r1 has less room and comes
    # first, b (4 free, all 3 fit) with a; binpack alone would put a first and then c, b, d alike.
    racks = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
    pods = gang("w", 3, required="", preferred="rack")
    for pod in pods:
        pod["metadata"]["annotations"][MIN_MEMBERS_ANNOTATION] = "1"
    fillers = [obj for i in range(3) for obj in running_member("f", i, "team", "a", f"gpu-{i}")]
    extender.sync(racks_of_four(racks, job("w", 3), job("f", 3), *pods, *fillers))
    _, ranked = await extender.call("prioritize", args(pods[0], list(racks)))
    ranks = scores(ranked)
    assert min(ranks["a"], ranks["b"]) > max(ranks["c"], ranks["d"])
    assert ranks["a"] > ranks["b"] and ranks["c"] == ranks["d"] == 0


@pytest.fixture
async def webhooks() -> AsyncIterator[Webhooks]:
    picture = ClusterPicture(PictureConfig(topology=TOPOLOGY))
    api = ApiClient(Configuration(host="http://127.0.0.1:1"))  # nothing listens there
    app = webhook_app(api, picture, ExtenderMetrics(picture), WebhookOptions(scheduler_name="tessera"))
    async with serve(app) as client:
        yield Webhooks(client, picture)
    await api.close()


@pytest.mark.parametrize(
    ("required", "preferred", "refusal"),
    [
        ("rack", "host", ""),
        ("nvlink", "", "topology level 'nvlink' (required) is not one of the cluster's levels: rack, host"),
        ("host", "rack", "preferred topology level 'rack' is wider than the required level 'host'"),
    ],
)
async def test_the_pod_webhook_refuses_unknown_levels(
    webhooks: Webhooks, required: str, preferred: str, refusal: str
) -> None:
    webhooks.sync(cluster())
    pod = gang("w", 1, required, preferred)[0]
    answer = await webhooks.review(MUTATE_PODS_PATH, pod)
    if refusal:
        assert answer["allowed"] is False
        assert answer["status"]["message"] == refusal
    else:
        assert answer["allowed"] is True
