"""Gangs that come later, planned around the first waiting gang (`extender.policy.backfill`): who
is the head, and which nodes are held back for it."""

from __future__ import annotations

import pytest

from extender.policy.backfill import WaitingGang, backfill_supplies, gang_ahead, held_back
from extender.policy.placement import GpuDemand, NodeGpus
from extender.policy.workloads import plan_gang


def node(name: str, free: int, total: int = 4) -> NodeGpus:
    return NodeGpus(name, "h100", (1000,) * free + (0,) * (total - free))


def gang(name: str, created: float, gpus: int = 4, missing: int = 2, priority: int = 0) -> WaitingGang:
    return WaitingGang(name, (-priority, created, name), GpuDemand(gpus), missing)


# The module docstring's example: a, b, c, d of 4 GPUs with 3, 2, 1 and 0 free.
NODES = [node("a", 3), node("b", 2), node("c", 1), node("d", 0)]
RACKS = {"a": "r1", "b": "r2", "c": "r2", "d": "r1"}  # r1: 3 free (a, d), r2: 3 free (b, c)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        # 2 members of 4: the freest first, a (room for 1 once empty), then b (2): a and b.
        (gang("h", 0, gpus=4, missing=2), {"a", "b"}),
        # 1 member of 4: a alone holds it once emptied.
        (gang("h", 0, gpus=4, missing=1), {"a"}),
        # 6 members of 2: 2 a node once empty, so 3 nodes by most free: a, b, c.
        (gang("h", 0, gpus=2, missing=6), {"a", "b", "c"}),
        # 5 members of 4 need 20 GPUs, the cluster has 16: it could never start, nothing held.
        (gang("h", 0, gpus=4, missing=5), set()),
        # Preferring racks: the racks tie at 3 free, r1 by name first, its a (3) then d (0) hold
        # 2 members of 4 once empty: a and d, not the globally freest b.
        (WaitingGang("h", (0, 0, "h"), GpuDemand(4), 2, RACKS), {"a", "d"}),
        # Requiring a rack: all in one, the freest that holds it once empty; 3 members of 4 fit
        # no rack of 2 nodes: nothing held.
        (WaitingGang("h", (0, 0, "h"), GpuDemand(4), 2, RACKS, one_domain=True), {"a", "d"}),
        (WaitingGang("h", (0, 0, "h"), GpuDemand(4), 3, RACKS, one_domain=True), set()),
    ],
)
def test_the_nodes_held_back_for_the_head(head: WaitingGang, expected: set[str]) -> None:
    assert held_back(head, NODES) == expected


def test_a_later_gang_is_planned_off_the_nodes_held_back() -> None:
    kept = held_back(gang("h", 0), NODES)
    around = backfill_supplies(NODES, kept)
    # A gang of 2 one-GPU members after the head: without the rule, binpacked, c's 1 and one of
    # b's 2 (b then has 1 free: the head's 8 need b to empty); with it, c (1 free) and d (0)
    # are all it has: 1 of its 2 fit, it waits. One of 1 GPU starts on c.
    assert plan_gang(NODES, GpuDemand(1), 2) == ["c", "b"]
    assert plan_gang(around, GpuDemand(1), 2) == ["c"]
    assert plan_gang(around, GpuDemand(1), 1) == ["c"]


@pytest.mark.parametrize(
    ("waiting", "asking", "now", "after_s", "expected"),
    [
        # The first gang before it that has waited long enough: b came at 10, waited 90 >= 60.
        ([gang("a", 50), gang("b", 10)], ("c", 60.0), 100.0, 60.0, "b"),
        # Both before it, a (waited 50) first in order? No: b (10) comes first, and it waited.
        ([gang("b", 10), gang("a", 50)], ("c", 60.0), 100.0, 40.0, "b"),
        # b has waited 30 < 60 and a 50 < 60: no head yet, the gang goes where it fits.
        ([gang("b", 70), gang("a", 50)], ("c", 80.0), 100.0, 60.0, None),
        # Gangs after the asking one (created later) are never its head.
        ([gang("d", 90)], ("c", 80.0), 200.0, 0.0, None),
        # Nor is the gang itself (an older member of its own counted at 10).
        ([gang("c", 10)], ("c", 80.0), 200.0, 0.0, None),
        # Priority first: p (priority 5, created later) is ahead of the asking gang at 0.
        ([gang("p", 90, priority=5)], ("c", 10.0), 200.0, 0.0, "p"),
    ],
)
def test_the_head_a_gang_is_planned_around(
    waiting: list[WaitingGang], asking: tuple[str, float], now: float, after_s: float, expected: str | None
) -> None:
    name, created = asking
    head = gang_ahead(waiting, name, (0, created, name), now, after_s)
    assert (head.workload if head else None) == expected
