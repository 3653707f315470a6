"""The cluster picture the extender decides on, kept current by watches.

`ClusterState` is plain data plus bookkeeping: it takes Kubernetes JSON objects (from a list, a
watch event, or the binder's optimistic update) and answers the questions of the hot path - the
free GPUs of a node, a pod's demand, the queues' usage and fair shares - without any API call.
`ClusterWatcher` is the only part doing I/O: list, then watch each kind, relisting when the
server says the resourceVersion is gone (410) and reconnecting with backoff on errors.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.kube import meta, object_key, pod_claim_refs
from contract.names import (
    CLASSIC_GPU_RESOURCE,
    CLASSIC_MODEL_LABEL,
    DEFAULT_QUEUE,
    DEVICE_TYPE_ATTRIBUTE,
    DRIVER_NAME,
    GPU_MILLI,
    MEMORY_CAPACITY,
    MODEL_ATTRIBUTE,
    QUEUE_GROUP,
    QUEUE_LABEL,
    QUEUE_PLURAL,
    QUEUE_VERSION,
)
from contract.quantity import parse_quantity
from extender.demand import (
    AllocatedDevice,
    GpuRequest,
    allocated_devices,
    claim_gpu_requests,
    device_class_gpu_models,
    fraction_milli,
    pod_classic_gpus,
    pod_resource_request,
    to_gpu_demand,
)
from extender.kubeapi import JsonObject, KubeError, request, watch_lines
from extender.policy.fairness import QueueSpec, QueueUsage, compute_fair_shares
from extender.policy.placement import GpuDemand, NodeGpus, WorkloadMix
from extender.queues import QueueSpecError, parse_queue
from extender.usage import Bucket, Contribution, QueueLedger

log = logging.getLogger(__name__)

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

# kind -> collection path; the watcher lists and watches each, the state keys objects by kind.
WATCHED_KINDS: dict[str, str] = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/pods",
    "ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
    "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/resourceclaimtemplates",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "Queue": f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}",
}

DeviceKey = tuple[str, str, str]  # (driver, pool, device name)


@dataclass(frozen=True)
class GpuDevice:
    node: str
    model: str
    memory_bytes: int


@dataclass(frozen=True)
class FairnessView:
    """Everything admission needs, computed once per change of the picture."""

    specs: tuple[QueueSpec, ...]
    invalid: Mapping[str, str]  # Queue objects that failed to parse -> why
    usage: Mapping[str, QueueUsage]
    capacity: Mapping[str, float]
    fair_shares: Mapping[str, Mapping[str, float]]
    pending_pods: Mapping[str, int]  # queue -> pending pods (for metrics)
    mix: WorkloadMix


@dataclass
class StateConfig:
    gpu_drivers: frozenset[str] = frozenset({DRIVER_NAME})
    # Pending pods count as queue demand only when addressed to one of these schedulers (empty: any).
    scheduler_names: frozenset[str] = frozenset()


def _resource_version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(meta(obj).get("resourceVersion", ""))
    except ValueError:
        return None


def pod_queue(pod: Mapping[str, Any]) -> str:
    labels = meta(pod).get("labels") or {}
    return str(labels.get(QUEUE_LABEL) or DEFAULT_QUEUE)


def _string_attribute(attributes: Mapping[str, Any], driver: str, name: str, default: str) -> str:
    """A device attribute, written bare or qualified with the driver's domain."""
    value = attributes.get(name) or attributes.get(f"{driver}/{name}") or {}
    return str(value.get("string", default))


def _discard(index: dict[str, set[str]], key: str, member: str) -> None:
    """Remove `member` from the set at `key`, and the key with its last member."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def gpu_amounts(model: str, amount: float) -> dict[str, float]:
    """A GPU amount counted both in "gpu" and, when the model is known, in "gpu/<model>"."""
    return {"gpu": amount, f"gpu/{model}": amount} if model else {"gpu": amount}


def _add(into: dict[str, float], amounts: Mapping[str, float]) -> None:
    for resource, amount in amounts.items():
        into[resource] = into.get(resource, 0.0) + amount


@dataclass
class ClusterState:
    config: StateConfig = field(default_factory=StateConfig)
    objects: dict[str, dict[str, JsonObject]] = field(default_factory=dict)
    synced: set[str] = field(default_factory=set)
    # Derived indexes, kept in step with `objects` by `_index`/`_unindex`.
    devices: dict[DeviceKey, GpuDevice] = field(default_factory=dict)
    node_devices: dict[str, list[DeviceKey]] = field(default_factory=dict)
    # Memory of a node's (first) GPU, which sizes fractional demands there: read per node by filter.
    gpu_memory: dict[str, int] = field(default_factory=dict)
    device_holders: dict[DeviceKey, dict[str, int | None]] = field(default_factory=dict)
    gpu_classes: dict[str, frozenset[str]] = field(default_factory=dict)
    # Pods the binder bound before the watch showed it: pod key -> node.
    assumed_nodes: dict[str, str] = field(default_factory=dict)
    # Pods filter admitted whose bind has not come yet: pod key -> expiry (monotonic). The
    # scheduler runs the next pod's filter while the previous one is still binding, so
    # admissions in flight must count against their queue or a burst could pass a limit.
    reserved: dict[str, float] = field(default_factory=dict)
    # The wire pod of a reservation, for a pod the watch has not delivered yet.
    reserved_pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    pods_by_node: dict[str, set[str]] = field(default_factory=dict)
    # Incremental queue accounting: pods whose contribution must be recomputed, and which pods
    # read which claim or template ("ResourceClaim:ns/name" -> pod keys).
    ledger: QueueLedger = field(default_factory=QueueLedger)
    _dirty_pods: set[str] = field(default_factory=set)
    _all_pods_dirty: bool = True
    _source_users: dict[str, set[str]] = field(default_factory=dict)
    _pod_sources: dict[str, set[str]] = field(default_factory=dict)
    # Caches of derived supply, dropped by `_supply_changed`.
    _memory_by_models: dict[frozenset[str], int] = field(default_factory=dict)
    # GPU devices per (model, memory). Pending fractions are sized against the largest GPU of
    # their models, so only a change of which sizes exist recounts every pod.
    _gpu_sizes: Counter[tuple[str, int]] = field(default_factory=Counter)
    _node_gpus: dict[str, NodeGpus] = field(default_factory=dict)
    _capacity: dict[str, float] | None = None
    # Called after every change (the status writer uses it to notice newly eligible pods).
    listeners: list[Callable[[], None]] = field(default_factory=list)
    _view: FairnessView | None = None

    # ---- updates -------------------------------------------------------------------------

    def kind(self, kind: str) -> dict[str, JsonObject]:
        return self.objects.setdefault(kind, {})

    def apply(self, kind: str, event_type: str, obj: JsonObject) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED). Older versions never overwrite newer."""
        key = object_key(obj)
        store = self.kind(kind)
        old = store.get(key)
        if event_type == "DELETED":
            if old is not None:
                self._unindex(kind, key, old)
                del store[key]
            if kind == "Pod":
                self.assumed_nodes.pop(key, None)
                self._drop_reservation(key)
        else:
            if old is not None:
                old_rv, new_rv = _resource_version(old), _resource_version(obj)
                if old_rv is not None and new_rv is not None and new_rv < old_rv:
                    return
                self._unindex(kind, key, old)
            store[key] = obj
            self._index(kind, key, obj)
        self._changed()

    def replace(self, kind: str, items: Iterable[JsonObject]) -> None:
        """A fresh list of a kind (first sync or relist after 410): drop what is gone."""
        fresh = {object_key(obj): obj for obj in items}
        store = self.kind(kind)
        for key, old in list(store.items()):
            self._unindex(kind, key, old)
        store.clear()
        for key, obj in fresh.items():
            store[key] = obj
            self._index(kind, key, obj)
        if kind == "Pod":
            self.assumed_nodes = {k: n for k, n in self.assumed_nodes.items() if k in fresh}
            for key in [k for k in self.reserved if k not in fresh]:
                self._drop_reservation(key)
            self._all_pods_dirty = True
        self.synced.add(kind)
        if self.ready():
            # Count every pod and every node's free GPUs (and their shapes) now, while
            # (re)listing, rather than in the first request after it.
            self.fairness()
            for node in self.kind("Node"):
                _ = self.node_gpus(node).shape
        # The picture is millions of long-lived objects; left to the collector, every full
        # collection walks all of them (hundreds of ms in the middle of a request). Collect what
        # is garbage now, then exempt the survivors from later collections; the picture holds no
        # reference cycles, so what it drops later is still freed by reference counting.
        gc.collect()
        gc.freeze()
        self._changed()

    def assume_bound(self, namespace: str, name: str, node: str) -> None:
        """The binder's optimistic update: count the pod on `node` before the watch says so."""
        key = f"{namespace}/{name}"
        pod = self.kind("Pod").get(key)
        if pod is not None:
            self._unindex("Pod", key, pod)
        self.assumed_nodes[key] = node
        self._drop_reservation(key)
        if pod is not None:
            self._index("Pod", key, pod)
        self._dirty_pods.add(key)
        self._changed()

    def reserve(self, key: str, pod: Mapping[str, Any], ttl_s: float) -> None:
        """Count a pending pod as allocated to its queue until it is bound or `ttl_s` passes."""
        self.reserved[key] = time.monotonic() + ttl_s
        self.reserved_pods[key] = pod
        self._dirty_pods.add(key)

    def release(self, key: str) -> None:
        """Undo `reserve` (the pod is being filtered again, so its old admission is void)."""
        if key in self.reserved:
            self._drop_reservation(key)
            self._dirty_pods.add(key)

    def _drop_reservation(self, key: str) -> None:
        self.reserved.pop(key, None)
        self.reserved_pods.pop(key, None)

    def _changed(self) -> None:
        for listener in self.listeners:
            listener()

    def _supply_changed(self, kind: str, obj: JsonObject) -> None:
        """Drop cached derivations that an object of `kind` can change."""
        key = object_key(obj)
        if kind == "DeviceClass":
            # Classes decide which requests are GPUs, for every pod: recount all (rare events).
            self._all_pods_dirty = True
        elif kind == "ResourceSlice":
            # Pods holding its devices are recounted by `_count_device`.
            self._capacity = None
            self._node_gpus.pop(str((obj.get("spec") or {}).get("nodeName")), None)
        elif kind == "Node":
            # Allocatable feeds capacity; the GPU model label feeds its classic-GPU pods.
            self._capacity = None
            self._view = None
            self._node_gpus.pop(key, None)
            self._dirty_pods.update(self.pods_by_node.get(key, ()))
        elif kind == "ResourceClaim":
            self._dirty_pods.update(self._source_users.get(f"{kind}:{key}", ()))
            for held in allocated_devices(obj):
                device = self._gpu_device(held)
                if device is not None:
                    self._node_gpus.pop(device.node, None)
        elif kind == "ResourceClaimTemplate":
            self._dirty_pods.update(self._source_users.get(f"{kind}:{key}", ()))
        elif kind == "Pod":
            self._dirty_pods.add(key)
            if pod_classic_gpus(obj):
                self._node_gpus.pop(self.pod_node(key, obj), None)
        elif kind == "Queue":
            self._view = None

    def _index(self, kind: str, key: str, obj: JsonObject) -> None:
        self._supply_changed(kind, obj)
        if kind == "ResourceSlice":
            for device_key, device in self._slice_devices(obj):
                self.devices[device_key] = device
                self.node_devices.setdefault(device.node, []).append(device_key)
                self._count_device(device_key, device, 1)
                self._refresh_gpu_memory(device.node)
        elif kind == "ResourceClaim":
            for held in allocated_devices(obj):
                self.device_holders.setdefault((held.driver, held.pool, held.device), {})[key] = (
                    held.consumed_memory
                )
        elif kind == "DeviceClass":
            models = device_class_gpu_models(obj, self.config.gpu_drivers)
            if models is not None:
                self.gpu_classes[key] = models
        elif kind == "Pod":
            if (obj.get("spec") or {}).get("nodeName"):
                self.assumed_nodes.pop(key, None)
                self._drop_reservation(key)
            node = self.pod_node(key, obj)
            if node:
                self.pods_by_node.setdefault(node, set()).add(key)

    def _unindex(self, kind: str, key: str, obj: JsonObject) -> None:
        self._supply_changed(kind, obj)
        if kind == "ResourceSlice":
            for device_key, device in self._slice_devices(obj):
                self.devices.pop(device_key, None)
                self._count_device(device_key, device, -1)
                keys = self.node_devices.get(device.node, [])
                if device_key in keys:
                    keys.remove(device_key)
                self._refresh_gpu_memory(device.node)
        elif kind == "ResourceClaim":
            for held in allocated_devices(obj):
                device_key = (held.driver, held.pool, held.device)
                holders = self.device_holders.get(device_key, {})
                holders.pop(key, None)
                if not holders:
                    self.device_holders.pop(device_key, None)
        elif kind == "DeviceClass":
            self.gpu_classes.pop(key, None)
        elif kind == "Pod":
            _discard(self.pods_by_node, self.pod_node(key, obj), key)

    def _refresh_gpu_memory(self, node: str) -> None:
        keys = self.node_devices.get(node)
        if keys:
            self.gpu_memory[node] = self.devices[keys[0]].memory_bytes
        else:
            self.gpu_memory.pop(node, None)

    def _count_device(self, key: DeviceKey, device: GpuDevice, sign: int) -> None:
        """A device appears (1) or goes (-1): recount the pods whose claims hold it, and every
        pod when a GPU size appears or disappears."""
        size = (device.model, device.memory_bytes)
        before = self._gpu_sizes[size]
        self._gpu_sizes[size] = before + sign
        if not self._gpu_sizes[size]:
            del self._gpu_sizes[size]
        if (before == 0) != (size not in self._gpu_sizes):  # a size appeared or went
            self._all_pods_dirty = True
            self._memory_by_models.clear()
        for claim in self.device_holders.get(key, {}):
            self._dirty_pods.update(self._source_users.get(f"ResourceClaim:{claim}", ()))

    def _slice_devices(self, slice_obj: Mapping[str, Any]) -> list[tuple[DeviceKey, GpuDevice]]:
        spec = slice_obj.get("spec") or {}
        driver, node = str(spec.get("driver", "")), spec.get("nodeName")
        if driver not in self.config.gpu_drivers or not node:
            return []
        pool = str((spec.get("pool") or {}).get("name", ""))
        found: list[tuple[DeviceKey, GpuDevice]] = []
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            if _string_attribute(attributes, driver, DEVICE_TYPE_ATTRIBUTE, "gpu") != "gpu":
                continue  # MIG partitions and other device types are not whole GPUs
            model = _string_attribute(attributes, driver, MODEL_ATTRIBUTE, "")
            memory_text = ((device.get("capacity") or {}).get(MEMORY_CAPACITY) or {}).get("value", 0)
            try:
                memory = int(parse_quantity(memory_text))
            except ValueError:
                log.warning(
                    "slice %s: device %s has a bad memory capacity %r",
                    object_key(slice_obj),
                    device.get("name"),
                    memory_text,
                )
                memory = 0
            found.append(((driver, pool, str(device.get("name"))), GpuDevice(str(node), model, memory)))
        return found

    # ---- questions of the hot path ----------------------------------------------------------

    def ready(self) -> bool:
        return all(kind in self.synced for kind in WATCHED_KINDS)

    def _device_used_milli(self, key: DeviceKey, device: GpuDevice) -> int:
        return sum(
            GPU_MILLI if consumed is None else fraction_milli(consumed, device.memory_bytes)
            for consumed in self.device_holders.get(key, {}).values()
        )

    def node_gpus(self, name: str) -> NodeGpus:
        """Free share of each GPU of a node: DRA devices minus claim allocations, plus classic GPUs."""
        cached = self._node_gpus.get(name)
        if cached is None:
            cached = self._node_gpus[name] = self._compute_node_gpus(name)
        return cached

    def _compute_node_gpus(self, name: str) -> NodeGpus:
        free: list[int] = []
        model = ""
        for key in self.node_devices.get(name, []):
            device = self.devices[key]
            model = model or device.model
            free.append(max(0, GPU_MILLI - self._device_used_milli(key, device)))
        node = self.kind("Node").get(name)
        if node is not None:
            classic_total = int(
                parse_quantity(
                    ((node.get("status") or {}).get("allocatable") or {}).get(CLASSIC_GPU_RESOURCE, 0)
                )
            )
            if classic_total:
                model = model or str((meta(node).get("labels") or {}).get(CLASSIC_MODEL_LABEL, ""))
                used = sum(pod_classic_gpus(p) for p in self.pods_on_node(name))
                free.extend([GPU_MILLI] * max(0, classic_total - used) + [0] * min(used, classic_total))
        return NodeGpus(name=name, model=model, free_milli=tuple(free))

    def node_gpu_memory(self, name: str) -> int:
        return self.gpu_memory.get(name, 0)

    def pods_on_node(self, node: str) -> list[JsonObject]:
        pods = self.kind("Pod")
        return [
            pods[key]
            for key in self.pods_by_node.get(node, ())
            if (pods[key].get("status") or {}).get("phase") not in TERMINAL_PHASES
        ]

    def pod_node(self, key: str, pod: Mapping[str, Any]) -> str:
        return str((pod.get("spec") or {}).get("nodeName") or self.assumed_nodes.get(key, ""))

    def reference_memory(self, models: frozenset[str]) -> int:
        """Memory of the largest GPU a pending fractional request could land on."""
        if models not in self._memory_by_models:
            self._memory_by_models[models] = max(
                (d.memory_bytes for d in self.devices.values() if not models or d.model in models), default=0
            )
        return self._memory_by_models[models]

    def pod_demand(self, pod: Mapping[str, Any]) -> GpuDemand | None:
        """GPUs a pod asks for (None: none); fractions relative to the largest GPU they could land on."""
        requests = self.pod_gpu_requests(pod)
        models = frozenset().union(*(r.models for r in requests))
        return to_gpu_demand(requests, pod_classic_gpus(pod), self.reference_memory(models))

    def pod_gpu_requests(self, pod: Mapping[str, Any]) -> list[GpuRequest]:
        """The GPU requests of a pod's claims (classic extended resources not included)."""
        namespace = str(meta(pod).get("namespace", ""))
        requests: list[GpuRequest] = []
        for ref in pod_claim_refs(pod):
            # The claim when the picture has it; else its template (the claim's watch event may lag).
            claim = self.kind("ResourceClaim").get(f"{namespace}/{ref.claim}") if ref.claim else None
            template = self.kind("ResourceClaimTemplate").get(f"{namespace}/{ref.template}")
            if claim is not None:
                claim_spec = claim.get("spec") or {}
            elif template is not None:
                claim_spec = (template.get("spec") or {}).get("spec") or {}
            else:
                continue
            requests.extend(claim_gpu_requests(claim_spec, self.gpu_classes))
        return requests

    def pod_resources(self, key: str, pod: Mapping[str, Any]) -> dict[str, float]:
        """The fairness vector of a pod: gpu (and gpu/<model>), cpu cores, memory bytes.

        A pod whose claims are allocated counts the devices it really holds; otherwise what it asks.
        """
        amounts: dict[str, float] = {
            "cpu": pod_resource_request(pod, "cpu"),
            "memory": pod_resource_request(pod, "memory"),
        }
        held = self._held_devices(pod)
        if held:
            for device, share in held:
                _add(amounts, gpu_amounts(device.model, share))
        else:
            demand = self.pod_demand(pod)
            if demand is not None:
                gpus = demand.count * demand.milli / GPU_MILLI
                classic_model = self._classic_model(key, pod)
                model = next(iter(demand.models)) if len(demand.models) == 1 else classic_model
                _add(amounts, gpu_amounts(model, gpus))
        return {r: a for r, a in amounts.items() if a > 0}

    def _classic_model(self, key: str, pod: Mapping[str, Any]) -> str:
        node = self.kind("Node").get(self.pod_node(key, pod))
        if node is None or not pod_classic_gpus(pod):
            return ""
        return str((meta(node).get("labels") or {}).get(CLASSIC_MODEL_LABEL, ""))

    def _held_devices(self, pod: Mapping[str, Any]) -> list[tuple[GpuDevice, float]]:
        namespace = str(meta(pod).get("namespace", ""))
        held: list[tuple[GpuDevice, float]] = []
        for ref in pod_claim_refs(pod):
            claim = self.kind("ResourceClaim").get(f"{namespace}/{ref.claim}") if ref.claim else None
            for allocated in allocated_devices(claim) if claim is not None else []:
                device = self._gpu_device(allocated)
                if device is not None:
                    share = (
                        1.0
                        if allocated.consumed_memory is None
                        else fraction_milli(allocated.consumed_memory, device.memory_bytes) / 1000
                    )
                    held.append((device, share))
        return held

    def _gpu_device(self, allocated: AllocatedDevice) -> GpuDevice | None:
        return self.devices.get((allocated.driver, allocated.pool, allocated.device))

    def is_pending(self, key: str, pod: Mapping[str, Any]) -> bool:
        """Waits for scheduling by a scheduler whose demand counts."""
        if self.pod_node(key, pod) or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return False
        names = self.config.scheduler_names
        return not names or (pod.get("spec") or {}).get("schedulerName", "default-scheduler") in names

    def fairness(self) -> FairnessView:
        """Queue specs, usage, capacity and fair shares, brought up to date with the picture.

        Only pods that changed (or whose claims did) are recounted; fair shares are recomputed,
        in O(queues x resources), only when something changed.
        """
        if self.reserved:
            now = time.monotonic()
            for key in [k for k, expiry in self.reserved.items() if expiry < now]:
                self._drop_reservation(key)
                self._dirty_pods.add(key)
        if self._all_pods_dirty:
            self.ledger.clear()
            self._source_users.clear()
            self._pod_sources.clear()
            self._dirty_pods = set(self.kind("Pod")) | set(self.reserved)
            self._all_pods_dirty = False
        if self._dirty_pods:
            for key in self._dirty_pods:
                try:
                    contribution = self._contribution(key)
                except ValueError as exc:  # an unreadable quantity: count nothing, keep serving
                    log.warning("pod %s is not counted: %s", key, exc)
                    contribution = None
                self.ledger.put(key, contribution)
            self._dirty_pods.clear()
            self._view = None
        if self._view is None:
            self._view = self._compute_fairness()
        return self._view

    def _contribution(self, key: str) -> Contribution | None:
        pod = self.kind("Pod").get(key) or self.reserved_pods.get(key)
        self._track_sources(key, pod)
        if pod is None or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            return None
        amounts = self.pod_resources(key, pod)
        bucket: Bucket = "none"
        if self.pod_node(key, pod) or key in self.reserved:
            bucket = "allocated"
        elif self.is_pending(key, pod):
            bucket = "requested"
        demand = self.pod_demand(pod) if "gpu" in amounts else None
        return Contribution(queue=pod_queue(pod), bucket=bucket, amounts=amounts, demand=demand)

    def _track_sources(self, key: str, pod: Mapping[str, Any] | None) -> None:
        """Remember which claims and templates a pod's vector was read from."""
        for source in self._pod_sources.pop(key, set()):
            _discard(self._source_users, source, key)
        if pod is None:
            return
        namespace = str(meta(pod).get("namespace", ""))
        sources = set()
        for ref in pod_claim_refs(pod):
            if ref.claim:
                sources.add(f"ResourceClaim:{namespace}/{ref.claim}")
            if ref.template:
                sources.add(f"ResourceClaimTemplate:{namespace}/{ref.template}")
        for source in sources:
            self._source_users.setdefault(source, set()).add(key)
        self._pod_sources[key] = sources

    def _compute_fairness(self) -> FairnessView:
        specs: dict[str, QueueSpec] = {}
        invalid: dict[str, str] = {}
        for key, obj in self.kind("Queue").items():
            try:
                specs[key] = parse_queue(obj)
            except QueueSpecError as exc:
                invalid[key] = str(exc)
        # Pods without a queue label go to the default queue, which need not be declared.
        specs.setdefault(DEFAULT_QUEUE, QueueSpec(name=DEFAULT_QUEUE))
        usage = self.ledger.usage(specs)
        capacity = self.capacity()
        spec_list = tuple(specs.values())
        return FairnessView(
            specs=spec_list,
            invalid=invalid,
            usage=usage,
            capacity=capacity,
            fair_shares=compute_fair_shares(spec_list, usage, capacity),
            pending_pods=self.ledger.pending_pods(),
            mix=self.ledger.mix(),
        )

    def capacity(self) -> dict[str, float]:
        if self._capacity is None:
            self._capacity = self._compute_capacity()
        return dict(self._capacity)

    def _compute_capacity(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for device in self.devices.values():
            _add(totals, gpu_amounts(device.model, 1.0))
        for node in self.kind("Node").values():
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            classic = parse_quantity(allocatable.get(CLASSIC_GPU_RESOURCE, 0))
            model = str((meta(node).get("labels") or {}).get(CLASSIC_MODEL_LABEL, ""))
            _add(
                totals,
                {
                    "cpu": parse_quantity(allocatable.get("cpu", 0)),
                    "memory": parse_quantity(allocatable.get("memory", 0)),
                },
            )
            if classic:
                _add(totals, gpu_amounts(model, classic))
        return {r: a for r, a in totals.items() if a > 0}


class ClusterWatcher:
    """Keeps a ClusterState current: list then watch every kind, relist on 410, retry on errors."""

    def __init__(
        self, api: ApiClient, state: ClusterState, watch_timeout_s: int = 300, retry_delay_s: float = 1.0
    ) -> None:
        self.api = api
        self.state = state
        self.watch_timeout_s = watch_timeout_s
        self.retry_delay_s = retry_delay_s
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(kind, path), name=f"watch-{kind}")
            for kind, path in WATCHED_KINDS.items()
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _list(self, kind: str, path: str) -> str:
        items: list[JsonObject] = []
        query = {"limit": "500"}
        while True:
            page = await request(self.api, "GET", path, query=query)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
            query = {"limit": "500", "continue": token}
        self.state.replace(kind, items)
        return str((page.get("metadata") or {}).get("resourceVersion", ""))

    async def _run(self, kind: str, path: str) -> None:
        version = ""
        delay = self.retry_delay_s
        while True:
            try:
                if not version:
                    version = await self._list(kind, path)
                    log.info("listed %s: %d objects", kind, len(self.state.kind(kind)))
                version = await self._watch(kind, path, version)
                delay = self.retry_delay_s
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.status == 404 and kind == "Queue":
                    # The Queue CRD is not installed: no queues, check again later.
                    self.state.replace(kind, [])
                if exc.status == 410:
                    version = ""
                    continue
                log.warning("watch %s failed: %s; retrying in %.1fs", kind, exc, delay)
            except Exception as exc:  # any transport error: reconnect, keep the picture
                log.warning("watch %s broke: %r; retrying in %.1fs", kind, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _watch(self, kind: str, path: str, version: str) -> str:
        """Follow one watch to its end; returns the version to resume from ('' forces a relist)."""
        query = {
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        async for event in watch_lines(self.api, path, query):
            version = apply_watch_event(self.state, kind, event, version)
            if not version:
                log.info("watch %s expired (410 Gone); relisting", kind)
                return ""
        return version


def apply_watch_event(state: ClusterState, kind: str, event: Mapping[str, Any], version: str) -> str:
    """Apply one watch event; returns the resourceVersion to resume from, '' when it expired (410).

    Bookmarks only move the version on; an ERROR event other than 410 raises KubeError.
    """
    event_type, obj = str(event.get("type")), event.get("object") or {}
    if event_type == "ERROR":
        if obj.get("code") == 410:
            return ""
        raise KubeError(int(obj.get("code") or 500), str(obj.get("message")))
    if event_type != "BOOKMARK":
        state.apply(kind, event_type, dict(obj))
    return str(meta(obj).get("resourceVersion", version))
