"""Pure parts of benchmarks 2 and 3: the objects they create, the fair-share target, the figures."""

from __future__ import annotations

import asyncio

import pytest

from bench.e2e import (
    FLOOR_LABEL,
    GPUS_PER_NODE,
    KAI_ANCHOR,
    TEMPLATE,
    BindRun,
    BoundPods,
    CpuUse,
    E2EResult,
    api_calls_table,
    api_request_counts,
    e2e_table,
    gpu_pod,
    gpu_slices,
)
from bench.reaction import QUEUE_A, QUEUE_B, ReactionResult, ReactionRun, fair_share_of_b, reaction_table
from contract.kube import ClaimRef, pod_claim_refs
from contract.names import DRIVER_NAME, QUEUE_LABEL
from extender.picture.cluster import ClusterPicture, PictureConfig
from tests import extender_objects as objects


def test_slices_are_the_drivers_h100x8_pool_and_the_extender_counts_eight_free_gpus() -> None:
    slices = gpu_slices("gpu-0001")
    devices = [device for s in slices for device in s["spec"]["devices"]]
    assert [device["name"] for device in devices] == [f"gpu-{minor}" for minor in range(GPUS_PER_NODE)]
    owners = {(s["spec"]["driver"], s["spec"]["nodeName"]) for s in slices}
    assert owners == {(DRIVER_NAME, "gpu-0001")}
    assert all("memory" in device["capacity"] for device in devices)

    picture = ClusterPicture(PictureConfig())
    picture.apply("Node", "ADDED", objects.node("gpu-0001"))
    for s in slices:
        picture.apply("ResourceSlice", "ADDED", s)
    assert picture.node_gpus("gpu-0001").free_milli == (1000,) * GPUS_PER_NODE


def test_pod_takes_one_gpu_from_the_template_in_its_queue() -> None:
    pod = gpu_pod("ns", "p-00001", "bench-tessera", queue=QUEUE_A)
    assert pod_claim_refs(pod) == [ClaimRef(claim=None, template=TEMPLATE)]
    assert pod["spec"]["schedulerName"] == "bench-tessera"
    assert pod["metadata"]["labels"] == {QUEUE_LABEL: QUEUE_A}
    assert gpu_pod("ns", "p", "s")["metadata"]["labels"] == {}


def test_fair_share_of_b_is_half_with_equal_quotas_and_never_above_its_demand() -> None:
    assert fair_share_of_b(gpus=32, a_pods=64, b_pods=32) == 16
    assert fair_share_of_b(gpus=32, a_pods=64, b_pods=5) == 5


def test_median_rounds_ratios_and_tables() -> None:
    plain = BindRun("plain", 800, 10.0, 40.0, CpuUse(scheduler_s=12.5))
    tessera = tuple(
        BindRun("tessera", 800, 10.0, seconds, CpuUse(9.0, 20.0)) for seconds in (90.0, 50.0, 45.0)
    )
    result = E2EResult(nodes=100, pods=800, qps=500, burst=1000, plain_runs=(plain,), tessera_runs=tessera)
    assert result.tessera.bound_s == 50.0  # the median round
    assert plain.pods_per_s == 20.0 and result.tessera.pods_per_s == 16.0
    assert result.ratio == pytest.approx(0.8)
    table = e2e_table(result)
    assert "0.80x" in table and KAI_ANCHOR in table and "500/1000" in table
    assert "90.0, 50.0, 45.0" in table and "12.5" in table and "20.0" in table
    # Without floor rounds the vs-floor column is "-" in every row and the table says why.
    assert result.vs_floor is None
    assert [line.split()[-1] for line in table.splitlines()[2:4]] == ["-", "-"]
    assert "Tessera / floor: not measured" in table and "--no-floor" in table

    reaction = ReactionResult(
        nodes=4,
        a_pods=64,
        b_pods=32,
        finish_rate=4.0,
        plain_runs=(ReactionRun("plain", 16, 12.0, 48, 16, 16), ReactionRun("plain", 16, 14.0, 50, 16, 16)),
        tessera_runs=(ReactionRun("tessera", 16, 4.0, 16, 16, 16),),
    )
    assert reaction.plain.seconds == 12.0  # the lower middle of an even count
    assert reaction.ratio == 3.0
    assert "3.00x faster" in reaction_table(reaction)


def test_the_floor_row_and_api_calls_per_pod_beside_plain_and_tessera() -> None:
    plain = BindRun(
        "plain", 800, 4.0, 20.0, CpuUse(13.0, 0.0, 18.0), {"POST pods/binding": 800, "GET pods": 8}
    )
    tessera = BindRun("tessera", 800, 4.0, 25.0, CpuUse(13.0, 4.0, 19.0), {"POST pods/binding": 800})
    floor = BindRun("floor", 800, 4.0, 21.0, CpuUse(13.0, 0.8, 18.0), {"POST pods/binding": 800})
    result = E2EResult(
        nodes=100,
        pods=800,
        qps=500,
        burst=1000,
        plain_runs=(plain,),
        tessera_runs=(tessera,),
        floor_runs=(floor,),
    )
    table = e2e_table(result)
    # 800 pods in 25 s: 32.0 pods/s against 40.0, 0.80x; the floor 38.1 pods/s, 0.95x
    floor_row = next(line for line in table.splitlines() if line.startswith(FLOOR_LABEL))
    assert "38.1" in floor_row and "0.95x" in floor_row and "0.8" in floor_row
    assert "0.80x" in table and "19.0" in table  # Tessera's ratio and its control plane's CPU
    # Against the floor: Tessera 32.0 / 38.1 = 0.84x; plain 40.0 / 38.1 = 1.05x; the floor 1.00x.
    assert result.vs_floor == pytest.approx(21.0 / 25.0)  # the same pods, so the times' ratio
    rows = {line.split("  ")[0]: line.split()[-2:] for line in table.splitlines()[2:5]}
    assert rows == {
        "plain kube-scheduler": ["1.00x", "1.05x"],
        "kube-scheduler + Tessera": ["0.80x", "0.84x"],
        FLOOR_LABEL: ["0.95x", "1.00x"],
    }
    assert "Tessera / floor: 0.84x" in table
    calls = api_calls_table(result).splitlines()
    # 8 GETs of 800 pods is 0.01 a pod in every column: under 0.05, left out
    assert [line.split() for line in calls[2:]] == [
        ["POST", "pods/binding", "1.00", "1.00", "1.00"],
        ["all", "1.01", "1.00", "1.00"],
    ]


def test_api_request_counts_sum_the_apiservers_counter_by_verb_and_resource() -> None:
    metrics = "\n".join(
        [
            "# HELP apiserver_request_total Counter of apiserver requests.",
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 5',
            'apiserver_request_total{code="409",resource="pods",subresource="binding",verb="POST"} 2',
            'apiserver_request_total{code="200",resource="pods",subresource="",verb="LIST"} 3',
            'apiserver_request_total{code="200",resource="",subresource="",verb="GET"} 4',
            "# TYPE apiserver_request_duration_seconds histogram",
            'apiserver_request_duration_seconds_count{resource="pods",verb="POST"} 9',
        ]
    )
    assert api_request_counts(metrics) == {"POST pods/binding": 7, "LIST pods": 3, "GET -": 4}


async def test_bound_pods_counts_per_queue_and_names_the_wait_that_timed_out() -> None:
    tracker = BoundPods(bound={"a-1": QUEUE_A, "a-2": QUEUE_A, "b-1": QUEUE_B})
    assert tracker.per_queue() == {QUEUE_A: 2, QUEUE_B: 1}
    await tracker.wait_for(lambda t: t.per_queue()[QUEUE_A] == 2, timeout=1.0, what="two of A")
    with pytest.raises(asyncio.TimeoutError, match="three of B"):
        await tracker.wait_for(lambda t: t.per_queue()[QUEUE_B] == 3, timeout=0.01, what="three of B")
