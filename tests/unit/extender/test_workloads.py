"""The workload map: every row of the table (with and without the owner's object), the annotation
override, and the gang planner. Objects are plain JSON as the API serves them; no CRD is needed."""

from __future__ import annotations

from typing import Any

import pytest

from contract.names import MIN_MEMBERS_ANNOTATION, WORKLOAD_LABEL
from extender.picture.gangs import remaining_slots
from extender.policy.placement import GpuDemand, NodeGpus
from extender.policy.workloads import Workload, plan_gang, workload_of

JsonObject = dict[str, Any]


def pod(
    owner: tuple[str, str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    group: str | None = None,
) -> JsonObject:
    """Pod `w-0` in namespace `ns`, controlled by (apiVersion, kind, name) when given."""
    metadata: JsonObject = {"name": "w-0", "namespace": "ns", "labels": labels or {}}
    metadata["annotations"] = annotations or {}
    if owner is not None:
        api_version, kind, name = owner
        metadata["ownerReferences"] = [
            {"apiVersion": api_version, "kind": kind, "name": name, "uid": "u", "controller": True}
        ]
    spec: JsonObject = {"containers": []}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"metadata": metadata, "spec": spec}


INDEXED = {"batch.kubernetes.io/job-completion-index": "0"}
JOB = ("batch/v1", "Job", "train")


def job(parallelism: int | None, completions: int | None, jobset: str | None = None) -> JsonObject:
    spec: JsonObject = {"completionMode": "Indexed"}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    labels = {"jobset.sigs.k8s.io/jobset-name": jobset} if jobset else {}
    return {"metadata": {"name": "train", "namespace": "ns", "labels": labels}, "spec": spec}


PYTORCHJOB = {
    "spec": {
        "pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 3}},
        "runPolicy": {},
    }
}
MPIJOB_MIN = {
    "spec": {
        "mpiReplicaSpecs": {"Launcher": {"replicas": 1}, "Worker": {"replicas": 8}},
        "runPolicy": {"schedulingPolicy": {"minAvailable": 5}},
    }
}
RAYCLUSTER = {
    "spec": {
        "headGroupSpec": {},
        "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 4, "minReplicas": 2, "maxReplicas": 8},
            {"groupName": "tpu", "replicas": 1, "minReplicas": 1, "numOfHosts": 4},
        ],
    }
}
JOBSET = {
    "spec": {
        "replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 4, "completions": 4}}},
        ]
    }
}
PODGROUP = {"spec": {"schedulingPolicy": {"gang": {"minCount": 6}}}}
LWS = {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "1"}


def known(objects: dict[tuple[str, str], JsonObject]) -> Any:
    return lambda kind, key: objects.get((kind, key))


# (case, pod, objects the caller has) -> (workload key, minimum, row). Minimum None: the members.
TABLE: list[tuple[str, JsonObject, dict[tuple[str, str], JsonObject], tuple[str, int | None, str]]] = [
    # An indexed Job: parallelism 8, completions 8 -> all 8 ranks together.
    (
        "indexed job",
        pod(JOB, annotations=INDEXED),
        {("Job", "ns/train"): job(8, 8)},
        ("Job/ns/train", 8, "indexed job"),
    ),
    # Parallelism above completions: only 4 indexes exist -> 4.
    (
        "indexed, few completions",
        pod(JOB, annotations=INDEXED),
        {("Job", "ns/train"): job(6, 4)},
        ("Job/ns/train", 4, "indexed job"),
    ),
    # Parallelism unset defaults to 1: a one-pod gang.
    (
        "indexed, default parallelism",
        pod(JOB, annotations=INDEXED),
        {("Job", "ns/train"): job(None, 5)},
        ("Job/ns/train", 1, "indexed job"),
    ),
    ("indexed job unknown", pod(JOB, annotations=INDEXED), {}, ("Job/ns/train", None, "indexed job")),
    # A non-indexed Job is a pool of independent work items: each pod alone.
    ("non-indexed job", pod(JOB), {("Job", "ns/train"): job(8, 100)}, ("Pod/ns/w-0", 1, "pod")),
    # JobSet: 1 driver x 1 + 2 worker jobs x 4 = 9.
    (
        "jobset",
        pod(JOB, labels={"jobset.sigs.k8s.io/jobset-name": "js"}, annotations=INDEXED),
        {("JobSet", "ns/js"): JOBSET},
        ("JobSet/ns/js", 9, "jobset"),
    ),
    # JobSet object unknown (CRD not watched): its Jobs, which the extender watches, say 4.
    (
        "jobset via its jobs",
        pod(JOB, labels={"jobset.sigs.k8s.io/jobset-name": "js"}),
        {("Job", "ns/train"): job(4, 4, jobset="js")},
        ("JobSet/ns/js", 4, "jobset"),
    ),
    (
        "jobset unknown",
        pod(JOB, labels={"jobset.sigs.k8s.io/jobset-name": "js"}),
        {},
        ("JobSet/ns/js", None, "jobset"),
    ),
    # A TrainJob runs in a JobSet of its name: the same row.
    (
        "trainjob",
        pod(("batch/v1", "Job", "tj-node-0"), labels={"jobset.sigs.k8s.io/jobset-name": "tj"}),
        {},
        ("JobSet/ns/tj", None, "jobset"),
    ),
    # PyTorchJob: master 1 + workers 3 = 4.
    (
        "pytorchjob",
        pod(("kubeflow.org/v1", "PyTorchJob", "pt")),
        {("PyTorchJob", "ns/pt"): PYTORCHJOB},
        ("PyTorchJob/ns/pt", 4, "kubeflow"),
    ),
    (
        "pytorchjob unknown",
        pod(("kubeflow.org/v1", "PyTorchJob", "pt")),
        {},
        ("PyTorchJob/ns/pt", None, "kubeflow"),
    ),
    # MPIJob with runPolicy.schedulingPolicy.minAvailable 5: 5, not 1 + 8.
    (
        "mpijob minAvailable",
        pod(("kubeflow.org/v2beta1", "MPIJob", "mpi")),
        {("MPIJob", "ns/mpi"): MPIJOB_MIN},
        ("MPIJob/ns/mpi", 5, "kubeflow"),
    ),
    # RayCluster: head 1 + gpu minReplicas 2 + tpu minReplicas 1 x 4 hosts = 7 (autoscaled: elastic).
    (
        "raycluster",
        pod(("ray.io/v1", "RayCluster", "rc")),
        {("RayCluster", "ns/rc"): RAYCLUSTER},
        ("RayCluster/ns/rc", 7, "ray"),
    ),
    # A RayJob's pods belong to the RayCluster it made.
    (
        "rayjob",
        pod(("ray.io/v1", "RayCluster", "rj-raycluster-x")),
        {},
        ("RayCluster/ns/rj-raycluster-x", None, "ray"),
    ),
    # LeaderWorkerSet: one group = leader + workers, its size on every pod.
    (
        "leaderworkerset",
        pod(
            ("apps/v1", "StatefulSet", "serve-1"),
            labels=LWS,
            annotations={"leaderworkerset.sigs.k8s.io/size": "4"},
        ),
        {},
        ("LeaderWorkerSet/ns/serve-1", 4, "lws"),
    ),
    # Deployment (through its ReplicaSet) and StatefulSet replicas stand alone.
    ("deployment", pod(("apps/v1", "ReplicaSet", "web-5d9c")), {}, ("Pod/ns/w-0", 1, "pod")),
    ("statefulset", pod(("apps/v1", "StatefulSet", "db")), {}, ("Pod/ns/w-0", 1, "pod")),
    ("bare pod", pod(), {}, ("Pod/ns/w-0", 1, "pod")),
    # Bare pods grouped by label: as many as exist.
    ("labelled bare pods", pod(labels={WORKLOAD_LABEL: "sweep"}), {}, ("Workload/ns/sweep", None, "label")),
    # KEP-4671 pods name their PodGroup; its gang minCount 6.
    ("podgroup", pod(group="pg"), {("PodGroup", "ns/pg"): PODGROUP}, ("PodGroup/ns/pg", 6, "podgroup")),
    ("podgroup unknown", pod(group="pg"), {}, ("PodGroup/ns/pg", None, "podgroup")),
    # The annotation overrides any row's minimum ...
    (
        "annotation on a job",
        pod(JOB, annotations={**INDEXED, MIN_MEMBERS_ANNOTATION: "2"}),
        {("Job", "ns/train"): job(4, 4)},
        ("Job/ns/train", 2, "annotation"),
    ),
    (
        "annotation, unknown owner",
        pod(("kubeflow.org/v1", "PyTorchJob", "pt"), annotations={MIN_MEMBERS_ANNOTATION: "3"}),
        {},
        ("PyTorchJob/ns/pt", 3, "annotation"),
    ),
    # ... and groups the pods of a controller that has no row of its own.
    (
        "annotation on a statefulset",
        pod(("apps/v1", "StatefulSet", "db"), annotations={MIN_MEMBERS_ANNOTATION: "3"}),
        {},
        ("StatefulSet/ns/db", 3, "annotation"),
    ),
    (
        "annotation on a non-indexed job",
        pod(JOB, annotations={MIN_MEMBERS_ANNOTATION: "2"}),
        {},
        ("Job/ns/train", 2, "annotation"),
    ),
    # A bare pod cannot be a gang of 3 by itself, and a count that is no count is ignored.
    (
        "annotation on a bare pod",
        pod(annotations={MIN_MEMBERS_ANNOTATION: "3"}),
        {},
        ("Pod/ns/w-0", 1, "pod"),
    ),
    (
        "unreadable annotation",
        pod(JOB, annotations={**INDEXED, MIN_MEMBERS_ANNOTATION: "-1"}),
        {("Job", "ns/train"): job(4, 4)},
        ("Job/ns/train", 4, "indexed job"),
    ),
]


@pytest.mark.parametrize(("case", "obj", "objects", "expected"), TABLE, ids=[row[0] for row in TABLE])
def test_the_workload_table(
    case: str,
    obj: JsonObject,
    objects: dict[tuple[str, str], JsonObject],
    expected: tuple[str, int | None, str],
) -> None:
    def owned(kind: str, key: str) -> list[JsonObject]:
        name = key.split("/")[1]
        return [
            o
            for (k, _), o in objects.items()
            if k == "Job" and o["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
        ]

    found = workload_of(obj, known(objects), owned)
    assert (found.key, found.minimum, found.rule) == expected
    assert found.single == (found.kind == "Pod")


def test_a_kind_of_the_same_name_from_another_api_group_is_not_matched() -> None:
    assert workload_of(pod(("example.com/v1", "PyTorchJob", "pt"))) == Workload(
        "Pod/ns/w-0", "Pod", "w-0", 1, "pod"
    )


def node(name: str, *free: int) -> NodeGpus:
    return NodeGpus(name=name, model="H100", free_milli=tuple(free))


ONE = GpuDemand(count=1)
TWO = GpuDemand(count=2)

# (nodes, demand, members) -> nodes chosen (fewer than asked: only that many fit).
PLANS: list[tuple[list[NodeGpus], GpuDemand, int, list[str]]] = [
    # 7 members of 1 GPU on 4 + 3 free: all of them, the fuller node (b) first (binpack).
    (
        [node("a", 1000, 1000, 1000, 1000), node("b", 0, 1000, 1000, 1000)],
        ONE,
        7,
        ["b", "b", "b", "a", "a", "a", "a"],
    ),
    # 4 free GPUs for 8 members: room for 4 only.
    ([node("a", 1000, 1000, 0, 0), node("b", 1000, 1000, 0, 0)], ONE, 8, ["a", "a", "b", "b"]),
    # Members of 2 GPUs: 3 free on each node hold one each, not three in all.
    ([node("a", 1000, 1000, 1000, 0), node("b", 1000, 1000, 1000, 0)], TWO, 3, ["a", "b"]),
    ([], ONE, 2, []),
]


@pytest.mark.parametrize(("nodes", "demand", "count", "expected"), PLANS)
def test_plan_gang(nodes: list[NodeGpus], demand: GpuDemand, count: int, expected: list[str]) -> None:
    assert plan_gang(nodes, demand, count) == expected


# (planned nodes, where members landed, slots still to hold) -> the slots held.
SLOTS: list[tuple[list[str], list[str], int, list[str]]] = [
    # Two of a, two of b planned; one member landed on b: one slot of b goes.
    (["a", "a", "b", "b"], ["b"], 3, ["a", "a", "b"]),
    # A member landed on c, where nothing was planned: the last slot goes.
    (["a", "a", "b", "b"], ["c"], 3, ["a", "a", "b"]),
    # A member admitted but not bound yet (no node): the count alone shrinks.
    (["a", "b"], [], 1, ["a"]),
    (["a", "b"], ["a", "b"], 0, []),
]


@pytest.mark.parametrize(("planned", "landed", "count", "expected"), SLOTS)
def test_remaining_slots(planned: list[str], landed: list[str], count: int, expected: list[str]) -> None:
    assert remaining_slots(planned, landed, count) == expected
