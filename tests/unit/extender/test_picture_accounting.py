"""Queue accounting (`extender.picture.accounting`): usage and pending demand, reservations and
their expiry, incremental recounts against a picture built afresh, kept fair shares.
"""

from __future__ import annotations

import random
import time
from typing import Any, Literal

import pytest

from extender.policy.fairness import (
    FairShareInputs,
    QueueTree,
    WeightAdjustment,
    compute_fair_shares,
)
from extender.policy.placement import GpuDemand
from tests import extender_objects as objects
from tests.unit.extender.pictures import (
    CLASS,
    ledger_mix,
    objects_of,
    reserved_pods,
    running_on,
    synced_picture,
    two_nodes,
    with_rv,
)

KINDS: tuple[Literal["allocated", "requested"], ...] = ("allocated", "requested")


def test_queue_usage_counts_held_devices_and_pending_demand() -> None:
    bound = objects.pod("ns", "bound", queue="team-a", template="gone", node_name="a")
    bound["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "bound-gpus"}]
    picture = synced_picture(
        [
            *two_nodes(),
            objects.queue("team-a", resources={"gpu": {"quota": 2}}),
            objects.claim(
                "ns",
                "bound-gpus",
                objects.claim_spec(CLASS, memory="40Gi"),
                allocated=[("a", "gpu-3", "40Gi")],
            ),
            bound,
            objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2)),
            objects.pod("ns", "waiting", queue="team-a", template="two"),
            objects.pod("ns", "plain", node_name="b", cpu="2"),
            objects.pod("ns", "done", queue="team-a", node_name="b", cpu="8")
            | {"status": {"phase": "Succeeded"}},
        ]
    )
    view = picture.fairness()
    assert view.capacity["gpu"] == 8
    assert view.capacity["gpu/H100-80GB"] == 4
    assert view.capacity["cpu"] == 128
    assert view.usage["team-a"].allocated == {
        "gpu": 0.5,
        "gpu/H100-80GB": 0.5,
        "cpu": 0.1,
        "memory": 64 * 2**20,
    }
    assert view.usage["team-a"].requested == {"gpu": 2, "cpu": 0.1, "memory": 64 * 2**20}
    assert view.usage["default"].allocated == {"cpu": 2, "memory": 64 * 2**20}
    assert view.pending_pods == {"team-a": 1}
    assert view.fair_shares["team-a"]["gpu"] == pytest.approx(2.5)
    # The mix holds every pod's placement demand, CPU (milli) and memory (MiB) included, and the
    # GPU-less pod "plain" too; the finished pod "done" is not in it.
    assert {demand for demand, _ in view.mix.demands} == {
        GpuDemand(count=1, milli=500, cpu_milli=100, memory_mib=64),
        GpuDemand(count=2, cpu_milli=100, memory_mib=64),
        GpuDemand(count=0, cpu_milli=2000, memory_mib=64),
    }
    assert picture.fairness() is view  # cached until the picture changes


def test_invalid_queue_objects_are_reported_not_fatal() -> None:
    picture = synced_picture([objects.queue("bad", resources={"gpu": {"quota": "lots"}})])
    view = picture.fairness()
    assert "bad" in view.invalid and "quota" in view.invalid["bad"]
    assert [spec.name for spec in view.specs] == ["default"]


def test_reservations_move_a_pod_to_allocated_and_expire() -> None:
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.queue("q"),
            objects.pod("ns", "p", queue="q", template="one"),
        ]
    )
    before = picture.fairness()
    picture.reserve("ns/p", picture.kind("Pod")["ns/p"], ttl_s=60)
    shifted = picture.fairness()
    assert shifted.usage["q"].allocated == {"gpu": 1, "cpu": 0.1, "memory": 64 * 2**20}
    assert shifted.usage["q"].requested == {}
    assert shifted.pending_pods.get("q", 0) == 0
    assert shifted.fair_shares == before.fair_shares
    # The pod moved from waiting to holding: no queue's demand changed, so the shares are reused.
    assert shifted.fair_shares is before.fair_shares
    # The incremental accounting equals a full recount of the same objects and reservation.
    fresh = synced_picture(objects_of(picture))
    fresh.reserve("ns/p", fresh.kind("Pod")["ns/p"], ttl_s=60)
    assert fresh.fairness().usage == shifted.usage
    picture.release("ns/p")
    assert picture.fairness().usage["q"] == before.usage["q"]
    picture.reserve(
        "ns/p", picture.kind("Pod")["ns/p"], ttl_s=-1
    )  # already expired: dropped at the next look
    assert picture.fairness().usage["q"] == before.usage["q"]
    assert reserved_pods(picture) == {}


def test_a_reservation_expires_at_its_last_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # p is reserved at t=100 for 10 s and again (filtered again) at t=105 for 10 s: at t=112,
    # past its first deadline, it still counts; at t=116, past 115, it does not. r is reserved at
    # t=100 for 20 s, released at 101, reserved at 111 for 1 s: gone at t=113 (its first
    # deadline, 120, is not its last).
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.queue("q"),
            objects.pod("ns", "p", queue="q", template="one"),
            objects.pod("ns", "r", queue="q", template="one"),
        ]
    )

    def held_gpus() -> float:
        return picture.fairness().usage["q"].allocated.get("gpu", 0.0)

    picture.reserve("ns/p", picture.kind("Pod")["ns/p"], ttl_s=10)
    picture.reserve("ns/r", picture.kind("Pod")["ns/r"], ttl_s=20)
    clock[0] = 101.0
    picture.release("ns/r")
    clock[0] = 105.0
    picture.reserve("ns/p", picture.kind("Pod")["ns/p"], ttl_s=10)
    assert held_gpus() == 1  # p
    clock[0] = 111.0
    picture.reserve("ns/r", picture.kind("Pod")["ns/r"], ttl_s=1)
    assert held_gpus() == 2  # p and r
    clock[0] = 112.0
    assert held_gpus() == 2  # p's first deadline (110) passed: not its last
    clock[0] = 113.0
    assert held_gpus() == 1 and set(reserved_pods(picture)) == {"ns/p"}
    clock[0] = 116.0
    assert held_gpus() == 0 and reserved_pods(picture) == {}


def test_settle_counts_changed_pods_as_the_next_view_would() -> None:
    template = objects.claim_template("ns", "one", objects.claim_spec(CLASS))
    picture = synced_picture([*two_nodes(), template, objects.queue("q")])
    before = ledger_mix(picture)
    picture.apply("Pod", "ADDED", with_rv(objects.pod("ns", "p0", queue="q", template="one"), 10))
    picture.settle()
    counted = ledger_mix(picture)  # the ledger as settle left it, read without a recount
    fresh = synced_picture([*two_nodes(), template, objects.queue("q"), *picture.kind("Pod").values()])
    assert counted != before and counted == fresh.mix()


def test_incremental_accounting_matches_a_fresh_count_after_many_events() -> None:
    template = objects.claim_template("ns", "one", objects.claim_spec(CLASS))
    picture = synced_picture([*two_nodes(), template, objects.queue("q", resources={"gpu": {"quota": 2}})])
    picture.fairness()
    for index in range(6):
        pod = with_rv(objects.pod("ns", f"p{index}", queue="q", template="one"), 10 + index)
        picture.apply("Pod", "ADDED", pod)
        picture.fairness()
    for index in range(4):  # the claims appear, get allocated, the pods get bound
        claim_name = f"p{index}-gpus"
        claim = objects.claim("ns", claim_name, objects.claim_spec(CLASS))
        picture.apply("ResourceClaim", "ADDED", with_rv(claim, 30))
        picture.fairness()
        bound = with_rv(objects.pod("ns", f"p{index}", queue="q", template="one", node_name="a"), 40 + index)
        bound["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim_name}]
        picture.apply("Pod", "MODIFIED", bound)
        allocated = objects.claim(
            "ns", claim_name, objects.claim_spec(CLASS), allocated=[("a", f"gpu-{index}", None)]
        )
        picture.apply("ResourceClaim", "MODIFIED", with_rv(allocated, 50 + index))
    picture.apply("Pod", "DELETED", objects.pod("ns", "p0"))
    picture.apply("Pod", "DELETED", objects.pod("ns", "p5"))
    view = picture.fairness()
    assert view.usage["q"].allocated["gpu"] == 3
    assert view.usage["q"].requested["gpu"] == 1
    assert view.pending_pods == {"q": 1}
    fresh = synced_picture(objects_of(picture))
    for queue, usage in fresh.fairness().usage.items():
        assert usage.allocated == pytest.approx(view.usage[queue].allocated)
        assert usage.requested == pytest.approx(view.usage[queue].requested)
        assert fresh.fairness().fair_shares[queue] == pytest.approx(view.fair_shares[queue])
    assert fresh.fairness().mix == view.mix


def test_slice_events_recount_what_they_change_like_a_fresh_count() -> None:
    held = objects.pod("ns", "held", queue="q", template="one", node_name="c")
    held["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "held-gpus"}]
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.claim_template("ns", "half", objects.claim_spec(CLASS, memory="40Gi")),
            # Allocated on node c before c's slice is in the picture.
            objects.claim("ns", "held-gpus", objects.claim_spec(CLASS), allocated=[("c", "gpu-0", None)]),
            held,
            objects.pod("ns", "pending", queue="q", template="half"),
            objects.queue("q"),
        ]
    )

    def assert_matches_fresh_count() -> None:
        view = picture.fairness()
        fresh = synced_picture(objects_of(picture))
        assert fresh.fairness().usage["q"].allocated == pytest.approx(view.usage["q"].allocated)
        assert fresh.fairness().usage["q"].requested == pytest.approx(view.usage["q"].requested)
        assert fresh.fairness().mix == view.mix

    assert "gpu/H100-80GB" not in picture.fairness().usage["q"].allocated
    picture.apply("ResourceSlice", "ADDED", objects.gpu_slice("c", 2))  # a GPU size already known
    assert picture.fairness().usage["q"].allocated["gpu/H100-80GB"] == 1
    assert picture.fairness().usage["q"].requested["gpu"] == pytest.approx(0.5)  # 40Gi of 80Gi
    assert_matches_fresh_count()
    picture.apply("ResourceSlice", "ADDED", objects.gpu_slice("d", 2, model="H200", memory="160Gi"))
    assert picture.fairness().usage["q"].requested["gpu"] == pytest.approx(0.25)  # now of 160Gi
    assert_matches_fresh_count()
    picture.apply("ResourceSlice", "DELETED", objects.gpu_slice("c", 2))
    picture.apply("ResourceSlice", "DELETED", objects.gpu_slice("d", 2, model="H200", memory="160Gi"))
    assert picture.fairness().usage["q"].requested["gpu"] == pytest.approx(0.5)
    assert_matches_fresh_count()


def test_a_pod_bound_before_its_claims_allocation_arrives_counts_its_nodes_model() -> None:
    """The scheduler allocates a claim, then binds; the two reach the picture on separate watches.
    While the pod shows bound and its claim not yet allocated, the pod counts 1 GPU of its node's
    one model (node a: H100-80GB), as it will once the allocation arrives: the queue's gpu and
    gpu/<model> never disagree (its status once said gpu 2, gpu/H100-80GB 1)."""
    bound = objects.pod("ns", "bound", queue="q", template="one", node_name="a")
    bound["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "bound-gpus"}]
    picture = synced_picture(
        [
            *two_nodes(),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.claim("ns", "bound-gpus", objects.claim_spec(CLASS)),  # not allocated yet
            bound,
            objects.queue("q"),
        ]
    )
    assert picture.fairness().usage["q"].allocated["gpu"] == 1
    assert picture.fairness().usage["q"].allocated["gpu/H100-80GB"] == 1
    picture.apply(
        "ResourceClaim",
        "MODIFIED",
        objects.claim("ns", "bound-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
    )
    assert picture.fairness().usage["q"].allocated["gpu/H100-80GB"] == 1
    # Its node's slice goes and comes back: the pod is recounted each time, like a fresh count.
    picture.apply("ResourceSlice", "DELETED", objects.gpu_slice("a", 4, shareable=True))
    picture.apply("ResourceClaim", "MODIFIED", objects.claim("ns", "bound-gpus", objects.claim_spec(CLASS)))
    assert "gpu/H100-80GB" not in picture.fairness().usage["q"].allocated  # node a has no GPUs now
    picture.apply("ResourceSlice", "ADDED", objects.gpu_slice("a", 4, shareable=True))
    assert picture.fairness().usage["q"].allocated["gpu/H100-80GB"] == 1


def test_a_claim_shared_by_two_pods_is_charged_once() -> None:
    # Time-slicing: one whole-GPU claim, reserved for two running pods of q -> 1 GPU, not 2.
    shared = objects.claim("ns", "shared", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)])
    shared["status"]["reservedFor"] = [
        {"resource": "pods", "name": "p1", "uid": "uid-ns-p1"},
        {"resource": "pods", "name": "p2", "uid": "uid-ns-p2"},
    ]
    picture = synced_picture(
        [*two_nodes(), shared, running_on("p1", "a", "shared"), running_on("p2", "a", "shared")]
    )
    assert picture.fairness().usage["q"].allocated["gpu"] == pytest.approx(1.0)
    assert picture.node_gpus("a").free_milli == (0, 1000, 1000, 1000)


def mig_slice(node: str, model: str, with_whole_gpu: bool) -> dict[str, Any]:
    """A node's slice with one 1g.10gb MIG partition (and optionally one whole GPU of the model)."""
    obj = objects.gpu_slice(node, 2 if with_whole_gpu else 1, model=model, memory="80Gi")
    partition = obj["spec"]["devices"][0]
    partition["name"] = "mig-0"
    partition["attributes"]["type"] = {"string": "mig"}
    partition["attributes"]["profile"] = {"string": "1g.10gb"}
    partition["capacity"] = {"memory": {"value": "10Gi"}}
    return obj


@pytest.mark.parametrize(
    ("whole_gpu_known", "share"),
    [(True, 0.125), (False, 1 / 7)],  # 10Gi of an 80Gi GPU of the model; else 1 of 7 slices
    ids=["by memory", "by compute slices"],
)
def test_a_mig_partition_is_charged_its_share_of_a_gpu(whole_gpu_known: bool, share: float) -> None:
    claim = objects.claim("ns", "slice", objects.claim_spec(CLASS), allocated=[("m", "mig-0", None)])
    picture = synced_picture(
        [
            objects.node("m"),
            mig_slice("m", "A100-80GB", with_whole_gpu=whole_gpu_known),
            objects.device_class(CLASS),
            claim,
            running_on("p", "m", "slice"),
        ]
    )
    # Charged its share (it was a whole GPU before); MIG partitions add no GPU capacity.
    assert picture.fairness().usage["q"].allocated["gpu"] == pytest.approx(share, abs=1e-3)
    assert picture.capacity().get("gpu", 0) == (1 if whole_gpu_known else 0)


@pytest.mark.parametrize("seed", range(20))
def test_fair_shares_kept_across_pod_events_equal_those_of_a_fresh_picture(seed: int) -> None:
    # Queues org (children a, b) and c; 2 nodes of 2 GPUs; 30 random events - a pod arrives
    # pending in a, b or c, a filter reserves one, one is bound, one is deleted, queue c's quota
    # changes. After each, the view's usage, pending counts, fair shares and subtree sums (kept
    # from view to view by the ledger, `FairShares.update` and `QueueTree.with_usage`) equal
    # those of a picture built afresh from the same objects, and the fair shares and sums equal
    # a division and a sum over the whole tree of the view's usage, to the bit. Only some sums
    # are asked of each view (as admission does), so the next keeps some, not all.
    rng = random.Random(seed)
    live = synced_picture(
        [
            *objects.two_nodes_of_two_gpus(CLASS),
            objects.queue("org", resources={"gpu": {"quota": 3}}),
            objects.queue("a", parent="org", resources={"gpu": {"quota": 1}}),
            objects.queue("b", parent="org", resources={"gpu": {"quota": 2, "overQuotaWeight": 2}}),
            objects.queue("c", resources={"gpu": {"quota": 1}}),
        ]
    )
    live.fairness()
    sums = [(queue, kind, r) for queue in ("org", "a", "b", "c") for kind in KINDS for r in ("gpu", "cpu")]
    for step in range(30):
        pods = sorted(live.kind("Pod"))
        roll = rng.random()
        if roll < 0.35 or not pods:
            pod = objects.pod("ns", f"p{step}", queue=rng.choice("abc"), template="one")
            live.apply("Pod", "ADDED", pod)
        elif roll < 0.55:
            key = rng.choice(pods)
            live.reserve(key, live.kind("Pod")[key], 30.0)
        elif roll < 0.75:
            key = rng.choice(pods)
            bound = dict(live.kind("Pod")[key])
            bound["spec"] = {**bound["spec"], "nodeName": rng.choice("ab")}
            live.apply("Pod", "MODIFIED", bound)
        elif roll < 0.9:
            live.apply("Pod", "DELETED", live.kind("Pod")[rng.choice(pods)])
        else:
            live.apply(
                "Queue", "MODIFIED", objects.queue("c", resources={"gpu": {"quota": rng.randint(0, 3)}})
            )
        view = live.fairness()
        fresh = synced_picture(objects_of(live))
        for key in reserved_pods(live):
            fresh.reserve(key, live.kind("Pod")[key], 30.0)
        again = fresh.fairness()
        # (running totals may differ from fresh sums in the last bits: approx there)
        assert view.usage.keys() == again.usage.keys()
        assert view.pending_pods == again.pending_pods
        for queue, usage in view.usage.items():
            assert usage.allocated == pytest.approx(again.usage[queue].allocated)
            assert usage.requested == pytest.approx(again.usage[queue].requested)
            assert view.fair_shares[queue] == pytest.approx(again.fair_shares[queue])
        assert dict(view.fair_shares) == compute_fair_shares(
            FairShareInputs(view.specs, view.usage, view.capacity)
        )
        whole = QueueTree(view.specs, view.usage)
        for question in rng.sample(sums, k=rng.randint(1, len(sums))):  # in any order
            assert view.tree.subtree(*question) == whole.subtree(*question)
            assert view.tree.subtree(*question) == pytest.approx(again.tree.subtree(*question))


def test_kept_fair_shares_are_divided_again_when_the_weight_adjustment_changes_version() -> None:
    # Queues a and b (no quota), 4 GPUs, each waiting for 4 one-GPU pods: 2 and 2. A weight
    # adjustment of factor 3 on a (version 1): weights 3 and 1, so a 3 and b 1. The same factors
    # under the same version are not read again (the kept shares stay); a new version with
    # factor 1 brings back 2 and 2 - with no pod or Queue event in between.
    picture = synced_picture(
        [
            *objects.two_nodes_of_two_gpus(CLASS),
            objects.queue("a"),
            objects.queue("b"),
            *(
                objects.pod("ns", f"{queue}{i}", queue=queue, template="one")
                for queue in "ab"
                for i in range(4)
            ),
        ]
    )

    def gpu_shares() -> dict[str, float]:
        view = picture.fairness()
        return {queue: view.fair_shares[queue]["gpu"] for queue in ("a", "b")}

    assert gpu_shares() == {"a": 2.0, "b": 2.0}
    picture.adjust_weights(WeightAdjustment(version=1, factors={"a": {"gpu": 3.0}}))
    assert gpu_shares() == {"a": 3.0, "b": 1.0}
    picture.adjust_weights(WeightAdjustment(version=1, factors={"a": {"gpu": 1.0}}))
    assert gpu_shares() == {"a": 3.0, "b": 1.0}  # version 1 still: the kept shares stand
    picture.adjust_weights(WeightAdjustment(version=2, factors={"a": {"gpu": 1.0}}))
    assert gpu_shares() == {"a": 2.0, "b": 2.0}
    picture.adjust_weights(None)  # back to the queues' weights: 2 and 2
    assert gpu_shares() == {"a": 2.0, "b": 2.0}
