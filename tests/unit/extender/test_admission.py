"""Admission decisions as worked examples: queue defaults, the gate, pod patches, Queue and
GpuConfig checks (plain dicts in, decisions out)."""

from __future__ import annotations

from typing import Any

import pytest

from contract.names import ADMISSION_GATE, NAMESPACE_QUEUE_LABEL, QUEUE_LABEL
from extender.admission import (
    claim_config_problems,
    gate_reason,
    gate_removal,
    pod_patch,
    queue_problems,
    resolve_queue,
)
from extender.policy.admission import Ask, GangState
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.workloads import Workload
from extender.webhook import owner_path
from tests import extender_objects as objects

Q = QUEUE_LABEL


@pytest.mark.parametrize(
    ("pod", "owners", "namespace", "expected"),
    [
        # The pod's own label wins over everything.
        ({Q: "a"}, [{Q: "b"}], {NAMESPACE_QUEUE_LABEL: "c"}, ("a", "pod")),
        # Owners, own first: ReplicaSet "rs", Deployment "dep": the top one (the Deployment) wins.
        ({}, [{Q: "rs"}, {Q: "dep"}], {NAMESPACE_QUEUE_LABEL: "c"}, ("dep", "owner")),
        # A top owner without the label: the highest one that has it.
        ({}, [{Q: "rs"}, {"app": "x"}], {}, ("rs", "owner")),
        # No owner names one: the Namespace's default queue.
        ({}, [{"app": "x"}], {NAMESPACE_QUEUE_LABEL: "team-ns"}, ("team-ns", "namespace")),
        # Nothing anywhere (an empty label counts as none): the default queue.
        ({Q: ""}, [], {NAMESPACE_QUEUE_LABEL: ""}, ("default", "default")),
        ({}, [], None, ("default", "default")),
    ],
)
def test_queue_resolution(
    pod: dict[str, str],
    owners: list[dict[str, str]],
    namespace: dict[str, str] | None,
    expected: tuple[str, str],
) -> None:
    choice = resolve_queue(pod, owners, namespace)
    assert (choice.queue, choice.source) == expected


def _view(limit: float, held: float) -> FairnessSnapshot:
    spec = QueueSpec(name="team", quota={"gpu": 2}, limit={"gpu": limit})
    usage = {"team": QueueUsage(allocated={"gpu": held}, requested={})}
    return FairnessSnapshot.build((spec,), usage, {"gpu": 8})


@pytest.mark.parametrize(
    ("limit", "held", "ahead", "asked", "gated"),
    [
        (4, 2, 0, 1, False),  # 2 + 1 <= 4
        (4, 2, 1, 1, False),  # 2 + 1 ahead + 1 = 4 <= 4
        (4, 2, 2, 1, True),  # 2 + 2 ahead + 1 = 5 > 4
        (4, 4, 0, 1, True),  # at its limit: 4 + 1 > 4
        (4, 0, 0, 5, True),  # one pod above the limit on its own: 5 > 4
    ],
)
def test_gate_reason_counts_the_pods_ahead(
    limit: float, held: float, ahead: float, asked: float, gated: bool
) -> None:
    reason = gate_reason(_view(limit, held), Ask("team", {"gpu": asked}, ahead={"gpu": ahead}))
    assert bool(reason) is gated
    if gated:
        assert "queue 'team'" in reason and "limit" in reason


def _gang(minimum: int, members: int, placed: int, reading: bool = False) -> GangState:
    kind = "PyTorchJob" if reading else "Job"
    spec = ("kubeflow.org/v1", kind, "j") if reading else None
    return GangState(
        Workload(f"{kind}/ns/j", kind, "j", minimum, "test", spec), minimum, members, placed, reading=reading
    )


@pytest.mark.parametrize(
    ("limit", "held", "ahead", "gang", "needle"),
    [
        # 3 of its minimum 4 pods exist: incomplete, whatever the queue's room (the filter's words).
        (
            8,
            0,
            0,
            _gang(4, 3, 0),
            "(minimum 4 pods, 0 placed, 3 present) waits for its pods: 3 of its minimum 4 exist",
        ),
        # Complete: its 4 missing pods together, 4 x 1 = 4 <= 4.
        (4, 0, 0, _gang(4, 4, 0), ""),
        # The same gang at limit 2: 4 x 1 = 4 > 2, all of it waits.
        (2, 0, 0, _gang(4, 4, 0), "its 4 missing pods together"),
        # Other pods ahead count too: 1 + 4 = 5 > 4.
        (4, 0, 1, _gang(4, 4, 0), "its 4 missing pods together"),
        # 2 of its minimum 4 placed, 5 present: the 2 missing, 2 + 2 x 1 = 4 <= 4.
        (4, 2, 0, _gang(4, 5, 2), ""),
        # Its minimum is still being read from its owner: it waits for it.
        (
            8,
            0,
            0,
            _gang(1, 1, 0, reading=True),
            "waits for its minimum: reading the spec of its PyTorchJob j",
        ),
    ],
)
def test_gate_reason_of_a_gang_counts_its_whole_missing_demand(
    limit: float, held: float, ahead: float, gang: GangState, needle: str
) -> None:
    reason = gate_reason(_view(limit, held), Ask("team", {"gpu": 1}, gang=gang, ahead={"gpu": ahead}))
    assert (needle in reason) if needle else reason == ""


def test_gate_reason_for_a_queue_that_does_not_exist() -> None:
    assert "does not exist" in gate_reason(_view(4, 0), Ask("nobody", {"gpu": 1}))


def test_pod_patch_sets_label_scheduler_and_gate() -> None:
    pod = objects.pod("ns", "p")  # labels {}, schedulerName default-scheduler
    assert pod_patch(pod, "team", "tessera", gate=True) == [
        {"op": "add", "path": "/metadata/labels/scheduling.tessera.dev~1queue", "value": "team"},
        {"op": "add", "path": "/spec/schedulerName", "value": "tessera"},
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]},
    ]


def test_pod_patch_without_labels_or_changes() -> None:
    bare: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"schedulingGates": [{"name": "other"}]}}
    assert pod_patch(bare, "team", None, gate=True) == [
        {"op": "add", "path": "/metadata/labels", "value": {Q: "team"}},
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}},
    ]
    labelled = objects.pod("ns", "p", queue="team")
    assert pod_patch(labelled, "team", None, gate=False) == []


def test_gate_removal_tests_then_removes_its_own_gate_only() -> None:
    pod: dict[str, Any] = {"spec": {"schedulingGates": [{"name": "other"}, {"name": ADMISSION_GATE}]}}
    assert gate_removal(pod) == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": ADMISSION_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    assert gate_removal({"spec": {}}) == []


STORED = [
    objects.queue("org", resources={"gpu": {"quota": 8}}),
    objects.queue("team-a", parent="org", resources={"gpu": {"quota": 4}}),
    objects.queue("team-b", parent="team-a"),
]


@pytest.mark.parametrize(
    ("queue", "needle"),
    [
        (objects.queue("x", resources={"gpu": {"quota": 4, "limit": 2}}), "limit 2 is below quota 4"),
        (objects.queue("x", parent="nobody"), "parent queue 'nobody' of 'x' does not exist"),
        (objects.queue("x", parent="x"), "cannot be its own parent"),
        # team-a -> org, org -> team-b -> team-a: a cycle through the updated org.
        (objects.queue("org", parent="team-b"), "parents form a cycle"),
        # org's children would hold 4 + 6 = 10 > its quota 8: reported on org, caused by x.
        (
            objects.queue("x", parent="org", resources={"gpu": {"quota": 6}}),
            "queue 'org' (because of this change): children's gpu quota 10",
        ),
        (objects.queue("x", resources={"gpus": {"quota": 1}}), "unknown resource names ['gpus']"),
    ],
)
def test_invalid_queues_are_refused_with_the_reason(queue: dict[str, Any], needle: str) -> None:
    problems = queue_problems(queue, STORED)
    assert any(needle in problem for problem in problems), problems


def test_valid_queues_and_old_problems_of_others_are_admitted() -> None:
    assert queue_problems(objects.queue("x", parent="team-a"), STORED) == []
    # An update of team-a (its old version is replaced, not a duplicate).
    assert (
        queue_problems(objects.queue("team-a", parent="org", resources={"gpu": {"quota": 2}}), STORED) == []
    )
    # "lost" already had an unknown parent: a write elsewhere does not have to fix it, and
    # neither does a write of "lost" that leaves its parent as it was (a new label, a priority).
    broken = [*STORED, objects.queue("lost", parent="gone")]
    assert queue_problems(objects.queue("y"), broken) == []
    assert queue_problems(objects.queue("lost", parent="gone", priority=3), broken) == []
    # Pointing it at another missing parent is a new problem.
    assert queue_problems(objects.queue("lost", parent="elsewhere"), broken) == [
        "queue 'lost': parent queue 'elsewhere' of 'lost' does not exist"
    ]


def _claim(parameters: Any, driver: str = "gpu.tessera.dev", template: bool = False) -> dict[str, Any]:
    spec = {"devices": {"config": [{"opaque": {"driver": driver, "parameters": parameters}}]}}
    if template:
        return {"kind": "ResourceClaimTemplate", "spec": {"spec": spec}}
    return {"kind": "ResourceClaim", "spec": spec}


GOOD = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "MPS"}}
BAD = {**GOOD, "sharing": {"strategy": "Magic"}}


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (_claim(GOOD), None),
        (_claim(BAD, driver="gpu.nvidia.com"), None),  # another driver's config is its own business
        (_claim(BAD), "invalid GpuConfig in spec.devices.config[0].opaque.parameters: sharing.strategy"),
        (_claim(BAD, template=True), "in spec.spec.devices.config[0].opaque.parameters: sharing.strategy"),
        (_claim({**GOOD, "colour": "blue"}), "colour: Extra inputs are not permitted"),
        (_claim("MPS"), "opaque parameters in spec.devices.config[0].opaque.parameters must be an object"),
        ({"kind": "ResourceClaim", "spec": {"devices": {"config": [{"opaque": {"driver": ["x"]}}]}}}, None),
        ({"kind": "ResourceClaim", "spec": "nonsense"}, None),
    ],
)
def test_claim_configs(obj: dict[str, Any], needle: str | None) -> None:
    problems = claim_config_problems(obj, {"gpu.tessera.dev"})
    if needle is None:
        assert problems == []
    else:
        assert len(problems) == 1 and needle in problems[0], problems


@pytest.mark.parametrize(
    ("owner", "path"),
    [
        (
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d"},
            "/apis/apps/v1/namespaces/ns/replicasets/web-7d",
        ),
        (
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly"},
            "/apis/batch/v1/namespaces/ns/cronjobs/nightly",
        ),
        (
            {"apiVersion": "v1", "kind": "ReplicationController", "name": "rc"},
            "/api/v1/namespaces/ns/replicationcontrollers/rc",
        ),
        (
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "train"},
            "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/train",
        ),
        ({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "../../secrets/x"}, None),
        ({"apiVersion": "apps/v1", "kind": "Replica/Set", "name": "x"}, None),
        ({}, None),
    ],
)
def test_owner_paths(owner: dict[str, str], path: str | None) -> None:
    assert owner_path("ns", owner) == path
