"""`kubectl tessera`'s answers as worked examples: plain API JSON (and the extender's report) in,
the lines it prints out."""

from __future__ import annotations

from typing import Any

from extender.policy.waiting import wait_message
from extender.status import ADMITTED_CONDITION
from tessera.kubectl import gpu_lines, parse_args, position_lines, queue_lines, why_lines
from tests import extender_objects as objects

JsonObject = dict[str, Any]


def with_status(queue: JsonObject, **status: Any) -> JsonObject:
    return {**queue, "status": status}


def test_queues_show_the_tree_with_borrowing_and_waiting() -> None:
    queues = [
        # team-a holds 14 with quota 6: borrows 14 - 6 = 8; two workloads wait.
        with_status(
            objects.queue("team-a", parent="org", resources={"gpu": {"quota": 6, "limit": 14}}),
            allocated={"gpu": "14"},
            fairShare={"gpu": "14"},
            requested={"gpu": "2"},
            waitingWorkloads=2,
        ),
        # team-b holds 2 of quota 6: borrows nothing (max(0, 2 - 6)).
        with_status(
            objects.queue("team-b", parent="org", resources={"gpu": {"quota": 6, "overQuotaWeight": 2}}),
            allocated={"gpu": "2"},
            fairShare={"gpu": "6"},
            waitingWorkloads=0,
        ),
        # org sets no GPU quota: all 16 it holds are borrowed (as its Borrowing condition says).
        with_status(objects.queue("org"), allocated={"gpu": "16"}, fairShare={"gpu": "16"}),
    ]
    report = {"waiting": {"team-a": [{"pod": "ml/a-14"}, {"pod": "ml/a-15"}]}}
    assert queue_lines(queues, report) == [
        "QUEUE     PRIO  QUOTA  LIMIT  WEIGHT  ALLOC  FAIR  BORROWED  PENDING  WAITING  PODS",
        "org          0      -      -       1     16    16        16        -        -     0",
        "  team-a     0      6     14       1     14    14         8        2        2     2",
        "  team-b     0      6      -       2      2     6         0        -        0     0",
    ]
    # Without the extender's report the pods column is unknown, not 0.
    assert queue_lines(queues[2:], None)[1].endswith("?")


def test_a_queue_whose_parent_is_missing_is_shown_as_a_root() -> None:
    lines = queue_lines([objects.queue("orphan", parent="gone")], None)
    assert lines[1].startswith("orphan ")


def condition(status: str, reason: str, message: str) -> JsonObject:
    return {"type": ADMITTED_CONDITION, "status": status, "reason": reason, "message": message}


def test_why_splits_the_written_reason_into_the_numbers_and_what_lets_it_run() -> None:
    numbers = "queue 'team-a': 14 allocated + 1 asked > limit (14)"
    pod = objects.pod("ml", "a-15", queue="team-a", template="one")
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-1", "controller": True}
    ]
    pod["status"]["conditions"] = [
        condition("False", "QueueAtLimit", wait_message("over_limit", numbers)),
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes"},
    ]
    sibling = objects.pod("ml", "a-0", queue="team-a", node_name="gpu-node-0")
    sibling["metadata"]["ownerReferences"] = pod["metadata"]["ownerReferences"]
    queue = with_status(
        objects.queue("team-a", resources={"gpu": {"quota": 6, "limit": 14}}),
        allocated={"gpu": "14"},
        fairShare={"gpu": "14"},
        requested={"gpu": "1"},
    )
    events = [{"type": "Normal", "reason": "QueueAtLimit", "message": numbers}]
    # In line: second of two pending pods of team-a.
    report = {
        "waiting": {"team-a": [{"pod": "ml/a-14", "planned": False}, {"pod": "ml/a-15", "planned": False}]}
    }
    assert why_lines(pod, queue, [pod, sibling], events, report) == [
        "pod ml/a-15: Pending, not bound",
        "queue team-a (GPUs): allocated 14, fair share 14, quota 6, limit 14, pending 1",
        f"admission: waiting (QueueAtLimit): {numbers}",
        "  would let it run: waits for the queue's running pods to finish, or for its limit to be raised",
        "workload: Job train: 2 pods, 1 bound",
        "scheduler: Unschedulable: 0/2 nodes",
        "place in line: 2 of 2 pending in queue team-a (no room planned for it yet)",
        "events (newest last):",
        f"  Normal QueueAtLimit: {numbers}",
    ]


def test_why_an_admitted_pod_and_a_pod_of_no_queue() -> None:
    admitted = objects.pod("ml", "p", queue="team-a", node_name="gpu-node-1")
    admitted["status"] = {"phase": "Running", "conditions": [condition("True", "Admitted", "within quota")]}
    assert why_lines(admitted, None, [admitted], [], None) == [
        "pod ml/p: Running on gpu-node-1",
        "queue team-a: no such Queue",
        "admission: admitted (Admitted): within quota",
        "workload: the pod alone (no controller)",
    ]
    bare = objects.pod("ml", "bare")
    assert why_lines(bare, None, [bare], [], None)[1:3] == [
        "queue: none named (no scheduling.tessera.dev/queue label; its Namespace's default, else 'default')",
        "admission: nothing written yet (the extender has not judged it, or it is not a queue's pod)",
    ]


def test_gpus_sum_each_gpus_fractions_and_name_their_pods() -> None:
    # gpu-node-0: two 80Gi GPUs. gpu-0 holds two 20Gi claims: 20/80 + 20/80 = 0.50;
    # gpu-1 one time-sliced claim (no consumedCapacity) shared by two notebooks: the whole GPU.
    slices = [objects.gpu_slice("gpu-node-0", 2, shareable=True)]
    claims = []
    for name, device, memory, pods in (
        ("inf-0", "gpu-0", "20Gi", ["inf-0"]),
        ("inf-1", "gpu-0", "20Gi", ["inf-1"]),
        ("notebooks", "gpu-1", None, ["nb-0", "nb-1"]),
    ):
        claim = objects.claim("team-c", name, {}, allocated=[("gpu-node-0", device, memory)])
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod} for pod in pods]
        claims.append(claim)
    # A claim of another driver is not counted.
    claims.append(
        objects.claim("x", "other", {}, allocated=[("gpu-node-0", "gpu-1", None)], driver="other.dev")
    )
    assert gpu_lines(slices, claims) == [
        "NODE        GPU    MODEL      MEMORY  USED  HELD BY (pods, fraction)",
        "gpu-node-0  gpu-0  H100-80GB    80Gi  0.50  team-c/inf-0 0.25, team-c/inf-1 0.25",
        "gpu-node-0  gpu-1  H100-80GB    80Gi  1.00  team-c/nb-0+team-c/nb-1 1.00",
    ]
    assert gpu_lines([], []) == ["no devices of driver gpu.tessera.dev in any ResourceSlice"]


def test_position_lists_the_line_up_to_the_pod() -> None:
    # Created 10:00:00 and 10:05:00 UTC (1764583200, 1764583500); urgent has priority 5.
    line = [
        {"pod": "ml/urgent", "priority": 5, "created": 1764583500.0, "gpu": 2.0, "planned": True, "code": ""},
        {
            "pod": "ml/early",
            "priority": 0,
            "created": 1764583200.0,
            "gpu": 1.0,
            "planned": False,
            "code": "over_limit",
        },
        {"pod": "ml/late", "priority": 0, "created": 1764583500.0, "gpu": 0.25, "planned": False, "code": ""},
    ]
    report = {"waiting": {"team-a": line}}
    assert position_lines(objects.pod("ml", "early"), report) == [
        "pod ml/early: 2 of 3 pending in queue team-a (order: priority, then creation)",
        "#    POD        PRIO   CREATED  GPU  PLANNED  WAITS FOR",
        "1    ml/urgent     5  10:05:00    2  yes      -",
        "2 *  ml/early      0  10:00:00    1  no       over_limit",
    ]
    assert position_lines(objects.pod("ml", "gone"), report) == [
        "pod ml/gone is not pending in any queue (bound, finished, or not a queue's pod)"
    ]


def test_options_may_follow_the_subcommand_as_with_kubectl() -> None:
    options, command, pod = parse_args(["why", "train-0", "-n", "ml", "--extender-url", "http://x:9090"])
    assert (command, pod, options.pod_namespace, options.extender_url) == (
        "why",
        "train-0",
        "ml",
        "http://x:9090",
    )
    options, command, _ = parse_args(["queues"])
    assert options.service == "tessera-extender-metrics:metrics" and options.namespace == "tessera-system"
