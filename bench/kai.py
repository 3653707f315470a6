"""KAI Scheduler as a contender in the cluster benchmarks (reclaim, end to end, reaction).

The benchmarks race it against the plain kube-scheduler and Tessera on the same local control
plane, the same nodes, GPUs, pods, claim templates, node agent and grace periods. The interface
they use is narrow:

- ``find_kai()``: the build of ``hack/build-kai.sh`` (binaries, CRDs, rendered PriorityClasses),
  or None; ``skip_reason()`` says why the KAI contender is skipped then;
- ``Kai(cluster, install)``: ``await kai.install(api, queues)`` once per cluster, then
  ``kai.start(variant)`` / ``kai.stop()`` around each of KAI's rounds, so KAI's processes run only
  during its own rounds (as the extender runs only during Tessera's);
- ``kai_pod(pod, queue)``: the benchmark's pod for KAI (``schedulerName: kai-scheduler`` and
  KAI's queue label; everything else unchanged);
- for gangs with a topology (``bench.topology_live``): ``kai_topology`` (a cluster-scoped
  ``Topology``, ``kai.scheduler/v1alpha1``: its levels' node labels, outermost first),
  ``kai_pod_group`` (a ``scheduling.run.ai/v2alpha2`` PodGroup with ``minMember``, ``queue``, the
  priority class KAI's podgrouper gives bare pods and Jobs, ``train``, and a
  ``topologyConstraint``) and ``pod_group_member`` (a pod joining it: annotations
  ``pod-group-name`` and ``kai.scheduler/skip-podgrouper: "true"``, so the podgrouper leaves it
  alone). tests/unit/simulate/test_bench_kai_operator.py checks these names and every field
  against KAI's CRDs and constants in its source tree.

How KAI runs. Its five processes (scheduler, binder, podgrouper, podgroupcontroller,
queuecontroller) run as local processes with the cluster's admin kubeconfig (``KUBECONFIG``) and
the flags KAI's operator gives its Deployments with the chart's default values: scheduler name
``kai-scheduler``, queue label ``kai.scheduler/queue``, node-pool label
``kai.scheduler/node-pool``, leader election off, the binder, podgroupcontroller and
queuecontroller clients at 20 QPS / burst 100 (the operator's K8sClientConfig defaults; the
podgrouper and the scheduler get no client flags from it), the binder's plugins as the operator
passes them (``BINDER_PLUGINS``: CDI off, as the operator decides without a GPU operator's
ClusterPolicy), and the scheduler's configuration file as the operator renders it for the default
SchedulingShard (``scheduler_config``, below). Differences, all needed to run outside a cluster:
metrics and probe addresses are free loopback ports, the queue and podgroup validating webhooks are off (they
validate objects; no webhook configuration is installed), and no CPU or memory limits apply
(the podgroupcontroller serves its metrics on :8080 whatever its flag says: a clash there stops
it). The variant without consolidation drops that one action (``KaiVariant.consolidation``); a
variant may also give all five processes another client QPS/burst (``KaiVariant.client``).

The scheduler's configuration (``scheduler_config``, pure) follows the operator at the pin: every
default plugin and action is enabled with a priority (``PLUGIN_PRIORITIES``,
``ACTION_PRIORITIES``), placement binpack for GPU and CPU turns gpuspread off (gpupack and
gpusharingorder on) and leaves consolidation on, and the enabled ones are listed by priority,
highest first, ties by name; nodeplacement carries the placement as arguments, and the scenario
search budgets are the shard's defaults (``SCENARIO_SEARCH_BUDGETS``). The scenario generators
``sg-nodelocalgreedy`` and ``sg-multinodegang`` are plugins there: without them reclaim finds no
strategy. tests/unit/simulate/test_bench_kai_operator.py compares these tables with the
operator's source in the tree the build was made from (``source_tree``).

Queue mirroring (``kai_queues``, pure). KAI schedules only into leaf queues, and its queues form a
tree, so the benchmark's Tessera queues become KAI Queues (``scheduling.run.ai/v2``) of the same
names under one added parent, ``KAI_PARENT_QUEUE``, whose quota is the sum of its children's:

    Tessera              KAI
    quota (missing: 0)   quota                  gpu in GPUs; cpu in millicores (x1000);
    limit (missing: no)  limit (-1: unlimited)  memory in megabytes (bytes / 10^6)
    overQuotaWeight      overQuotaWeight        missing: 1 (both)
    priority p           priority 100 + p       100 is KAI's default, 0 Tessera's
    min runtimes (s)     "<s>s" strings         only when set
    parent               parentQueue            top-level queues: KAI_PARENT_QUEUE

Resources KAI has no field for (``gpu/<model>``) are left out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject, KubeError, request
from extender.policy.fairness import QueueSpec
from tessera.dev.localcluster import REPO_ROOT, Component, LocalCluster, free_port

log = logging.getLogger(__name__)

PIN_FILE = REPO_ROOT / "hack" / "kai" / "pin.env"
BUILD_SCRIPT = "hack/build-kai.sh"
DIR_ENV = "TESSERA_KAI_DIR"
COMPONENTS = ("scheduler", "binder", "podgrouper", "podgroupcontroller", "queuecontroller")
KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
KAI_PARENT_QUEUE = "tessera-bench-parent"
KAI_DEFAULT_PRIORITY = 100
KAI_QUEUES_PATH = "/apis/scheduling.run.ai/v2/queues"
KAI_TOPOLOGIES_PATH = "/apis/kai.scheduler/v1alpha1/topologies"
KAI_PODGROUPS_PATH = "/apis/scheduling.run.ai/v2alpha2/namespaces/{namespace}/podgroups"
POD_GROUP_ANNOTATION = "pod-group-name"  # constants.PodGroupAnnotationForPod
SKIP_PODGROUPER_ANNOTATION = "kai.scheduler/skip-podgrouper"  # constants.SkipPodGrouperAnnotation
PODGROUPER_PRIORITY_CLASS = "train"  # what the podgrouper gives bare pods and Jobs (TrainPriorityClass)
NAMESPACES = ("kai-scheduler", "kai-resource-reservation", "kai-scale-adjust")
RESERVATION = "kai-resource-reservation"
# GPU sharing (bench.fragmented): a pod asks a fraction of one GPU by annotation; KAI's admission
# webhook names the pod's shared-GPU ConfigMaps in another, which the binder needs; the binder
# labels each fraction pod with its GPU group and reserves the group's GPU with a pod of its own
# in RESERVATION, whose image writes the GPU it was given into an annotation on itself.
GPU_FRACTION_ANNOTATION = "gpu-fraction"  # constants.GpuFraction
SHARED_GPU_CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"  # constants.GpuSharingConfigMapAnnotation
GPU_GROUP_LABEL = "runai-gpu-group"  # constants.GPUGroup
RESERVED_GPU_ANNOTATION = "run.ai/reserve_for_gpu_index"  # resourcereservation gpuIndexAnnotationName
# The operator's SchedulingShard defaults at the pin (pkg/apis/kai/v1/schedulingshard_types.go):
# priority of each plugin and action, higher runs first.
PLUGIN_PRIORITIES = {
    "predicates": 1900,
    "proportion": 1800,
    "priority": 1700,
    "nodeavailability": 1600,
    "resourcetype": 1500,
    "podaffinity": 1400,
    "elastic": 1300,
    "kubeflow": 1200,
    "ray": 1100,
    "subgrouporder": 1000,
    "taskorder": 900,
    "nominatednode": 800,
    "dynamicresources": 700,
    "minruntime": 600,
    "topology": 500,
    "snapshot": 400,
    "sg-nodelocalgreedy": 360,
    "sg-multinodegang": 350,
    "gpupack": 300,
    "gpuspread": 300,
    "nodeplacement": 200,
    "gpusharingorder": 100,
}
ACTION_PRIORITIES = {
    "allocate": 500,
    "consolidation": 400,
    "reclaim": 300,
    "preempt": 200,
    "stalegangeviction": 100,
}
PLACEMENT = "binpack"  # the chart's scheduler.placementStrategy, for GPU and CPU
BINPACK_ONLY_PLUGINS = ("gpupack", "gpusharingorder")  # on with GPU binpack; gpuspread the reverse
SPREAD_ONLY_PLUGINS = ("gpuspread",)
# DefaultScenarioSearchBudgets (keys "default", "NodeLocalGreedy", "MultiNodeGang" as in its constants).
SCENARIO_SEARCH_BUDGETS = {
    "maxActionSearchDuration": {"default": "5m"},
    "maxJobSearchDuration": "4m",
    "minJobSearchDuration": "0s",
    "maxGeneratorSearchDuration": {"default": "2m", "NodeLocalGreedy": "30s", "MultiNodeGang": "2m"},
}
# The binder's --plugins as the operator passes them (pkg/apis/kai/v1/binder DefaultPluginsConfig):
# bind timeout 120 s; cdiEnabled false, which the operator sets when no ClusterPolicy enables CDI.
BIND_TIMEOUT_S = 120
BINDER_PLUGINS: dict[str, JsonObject] = {
    "volumebinding": {
        "enabled": True,
        "priority": 300,
        "arguments": {"bindTimeoutSeconds": str(BIND_TIMEOUT_S)},
    },
    "dynamicresources": {
        "enabled": True,
        "priority": 200,
        "arguments": {"bindTimeoutSeconds": str(BIND_TIMEOUT_S)},
    },
    "gpusharing": {"enabled": True, "priority": 100, "arguments": {"cdiEnabled": "false"}},
    "hamicore": {"enabled": False, "priority": 50},
}
# The operator's K8sClientConfig defaults (QPS, burst), given to these components only.
OPERATOR_CLIENT = (20, 100)
OPERATOR_CLIENT_COMPONENTS = ("binder", "podgroupcontroller", "queuecontroller")
# KAI's units per Tessera unit: cores -> millicores, bytes -> megabytes.
UNITS = {"gpu": 1.0, "cpu": 1000.0, "memory": 1e-6}


# -- pure parts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KaiVariant:
    """One way of running KAI: with its default actions or without consolidation; with its
    operator's client QPS/burst, or with `client` (QPS, burst) for all five processes."""

    label: str
    consolidation: bool = True
    client: tuple[int, int] | None = None


DEFAULT_ACTIONS = KaiVariant("KAI Scheduler, default actions")
NO_CONSOLIDATION = KaiVariant("KAI Scheduler, no consolidation", consolidation=False)


def read_pin(text: str) -> dict[str, str]:
    """KEY=VALUE lines of hack/kai/pin.env (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def install_dir(pin: Mapping[str, str], env: Mapping[str, str], home: Path) -> Path:
    """Where hack/build-kai.sh puts its build (the same rule as the script), or $TESSERA_KAI_DIR."""
    if env.get(DIR_ENV):
        return Path(env[DIR_ENV])
    cache_root = env.get("TESSERA_CACHE") or str(
        Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "tessera"
    )
    return Path(cache_root) / f"kai-{pin['KAI_REVISION']}"


def missing_parts(directory: Path) -> list[str]:
    """What the KAI contender needs from the build directory and does not find there."""
    wanted = [f"bin/{name}" for name in COMPONENTS] + ["crds", "priorityclasses", "version"]
    return [part for part in wanted if not (directory / part).exists()]


def skip_message(directory: Path, missing: Sequence[str]) -> str:
    """Why the KAI contender does not run, and how to get it."""
    return (
        f"KAI Scheduler contender skipped: {directory} lacks {', '.join(missing)}. "
        f"Build it with `bash {BUILD_SCRIPT}` (or point {DIR_ENV} at a build), then rerun."
    )


def kai_queues(specs: Sequence[QueueSpec], parent: str = KAI_PARENT_QUEUE) -> list[JsonObject]:
    """Tessera queue specs as KAI Queue objects under one added parent (see the module doc)."""
    names = {spec.name for spec in specs}

    def resources(
        quota: Mapping[str, float], limit: Mapping[str, float], weight: Mapping[str, float]
    ) -> JsonObject:
        return {
            resource: {
                "quota": quota.get(resource, 0.0) * unit,
                "limit": limit[resource] * unit if resource in limit else -1,
                "overQuotaWeight": weight.get(resource, 1.0),
            }
            for resource, unit in UNITS.items()
        }

    def queue(name: str, spec: JsonObject) -> JsonObject:
        return {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        }

    top = [spec for spec in specs if spec.parent is None or spec.parent not in names]
    parent_quota = {resource: sum(spec.quota.get(resource, 0.0) for spec in top) for resource in UNITS}
    mirrored = [queue(parent, {"resources": resources(parent_quota, {}, {})})]
    for spec in specs:
        body: JsonObject = {
            "parentQueue": spec.parent if spec.parent in names else parent,
            "priority": KAI_DEFAULT_PRIORITY + spec.priority,
            "resources": resources(spec.quota, spec.limit, spec.over_quota_weight),
        }
        if spec.reclaim_min_runtime_s:
            body["reclaimMinRuntime"] = f"{spec.reclaim_min_runtime_s:g}s"
        if spec.preempt_min_runtime_s:
            body["preemptMinRuntime"] = f"{spec.preempt_min_runtime_s:g}s"
        mirrored.append(queue(spec.name, body))
    return mirrored


def scheduler_config(consolidation: bool) -> JsonObject:
    """The scheduler's configuration file, as the operator renders it for the default shard
    (see the module doc); without ``consolidation``, that one action left out."""
    binpack = PLACEMENT == "binpack"
    disabled = set(SPREAD_ONLY_PLUGINS if binpack else BINPACK_ONLY_PLUGINS)

    def by_priority(priorities: Mapping[str, int], skip: set[str]) -> list[str]:
        enabled = [name for name in priorities if name not in skip]
        return sorted(enabled, key=lambda name: (-priorities[name], name))

    plugins: list[JsonObject] = [
        {"name": name, "arguments": {"cpu": PLACEMENT, "gpu": PLACEMENT}}
        if name == "nodeplacement"
        else {"name": name}
        for name in by_priority(PLUGIN_PRIORITIES, disabled)
    ]
    actions = by_priority(ACTION_PRIORITIES, set() if consolidation else {"consolidation"})
    return {
        "actions": ", ".join(actions),
        "tiers": [{"plugins": plugins}],
        "scenarioSearchBudgets": SCENARIO_SEARCH_BUDGETS,
    }


def kai_pod(pod: JsonObject, queue: str) -> JsonObject:
    """The same pod for KAI: its scheduler name and queue label added, nothing else changed."""
    metadata = dict(pod["metadata"])
    metadata["labels"] = {**(metadata.get("labels") or {}), KAI_QUEUE_LABEL: queue}
    return {**pod, "metadata": metadata, "spec": {**pod["spec"], "schedulerName": KAI_SCHEDULER}}


def kai_topology(name: str, node_labels: Sequence[str]) -> JsonObject:
    """KAI's cluster-scoped Topology: one level per node label, outermost first (the hostname
    label, when given, last: KAI's CRD allows it only there)."""
    return {
        "apiVersion": "kai.scheduler/v1alpha1",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": label} for label in node_labels]},
    }


def kai_pod_group(
    namespace: str,
    name: str,
    queue: str,
    min_member: int,
    topology: str | None = None,
    preferred_level: str | None = None,
) -> JsonObject:
    """A PodGroup made by hand for a gang of bare pods: at least ``min_member`` of them start
    together, in ``queue``, at the priority class the podgrouper would have given them; with
    ``topology``, preferring one domain of ``preferred_level`` (a node label of that Topology)."""
    spec: JsonObject = {
        "minMember": min_member,
        "queue": queue,
        "priorityClassName": PODGROUPER_PRIORITY_CLASS,
    }
    if topology and preferred_level:
        spec["topologyConstraint"] = {"topology": topology, "preferredTopologyLevel": preferred_level}
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "labels": {KAI_QUEUE_LABEL: queue}},
        "spec": spec,
    }


def pod_group_member(pod: JsonObject, group: str) -> JsonObject:
    """``pod`` (already ``kai_pod``'s) as a member of the PodGroup ``group`` made by hand: the
    podgrouper told to leave it alone, the group named."""
    metadata = dict(pod["metadata"])
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        POD_GROUP_ANNOTATION: group,
        SKIP_PODGROUPER_ANNOTATION: "true",
    }
    return {**pod, "metadata": metadata}


def component_args(
    name: str, config: Path, ports: Mapping[str, int], client: tuple[int, int] | None = None
) -> list[str]:
    """The flags of one component: its operator's, plus the loopback addresses of ``ports``; with
    ``client``, that QPS and burst instead of the operator's (or the built-in) ones."""
    common = ["--scheduler-name", KAI_SCHEDULER]
    probes = [
        f"--metrics-bind-address=127.0.0.1:{ports['metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{ports['probe']}",
    ]
    by_name = {
        "scheduler": [
            f"--scheduler-conf={config}",
            f"--scheduler-name={KAI_SCHEDULER}",
            "--namespace=kai-scheduler",
            f"--nodepool-label-key={NODE_POOL_LABEL}",
            "--partition-label-value=",
            f"--resource-reservation-app-label={RESERVATION}",
            f"--queue-label-key={KAI_QUEUE_LABEL}",
            f"--listen-address=127.0.0.1:{ports['metrics']}",
            "--metrics-namespace=kai",
            f"--plugin-server-port={ports['probe']}",
        ],
        "binder": [
            *common,
            *("--resource-reservation-namespace", RESERVATION),
            *("--resource-reservation-service-account", RESERVATION),
            *("--resource-reservation-app-label", RESERVATION),
            *("--resource-reservation-pod-image", "registry/local/kai-scheduler/resource-reservation"),
            *("--scale-adjust-namespace", "kai-scale-adjust"),
            *probes,
            *("--plugins", json.dumps(BINDER_PLUGINS, sort_keys=True, separators=(",", ":"))),
        ],
        "podgrouper": [
            *common,
            *("--queue-label-key", KAI_QUEUE_LABEL, "--nodepool-label-key", NODE_POOL_LABEL),
            "--generic-karta-fallback=true",
            *probes,
        ],
        "podgroupcontroller": [*common, *probes, "--enable-podgroup-webhook=false"],
        "queuecontroller": [
            f"--metrics-listen-address=127.0.0.1:{ports['metrics']}",
            "--metrics-namespace=kai",
            "--enable-webhook=false",
        ],
    }
    if client:
        qps = [f"--qps={client[0]}", f"--burst={client[1]}"]
    elif name in OPERATOR_CLIENT_COMPONENTS:
        qps = ["--qps", str(OPERATOR_CLIENT[0]), "--burst", str(OPERATOR_CLIENT[1])]
    else:
        qps = []
    return [*by_name[name], *qps]


def health_url(name: str, ports: Mapping[str, int]) -> str:
    """What answers once a component runs: its readiness probe where it has one, else its metrics
    (the podgroupcontroller serves its metrics on :8080 whatever its flag says)."""
    if name in ("podgrouper", "podgroupcontroller"):
        return f"http://127.0.0.1:{ports['probe']}/readyz"
    return f"http://127.0.0.1:{ports['metrics']}/metrics"


# -- the build and the processes ---------------------------------------------------------------


@dataclass(frozen=True)
class KaiInstall:
    """A build of hack/build-kai.sh: bin/, crds/, priorityclasses/ and the module version."""

    directory: Path

    @property
    def version(self) -> str:
        return (self.directory / "version").read_text().strip()

    def manifests(self, kind: str) -> list[JsonObject]:
        documents: list[JsonObject] = []
        for path in sorted((self.directory / kind).glob("*.yaml")):
            documents.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
        return documents


def source_tree(directory: Path, env: Mapping[str, str]) -> Path | None:
    """KAI's source tree: $KAI_SRC when it is one (it holds go.mod), else the tree the build in
    ``directory`` was made from (its ``source`` file, written by hack/build-kai.sh), else None."""
    candidates = [Path(env["KAI_SRC"])] if env.get("KAI_SRC") else []
    if (directory / "source").is_file():
        candidates.append(Path((directory / "source").read_text().strip()))
    return next((tree for tree in candidates if (tree / "go.mod").is_file()), None)


def kai_directory() -> Path:
    return install_dir(read_pin(PIN_FILE.read_text()), os.environ, Path.home())


def find_kai() -> KaiInstall | None:
    """The KAI build the benchmarks use, or None when it is absent (see ``skip_message``)."""
    directory = kai_directory()
    return None if missing_parts(directory) else KaiInstall(directory)


def skip_reason() -> str:
    directory = kai_directory()
    return skip_message(directory, missing_parts(directory))


async def _create(api: ApiClient, path: str, body: JsonObject) -> None:
    try:
        await request(api, "POST", path, body=body)
    except KubeError as exc:
        if exc.status != 409:  # already there (a second install on the same cluster)
            raise


class Kai:
    """KAI Scheduler on one LocalCluster: its objects installed once, its processes per round."""

    def __init__(self, cluster: LocalCluster, install: KaiInstall) -> None:
        self.cluster = cluster
        self.install_ = install
        self.components: list[Component] = []

    @property
    def version(self) -> str:
        return self.install_.version

    async def install(self, api: ApiClient, queues: Sequence[QueueSpec]) -> None:
        """KAI's CRDs and PriorityClasses from the build, its namespaces, and ``queues`` mirrored."""
        crds = self.install_.manifests("crds")
        for crd in crds:
            await _create(api, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        await asyncio.to_thread(
            self.cluster.wait_established, *(f"crd/{crd['metadata']['name']}" for crd in crds)
        )
        for priority_class in self.install_.manifests("priorityclasses"):
            await _create(api, "/apis/scheduling.k8s.io/v1/priorityclasses", priority_class)
        for namespace in NAMESPACES:
            await _create(api, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        for queue in kai_queues(queues):
            await _create(api, KAI_QUEUES_PATH, queue)

    async def install_topology(self, api: ApiClient, topology: JsonObject) -> None:
        """A Topology object (``kai_topology``), after ``install`` put KAI's CRDs in."""
        await _create(api, KAI_TOPOLOGIES_PATH, topology)

    async def replace_queues(self, api: ApiClient, old: Sequence[str], queues: Sequence[QueueSpec]) -> None:
        """The mirrored queues `old` deleted and `queues` mirrored instead (under the same parent,
        whose quota stays the sum of its children's)."""
        for name in old:
            await request(api, "DELETE", f"{KAI_QUEUES_PATH}/{name}")
        for queue in kai_queues(queues):
            await _create(api, KAI_QUEUES_PATH, queue)

    def start(self, variant: KaiVariant) -> None:
        """KAI's five processes, each waited for until it answers (``health_url``)."""
        config = (
            self.cluster.workdir / f"kai-scheduler-{'default' if variant.consolidation else 'noconsol'}.yaml"
        )
        config.write_text(yaml.safe_dump(scheduler_config(variant.consolidation), sort_keys=False))
        env = {"KUBECONFIG": str(self.cluster.kubeconfig)}
        try:
            for name in COMPONENTS:
                ports = {"metrics": free_port(), "probe": free_port()}
                args = component_args(name, config, ports, variant.client)
                command = [str(self.install_.directory / "bin" / name), *args]
                log.info("starting %s", shlex.join(command))
                component = self.cluster.spawn(f"kai-{name}", command, env)
                self.components.append(component)
                self.cluster.wait_healthy(component, health_url(name, ports), tls=False)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for component in self.components:
            component.stop(timeout=30)
            if component in self.cluster.components:
                self.cluster.components.remove(component)
        self.components = []
