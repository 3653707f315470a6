"""One filter call asks the picture one question (`ClusterPicture.filter_inputs`), and the picture
asks each of its parts once for it: the worked examples count the picture's entries into each
part (`counting_entries`: every attribute the picture reads of a part) during one filter call.

The cluster: nodes a and b in zone z1 with 2 H100s (80Gi) each, node c in zone z2 with 2
A100-40GBs; all shareable. Queues team and other, no limits. Each call is the second of its kind:
the first fills what the picture keeps between calls (node kinds, the owed waiting pods), as a
running extender has.

Entries of a pod alone (the common call):
  _store 1        ready()
  _demands 1      its demand (decide_filter reads it first: a pod that is not ours stops there)
  _accounting 1   its context: the view, its gang, its fairness vector (at each GPU size), tenancy
  _inventory 1    the candidates by kind, the GPUs held for it, the nodes' GPU sizes, the version
A gang's member kept in its gang's zone adds _topology 1 (the zone's nodes). (The filter before
`filter_inputs` entered, for the first example, the inventory 4 times, the accounting 4 and the
gangs once; for half a GPU the inventory 5, the accounting 6 and the pod demands 3.)
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.picture.gangs import GangReservation
from extender.policy.placement import GpuDemand
from extender.verbs import FilterDecision, decide_filter
from extender.wire import ExtenderArgs
from tests import extender_objects as objects
from tests.unit.extender import test_deference
from tests.unit.extender.pictures import counting_entries
from tests.unit.extender.test_gangs import job, member

CLASS = "gpu.tessera.dev"
ZONE = "topology.kubernetes.io/zone"
NODES = ["a", "b", "c"]
ALONE = {"_store": 1, "_demands": 1, "_accounting": 1, "_inventory": 1}


def cluster(*extra: dict[str, Any]) -> ClusterPicture:
    objs = [
        objects.node("a", labels={ZONE: "z1"}),
        objects.node("b", labels={ZONE: "z1"}),
        objects.node("c", labels={ZONE: "z2"}),
        objects.gpu_slice("a", 2, shareable=True),
        objects.gpu_slice("b", 2, shareable=True),
        objects.gpu_slice("c", 2, model="A100-40GB", memory="40Gi", shareable=True),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.claim_template("ns", "half", objects.claim_spec(CLASS, memory="20Gi")),
        objects.queue("team"),
        objects.queue("other"),
        *extra,
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


def counted_filter(
    picture: ClusterPicture, pod: dict[str, Any], names: list[str]
) -> tuple[FilterDecision, dict[str, int]]:
    """The second of two filter calls of `pod` on `names`, and the entries per part during it."""
    args = ExtenderArgs(Pod=pod, NodeNames=names)
    decide_filter(picture, args)
    with counting_entries(picture) as counts:
        decision = decide_filter(picture, args)
    return decision, dict(counts)


@pytest.mark.parametrize(
    ("template", "passed"),
    [
        ("one", NODES),  # one whole GPU: every node has 2 free
        # 20Gi of a GPU: 1/4 of an H100, 1/2 of an A100-40GB, admitted per GPU size (2 sizes),
        # its vector at each size asked of the accounting in the one entry.
        ("half", NODES),
    ],
)
def test_a_pod_alone_enters_each_part_once(template: str, passed: list[str]) -> None:
    pod = objects.pod("ns", "p", queue="team", template=template)
    picture = cluster(pod)
    decision, entries = counted_filter(picture, pod, NODES)
    assert decision.result.NodeNames == passed
    assert entries == ALONE


def test_a_member_of_a_gang_reserved_in_a_zone_enters_the_topology_once_too() -> None:
    # Job ja of 2 one-GPU members, admitted whole in zone z1 (slots on a and b): ja-1's filter
    # passes a and b only, and c fails with the reservation's reason.
    pods = [member("ja", i) for i in range(2)]
    picture = cluster(job("ja", 2), *pods)
    picture.reserve_gang(
        GangReservation(
            workload=picture.workload(pods[0]),
            queue="team",
            amounts=picture.pod_resources("ns/ja-0", pods[0]),
            demand=GpuDemand(1),
            preemptible=True,
            nodes=["a", "b"],
            target=2,
            level="zone",
            domain="z1",
        )
    )
    decision, entries = counted_filter(picture, pods[1], NODES)
    assert decision.result.NodeNames == ["a", "b"]
    assert decision.result.FailedNodes == {"c": "gang Job/ns/ja is placed in zone z1"}
    assert entries == {**ALONE, "_topology": 1}


def test_a_pod_that_defers_to_an_owed_pod_reads_the_owed_pods_kept_since_the_last_call() -> None:
    # The picture of `test_deference`: b0 waits unplaced and owed; a3 defers to it on n1. The
    # owed pods were found by the first call and are kept (the view and the nodes did not move).
    b0 = test_deference.waiting("b0", "b")
    picture = test_deference.picture_of(test_deference.A3, b0)
    decision, entries = counted_filter(picture, test_deference.A3, ["n1"])
    assert decision.result.FailedNodes == {"n1": test_deference.DEFERS}
    assert entries == ALONE
