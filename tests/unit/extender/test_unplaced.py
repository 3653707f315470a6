"""Which waiting pods the planners may serve: those kube-scheduler tried and could not place.

The reclaim loop plans (reclaim, then consolidation) only while `unplaced_waiting()` holds; a pod
the scheduler has not tried yet may well fit where it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from extender.controllers.reclaim import ReclaimLoop, ReclaimOptions
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, scheduler_gave_up
from extender.policy.reclaim import PendingPod
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"


def scheduled(status: str, reason: str) -> dict[str, Any]:
    """The PodScheduled condition kube-scheduler writes."""
    return {"type": "PodScheduled", "status": status, "reason": reason}


def gpu_pod(name: str, *conditions: Mapping[str, Any], node: str | None = None) -> dict[str, Any]:
    pod = objects.pod("ns", name, queue="q", template="one", node_name=node)
    pod["status"]["conditions"] = list(conditions)
    return pod


def picture_of(pods: Sequence[Mapping[str, Any]]) -> ClusterPicture:
    objs = [
        objects.node("a"),
        objects.gpu_slice("a", 4),
        objects.device_class(CLASS),
        objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
        objects.queue("q"),
        *pods,
    ]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


@pytest.mark.parametrize(
    ("conditions", "node", "gave_up"),
    [
        ((), None, False),  # new: the scheduler has not tried it yet
        ((scheduled("False", "Unschedulable"),), None, True),  # tried: no node fit, or the filter refused
        ((scheduled("False", "SchedulerError"),), None, False),  # an error: the scheduler retries it
        ((scheduled("False", "SchedulingGated"),), None, False),  # gated: never tried
        ((scheduled("True", ""),), "a", False),  # placed
        ((scheduled("False", "Unschedulable"),), "a", False),  # bound since (the condition lags)
        (({"type": "Ready", "status": "False"},), None, False),  # another condition only
    ],
)
def test_a_pod_the_scheduler_gave_up_on(
    conditions: tuple[dict[str, Any], ...], node: str | None, gave_up: bool
) -> None:
    assert scheduler_gave_up(gpu_pod("p", *conditions, node=node)) is gave_up


def test_planning_waits_for_a_waiting_gpu_pod_the_scheduler_could_not_place() -> None:
    picture = picture_of([gpu_pod("new"), gpu_pod("gated", scheduled("False", "SchedulingGated"))])
    assert not picture.unplaced_waiting()  # two GPU pods wait, neither was tried

    refused = gpu_pod("new", scheduled("False", "Unschedulable"))
    refused["metadata"]["resourceVersion"] = "2"
    picture.apply("Pod", "MODIFIED", refused)
    assert picture.unplaced_waiting()

    bound = gpu_pod("new", scheduled("True", ""), node="a")
    bound["metadata"]["resourceVersion"] = "3"
    picture.apply("Pod", "MODIFIED", bound)
    assert not picture.unplaced_waiting()


def test_a_cpu_pod_the_scheduler_could_not_place_is_no_reason_to_plan() -> None:
    cpu_only = objects.pod("ns", "cpu", queue="q")
    cpu_only["status"]["conditions"] = [scheduled("False", "Unschedulable")]
    picture = picture_of([cpu_only])
    assert scheduler_gave_up(cpu_only)
    assert not picture.unplaced_waiting()  # not a waiting GPU pod: reclaim frees only GPUs


def test_a_deleted_pod_leaves_the_unplaced_set() -> None:
    refused = gpu_pod("p", scheduled("False", "Unschedulable"))
    picture = picture_of([refused])
    assert picture.unplaced_waiting()
    picture.apply("Pod", "DELETED", refused)
    assert not picture.unplaced_waiting()


class FollowUp:
    """A consolidator stand-in: whether it has work of its own, and the waiting pods it was given."""

    def __init__(self, own_work: bool) -> None:
        self.own_work = own_work
        self.given: list[list[str]] = []
        self.planned = asyncio.Event()  # set by each cycle that planned

    def has_own_work(self) -> bool:
        return self.own_work

    async def run_once(self, snapshot: object, waiting: Sequence[PendingPod], served: object) -> None:
        self.given.append([pod.key for pod in waiting])
        self.planned.set()


def counter(metrics: ExtenderMetrics, name: str) -> float:
    return sum(s.value for family in metrics.registry.collect() for s in family.samples if s.name == name)


@pytest.mark.parametrize(
    ("conditions", "own_work", "plans"),
    [
        ((), False, False),  # a new pod only: the cycle is skipped
        ((), True, True),  # consolidation has moves to check: the cycle plans
        ((scheduled("False", "Unschedulable"),), False, True),  # the scheduler gave up on it
    ],
)
async def test_a_reclaim_cycle_plans_only_when_something_can_come_of_it(
    conditions: tuple[dict[str, Any], ...], own_work: bool, plans: bool
) -> None:
    picture = picture_of([gpu_pod("p", *conditions)])
    metrics = ExtenderMetrics(picture)
    api = ApiClient()
    loop = ReclaimLoop(api, picture, metrics)
    follow_up = FollowUp(own_work)
    loop.follow_ups.append(follow_up)
    try:
        assert await loop.run_once() == []  # the pod fits a free GPU: nothing to evict
    finally:
        await api.close()
    assert counter(metrics, "tessera_reclaim_cycles_skipped_total") == (0 if plans else 1)
    assert counter(metrics, "tessera_reclaim_cycle_duration_seconds_count") == (1 if plans else 0)
    # A cycle that plans hands every waiting pod on, tried or not (the plan itself is unchanged).
    assert follow_up.given == ([["ns/p"]] if plans else [])


def test_the_reclaim_loop_is_woken_when_the_scheduler_gives_up_on_a_pod() -> None:
    """Only a pod newly given up on wakes the loop: a second refusal of the same pod, a bind, and
    a pod never tried do not (the loop then plans at its interval, as before)."""
    picture = picture_of([gpu_pod("p"), gpu_pod("other")])
    wakes: list[int] = []
    picture.unplaced_listeners.append(lambda: wakes.append(len(wakes)))

    def update(name: str, version: str, *conditions: Mapping[str, Any], node: str | None = None) -> None:
        pod = gpu_pod(name, *conditions, node=node)
        pod["metadata"]["resourceVersion"] = version
        picture.apply("Pod", "MODIFIED", pod)

    update("p", "2", scheduled("False", "Unschedulable"))
    assert len(wakes) == 1  # given up on: wake
    update("p", "3", scheduled("False", "Unschedulable"))
    assert len(wakes) == 1  # refused again (a new message): already unplaced, no wake
    update("other", "2", scheduled("False", "SchedulingGated"))
    assert len(wakes) == 1  # gated, never tried
    update("p", "4", scheduled("True", ""), node="a")
    assert len(wakes) == 1  # bound: leaves the set
    update("other", "3", scheduled("False", "Unschedulable"))
    assert len(wakes) == 2


async def test_a_pod_given_up_on_runs_a_reclaim_cycle_at_once() -> None:
    """An hour's interval: the cycle that plans comes from the wake alone."""
    picture = picture_of([gpu_pod("p")])
    metrics = ExtenderMetrics(picture)
    api = ApiClient()
    loop = ReclaimLoop(api, picture, metrics, ReclaimOptions(interval_s=3600.0))
    follow_up = FollowUp(False)
    loop.follow_ups.append(follow_up)
    loop.start()
    try:
        refused = gpu_pod("p", scheduled("False", "Unschedulable"))
        refused["metadata"]["resourceVersion"] = "2"
        picture.apply("Pod", "MODIFIED", refused)
        await asyncio.wait_for(follow_up.planned.wait(), 30)
        assert follow_up.given == [["ns/p"]]
    finally:
        await loop.stop()
        await api.close()
    assert picture.unplaced_listeners == []  # stopped: no longer woken
