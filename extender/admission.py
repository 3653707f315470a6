"""Admission decisions, pure: a pod's queue, its scheduling gate and patch, and the checks of
Queues and GpuConfigs that the webhooks (`extender.webhook`) answer at the API. No I/O: the
webhook fetches what these read (owners, the Namespace, the other Queues) and passes plain data.

Queue defaults. A pod's queue is the first of:

1. its own label `scheduling.tessera.dev/queue`;
2. that label on its owners, walked up the controller `ownerReferences` (ReplicaSet, then its
   Deployment; Job, then its CronJob): the topmost owner that carries it wins, so the object a
   user writes (the Deployment, the CronJob) decides for everything it makes;
3. its Namespace's label `scheduling.tessera.dev/default-queue`;
4. `default`.

The mutating webhook writes the result on the pod as its label, so every later reader (the
extender's filter, the accounting, `kubectl get pods -L`) agrees without walking anything. A pod
created while the webhook was unreachable has no label: the picture then applies steps 3 and 4
itself (it watches Namespaces; it does not walk owners).

The gate. A pod whose queue refuses it for a reason that no new node would fix (a limit, a
quota for non-preemptible pods, an unknown or unusable queue) is created with the scheduling
gate `scheduling.tessera.dev/admission`: kube-scheduler skips it, so it never turns
Unschedulable and cluster autoscalers (cluster-autoscaler, Karpenter) never add nodes for it.
`gate_reason` decides, both at creation and when the gate controller asks whether to lift it,
with the admission rule the filter uses (`extender.policy.admission.admit`); the ask's `ahead` is
what the queue's pods already in the scheduler's hands ask for, which is admitted before this
pod: limit 4 GPUs, 2 held, 2 waiting ungated, a new pod of 1 is gated (2 + 2 + 1 > 4).

A pod of a gang not admitted yet (`extender.policy.admission.GangState`) is judged with its gang:
it is gated while the gang has fewer pods than its minimum (gated pods count as present; at
creation the pod itself too), and then until its queue takes the gang's whole missing demand
(minimum - placed members, each asking what this pod asks), with `ahead` not counting the gang's
own ungated pods (they are in that demand). Limit 4 GPUs, nothing held, a gang of minimum 4
one-GPU pods: gated with 1, 2 and 3 pods present; with 4 the demand is 4 x 1 = 4 <= 4 and all
four go; at limit 2 they stay gated (4 > 2) until the limit is raised.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from contract.gpuconfig import ClaimConfigError, parse_gpu_config
from contract.kube import mapping, meta, sequence
from contract.names import ADMISSION_GATE, DEFAULT_QUEUE, NAMESPACE_QUEUE_LABEL, QUEUE_LABEL
from extender.policy.admission import Ask, admit
from extender.policy.fairness import FairnessSnapshot, QueueSpec
from extender.queues import QueueSpecError, parse_queue, validate_hierarchy

Source = Literal["pod", "owner", "namespace", "default"]


@dataclass(frozen=True)
class QueueChoice:
    queue: str
    source: Source  # where the queue came from (a "default" pod names no queue anywhere)


def resolve_queue(
    pod_labels: Mapping[str, Any],
    owner_labels: Sequence[Mapping[str, Any]] = (),
    namespace_labels: Mapping[str, Any] | None = None,
) -> QueueChoice:
    """The pod's queue; `owner_labels` are its controllers' labels, its own owner first."""
    if pod_labels.get(QUEUE_LABEL):
        return QueueChoice(str(pod_labels[QUEUE_LABEL]), "pod")
    for labels in reversed(owner_labels):
        if labels.get(QUEUE_LABEL):
            return QueueChoice(str(labels[QUEUE_LABEL]), "owner")
    namespace_default = (namespace_labels or {}).get(NAMESPACE_QUEUE_LABEL)
    if namespace_default:
        return QueueChoice(str(namespace_default), "namespace")
    return QueueChoice(DEFAULT_QUEUE, "default")


def gate_reason(view: FairnessSnapshot, ask: Ask) -> str:
    """Why the pod must wait outside the scheduler ('' when it may be scheduled now): the admission
    rule's refusal (`extender.policy.admission.admit`), so the gate holds back exactly what the
    filter would refuse. `ask.ahead`: its queue's pods the scheduler already has (for a gang: not
    its own)."""
    decision = admit(view, ask)
    return "" if decision.admit else decision.reason


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(
        mapping(g).get("name") == ADMISSION_GATE
        for g in sequence(mapping(pod.get("spec")).get("schedulingGates"))
    )


def _escape(key: str) -> str:
    """A JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def pod_patch(
    pod: Mapping[str, Any], queue: str | None, scheduler: str | None, gate: bool
) -> list[dict[str, Any]]:
    """JSON Patch operations that set the queue label (None: leave it), the scheduler name
    (None: leave it) and add the admission gate (when `gate` and not there already)."""
    ops: list[dict[str, Any]] = []
    labels = meta(pod).get("labels")
    if queue is not None and mapping(labels).get(QUEUE_LABEL) != queue:
        if isinstance(labels, Mapping):
            ops.append({"op": "add", "path": f"/metadata/labels/{_escape(QUEUE_LABEL)}", "value": queue})
        else:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {QUEUE_LABEL: queue}})
    spec = mapping(pod.get("spec"))
    if scheduler is not None and spec.get("schedulerName") != scheduler:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler})
    if gate and not is_gated(pod):
        if isinstance(spec.get("schedulingGates"), list):
            ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}})
        else:
            ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]})
    return ops


def gate_removal(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON Patch that lifts the admission gate; its `test` fails if the gates moved meanwhile."""
    gates = sequence(mapping(pod.get("spec")).get("schedulingGates"))
    for index, entry in enumerate(gates):
        if mapping(entry).get("name") == ADMISSION_GATE:
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": f"{path}/name", "value": ADMISSION_GATE},
                {"op": "remove", "path": path},
            ]
    return []


def queue_problems(queue: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why a Queue being created or updated must be refused ([]: admit it).

    `others`: the Queues already stored (with the old version of this one, on an update). Refused:
    a spec that does not parse (a limit below its quota, unknown resources, its own parent), and a
    hierarchy problem the write brings: of this queue (unknown parent, a cycle, children's quotas
    above its own) unless it had the very same one before, or of another queue that had none
    before (a cycle closed through it, its children's quotas pushed above its quota). Problems
    that were there already stay reported in the Queues' status, not refused here: a write need
    not fix what it did not break (a label on a queue whose parent was deleted is still allowed).
    """
    try:
        spec = parse_queue(queue)
    except QueueSpecError as exc:
        return [str(exc)]
    existing: list[QueueSpec] = []
    previous: list[QueueSpec] = []
    for other in others:
        try:
            parsed = parse_queue(other)
        except QueueSpecError:
            continue  # an invalid stored queue takes no part in the hierarchy
        (previous if parsed.name == spec.name else existing).append(parsed)
    before = validate_hierarchy([*existing, *previous[:1]])
    after = validate_hierarchy([*existing, spec])
    found = [
        f"queue '{spec.name}': {problem}"
        for problem in after[spec.name]
        if problem not in before.get(spec.name, [])
    ]
    for name, problems in after.items():
        if name != spec.name and problems and not before.get(name):
            found.extend(f"queue '{name}' (because of this change): {problem}" for problem in problems)
    return found


def claim_config_problems(obj: Mapping[str, Any], drivers: Collection[str]) -> list[str]:
    """Invalid GpuConfigs in a ResourceClaim or ResourceClaimTemplate, each naming its field.

    Only opaque configs addressed to one of `drivers` are read; other drivers' are theirs.
    """
    spec = mapping(obj.get("spec"))
    root = "spec.devices.config"
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = mapping(spec.get("spec"))
        root = "spec.spec.devices.config"
    problems: list[str] = []
    for index, config in enumerate(sequence(mapping(spec.get("devices")).get("config"))):
        opaque = mapping(mapping(config).get("opaque"))
        driver = opaque.get("driver")
        if not isinstance(driver, str) or driver not in drivers:
            continue
        try:
            parse_gpu_config(opaque.get("parameters"), f"{root}[{index}].opaque.parameters")
        except ClaimConfigError as exc:
            problems.append(str(exc))
    return problems
