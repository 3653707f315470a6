"""The reclaim benchmark's pure helpers: what counts as an eviction undone."""

from __future__ import annotations

from bench.e2e import PLAIN_SCHEDULER, gpu_pod
from bench.reclaim import (
    CLASSIC_GPU,
    CLASSIC_NODE_LABEL,
    Eviction,
    ReclaimRun,
    by_action,
    classic_gpu_pod,
    kai_pod_of,
    reverse_reclaims,
    undone,
)


def test_an_eviction_is_undone_when_the_pod_it_served_is_evicted_back() -> None:
    # a-1 (queue a) was evicted for b-1 (queue b); later b-1 itself is evicted for queue a.
    first = Eviction(10.0, "a-1", "a", "b-1", "b")
    back = Eviction(20.0, "b-1", "b", "a-7", "a")
    assert undone([first, back]) == 1
    assert reverse_reclaims([first, back]) == 1


def test_a_later_reclaim_between_the_same_queues_is_a_reverse_reclaim_only() -> None:
    # b later gives back another pod to a (demand changed): reported, but not ping-pong.
    first = Eviction(10.0, "a-1", "a", "b-1", "b")
    other = Eviction(30.0, "b-9", "b", "a-8", "a")
    unrelated = Eviction(40.0, "c-1", "c", "a-9", "a")
    assert undone([first, other, unrelated]) == 0
    assert reverse_reclaims([first, other, unrelated]) == 1


def test_a_kai_pod_group_names_its_bare_pod() -> None:
    """KAI's podgrouper names a bare pod's PodGroup `pg-<pod>-<pod uid>`: the churn's victims and
    the pods served are read back from those names in KAI's Evict events."""
    uid = "0f8e2a51-6c3d-4b7a-9e12-3a4b5c6d7e8f"
    assert kai_pod_of(f"pg-a-00012-{uid}") == "a-00012"
    assert kai_pod_of(f"pg-b-00003-{uid}") == "b-00003"
    assert kai_pod_of("pg-a-00012") is None  # no uid: not a bare pod's group
    assert kai_pod_of(f"a-00012-{uid}") is None  # no prefix
    assert kai_pod_of("") is None  # an Evict event without the evictor annotation


def test_evictions_are_counted_by_the_action_that_made_them() -> None:
    # KAI's Evict events say which action evicted: three by consolidation, one by reclaim.
    evictions = [
        Eviction(1.0, f"a-{i}", "a", "b-1", "b", action=action)
        for i, action in enumerate(["consolidation", "reclaim", "consolidation", "consolidation"])
    ]
    assert by_action(evictions) == "consolidation 3, reclaim 1"
    assert by_action([]) == ""  # none: the table shows the bare count


def test_figures_of_a_round() -> None:
    run = ReclaimRun("tessera", needed=16, seconds=8.0, evicted=16)
    assert run.per_gpu_s == 0.5
    assert run.ratio == 1.0


def test_the_baselines_classic_gpu_pod_stays_on_the_classic_gpu_nodes() -> None:
    # The shipped DeviceClass maps nvidia.com/gpu (extendedResourceName), so from Kubernetes 1.37
    # kube-scheduler could serve a classic GPU on a DRA node through a claim it makes itself; the
    # baseline's pods select the classic nodes' label instead, and carry no claim of their own.
    pod = gpu_pod("ns", "a-00000", PLAIN_SCHEDULER, "queue-a")
    classic = classic_gpu_pod(pod)
    assert classic["spec"]["nodeSelector"] == {CLASSIC_NODE_LABEL[0]: CLASSIC_NODE_LABEL[1]}
    assert "resourceClaims" not in classic["spec"]
    (container,) = classic["spec"]["containers"]
    assert container["resources"]["limits"] == {CLASSIC_GPU: "1"}
    assert "claims" not in container["resources"]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "64Mi"}
    # The DRA pod it came from is left as it was (the Tessera rounds use it).
    assert pod["spec"]["resourceClaims"] and "nodeSelector" not in pod["spec"]
