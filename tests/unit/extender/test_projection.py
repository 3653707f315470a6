"""The picture stores each object projected to the fields Tessera reads (extender.picture.store)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from extender.picture.store import PROJECTIONS, ObjectStore, project
from tests import extender_objects as objects


def api_pod(name: str, node: str = "a") -> dict[str, Any]:
    """A pod as the API server returns it: the fields Tessera reads and many it does not."""
    pod = objects.pod("ns", name, queue="team-a", template="one", cpu="2")
    pod["metadata"].update(
        resourceVersion="7",
        creationTimestamp="2026-12-01T10:00:00Z",
        ownerReferences=[{"kind": "Job", "name": "train", "uid": "job-uid", "controller": True}],
        annotations={"tessera.dev/movable": "false"},
        managedFields=[{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
    )
    pod["spec"].update(
        nodeName=node,
        priority=10,
        tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
        volumes=[{"name": "data", "emptyDir": {}}],
        initContainers=[{"name": "init", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}],
        schedulingGroup={"podGroupName": "train"},
        schedulingGates=[{"name": "scheduling.tessera.dev/admission"}],
    )
    pod["spec"]["containers"][0].update(image="trainer:1", env=[{"name": "A", "value": "1"}], command=["run"])
    pod["status"] = {
        "phase": "Running",
        "startTime": "2026-12-01T10:00:01Z",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastProbeTime": None}],
        "containerStatuses": [{"name": "main", "ready": True, "imageID": "sha256:abc"}],
        "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}],
    }
    return pod


def test_a_pod_keeps_what_the_policies_read_and_drops_the_rest() -> None:
    kept = project("Pod", api_pod("p"))
    assert set(kept["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "labels",
        "annotations",
        "ownerReferences",
        "resourceVersion",
        "creationTimestamp",
    }  # managedFields gone
    assert kept["metadata"]["ownerReferences"][0]["kind"] == "Job"
    spec = kept["spec"]
    assert (spec["nodeName"], spec["priority"], spec["schedulerName"]) == ("a", 10, "default-scheduler")
    assert spec["containers"] == [
        {"name": "main", "resources": api_pod("p")["spec"]["containers"][0]["resources"]}
    ]
    assert spec["initContainers"] == [{"name": "init", "resources": {"requests": {"cpu": "1"}}}]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "one"}]
    assert spec["tolerations"][0]["effect"] == "NoExecute"
    # The gang's PodGroup (workload map) and the admission gate (gate controller) are read too.
    assert spec["schedulingGroup"] == {"podGroupName": "train"}
    assert spec["schedulingGates"] == [{"name": "scheduling.tessera.dev/admission"}]
    assert "volumes" not in spec
    status = kept["status"]
    assert set(status) == {"phase", "startTime", "conditions", "resourceClaimStatuses"}
    assert status["conditions"] == [{"type": "PodScheduled", "status": "True"}]


def test_a_node_keeps_labels_taints_and_its_cpu_and_memory_supply() -> None:
    node = objects.node("a")
    node["spec"] = {"unschedulable": True, "taints": [{"key": "gpu", "effect": "NoSchedule"}], "podCIDR": "x"}
    node["status"] = {
        "allocatable": {"cpu": "63", "memory": "500Gi"},
        "capacity": {"cpu": "64", "memory": "512Gi"},
        "images": [{"names": ["a"], "sizeBytes": 1}],
        "nodeInfo": {"kernelVersion": "6"},
    }
    kept = project("Node", node)
    assert kept["metadata"]["labels"] == node["metadata"]["labels"]
    assert kept["spec"] == {"unschedulable": True, "taints": [{"key": "gpu", "effect": "NoSchedule"}]}
    assert kept["status"] == {
        "allocatable": {"cpu": "63", "memory": "500Gi"},
        "capacity": {"cpu": "64", "memory": "512Gi"},
    }


def test_a_slice_keeps_what_the_inventory_reads_of_its_devices() -> None:
    slice_obj = objects.gpu_slice("a", 2, shareable=True)
    slice_obj["spec"]["devices"][1]["attributes"]["gpu.tessera.dev/profile"] = {"string": "1g.10gb"}
    kept = project("ResourceSlice", slice_obj)
    spec = kept["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == ("gpu.tessera.dev", "a", "a")
    first, second = spec["devices"]
    # type, productName and profile (bare or qualified with a domain) are read; the uuid is not.
    assert first["attributes"] == {"type": {"string": "gpu"}, "productName": {"string": "H100-80GB"}}
    assert second["attributes"]["gpu.tessera.dev/profile"] == {"string": "1g.10gb"}
    assert first["capacity"] == slice_obj["spec"]["devices"][0]["capacity"]
    assert "allowMultipleAllocations" not in first
    # Devices of one model and size share their attributes and capacity, across slices too.
    other = project("ResourceSlice", objects.gpu_slice("b", 1, shareable=True))["spec"]["devices"][0]
    assert other["attributes"] is first["attributes"] and other["capacity"] is first["capacity"]


def test_a_claim_keeps_its_devices_and_the_pods_reserving_it() -> None:
    claim = objects.claim(
        "ns", "c", objects.claim_spec("gpu.tessera.dev"), allocated=[("a", "gpu-1", "40Gi")]
    )
    claim["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": []}]}
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
    kept = project("ResourceClaim", claim)
    assert kept["status"] == {
        "allocation": {"devices": {"results": claim["status"]["allocation"]["devices"]["results"]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
    }


def test_a_record_reads_as_a_read_only_mapping() -> None:
    kept = project("Pod", api_pod("p"))
    metadata = kept["metadata"]
    assert isinstance(metadata, Mapping) and not isinstance(metadata, dict)
    # Its fields in the table's order, those the object has only.
    assert list(metadata)[:3] == ["name", "uid", "resourceVersion"] and len(metadata) == 8
    assert metadata.get("deletionTimestamp") is None and metadata.get("deletionTimestamp", 0) == 0
    assert "deletionTimestamp" not in metadata and "name" in metadata and 1 not in metadata
    with pytest.raises(KeyError):
        metadata["deletionTimestamp"]
    with pytest.raises(KeyError):
        metadata["managedFields"]
    assert dict(metadata.items())["namespace"] == "ns"
    # Equal to the dict of the same fields, either way round; slots only for the fields present.
    bare = project("Pod", {"metadata": {"name": "p", "namespace": "ns"}})
    plain = {"metadata": {"name": "p", "namespace": "ns"}}
    assert bare == plain
    assert plain == bare  # (the dict on the left)
    assert len(type(bare["metadata"]).__slots__) == 2


def test_parts_holding_nothing_of_their_object_are_shared() -> None:
    first, second = project("Pod", api_pod("p1")), project("Pod", api_pod("p2"))
    assert first["spec"]["containers"] is second["spec"]["containers"]
    assert first["status"]["conditions"] is second["status"]["conditions"]
    assert first["metadata"] is not second["metadata"]  # its name and uid are its own
    # The claim generated for each pod is its own: the statuses naming them are not shared.
    assert first["status"] is not second["status"]
    # Names and uids are the pod's own: not interned (an interned string costs a table entry).
    assert first["metadata"]["name"] == "p1"


def test_equal_values_are_one_object_and_strings_are_interned() -> None:
    first, second = project("Pod", api_pod("p1")), project("Pod", api_pod("p2", node="b"))
    assert first["spec"]["containers"][0]["resources"] is second["spec"]["containers"][0]["resources"]
    assert first["spec"]["tolerations"] is second["spec"]["tolerations"]
    assert first["metadata"]["labels"] is second["metadata"]["labels"]
    assert first["metadata"]["namespace"] is second["metadata"]["namespace"]
    # Different values stay different.
    assert first["status"]["resourceClaimStatuses"] != second["status"]["resourceClaimStatuses"]


def test_the_store_holds_projections_and_orders_them_by_version() -> None:
    store = ObjectStore(["Pod"])
    store.replace("Pod", [api_pod("p")])
    held = store.get("Pod", "ns/p")
    assert held is not None and "managedFields" not in held["metadata"]
    newer = api_pod("p", node="b")
    newer["metadata"]["resourceVersion"] = "8"
    assert store.apply("Pod", "MODIFIED", newer)
    older = api_pod("p", node="c")
    assert not store.apply("Pod", "MODIFIED", older)  # resourceVersion 7 < 8
    assert store.get("Pod", "ns/p")["spec"]["nodeName"] == "b"  # type: ignore[index]


@pytest.mark.parametrize("kind", sorted(PROJECTIONS))
def test_every_projection_keeps_identity_and_version(kind: str) -> None:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": "x",
            "namespace": "ns",
            "uid": "u",
            "resourceVersion": "3",
            "managedFields": [{}],
        },
    }
    assert project(kind, obj) == {
        **obj,
        "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"},
    }


def test_kinds_without_a_projection_are_kept_whole() -> None:
    lease = {
        "kind": "Lease",
        "metadata": {"name": "l", "managedFields": [{}]},
        "spec": {"holderIdentity": "a"},
    }
    assert project("Lease", lease) is lease


def test_record_classes_per_level_are_bounded() -> None:
    # 2^6 = 64 sets of pod-spec fields: past 32 classes of the level, the class of every field
    # holds the rest, its absent fields reading as absent all the same.
    fields = (
        "nodeName",
        "schedulerName",
        "priority",
        "priorityClassName",
        "preemptionPolicy",
        "nodeSelector",
    )
    values = {"nodeName": "a", "schedulerName": "s", "priority": 5, "priorityClassName": "high"}
    values |= {"preemptionPolicy": "Never", "nodeSelector": {"zone": "z"}}
    classes = set()
    for mask in range(2**6):
        present = {f: values[f] for i, f in enumerate(fields) if mask >> i & 1}
        spec = project("Pod", {"metadata": {"name": f"p{mask}"}, "spec": present})["spec"]
        assert spec == present and len(spec) == len(present) and list(spec) == list(present)
        assert all(spec.get(f) is None and f not in spec for f in fields if f not in present)
        classes.add(type(spec))
    assert len(classes) <= 32  # (_CLASSES_LIMIT: those made before this test count towards it too)
