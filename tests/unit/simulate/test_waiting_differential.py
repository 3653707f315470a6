"""The extender's picture and the simulator list the same waiting pods for the planners.

One state, built twice: in the simulator's replay (pods waiting, running on chosen GPUs, a hold)
and as the Kubernetes objects a cluster would hold for it (``tessera.simulate.kube``: Nodes, the
driver's ResourceSlices, bound pods with their allocated claims, indexed Jobs for gangs) fed to the
extender's `ClusterPicture`. Both ask the one admission rule (`extender.policy.admission`), so the
waiting lists - which pods, in which order, which served whole with their gang - must be equal.

Two nodes of 4 H100. Queue a: quota 4, limit 6, holds 4 (preemptible). Queue b: quota 2, holds 2
with a non-preemptible pod (priority 1000). Queue c: quota 2, holds 2 with preemptible pods.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from contract.names import DRIVER_NAME, GPU_MILLI, QUEUE_LABEL
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.reclaim import PendingPod
from tessera.simulate.kube import CLAIM, GPU_MEMORY_MIB, claim_template, node_object, node_slices, pod_object
from tessera.simulate.queues import _Hold, _Replay, parse_workload
from tests import extender_objects as objects
from tests.unit.extender.test_gangs import job as indexed_job

REPO = Path(__file__).resolve().parents[3]
EPOCH = 1_800_000_000.0  # the picture's creation times: this plus the simulated arrival
HOLD_S = 90.0


def _job(name: str, queue: str, count: int, gpus: int = 1, **fields: Any) -> dict[str, Any]:
    return {"name": name, "queue": queue, "count": count, "duration": 3600, "gpus": gpus, **fields}


WORKLOAD = parse_workload(
    {
        "name": "differential",
        "nodes": [{"name": "n", "count": 2, "model": "H100", "gpus": 4, "cpu": 64, "memory": "512Gi"}],
        "queues": [
            {"name": "a", "spec": {"resources": {"gpu": {"quota": 4, "limit": 6}}}},
            {"name": "b", "spec": {"resources": {"gpu": {"quota": 2}}}},
            {"name": "c", "spec": {"resources": {"gpu": {"quota": 2}}}},
        ],
        # Arrival order = creation order (1 s apart): the scheduler's order after priority.
        "jobs": [
            _job("a-run", "a", 4, interval=1),
            _job("b-run", "b", 1, gpus=2, arrival=4, priority=1000),
            _job("c-run", "c", 2, arrival=5, interval=1),
            # a holds 4 (limit 6): each of these alone 4 + 1 <= 6; 4 + 2 <= 6; 4 + 3 > 6.
            _job("a-one", "a", 3, arrival=10, interval=1),
            _job("a-two", "a", 1, gpus=2, arrival=13),
            _job("a-three", "a", 1, gpus=3, arrival=14),
            _job("a-quarter", "a", 1, gpuMilli=250, arrival=15),
            # Not preemptible: b's non-preemptible use 2 + 1 > quota 2, refused; c's 0 + 1 <= 2
            # (its 2 GPUs are held by preemptible pods), admitted.
            _job("b-urgent", "b", 1, arrival=16, priority=1000),
            _job("c-urgent", "c", 1, arrival=17, priority=1000),
            # Gangs of minimum 3: c's 3 present, 3 missing together, admitted whole; a's 4 + 3 > 6,
            # refused whole; b's has 2 of its 3 pods (the third comes later): incomplete.
            _job("c-gang", "c", 3, arrival=18, interval=1, minMembers=3),
            _job("a-gang", "a", 3, arrival=21, interval=1, minMembers=3),
            _job("b-gang", "b", 3, arrival=24, interval=1, minMembers=3),
            # GPUs are held for it already (a plan freed them): not listed again.
            _job("b-held", "b", 1, arrival=27),
        ],
    }
)
RUNNING = {"a-run": ((0, 0), (0, 1), (0, 2), (0, 3)), "b-run": ((1, 0, 1),), "c-run": ((1, 2), (1, 3))}
ABSENT = {("b-gang", 2)}  # (job, index in the job): not created yet
HELD = {"b-held"}
HELD_GPUS = ((0, GPU_MILLI),)  # the device the hold names: GPU 0 of node 1, whole


def _replay() -> _Replay:
    """The state in the simulator: pods placed where RUNNING says, the rest waiting."""
    replay = _Replay(WORKLOAD, "tessera", 0, 0.0, 0.0)
    seen: dict[str, int] = {}
    for pod in replay.pods:
        number = seen[pod.job] = seen.get(pod.job, -1) + 1
        if (pod.job, number) in ABSENT:
            continue
        replay._wait(pod, pod.created)
        if pod.job in RUNNING:
            node, *gpus = RUNNING[pod.job][number]
            replay.cluster.place(node, pod.demand, gpus)
            replay._start(pod, pod.created, (node, tuple(gpus)))
        if pod.job in HELD:
            replay.holds[pod.index] = _Hold(1, HELD_GPUS, HOLD_S)
    return replay


def _names(replay: _Replay) -> dict[str, str]:
    """Simulator pod key -> the pod's name in the picture: <job>-<index in the job>."""
    names: dict[str, str] = {}
    seen: dict[str, int] = {}
    for pod in replay.pods:
        seen[pod.job] = seen.get(pod.job, -1) + 1
        names[pod.key] = f"{pod.job}-{seen[pod.job]}"
    return names


def _claim(name: str, template: dict[str, Any], node: str, gpus: list[int], milli: int) -> dict[str, Any]:
    """What the DRA allocator writes for a bound pod: the devices and the memory each consumes."""
    consumed = f"{milli * GPU_MEMORY_MIB // GPU_MILLI}Mi"
    results = [
        {
            "request": CLAIM,
            "driver": DRIVER_NAME,
            "pool": node,
            "device": f"gpu-{gpu}",
            "consumedCapacity": {"memory": consumed},
        }
        for gpu in gpus
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{name}-{CLAIM}", "namespace": "ns"},
        "spec": template["spec"]["spec"],
        "status": {"allocation": {"devices": {"results": results}}},
    }


def _picture(replay: _Replay) -> ClusterPicture:
    """The same state as Kubernetes objects in the extender's picture."""
    found: list[dict[str, Any]] = [
        *yaml.safe_load_all((REPO / "manifests" / "deviceclasses.yaml").read_text())
    ]
    for node in WORKLOAD.nodes:
        found += [node_object(node), *node_slices(node)]
    for spec in WORKLOAD.queues:
        limit = {"limit": spec.limit["gpu"]} if "gpu" in spec.limit else {}
        found.append(objects.queue(spec.name, resources={"gpu": {"quota": spec.quota["gpu"], **limit}}))
    found += [indexed_job(job.name, job.min_members) for job in WORKLOAD.jobs if job.min_members > 1]
    names = _names(replay)
    for pod in replay.pods:
        if pod.index not in replay.waiting and pod.index not in replay.running:
            continue  # not created yet
        name = names[pod.key]
        template = claim_template("ns", pod.demand)
        obj = pod_object("ns", name, pod.demand, "tessera")
        created = datetime.fromtimestamp(EPOCH + pod.created, UTC).isoformat().replace("+00:00", "Z")
        obj["metadata"].update(uid=f"uid-{name}", labels={QUEUE_LABEL: pod.queue}, creationTimestamp=created)
        obj["spec"]["priority"] = pod.priority
        obj["status"] = {"phase": "Pending"}
        if pod.gang:
            obj["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": pod.job,
                    "uid": f"uid-{pod.job}",
                    "controller": True,
                }
            ]
            obj["metadata"]["annotations"] = {
                "batch.kubernetes.io/job-completion-index": name.rsplit("-", 1)[1]
            }
        if pod.index in replay.running:
            node_name = WORKLOAD.nodes[pod.node].name
            obj["spec"]["nodeName"] = node_name
            obj["status"] = {
                "phase": "Running",
                "resourceClaimStatuses": [{"name": CLAIM, "resourceClaimName": f"{name}-{CLAIM}"}],
            }
            found.append(_claim(name, template, node_name, list(pod.gpus), pod.demand.milli))
        found += [template, obj]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [obj for obj in found if obj.get("kind") == kind])
    for pod in replay.pods:
        if pod.index in replay.holds:
            hold = replay.holds[pod.index]
            held_on = WORKLOAD.nodes[hold.node].name
            picture.hold(f"ns/{names[pod.key]}", held_on, pod.demand, HOLD_S, gpus=hold.gpus)
    return picture


def _listed(pending: list[PendingPod], name_of: dict[str, str]) -> list[tuple[str, str, bool]]:
    """(pod name, queue, served whole with its gang) of each listed pod, in order."""
    return [(name_of.get(p.key, p.key.removeprefix("ns/")), p.queue, bool(p.workload)) for p in pending]


def test_the_picture_and_the_simulator_list_the_same_waiting_pods() -> None:
    replay = _replay()
    simulated = _listed(replay._pending(replay._fairness()), _names(replay))
    live = _listed(_picture(replay).waiting_pods(), {})
    assert live == simulated
    # Priority first (c-urgent, 1000), then creation order; what the module docstring works out.
    assert simulated == [
        ("c-urgent-0", "c", False),
        ("a-one-0", "a", False),
        ("a-one-1", "a", False),
        ("a-one-2", "a", False),
        ("a-two-0", "a", False),
        ("a-quarter-0", "a", False),
        ("c-gang-0", "c", True),
        ("c-gang-1", "c", True),
        ("c-gang-2", "c", True),
    ]
