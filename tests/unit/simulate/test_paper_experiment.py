"""The FGD paper's experiment: pod order, tuning to the target, ties, measurement, baseline scores."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from extender.policy.placement import GpuDemand, mix_from_demands
from tessera.simulate.baselines import (
    TaskType,
    best_fit_score,
    paper_fragmentation,
    sigmoid_score,
    typical_tasks,
)
from tessera.simulate.cluster import Cluster
from tessera.simulate.packing import Placer, arrival_order, replay_packing, tune_to_target
from tessera.simulate.policies import make_policy
from tessera.simulate.trace import SimNode, SimPod, load_nodes, load_pods

TIMED_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time"
)


def synthetic_rows(count: int) -> list[tuple[str, str]]:
    """(request columns, time columns) of a small mixed trace: fractions, whole and multi-GPU, CPU-only."""
    rng = random.Random(5)
    rows = []
    for i in range(count):
        num_gpu, milli = rng.choice([(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (0, 0)])
        spec = rng.choice(["", "", "T4"])
        created = rng.randrange(10_000)
        rows.append(
            (
                f"pod-{i:03d},{rng.choice([2000, 4000, 8000])},4096,{num_gpu},{milli},{spec}",
                f"LS,Running,{created},",
            )
        )
    return rows


def write_cluster(folder: Path) -> Path:
    nodes = folder / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(
            f"n{i},32000,131072,{gpus},{model}\n"
            for i, (gpus, model) in enumerate([(4, "T4"), (8, "V100M16")] * 5)
        )
    )
    return nodes


def test_shuffled_replay_is_the_same_with_and_without_time_columns(tmp_path: Path) -> None:
    rows = synthetic_rows(60)
    timed = tmp_path / "timed.csv"
    timed.write_text(TIMED_HEADER + "\n" + "".join(f"{head},{tail}\n" for head, tail in rows))
    bare = tmp_path / "bare.csv"
    # No time (nor qos, phase) columns, and the rows in another order: neither may change a
    # shuffled replay.
    bare.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        + "".join(f"{head}\n" for head, _ in reversed(rows))
    )
    nodes = load_nodes(write_cluster(tmp_path))
    timed_pods, bare_pods = load_pods(timed), load_pods(bare)
    assert any(p.creation_time is not None for p in timed_pods)
    assert all(p.creation_time is None for p in bare_pods)
    for policy in ("fgd", "tessera", "random"):
        with_times = replay_packing(nodes, timed_pods, policy, seed=4)
        without = replay_packing(nodes, bare_pods, policy, seed=4)
        assert with_times.curve == without.curve
        assert (with_times.allocation_pct, with_times.pods_placed) == (
            without.allocation_pct,
            without.pods_placed,
        )


def test_paper_order_is_a_seeded_shuffle_and_creation_order_follows_times() -> None:
    demand = GpuDemand(count=1, milli=500)
    pods = [SimPod(f"p{i}", demand, creation_time=(None if i == 2 else 10 - i)) for i in range(6)]
    shuffled = arrival_order(pods, "paper", seed=1)
    assert sorted(p.name for p in shuffled) == [p.name for p in pods]
    assert shuffled == arrival_order(list(reversed(pods)), "paper", seed=1)
    assert shuffled != arrival_order(pods, "paper", seed=2)
    # By time; a pod without one comes last.
    assert [p.name for p in arrival_order(pods, "creation", seed=1)] == ["p5", "p4", "p3", "p1", "p0", "p2"]


def test_tuning_appends_draws_until_the_per_gpu_request_would_pass_the_target() -> None:
    small = SimPod("small", GpuDemand(count=1, milli=500))
    cpu = SimPod("cpu", GpuDemand(count=0, cpu_milli=1000))
    tuned = tune_to_target([small, cpu], target_milli=2600, seed=0)
    assert tuned[:2] == [small, cpu]
    assert sum(p.gpu_milli for p in tuned) == 2500  # 500 more would pass 2600
    # A trace above the target loses random pods until it fits.
    big = [SimPod(f"b{i}", GpuDemand(count=2, milli=1000)) for i in range(5)]
    cut = tune_to_target(big, target_milli=6500, seed=0)
    assert len(cut) == 3 and all(p in big for p in cut)


def test_tuning_checks_only_the_per_gpu_share_of_a_multi_gpu_draw() -> None:
    eight = SimPod("eight", GpuDemand(count=8, milli=1000))
    tuned = tune_to_target([eight], target_milli=9000, seed=0)
    # 8000 + 1000 (per GPU) <= 9000, so the second 8-GPU draw goes in: 16000 asked, as the paper's
    # simulator does; the third is checked against 17000 > 9000 and stops the tuning.
    assert [p.gpu_milli for p in tuned] == [8000, 8000]


def test_allocation_is_the_mean_over_arrivals_that_round_to_the_target() -> None:
    # One 1-GPU node. Pods of 300: 1 node x 1000 milli; arrivals 30, 60, 90, 120 -> 129.x never
    # reached, so the measure falls back to the final allocation.
    nodes = [SimNode("n", "T4", gpus=1, cpu_milli=8000, memory_mib=8192)]
    result = replay_packing(nodes, [SimPod("p", GpuDemand(count=1, milli=300))], "bestfit", seed=0)
    assert result.arrival_pct == pytest.approx(120.0)
    assert result.allocation_pct == result.final_allocation_pct == pytest.approx(90.0)
    # Pods of 100 on a 1000-milli node: arrivals 10..130 in steps of 10; 130 rounds to 130, where
    # allocation is 100 (the node filled at 100% arrival).
    tenth = replay_packing(nodes, [SimPod("q", GpuDemand(count=1, milli=100))], "bestfit", seed=0)
    assert tenth.arrival_pct == pytest.approx(130.0)
    assert tenth.allocation_pct == pytest.approx(100.0)


def test_first_tie_break_takes_the_lowest_node_index() -> None:
    nodes = [SimNode(f"n{i}", "T4", gpus=1, cpu_milli=8000, memory_mib=8192) for i in range(4)]
    demand = GpuDemand(count=1, milli=1000, cpu_milli=100)
    mix = mix_from_demands([demand])
    placer = Placer(Cluster(nodes, mix), make_policy("bestfit", mix), random.Random(0), tie_break="first")
    assert [placer.place(demand) for _ in range(4)] == [(0, (0,)), (1, (0,)), (2, (0,)), (3, (0,))]


def test_random_policy_ignores_the_tie_rule() -> None:
    nodes = [SimNode(f"n{i}", "T4", gpus=8, cpu_milli=96000, memory_mib=8192) for i in range(20)]
    demand = GpuDemand(count=1, milli=1000)
    mix = mix_from_demands([demand])
    placer = Placer(Cluster(nodes, mix), make_policy("random", mix), random.Random(0), tie_break="first")
    chosen = {placement[0] for placement in (placer.place(demand) for _ in range(10)) if placement}
    assert len(chosen) > 1


def test_typical_tasks_keep_the_most_popular_types_covering_95_percent() -> None:
    common = GpuDemand(count=1, milli=500, cpu_milli=4000, memory_mib=1)
    # Memory is no part of a type: this is the same type as ``common``.
    same_but_memory = GpuDemand(count=1, milli=500, cpu_milli=4000, memory_mib=2)
    rare = GpuDemand(count=2, milli=1000, cpu_milli=8000)
    tasks = typical_tasks([(common, 50.0), (same_but_memory, 46.0), (rare, 4.0)])
    assert [(task, popularity) for task, _, popularity in tasks.types] == [(TaskType(4000, 500, 1, ""), 1.0)]


def test_paper_fragmentation_by_hand() -> None:
    share = GpuDemand(count=1, milli=500, cpu_milli=4000)
    pair = GpuDemand(count=2, milli=1000, cpu_milli=8000, models=frozenset({"V100M16"}))
    cpu_only = GpuDemand(count=0, cpu_milli=2000)
    tasks = typical_tasks([(share, 2.0), (pair, 1.0), (cpu_only, 1.0)], threshold_pct=100)
    free = (1000, 300, 600, 1000)  # idle 2900
    # share (1/2): fits, the 300 is stranded -> 300. pair (1/4): T4 is not its model -> 2900.
    # cpu-only (1/4): GPUs are idle to it whatever -> 2900.
    assert paper_fragmentation("T4", free, 16000, tasks) == pytest.approx(
        0.5 * 300 + 0.25 * 2900 + 0.25 * 2900
    )
    # On a V100M16 with 6 cores free: pair lacks CPU (2900), share fits (300).
    assert paper_fragmentation("V100M16", free, 6000, tasks) == pytest.approx(
        0.5 * 300 + 0.25 * 2900 + 0.25 * 2900
    )
    # With 3 cores: share lacks CPU too.
    assert paper_fragmentation("V100M16", free, 3000, tasks) == pytest.approx(0.75 * 2900 + 0.25 * 2900)


def test_integer_scores() -> None:
    assert sigmoid_score(1000.0, 1000.0) == 50
    assert sigmoid_score(200.0, 0.0) == int(100 / (1 + math.exp(-0.2)))  # 54
    assert sigmoid_score(0.0, 266.7) == 43
    demand = GpuDemand(count=1, milli=500, cpu_milli=8000)
    # 0.5 * (64000 - 8000) / 128000 + 0.5 * (4000 - 500) / 8000 = 0.21875 + 0.21875 -> 56.25 -> 56
    assert best_fit_score(64000, 4000, demand) == 56


def test_fgd_puts_a_fraction_on_the_lowest_index_gpu_among_equal_scores() -> None:
    share = GpuDemand(count=1, milli=500, cpu_milli=1000)
    mix = mix_from_demands([share])
    policy = make_policy("fgd", mix)
    node = Cluster([SimNode("n", "T4", gpus=4, cpu_milli=32000, memory_mib=1024)], mix).node_gpus(0)
    assert policy.gpus(node, share, random.Random(0)) == (0,)
