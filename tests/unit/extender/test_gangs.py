"""Gang admission through the filter verb: a workload's minimum is admitted whole or not at all.

The cluster: nodes a and b with 2 GPUs each (4 GPUs), indexed Jobs whose pods ask one GPU each.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from contract.names import MIN_MEMBERS_ANNOTATION, WORKLOAD_LABEL
from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.picture.gangs import GangReservation
from extender.policy.placement import GpuDemand
from extender.server import build_app
from extender.status import StatusWriter, WaitingPods
from extender.verbs import decide_filter, decide_preemption
from extender.wire import ExtenderArgs, ExtenderPreemptionArgs, decode
from tests import extender_objects as objects
from tests.unit.extender.pictures import gang_members, lapse_gang_reservations, reserved_gangs, supply
from tests.unit.extender.serving import serve
from tests.unit.extender.test_server import CLASS, Extender, args


@pytest.fixture
async def extender() -> AsyncIterator[Extender]:
    picture, waiting, api = ClusterPicture(), WaitingPods(), ApiClient()
    app = build_app(picture, Binder(api, picture), waiting, ExtenderMetrics(picture))
    async with serve(app) as client:
        yield Extender(client, picture, waiting, api)
    await api.close()


NODES = ["a", "b"]


def reservation_of(extender: Extender, workload: str) -> GangReservation:
    found = extender.picture.gang_reservation(workload)
    assert found is not None, f"{workload} holds no reservation"
    return found


def job(name: str, parallelism: int, namespace: str = "ns") -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"parallelism": parallelism, "completions": parallelism, "completionMode": "Indexed"},
    }


def member(
    job_name: str, index: int, queue: str = "team", min_members: int | None = None, namespace: str = "ns"
) -> dict[str, Any]:
    pod = objects.pod(namespace, f"{job_name}-{index}", queue=queue, template="one")
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job_name,
            "uid": f"uid-{job_name}",
            "controller": True,
        }
    ]
    pod["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
    if min_members is not None:
        pod["metadata"]["annotations"][MIN_MEMBERS_ANNOTATION] = str(min_members)
    return pod


def cluster(*extra: dict[str, Any], limit: int | None = None) -> list[dict[str, Any]]:
    gpu: dict[str, Any] = {"limit": limit} if limit is not None else {}
    return [*objects.two_nodes_of_two_gpus(CLASS), objects.queue("team", resources={"gpu": gpu}), *extra]


def bind(picture: ClusterPicture, pod: dict[str, Any], node: str, device: str, version: int) -> None:
    """The pod bound to `node` with its claim (from the template) allocated to `device` there."""
    name = pod["metadata"]["name"]
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    picture.apply(
        "ResourceClaim", "ADDED", {**claim, "metadata": {**claim["metadata"], "resourceVersion": "1"}}
    )
    pod = {**pod, "spec": {**pod["spec"], "nodeName": node}}
    pod["metadata"] = {**pod["metadata"], "resourceVersion": str(version)}
    pod["status"] = {
        **pod["status"],
        "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}],
    }
    picture.apply("Pod", "MODIFIED", pod)


async def test_two_gangs_of_four_on_four_gpus_never_split(extender: Extender) -> None:
    first = [member("ja", i) for i in range(4)]
    second = [member("jb", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), job("jb", 4), *first, *second))

    # ja-0 comes first: ja's 4 pods fit the 4 free GPUs and are admitted as one.
    _, result = await extender.call("filter", args(first[0], NODES))
    assert result["NodeNames"] == NODES
    reservation = reservation_of(extender, "Job/ns/ja")
    assert (reservation.target, sorted(reservation.nodes)) == (4, ["a", "a", "b", "b"])
    report = extender.waiting.reports["ns/ja-0"]
    assert report.admitted and report.post_event  # condition True and a WorkloadAdmitted Event
    assert "workload Job/ns/ja (minimum 4 pods, 0 placed, 4 present) admitted whole: 4 pods held for" in (
        report.reason
    )

    # jb-0, interleaved by the scheduler: the 4 GPUs are ja's, so jb waits whole; no pod of jb takes one.
    for pod in second:
        _, result = await extender.call("filter", args(pod, NODES))
        assert result["NodeNames"] == []
        reason = result["FailedAndUnresolvableNodes"]["a"]
        assert "workload Job/ns/jb (minimum 4 pods, 0 placed, 4 present) starts whole or not at all" in reason
        assert "GPUs free for 0 of its 4 missing pods (1 GPU each)" in reason

    # The queue counts one workload admitted (ja, held for) and one waiting (jb).
    assert extender.picture.workload_counts() == {"team": (1, 1)}

    # ja's other pods pass on both nodes: the GPUs held for their gang are theirs.
    for pod in first[1:]:
        _, result = await extender.call("filter", args(pod, NODES))
        assert result["NodeNames"] == NODES

    # They bind (2 per node); each bind takes a slot once the picture sees its GPU taken, and the
    # reservation ends with the 4th.
    places = [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0"), ("b", "gpu-1")]
    for version, (pod, (node, device)) in enumerate(zip(first, places, strict=True), start=10):
        bind(extender.picture, pod, node, device, version)
        extender.picture.fairness()
    assert not (extender.picture.gang_reservation("Job/ns/ja") is not None)
    assert extender.picture.holds() == {}
    assert extender.picture.workload_counts() == {"team": (1, 1)}  # ja's minimum runs; jb waits


async def test_the_queue_admits_the_whole_minimum_or_nothing(extender: Extender) -> None:
    # Limit 3 GPUs, a gang of 4: 3 would fit the limit and the GPUs, but the gang needs 4.
    pods = [member("ja", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods, limit=3))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == []
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert (
        "its 4 missing pods together: queue 'team': gpu allocated 0 + request 4 would exceed its limit (3)"
        in (reason)
    )
    assert reserved_gangs(extender.picture) == []


async def test_a_gang_counts_its_reserved_members_against_the_queue(extender: Extender) -> None:
    # Limit 4: ja's minimum of 2 is admitted and counts 2 at once; a gang of 3 then exceeds the limit.
    ja = [member("ja", i) for i in range(2)]
    jb = [member("jb", i) for i in range(3)]
    extender.sync(cluster(job("ja", 2), job("jb", 3), *ja, *jb, limit=4))
    _, result = await extender.call("filter", args(ja[0], NODES))
    assert result["NodeNames"] == NODES
    assert extender.picture.fairness().usage["team"].allocated["gpu"] == 2  # ja-0 + one slot
    _, result = await extender.call("filter", args(jb[0], NODES))
    assert (
        "gpu allocated 2 + request 3 would exceed its limit (4)" in result["FailedAndUnresolvableNodes"]["a"]
    )


async def test_the_requeue_check_lets_a_member_of_a_gang_being_placed_through_as_the_filter_does(
    extender: Extender,
) -> None:
    # Limit 4: ja's minimum of 4 is admitted whole, its 3 slots and ja-0 (admitted, its bind to
    # come: 1 placed) count 4 of 4. ja-1 was refused before (its condition False). The filter
    # lets it through now - the unit it is in was judged ("is being placed") - and so does the
    # requeue check, which asks the same rule (it asked the queue for ja-1 alone before:
    # 4 + 1 > 4, never nudged).
    pods = [member("ja", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods, limit=4))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == NODES
    assert extender.picture.fairness().usage["team"].allocated["gpu"] == 4
    extender.waiting.refused("ns", "ja-1", "uid-ns-ja-1", "team", "waited for its gang")
    filtered = decide_filter(
        extender.picture, decode(ExtenderArgs, json.dumps(args(pods[1], NODES)).encode())
    )
    assert (filtered.admitted, filtered.reason) == (True, "fits")
    assert "(minimum 4 pods, 1 placed, 4 present) is being placed" in filtered.message
    writer = StatusWriter(extender.api, extender.picture, extender.waiting, ExtenderMetrics(extender.picture))
    assert [entry.name for entry in writer.eligible_now()] == ["ja-1"]


async def test_min_two_of_four_starts_with_two_and_grows(extender: Extender) -> None:
    pods = [member("ja", i, min_members=2) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == NODES
    assert reservation_of(extender, "Job/ns/ja").target == 2
    bind(extender.picture, pods[0], "a", "gpu-0", 10)
    bind(extender.picture, pods[1], "a", "gpu-1", 11)
    extender.picture.fairness()
    assert reserved_gangs(extender.picture) == []
    # The minimum runs (node a full): pods 3 and 4 are elastic and go one by one, as any pod.
    _, result = await extender.call("filter", args(pods[2], NODES))
    assert result["NodeNames"] == ["b"]
    assert "ns/ja-2" not in extender.waiting.reports  # admitted pod by pod, as any pod


async def test_a_gang_that_is_not_completed_in_time_gives_back_everything(extender: Extender) -> None:
    first = [member("ja", i) for i in range(4)]
    second = [member("jb", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), job("jb", 4), *first, *second))
    lapse_gang_reservations(extender.picture)  # ja's reservation lapses at once: no member is placed
    _, result = await extender.call("filter", args(first[0], NODES))
    assert result["NodeNames"] == NODES
    extender.picture.release("ns/ja-0")  # its bind did not come either
    _, result = await extender.call("filter", args(second[0], NODES))
    assert result["NodeNames"] == NODES
    assert reserved_gangs(extender.picture) == ["Job/ns/jb"]


async def test_a_gang_waiting_for_gpus_keeps_what_reclaim_holds_for_it(extender: Extender) -> None:
    first = [member("ja", i) for i in range(4)]
    second = [member("jb", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), job("jb", 4), *first, *second))
    _, result = await extender.call("filter", args(second[0], NODES))  # jb holds all 4 GPUs
    assert result["NodeNames"] == NODES
    # Reclaim freed a GPU for ja's members (its victims still terminating, say): ja-0 is refused
    # for want of GPUs, not by its queue, so the hold stays for it.
    extender.picture.hold("ns/ja-0", "a", GpuDemand(1), 90.0, owner="Job/ns/ja")
    _, result = await extender.call("filter", args(first[0], NODES))
    assert "GPUs free for 0 of its 4 missing pods" in result["FailedAndUnresolvableNodes"]["a"]
    assert extender.picture.held_for("ns/ja-0") is not None


async def test_members_rank_gpus_held_for_their_gang_as_free(extender: Extender) -> None:
    pods = [member("ja", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods))
    # Reclaim freed node a's two GPUs for the gang (held under ja-0's name, for any member).
    extender.picture.hold("ns/ja-0", "a", GpuDemand(2), 90.0, owner="Job/ns/ja")
    _, ranked = await extender.call("prioritize", args(pods[1], NODES))
    scores = {entry["Host"]: entry["Score"] for entry in ranked}
    assert scores["a"] == scores["b"] == 10  # both empty for ja-1: alike (not a "full" node a)
    _, ranked = await extender.call("prioritize", args(member("jb", 0), NODES))
    scores = {entry["Host"]: entry["Score"] for entry in ranked}
    assert (scores["a"], scores["b"]) == (0, 10)  # another workload's pod may not use them


def test_members_follow_the_pods_and_make_the_minimum_of_an_unread_owner() -> None:
    # Bare pods grouped by label: their minimum is the members that exist and have not finished.
    pods = []
    for i in range(3):
        pod = objects.pod("ns", f"w-{i}", queue="team", template="one")
        pod["metadata"]["labels"][WORKLOAD_LABEL] = "sweep"
        pods.append(pod)
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in [*cluster(), *pods] if o["kind"] == kind])
    gang = picture.gang(pods[0])
    assert (gang.workload.key, gang.minimum, gang.members, gang.admitted) == (
        "Workload/ns/sweep",
        3,
        3,
        False,
    )
    done = {
        **pods[2],
        "status": {"phase": "Succeeded"},
        "metadata": {**pods[2]["metadata"], "resourceVersion": "9"},
    }
    picture.apply("Pod", "MODIFIED", done)
    assert (picture.gang(pods[0]).minimum, picture.gang(pods[0]).members) == (2, 2)
    picture.apply("Pod", "DELETED", pods[1])
    assert gang_members(picture) == {"Workload/ns/sweep": {"ns/w-0"}}


def test_a_members_workload_follows_its_owner_job() -> None:
    # The workload of a stored pod is kept from one question to the next; a change of its Job
    # (parallelism 2 -> 3) or of the pod itself finds it again.
    picture = ClusterPicture()
    objs = [*cluster(), job("train", 2), member("train", 0), member("train", 1)]
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    stored = picture.kind("Pod")["ns/train-0"]
    assert picture.gang(stored).minimum == 2
    assert picture.gang(stored).minimum == 2  # the kept workload
    grown = {**job("train", 3), "metadata": {**job("train", 3)["metadata"], "resourceVersion": "9"}}
    picture.apply("Job", "MODIFIED", grown)
    assert picture.gang(stored).minimum == 3
    alone = objects.pod("ns", "train-0", queue="team", template="one")
    alone["metadata"]["resourceVersion"] = "10"
    picture.apply("Pod", "MODIFIED", alone)
    assert picture.gang(picture.kind("Pod")["ns/train-0"]).workload.single


def running_member(job_name: str, index: int, queue: str, node: str, device: str) -> list[dict[str, Any]]:
    """A member of an indexed Job running on `node` with its claim allocated to `device`."""
    pod = member(job_name, index, queue)
    pod["spec"]["nodeName"] = node
    name = pod["metadata"]["name"]
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    return [pod, claim]


async def test_the_schedulers_preemption_never_breaks_a_gang(extender: Extender) -> None:
    # Queue hog (quota 0) runs a gang of 2 (minimum 2) on node a and a lone pod on node b; urgent
    # (quota 4) waits with 4 pods: its fair share is 4, hog's 0. The scheduler proposes one victim
    # per node: on a, a gang member (evicting it would leave the gang below its minimum): dropped;
    # on b, the lone pod: kept.
    waiting = [objects.pod("ns", f"u-{i}", queue="urgent", template="one") for i in range(4)]
    pending = waiting[0]
    lone = objects.pod("ns", "lone", queue="hog", template="one", node_name="b")
    lone["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "lone-gpus"}]
    extender.sync(
        [
            *objects.two_nodes_of_two_gpus(CLASS),
            objects.queue("hog", resources={"gpu": {"quota": 0}}),
            objects.queue("urgent", resources={"gpu": {"quota": 4}}),
            job("jh", 2),
            *running_member("jh", 0, "hog", "a", "gpu-0"),
            *running_member("jh", 1, "hog", "a", "gpu-1"),
            lone,
            objects.claim("ns", "lone-gpus", objects.claim_spec(CLASS), allocated=[("b", "gpu-0", None)]),
            *waiting,
        ]
    )
    body = {
        "Pod": pending,
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": "uid-ns-jh-0"}], "NumPDBViolations": 0},
            "b": {"Pods": [{"UID": "uid-ns-lone"}], "NumPDBViolations": 0},
        },
    }
    status, result = await extender.call("preempt", body)
    assert status == 200
    assert list(result["NodeNameToMetaVictims"]) == ["b"]
    dropped = decide_preemption(
        extender.picture, decode(ExtenderPreemptionArgs, json.dumps(body).encode())
    ).dropped
    assert dropped == {
        "a": "pod ns/jh-0 is one of the 2 running pods of workload Job/ns/jh, its minimum: evicting it "
        "would break the gang"
    }


def pytorch_pod(name: str) -> dict[str, Any]:
    pod = objects.pod("ns", name, queue="team", template="one")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "pt", "uid": "u", "controller": True}
    ]
    return pod


PYTORCHJOB = {"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}}}}
PT_REF = ("kubeflow.org/v1", "PyTorchJob", "ns/pt")


async def test_a_gang_waits_for_its_owners_spec_then_takes_its_minimum_from_it(extender: Extender) -> None:
    # The operator created 2 of the PyTorchJob's 4 pods so far. Until the extender has read the
    # PyTorchJob, its pods wait; then the minimum is 4 (1 master + 3 workers), not the 2 present.
    pods = [pytorch_pod("pt-master-0"), pytorch_pod("pt-worker-0")]
    extender.sync(cluster(*pods))
    assert set(extender.picture.owners_to_read()) == {PT_REF}
    _, result = await extender.call("filter", args(pods[0], NODES))
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert "waits for its minimum: reading the spec of its PyTorchJob pt" in reason
    extender.picture.read_owner(PT_REF, PYTORCHJOB)
    _, result = await extender.call("filter", args(pods[0], NODES))
    reason = result["FailedAndUnresolvableNodes"]["a"]
    assert "workload PyTorchJob/ns/pt (minimum 4 pods, 0 placed, 2 present) waits for its pods" in reason
    # The last pods come: the 4 fit the 4 GPUs and are admitted whole.
    extender.picture.apply("Pod", "ADDED", pytorch_pod("pt-worker-1"))
    extender.picture.apply("Pod", "ADDED", pytorch_pod("pt-worker-2"))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == NODES
    assert reservation_of(extender, "PyTorchJob/ns/pt").target == 4


async def test_an_owner_that_cannot_be_read_leaves_the_minimum_to_the_pods(extender: Extender) -> None:
    pods = [pytorch_pod("pt-master-0"), pytorch_pod("pt-worker-0")]
    extender.sync(cluster(*pods))
    extender.picture.read_owner(PT_REF, None)  # e.g. the CRD is not installed: 404
    assert set(extender.picture.owners_to_read()) == set()
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert result["NodeNames"] == NODES  # the 2 present are the gang
    assert reservation_of(extender, "PyTorchJob/ns/pt").target == 2


def foreign_takes(extender: Extender, node: str, device: str) -> None:
    """A default-scheduler pod (it sees no holds) gets `device` on `node`: claim allocated, then bound."""
    claim = objects.claim("ns", "foreign-gpu", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    extender.picture.apply(
        "ResourceClaim", "ADDED", {**claim, "metadata": {**claim["metadata"], "resourceVersion": "1"}}
    )
    pod = objects.pod("ns", "foreign", claim_name="foreign-gpu", node_name=node)
    extender.picture.apply("Pod", "ADDED", {**pod, "metadata": {**pod["metadata"], "resourceVersion": "2"}})


async def test_a_slot_whose_gpu_another_scheduler_took_moves_to_a_node_with_room(extender: Extender) -> None:
    # A gang of 2 on 4 free GPUs: binpack plans both on a. A default-scheduler pod then takes
    # a's gpu-0: one slot still fits a (gpu-1), the other moves to b, where its member fits.
    pods = [member("ja", i) for i in range(2)]
    extender.sync(cluster(job("ja", 2), *pods))
    _, result = await extender.call("filter", args(pods[0], NODES))
    assert reservation_of(extender, "Job/ns/ja").nodes == ["a", "a"]
    foreign_takes(extender, "a", "gpu-0")
    extender.picture.fairness()
    assert sorted(reservation_of(extender, "Job/ns/ja").slots) == ["a", "b"]
    # Both members still have GPUs (a's gpu-1, and b's, held for their gang); others see neither.
    _, result = await extender.call("filter", args(pods[1], NODES))
    assert result["NodeNames"] == NODES
    assert supply(extender.picture, "ns/other", "b").free_milli == (0, 1000)


async def test_a_gang_whose_last_gpu_another_scheduler_took_is_judged_again_at_once(
    extender: Extender,
) -> None:
    """The live 3 Running + 1 Pending: 3 members bound, a default-scheduler pod takes the GPU held
    for the 4th. Nowhere else has room, so the reservation ends now (not after its 60 s hold): the
    4th is refused with the true count and is listed for reclaim at once."""
    pods = [member("ja", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods))
    await extender.call("filter", args(pods[0], NODES))
    for version, (pod, (node, device)) in enumerate(
        zip(pods[:3], [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0")], strict=False), start=10
    ):
        bind(extender.picture, pod, node, device, version)
        extender.picture.fairness()
    assert reservation_of(extender, "Job/ns/ja").slots == ["b"]
    foreign_takes(extender, "b", "gpu-1")
    extender.picture.fairness()
    assert not (extender.picture.gang_reservation("Job/ns/ja") is not None)
    assert extender.picture.holds() == {}
    _, result = await extender.call("filter", args(pods[3], NODES))
    reason = result["FailedAndUnresolvableNodes"]["b"]
    assert "workload Job/ns/ja (minimum 4 pods, 3 placed, 4 present) starts whole or not at all" in reason
    assert "GPUs free for 0 of its 1 missing pods" in reason
    assert [(p.key, p.workload) for p in extender.picture.waiting_pods()] == [("ns/ja-3", "Job/ns/ja")]


async def test_a_refused_members_reason_follows_its_gangs_binds(extender: Extender) -> None:
    """The live 3 Running + 1 Pending said "0 placed": ja-3 was refused before its gang started,
    and kube-scheduler's own DRA filter (no device left) never asked the extender about it again
    while the others bound. The status writer writes its refusal again when the count moves."""
    pods = [member("ja", i) for i in range(4)]
    extender.sync(cluster(job("ja", 4), *pods))
    foreign_takes(extender, "b", "gpu-1")  # 3 GPUs free for a gang of 4
    _, result = await extender.call("filter", args(pods[3], NODES))
    assert "(minimum 4 pods, 0 placed, 4 present)" in result["FailedAndUnresolvableNodes"]["a"]
    assert "GPUs free for 3 of its 4 missing pods" in result["FailedAndUnresolvableNodes"]["a"]
    writer = StatusWriter(extender.api, extender.picture, extender.waiting, ExtenderMetrics(extender.picture))
    extender.waiting.reports.clear()
    assert writer.eligible_now() == [] and extender.waiting.reports == {}  # nothing moved yet
    for version, (pod, (node, device)) in enumerate(
        zip(pods[:3], [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0")], strict=False), start=10
    ):
        bind(extender.picture, pod, node, device, version)
    assert writer.eligible_now() == []
    report = extender.waiting.reports["ns/ja-3"]
    assert (report.admitted, report.post_event) == (False, True)  # condition False and an Event
    assert (
        "workload Job/ns/ja (minimum 4 pods, 3 placed, 4 present) starts whole or not at all" in report.reason
    )
    assert "GPUs free for 0 of its 1 missing pods" in report.reason
    extender.waiting.reports.clear()
    assert writer.eligible_now() == [] and extender.waiting.reports == {}  # once per count
