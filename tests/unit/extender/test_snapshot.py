"""Snapshots and forks: a planner's "what if" on a copy, the live picture untouched.

Picture: node a has 4 H100s; team-a holds gpu-0 and gpu-1 whole and half of gpu-2 (40Gi of 80Gi);
team-b waits for one whole GPU. Every assertion on the fork is checked again on the live picture.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.placement import GpuDemand
from extender.policy.reclaim import Rules, plan
from extender.policy.snapshot import ClusterSnapshot, RunningPod, can_be_victim
from tests import extender_objects as objects
from tests.unit.extender.test_gangs import job, member

CLASS = "gpu.tessera.dev"


def held_pod(name: str, device: str, memory: str | None = None) -> list[dict[str, Any]]:
    """A team-a pod bound to node a, and its claim allocated `device` (whole, or `memory` of it)."""
    pod = objects.pod("ns", name, queue="team-a", template="one", node_name="a")
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    spec = objects.claim_spec(CLASS, memory=memory) if memory else objects.claim_spec(CLASS)
    return [pod, objects.claim("ns", f"{name}-gpus", spec, allocated=[("a", device, memory)])]


def picture() -> ClusterPicture:
    objs = [
        objects.node("a"),
        objects.gpu_slice("a", 4, shareable=True),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team-a", resources={"gpu": {"quota": 2}}),
        objects.queue("team-b", resources={"gpu": {"quota": 2}}),
        *held_pod("w0", "gpu-0"),
        *held_pod("w1", "gpu-1"),
        *held_pod("half", "gpu-2", memory="40Gi"),
        objects.pod("ns", "waiting", queue="team-b", template="one"),
    ]
    live = ClusterPicture()
    for kind in WATCHED_PATHS:
        live.replace(kind, [o for o in objs if o["kind"] == kind])
    return live


def test_snapshot_lists_running_pods_with_the_gpus_they_hold() -> None:
    snapshot = picture().snapshot()
    assert snapshot.nodes["a"].free_milli == (0, 0, 500, 1000)
    held = {key: (pod.queue, pod.node, pod.gpus) for key, pod in snapshot.running.items()}
    assert held == {
        "ns/w0": ("team-a", "a", ((0, 1000),)),
        "ns/w1": ("team-a", "a", ((1, 1000),)),
        "ns/half": ("team-a", "a", ((2, 500),)),
    }
    # team-a holds 2.5 GPUs (quota 2), team-b waits for 1.
    assert snapshot.fairness.usage["team-a"].allocated["gpu"] == pytest.approx(2.5)
    assert snapshot.fairness.usage["team-b"].requested["gpu"] == 1


def test_a_fork_evicts_and_places_while_the_live_picture_stays_as_it_was() -> None:
    live = picture()
    snapshot = live.snapshot()
    fork = snapshot.fork()
    whole = GpuDemand(count=2)
    assert fork.fitting_nodes(whole) == []  # one whole GPU free: two do not fit

    evicted = fork.evict("ns/w1")
    assert evicted.gpus == ((1, 1000),)
    assert fork.nodes["a"].free_milli == (0, 1000, 500, 1000)
    assert fork.fitting_nodes(whole) == ["a"]
    # The evicted pod's queue holds 1.5 GPUs and waits for the 1 it gave back; shares unchanged.
    assert fork.fairness.usage["team-a"].allocated["gpu"] == pytest.approx(1.5)
    assert fork.fairness.usage["team-a"].requested["gpu"] == pytest.approx(1.0)
    assert fork.fairness.fair_shares == snapshot.fairness.fair_shares

    waiting = RunningPod(key="ns/waiting", queue="team-b", node="", gpus=(), resources={"gpu": 1.0})
    placed = fork.place(waiting, GpuDemand(count=1), "a")
    assert placed is not None and placed.gpus in (((1, 1000),), ((3, 1000),))
    assert fork.fairness.usage["team-b"].allocated["gpu"] == 1
    assert fork.fairness.usage["team-b"].requested.get("gpu", 0) == 0
    assert fork.place(waiting, GpuDemand(count=4), "a") is None  # does not fit: nothing changes

    # The snapshot the fork came from and the live picture are untouched.
    assert snapshot.nodes["a"].free_milli == (0, 0, 500, 1000)
    assert set(snapshot.running) == {"ns/w0", "ns/w1", "ns/half"}
    assert snapshot.fairness.usage["team-b"].requested["gpu"] == 1
    assert live.node_gpus("a").free_milli == (0, 0, 500, 1000)
    assert live.fairness().usage["team-a"].allocated["gpu"] == pytest.approx(2.5)
    assert live.fairness().usage["team-b"].requested["gpu"] == 1


def test_forks_of_forks_are_independent() -> None:
    first = picture().snapshot().fork()
    first.evict("ns/w0")
    second = first.fork()
    second.evict("ns/half")
    assert first.nodes["a"].free_milli == (1000, 0, 500, 1000)
    assert second.nodes["a"].free_milli == (1000, 0, 1000, 1000)
    assert "ns/half" in first.running and "ns/half" not in second.running


def counted(snapshot: ClusterSnapshot) -> dict[str, set[str]]:
    """Per queue, the nodes of its possible victims by a pass over every running pod."""
    nodes: dict[str, set[str]] = {}
    for pod in snapshot.running.values():
        if can_be_victim(pod):
            nodes.setdefault(pod.queue, set()).add(pod.node)
    return nodes


def test_a_snapshot_after_events_equals_one_of_a_fresh_picture() -> None:
    # Snapshots keep their running pods from one to the next and re-read only pods that changed.
    # After each event the live picture's snapshot equals a fresh picture's over the same objects:
    # a pod bound (waiting gets gpu-3 through its claim), a pod deleted (w0), one terminating
    # (w1), and a classic-GPU pod on a node of device-plugin GPUs (numbered per node).
    live = picture()
    live.node_gpus("a")
    assert set(live.snapshot().running) == {"ns/w0", "ns/w1", "ns/half"}

    def fresh() -> ClusterPicture:
        again = ClusterPicture()
        for kind in WATCHED_PATHS:
            again.replace(kind, list(live.kind(kind).values()))
        return again

    def same() -> None:
        ours, theirs = live.snapshot(), fresh().snapshot()
        assert dict(ours.running) == dict(theirs.running)
        assert dict(ours.nodes) == dict(theirs.nodes)
        assert ours.terminating() == theirs.terminating()
        # The possible victims' nodes, kept from one snapshot to the next, as a fresh count.
        assert ours.victim_nodes() == theirs.victim_nodes() == counted(ours)

    bound = objects.pod("ns", "waiting", queue="team-b", template="one", node_name="a")
    bound["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "waiting-gpus"}]
    claim = objects.claim("ns", "waiting-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-3", None)])
    live.apply("ResourceClaim", "ADDED", claim)
    live.apply("Pod", "MODIFIED", bound)
    same()
    assert live.snapshot().running["ns/waiting"].gpus == ((3, 1000),)
    live.apply("Pod", "DELETED", live.kind("Pod")["ns/w0"])
    same()
    terminating = dict(live.kind("Pod")["ns/w1"])
    terminating["metadata"] = {**terminating["metadata"], "deletionTimestamp": "2026-12-01T10:00:00Z"}
    live.apply("Pod", "MODIFIED", terminating)
    same()
    assert live.snapshot().running["ns/w1"].terminating
    assert live.snapshot().terminating() == ["ns/w1"]
    classic_node = objects.node("c")
    classic_node["status"] = {"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "2"}}
    live.apply("Node", "ADDED", classic_node)
    live.apply("Pod", "ADDED", objects.pod("ns", "classic", queue="team-a", node_name="c", classic_gpus=1))
    same()
    assert [i for i, _ in live.snapshot().running["ns/classic"].gpus] == [1]  # the last GPU of c


def test_a_snapshot_knows_the_minimum_of_each_gang_with_running_members() -> None:
    # Indexed Job "train" (3 pods, at least 2 together) has member 0 running on node a (gpu-3)
    # and members 1 and 2 waiting; Job "later" (2 pods) has only a member waiting: only train has
    # a minimum in the snapshot, 2 (found from the gangs' members, not by a pass over the pods).
    live = picture()
    live.apply("Job", "ADDED", job("train", 3))
    live.apply("Job", "ADDED", job("later", 2))
    for index, device in ((0, "gpu-3"), (1, None), (2, None)):
        pod = member("train", index, queue="team-a", min_members=2)
        if device is not None:
            name = pod["metadata"]["name"]
            pod["spec"]["nodeName"] = "a"
            pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
            claim = objects.claim(
                "ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[("a", device, None)]
            )
            live.apply("ResourceClaim", "ADDED", claim)
        live.apply("Pod", "ADDED", pod)
    live.apply("Pod", "ADDED", member("later", 0, queue="team-a"))
    snapshot = live.snapshot()
    train = snapshot.running["ns/train-0"].workload
    assert train and snapshot.minimums == {train: 2}


def test_an_urgent_pod_is_listed_and_preempts_its_queues_newest_preemptible_pod() -> None:
    # Node a, 4 H100; team-a (quota 4) runs 4 of its own preemptible pods (priority 0, w1 the
    # newest). An urgent pod of team-a (priority 1000: not preemptible) waits. The quota counts
    # non-preemptible use: 0 + 1 <= 4, so the waiting list has it (before, 4 + 1 > 4 refused it
    # over_quota forever) and the planner preempts within the queue: the newest preemptible pod.
    pods = [
        *held_pod("w0", "gpu-0"),
        *held_pod("w2", "gpu-2"),
        *held_pod("w3", "gpu-3"),
        *held_pod("w1", "gpu-1"),
    ]
    for index, obj in enumerate(o for o in pods if o["kind"] == "Pod"):
        obj["status"]["startTime"] = f"2026-12-01T10:00:0{index}Z"
    urgent = objects.pod("ns", "urgent", queue="team-a", template="one")
    urgent["spec"]["priority"] = 1000
    objs = [
        objects.node("a"),
        objects.gpu_slice("a", 4),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("team-a", resources={"gpu": {"quota": 4}}),
        *pods,
        urgent,
    ]
    live = ClusterPicture()
    for kind in WATCHED_PATHS:
        live.replace(kind, [o for o in objs if o["kind"] == kind])
    waiting = live.waiting_pods()
    assert [(p.key, p.preemptible) for p in waiting] == [("ns/urgent", False)]
    assert live.fairness().usage["team-a"].non_preemptible == {}
    plans = plan(live.snapshot(), waiting, datetime(2026, 12, 1, 11, tzinfo=UTC).timestamp(), Rules())
    assert [(p.goal, [e.pod.key for e in p.evictions]) for p in plans] == [("preempt", ["ns/w1"])]
