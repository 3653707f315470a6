"""`GET /status/queues`: the extender's view of its queues and their waiting pods, as JSON.

What `kubectl tessera` (`tessera.kubectl`) reads beside the API: the numbers the Queue status
rounds (shares, use and demand per resource, unrounded), and what no object holds - each queue's
pending pods in the scheduler's order (priority, then creation, then name: the order
kube-scheduler's queue and the planners take them in), with, per pod, the wait reason the
extender last reported (the text of its `QueueAdmitted` condition; "" before its first filter
call) and whether the planners would make room for it now (`planned`: admitted, nothing held for
it; `extender.policy.admission.waiting_list`). Read-only; served on the verb port and on the
metrics port, so a port-forward or the API server's service proxy reaches it.

Shape (amounts: GPUs, CPU cores, bytes; `version` changes when a field changes meaning):

    {"version": 1, "ready": true,
     "queues": {"team-a": {"parent": null, "priority": 0, "quota": {"gpu": 6.0}, "limit": {...},
                           "weight": {...}, "allocated": {...}, "requested": {...},
                           "fairShare": {...}, "pendingPods": 2}},
     "invalid": {"broken": "why it did not parse"},
     "waiting": {"team-a": [{"pod": "ns/name", "priority": 0, "created": 1764636000.0,
                             "gpu": 1.0, "planned": false, "code": "over_limit",
                             "reason": "queue 'team-a' ..."}]}}
"""

from __future__ import annotations

from typing import Any

from extender.picture.cluster import ClusterPicture
from extender.picture.demands import pod_created
from extender.status import WaitingPods

STATUS_PATH = "/status/queues"
STATUS_VERSION = 1


def queue_report(picture: ClusterPicture, waiting: WaitingPods | None) -> dict[str, Any]:
    """The report above; `waiting` None: no wait reasons (a process that answers no filter)."""
    if not picture.ready():
        return {"version": STATUS_VERSION, "ready": False, "queues": {}, "invalid": {}, "waiting": {}}
    view = picture.fairness()
    queues: dict[str, dict[str, Any]] = {}
    for spec in view.specs:
        usage = view.usage.get(spec.name)
        queues[spec.name] = {
            "parent": spec.parent,
            "priority": spec.priority,
            "quota": dict(spec.quota),
            "limit": dict(spec.limit),
            "weight": dict(spec.over_quota_weight),
            "allocated": dict(usage.allocated) if usage else {},
            "requested": dict(usage.requested) if usage else {},
            "fairShare": dict(view.fair_shares.get(spec.name, {})),
            "pendingPods": view.pending_pods.get(spec.name, 0),
        }
    planned = {pod.key for pod in picture.waiting_pods()}
    said = {**(waiting.unplaced if waiting else {}), **(waiting.waiting if waiting else {})}
    lines: dict[str, list[tuple[tuple[int, float, str], dict[str, Any]]]] = {}
    for key, pod in picture.kind("Pod").items():
        if not picture.is_pending(key, pod):
            continue
        demand = picture.demand(pod)
        if not (demand.labelled or demand.wants_gpu):
            continue  # not a pod of any queue
        entry = said.get(key)
        created = pod_created(pod)
        line = {
            "pod": key,
            "priority": demand.priority,
            "created": created,
            "gpu": picture.pod_resources(key, pod).get("gpu", 0.0),
            "planned": key in planned,
            "code": entry.code if entry else "",
            "reason": entry.reason if entry else "",
        }
        lines.setdefault(demand.queue, []).append(((-demand.priority, created, key), line))
    return {
        "version": STATUS_VERSION,
        "ready": True,
        "queues": queues,
        "invalid": dict(view.invalid),
        "waiting": {queue: [line for _, line in sorted(found)] for queue, found in sorted(lines.items())},
    }
