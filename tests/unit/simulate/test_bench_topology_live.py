"""Pure parts of bench.topology_live: the workload drawn for a seed, the racks a gang spans, the
figures and the ratio line; and the KAI objects it makes for a gang."""

from __future__ import annotations

import pytest

from bench.e2e import GPUS_PER_NODE, TEMPLATE, TESSERA_SCHEDULER, claim_template, gpu_pod
from bench.kai import (
    KAI_QUEUE_LABEL,
    KAI_SCHEDULER,
    POD_GROUP_ANNOTATION,
    SKIP_PODGROUPER_ANNOTATION,
    kai_pod_group,
    kai_topology,
    pod_group_member,
)
from bench.topology_live import (
    SMOKE_LAYOUT,
    SMOKE_SIZES,
    Contender,
    ContenderRun,
    GangStart,
    LiveGang,
    LiveWorkload,
    LonePod,
    free_gpus,
    gangs_table,
    largest_rack_room,
    live_table,
    live_workload,
    pooled,
    rack_domains,
    rack_free,
    racks_spanned,
    started_by_all,
    tessera_vs_kai,
)
from bench.topologywaits import GANG_GPUS, MEMBER_GPUS, mixed_workload
from tessera.dev.localcluster import node_layout

LAYOUT = node_layout("2x4x2")  # 16 nodes x 8 GPUs: 128 GPUs in 8 racks
NODES = list(LAYOUT.nodes)


def test_the_gangs_are_bench_topologywaits_draw_with_the_times_scaled() -> None:
    # 128 GPUs with a quarter to lone pods leaves 96, as topologywaits' 128 - 32: the same gangs.
    workload = live_workload(3, NODES, 40, load=1.0, time_scale=0.1)
    simulated = [job for job in mixed_workload(3, 40, 1.0)["jobs"] if job["queue"] == "train"]
    assert len(workload.gangs) == len(simulated) == 40
    first = simulated[0]["arrival"]
    for gang, job in zip(workload.gangs, simulated, strict=True):
        assert (gang.name, gang.members, gang.per_member) == (job["name"], job["count"], job["gpus"])
        assert gang.arrival_s == pytest.approx((job["arrival"] - first) * 0.1, abs=0.01)
        assert gang.duration_s == pytest.approx(job["duration"] * 0.1, abs=0.06)


def test_a_workload_is_fixed_by_its_seed_and_its_gangs_are_mixed() -> None:
    workload = live_workload(0, NODES, 30)
    assert workload == live_workload(0, NODES, 30) != live_workload(1, NODES, 30)
    assert workload.gangs[0].arrival_s == 0.0
    arrivals = [gang.arrival_s for gang in workload.gangs]
    assert arrivals == sorted(arrivals)
    for gang in workload.gangs:
        assert gang.gpus in GANG_GPUS and gang.per_member in MEMBER_GPUS and gang.members >= 2
        assert 20.0 <= gang.duration_s <= 90.0  # 200-900 s at the default time scale 0.1
    assert workload.gpu_counts == {1, *(gang.per_member for gang in workload.gangs)}
    assert len({gang.gpus for gang in workload.gangs}) >= 5


def test_lone_pods_take_a_quarter_of_the_gpus_on_nodes_drawn_never_more_than_a_node_holds() -> None:
    workload = live_workload(0, NODES, 30)
    assert len(workload.lone) == 32
    per_node = {node: sum(1 for pod in workload.lone if pod.node == node) for node in NODES}
    assert max(per_node.values()) <= GPUS_PER_NODE and sum(per_node.values()) == 32
    assert len({pod.name for pod in workload.lone}) == 32
    # Two nodes, 15 lone pods: one node full, the other one GPU short, none over.
    nearly = live_workload(0, NODES[:2], 1, lone_share=15 / 16)
    assert sorted(sum(1 for pod in nearly.lone if pod.node == node) for node in NODES[:2]) == [7, 8]


def test_the_smoke_workload_fits_its_cluster() -> None:
    layout = node_layout(SMOKE_LAYOUT)
    workload = live_workload(0, list(layout.nodes), 3, sizes=SMOKE_SIZES, time_scale=0.01)
    free = len(layout.nodes) * GPUS_PER_NODE - len(workload.lone)
    assert all(gang.gpus <= free for gang in workload.gangs) and len(rack_domains(layout)) == 2


def test_racks_are_domain_paths_so_rack_names_repeating_across_blocks_are_two_racks() -> None:
    racks = rack_domains(LAYOUT)
    assert len(racks) == 16 and len(set(racks.values())) == 8
    assert racks["gpu-node-0"] == racks["gpu-node-1"] == "block0/rack0"
    assert racks["gpu-node-2"] == "block0/rack1" and racks["gpu-node-8"] == "block1/rack0"
    assert racks_spanned(["gpu-node-0", "gpu-node-1", "gpu-node-0"], racks) == 1
    assert racks_spanned(["gpu-node-0", "gpu-node-8"], racks) == 2  # rack0 of each block
    assert racks_spanned(["gpu-node-0", "gpu-node-3", "gpu-node-15"], racks) == 3
    with pytest.raises(ValueError, match="without racks"):
        rack_domains(node_layout("4"))


TESSERA = Contender("kube-scheduler + Tessera, preferred rack", TESSERA_SCHEDULER, True, "shipped")
KAI = Contender("KAI Scheduler d5bc503, preferred rack", KAI_SCHEDULER, True, "operator's")


def test_figures_of_a_run_and_the_ratio_on_all_and_on_the_gangs_both_started() -> None:
    tessera = ContenderRun(
        TESSERA, 3, (GangStart("a", 8, 1.0, 1), GangStart("b", 16, 3.0, 2), GangStart("c", 4, 2.0, 1))
    )
    kai = ContenderRun(KAI, 3, (GangStart("a", 8, 2.0, 2), GangStart("b", 16, 5.0, 4)), 1, 2)
    assert tessera.racks_mean == pytest.approx(4 / 3) and tessera.racks_max == 2
    assert (tessera.wait_mean_s, tessera.wait_p95_s) == (2.0, 3.0)
    assert started_by_all([tessera, kai]) == {"a", "b"}
    assert tessera.racks_mean_of({"a", "b"}) == 1.5
    ratio = tessera_vs_kai([tessera, kai])
    assert ratio is not None and ratio[0] == pytest.approx(4 / 9) and ratio[1] == pytest.approx(0.5)
    table = live_table([tessera, kai])
    assert "Tessera / KAI racks per gang: 0.44x (every gang each started), 0.50x" in table
    assert "target at most 1.00x: yes" in table and "2 / 3" in table
    assert table.splitlines()[3].split()[-2:] == ["1", "2"]  # KAI's evictions: lone, gang pods
    worse = ContenderRun(KAI, 3, (GangStart("a", 8, 2.0, 1),))
    assert "target at most 1.00x: no" in live_table([tessera, worse])


def test_a_gang_spread_although_one_rack_held_it_is_counted() -> None:
    # Racks r0 (n0, n1) and r1 (n2, n3), 8 GPUs a node. Lone pods: 3 on n0, 1 on n2; gang g (2
    # members x 4 GPUs) runs on n1 and n3. Free: n0 5, n1 4, n2 7, n3 4.
    rack_of = {"n0": "r0", "n1": "r0", "n2": "r1", "n3": "r1"}
    lone = [LonePod("l0", "n0"), LonePod("l1", "n0"), LonePod("l2", "n0"), LonePod("l3", "n2")]
    running = [(LiveGang("g", 2, 4, 0.0, 60.0), ["n1", "n3"])]
    free = free_gpus(rack_of, lone, running)
    assert free == {"n0": 5, "n1": 4, "n2": 7, "n3": 4}
    # 4-GPU members: r0 holds 5 // 4 + 4 // 4 = 2, r1 7 // 4 + 4 // 4 = 2; 2-GPU members: r0
    # 2 + 2 = 4, r1 3 + 2 = 5.
    assert largest_rack_room(free, rack_of, 4) == 2 and largest_rack_room(free, rack_of, 2) == 5
    assert rack_free(free, rack_of) == {"r0": 9, "r1": 11}  # (the log line names these)
    # A gang of 2 x 4 over both racks where one held both members: spread needlessly; one of 3 x 4
    # (no rack held 3) or one kept in one rack: not.
    needless = GangStart("a", 8, 1.0, 2, rack_room=2, members=2)
    forced = GangStart("b", 12, 1.0, 2, rack_room=2, members=3)
    kept = GangStart("c", 8, 1.0, 1, rack_room=2, members=2)
    unknown = GangStart("d", 8, 1.0, 2)  # (no room recorded)
    assert [g.spread_needlessly for g in (needless, forced, kept, unknown)] == [True, False, False, False]
    run = ContenderRun(KAI, 4, (needless, forced, kept, unknown))
    assert run.spread_needlessly == 1
    assert live_table([run]).splitlines()[2].split()[-3:] == ["1", "0", "0"]
    # The per-gang table marks the needless spread with a star after its racks.
    drawn = LiveWorkload(tuple(LiveGang(name, 2, 4, 0.0, 60.0) for name in "abcd"), tuple(lone))
    racks = [line.split()[6] for line in gangs_table(drawn, [run]).splitlines()[2:]]
    assert racks == ["2*", "2", "1", "2"]


def test_without_kai_the_ratio_says_it_was_not_measured() -> None:
    run = ContenderRun(TESSERA, 1, (GangStart("a", 8, 1.0, 1),))
    assert tessera_vs_kai([run]) is None
    assert "not measured (KAI did not race)" in live_table([run])
    nothing = ContenderRun(TESSERA, 1, ())
    assert (nothing.racks_mean, nothing.racks_max, nothing.wait_p95_s) == (0.0, 0, 0.0)


def test_rounds_pool_their_gangs_and_all_started_means_in_every_round() -> None:
    first = ContenderRun(TESSERA, 2, (GangStart("a", 8, 1.0, 1), GangStart("b", 8, 1.0, 1)), 1, 2)
    second = ContenderRun(TESSERA, 2, (GangStart("a", 8, 3.0, 2),))
    both = pooled([first, second])
    assert (both.drawn, len(both.started), both.evicted_lone, both.evicted_members) == (4, 3, 1, 2)
    assert started_by_all([both]) == {"a"}


def test_claim_templates_by_gpu_count_and_pods_that_use_them() -> None:
    assert claim_template(1) == TEMPLATE and claim_template(4) == "gpus-4"
    pod = gpu_pod("ns", "g-0", TESSERA_SCHEDULER, "train", gpus=4)
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "gpus-4"}]


def test_kais_objects_for_a_gang_preferring_a_rack() -> None:
    topology = kai_topology("racks", ["example.com/block", "example.com/rack", "kubernetes.io/hostname"])
    assert topology["apiVersion"] == "kai.scheduler/v1alpha1" and topology["kind"] == "Topology"
    assert topology["spec"]["levels"][1] == {"nodeLabel": "example.com/rack"}
    assert "namespace" not in topology["metadata"]  # cluster-scoped
    group = kai_pod_group("ns", "g8-0", "train", 4, "racks", "example.com/rack")
    assert group["apiVersion"] == "scheduling.run.ai/v2alpha2"
    assert group["spec"] == {
        "minMember": 4,
        "queue": "train",
        "priorityClassName": "train",
        "topologyConstraint": {"topology": "racks", "preferredTopologyLevel": "example.com/rack"},
    }
    assert "topologyConstraint" not in kai_pod_group("ns", "g", "train", 2)["spec"]
    pod = gpu_pod("ns", "g8-0-0", KAI_SCHEDULER, "train", gpus=2)
    member = pod_group_member(pod, "g8-0")
    assert member["metadata"]["annotations"] == {
        POD_GROUP_ANNOTATION: "g8-0",
        SKIP_PODGROUPER_ANNOTATION: "true",
    }
    assert member["metadata"]["labels"][KAI_QUEUE_LABEL] == "train" and member["spec"] == pod["spec"]
    assert "annotations" not in pod["metadata"]  # the original is left alone
