"""The GPU inventory: which GPUs exist, who holds them, and what is free on each node.

Devices come from the ResourceSlices of the GPU drivers (whole GPUs only: MIG partitions and
other device types add no capacity; a partition is charged its share of its GPU, and a
partitionable GPU - whole GPU and MIG placements consuming one counter set, KEP-4815 - holding an
allocated placement is that share used), holders from the allocations in ResourceClaims, classic
`nvidia.com/gpu` supply from Node allocatable minus the pods bound there. The inventory also
knows where each pod runs: its `spec.nodeName`, or the node the binder just bound it to before
the watch says so (an *assumed* bind).

It answers the hot path's questions - a node's supply (`node_gpus`: free share per GPU, and free
CPU and memory - allocatable minus the requests of the pods there, as kube-scheduler counts them -
built by placement's `node_supply` as the simulator's nodes are; cached per node until a slice,
claim, node or pod there changes), the memory of its GPUs, cluster capacity - and tells its
listeners which pods' accounting a change moved (None: every pod).
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, replace
from itertools import compress
from operator import not_
from typing import Any, cast

from contract.kube import mapping, meta, object_key, sequence
from contract.names import (
    CLASSIC_GPU_RESOURCE,
    CLASSIC_MODEL_LABEL,
    COMPUTE_SLICES_COUNTER,
    DEVICE_TYPE_ATTRIBUTE,
    GPU_MILLI,
    MEMORY_CAPACITY,
    MIG_COMPUTE_SLICES,
    MODEL_ATTRIBUTE,
)
from contract.quantity import parse_quantity
from extender.claims import allocated_devices, fraction_milli
from extender.picture.demands import PodDemands, claim_names, is_terminal
from extender.picture.store import ObjectStore, Stored
from extender.policy.admission import add_amounts, gpu_amounts
from extender.policy.placement import (
    DomainMap,
    GpuDemand,
    NodeGpus,
    WorkloadMix,
    domain_shape,
    host_cpu_milli,
    host_memory_mib,
    node_supply,
)
from extender.policy.snapshot import occupy

log = logging.getLogger(__name__)

DeviceKey = tuple[str, str, str]  # (driver, pool, device name)
CounterSetKey = tuple[str, str, str]  # (driver, pool, counter set name)


@dataclass(frozen=True)
class Hold:
    """GPUs on a node kept for one pending pod (reclaim freed them for it).

    A reclaim hold names the devices its plan freed (`gpus`: each GPU's index and the thousandths
    kept there): only those shares are kept from other pods. A hold without them (a gang's slot,
    consolidation's) keeps `demand` wherever the placement would put it on the node."""

    node: str
    demand: GpuDemand
    expires: float  # time.monotonic()
    owner: str = ""  # a workload whose members may all use it ("": only the pod it is held for)
    gpus: tuple[tuple[int, int], ...] = ()  # (GPU index on the node, thousandths kept)
    queue: str = ""  # a queue whose pods may all use it (the rest of a freed GPU: reclaim's rule 11)


_NO_MIX = WorkloadMix(demands=())
_MIG_SLICES = re.compile(r"^([1-7])g\.")


@dataclass(frozen=True, slots=True)
class GpuDevice:
    node: str
    model: str
    memory_bytes: int
    index: int = 0  # position among its node's GPUs (the order of NodeGpus.free_milli)


def _string_attribute(attributes: Mapping[str, Any], driver: str, name: str, default: str) -> str:
    """A device attribute, written bare or qualified with the driver's domain."""
    value = mapping(attributes.get(name) or attributes.get(f"{driver}/{name}"))
    return str(value.get("string", default))


def _compute_slices(device: Mapping[str, Any], driver: str, pool: str) -> tuple[CounterSetKey, int] | None:
    """The counter set a device consumes from and its compute slices there (None: no counters)."""
    for consumption in sequence(device.get("consumesCounters")):
        consumption = mapping(consumption)
        value = mapping(mapping(consumption.get("counters")).get(COMPUTE_SLICES_COUNTER)).get("value")
        with suppress(ValueError):
            if value is not None:
                return (driver, pool, str(consumption.get("counterSet", ""))), int(parse_quantity(value))
    return None


def _discard(index: dict[str, dict[str, None]], key: str, member: str) -> None:
    """Remove `member` from the members at `key`, and the key with its last member."""
    members = index.get(key)
    if members is not None:
        members.pop(member, None)
        if not members:
            del index[key]


def _keep(supply: NodeGpus, gpus: tuple[tuple[int, int], ...], host: GpuDemand) -> NodeGpus:
    """`supply` less the held shares of these GPUs, and the CPU and memory `host` names where
    the node tracks them (as much as is free: a victim may still be terminating). A share its
    GPU cannot give (still held by a terminating victim, or taken by another pod: the DRA
    allocator chose the devices, and may have put another held pod there) is kept on the free
    GPU that fits it most tightly instead, so the hold keeps as much on the node as it was made
    for, whichever devices the pods were given."""
    free = list(supply.free_milli)
    short: list[int] = []
    for index, milli in gpus:
        if 0 <= index < len(free):
            taken = min(free[index], milli)
            free[index] -= taken
            if taken < milli:
                short.append(milli - taken)
    for milli in sorted(short, reverse=True):
        fitting = [index for index, left in enumerate(free) if left >= milli]
        if fitting:
            tightest = min(fitting, key=lambda index: (free[index], index))
            free[tightest] -= milli
    if not supply.host_tracked:
        return replace(supply, free_milli=tuple(free))
    return replace(
        supply,
        free_milli=tuple(free),
        cpu_free_milli=supply.cpu_free_milli - min(max(supply.cpu_free_milli, 0), host.cpu_milli),
        memory_free_mib=supply.memory_free_mib - min(max(supply.memory_free_mib, 0), host.memory_mib),
    )


def _shared_with(hold: Hold, owner: str, queue: str) -> bool:
    """Whether a pod of workload `owner` in `queue` may use a hold kept for another pod."""
    return bool((owner and hold.owner == owner) or (queue and hold.queue == queue))


def _allocatable(node: Mapping[str, Any], resource: str) -> float:
    return parse_quantity(mapping(mapping(node.get("status")).get("allocatable")).get(resource, 0))


def _host(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """A node's allocatable CPU milli and memory MiB (None when it reports neither: untracked)."""
    allocatable = mapping(mapping(node.get("status")).get("allocatable"))
    if "cpu" not in allocatable or "memory" not in allocatable:
        return None
    cpu, memory = _allocatable(node, "cpu"), _allocatable(node, "memory")
    return host_cpu_milli(cpu, request=False), host_memory_mib(memory, request=False)


@dataclass(frozen=True)
class CandidateKinds:
    """The candidates of a request by kind: nodes alike to placement, judged and scored once."""

    names: list[str]  # the candidates, in the request's order
    kinds: list[str]  # each one's kind
    one_of_kind: dict[str, str]  # kind -> a node of that kind
    supply_of: dict[str, NodeGpus]  # kind -> its free GPUs, CPU and memory
    held: bool = False  # some kinds are nodes with GPUs held (what this pod may use there)

    def keeping(self, reasons: list[str], reason_of: Mapping[str, str]) -> CandidateKinds:
        """Only the candidates whose verdict is '' (`reasons`: each one's; `reason_of`: each kind's)."""
        fits = list(map(not_, reasons))
        return CandidateKinds(
            list(compress(self.names, fits)),
            list(compress(self.kinds, fits)),
            {kind: name for kind, name in self.one_of_kind.items() if not reason_of[kind]},
            {kind: supply for kind, supply in self.supply_of.items() if not reason_of[kind]},
            self.held,
        )


NO_CANDIDATES = CandidateKinds([], [], {}, {})


@dataclass(frozen=True)
class PodNodes:
    """What the inventory answers about the nodes a pod the filter judges may use, asked at once
    (`GpuInventory.pod_nodes`)."""

    version: int  # the inventory's version the rest was read at (`GpuInventory.version`)
    hold: Hold | None  # the GPUs held for the pod
    candidates: CandidateKinds
    gpu_memory: Mapping[str, int]  # node -> the memory of its GPUs (`GpuInventory.gpu_memory`)


class GpuInventory:
    def __init__(
        self, store: ObjectStore, demands: PodDemands, gpu_drivers: frozenset[str], domains: DomainMap
    ) -> None:
        self.store = store
        self.demands = demands
        self.gpu_drivers = gpu_drivers
        # Node -> its topology domain (`PictureConfig.domains`): the gang planners' map, and part
        # of each node's kind, so nodes of one shape in two domains are not merged.
        self.domains = domains
        self.devices: dict[DeviceKey, GpuDevice] = {}
        # MIG partitions: not GPUs of their own (no capacity, not in NodeGpus), but a claim holding
        # one holds a share of its GPU: `memory_bytes` carries that share in thousandths here.
        self.partitions: dict[DeviceKey, GpuDevice] = {}
        # Partitionable GPUs: the counter set a whole GPU consumes all of, and the placements
        # consuming from each set (a held one makes its share of that GPU used).
        self.whole_gpu_sets: dict[DeviceKey, CounterSetKey] = {}
        self.set_placements: dict[CounterSetKey, dict[DeviceKey, None]] = {}
        self.node_devices: dict[str, list[DeviceKey]] = {}
        # Memory of a node's (first) GPU, which sizes fractional demands there.
        self.gpu_memory: dict[str, int] = {}
        # Device -> claim key -> consumed memory (None: the whole device).
        self.device_holders: dict[DeviceKey, dict[str, int | None]] = {}
        # Claim key -> (pods sharing it, its allocated devices with their consumed memory), read
        # once per claim version: accounting and snapshots ask for it per pod.
        self.claim_allocations: dict[str, tuple[int, tuple[tuple[DeviceKey, int | None], ...]]] = {}
        # Pods the binder bound before the watch showed it: pod key -> node.
        self.assumed_nodes: dict[str, str] = {}
        # Node -> its pods' keys (a dict as an ordered set: 464 bytes for 20 pods, a set 2264).
        self.pods_by_node: dict[str, dict[str, None]] = {}
        # GPU devices per (model, memory). Pending fractions are sized against the largest GPU of
        # their models, so only a change of which sizes exist recounts every pod.
        self._gpu_sizes: Counter[tuple[str, int]] = Counter()
        self._memory_by_models: dict[frozenset[str], int] = {}
        self._sizes: tuple[int, ...] | None = None  # `gpu_sizes`, until a size appears or goes
        self._node_gpus: dict[str, NodeGpus] = {}
        # Each cached node's kind: its shape (with its domain) and GPU memory in one string
        # (`kinds_for`).
        self._node_kinds: dict[str, str | None] = {}
        self._capacity: dict[str, float] | None = None
        # Holds by node, then pod key: reclaim's freed GPUs, kept for the pod they were freed for.
        self.holds: dict[str, dict[str, Hold]] = {}
        # Moves whenever a node's supply or kind may have changed, or a hold was made or let go:
        # what was read of the nodes at one version is still true while it has not moved.
        self.version = 0
        self.listeners: list[Callable[[Iterable[str] | None], None]] = []  # None: every pod
        store.subscribe("ResourceSlice", self._slice_changed)
        store.subscribe("ResourceClaim", self._claim_changed)
        store.subscribe("Node", self._node_changed, self._nodes_relisted)
        store.subscribe("Pod", self._pod_changed, self._pods_relisted)

    # ---- questions ---------------------------------------------------------------------------

    def node_gpus(self, name: str) -> NodeGpus:
        """Free share of each GPU of a node: DRA devices minus claim allocations, plus classic GPUs."""
        cached = self._node_gpus.get(name)
        if cached is None:
            cached = self._compute_node_gpus(name)
            # Only nodes the picture knows are cached: a request naming millions of made-up
            # nodes must not grow memory.
            if name in self.node_devices or self.store.get("Node", name) is not None:
                # Keyed by the interned name: one string object per node, not the copy of whichever
                # request asked after the node last changed. Requests look thousands of names up,
                # and keys scattered over the heap that many times over miss the CPU's cache.
                name = sys.intern(name)
                self._node_gpus[name] = cached
                self._node_kinds[name] = self._kind(name, cached)
        return cached

    def _kind(self, name: str, supply: NodeGpus) -> str:
        # Interned: thousands of nodes share a few kinds, and one string object per kind stays in
        # the CPU's cache and compares by identity where thousands of copies would not.
        return sys.intern(f"{domain_shape(supply, self.domains)} {self.gpu_memory.get(name, 0)}")

    def kinds_for(self, names: Sequence[str]) -> list[str]:
        """Each node's kind: its shape and the memory of its GPUs, all that the filter and the
        scores read of a node, and its domain where it has one. Nodes of one kind get one verdict
        and one score, and a large cluster has few kinds; the names of one request are looked up
        by `map`, in C, as there are thousands."""
        kinds: list[str | None] = list(map(self._node_kinds.get, names))
        if not all(kinds):  # nodes changed since last asked (a few), or unknown: find them in C
            position = -1
            with suppress(ValueError):
                while True:
                    position = kinds.index(None, position + 1)
                    name = names[position]
                    kinds[position] = self._kind(name, self.node_gpus(name))
        return cast(list[str], kinds)

    def candidates(self, key: str, names: list[str], owner: str = "", queue: str = "") -> CandidateKinds:
        """The candidates' kinds for pod `key` (of workload `owner`, in `queue`). A node with GPUs
        held for some pod is a kind of its own: its supply is what this pod may use there
        (`supply_for`)."""
        kinds = self.kinds_for(names)
        held = self.held_among(names)
        if held:
            kind_of = dict(zip(names, kinds, strict=True))
            kind_of.update((name, f"held {name}") for name in held)
            kinds = list(map(kind_of.__getitem__, names))
        one_of_kind = dict(zip(kinds, names, strict=True))
        supplies = self.supplies_for(key, one_of_kind.values(), owner, queue)
        supply_of = dict(zip(one_of_kind, supplies, strict=True))
        return CandidateKinds(names, kinds, one_of_kind, supply_of, bool(held))

    def held_among(self, names: Iterable[str]) -> set[str]:
        """The nodes among `names` where GPUs are held for some pod."""
        return self.holds.keys() & set(names) if self.holds else set()

    def supplies_for(
        self, key: str, names: Iterable[str], owner: str = "", queue: str = ""
    ) -> list[NodeGpus]:
        """`supply_for` of many nodes: the hot path's form (one lookup per node without holds)."""
        cached = self._node_gpus.get
        supplies = [cached(name) or self.node_gpus(name) for name in names]
        if self.holds:
            supplies = [
                self.supply_for(key, supply.name, owner, queue) if supply.name in self.holds else supply
                for supply in supplies
            ]
        return supplies

    def supply_for(self, key: str, name: str, owner: str = "", queue: str = "") -> NodeGpus:
        """A node's free GPUs as pod `key` (of workload `owner`, in `queue`) may use them: minus
        what is held for other pods, workloads and queues.

        A hold that names its GPUs keeps their shares (all that is free of each, up to the share,
        while its victims are still terminating). One that does not and cannot be placed yet keeps
        the whole node: nothing else may take GPUs there until the pod it is for has them.
        """
        supply = self.node_gpus(name)
        on_node = self.holds.get(name)
        if not on_node:
            return supply
        now = time.monotonic()
        for holder, hold in list(on_node.items()):
            if hold.expires < now:
                self.release_hold(holder)
            elif holder != key and not _shared_with(hold, owner, queue):
                if hold.gpus:
                    supply = _keep(supply, hold.gpus, hold.demand)
                    continue
                occupied = occupy(supply, hold.demand, _NO_MIX)
                if occupied is None:
                    return replace(supply, free_milli=(0,) * len(supply.free_milli))
                supply = occupied[0]
        return supply

    def hold(
        self,
        key: str,
        node: str,
        demand: GpuDemand,
        ttl_s: float,
        owner: str = "",
        gpus: tuple[tuple[int, int], ...] = (),
        queue: str = "",
    ) -> None:
        """Keep GPUs on `node` for pod `key` (or for any pod of `queue`) for `ttl_s`: the shares of
        `gpus` when named, else `demand` wherever it fits there (see `Hold`)."""
        self.release_hold(key)
        self.version += 1
        expires = time.monotonic() + ttl_s
        self.holds.setdefault(node, {})[key] = Hold(node, demand, expires, owner, gpus, queue)

    def release_hold(self, key: str) -> None:
        for node, on_node in list(self.holds.items()):
            if on_node.pop(key, None) is not None:
                self.version += 1
                if not on_node:
                    del self.holds[node]

    def held_for(self, key: str) -> Hold | None:
        return next((on_node[key] for on_node in self.holds.values() if key in on_node), None)

    def pod_node(self, key: str, pod: Mapping[str, Any]) -> str:
        return str(mapping(pod.get("spec")).get("nodeName") or self.assumed_nodes.get(key, ""))

    def pods_on_node(self, node: str) -> list[Stored]:
        pods = self.store.kind("Pod")
        return [pods[key] for key in self.pods_by_node.get(node, ()) if not is_terminal(pods[key])]

    def reference_memory(self, models: frozenset[str]) -> int:
        """Memory of the largest GPU a pending fractional request could land on."""
        if models not in self._memory_by_models:
            self._memory_by_models[models] = max(
                (d.memory_bytes for d in self.devices.values() if not models or d.model in models), default=0
            )
        return self._memory_by_models[models]

    def gpu_sizes(self) -> tuple[int, ...]:
        """The memory sizes of the cluster's GPUs, smallest first: every size a node's GPUs are
        (`gpu_memory`), so every size a fraction may be sized at."""
        if self._sizes is None:
            self._sizes = tuple(sorted({memory for _, memory in self._gpu_sizes}))
        return self._sizes

    def pod_nodes(self, key: str, names: list[str], owner: str, queue: str, wants_gpu: bool) -> PodNodes:
        """What the filter reads of the inventory about pod `key` (of workload `owner`, in
        `queue`) on the candidates `names`: their kinds (`candidates`; none for a pod that wants
        no GPU), the GPUs held for it, each node's GPU size, and the version all that is true at."""
        version, hold = self.version, self.held_for(key)
        nodes = self.candidates(key, names, owner, queue) if wants_gpu else NO_CANDIDATES
        return PodNodes(version, hold, nodes, self.gpu_memory)

    def held_devices(self, namespace: str, claims: Iterable[str]) -> list[tuple[DeviceKey, GpuDevice, float]]:
        """GPU devices the named claims of a namespace hold, with the thousandths each pod takes.

        A MIG partition counts as its share of its GPU (it adds no capacity of its own). A claim
        shared by several pods (time-slicing) is charged once, split evenly among them.
        """
        held: list[tuple[DeviceKey, GpuDevice, float]] = []
        for name in claims:
            allocation = self.claim_allocations.get(f"{namespace}/{name}")
            if allocation is None:
                continue
            consumers, devices = allocation
            for key, consumed in devices:
                device = self.devices.get(key) or self.partitions.get(key)
                if device is None:
                    continue
                # A partition's share, in thousandths, is its memory_bytes.
                milli = device.memory_bytes if key in self.partitions else _holder_milli(consumed, device)
                held.append((key, device, milli / consumers))
        return held

    def classic_model(self, node_name: str) -> str:
        node = self.store.get("Node", node_name)
        return str(mapping(meta(node).get("labels")).get(CLASSIC_MODEL_LABEL, "")) if node else ""

    def node_model(self, node_name: str) -> str:
        """The one GPU model a node has ("" for none or several): what a pod bound there holds
        while its claims' allocation has not reached the picture yet."""
        models = {self.devices[key].model for key in self.node_devices.get(node_name, [])}
        return next(iter(models)) if len(models) == 1 else ""

    def capacity(self) -> dict[str, float]:
        if self._capacity is None:
            self._capacity = self._compute_capacity()
        return dict(self._capacity)

    # ---- derivations -------------------------------------------------------------------------

    def unaccounted_shares(self, node: str) -> tuple[tuple[int, int], ...]:
        """(GPU index, thousandths) of the node's GPUs held by claims of no pod counted on the
        node: claims the scheduler allocated before their pod's bind reached the picture, and
        claims whose pod finished or is gone and that are not deallocated yet. No pod of the node
        holds those shares; a hold naming them is not taken (`extender.policy.reclaim.lost_holds`)."""
        accounted = {
            f"{meta(pod).get('namespace', '')}/{claim}"
            for pod in self.pods_on_node(node)
            for claim in claim_names(pod)
        }
        shares = []
        for key in self.node_devices.get(node, []):
            device = self.devices[key]
            milli = sum(
                _holder_milli(consumed, device)
                for claim, consumed in self.device_holders.get(key, {}).items()
                if claim not in accounted
            )
            if milli:
                shares.append((device.index, min(GPU_MILLI, milli)))
        return tuple(shares)

    def _device_used_milli(self, key: DeviceKey, device: GpuDevice) -> int:
        held = sum(_holder_milli(consumed, device) for consumed in self.device_holders.get(key, {}).values())
        counter_set = self.whole_gpu_sets.get(key)
        if counter_set is not None:  # its allocated MIG placements
            held += sum(
                self.partitions[placement].memory_bytes
                for placement in self.set_placements.get(counter_set, {})
                if placement in self.partitions and self.device_holders.get(placement)
            )
        return min(GPU_MILLI, held)

    def _forget_node(self, name: str) -> None:
        """The node's supply changed: derive it again when next asked. Its kind is blanked in
        place: the table keeps its order and its key objects (see `node_gpus`)."""
        if not name:
            return  # (a pod on no node)
        self.version += 1
        self._node_gpus.pop(name, None)
        if name in self._node_kinds:
            self._node_kinds[name] = None

    def _compute_node_gpus(self, name: str) -> NodeGpus:
        free: list[int] = []
        model = ""
        for key in self.node_devices.get(name, []):
            device = self.devices[key]
            model = model or device.model
            free.append(max(0, GPU_MILLI - self._device_used_milli(key, device)))
        node = self.store.get("Node", name)
        if node is None:
            return node_supply(name, model, free, None)
        pods = [self.demands.of(p) for p in self.pods_on_node(name)]
        classic_total = int(_allocatable(node, CLASSIC_GPU_RESOURCE))
        if classic_total:
            model = model or self.classic_model(name)
            used = sum(demand.classic_gpus for demand in pods)
            free.extend([GPU_MILLI] * max(0, classic_total - used) + [0] * min(used, classic_total))
        return node_supply(name, model, free, _host(node), (demand.placement_at(0) for demand in pods))

    def _compute_capacity(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for device in self.devices.values():
            add_amounts(totals, gpu_amounts(device.model, 1.0))
        for name, node in self.store.kind("Node").items():
            add_amounts(totals, {"cpu": _allocatable(node, "cpu"), "memory": _allocatable(node, "memory")})
            classic = _allocatable(node, CLASSIC_GPU_RESOURCE)
            if classic:
                add_amounts(totals, gpu_amounts(self.classic_model(name), classic))
        return {r: a for r, a in totals.items() if a > 0}

    def _slice_devices(
        self, slice_obj: Mapping[str, Any]
    ) -> tuple[
        list[tuple[DeviceKey, GpuDevice]],
        list[tuple[DeviceKey, GpuDevice]],
        dict[DeviceKey, tuple[CounterSetKey, int]],
    ]:
        """The whole GPUs of a slice, its MIG partitions (with their share of their GPU), and the
        counter set each device consuming counters consumes from."""
        spec = mapping(slice_obj.get("spec"))
        driver, node = str(spec.get("driver", "")), spec.get("nodeName")
        if driver not in self.gpu_drivers or not node:
            return [], [], {}
        pool = str(mapping(spec.get("pool")).get("name", ""))
        gpus: list[tuple[DeviceKey, GpuDevice]] = []
        partitions: list[tuple[DeviceKey, str, int, str]] = []  # key, model, memory, MIG profile
        counted: dict[DeviceKey, tuple[CounterSetKey, int]] = {}  # devices consuming counters
        for device in sequence(spec.get("devices")):
            device = mapping(device)
            attributes = mapping(device.get("attributes"))
            kind = _string_attribute(attributes, driver, DEVICE_TYPE_ATTRIBUTE, "gpu")
            model = _string_attribute(attributes, driver, MODEL_ATTRIBUTE, "")
            memory = self._memory(slice_obj, device)
            key = (driver, pool, str(device.get("name")))
            counters = _compute_slices(device, driver, pool)
            if counters is not None:
                counted[key] = counters
            if kind == "gpu":
                gpus.append((key, GpuDevice(str(node), model, memory)))
            elif kind == "mig":
                partitions.append((key, model, memory, _string_attribute(attributes, driver, "profile", "")))
        whole = {gpu.model: gpu.memory_bytes for _, gpu in gpus}
        shares = [
            (
                key,
                GpuDevice(
                    str(node),
                    model,
                    self._placement_milli(counted[key])
                    if key in counted
                    else self._partition_milli(model, memory, profile, whole),
                    -1,
                ),
            )
            for key, model, memory, profile in partitions
        ]
        return gpus, shares, counted

    @staticmethod
    def _placement_milli(counters: tuple[CounterSetKey, int]) -> int:
        """A MIG placement's share of its partitionable GPU: its compute slices of the 7."""
        return min(GPU_MILLI, round(GPU_MILLI * counters[1] / MIG_COMPUTE_SLICES))

    def _partition_milli(self, model: str, memory: int, profile: str, beside: Mapping[str, int]) -> int:
        """A MIG partition's share of its GPU: its memory over a whole GPU's of the model where one
        is known (in the same slice or the cluster), else its compute slices of the 7 an A100 or
        H100 has (profile "<n>g.<m>gb"), else a whole GPU."""
        whole = beside.get(model) or (self.reference_memory(frozenset({model})) if model else 0)
        if whole and memory:
            return fraction_milli(memory, whole)
        slices = _MIG_SLICES.match(profile)
        return min(GPU_MILLI, round(GPU_MILLI * int(slices.group(1)) / 7)) if slices else GPU_MILLI

    @staticmethod
    def _memory(slice_obj: Mapping[str, Any], device: Mapping[str, Any]) -> int:
        memory_text = mapping(mapping(device.get("capacity")).get(MEMORY_CAPACITY)).get("value", 0)
        try:
            return int(parse_quantity(memory_text))
        except ValueError:
            log.warning(
                "slice %s: device %s has a bad memory capacity %r",
                object_key(slice_obj),
                device.get("name"),
                memory_text,
            )
            return 0

    # ---- keeping in step ---------------------------------------------------------------------

    def _notify(self, keys: Iterable[str] | None) -> None:
        for listener in self.listeners:
            listener(keys)

    def _holders_changed(self, key: DeviceKey) -> None:
        """Pods whose claims hold a device that appeared or went are recounted."""
        for claim in self.device_holders.get(key, {}):
            self._notify(self.demands.users_of("ResourceClaim", claim))

    def _slice_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self._capacity = None
        touched: set[str] = set()
        for obj, sign in ((old, -1), (new, 1)):
            if obj is None:
                continue
            gpus, partitions, counted = self._slice_devices(obj)
            for device_key, device in partitions:
                touched.add(device.node)
                if sign > 0:
                    self.partitions[device_key] = device
                    if device_key in counted:
                        self.set_placements.setdefault(counted[device_key][0], {})[device_key] = None
                else:
                    self.partitions.pop(device_key, None)
                    placements = (
                        self.set_placements.get(counted[device_key][0]) if device_key in counted else None
                    )
                    if placements is not None:
                        placements.pop(device_key, None)
                        if not placements:
                            del self.set_placements[counted[device_key][0]]
                self._holders_changed(device_key)
            for device_key, device in gpus:
                touched.add(device.node)
                if sign > 0:
                    self.devices[device_key] = device
                    self.node_devices.setdefault(device.node, []).append(device_key)
                    if device_key in counted:
                        self.whole_gpu_sets[device_key] = counted[device_key][0]
                else:
                    self.devices.pop(device_key, None)
                    self.whole_gpu_sets.pop(device_key, None)
                    keys = self.node_devices.get(device.node, [])
                    if device_key in keys:
                        keys.remove(device_key)
                    if not keys:
                        self.node_devices.pop(device.node, None)
                self._count_size(device, sign)
                self._holders_changed(device_key)
        for node in touched:
            self._forget_node(node)
            self._reindex_node(node)
            self._notify(list(self.pods_by_node.get(node, ())))  # they may count the node's model

    def _reindex_node(self, node: str) -> None:
        """Number a node's GPUs in order and note their memory."""
        keys = self.node_devices.get(node)
        if not keys:
            self.gpu_memory.pop(node, None)
            return
        for index, key in enumerate(keys):
            device = self.devices[key]
            if device.index != index:
                self.devices[key] = GpuDevice(device.node, device.model, device.memory_bytes, index)
        self.gpu_memory[node] = self.devices[keys[0]].memory_bytes

    def _count_size(self, device: GpuDevice, sign: int) -> None:
        size = (device.model, device.memory_bytes)
        before = self._gpu_sizes[size]
        self._gpu_sizes[size] = before + sign
        if self._gpu_sizes[size] <= 0:
            del self._gpu_sizes[size]
        if (before == 0) != (size not in self._gpu_sizes):  # a size appeared or went
            self._memory_by_models.clear()
            self._sizes = None
            self._notify(None)

    def _claim_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self.claim_allocations.pop(key, None)
        # (One key tuple per device held, shared by both indexes.)
        devices = tuple(
            ((d.driver, d.pool, d.device), d.consumed_memory) for d in allocated_devices(new or {})
        )
        if devices and new is not None:
            consumers = sum(
                1
                for ref in sequence(mapping(new.get("status")).get("reservedFor"))
                if mapping(ref).get("resource") == "pods"
            )
            self.claim_allocations[key] = (max(1, consumers), devices)
        if old is not None:
            for held in allocated_devices(old):
                device_key = (held.driver, held.pool, held.device)
                holders = self.device_holders.get(device_key, {})
                holders.pop(key, None)
                if not holders:
                    self.device_holders.pop(device_key, None)
                self._drop_node_of(device_key)
        for device_key, consumed in devices:
            self.device_holders.setdefault(device_key, {})[key] = consumed
            self._drop_node_of(device_key)

    def _drop_node_of(self, device_key: DeviceKey) -> None:
        # A MIG placement's holders change its GPU's supply too.
        device = self.devices.get(device_key) or self.partitions.get(device_key)
        if device is not None:
            self._forget_node(device.node)

    def _node_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        # Allocatable feeds capacity; the GPU model label feeds its classic-GPU pods.
        self._capacity = None
        self._forget_node(key)
        if new is None:
            self._node_kinds.pop(key, None)
        self._notify(list(self.pods_by_node.get(key, ())))

    def _nodes_relisted(self, keys: set[str]) -> None:
        """Index the listed nodes' kinds (computed when first asked), keyed by copies of their
        names made one after the other: the table requests read thousands of names from then
        sits in contiguous memory, not scattered over the objects the list was decoded into.
        """
        names = "\n".join(sorted(keys)).split("\n") if keys else []
        self._node_kinds = dict.fromkeys(names)
        self.version += 1

    def _pod_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        # A pod's CPU and memory (and classic GPUs) count on its node: that node's supply moves.
        if old is not None:
            node = self.pod_node(key, old)
            _discard(self.pods_by_node, node, key)
            self._forget_node(node)
        if new is None or mapping(new.get("spec")).get("nodeName"):
            self.assumed_nodes.pop(key, None)
            if self.holds:
                self.release_hold(key)  # bound (or gone): what was held for it is its own now
        if new is not None:
            node = self.pod_node(key, new)
            if node:
                self.pods_by_node.setdefault(node, {})[key] = None
                self._forget_node(node)

    def _pods_relisted(self, keys: set[str]) -> None:
        self.assumed_nodes = {k: n for k, n in self.assumed_nodes.items() if k in keys}

    def assume(self, key: str, node: str) -> None:
        """The binder bound pod `key` to `node`: count it there before the watch says so."""
        pod = self.store.get("Pod", key)
        if pod is not None:
            self._pod_changed(key, pod, None)
        self.assumed_nodes[key] = node
        if pod is not None:
            self._pod_changed(key, None, pod)


def _holder_milli(consumed: int | None, device: GpuDevice) -> int:
    """Thousandths of a whole GPU one claim holds: all of it, or the memory it consumes."""
    return GPU_MILLI if consumed is None else fraction_milli(consumed, device.memory_bytes)
