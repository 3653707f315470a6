"""The gang reservations part (`extender.picture.gangs`) as worked examples: a reservation made as
the filter makes it (`extender.verbs.admit_gang`), then followed step by step as members bind, as
a filter admits one, and as it lapses.

The cluster: nodes a and b with 2 GPUs each (4), queue "team", an indexed Job ja of 4 members
asking one GPU each (the helpers of `tests.unit.extender.test_gangs`).
"""

from __future__ import annotations

from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.picture.gangs import GangReservation
from extender.policy.placement import GpuDemand
from tests.unit.extender.pictures import lapse_gang_reservations, reserved_gangs, supply
from tests.unit.extender.test_gangs import bind, cluster, job, member

WORKLOAD = "Job/ns/ja"


def picture_of(objs: list[dict[str, Any]]) -> ClusterPicture:
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


def admit_whole(picture: ClusterPicture, pods: list[dict[str, Any]], nodes: list[str]) -> None:
    """The reservation the filter leaves when it admits the gang's 4 missing members on `nodes`."""
    first = pods[0]
    picture.reserve_gang(
        GangReservation(
            workload=picture.workload(first),
            queue="team",
            amounts=picture.pod_resources("ns/ja-0", first),
            demand=GpuDemand(1),
            preemptible=True,
            nodes=nodes,
            target=4,
        )
    )


def allocated_gpus(picture: ClusterPicture) -> float:
    return picture.fairness().usage["team"].allocated.get("gpu", 0.0)


@pytest.fixture
def pods() -> list[dict[str, Any]]:
    return [member("ja", i) for i in range(4)]


def test_the_slots_follow_the_binds_until_the_minimum_is_placed(pods: list[dict[str, Any]]) -> None:
    picture = picture_of(cluster(job("ja", 4), *pods))
    admit_whole(picture, pods, ["a", "a", "b", "b"])
    # (bound so far, slots left, placed, team's GPUs counted: bound members + slots)
    steps = [
        ((), ["a", "a", "b", "b"], 0, 4),  # 4 slots, nothing placed: 0 + 4
        ((("a", "gpu-0"),), ["a", "b", "b"], 1, 4),  # ja-0 on a takes a's first slot: 1 + 3
        ((("a", "gpu-1"),), ["b", "b"], 2, 4),  # 2 + 2
        ((("b", "gpu-0"),), ["b"], 3, 4),  # 3 + 1
    ]
    bound = 0
    for version, (binds, slots, placed, counted) in enumerate(steps, start=10):
        for node, device in binds:
            bind(picture, pods[bound], node, device, version)
            bound += 1
        assert allocated_gpus(picture) == counted
        reservation = picture.gang_reservation(WORKLOAD)
        assert reservation is not None
        assert (reservation.slots, reservation.placed) == (slots, placed)
        assert picture.gang(pods[3]).placed == placed
    # The 4th binds: the minimum is placed, the reservation ends and holds nothing.
    bind(picture, pods[3], "b", "gpu-1", 20)
    assert allocated_gpus(picture) == 4  # 4 bound + 0 slots
    assert not (picture.gang_reservation(WORKLOAD) is not None) and picture.holds() == {}
    gang = picture.gang(pods[3])
    assert (gang.placed, gang.reserved, gang.admitted) == (4, False, True)


def test_a_member_a_filter_admitted_is_placed_but_keeps_its_slot_until_its_gpus_show(
    pods: list[dict[str, Any]],
) -> None:
    # ja-0's filter admitted the gang and reserved ja-0 itself (its bind to come): placed 1, but
    # all 4 slots keep holding GPUs - the picture does not see ja-0's yet. Counted: ja-0's own
    # reservation 1 + 3 slots (the 4th slot stands for ja-0) = 4, not 5.
    picture = picture_of(cluster(job("ja", 4), *pods))
    admit_whole(picture, pods, ["a", "a", "b", "b"])
    picture.reserve("ns/ja-0", pods[0], 30.0)
    assert allocated_gpus(picture) == 4
    reservation = picture.gang_reservation(WORKLOAD)
    assert reservation is not None and (len(reservation.slots), reservation.placed) == (4, 1)
    assert supply(picture, "ns/other", "a").free_milli == (0, 0)  # held for the gang
    assert supply(picture, "ns/ja-1", "a", WORKLOAD).free_milli == (1000, 1000)


def test_a_reservation_without_progress_lapses_and_its_members_wait_again(
    pods: list[dict[str, Any]],
) -> None:
    picture = picture_of(cluster(job("ja", 4), *pods))
    lapse_gang_reservations(picture)  # no member placed within the hold: it lapses at the next recount
    admit_whole(picture, pods, ["a", "a", "b", "b"])
    usage = picture.fairness().usage["team"]
    # Slots and holds given back; the 4 pending members count as waiting (requested) again.
    assert (usage.allocated.get("gpu", 0.0), usage.requested.get("gpu")) == (0.0, 4)
    assert reserved_gangs(picture) == [] and picture.holds() == {}
    assert picture.gang(pods[0]).admitted is False


def test_while_reserved_the_members_count_nothing_of_their_own(pods: list[dict[str, Any]]) -> None:
    # Before: 4 pending members, 4 GPUs requested. Reserved: 4 slots allocated, nothing requested
    # (the slots stand for the members), so the queue is charged 4, not 8.
    picture = picture_of(cluster(job("ja", 4), *pods))
    assert picture.fairness().usage["team"].requested.get("gpu") == 4
    admit_whole(picture, pods, ["a", "a", "b", "b"])
    usage = picture.fairness().usage["team"]
    assert (usage.allocated.get("gpu"), usage.requested.get("gpu", 0.0)) == (4, 0.0)
    assert picture.gang(pods[1]).reserved
