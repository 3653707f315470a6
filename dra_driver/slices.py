"""Publish the node's devices as ResourceSlices (resource.k8s.io/v1) and keep them current.

Two halves:
- pure builders (``build_devices``, ``build_slices``): GPUs in, ResourceSlice dicts out, no I/O;
  each device carries the common attributes and the ones its profile's discovery gave it;
- ``SliceReconciler``: detects whether the cluster supports consumable capacity, publishes at
  start, republishes (with a pool generation bump) when the inventory or a device's health
  changes (discovery reports MIG instances made or destroyed as changes too), or soon after
  ``request_republish`` (the preparer made, destroyed or found MIG instances, and its records
  say so: requests coalesce, at most one publish per ``REPUBLISH_MIN_INTERVAL_S``), and deletes
  this node's stale slices.

Sharing modes. With consumable capacity (DRAConsumableCapacity) every whole GPU allows multiple
allocations and carries two capacities: ``memory`` (a quantity such as ``80Gi``) whose request
policy defaults to the whole memory, so a plain request takes the whole GPU and a request for 10Gi
takes a slice; and
``compute`` (thousandths of the GPU) whose default is 0, so a memory-only request reserves no
compute share and the node side derives the thread share from the memory share. Without the
feature, GPUs are published as whole devices; sharing is then a ResourceClaim referenced by
several pods (time-slicing).

Partitionable MIG (DRAPartitionableDevices). A GPU in MIG mode whose placements are known
(``Gpu.mig_layout``) publishes one counter set (``gpu-<minor>``: ``memory-slice-0`` ..
``memory-slice-7`` of 1 each, ``compute-slices`` of 7) and, as devices consuming from it, the
whole GPU (every counter: it is prepared as the full-size instance) and each MIG profile placement
(the memory slices it covers and its compute slices). The scheduler allocates a device only when
its counters are still free, so two placements that overlap, or a placement and the whole GPU,
are never allocated together. An instance someone else made there is published as a device
consuming its placement's counters, and the placements overlapping it (the whole GPU among them)
are not published: the scheduler subtracts only allocated devices' counters. The reconciler is
handed what of the inventory to publish (``published``: the driver's own instances left out).
Counter sets and devices go in separate slices of the pool (the API
allows one or the other in a slice; at most 8 counter sets in one, and 64 devices once any
consumes counters). Without the feature such a GPU publishes its existing MIG devices, as every
GPU in MIG mode did before.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

from contract.names import COMPUTE_CAPACITY, COMPUTE_SLICES_COUNTER, GPU_MILLI, MEMORY_CAPACITY
from dra_driver.config import API_TIMEOUT_S
from dra_driver.devices.attributes import string_attribute
from dra_driver.devices.model import DeviceAttribute, Gpu, MigDevice, MigLayout, MigPlacement
from dra_driver.devices.naming import (
    counter_set_name,
    gpu_device_name,
    mig_device_name,
    placement_device_name,
    published_memory,
)
from dra_driver.devices.profile import Discovery

log = logging.getLogger(__name__)

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_TAINTED_SLICE = 64  # the API's lower limit once any device has taints or counters
MAX_COUNTER_SETS_PER_SLICE = 8  # measured on kube-apiserver v1.37.2, as the limits below
MAX_COUNTERS_PER_SET = 32
MAX_COUNTER_SETS_PER_DEVICE = 2
_MIB = 1 << 20
_MAX_NAME = 253
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "tessera-dra-driver"
RESYNC_INTERVAL_S = 300.0
# The least time between two publishes asked for by ``request_republish``: every MIG prepare and
# unprepare asks (a kubelet retrying a refused prepare at each retry), and each republish reads
# the inventory and the API.
REPUBLISH_MIN_INTERVAL_S = 5.0

TaintEffect = Literal["NoSchedule", "NoExecute", "None"]

SLICE_PUBLISHES = Counter(
    "tessera_dra_slice_publishes_total", "ResourceSlice pool publications (generation bumps)"
)
PUBLISHED_DEVICES = Gauge("tessera_dra_published_devices", "Devices in the published pool", ["state"])


class SharingMode(StrEnum):
    CONSUMABLE_CAPACITY = "consumable-capacity"
    WHOLE_DEVICE = "whole-device"


@dataclass(frozen=True)
class NodeRef:
    """The Node the pool belongs to; an empty uid publishes without an owner reference."""

    name: str
    uid: str = ""


def normalized_pci_bus_id(pci_bus_id: str) -> str:
    """NVML pads the PCI domain to 8 digits; the standard attribute uses the sysfs form."""
    return pci_bus_id.lower()[-12:]


def taint_value(message: str) -> str:
    """A health message squeezed into a label value (what a taint value must be)."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", message)[:63]
    return value.strip("-._")


def _gpu_attributes(gpu: Gpu) -> dict[str, DeviceAttribute]:
    attributes: dict[str, DeviceAttribute] = {
        "type": string_attribute("gpu"),
        "uuid": string_attribute(gpu.uuid),
        "index": {"int": gpu.index},
        "minor": {"int": gpu.minor},
        "productName": string_attribute(gpu.product_name),
        **gpu.attributes,
        "resource.kubernetes.io/pciBusID": string_attribute(normalized_pci_bus_id(gpu.pci_bus_id)),
    }
    if gpu.pcie_root:
        attributes["resource.kubernetes.io/pcieRoot"] = string_attribute(gpu.pcie_root)
    return attributes


def _taints(gpu: Gpu, driver: str, effect: TaintEffect) -> list[dict[str, str]]:
    if gpu.healthy:
        return []
    taint = {"key": f"{driver}/unhealthy", "effect": effect}
    value = taint_value(gpu.health_message)
    if value:
        taint["value"] = value
    return [taint]


def memory_quantity(size: int) -> str:
    """Bytes as the Kubernetes quantity that reads best in ``kubectl describe``: whole GiB
    ("80Gi"), else whole MiB ("15104Mi"), else plain bytes."""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", _MIB)):
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _whole_gpu_device(gpu: Gpu, driver: str, mode: SharingMode, effect: TaintEffect) -> dict[str, Any]:
    memory = memory_quantity(published_memory(gpu))
    device: dict[str, Any] = {"name": gpu_device_name(gpu), "attributes": _gpu_attributes(gpu)}
    if mode is SharingMode.CONSUMABLE_CAPACITY:
        device["allowMultipleAllocations"] = True
        device["capacity"] = {
            MEMORY_CAPACITY: {
                "value": memory,
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": memory_quantity(_MIB), "step": memory_quantity(_MIB)},
                },
            },
            COMPUTE_CAPACITY: {
                "value": str(GPU_MILLI),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(GPU_MILLI), "step": "1"},
                },
            },
        }
    else:
        device["capacity"] = {MEMORY_CAPACITY: {"value": memory}}
    taints = _taints(gpu, driver, effect)
    if taints:
        device["taints"] = taints
    return device


def _mig_device(gpu: Gpu, mig: MigDevice, driver: str, effect: TaintEffect) -> dict[str, Any]:
    attributes = _gpu_attributes(gpu)
    attributes.update(
        {
            "type": string_attribute("mig"),
            "uuid": string_attribute(mig.uuid),
            "parentUUID": string_attribute(gpu.uuid),
            "profile": string_attribute(mig.profile),
            "gpuInstance": {"int": mig.gi},
            "computeInstance": {"int": mig.ci},
        }
    )
    device: dict[str, Any] = {
        "name": mig_device_name(gpu, mig),
        "attributes": attributes,
        "capacity": {MEMORY_CAPACITY: {"value": memory_quantity(mig.memory_bytes)}},
    }
    taints = _taints(gpu, driver, effect)
    if taints:
        device["taints"] = taints
    return device


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def placement_counters(layout: MigLayout, placement: MigPlacement) -> dict[str, dict[str, str]]:
    """What a placement consumes of its GPU's counter set: each memory slice it covers, and its
    compute slices."""
    counters = {
        memory_slice_counter(index): {"value": "1"}
        for index in range(placement.start, placement.start + placement.memory_slices)
    }
    counters[COMPUTE_SLICES_COUNTER] = {"value": str(placement.compute_slices)}
    return counters


def counter_set(gpu: Gpu, layout: MigLayout) -> dict[str, Any]:
    counters = {memory_slice_counter(index): {"value": "1"} for index in range(layout.memory_slices)}
    counters[COMPUTE_SLICES_COUNTER] = {"value": str(layout.compute_slices)}
    return {"name": counter_set_name(gpu), "counters": counters}


def _memory_slices(placement: MigPlacement) -> set[int]:
    return set(range(placement.start, placement.start + placement.memory_slices))


def _consuming(
    device: dict[str, Any], gpu: Gpu, layout: MigLayout, placement: MigPlacement
) -> dict[str, Any]:
    """The device with its placement's attributes and the counters it consumes."""
    device["attributes"]["placementStart"] = {"int": placement.start}
    device["attributes"]["computeSlices"] = {"int": placement.compute_slices}
    device["consumesCounters"] = [
        {"counterSet": counter_set_name(gpu), "counters": placement_counters(layout, placement)}
    ]
    return device


def _partitionable_devices(
    gpu: Gpu, layout: MigLayout, driver: str, effect: TaintEffect
) -> list[dict[str, Any]]:
    """The whole GPU and every smaller placement, each consuming its counters of the GPU's set.

    Instances someone else made (``gpu.mig_devices``; the driver's own are left out by the
    caller) are published as they are, consuming their placement's counters, and no placement
    overlapping one is published, the whole GPU included: the scheduler subtracts the counters of
    allocated devices only, so an idle instance's would not keep an overlapping placement from
    being allocated (and its create from failing). An instance whose placement is unknown leaves
    nothing else to publish on its GPU."""
    existing: list[tuple[MigDevice, MigPlacement]] = []
    for mig in gpu.mig_devices:
        found = layout.placement(mig.profile, mig.placement_start)
        if found is None:
            return [_mig_device(gpu, mig, driver, effect) for mig in gpu.mig_devices]
        existing.append((mig, found))
    taken = {index for _, found in existing for index in _memory_slices(found)}
    whole = layout.full
    taints = _taints(gpu, driver, effect)
    devices: list[dict[str, Any]] = []
    for placement in (whole, *(p for p in layout.placements if p != whole)):
        if taken & _memory_slices(placement):
            continue
        attributes = _gpu_attributes(gpu)
        if placement == whole:
            name = gpu_device_name(gpu)
            memory = published_memory(gpu)
        else:
            name = placement_device_name(gpu, placement)
            memory = placement.memory_bytes
            # The MIG device's uuid exists only once prepare has made it.
            del attributes["uuid"]
            attributes.update(
                {
                    "type": string_attribute("mig"),
                    "parentUUID": string_attribute(gpu.uuid),
                    "profile": string_attribute(placement.profile),
                }
            )
        device: dict[str, Any] = {
            "name": name,
            "attributes": attributes,
            "capacity": {MEMORY_CAPACITY: {"value": memory_quantity(memory)}},
        }
        if taints:
            device["taints"] = taints
        devices.append(_consuming(device, gpu, layout, placement))
    for mig, found in existing:
        devices.append(_consuming(_mig_device(gpu, mig, driver, effect), gpu, layout, found))
    return devices


def build_devices(
    gpus: Iterable[Gpu],
    driver: str,
    mode: SharingMode,
    taint_effect: TaintEffect = "NoSchedule",
    partitionable: bool = False,
) -> list[dict[str, Any]]:
    """Devices for the pool: whole GPUs, or for a GPU in MIG mode its MIG devices (never the GPU
    itself: work cannot run outside its instances); with ``partitionable``, a GPU in MIG mode with
    known placements publishes the whole GPU and every placement, consuming its counters."""
    devices: list[dict[str, Any]] = []
    for gpu in sorted(gpus, key=lambda g: g.minor):
        if partitionable and gpu.mig_layout is not None:
            devices.extend(_partitionable_devices(gpu, gpu.mig_layout, driver, taint_effect))
        elif gpu.mig_enabled:
            devices.extend(_mig_device(gpu, mig, driver, taint_effect) for mig in gpu.mig_devices)
        else:
            devices.append(_whole_gpu_device(gpu, driver, mode, taint_effect))
    return devices


def build_counter_sets(gpus: Iterable[Gpu], partitionable: bool) -> list[dict[str, Any]]:
    """One counter set per partitionable GPU (none unless ``partitionable``)."""
    if not partitionable:
        return []
    return [
        counter_set(gpu, gpu.mig_layout)
        for gpu in sorted(gpus, key=lambda g: g.minor)
        if gpu.mig_layout is not None
    ]


def chunk_devices(devices: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split devices into slices within the per-slice limit (lower when a slice holds taints or
    devices consuming counters)."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    current_tainted = False
    for device in devices:
        tainted = current_tainted or _limited(device)
        limit = MAX_DEVICES_PER_TAINTED_SLICE if tainted else MAX_DEVICES_PER_SLICE
        if len(current) + 1 > limit:
            chunks.append(current)
            current, tainted = [], _limited(device)
        current.append(device)
        current_tainted = tainted
    if current or not chunks:
        chunks.append(current)
    return chunks


def _limited(device: Mapping[str, Any]) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def slice_name(node: str, driver: str, index: int) -> str:
    """Deterministic per node, driver and position, so republishing updates objects in place."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(f"{node}/{driver}".encode()).hexdigest()[:10]
    return f"{node[: _MAX_NAME - len(digest) - 12]}-{digest}-{index}"


def build_slices(
    node: NodeRef,
    driver: str,
    gpus: Iterable[Gpu],
    mode: SharingMode,
    generation: int,
    taint_effect: TaintEffect = "NoSchedule",
    partitionable: bool = False,
) -> list[dict[str, Any]]:
    """The complete pool for one node: ResourceSlice objects ready to create or replace; the
    counter sets' slices first, then the devices'.

    A node without GPUs still publishes one empty slice, so the pool (and its generation) exists.
    """
    gpus = list(gpus)
    sets = build_counter_sets(gpus, partitionable)
    contents: list[tuple[str, list[dict[str, Any]]]] = [
        ("sharedCounters", sets[start : start + MAX_COUNTER_SETS_PER_SLICE])
        for start in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
    ]
    contents += [
        ("devices", chunk)
        for chunk in chunk_devices(build_devices(gpus, driver, mode, taint_effect, partitionable))
    ]
    metadata_extra: dict[str, Any] = {}
    if node.uid:
        metadata_extra["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
        ]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node.name, driver, index),
                "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                **metadata_extra,
            },
            "spec": {
                "driver": driver,
                "nodeName": node.name,
                "pool": {"name": node.name, "generation": generation, "resourceSliceCount": len(contents)},
                field_name: items,
            },
        }
        for index, (field_name, items) in enumerate(contents)
    ]


async def read_json(call: Awaitable[Any], timeout_s: float = API_TIMEOUT_S) -> dict[str, Any]:
    """Await a raw (``_preload_content=False``) client call; the dict, or ApiException on non-2xx,
    or TimeoutError when the whole exchange takes longer than ``timeout_s``.

    Raw JSON keeps every field the apiserver returned, including ones the generated models lack.
    """
    async with asyncio.timeout(timeout_s):
        response = await call
        try:
            body = await response.read()
            status = int(response.status)
            reason = str(response.reason)
        finally:
            response.release()
    if not 200 <= status < 300:
        error = ApiException(status=status, reason=reason)
        error.body = body.decode(errors="replace")
        raise error
    result: dict[str, Any] = json.loads(body)
    return result


def _probe_slice(
    node: str, driver: str, probe: str, slice_count: int, device: dict[str, Any]
) -> dict[str, Any]:
    """A dry-run slice of one device named "probe", in a pool of its own (`probe`: what it
    probes, in its names) that says it has `slice_count` slices."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{probe}-probe"[:_MAX_NAME]},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": f"{node}-{probe}-probe", "generation": 0, "resourceSliceCount": slice_count},
            "devices": [{"name": "probe", **device}],
        },
    }


def _capacity_probe_slice(node: str, driver: str) -> dict[str, Any]:
    memory = memory_quantity(_MIB)
    device = {
        "allowMultipleAllocations": True,
        "capacity": {MEMORY_CAPACITY: {"value": memory, "requestPolicy": {"default": memory}}},
    }
    return _probe_slice(node, driver, "capability", 1, device)


def _partition_probe_slice(node: str, driver: str) -> dict[str, Any]:
    device = {
        "consumesCounters": [{"counterSet": "probe", "counters": {memory_slice_counter(0): {"value": "1"}}}]
    }
    return _probe_slice(node, driver, "partition", 2, device)


def _comparable(slices: Sequence[Mapping[str, Any]]) -> list[Any]:
    """What decides whether a republish is needed: everything except the pool generation."""
    return [
        (
            s["metadata"]["name"],
            s["metadata"].get("ownerReferences"),
            s["spec"].get("devices"),
            s["spec"].get("sharedCounters"),
            s["spec"]["pool"]["resourceSliceCount"],
        )
        for s in slices
    ]


class SliceReconciler:
    """Owns this node's ResourceSlices for one driver name."""

    def __init__(
        self,
        api: client.ApiClient,
        node_name: str,
        driver: str,
        discovery: Discovery,
        mode: SharingMode | None = None,
        taint_effect: TaintEffect = "NoSchedule",
        partitionable: bool | None = None,
        published: Callable[[Sequence[Gpu]], Sequence[Gpu]] | None = None,
    ) -> None:
        # What of the inventory is published: the caller leaves out the MIG instances the driver
        # made itself (it knows them from its records); by default all of it.
        self._published_gpus = published or (lambda gpus: gpus)
        # Typed Any: bodies go in as plain dicts and come back raw, bypassing the generated models.
        self._resource: Any = client.ResourceV1Api(api)
        self._core = client.CoreV1Api(api)
        self._node_name = node_name
        self._driver = driver
        self._discovery = discovery
        self._taint_effect = taint_effect
        self.mode = mode
        self.partitionable = partitionable  # None: probed at the first publish
        self.generation = 0
        self._published: list[Any] | None = None
        self._lock = asyncio.Lock()
        # Set by the first publish that succeeds (written, or found current): the pool in the API
        # is this driver's view from then on.
        self.published_once = asyncio.Event()
        self._republish_requested = asyncio.Event()
        self._last_requested_publish = -math.inf  # time.monotonic() of the last one

    def request_republish(self, reason: str) -> None:
        """Publish again soon from a fresh inventory and the records on disk (``run`` does;
        requests made before it begins its publish are served by that one). Call it on the
        event loop, once what the publish should see is written."""
        if not self._republish_requested.is_set():
            log.debug("republishing the slices soon: %s", reason)
            self._republish_requested.set()

    async def detect_sharing_mode(self) -> SharingMode:
        """Dry-run a slice with a shareable device: the apiserver drops fields whose feature is off."""
        device = await self._echoed_device(
            _capacity_probe_slice(self._node_name, self._driver),
            "consumable-capacity",
            "publishing whole GPUs only",
        )
        if device is None:
            return SharingMode.WHOLE_DEVICE
        if device.get("allowMultipleAllocations") is True:
            log.info("cluster supports consumable capacity: publishing shareable GPUs with memory/compute")
            return SharingMode.CONSUMABLE_CAPACITY
        log.info("cluster lacks consumable capacity: publishing whole GPUs (share by shared claims)")
        return SharingMode.WHOLE_DEVICE

    async def detect_partitionable(self) -> bool:
        """Dry-run a device consuming counters: an apiserver without DRAPartitionableDevices drops
        ``consumesCounters``; then GPUs in MIG mode publish their existing MIG devices only."""
        device = await self._echoed_device(
            _partition_probe_slice(self._node_name, self._driver),
            "partitionable-devices",
            "MIG devices published as they exist",
        )
        if device is None:
            return False
        if device.get("consumesCounters"):
            log.info("cluster supports partitionable devices: MIG partitions are made on demand")
            return True
        log.info("cluster lacks partitionable devices: MIG devices published as they exist (static)")
        return False

    async def _echoed_device(
        self, probe: dict[str, Any], feature: str, fallback: str
    ) -> dict[str, Any] | None:
        """The first device of `probe` as the apiserver echoes a dry-run create of it (what it keeps
        of the fields a feature gate serves); None, logged with `fallback`, when it refuses."""
        try:
            echoed = await read_json(
                self._resource.create_resource_slice(body=probe, dry_run="All", _preload_content=False)
            )
        except ApiException as exc:
            log.warning("%s probe rejected (%s %s); %s", feature, exc.status, exc.reason, fallback)
            return None
        device: dict[str, Any] = (echoed.get("spec", {}).get("devices") or [{}])[0]
        return device

    async def _node_ref(self) -> NodeRef:
        try:
            async with asyncio.timeout(API_TIMEOUT_S):  # past it: TimeoutError, retried by the caller
                node = await self._core.read_node(self._node_name)
        except ApiException as exc:
            log.warning(
                "cannot read Node %s (%s); slices get no owner reference", self._node_name, exc.status
            )
            return NodeRef(self._node_name)
        return NodeRef(self._node_name, str(node.metadata.uid))

    async def _existing(self) -> dict[str, dict[str, Any]]:
        """This node's slices for this driver, by name."""
        listed = await read_json(
            self._resource.list_resource_slice(
                field_selector=f"spec.nodeName={self._node_name},spec.driver={self._driver}",
                _preload_content=False,
            )
        )
        return {item["metadata"]["name"]: item for item in listed.get("items", [])}

    async def publish(self, gpus: Sequence[Gpu]) -> bool:
        """Write the pool for ``gpus`` if it differs from what was last published; True if written."""
        gpus = self._published_gpus(gpus)  # before any await: see _publish_with_retry
        async with self._lock:
            if self.mode is None:
                self.mode = await self.detect_sharing_mode()
            if self.partitionable is None:
                self.partitionable = await self.detect_partitionable()
            existing = await self._existing()
            if self.generation == 0:
                # Continue after whatever a previous run of this driver left behind.
                self.generation = max((s["spec"]["pool"]["generation"] for s in existing.values()), default=0)
            node = await self._node_ref()
            desired = build_slices(
                node,
                self._driver,
                gpus,
                self.mode,
                self.generation + 1,
                self._taint_effect,
                self.partitionable,
            )
            wanted_names = {s["metadata"]["name"] for s in desired}
            in_place = existing.keys() == wanted_names and all(
                s["spec"]["pool"]["generation"] == self.generation for s in existing.values()
            )
            if in_place and self._published == _comparable(desired):
                self.published_once.set()
                return False
            self.generation += 1
            for wanted in desired:
                name = wanted["metadata"]["name"]
                if name in existing:
                    wanted["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                    await read_json(
                        self._resource.replace_resource_slice(name, body=wanted, _preload_content=False)
                    )
                else:
                    await read_json(self._resource.create_resource_slice(body=wanted, _preload_content=False))
            # Stale slices go last, so consumers never see the pool shrink before it is complete.
            for name in existing.keys() - wanted_names:
                await self._delete(name)
            self._published = _comparable(desired)
            self._record(gpus, desired)
            self.published_once.set()
            return True

    def _record(self, gpus: Sequence[Gpu], desired: Sequence[Mapping[str, Any]]) -> None:
        SLICE_PUBLISHES.inc()
        healthy = sum(1 for gpu in gpus if gpu.healthy)
        PUBLISHED_DEVICES.labels("healthy").set(healthy)
        PUBLISHED_DEVICES.labels("unhealthy").set(len(gpus) - healthy)
        log.info(
            "published pool %s generation %d: %d slice(s), %d device(s), mode %s",
            self._node_name,
            self.generation,
            len(desired),
            sum(len(s["spec"].get("devices", ())) for s in desired),
            self.mode,
        )

    async def _delete(self, name: str) -> None:
        try:
            await read_json(self._resource.delete_resource_slice(name, _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise
        log.info("deleted stale ResourceSlice %s", name)

    async def delete_all(self) -> None:
        """Remove every slice of this node and driver (used when the driver is uninstalled)."""
        async with self._lock:
            for name in await self._existing():
                await self._delete(name)
            self._published = None

    async def run(
        self,
        resync_s: float = RESYNC_INTERVAL_S,
        start_after: asyncio.Event | None = None,
        min_interval_s: float = REPUBLISH_MIN_INTERVAL_S,
    ) -> None:
        """Publish once ``start_after`` is set (at once without it), then on every inventory or
        health change, until cancelled.

        The first publish waits for ``start_after`` with nothing read: what is published depends
        on state the event's setter may change (the driver's recovery rewrites the checkpoint,
        which tells its own MIG instances, and destroys instances a crash left), so the first
        inventory is read after it. Until then the slices a previous run left stay as they are.
        Every ``resync_s`` without a change the pool is checked against the API too, so slices
        deleted or left behind by someone else are repaired. A ``request_republish`` is served
        like a resync, from an inventory read after the request, once ``min_interval_s`` has
        passed since the last one it served. API errors are logged and retried with back-off,
        never fatal.
        """
        changes = self._discovery.watch_health()  # before the first read: no change slips between
        if start_after is not None:
            await start_after.wait()
        # Tasks, not wait_for: a timeout must not cancel (and so end) the change iterator.
        next_change: asyncio.Future[list[Gpu]] = asyncio.ensure_future(anext(changes))
        requested = asyncio.ensure_future(self._republish_requested.wait())
        try:
            while True:
                await self._publish_with_retry()
                waiting: set[asyncio.Future[Any]] = {next_change, requested}
                done, _ = await asyncio.wait(waiting, timeout=resync_s, return_when=asyncio.FIRST_COMPLETED)
                if requested in done and next_change not in done:
                    # Held back by the rate limit, not past a change: that is published meanwhile.
                    hold = min_interval_s - (time.monotonic() - self._last_requested_publish)
                    if hold > 0:
                        log.debug(
                            "a republish asked for is held back %.1f s (at most one per %g s)",
                            hold,
                            min_interval_s,
                        )
                        changed, _ = await asyncio.wait({next_change}, timeout=hold)
                        done |= changed
                if next_change in done:  # a request still pending is served next time round
                    next_change.result()  # the change is read again with the records, below
                    next_change = asyncio.ensure_future(anext(changes))
                    continue
                if requested in done:
                    # Cleared before the inventory is read: a later request gets a later publish.
                    self._republish_requested.clear()
                    requested = asyncio.ensure_future(self._republish_requested.wait())
                    self._last_requested_publish = time.monotonic()
        finally:
            next_change.cancel()
            requested.cancel()

    async def _publish_with_retry(self, attempts: int = 5) -> None:
        """Publish the inventory as it is now, read at each attempt in the same turn of the event
        loop as ``publish`` reads the driver's records (no await between): a MIG instance the
        driver destroys is gone from the inventory before its record goes (the destroy returns
        on this loop first), so no listing of it meets the records without its claim and
        publishes it as someone else's, as one read earlier (the change's own, or before a
        retry's back-off) could."""
        delay = 1.0
        for attempt in range(1, attempts + 1):
            try:
                await self.publish(self._discovery.inventory())
                return
            except (ApiException, OSError) as exc:
                log.warning("publishing slices failed (attempt %d/%d): %s", attempt, attempts, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        log.error("giving up publishing this inventory; the next change retries")
