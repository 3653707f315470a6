"""Pure parts of bench.fragmented, as worked examples: the layout (which halves end so one stays
on each GPU, read from Tessera's claims or KAI's GPU groups), the pods each contender gets, the
device plugin stand-in's choice of GPU index, and the table with its ratio line."""

from __future__ import annotations

from bench.e2e import TESSERA_SCHEDULER
from bench.fragmented import (
    HALF_TEMPLATE,
    TESSERA,
    ContenderRuns,
    DeviceTable,
    FragRun,
    claim_gpus,
    figures_json,
    fragmented_table,
    half_job_names,
    half_template,
    halves_to_end,
    kai_contender,
    kai_group_gpus,
    kai_half_pod,
    layout_problem,
    shared_gpu_configmap,
    tessera_half_pod,
    tessera_vs_kai,
)
from bench.kai import (
    GPU_FRACTION_ANNOTATION,
    GPU_GROUP_LABEL,
    KAI_QUEUE_LABEL,
    KAI_SCHEDULER,
    SHARED_GPU_CONFIGMAP_ANNOTATION,
)
from bench.reclaim import CLASSIC_NODE_LABEL, as_job
from contract.names import QUEUE_LABEL
from tessera.simulate.kube import FRACTION_CLASS

KAI = kai_contender("d5bc503 (source tree, commit d5bc503a)")


def test_two_halves_per_gpu_then_the_one_named_last_on_each_gpu_ends() -> None:
    # 2 GPUs, 4 halves: a and c share gpu-0, b and d gpu-1; c and d end, a and b stay, one a GPU.
    gpu_of = {"half-a": "n0/gpu-0", "half-b": "n0/gpu-1", "half-c": "n0/gpu-0", "half-d": "n0/gpu-1"}
    assert halves_to_end(gpu_of) == ["half-c", "half-d"]
    assert layout_problem(gpu_of, 2) is None
    left = {pod: gpu for pod, gpu in gpu_of.items() if pod not in halves_to_end(gpu_of)}
    assert sorted(left.values()) == ["n0/gpu-0", "n0/gpu-1"]
    # A lone half on a GPU stays; nothing to end there.
    assert halves_to_end({"half-a": "n0/gpu-0", "half-b": "n0/gpu-1", "half-c": "n0/gpu-1"}) == ["half-c"]
    assert len(half_job_names(8)) == 16 and half_job_names(1) == ["half-000", "half-001"]


def test_a_layout_that_would_leave_a_gpu_whole_or_three_halves_on_one_is_refused() -> None:
    # 4 halves on 2 of 3 GPUs: the third stays whole free, so the whole pod would fit at once.
    assert (
        layout_problem({"a": "g0", "b": "g0", "c": "g1", "d": "g1"}, 3) == "the halves hold 2 of the 3 GPUs"
    )
    assert layout_problem({"a": "g0", "b": "g0", "c": "g0", "d": "g1"}, 2) == "more than two halves on g0"


def test_tesseras_halves_gpus_come_from_their_claims_allocation() -> None:
    def claim(pod: str | None, device: str | None) -> dict[str, object]:
        status: dict[str, object] = {}
        if device:
            results = [{"request": "gpu", "driver": "gpu.tessera.dev", "pool": "gpu-0000", "device": device}]
            status["allocation"] = {"devices": {"results": results}}
        if pod:
            status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": "u"}]
        return {"metadata": {"name": f"{pod}-gpu-x"}, "status": status}

    claims = [
        claim("half-000-a", "gpu-3"),
        claim("half-001-b", "gpu-3"),
        claim(None, "gpu-1"),
        claim("p", None),
    ]
    assert claim_gpus(claims) == {"half-000-a": "gpu-0000/gpu-3", "half-001-b": "gpu-0000/gpu-3"}


def test_kais_halves_gpus_come_from_the_gpu_group_its_binder_labels_them_with() -> None:
    def pod(name: str, node: str | None, group: str | None) -> dict[str, object]:
        labels = {GPU_GROUP_LABEL: group} if group else {}
        spec = {"nodeName": node} if node else {}
        return {"metadata": {"name": name, "labels": labels}, "spec": spec}

    pods = [
        pod("half-000-a", "classic-0000", "g1"),
        pod("half-001-b", "classic-0000", "g1"),
        pod("h", None, None),
    ]
    assert kai_group_gpus([*pods, pod("half-002-c", "classic-0000", None)]) == {
        "half-000-a": "classic-0000/g1",
        "half-001-b": "classic-0000/g1",
    }
    assert GPU_GROUP_LABEL == "runai-gpu-group"


def test_tesseras_half_is_a_fractional_claim_of_half_an_h100() -> None:
    template = half_template("ns")
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert template["metadata"]["name"] == HALF_TEMPLATE
    assert exactly == {
        "deviceClassName": FRACTION_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"memory": "40Gi"}},
    }
    pod = tessera_half_pod("ns", "half-000")
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": HALF_TEMPLATE}]
    assert pod["spec"]["schedulerName"] == TESSERA_SCHEDULER
    assert pod["metadata"]["labels"] == {QUEUE_LABEL: "frag"}


def test_kais_half_asks_half_a_gpu_by_annotation_on_a_classic_node_and_keeps_it_as_a_job() -> None:
    pod = kai_half_pod("ns", "half-007")
    main = pod["spec"]["containers"][0]
    assert "resourceClaims" not in pod["spec"] and "claims" not in main["resources"]
    assert "limits" not in main["resources"]  # no nvidia.com/gpu: the fraction is the annotation
    assert pod["spec"]["nodeSelector"] == dict([CLASSIC_NODE_LABEL])
    assert pod["spec"]["schedulerName"] == KAI_SCHEDULER
    assert pod["metadata"]["labels"][KAI_QUEUE_LABEL] == "frag"
    configmap = shared_gpu_configmap("half-007")
    assert pod["metadata"]["annotations"] == {
        GPU_FRACTION_ANNOTATION: "0.5",
        SHARED_GPU_CONFIGMAP_ANNOTATION: configmap,
    }
    # The webhook's shape: owner name, seven characters, "-shared-gpu"; one name per Job.
    assert configmap.startswith("half-007-") and configmap.endswith("-shared-gpu")
    assert len(configmap) == len("half-007-") + 7 + len("-shared-gpu")
    assert configmap == shared_gpu_configmap("half-007") != shared_gpu_configmap("half-008")
    # As a Job, the annotations go to the template: KAI reads them on the pod.
    job = as_job(pod)
    assert job["spec"]["template"]["metadata"]["annotations"] == pod["metadata"]["annotations"]
    assert "annotations" not in as_job(tessera_half_pod("ns", "half-000"))["spec"]["template"]["metadata"]


def test_the_device_plugin_gives_the_lowest_free_indexes_and_takes_them_back() -> None:
    table = DeviceTable(gpus_per_node=4)
    assert table.take("n0", "reserve-a", 1) == [0]
    assert table.take("n0", "reserve-b", 1) == [1]
    assert table.take("n0", "reserve-a", 1) == [0]  # asked again (a later event): the same GPU
    assert table.take("n1", "reserve-c", 1) == [0]  # another node's indexes are its own
    assert table.take("n0", "whole", 2) == [2, 3]  # a whole-GPU pod holds device-plugin GPUs too
    assert table.take("n0", "reserve-d", 1) is None  # n0 full: the kubelet would not admit it
    table.release("reserve-b")
    assert table.take("n0", "reserve-d", 1) == [1]
    table.release("unknown")  # nothing held: nothing to free
    assert table.held["n0"] == {"reserve-a": [0], "whole": [2, 3], "reserve-d": [1]}


def run(bound_s: float | None, moved: int, gpus: int = 8) -> FragRun:
    return FragRun(gpus, gpus, 1, bound_s, tuple(f"half-{i:03d}-x" for i in range(moved)), gpus)


def test_the_table_has_a_row_per_contender_and_the_ratio_when_both_ran() -> None:
    results = [ContenderRuns(TESSERA, (run(2.0, 1),)), ContenderRuns(KAI, (run(8.0, 1),))]
    assert tessera_vs_kai(results) == 0.25
    table = fragmented_table(results, 60.0)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["contender", "GPUs", "half-GPU", "pods"]
    assert lines[2].split() == [
        "kube-scheduler",
        "+",
        "Tessera",
        "8",
        "8",
        "1",
        "2.0",
        "1",
        "/",
        "1",
        "1",
        "8",
        "-",
    ]
    assert lines[3].split() == [
        "KAI",
        "Scheduler",
        "d5bc503",
        "8",
        "8",
        "1",
        "8.0",
        "1",
        "/",
        "1",
        "1",
        "8",
        "0",
    ]
    assert lines[4] == "Tessera / KAI, time to run: 0.25x"
    figures = figures_json(results, 1)
    assert figures["tessera_vs_kai_time"] == 0.25 and figures["moves (KAI Scheduler d5bc503)"] == [1]
    assert figures["bound_s (kube-scheduler + Tessera)"] == [2.0] and figures["gpus"] == 8


def test_a_whole_pod_not_bound_in_time_reads_not_in_t_and_no_ratio_is_drawn() -> None:
    results = [ContenderRuns(TESSERA, (run(2.0, 1),)), ContenderRuns(KAI, (run(None, 0),))]
    assert tessera_vs_kai(results) is None
    lines = fragmented_table(results, 60.0).splitlines()
    assert "not in 60" in lines[3] and " 0 / 1 " in lines[3]
    assert (
        lines[4] == "Tessera / KAI, time to run: not measured (one of them did not run the whole pod in time)"
    )
    assert figures_json(results, 1)["bound_s (KAI Scheduler d5bc503)"] == [None]
    alone = fragmented_table([ContenderRuns(TESSERA, (run(2.0, 1),))], 60.0)
    assert alone.endswith("Tessera / KAI, time to run: not measured (KAI did not race)")


def test_over_rounds_the_median_counts_a_round_not_run_as_the_slowest() -> None:
    assert ContenderRuns(TESSERA, (run(3.0, 1), run(1.0, 2), run(2.0, 1))).median_s == 2.0
    assert ContenderRuns(TESSERA, (run(3.0, 1), run(1.0, 1))).median_s == 2.0  # two: their mean
    assert ContenderRuns(TESSERA, (run(None, 0), run(1.0, 1), run(2.0, 1))).median_s == 2.0
    assert ContenderRuns(TESSERA, (run(None, 0), run(None, 0), run(2.0, 1))).median_s is None
    rounds = ContenderRuns(TESSERA, (run(None, 0), run(1.0, 1), run(2.0, 2)))
    assert rounds.ran == 2 and rounds.moves == [0, 1, 2]
    assert " 2 / 3 " in fragmented_table([rounds], 60.0) and "0, 1, 2" in fragmented_table([rounds], 60.0)
