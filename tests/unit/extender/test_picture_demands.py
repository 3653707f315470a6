"""Pod demands (`extender.picture.demands`): what a pod asks (its claims, else their templates),
fractions sized against the largest GPU they could land on, read once per version of what it reads.
"""

from __future__ import annotations

import copy

import pytest

from extender.picture.watcher import apply_watch_event
from extender.policy.placement import GpuDemand
from tests import extender_objects as objects
from tests.unit.extender.pictures import CLASS, demand_parses, synced_picture, two_nodes, with_rv


def test_pending_demand_counts_only_the_configured_schedulers() -> None:
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.pod("ns", "mine", queue="q", template="one", scheduler="tessera"),
            objects.pod("ns", "other", queue="q", template="one"),
            objects.queue("q"),
        ],
        scheduler_names=frozenset({"tessera"}),
    )
    assert picture.fairness().usage["q"].requested["gpu"] == 1


def test_pending_fraction_is_relative_to_the_largest_matching_gpu() -> None:
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "half", objects.claim_spec(CLASS, memory="20Gi")),
            objects.pod("ns", "p", queue="q", template="half"),
        ]
    )
    pod = picture.kind("Pod")["ns/p"]
    demand = picture.pod_demand(pod)
    assert demand is not None and (demand.count, demand.milli) == (1, 250)  # 20Gi of an 80Gi GPU
    demand_on_b = picture.demand(pod).gpus_at(picture.gpu_memory["b"])
    assert demand_on_b is not None and demand_on_b.milli == 500  # 20Gi of a 40Gi GPU
    assert picture.pod_resources("ns/p", pod)["gpu"] == pytest.approx(0.25)


def test_a_claim_not_yet_seen_is_sized_from_its_template() -> None:
    pod = objects.pod("ns", "p", queue="q", template="two")
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "p-gpus-abc"}]
    template = objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2))
    picture = synced_picture([*two_nodes(), template, pod])
    demand = picture.pod_demand(pod)
    assert demand is not None and demand.count == 2
    claim = objects.claim("ns", "p-gpus-abc", objects.claim_spec(CLASS, count=3))
    picture.apply("ResourceClaim", "ADDED", claim)
    demand = picture.pod_demand(pod)
    assert demand is not None and demand.count == 3  # the claim itself wins once known


def test_a_request_pod_the_store_lacks_is_read_once_per_version_until_its_template_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Filter, prioritize and the reservation of one scheduling cycle read the same pod version;
    # the watch may not have delivered it yet. Its demand is kept for that version, and dropped
    # when what it reads changes (here its claim template: 1 GPU, then 2).
    template = objects.claim_template("ns", "t", objects.claim_spec(CLASS))
    picture = synced_picture([*two_nodes(), template])
    reads = demand_parses(picture, monkeypatch)
    pod = with_rv(objects.pod("ns", "p", queue="q", template="t"), 7)
    for _ in range(3):  # three decodes of the same version: one read
        assert picture.demand(copy.deepcopy(pod)).queue == "q"
    picture.demand(with_rv(copy.deepcopy(pod), 8))  # a new version is read
    assert reads == ["p", "p"]
    changed = with_rv(objects.claim_template("ns", "t", objects.claim_spec(CLASS, count=2)), 9)
    apply_watch_event(picture, "ResourceClaimTemplate", {"type": "MODIFIED", "object": changed}, "9")
    again = picture.pod_demand(copy.deepcopy(pod))
    assert again is not None and again.count == 2 and reads == ["p", "p", "p"]


def test_a_pods_demand_is_read_again_only_when_what_it_reads_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pod event that changes only its phase or node, or a claim event that changes only its
    # status (allocation), keeps the demand; a new container request or claim spec reads it again.
    pod = objects.pod("ns", "p", queue="q", claim_name="c")
    claim = objects.claim("ns", "c", objects.claim_spec(CLASS))
    picture = synced_picture([*two_nodes(), with_rv(pod, 1), with_rv(claim, 2)])
    reads = demand_parses(picture, monkeypatch)

    def demand_now() -> GpuDemand | None:
        return picture.pod_demand(picture.kind("Pod")["ns/p"])

    assert demand_now() == GpuDemand(count=1) and reads == []  # read when the picture synced
    bound = with_rv(copy.deepcopy(pod), 3)
    bound["spec"]["nodeName"] = "a"
    bound["status"]["phase"] = "Running"
    picture.apply("Pod", "MODIFIED", bound)
    allocated = with_rv(
        objects.claim("ns", "c", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]), 4
    )
    picture.apply("ResourceClaim", "MODIFIED", allocated)
    assert demand_now() == GpuDemand(count=1) and reads == []  # not read again
    bigger = with_rv(objects.claim("ns", "c", objects.claim_spec(CLASS, count=2)), 5)
    picture.apply("ResourceClaim", "MODIFIED", bigger)
    assert demand_now() == GpuDemand(count=2) and reads == ["p"]
    more_cpu = with_rv(copy.deepcopy(bound), 6)
    more_cpu["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    picture.apply("Pod", "MODIFIED", more_cpu)
    assert picture.demand(picture.kind("Pod")["ns/p"]).cpu == 4 and reads == ["p", "p"]
