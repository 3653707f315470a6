"""The workload map: which workload a pod belongs to, and that workload's minimum member count.

A workload is the group of pods admitted, placed and reclaimed together. Its **minimum** is how
many members must run for any of them to be useful (a gang); members beyond it are elastic. One
table, first matching row wins, read from the pod (labels, annotations, owner references,
`spec.schedulingGroup`) and, where the caller has them, from its owners' objects:

Rows (the pod → its workload key → the minimum):

- **podgroup**: `spec.schedulingGroup.podGroupName` (KEP-4671) → `PodGroup/ns/name` → the
  PodGroup's gang `minCount` (basic policy: 1); the object unknown: members.
- **label**: label `scheduling.tessera.dev/workload` → `Workload/ns/<value>` → members.
- **lws**: labels `leaderworkerset.sigs.k8s.io/name` and `.../group-index` →
  `LeaderWorkerSet/ns/<name>-<index>` → annotation `leaderworkerset.sigs.k8s.io/size` (leader
  and workers), else members.
- **jobset**: label `jobset.sigs.k8s.io/jobset-name` (JobSet pods, and TrainJob pods, which run
  in a JobSet of the TrainJob's name) → `JobSet/ns/name` → the JobSet's replicated jobs'
  replicas x parallelism; the JobSet unknown: its Jobs' parallelism; none known: members.
- **indexed job**: controller a batch Job, annotation `batch.kubernetes.io/job-completion-index`
  → `Job/ns/name` → the Job's min(parallelism, completions); the Job unknown: members.
- **kubeflow**: controller a `kubeflow.org` PyTorchJob, TFJob, MPIJob, XGBoostJob, JAXJob or
  PaddleJob → `Kind/ns/name` → `runPolicy.schedulingPolicy.minAvailable`, else the sum of the
  replica specs' replicas; the object unknown: members.
- **ray**: controller a `ray.io` RayCluster (RayJob and RayService make one) →
  `RayCluster/ns/name` → 1 head + each worker group's minReplicas x numOfHosts; unknown: members.
- **pod**: anything else - a non-indexed Job's pods, ReplicaSet/Deployment, StatefulSet, bare
  pods → `Pod/ns/name` → 1.

The annotation `scheduling.tessera.dev/min-members: N` on the pod (its template) overrides the
minimum of any row; on a pod of the last row it groups the pods of its controller
(`ReplicaSet/ns/name`, `StatefulSet/ns/name`, `Job/ns/name`) into one workload of minimum N.

**Subgroups** (parts): a workload may consist of parts, each with its own minimum (a leader and
its workers, a JobSet's replicated jobs). A pod's part (`part_of`) is its label
`scheduling.tessera.dev/subgroup`, else its LeaderWorkerSet role (`worker-index` 0: `leader`,
others `workers`), else its JobSet replicated job (`jobset.sigs.k8s.io/replicatedjob-name`). The
parts' minimums come from the pod annotation `scheduling.tessera.dev/subgroup-min-members:
"leader=1,workers=4"` (`parse_parts`; it overrides any row, and groups like `min-members`), else
from a LeaderWorkerSet's size (leader 1, workers size - 1), else from the JobSet's replicated jobs
(replicas x parallelism each). A workload with parts has the sum of their minimums as its
minimum; admission counts each part on its own (`extender.policy.admission.GangState`).

"members" means the members that exist now: for an owner whose spec the caller does not have (a
custom resource the extender does not watch), the pods its controller created. Those controllers
create all their pods in one reconcile, so the count is complete moments after the first pod;
where that matters, the annotation states it exactly.

Why these minimums: a non-indexed Job is a pool of independent work items (completions beyond
parallelism; any pod is useful alone); an indexed Job is how distributed training runs on plain
Jobs (one rank per index), so its parallel pods are a gang. Ray's autoscaled workers above
minReplicas and StatefulSet/Deployment replicas are elastic by nature. A StatefulSet with the
default `OrderedReady` policy creates pod n+1 only when pod n is ready, so it must never be a gang
unless the user says so (and uses `podManagementPolicy: Parallel`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.kube import controller_of, mapping, meta, sequence
from contract.names import (
    MIN_MEMBERS_ANNOTATION,
    SUBGROUP_LABEL,
    SUBGROUP_MINIMUMS_ANNOTATION,
    WORKLOAD_LABEL,
)
from extender.policy.placement import NO_DOMAINS, DomainMap, GpuDemand, NodeGpus, WorkloadMix, domain_shape
from extender.policy.snapshot import occupy

JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# API versions of owners a pod does not name with its own ownerReferences.
PODGROUP_API_VERSION = "scheduling.k8s.io/v1beta1"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_LEADER, LWS_WORKERS = "leader", "workers"  # the parts of a LeaderWorkerSet group
KUBEFLOW_KINDS = frozenset({"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "JAXJob", "PaddleJob"})
# Owners the annotation groups pods by when no row of their own does.
GROUPING_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})

# (kind, "namespace/name") -> the object, when the caller has it (None: unknown).
Lookup = Callable[[str, str], Mapping[str, Any] | None]
_MIX = WorkloadMix(demands=())  # placement without a target mix: plain binpack
# (owner kind, "namespace/name") -> objects it controls that the caller has (e.g. a JobSet's Jobs).
Owned = Callable[[str, str], Sequence[Mapping[str, Any]]]


def _nothing(kind: str, key: str) -> Mapping[str, Any] | None:
    return None


def _none_owned(kind: str, key: str) -> Sequence[Mapping[str, Any]]:
    return ()


_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")
# A workload's parts and their minimums, in the order stated: ((part, minimum), ...).
Parts = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Workload:
    """A pod's workload. `minimum` None: the members that exist (the owner's spec is unknown);
    with `parts`, the sum of theirs."""

    key: str  # Kind/namespace/name: unique in the cluster
    kind: str
    name: str
    minimum: int | None
    rule: str  # the row that decided (docs, events, tests)
    # The object whose spec states the minimum, in the pod's namespace: (apiVersion, kind, name).
    spec: tuple[str, str, str] | None = None
    parts: Parts = ()  # its subgroups, each with its minimum (): one group, one minimum

    @property
    def single(self) -> bool:
        """A workload of one pod: admitted and placed as today, pod by pod."""
        return self.kind == "Pod"


def _count(value: object) -> int | None:
    """A member count from JSON: a positive integer (or its string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 1 else None
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
        return number if number >= 1 else None
    return None


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def job_minimum(job: Mapping[str, Any]) -> int:
    """An indexed Job's gang: all the pods that run in parallel (never more than there are indexes)."""
    spec = mapping(job.get("spec"))
    parallelism = _int(spec.get("parallelism"), 1)
    completions = spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        parallelism = min(parallelism, completions)
    return max(parallelism, 1)


def jobset_minimum(jobset: Mapping[str, Any]) -> int:
    total = 0
    for replicated in sequence(mapping(jobset.get("spec")).get("replicatedJobs")):
        replicated = mapping(replicated)
        job_spec = mapping(mapping(replicated.get("template")).get("spec"))
        total += _int(replicated.get("replicas"), 1) * job_minimum({"spec": job_spec})
    return max(total, 1)


def kubeflow_minimum(job: Mapping[str, Any]) -> int:
    spec = mapping(job.get("spec"))
    stated = _count(mapping(mapping(spec.get("runPolicy")).get("schedulingPolicy")).get("minAvailable"))
    if stated is not None:
        return stated
    total = 0
    for field, replica_specs in spec.items():
        if field.endswith("ReplicaSpecs"):
            total += sum(_int(mapping(r).get("replicas"), 1) for r in mapping(replica_specs).values())
    return max(total, 1)


def ray_minimum(cluster: Mapping[str, Any]) -> int:
    spec = mapping(cluster.get("spec"))
    workers = sum(
        _int(mapping(g).get("minReplicas"), 0) * max(_int(mapping(g).get("numOfHosts"), 1), 1)
        for g in sequence(spec.get("workerGroupSpecs"))
    )
    return 1 + workers


def parse_parts(text: str) -> Parts:
    """The parts of `scheduling.tessera.dev/subgroup-min-members`: `part=N,...`, each part named
    once (a label value: letters, digits, `-`, `_`, `.`), each N a positive integer. Raises
    ValueError saying what is wrong ("leader=0": "minimum of part 'leader' must be a positive
    integer, not '0'")."""
    parts: list[tuple[str, int]] = []
    for entry in (part.strip() for part in text.split(",")):
        name, sep, value = (piece.strip() for piece in entry.partition("="))
        if not sep or not name:
            raise ValueError(f"{entry!r} is not part=minimum")
        if not _LABEL_VALUE.fullmatch(name):
            raise ValueError(f"part name {name!r} is not a label value")
        if any(name == known for known, _ in parts):
            raise ValueError(f"part {name!r} is named twice")
        minimum = _count(value)
        if minimum is None:
            raise ValueError(f"minimum of part {name!r} must be a positive integer, not {value!r}")
        parts.append((name, minimum))
    return tuple(parts)


def stated_parts(pod: Mapping[str, Any]) -> Parts:
    """The parts the pod's annotation states (() without one, or when it does not parse: the
    webhook refuses such pods, one that slipped past is one group)."""
    text = mapping(meta(pod).get("annotations")).get(SUBGROUP_MINIMUMS_ANNOTATION)
    if not isinstance(text, str):
        return ()
    try:
        return parse_parts(text)
    except ValueError:
        return ()


def subgroup_refusal(pod: Mapping[str, Any]) -> str:
    """Why the pod's subgroup annotations cannot be served ('' when they can, or it states none):
    parts that do not parse, a pod of no stated part, a part label without minimums, or a
    `min-members` that disagrees with the parts' sum. The pod webhook refuses such pods."""
    annotations = mapping(meta(pod).get("annotations"))
    labels = mapping(meta(pod).get("labels"))
    text = annotations.get(SUBGROUP_MINIMUMS_ANNOTATION)
    if text is None:
        named = labels.get(SUBGROUP_LABEL)
        if named is None:
            return ""
        return (
            f"label {SUBGROUP_LABEL}={named} names a part, but annotation {SUBGROUP_MINIMUMS_ANNOTATION} "
            "does not state the parts' minimums (e.g. leader=1,workers=4)"
        )
    try:
        parts = parse_parts(str(text))
    except ValueError as exc:
        return f"annotation {SUBGROUP_MINIMUMS_ANNOTATION}={text!r}: {exc}"
    names = ", ".join(name for name, _ in parts)
    part = part_of(pod)
    if not part:
        return (
            f"annotation {SUBGROUP_MINIMUMS_ANNOTATION} states parts ({names}); "
            f"label {SUBGROUP_LABEL} must name the pod's"
        )
    if part not in dict(parts):
        return (
            f"the pod's part {part!r} is not one of the parts {SUBGROUP_MINIMUMS_ANNOTATION} states: {names}"
        )
    stated = annotations.get(MIN_MEMBERS_ANNOTATION)
    total = sum(minimum for _, minimum in parts)
    if stated is not None and _count(stated) != total:
        return (
            f"annotation {MIN_MEMBERS_ANNOTATION}={stated} disagrees with the parts' minimums "
            f"({text}: {total} in all); leave it out"
        )
    return ""


def part_of(pod: Mapping[str, Any]) -> str:
    """The part of its workload the pod belongs to ("": none): the subgroup label, else its
    LeaderWorkerSet role, else its JobSet replicated job."""
    labels = mapping(meta(pod).get("labels"))
    named = labels.get(SUBGROUP_LABEL)
    if isinstance(named, str) and named:
        return named
    index = labels.get(LWS_WORKER_INDEX_LABEL)
    if isinstance(index, str) and isinstance(labels.get(LWS_NAME_LABEL), str):
        return LWS_LEADER if index == "0" else LWS_WORKERS
    replicated = labels.get(JOBSET_REPLICATED_JOB_LABEL)
    return replicated if isinstance(replicated, str) else ""


def jobset_parts(jobset: Mapping[str, Any]) -> Parts:
    """A JobSet's replicated jobs as parts: replicas x each Job's parallel pods."""
    parts: list[tuple[str, int]] = []
    for replicated in sequence(mapping(jobset.get("spec")).get("replicatedJobs")):
        replicated = mapping(replicated)
        name = replicated.get("name")
        job_spec = mapping(mapping(replicated.get("template")).get("spec"))
        if isinstance(name, str) and name:
            parts.append((name, _int(replicated.get("replicas"), 1) * job_minimum({"spec": job_spec})))
    return tuple(parts)


def _owned_parts(jobs: Sequence[Mapping[str, Any]]) -> Parts:
    """A JobSet's parts from its Jobs, by their replicated-job label (in the order first seen)."""
    minimums: dict[str, int] = {}
    for job in jobs:
        name = mapping(meta(job).get("labels")).get(JOBSET_REPLICATED_JOB_LABEL)
        if isinstance(name, str) and name:
            minimums[name] = minimums.get(name, 0) + job_minimum(job)
    return tuple(minimums.items())


def lws_parts(size: int | None) -> Parts:
    """A LeaderWorkerSet group of `size` pods: one leader and size - 1 workers."""
    if size is None or size < 2:
        return ()
    return ((LWS_LEADER, 1), (LWS_WORKERS, size - 1))


def podgroup_minimum(group: Mapping[str, Any]) -> int:
    policy = mapping(mapping(group.get("spec")).get("schedulingPolicy"))
    return _count(mapping(policy.get("gang")).get("minCount")) or 1


def workload_of(pod: Mapping[str, Any], lookup: Lookup = _nothing, owned: Owned = _none_owned) -> Workload:
    """The pod's workload by the table above (the annotations' overrides applied: the parts',
    else the minimum's)."""
    found = _by_table(pod, lookup, owned)
    parts = stated_parts(pod)
    stated = mapping(meta(pod).get("annotations")).get(MIN_MEMBERS_ANNOTATION)
    minimum = sum(m for _, m in parts) if parts else _count(stated)
    if minimum is None:
        return found
    if found.single:
        owner = controller_of(pod)
        kind, name = str(owner.get("kind") or ""), str(owner.get("name") or "")
        if kind not in GROUPING_OWNERS or not name:
            return found  # a pod alone: a minimum above 1 could never be met
        namespace = str(meta(pod).get("namespace") or "")
        return Workload(f"{kind}/{namespace}/{name}", kind, name, minimum, "annotation", parts=parts)
    return Workload(found.key, found.kind, found.name, minimum, "annotation", found.spec, parts)


def _by_table(pod: Mapping[str, Any], lookup: Lookup, owned: Owned) -> Workload:
    metadata = meta(pod)
    namespace = str(metadata.get("namespace") or "")
    labels = mapping(metadata.get("labels"))
    annotations = mapping(metadata.get("annotations"))

    def workload(
        kind: str,
        name: str,
        minimum: int | None,
        rule: str,
        api_version: str = "",
        parts: Parts = (),
    ) -> Workload:
        spec = (api_version, kind, name) if api_version else None
        # (Parts that do not add up to the minimum - Jobs without the label - are not kept.)
        kept = parts if sum(m for _, m in parts) == minimum else ()
        return Workload(f"{kind}/{namespace}/{name}", kind, name, minimum, rule, spec, kept)

    group = mapping(mapping(pod.get("spec")).get("schedulingGroup")).get("podGroupName")
    if isinstance(group, str) and group:
        obj = lookup("PodGroup", f"{namespace}/{group}")
        minimum = podgroup_minimum(obj) if obj else None
        return workload("PodGroup", group, minimum, "podgroup", PODGROUP_API_VERSION)
    named = labels.get(WORKLOAD_LABEL)
    if isinstance(named, str) and named:
        return workload("Workload", named, None, "label")
    lws, index = labels.get(LWS_NAME_LABEL), labels.get(LWS_GROUP_LABEL)
    if isinstance(lws, str) and lws and isinstance(index, str):
        size = _count(annotations.get(LWS_SIZE_ANNOTATION))
        return workload("LeaderWorkerSet", f"{lws}-{index}", size, "lws", parts=lws_parts(size))
    jobset = labels.get(JOBSET_LABEL)
    if isinstance(jobset, str) and jobset:
        key = f"{namespace}/{jobset}"
        obj = lookup("JobSet", key)
        if obj is not None:
            minimum = jobset_minimum(obj)
            return workload("JobSet", jobset, minimum, "jobset", JOBSET_API_VERSION, jobset_parts(obj))
        jobs = owned("JobSet", key)
        minimum = sum(job_minimum(j) for j in jobs) if jobs else None
        return workload("JobSet", jobset, minimum, "jobset", JOBSET_API_VERSION, _owned_parts(jobs))
    owner = controller_of(pod)
    kind, name = str(owner.get("kind") or ""), str(owner.get("name") or "")
    api_version = str(owner.get("apiVersion") or "")
    group_of_api = api_version.split("/")[0]
    if kind == "Job" and group_of_api == "batch" and JOB_INDEX_ANNOTATION in annotations:
        job = lookup("Job", f"{namespace}/{name}")
        return workload("Job", name, job_minimum(job) if job else None, "indexed job", api_version)
    if kind in KUBEFLOW_KINDS and group_of_api == "kubeflow.org":
        obj = lookup(kind, f"{namespace}/{name}")
        return workload(kind, name, kubeflow_minimum(obj) if obj else None, "kubeflow", api_version)
    if kind == "RayCluster" and group_of_api == "ray.io":
        obj = lookup(kind, f"{namespace}/{name}")
        return workload(kind, name, ray_minimum(obj) if obj else None, "ray", api_version)
    return workload("Pod", str(metadata.get("name") or ""), 1, "pod")


def plan_gang(
    supplies: Sequence[NodeGpus], demand: GpuDemand, count: int, domains: DomainMap = NO_DOMAINS
) -> list[str]:
    """Nodes for up to `count` members of one GPU shape (fewer: only that many fit).

    Binpack: the fullest nodes first, each filled with as many members as fit, so a gang takes
    few nodes and leaves whole ones to others. Nodes of one shape (in one of the `domains`) take
    as many members alike, so the cost is a sort of the nodes plus `count` placements per
    distinct shape at most - a filter call on thousands of nodes stays fast.
    """
    chosen: list[str] = []
    fitting_by_kind: dict[str, int] = {}
    for node in sorted(supplies, key=lambda n: (sum(n.free_milli), n.name)):
        missing = count - len(chosen)
        if missing <= 0:
            break
        kind = domain_shape(node, domains)
        fitting = fitting_by_kind.get(kind)
        if fitting is None:
            fitting, current = 0, node
            while fitting < count and (after := occupy(current, demand, _MIX)) is not None:
                current, fitting = after[0], fitting + 1
            fitting_by_kind[kind] = fitting
        chosen.extend([node.name] * min(fitting, missing))
    return chosen
