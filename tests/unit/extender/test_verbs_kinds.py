"""Filter and prioritize judge nodes by kind (shape and GPU size, one verdict and one score per
kind); a differential test against a per-node oracle that judges every node on its own.

The oracle is the rule as written: a node passes when the pod's placement demand, sized for the
node's GPUs, fits the supply the pod may use there (`supply_for`: minus GPUs held for others);
scores are `score_nodes` over those supplies. Pictures are the benchmark's (70% of GPUs held,
one GPU in three shared by two halves), with holds added on some nodes (for another pod, and for
the pod itself) and names the picture does not know.
"""

from __future__ import annotations

import random

import pytest

from bench.picture import build_picture, load_picture, pod_object
from extender.picture.cluster import ClusterPicture
from extender.policy.placement import GpuDemand, score_nodes
from extender.verbs import _misfit, decide_filter, decide_priorities, queue_strategy
from extender.wire import ExtenderArgs, ExtenderFilterResult
from tests.unit.extender.pictures import supply


def _oracle_filter(picture: ClusterPicture, args: ExtenderArgs) -> dict[str, str]:
    demand = picture.demand(args.Pod)
    reference = picture.reference_memory(demand.models)
    sizes = picture.gpu_memory if demand.fractional else {}
    return {
        name: _misfit(
            supply(picture, args.pod.key, name),
            demand.placement_at(sizes.get(name) or reference),
        )
        for name in args.candidate_names()
    }


def _oracle_scores(picture: ClusterPicture, args: ExtenderArgs) -> dict[str, int]:
    demand = picture.demand(args.Pod)
    placement = demand.placement_at(picture.reference_memory(demand.models))
    supplies = [supply(picture, args.pod.key, name) for name in args.candidate_names()]
    return score_nodes(supplies, placement, picture.mix(), queue_strategy(picture, demand.queue))


def _verdicts(result: ExtenderFilterResult) -> dict[str, str]:
    return {**dict.fromkeys(result.NodeNames or [], ""), **result.FailedNodes}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("pending", ["whole", "half"])
def test_kinds_judge_and_score_every_node_as_the_per_node_rule_does(seed: int, pending: str) -> None:
    built = build_picture(nodes=40, pods=300, seed=seed)
    picture = load_picture(built)
    rng = random.Random(seed)
    pod = built.pending_pods[pending]
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    # GPUs held on six nodes: four for some other pod (this pod may not use them), two for this
    # pod (it may); a held node is a kind of its own.
    for i, node in enumerate(rng.sample(built.node_names, 6)):
        holder = key if i < 2 else f"other/pod-{i}"
        picture.hold(holder, node, GpuDemand(count=rng.choice([1, 2])), ttl_s=600)
    names = [*built.node_names, "not-a-node"]
    rng.shuffle(names)
    args = ExtenderArgs(Pod=pod, NodeNames=names)

    decision = decide_filter(picture, args)
    assert decision.outcome == "admitted", decision.message
    verdicts = _verdicts(decision.result)
    assert verdicts == _oracle_filter(picture, args)
    assert decision.result.NodeNames == [name for name in names if not verdicts[name]]  # in order
    assert 0 < len(decision.result.NodeNames) < len(names)  # the case is not trivial

    scores = decide_priorities(picture, args).scores
    assert scores == _oracle_scores(picture, args)
    assert len(set(scores.values())) > 2


def test_prioritize_reads_the_kinds_the_filter_passed_while_no_node_changed() -> None:
    built = build_picture(nodes=40, pods=300, seed=1)
    picture = load_picture(built)
    pod = built.pending_pods["whole"]
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    decision = decide_filter(picture, ExtenderArgs(Pod=pod, NodeNames=list(built.node_names)))
    passed = decision.passed
    assert passed is not None and decision.result.NodeNames is not None
    assert passed.nodes.names == decision.result.NodeNames
    # kube-scheduler asks prioritize about the nodes passed: a new request, a new list of them.
    asked = ExtenderArgs(Pod=pod, NodeNames=list(decision.result.NodeNames))
    version = picture.nodes_version
    assert passed.of(key, "", list(decision.result.NodeNames), version) is passed.nodes
    before = decide_priorities(picture, asked, passed).scores
    assert before == _oracle_scores(picture, asked)
    # Another pod, other names, another workload: not what the filter judged.
    assert passed.of("bench/other", "", asked.candidate_names(), version) is None
    assert passed.of(key, "", asked.candidate_names()[1:], version) is None
    assert passed.of(key, "bench/some-job", asked.candidate_names(), version) is None

    # A pod taking all the CPU of a passed node, after the filter: the inventory's version moved,
    # and prioritize reads the nodes again (that node now scores 0: the pod no longer fits there).
    node = max(before, key=before.__getitem__)  # a best-ranked node
    assert before[node] == 10
    hog = pod_object("hog", "team-a", node)
    hog["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "128"
    picture.apply("Pod", "ADDED", hog)
    assert picture.nodes_version != version
    assert passed.of(key, "", asked.candidate_names(), picture.nodes_version) is None
    scores = decide_priorities(picture, asked, passed).scores
    assert scores == _oracle_scores(picture, asked)
    assert scores[node] == 0


def test_a_filter_with_gpus_held_on_a_candidate_keeps_nothing_for_prioritize() -> None:
    built = build_picture(nodes=10, pods=50, seed=2)
    picture = load_picture(built)
    pod = built.pending_pods["half"]
    picture.hold("other/pod", built.node_names[0], GpuDemand(count=1), ttl_s=600)
    decision = decide_filter(picture, ExtenderArgs(Pod=pod, NodeNames=list(built.node_names)))
    assert decision.outcome == "admitted" and decision.passed is None  # judged per call there
    without = decide_filter(picture, ExtenderArgs(Pod=pod, NodeNames=built.node_names[1:]))
    assert without.passed is not None
