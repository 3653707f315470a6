"""`tessera simulate snapshot` on a snapshot of plain objects: the extender's admission, reclaim
and consolidation decide on it, and what-if edits change what they decide (worked examples)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from extender.picture.cluster import PictureConfig
from extender.policy.consolidation import ConsolidationRules
from tessera.snapshot import (
    WhatIf,
    admissions,
    consolidation_moves,
    edited,
    picture_of,
    reclaim_plans,
    report,
)
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"
STARTED = 1796115600.0  # 2026-12-01T09:00:00Z, when team-a's pods started
NOW = STARTED + 3600


def running(name: str, device: str, node: str = "a", owner: str = "") -> list[dict[str, Any]]:
    """A pod of team-a running since STARTED on `node`'s `device`; with `owner`, its ReplicaSet's
    (which recreates it when evicted: consolidation may move it)."""
    pod = objects.pod("ns", name, queue="team-a", template="one", node_name=node)
    pod["metadata"]["creationTimestamp"] = "2026-12-01T09:00:00Z"
    if owner:
        pod["metadata"]["ownerReferences"] = [objects.replica_set_owner(owner)]
    pod["status"] = {
        "phase": "Running",
        "startTime": "2026-12-01T09:00:00Z",
        "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}],
    }
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]
    return [pod, claim]


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Node a, 2 GPUs, both held by team-a (quota 0: borrowed); team-b (quota 2) waits with one
    pod of 1 GPU. Fair shares: each asks for 1 or more of the 2 GPUs at weight 1, so 1 each;
    team-a holds 2 > 1."""
    waiting = objects.pod("ns", "b-0", queue="team-b", template="one")
    waiting["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    found: dict[str, list[dict[str, Any]]] = {}
    for obj in (
        objects.node("a"),
        objects.gpu_slice("a", 2),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team-a", resources={"gpu": {"quota": 0}}),
        objects.queue("team-b", resources={"gpu": {"quota": 2}}),
        *running("a-0", "gpu-0"),
        *running("a-1", "gpu-1"),
        waiting,
    ):
        found.setdefault(obj["kind"], []).append(obj)
    return found


CASES = [
    # what if -> (admitted, code; the reclaim plans as "served: victims")
    # As it is: admitted (team-b is below its fair share of 1), no GPU free: reclaim takes one of
    # team-a's borrowed GPUs (2 held > fair share 1), the older-keyed of two alike victims.
    (WhatIf({}, {}, {}), (True, "within_fair_share", ["ns/b-0: ns/a-0"])),
    # One more node like a: 2 GPUs free, the pod fits, nothing to reclaim.
    (WhatIf({}, {}, {}, new_nodes=1), (True, "within_fair_share", [])),
    # team-b's quota and limit 0 (a limit below the quota would make the queue invalid):
    # 0 + 1 > 0, refused; no reclaim for a pod its queue refuses.
    (WhatIf({"team-b": 0}, {"team-b": 0}, {}), (False, "over_limit", [])),
]


@pytest.mark.parametrize(("what_if", "expected"), CASES)
def test_the_replay_decides_as_the_extender_would(
    what_if: WhatIf, expected: tuple[bool, str, list[str]]
) -> None:
    picture = picture_of(edited(snapshot(), what_if, CLASS), PictureConfig())
    (decision,) = admissions(picture)
    plans = reclaim_plans(picture, now=NOW)
    served = [f"{p.pod.key}: {', '.join(e.pod.key for e in p.evictions)}" for p in plans]
    assert (decision.admitted, decision.code, served) == expected


def test_edits_leave_the_snapshot_alone_and_add_what_they_name() -> None:
    taken = snapshot()
    before = copy.deepcopy(taken)
    changed = edited(taken, WhatIf({"team-a": 3}, {}, {"team-c": 2.0}, new_nodes=2), CLASS)
    assert taken == before
    queues = {q["metadata"]["name"]: q["spec"]["resources"]["gpu"] for q in changed["Queue"]}
    assert queues == {"team-a": {"quota": 3}, "team-b": {"quota": 2}, "team-c": {"quota": 2.0}}
    assert [n["metadata"]["name"] for n in changed["Node"]] == ["a", "a-what-if-0", "a-what-if-1"]
    assert [s["spec"]["nodeName"] for s in changed["ResourceSlice"]] == ["a", "a-what-if-0", "a-what-if-1"]
    assert {s["spec"]["pool"]["name"] for s in changed["ResourceSlice"]} == {
        "a",
        "a-what-if-0",
        "a-what-if-1",
    }


def test_the_report_says_each_decision_and_plan() -> None:
    picture = picture_of(snapshot(), PictureConfig())
    plans = reclaim_plans(picture, now=NOW)
    # Reclaim serves the one waiting pod: nothing is left for consolidation.
    assert report(
        admissions(picture), plans, consolidation_moves(picture, plans, ConsolidationRules(), NOW)
    ) == [
        "admission (the filter's decision, every node a candidate):",
        "  ns/b-0 [team-b]: admitted: queue 'team-b' is within its limits and fair share",
        "reclaim (the next cycle's plans):",
        "  reclaim for ns/b-0 [team-b] on a: evict ns/a-0 [team-a]",
        "consolidation (the same cycle's moves, after reclaim's):",
        "  none",
    ]


def fragmented() -> dict[str, list[dict[str, Any]]]:
    """Nodes a and b, 2 GPUs each; team-a (quota 2) runs one pod of 1 GPU on each, both of its
    ReplicaSet; team-b (quota 2) waits with one pod of 2 GPUs. 2 GPUs are free, 1 per node: the
    pod fits nowhere. Fair shares 2 and 2 (each queue's quota, 4 GPUs in all): team-a holds 2, not
    beyond its share, so reclaim takes nothing - only a move makes a node whole."""
    waiting = objects.pod("ns", "b-0", queue="team-b", template="two")
    waiting["metadata"]["creationTimestamp"] = "2026-12-01T10:00:00Z"
    found: dict[str, list[dict[str, Any]]] = {}
    for obj in (
        *objects.two_nodes_of_two_gpus(CLASS),
        objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2)),
        objects.queue("team-a", resources={"gpu": {"quota": 2}}),
        objects.queue("team-b", resources={"gpu": {"quota": 2}}),
        *running("a-0", "gpu-0", node="a", owner="a-rs"),
        *running("a-1", "gpu-0", node="b", owner="a-rs"),
        waiting,
    ):
        found.setdefault(obj["kind"], []).append(obj)
    return found


MOVE_CASES = [
    # (what if, seconds a pod must have run before a move) -> the report's consolidation lines
    # As it is: team-a's pods have run 3600 s >= 300, one moves onto the other's node, whose
    # free GPU takes it: the emptied node has the 2 GPUs b-0 asks.
    (WhatIf({}, {}, {}), 300.0, ["  consolidate for ns/b-0 [team-b] on a: move ns/a-0 [team-a] to b"]),
    # Only pods that have run 7200 s may move: 3600 < 7200, none may, nothing is planned.
    (WhatIf({}, {}, {}), 7200.0, ["  none"]),
    # One more node like a: its 2 free GPUs take b-0 as it is, no move needed.
    (WhatIf({}, {}, {}, new_nodes=1), 300.0, ["  none"]),
]


@pytest.mark.parametrize(("what_if", "min_runtime_s", "expected"), MOVE_CASES)
def test_the_replay_moves_a_pod_so_a_waiting_one_fits(
    what_if: WhatIf, min_runtime_s: float, expected: list[str]
) -> None:
    picture = picture_of(edited(fragmented(), what_if, CLASS), PictureConfig())
    (decision,) = admissions(picture)
    plans = reclaim_plans(picture, now=NOW)
    assert (decision.admitted, plans) == (True, [])
    moves = consolidation_moves(picture, plans, ConsolidationRules(min_runtime_s=min_runtime_s), NOW)
    lines = report([decision], plans, moves)
    assert lines[lines.index("consolidation (the same cycle's moves, after reclaim's):") + 1 :] == expected


def test_an_admitted_pod_no_node_was_found_for_says_why_it_waits_as_the_extender_writes() -> None:
    """kube-scheduler tried b-0 and found no node (PodScheduled False, Unschedulable): the replay
    says what the extender's status writer says of it - team-b's fair share is 2, it holds 0 and
    asks 2: 0 + 2 <= 2, within it, so reclaim comes for it (here consolidation does)."""
    taken = fragmented()
    (waiting,) = [p for p in taken["Pod"] if p["metadata"]["name"] == "b-0"]
    waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    (decision,) = admissions(picture_of(taken, PictureConfig()))
    assert report([decision], [], [])[1] == (
        "  ns/b-0 [team-b]: admitted, no node fits (waiting_for_reclaim): "
        "queue 'team-b' fair share 2 GPUs: 0 allocated + 2 asked, within it"
    )
    # What if a node came: kube-scheduler would try b-0 again, and it fits the new node's 2
    # free GPUs; what the scheduler found before the node came is not what the replay says.
    (decision,) = admissions(
        picture_of(edited(taken, WhatIf({}, {}, {}, new_nodes=1), CLASS), PictureConfig())
    )
    assert (
        report([decision], [], [])[1]
        == "  ns/b-0 [team-b]: admitted: queue 'team-b' is within its limits and fair share"
    )
