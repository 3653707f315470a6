"""Pod demands: what each pod asks for, parsed once per version of the pod and of its claims.

A pod's demand is read from its spec (containers' cpu and memory, `nvidia.com/gpu`, queue label,
priority) and from its ResourceClaims - or their templates while a generated claim is not there
yet - through the GPU DeviceClasses. A pod without a queue label goes to its Namespace's default
queue (`extender.admission.resolve_queue`); a change of that label recounts the namespace's pods.
Watch events for a pod are frequent (status, conditions, annotations) while its demand rarely
changes, so the parse is cached by the pod's resourceVersion and dropped only when the pod, one of
its claims or templates, a DeviceClass or its Namespace's default queue changes.
`users_of` answers which pods read a given claim or template, so a claim event recounts only them.

Pods outside Tessera: a pod addressed to a scheduler that is not one of Tessera's (`outside`:
`default-scheduler`, say) never passed Tessera's admission, yet a GPU of Tessera's DeviceClass
that the other scheduler's DRA allocator gives it is as taken as any other. It is charged to its
Namespace's default queue (label `scheduling.tessera.dev/default-queue`, else `default`), never to
the queue its own label names: the label is what admission reads, and this pod skipped admission.
A pod asking `nvidia.com/gpu` on a node without a device plugin is served through the DeviceClass's
`extendedResourceName`: kube-scheduler makes a claim for it, named in the pod's
`status.extendedResourceClaimStatus` (not in `spec.resourceClaims`); once that claim is known, its
requests are the pod's GPUs, and its `nvidia.com/gpu` no classic GPUs.

Memory: the cache is one entry per stored pod, made when the pod arrives (under the store's own
key string) and holding its demand once parsed. A demand says nothing that is the pod's own -
which claims it names is read from the pod again (`claim_names`) - so equal demands (the pods of
one template, each with claims of its own) share one `PodDemand` object and its cached GPU and
placement demands, instead of one each (~1.5 KB a pod); a claim read by one pod (the usual case)
notes that pod's key alone, a set only when several read it. Pods by namespace are not indexed: a
Namespace's default queue changes rarely, and then its pods are found among the stored keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from typing import Any

from contract.kube import mapping, meta, object_key, pod_claim_refs
from contract.names import GPU_MILLI, NAMESPACE_QUEUE_LABEL, PREEMPTIBLE_LABEL
from extender.admission import QueueChoice, resolve_queue
from extender.claims import (
    GpuRequest,
    claim_gpu_requests,
    device_class_gpu_models,
    pod_classic_gpus,
    pod_resource_request,
    to_gpu_demand,
)
from extender.memo import remembered
from extender.picture.store import ObjectStore, Stored
from extender.policy.placement import GpuDemand, host_cpu_milli, host_memory_mib, placement_demand

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
# Distinct demands remembered for sharing; past this the table starts over.
_SHARED_LIMIT = 4096
# Request pods the store does not hold whose demands are kept (a few scheduling cycles' worth).
_UNSTORED_LIMIT = 256
Source = tuple[str, str]  # (kind, namespace/name) of a claim or template a pod reads
# Placement demands equal in value are one object, whichever pod's demand (of whichever queue)
# made them: the placement caches, keyed by them, then match by identity instead of comparing
# fields (pods of a thousand queues ask for a few shapes).
_PLACEMENTS: dict[GpuDemand, GpuDemand] = {}


def is_terminal(pod: Mapping[str, Any]) -> bool:
    phase = mapping(pod.get("status")).get("phase")
    return isinstance(phase, str) and phase in TERMINAL_PHASES


def pod_created(pod: Mapping[str, Any]) -> float:
    """Seconds since the epoch of a pod's creation (whole seconds; 0 when unknown)."""
    return _timestamp(meta(pod).get("creationTimestamp"))


def pod_started(pod: Mapping[str, Any]) -> float:
    """Seconds since the epoch of a pod's start (its creation until the kubelet says; 0: unknown)."""
    return _timestamp(mapping(pod.get("status")).get("startTime") or meta(pod).get("creationTimestamp"))


def _timestamp(text: object) -> float:
    """Seconds since the epoch of a Kubernetes timestamp (0 when absent or unreadable)."""
    return _parse_timestamp(text) if isinstance(text, str) else 0.0


@lru_cache(maxsize=4096)
def _parse_timestamp(text: str) -> float:
    # Cached: the planners read every waiting pod's creation time each cycle; pods created in
    # the same second share the text.
    try:
        moment = datetime.fromisoformat(text)  # RFC 3339, parsed in C
    except ValueError:
        return 0.0
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@dataclass(frozen=True)
class PodDemand:
    """Everything the policies read of one pod's spec and claims (not where it runs)."""

    queue: str
    namespace: str
    cpu: float  # cores
    memory: float  # bytes
    classic_gpus: int
    gpu_requests: tuple[GpuRequest, ...]
    # Names its queue, by its label or its Namespace's default (a pod without GPUs that names none
    # is not ours).
    labelled: bool
    priority: int = 0
    # May reclaim and preemption evict it (and may it therefore use more than its queue's quota)?
    preemptible: bool = True
    # Why the pod cannot be read (e.g. a quantity no real amount has): it then asks for nothing,
    # counts nothing, and only its own requests are refused.
    problem: str = ""
    # Addressed to a scheduler that is not Tessera's: it bypasses queue ordering (its namespace's
    # default queue is charged with what it holds).
    outside: bool = False
    # GPU demand per GPU memory size it is sized against (fractions are relative to it).
    _by_memory: dict[int, GpuDemand | None] = field(default_factory=dict, compare=False, repr=False)
    _placement: dict[int, GpuDemand] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def models(self) -> frozenset[str]:
        return frozenset().union(*(r.models for r in self.gpu_requests))

    @cached_property
    def wants_gpu(self) -> bool:
        return self.classic_gpus > 0 or any(r.count for r in self.gpu_requests)

    @cached_property
    def fractional(self) -> bool:
        """One slice of one GPU: its share depends on the size of the GPU it lands on."""
        return (
            self.classic_gpus == 0
            and len(self.gpu_requests) == 1
            and self.gpu_requests[0].count == 1
            and bool(self.gpu_requests[0].memory_bytes)
        )

    def gpus_at(self, device_memory: int) -> GpuDemand | None:
        """The placement demand on GPUs of `device_memory` bytes (None: no GPU)."""
        if device_memory not in self._by_memory:
            self._by_memory[device_memory] = to_gpu_demand(
                self.gpu_requests, self.classic_gpus, device_memory
            )
        return self._by_memory[device_memory]

    def placement_at(self, device_memory: int) -> GpuDemand:
        """What placement ranks on GPUs of `device_memory` bytes: its GPUs (count 0: none) with
        its CPU and memory requests - the simulator's demand of the same pod."""
        cached = self._placement.get(device_memory)
        if cached is None:
            fresh = placement_demand(
                self.gpus_at(device_memory), host_cpu_milli(self.cpu), host_memory_mib(self.memory)
            )
            cached = self._placement[device_memory] = remembered(
                _PLACEMENTS, fresh, _SHARED_LIMIT, lambda: fresh
            )
        return cached

    def gpu_amount_at(self, device_memory: int) -> float:
        """GPUs this pod takes on GPUs of that size (a fraction counts as its share)."""
        demand = self.gpus_at(device_memory)
        return demand.count * demand.milli / GPU_MILLI if demand is not None else 0.0


def extended_resource_claim(pod: Mapping[str, Any]) -> str:
    """The claim kube-scheduler made for the pod's extended resources (`nvidia.com/gpu` served by
    a DeviceClass's `extendedResourceName`); "" when there is none."""
    status = pod.get("status")
    if not status:
        return ""
    name = mapping(mapping(status).get("extendedResourceClaimStatus")).get("resourceClaimName")
    return name if isinstance(name, str) else ""


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The claims a pod uses that exist by name (a template's claim once it was generated, and
    the claim made for its extended resources)."""
    extended = extended_resource_claim(pod)
    if not mapping(pod.get("spec")).get("resourceClaims"):
        return [extended] if extended else []  # (most pods: no need to read their claims' statuses)
    names = [ref.claim for ref in pod_claim_refs(pod) if ref.claim]
    return [*names, extended] if extended else names


def _demand_inputs(pod: Stored) -> tuple[object, ...]:
    """All `PodDemands._read` reads of the pod itself (its claims, templates, classes and namespace
    have events of their own)."""
    metadata, spec = meta(pod), mapping(pod.get("spec"))
    return (
        metadata.get("namespace"),
        metadata.get("labels"),
        spec.get("priority"),
        spec.get("containers"),
        spec.get("initContainers"),
        spec.get("resourceClaims"),
        spec.get("schedulerName"),
        mapping(pod.get("status")).get("resourceClaimStatuses"),
        extended_resource_claim(pod),
    )


def _sources(pod: Mapping[str, Any]) -> set[Source]:
    """The claims and templates a pod reads (none when its claim references cannot be read)."""
    namespace = str(meta(pod).get("namespace", ""))
    sources: set[Source] = set()
    try:
        refs = pod_claim_refs(pod)
    except (ValueError, TypeError, AttributeError, KeyError):  # untrusted JSON
        return sources
    for ref in refs:
        if ref.claim:
            sources.add(("ResourceClaim", f"{namespace}/{ref.claim}"))
        if ref.template:
            sources.add(("ResourceClaimTemplate", f"{namespace}/{ref.template}"))
    extended = extended_resource_claim(pod)
    if extended:
        sources.add(("ResourceClaim", f"{namespace}/{extended}"))
    return sources


class PodDemands:
    """The demand cache over a store; `changed(keys)` is told which pods' demands moved."""

    def __init__(
        self,
        store: ObjectStore,
        gpu_drivers: frozenset[str],
        non_preemptible_priority: int = 100,
        scheduler_names: frozenset[str] = frozenset(),
    ) -> None:
        self.store = store
        self.gpu_drivers = gpu_drivers
        self.non_preemptible_priority = non_preemptible_priority
        # Tessera's schedulers: a pod addressed to another is `outside` (empty: none is).
        self.scheduler_names = scheduler_names
        # GPU DeviceClass name -> the models it pins (empty: any model).
        self.gpu_classes: dict[str, frozenset[str]] = {}
        # Stored pod key -> the demand of the version the store holds (None: not parsed since it came).
        self._cache: dict[str, PodDemand | None] = {}
        # Pods read from requests that the store does not hold at that version (the watch has
        # not delivered it yet, or never will: a test's pod): filter, prioritize and the
        # reservation of one scheduling cycle read the same version. Keyed by pod key and
        # version, emptied when any claim, template, class or namespace changes.
        self._unstored: dict[tuple[str, str], PodDemand] = {}
        self._shared: dict[PodDemand, PodDemand] = {}
        # Kind -> claim or template key -> the pods reading it (a key alone: one pod).
        self._users: dict[str, dict[str, str | set[str]]] = {
            "ResourceClaim": {},
            "ResourceClaimTemplate": {},
        }
        self.listeners: list[Callable[[Iterable[str] | None], None]] = []  # None: every pod
        store.subscribe("Pod", self._pod_changed)
        store.subscribe("ResourceClaim", self._source_changed("ResourceClaim"))
        store.subscribe("ResourceClaimTemplate", self._source_changed("ResourceClaimTemplate"))
        store.subscribe("DeviceClass", self._class_changed)
        store.subscribe("Namespace", self._namespace_changed)

    def is_outside(self, pod: Mapping[str, Any]) -> bool:
        """Addressed to a scheduler that is not one of Tessera's."""
        names = self.scheduler_names
        return bool(names) and mapping(pod.get("spec")).get("schedulerName", "default-scheduler") not in names

    def queue_of(self, pod: Mapping[str, Any]) -> QueueChoice:
        """The pod's queue: its label, else its Namespace's default queue, else the default (a pod
        outside Tessera: its Namespace's default queue, whatever its label says)."""
        namespace = self.store.get("Namespace", str(meta(pod).get("namespace", "")))
        return resolve_queue(
            {} if self.is_outside(pod) else mapping(meta(pod).get("labels")),
            (),
            mapping(meta(namespace).get("labels")) if namespace else None,
        )

    def of(self, pod: Mapping[str, Any]) -> PodDemand:
        """The demand of a pod (a stored one or one from a request); raises ValueError when unreadable."""
        key = object_key(pod)
        version = str(meta(pod).get("resourceVersion", ""))
        stored = self.store.get("Pod", key)
        held = stored is not None and (
            stored is pod or bool(version and meta(stored).get("resourceVersion") == version)
        )
        if held:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        elif version and (key, version) in self._unstored:
            return self._unstored[key, version]
        demand = self._parse(pod)
        if held and key in self._cache:
            # Cached only for the version the store holds: any event for the pod drops it.
            self._cache[key] = demand
        elif version and not held:
            if len(self._unstored) >= _UNSTORED_LIMIT:
                self._unstored.clear()
            self._unstored[key, version] = demand
        return demand

    def _parse(self, pod: Mapping[str, Any]) -> PodDemand:
        try:
            return self._read(pod)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:  # untrusted JSON
            choice = self.queue_of(pod)
            unreadable = PodDemand(
                queue=choice.queue,
                namespace=str(meta(pod).get("namespace", "")),
                cpu=0.0,
                memory=0.0,
                classic_gpus=0,
                gpu_requests=(),
                labelled=choice.source != "default",
                problem=str(exc),
                outside=self.is_outside(pod),
            )
            return unreadable

    def _read(self, pod: Mapping[str, Any]) -> PodDemand:
        namespace = str(meta(pod).get("namespace", ""))
        refs = pod_claim_refs(pod)
        requests: list[GpuRequest] = []
        for ref in refs:
            claim_key = f"{namespace}/{ref.claim}" if ref.claim else None
            template_key = f"{namespace}/{ref.template}" if ref.template else None
            # The claim when the picture has it; else its template (the claim's watch event may lag).
            claim = self.store.get("ResourceClaim", claim_key) if claim_key else None
            template = self.store.get("ResourceClaimTemplate", template_key) if template_key else None
            if claim is not None:
                claim_spec = mapping(claim.get("spec"))
            elif template is not None:
                claim_spec = mapping(mapping(template.get("spec")).get("spec"))
            else:
                continue
            requests.extend(claim_gpu_requests(claim_spec, self.gpu_classes))
        classic_gpus = pod_classic_gpus(pod)
        extended = extended_resource_claim(pod)
        claim = self.store.get("ResourceClaim", f"{namespace}/{extended}") if extended else None
        if claim is not None:  # its nvidia.com/gpu is served by this claim's devices, not a device plugin
            requests.extend(claim_gpu_requests(mapping(claim.get("spec")), self.gpu_classes))
            classic_gpus = 0
        labels = mapping(meta(pod).get("labels"))
        priority = int(mapping(pod.get("spec")).get("priority") or 0)
        said = str(labels.get(PREEMPTIBLE_LABEL, "")).lower()
        preemptible = (
            said == "true" if said in ("true", "false") else priority < self.non_preemptible_priority
        )
        choice = self.queue_of(pod)
        demand = PodDemand(
            queue=choice.queue,
            namespace=namespace,
            cpu=pod_resource_request(pod, "cpu"),
            memory=pod_resource_request(pod, "memory"),
            classic_gpus=classic_gpus,
            gpu_requests=tuple(requests),
            labelled=choice.source != "default",
            priority=priority,
            preemptible=preemptible,
            outside=self.is_outside(pod),
        )
        return remembered(self._shared, demand, _SHARED_LIMIT, lambda: demand)

    def users_of(self, kind: str, key: str) -> list[str]:
        """The stored pods that read claim or template `key` (kind ResourceClaim or ResourceClaimTemplate)."""
        users = self._users[kind].get(key)
        if users is None:
            return []
        return [users] if isinstance(users, str) else list(users)

    def _add_user(self, source: Source, pod: str) -> None:
        index = self._users[source[0]]
        users = index.get(source[1])
        if users is None:
            index[source[1]] = pod
        elif isinstance(users, set):
            users.add(pod)
        elif users != pod:
            index[source[1]] = {users, pod}

    def _drop_user(self, source: Source, pod: str) -> None:
        index = self._users[source[0]]
        users = index.get(source[1])
        if users == pod:
            del index[source[1]]
        elif isinstance(users, set):
            users.discard(pod)
            if len(users) == 1:
                index[source[1]] = users.pop()

    def _forget(self, key: str) -> None:
        """Drop a pod's parsed demand (its entry stays, with the store's key)."""
        if key in self._cache:
            self._cache[key] = None

    def _notify(self, keys: Iterable[str] | None) -> None:
        for listener in self.listeners:
            listener(keys)

    def _pod_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        if old is not None:
            for source in _sources(old):
                self._drop_user(source, key)
        if new is None:
            self._cache.pop(key, None)
            return
        # Most events of a pod (bound, started, its conditions) leave what its demand is read
        # from as it was: the demand read for the old object stands for the new one.
        if old is None or _demand_inputs(old) != _demand_inputs(new):
            self._cache[key] = None
        for source in _sources(new):
            self._add_user(source, key)

    def _source_changed(self, kind: str) -> Callable[[str, Stored | None, Stored | None], None]:
        def changed(key: str, old: Stored | None, new: Stored | None) -> None:
            self._unstored.clear()
            users = self.users_of(kind, key)
            # Demands read a claim's or template's spec only; its status (allocation, consumers)
            # changes several times per pod and leaves them as they were.
            if old is None or new is None or old.get("spec") != new.get("spec"):
                for user in users:
                    self._forget(user)
            # Pods that read it before it existed are found by their claim refs, so tell them too.
            self._notify(users)

        return changed

    def _namespace_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        default_before = mapping(meta(old).get("labels")).get(NAMESPACE_QUEUE_LABEL) if old else None
        default_now = mapping(meta(new).get("labels")).get(NAMESPACE_QUEUE_LABEL) if new else None
        if default_before == default_now:
            return
        self._unstored.clear()
        # Its pods without a label change queue: recount them (found by their keys, a rare event).
        prefix = f"{key}/"
        moved = [pod for pod in self.store.kind("Pod") if pod.startswith(prefix)]
        for pod in moved:
            self._forget(pod)
        self._notify(moved)

    def _class_changed(self, key: str, old: Stored | None, new: Stored | None) -> None:
        self.gpu_classes.pop(key, None)
        if new is not None:
            models = device_class_gpu_models(new, self.gpu_drivers)
            if models is not None:
                self.gpu_classes[key] = models
        # Classes decide which requests are GPUs, for every pod: recount all (rare events).
        self._cache = dict.fromkeys(self._cache)
        self._unstored.clear()
        self._notify(None)
