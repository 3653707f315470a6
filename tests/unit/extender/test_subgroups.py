"""Subgroups: a workload's parts, each with its own minimum, as worked examples.

From the pod to its parts (`workload_of`, `part_of`), the webhook's refusals (`subgroup_refusal`),
the admission rule counting each part (`GangState`, `admit`), the filter admitting a leader and its
workers whole and elastic workers pod by pod, and reclaim taking elastic members first.

Unless said: one-GPU pods; parts `leader=1,workers=4` (minimum 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from contract.names import (
    ADMISSION_GATE,
    GPU_MILLI,
    MIN_MEMBERS_ANNOTATION,
    SUBGROUP_LABEL,
    SUBGROUP_MINIMUMS_ANNOTATION,
    TOPOLOGY_REQUIRED_ANNOTATION,
    WORKLOAD_LABEL,
)
from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.policy.admission import (
    GANG,
    GANG_ELASTIC,
    GANG_INCOMPLETE,
    Ask,
    GangState,
    PartState,
    Waiting,
    admit,
    waiting_list,
)
from extender.policy.fairness import FairnessSnapshot, QueueSpec, QueueUsage
from extender.policy.placement import NO_DOMAINS, GpuDemand, NodeGpus, WorkloadMix
from extender.policy.snapshot import ClusterSnapshot, RunningPod
from extender.policy.topology import PartAsk, domain_sizes, never_held_parts_text, parse_topology, plan_parts
from extender.policy.workloads import (
    Parts,
    Workload,
    parse_parts,
    part_of,
    subgroup_refusal,
    workload_of,
)
from extender.server import build_app
from extender.status import WaitingPods
from extender.webhook import MUTATE_PODS_PATH, WebhookOptions, webhook_app
from tests import extender_objects as objects
from tests.unit.extender.pictures import supply
from tests.unit.extender.serving import serve
from tests.unit.extender.test_gangs import bind
from tests.unit.extender.test_server import CLASS, Extender, args
from tests.unit.extender.test_webhook import Webhooks, cluster, patch_of

JsonObject = dict[str, Any]
RACK = "example.com/rack"
LEADER_WORKERS = "leader=1,workers=4"


@pytest.fixture
async def extender() -> AsyncIterator[Extender]:
    picture, waiting, api = ClusterPicture(), WaitingPods(), ApiClient()
    app = build_app(picture, Binder(api, picture), waiting, ExtenderMetrics(picture))
    async with serve(app) as client:
        yield Extender(client, picture, waiting, api)
    await api.close()


@pytest.fixture
async def webhooks() -> AsyncIterator[Webhooks]:
    picture = ClusterPicture()
    api = ApiClient(Configuration(host="http://127.0.0.1:1"))  # nothing listens there
    app = webhook_app(api, picture, ExtenderMetrics(picture), WebhookOptions(scheduler_name="tessera"))
    async with serve(app) as client:
        yield Webhooks(client, picture)
    await api.close()


def meta_pod(labels: dict[str, str], annotations: dict[str, str] | None = None) -> JsonObject:
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels, "annotations": annotations or {}}}


def lws_pod(worker_index: str, **annotations: str) -> JsonObject:
    return meta_pod(
        {
            "leaderworkerset.sigs.k8s.io/name": "serve",
            "leaderworkerset.sigs.k8s.io/group-index": "0",
            "leaderworkerset.sigs.k8s.io/worker-index": worker_index,
        },
        {"leaderworkerset.sigs.k8s.io/size": "4", **annotations},
    )


def jobset_pod(replicated: str) -> JsonObject:
    return meta_pod(
        {"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": replicated}
    )


JOBSET = {
    "spec": {
        "replicatedJobs": [
            {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1, "completions": 1}}},
            {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 3, "completions": 3}}},
        ]
    }
}


def jobset_job(replicated: str, index: int, parallelism: int) -> JsonObject:
    labels = {"jobset.sigs.k8s.io/jobset-name": "js", "jobset.sigs.k8s.io/replicatedjob-name": replicated}
    return {
        "metadata": {"name": f"js-{replicated}-{index}", "namespace": "ns", "labels": labels},
        "spec": {"parallelism": parallelism, "completions": parallelism},
    }


def bare(part: str, minimums: str = LEADER_WORKERS) -> JsonObject:
    return meta_pod({WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}, {SUBGROUP_MINIMUMS_ANNOTATION: minimums})


@pytest.mark.parametrize(
    ("pod", "lookup", "owned", "part", "minimum", "parts"),
    [
        # The annotation: grouped by the workload label, the minimum is the parts' sum (1 + 4).
        (bare("leader"), None, (), "leader", 5, (("leader", 1), ("workers", 4))),
        (bare("workers"), None, (), "workers", 5, (("leader", 1), ("workers", 4))),
        # A LeaderWorkerSet group of size 4: worker-index 0 is the leader, the rest 3 workers.
        (lws_pod("0"), None, (), "leader", 4, (("leader", 1), ("workers", 3))),
        (lws_pod("2"), None, (), "workers", 4, (("leader", 1), ("workers", 3))),
        # A JobSet read: driver 1 x 1, workers 2 replicas x 3 = 6; 7 in all.
        (jobset_pod("workers"), JOBSET, (), "workers", 7, (("driver", 1), ("workers", 6))),
        # The JobSet unknown, its Jobs watched: the same parts from their replicated-job labels.
        (
            jobset_pod("driver"),
            None,
            (jobset_job("driver", 0, 1), jobset_job("workers", 0, 3), jobset_job("workers", 1, 3)),
            "driver",
            7,
            (("driver", 1), ("workers", 6)),
        ),
        # min-members overrides the table's number and drops its parts: one group of 6.
        (lws_pod("1", **{MIN_MEMBERS_ANNOTATION: "6"}), None, (), "workers", 6, ()),
        # Parts that do not parse are no parts (the webhook refuses such pods): members.
        (bare("leader", "leader=0,workers=4"), None, (), "leader", None, ()),
    ],
)
def test_a_pods_part_and_its_workloads_parts(
    pod: JsonObject,
    lookup: JsonObject | None,
    owned: tuple[JsonObject, ...],
    part: str,
    minimum: int | None,
    parts: Parts,
) -> None:
    found = workload_of(pod, lambda kind, key: lookup, lambda kind, key: owned)
    assert (part_of(pod), found.minimum, found.parts) == (part, minimum, parts)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("leader=1,workers=4", ""),
        (" leader = 1 , workers=4 ", ""),
        ("leader=0,workers=4", "minimum of part 'leader' must be a positive integer, not '0'"),
        ("leader=one", "minimum of part 'leader' must be a positive integer, not 'one'"),
        ("leader", "'leader' is not part=minimum"),
        ("leader=1,,workers=4", "'' is not part=minimum"),
        ("leader=1,leader=2", "part 'leader' is named twice"),
        ("lead er=1", "part name 'lead er' is not a label value"),
    ],
)
def test_parts_parse_or_say_what_is_wrong(text: str, error: str) -> None:
    if not error:
        assert parse_parts(text) == (("leader", 1), ("workers", 4))
        return
    with pytest.raises(ValueError, match=error):
        parse_parts(text)


@pytest.mark.parametrize(
    ("pod", "refusal"),
    [
        (bare("leader"), ""),
        (meta_pod({}), ""),  # no parts, no refusal
        (lws_pod("0"), ""),  # parts from the LeaderWorkerSet: nothing to check
        (
            bare("leader", "leader=0,workers=4"),
            "annotation scheduling.tessera.dev/subgroup-min-members='leader=0,workers=4': "
            "minimum of part 'leader' must be a positive integer, not '0'",
        ),
        (
            bare("driver"),
            "the pod's part 'driver' is not one of the parts scheduling.tessera.dev/subgroup-min-members "
            "states: leader, workers",
        ),
        (
            meta_pod({WORKLOAD_LABEL: "lw"}, {SUBGROUP_MINIMUMS_ANNOTATION: LEADER_WORKERS}),
            "annotation scheduling.tessera.dev/subgroup-min-members states parts (leader, workers); "
            "label scheduling.tessera.dev/subgroup must name the pod's",
        ),
        (
            meta_pod({WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: "leader"}),
            "label scheduling.tessera.dev/subgroup=leader names a part, but annotation "
            "scheduling.tessera.dev/subgroup-min-members does not state the parts' minimums",
        ),
        (
            meta_pod(
                {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: "leader"},
                {SUBGROUP_MINIMUMS_ANNOTATION: LEADER_WORKERS, MIN_MEMBERS_ANNOTATION: "6"},
            ),
            "annotation scheduling.tessera.dev/min-members=6 disagrees with the parts' minimums "
            "(leader=1,workers=4: 5 in all)",
        ),
    ],
)
def test_the_webhook_refuses_subgroups_stated_wrong(pod: JsonObject, refusal: str) -> None:
    assert subgroup_refusal(pod).startswith(refusal) and bool(subgroup_refusal(pod)) == bool(refusal)


async def test_the_pod_webhook_answers_a_malformed_subgroup_with_the_reason(webhooks: Webhooks) -> None:
    webhooks.sync(cluster())
    pod = objects.pod("plain", "p", queue="team-b", template="one")
    pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: "leader"}
    pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: "leader=1,workers=-4"}
    answer = await webhooks.review(MUTATE_PODS_PATH, pod)
    assert answer["allowed"] is False
    assert "minimum of part 'workers' must be a positive integer, not '-4'" in answer["status"]["message"]


async def test_the_gate_counts_the_pod_being_created_in_its_part(webhooks: Webhooks) -> None:
    # 4 workers exist (gated); the leader being created completes part leader (0 + 1 = 1): the
    # gang is complete and team-b (no limit) takes all 5, so the leader is not gated. A 5th worker
    # instead leaves part leader at 0 present: gated, the short part named.
    def plain(part: str, index: int) -> JsonObject:
        pod = objects.pod("plain", f"{part}-{index}", queue="team-b", template="one")
        pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}
        pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: LEADER_WORKERS}
        return pod

    workers = [plain("workers", i) for i in range(4)]
    webhooks.sync(
        cluster(
            *({**w, "spec": {**w["spec"], "schedulingGates": [{"name": ADMISSION_GATE}]}} for w in workers)
        )
    )
    answer = await webhooks.review(MUTATE_PODS_PATH, plain("workers", 4))
    assert [op["path"] for op in patch_of(answer)] == ["/spec/schedulingGates"]
    assert "part leader: minimum 1, 0 placed, 0 present: waits for its pods" in answer["warnings"][0]
    assert patch_of(await webhooks.review(MUTATE_PODS_PATH, plain("leader", 0))) == []


# ---- admission counts each part ---------------------------------------------------------------

WORKLOAD = Workload(
    "Workload/ns/lw", "Workload", "lw", 5, "annotation", parts=(("leader", 1), ("workers", 4))
)


def state(
    leader: tuple[int, int], workers: tuple[int, int], part: str = "leader", reserved: bool = False
) -> GangState:
    """The gang with (members, placed) of each part; the asking pod of `part`."""
    parts = (PartState("leader", 1, *leader), PartState("workers", 4, *workers))
    return GangState(
        WORKLOAD, 5, leader[0] + workers[0], leader[1] + workers[1], reserved, parts=parts, part=part
    )


def roomy() -> FairnessSnapshot:
    spec = QueueSpec("team", quota={"gpu": 8})
    return FairnessSnapshot.build([spec], {"team": QueueUsage({}, {"gpu": 6})}, {"gpu": 8})


@dataclass(frozen=True)
class AdmissionCase:
    name: str
    gang: GangState
    admitted: bool  # the gang as a unit (GangState.admitted)
    missing: int
    elastic: bool
    kind: str  # the rule's decision for the asking pod (QUEUE: admitted by the queue)
    says: str = ""


QUEUE = "queue"
ADMISSION = [
    AdmissionCase(
        # 1 leader + 5 workers, nothing placed: it misses 1 + 4 = 5, judged whole (queue: 5 x 1 <= 8).
        "nothing placed: judged whole",
        state((1, 0), (5, 0)),
        False,
        5,
        False,
        QUEUE,
    ),
    AdmissionCase(
        # 5 workers placed and no leader: 5 pods placed, the minimum's count, but part leader
        # misses 1 -> not admitted; it misses 1 (the leader), not 0. (Counted as one group, it
        # would be admitted and the leader would go pod by pod.)
        "five workers placed and no leader is not admitted",
        state((1, 0), (5, 5)),
        False,
        1,
        False,
        QUEUE,
    ),
    AdmissionCase(
        # 6 pods present, but no leader: the controller has not created part leader yet.
        "a part with too few pods waits for them",
        state((0, 0), (6, 0), part="workers"),
        False,
        5,
        False,
        GANG_INCOMPLETE,
        "part leader: minimum 1, 0 placed, 0 present: waits for its pods",
    ),
    AdmissionCase(
        # Reserved, 4 workers placed: a 5th worker is above its part's minimum, elastic, judged
        # by the queue alone; the leader's pod is still placed with the unit.
        "a worker above its part's minimum is elastic while the leader is placed",
        state((1, 0), (6, 4), part="workers", reserved=True),
        True,
        1,
        True,
        QUEUE,
    ),
    AdmissionCase(
        "the leader of a reserved gang is placed with the unit",
        state((1, 0), (6, 4), part="leader", reserved=True),
        True,
        1,
        False,
        GANG,
    ),
    AdmissionCase(
        # Not admitted (its leader is not placed: it lapsed): the 5th worker does not admit the
        # gang for the leader; the leader's own filter does.
        "an elastic pod of a gang not admitted waits for the gang",
        state((1, 0), (6, 4), part="workers"),
        False,
        1,
        True,
        GANG_ELASTIC,
        "this pod is above its part's minimum (part workers: minimum 4, 4 placed, 6 present)",
    ),
    AdmissionCase(
        "every part at its minimum: admitted, members go pod by pod",
        state((1, 1), (5, 4), part="workers"),
        True,
        0,
        True,
        QUEUE,
    ),
]


@pytest.mark.parametrize("case", ADMISSION, ids=[c.name for c in ADMISSION])
def test_admission_counts_each_part(case: AdmissionCase) -> None:
    gang = case.gang
    assert (gang.admitted, gang.missing, gang.elastic) == (case.admitted, case.missing, case.elastic)
    ask = Ask("team", {"gpu": 1.0}, gang=gang)
    decision = admit(roomy(), ask)
    assert case.says in decision.reason
    if case.kind == QUEUE:  # the queue asked for the pods it must take at once: all missing, or 1
        assert decision.admit and decision.kind not in (GANG, GANG_ELASTIC, GANG_INCOMPLETE)
        assert ask.pods == (gang.missing if not gang.admitted else 1)
    else:
        assert (decision.admit, decision.kind) == (case.kind == GANG, case.kind)


def test_reclaim_serves_a_gang_whose_first_waiting_pod_is_elastic() -> None:
    # The gang lapsed with 4 workers placed: it misses the leader. Listed first, the 6th worker is
    # above its part's minimum; judged at it, the gang was refused (gang_elastic) and never listed
    # for reclaim. It is skipped: the leader is listed, marked with the gang.
    worker = Waiting("ns/workers-5", Ask("team", {"gpu": 1.0}, gang=state((1, 0), (6, 4), part="workers")))
    leader = Waiting("ns/leader-0", Ask("team", {"gpu": 1.0}, gang=state((1, 0), (6, 4), part="leader")))
    listed = waiting_list(roomy(), [worker, leader])
    assert [(entry.waiting.key, entry.workload) for entry in listed] == [("ns/leader-0", "Workload/ns/lw")]


# ---- reclaim: elastic members first, a part's minimum with the whole ----------------------------


def gang_snapshot(workers: int) -> ClusterSnapshot:
    """A leader and `workers` workers of "leader=1,workers=4" on node n (8 GPUs)."""
    pods = [("l0", "leader"), *((f"w{i}", "workers") for i in range(workers))]
    running = {
        key: RunningPod(key, "a", "n", ((i, GPU_MILLI),), {"gpu": 1.0}, workload="W", part=part)
        for i, (key, part) in enumerate(pods)
    }
    nodes = {"n": NodeGpus("n", "", tuple([0] * len(pods) + [GPU_MILLI] * (8 - len(pods))))}
    usage = {"a": QueueUsage({"gpu": float(len(pods))}, {})}
    fairness = FairnessSnapshot.build([QueueSpec("a", quota={"gpu": 8})], usage, {"gpu": 8})
    return ClusterSnapshot(
        nodes,
        running,
        fairness,
        WorkloadMix(demands=()),
        minimums={"W": 5},
        part_minimums={"W": {"leader": 1, "workers": 4}},
    )


@pytest.mark.parametrize(
    ("workers", "victim", "elastic", "unit"),
    [
        # 6 pods, 1 above the minimum of 5. A worker is elastic (5 workers > 4) and goes alone;
        # the leader is not (1 = its part's 1), though the gang has 6 > 5: it goes with all 6.
        (5, "w0", True, 1),
        (5, "l0", False, 6),
        # 4 workers: each is at its part's minimum: with the whole gang.
        (4, "w0", False, 5),
    ],
)
def test_reclaim_takes_members_above_their_parts_minimum_first(
    workers: int, victim: str, elastic: bool, unit: int
) -> None:
    snapshot = gang_snapshot(workers)
    pod = snapshot.running[victim]
    assert (snapshot.elastic(pod), len(snapshot.unit_of(pod))) == (elastic, unit)


# ---- through the filter: a leader and its workers --------------------------------------------


def lw_member(part: str, index: int) -> JsonObject:
    pod = objects.pod("ns", f"{part}-{index}", queue="team", template="one")
    pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}
    pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: LEADER_WORKERS}
    return pod


def lw_cluster(*extra: JsonObject, third_gpus: int = 0) -> list[JsonObject]:
    third = [objects.node("c"), objects.gpu_slice("c", third_gpus)] if third_gpus else []
    return [*objects.two_nodes_of_two_gpus(CLASS), *third, objects.queue("team"), *extra]


async def test_a_leader_and_workers_on_four_gpus_wait_naming_the_short_part(extender: Extender) -> None:
    # 1 leader + 4 workers on a and b (2 GPUs each): room for 4 of the 5. The room goes to the
    # parts in order: the leader's 1, then 3 for 4 workers -> part workers is short.
    pods = [lw_member("leader", 0), *(lw_member("workers", i) for i in range(4))]
    extender.sync(lw_cluster(*pods))
    _, result = await extender.call("filter", args(pods[1], ["a", "b"]))
    assert result["NodeNames"] == []
    assert result["FailedAndUnresolvableNodes"]["a"].endswith(
        "starts whole or not at all: GPUs free for 4 of its 5 missing pods (1 GPU each); "
        "part workers: minimum 4, 0 placed, 4 present; room for 3 of its 4 missing"
    )


async def admitted_with_four_workers_bound(extender: Extender, c_gpus: int) -> list[JsonObject]:
    """1 leader + 5 workers; a, b with 2 GPUs and c with `c_gpus`: the gang of 5 is admitted and
    held on a, a, b, b, c; four workers bind on a and b. Returns the leader and the workers."""
    pods = [lw_member("leader", 0), *(lw_member("workers", i) for i in range(5))]
    extender.sync(lw_cluster(*pods, third_gpus=c_gpus))
    await extender.call("filter", args(pods[1], NODES))
    reservation = extender.picture.gang_reservation("Workload/ns/lw")
    assert reservation is not None and sorted(reservation.nodes) == ["a", "a", "b", "b", "c"]
    devices = [("a", "gpu-0"), ("a", "gpu-1"), ("b", "gpu-0"), ("b", "gpu-1")]
    for version, (pod, (node, device)) in enumerate(zip(pods[1:5], devices, strict=True), start=10):
        bind(extender.picture, pod, node, device, version)
        extender.picture.fairness()  # (the reservation follows its members)
    # Part workers is at its minimum; the slot left, on c, is the leader's.
    held = extender.picture.gang_reservation("Workload/ns/lw")
    assert held is not None and held.slots == ["c"]
    return pods


NODES = ["a", "b", "c"]


async def test_an_elastic_worker_never_takes_the_leaders_held_gpu(extender: Extender) -> None:
    # c has 1 GPU, held for the leader. The fifth worker is above its part's minimum: judged alone,
    # it sees c's GPU taken. (Counted as one group, 4 of 5 placed, it was "being placed" with the
    # unit and took the leader's GPU.)
    leader, *workers = await admitted_with_four_workers_bound(extender, c_gpus=1)
    _, result = await extender.call("filter", args(workers[4], NODES))
    assert result["NodeNames"] == []
    _, result = await extender.call("filter", args(leader, NODES))
    assert result["NodeNames"] == ["c"]  # the leader is placed with the unit: c is its


async def test_an_elastic_worker_bound_does_not_complete_the_gang(extender: Extender) -> None:
    # c has 2 GPUs: the fifth worker binds on the one not held. 5 pods placed, but part leader
    # has none: the reservation stays, its one slot the leader's. (Counted as one group, 5 of 5
    # placed ended it, and the leader went pod by pod without a held GPU.)
    leader, *workers = await admitted_with_four_workers_bound(extender, c_gpus=2)
    bind(extender.picture, workers[4], "c", "gpu-1", 20)
    extender.picture.fairness()
    held = extender.picture.gang_reservation("Workload/ns/lw")
    assert held is not None and (held.placed, held.slots) == (4, ["c"])
    bind(extender.picture, leader, "c", "gpu-0", 21)
    extender.picture.fairness()
    assert extender.picture.gang_reservation("Workload/ns/lw") is None  # every part at its minimum


# ---- a level per part --------------------------------------------------------------------------

RACKS = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}  # levels rack > host


def supplies(free: dict[str, int]) -> list[NodeGpus]:
    return [NodeGpus(name, "", tuple([GPU_MILLI] * gpus)) for name, gpus in free.items()]


def part_ask(name: str, count: int, level: str) -> PartAsk:
    maps = {"rack": RACKS, "host": {node: f"{rack}/{node}" for node, rack in RACKS.items()}}
    depth = {"": -1, "rack": 0, "host": 1}[level]
    return PartAsk(name, count, level, depth, maps[level] if level else None, NO_DOMAINS, GpuDemand(1))


@pytest.mark.parametrize(
    ("free", "leader_level", "nodes", "domains", "short"),
    [
        # r1: a 3, b 3 (6 free); r2: c 4, d 1 (5). Both racks hold the 5 with a level; r2 has
        # less room and is tried first. The workers (host: narrowest, planned first) take c, the
        # tightest host that holds 4; the leader (rack) takes what r2 has left: d.
        (
            {"a": 3, "b": 3, "c": 4, "d": 1},
            "rack",
            ["c", "c", "c", "c", "d"],
            {"workers": ("host", "r2/c"), "leader": ("rack", "r2")},
            "",
        ),
        # c has 3: r2 (4 free) cannot hold the 5; in r1 no host holds 4 (3 and 3).
        (
            {"a": 3, "b": 3, "c": 3, "d": 1},
            "rack",
            [],
            {},
            "part workers: needs 4 GPUs in one host; largest host has 3 free "
            "(room for 3 of its 4 missing pods)",
        ),
        # No rack holds 5 at all: said at the widest level, for the parts with a level together.
        (
            {"a": 2, "b": 2, "c": 4, "d": 0},
            "rack",
            [],
            {},
            "its parts with a level together: needs 5 GPUs in one rack; largest rack has 4 free",
        ),
        # The leader states no level: the workers are the parts with one (host c, the only host
        # holding 4), and the leader goes anywhere: of what is left (c and d full) the node with
        # least room that fits, a - outside the workers' rack.
        (
            {"a": 3, "b": 3, "c": 4, "d": 0},
            "",
            ["c", "c", "c", "c", "a"],
            {"workers": ("host", "r2/c")},
            "",
        ),
    ],
)
def test_each_part_is_planned_in_a_domain_of_its_own_level(
    free: dict[str, int], leader_level: str, nodes: list[str], domains: dict[str, tuple[str, str]], short: str
) -> None:
    parts = [part_ask("leader", 1, leader_level), part_ask("workers", 4, "host")]
    outer = "rack" if leader_level == "rack" else "host"
    outer_map = RACKS if outer == "rack" else {node: f"{rack}/{node}" for node, rack in RACKS.items()}
    plan = plan_parts(supplies(free), parts, outer, outer_map)
    assert (plan.nodes, plan.domains) == (nodes, domains)
    assert plan.short.startswith(short) and bool(plan.short) == bool(short)


def test_parts_larger_than_every_domain_of_their_levels_are_told_they_cannot_start() -> None:
    # 4 GPUs a node, all busy (sizes count GPUs free or not): racks r1 (a, b) and r2 (c, d) of
    # 8 in all, hosts of 4.
    hosts = {node: f"{rack}/{node}" for node, rack in RACKS.items()}
    every = [NodeGpus(name, "", (0,) * 4) for name in RACKS]

    def sizes_of(level: str) -> dict[str, int]:
        return domain_sizes(every, RACKS if level == "rack" else hosts)

    # A leader (rack) and 4 workers (host): 5 GPUs in a rack, 4 in a host - both could be held.
    fits = [part_ask("leader", 1, "rack"), part_ask("workers", 4, "host")]
    assert never_held_parts_text(fits, "rack", sizes_of) == ""
    # 5 workers in one host of 4: the rack (6 in all with the leader) could hold them, the host
    # never.
    wide = [part_ask("leader", 1, "rack"), part_ask("workers", 5, "host")]
    assert never_held_parts_text(wide, "rack", sizes_of) == (
        "part workers: needs 5 GPUs in one host; the largest host has 4 GPUs in all, "
        "so it cannot start as asked"
    )
    # A leader and 8 workers in one rack: 9 GPUs together, more than a rack's 8.
    together = [part_ask("leader", 1, "rack"), part_ask("workers", 8, "rack")]
    assert never_held_parts_text(together, "rack", sizes_of).startswith(
        "needs 9 GPUs in one rack; the largest"
    )


TOPOLOGY = parse_topology(f"rack={RACK},host=kubernetes.io/hostname")


@pytest.fixture
async def racked() -> AsyncIterator[Extender]:
    picture, waiting, api = ClusterPicture(PictureConfig(topology=TOPOLOGY)), WaitingPods(), ApiClient()
    app = build_app(picture, Binder(api, picture), waiting, ExtenderMetrics(picture))
    async with serve(app) as client:
        yield Extender(client, picture, waiting, api)
    await api.close()


async def test_a_leader_in_a_rack_and_workers_in_one_host_go_to_the_nodes_planned_for_their_part(
    racked: Extender,
) -> None:
    # Racks r1 (a, b: 3 GPUs each) and r2 (c: 4, d: 1); the leader's template requires a rack,
    # the workers' a host. r2 has less room: the workers are held on c, the leader on d.
    free = {"a": 3, "b": 3, "c": 4, "d": 1}
    leader = lw_member("leader", 0)
    leader["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = "rack"
    workers = [lw_member("workers", i) for i in range(4)]
    for pod in workers:
        pod["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = "host"
    racked.sync(
        [
            *(
                objects.node(name, labels={RACK: rack, "kubernetes.io/hostname": name})
                for name, rack in RACKS.items()
            ),
            *(objects.gpu_slice(name, gpus) for name, gpus in free.items()),
            objects.device_class(CLASS),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.queue("team"),
            leader,
            *workers,
        ]
    )
    names = list(RACKS)
    _, result = await racked.call("filter", args(workers[0], names))
    reservation = racked.picture.gang_reservation("Workload/ns/lw")
    assert reservation is not None
    assert sorted(reservation.nodes) == ["c", "c", "c", "c", "d"]
    assert dict(reservation.part_domains) == {"workers": ("host", "r2/c"), "leader": ("rack", "r2")}
    assert result["NodeNames"] == ["c"]
    assert "admitted whole with part workers in host r2/c, part leader in rack r2" in (
        racked.waiting.reports["ns/workers-0"].reason
    )
    # The leader passes only d: c is in its rack, but its GPUs are held for the workers.
    _, result = await racked.call("filter", args(leader, names))
    assert result["NodeNames"] == ["d"]
    assert result["FailedNodes"]["c"] == "part leader of gang Workload/ns/lw is placed on d in rack r2"


# ---- parts of different shapes -----------------------------------------------------------------

SHAPED = "leader=1,workers=2"  # a CPU-only leader (no claim), 2 workers of 4 GPUs each


def shaped_member(part: str, index: int, requirement: str = "") -> JsonObject:
    pod = objects.pod("ns", f"{part}-{index}", queue="team", template="four" if part == "workers" else None)
    pod["metadata"]["labels"] |= {WORKLOAD_LABEL: "lw", SUBGROUP_LABEL: part}
    pod["metadata"]["annotations"] = {SUBGROUP_MINIMUMS_ANNOTATION: SHAPED}
    if requirement:
        pod["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = requirement
    return pod


def shaped_cluster(free: dict[str, int], *pods: JsonObject, limit: int | None = None) -> list[JsonObject]:
    """Nodes of `free` GPUs, racks r1 (a, b) and r2 (c, d) as RACKS; queue team (GPU limit)."""
    resources = {"gpu": {"limit": limit}} if limit is not None else None
    return [
        *(objects.node(name, labels={RACK: RACKS[name], "kubernetes.io/hostname": name}) for name in free),
        *(objects.gpu_slice(name, gpus) for name, gpus in free.items()),
        objects.device_class(CLASS),
        objects.claim_template("ns", "four", objects.claim_spec(CLASS, 4)),
        objects.queue("team", resources=resources),
        *pods,
    ]


def bind_four(picture: ClusterPicture, pod: JsonObject, node: str, version: int) -> None:
    """A worker bound to `node` with its claim allocated to that node's 4 GPUs."""
    name = pod["metadata"]["name"]
    devices: list[tuple[str, str, str | None]] = [(node, f"gpu-{minor}", None) for minor in range(4)]
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS, 4), allocated=devices)
    picture.apply(
        "ResourceClaim", "ADDED", {**claim, "metadata": {**claim["metadata"], "resourceVersion": "1"}}
    )
    status = {
        **pod["status"],
        "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}],
    }
    metadata = {**pod["metadata"], "resourceVersion": str(version)}
    picture.apply(
        "Pod",
        "MODIFIED",
        {**pod, "metadata": metadata, "spec": {**pod["spec"], "nodeName": node}, "status": status},
    )


def free_for_others(picture: ClusterPicture, names: list[str]) -> list[int]:
    """Whole GPUs a pod outside the gang sees free on each node (the gang's holds taken)."""
    return [sum(supply(picture, "ns/other", name).free_milli) // GPU_MILLI for name in names]


@pytest.mark.parametrize("asking", ["leader", "workers"])
async def test_a_cpu_only_leader_and_four_gpu_workers_are_admitted_together_each_with_its_shape(
    racked: Extender, asking: str
) -> None:
    # a 4, b 4, c 2 free. The 3 missing pods, planned alike with the asking pod's shape, were
    # either 3 x 4 GPUs (a worker asking: a, b, and c holds 2 -> "GPUs free for 2 of its 3") or
    # 3 x nothing (the leader asking: admitted with no GPU held, the workers' GPUs free to
    # anyone). Each part with its own shape: the workers' 2 x 4 GPUs held on a and b, the leader
    # holds none, whichever member's filter admits the gang.
    pods = [shaped_member("leader", 0), shaped_member("workers", 0), shaped_member("workers", 1)]
    racked.sync(shaped_cluster({"a": 4, "b": 4, "c": 2}, *pods))
    names = ["a", "b", "c"]
    _, result = await racked.call("filter", args(pods[0 if asking == "leader" else 1], names))
    reservation = racked.picture.gang_reservation("Workload/ns/lw")
    assert reservation is not None, result
    assert {part: slots.nodes for part, slots in reservation.part_slots.items()} == {
        "leader": [""],
        "workers": ["a", "b"],
    }
    racked.picture.fairness()  # (the reservation's slots are held from here)
    assert free_for_others(racked.picture, names) == [0, 0, 2]
    # The queue counts the slots with each part's request: 8 GPUs (the leader's counts none).
    assert racked.picture.fairness().usage["team"].allocated.get("gpu", 0.0) == 8
    # Each worker passes only the nodes planned for its part.
    _, result = await racked.call("filter", args(pods[2], names))
    assert result["NodeNames"] == ["a", "b"]


@pytest.mark.parametrize(
    ("free", "limit", "reason"),
    [
        # 2 x 4 GPUs asked, limit 6: refused with each part's request summed (asked as 3 pods of
        # the leader's nothing, it went through).
        (
            {"a": 4, "b": 4},
            6,
            "its 3 missing pods together: queue 'team': gpu allocated 0 + request 8 would exceed its "
            "limit (6)",
        ),
        # One node holds a worker: part workers is short, named with its own count.
        ({"a": 4, "b": 3}, None, "part workers: GPUs free for 1 of its 2 missing pods"),
    ],
)
async def test_parts_of_different_shapes_are_refused_with_their_own_numbers(
    racked: Extender, free: dict[str, int], limit: int | None, reason: str
) -> None:
    pods = [shaped_member("leader", 0), shaped_member("workers", 0), shaped_member("workers", 1)]
    racked.sync(shaped_cluster(free, *pods, limit=limit))
    _, result = await racked.call("filter", args(pods[0], list(free)))
    assert racked.picture.gang_reservation("Workload/ns/lw") is None
    assert reason in result["FailedAndUnresolvableNodes"]["a"]


async def test_workers_requiring_a_rack_land_in_one_and_a_cpu_only_leader_requiring_it_follows(
    racked: Extender,
) -> None:
    # Racks r1 (a 4, b 2: 6 free) and r2 (c 4, d 4: 8). The workers (2 x 4 GPUs) fit r2 only;
    # the leader, CPU only, requires the rack too: it holds no GPU and passes r2's nodes.
    free = {"a": 4, "b": 2, "c": 4, "d": 4}
    leader = shaped_member("leader", 0, requirement="rack")
    workers = [shaped_member("workers", i, requirement="rack") for i in range(2)]
    racked.sync(shaped_cluster(free, leader, *workers))
    names = list(free)
    await racked.call("filter", args(workers[0], names))
    reservation = racked.picture.gang_reservation("Workload/ns/lw")
    assert reservation is not None
    assert dict(reservation.part_domains) == {"workers": ("rack", "r2"), "leader": ("rack", "r2")}
    assert sorted(reservation.part_slots["workers"].nodes) == ["c", "d"]
    _, result = await racked.call("filter", args(leader, names))
    assert result["NodeNames"] == ["c", "d"]
    assert result["FailedNodes"]["a"] == "part leader of gang Workload/ns/lw is placed in rack r2"


async def test_a_worker_takes_its_own_parts_slot_and_the_gang_ends_when_every_part_is_placed(
    racked: Extender,
) -> None:
    # a 4, b 4, c 2: workers held on a and b, the leader on no node. worker-0 binds on a (all 4
    # of its GPUs): its slot goes, b's stays (4 GPUs), the leader's stays (counted, no hold).
    pods = [shaped_member("leader", 0), shaped_member("workers", 0), shaped_member("workers", 1)]
    racked.sync(shaped_cluster({"a": 4, "b": 4, "c": 2}, *pods))
    await racked.call("filter", args(pods[1], ["a", "b", "c"]))
    bind_four(racked.picture, pods[1], "a", 10)
    racked.picture.fairness()
    held = racked.picture.gang_reservation("Workload/ns/lw")
    assert held is not None and (held.placed, sorted(held.slots)) == (1, ["", "b"])
    assert free_for_others(racked.picture, ["a", "b", "c"]) == [0, 0, 2]
    bind_four(racked.picture, pods[2], "b", 11)
    racked.picture.fairness()
    held = racked.picture.gang_reservation("Workload/ns/lw")
    assert held is not None and held.slots == [""]  # the leader still to place
    bound = {**pods[0], "spec": {**pods[0]["spec"], "nodeName": "c"}}
    racked.picture.apply(
        "Pod", "MODIFIED", {**bound, "metadata": {**bound["metadata"], "resourceVersion": "12"}}
    )
    racked.picture.fairness()
    assert racked.picture.gang_reservation("Workload/ns/lw") is None


@pytest.mark.parametrize(
    ("placed", "asking", "asked"),
    [
        # Nothing placed: 1 leader x 1 CPU + 4 workers x (8 GPUs, 2 CPUs) = 32 GPUs, 9 CPUs -
        # whichever pod asks (5 x the leader's was 0 GPUs; 5 x a worker's, 40).
        ((0, 0), "leader", {"cpu": 9.0, "gpu": 32.0}),
        ((0, 0), "workers", {"cpu": 9.0, "gpu": 32.0}),
        # The leader and 3 workers placed: 1 worker missing, 8 GPUs and 2 CPUs.
        ((1, 3), "leader", {"cpu": 2.0, "gpu": 8.0}),
    ],
)
def test_a_gang_of_parts_asks_its_queue_for_each_parts_missing_pods_with_their_own_request(
    placed: tuple[int, int], asking: str, asked: dict[str, float]
) -> None:
    leader, worker = {"cpu": 1.0}, {"cpu": 2.0, "gpu": 8.0}
    parts = (PartState("leader", 1, 1, placed[0], leader), PartState("workers", 4, 4, placed[1], worker))
    workload = Workload(
        "Workload/ns/lw", "Workload", "lw", 5, "annotation", parts=(("leader", 1), ("workers", 4))
    )
    gang = GangState(workload, 5, 5, sum(placed), parts=parts, part=asking)
    ask = Ask("team", leader if asking == "leader" else worker, gang=gang)
    assert ask.asked() == asked


async def test_reclaim_lists_each_part_with_its_own_level_inside_the_widest(racked: Extender) -> None:
    # Every GPU taken (a, b, c, d of RACKS with 0 free): a leader requiring a rack and 4 workers
    # requiring a host wait. Reclaim's waiting list carries each part's level (the leader's
    # racks, the workers' hosts) and the widest of them (racks) for both, so it frees GPUs for
    # the workers inside one host of one rack, not inside the level of whichever is listed first.
    leader = lw_member("leader", 0)
    leader["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = "rack"
    workers = [lw_member("workers", i) for i in range(4)]
    for pod in workers:
        pod["metadata"]["annotations"][TOPOLOGY_REQUIRED_ANNOTATION] = "host"
    racked.sync(
        [
            *(
                objects.node(name, labels={RACK: rack, "kubernetes.io/hostname": name})
                for name, rack in RACKS.items()
            ),
            objects.device_class(CLASS),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.queue("team"),
            leader,
            *workers,
        ]
    )
    listed = {p.key: (p.part, p.domains, p.outer) for p in racked.picture.waiting_pods()}
    hosts = {node: f"{rack}/{node}" for node, rack in RACKS.items()}
    assert listed == {
        "ns/leader-0": ("leader", RACKS, RACKS),
        **{f"ns/workers-{i}": ("workers", hosts, RACKS) for i in range(4)},
    }
