"""NodePrepareResources / NodeUnprepareResources: from an allocated ResourceClaim to a CDI spec.

For each claim: read it from the API (UID must match, it must be allocated), keep the allocation
results of this driver, apply the opaque configs (class first, then claim; strictly validated),
decide how each GPU is shared (among the strategies the device profile sets up), record the plan
in the checkpoint as ``started``, set up sharing, write the claim's CDI spec (the profile's
container edits) and record it ``completed``. Every failure is reported for that claim
only. A ``completed`` claim is answered from the checkpoint; a ``started`` one (a crash
interrupted it) is rolled back and redone.

Recovery (``Preparer.recover``, before the driver serves): every ``started`` claim is rolled back
at once, so each GPU is reset at most once however many claims a crash interrupted. A claim's
CDI spec carries its ``completed`` record; when the checkpoint cannot prove it is complete (a
slot unreadable or missing, see ``dra_driver.checkpoint``), every spec it does not record as
completed is taken for a prepared claim and its record restored from the spec, and a spec with
no record is kept and pins the GPUs it names (never reset while it exists). So no damage to the
checkpoint makes the driver drop a claim the kubelet was told is prepared, or reset a GPU under it.

MIG partitions made on demand (a device of a partitionable GPU: a placement, or the whole GPU as
its full-size instance) are made by the profile's ``Partitioner`` (GPU and compute instance in one
command), with the checkpoint written before (``started``: nothing made yet) and after
(``completed``, with the instance ids and MIG device uuid). Before either, the GPU's instances
are listed: a claim whose placement an instance already covers (made since the slice was
published) fails with nothing recorded or made; a create refused after a clear listing (an
instance someone made in between) made nothing, so nothing is destroyed, and the GPU is listed
again for the claim's error to name that instance. Once a prepare or unprepare of partitions
has written its records, the ``instances_changed`` callback asks the slice publisher to publish
again (an instance someone else made at a placement is then published, and the placements it
overlaps withdrawn). A claim of an existing MIG device that is the driver's partition of another
claim fails (an allocation of an administrator's instance that outlived it). Undoing one
(unprepare, a failure, or the roll-back of a claim a crash interrupted) destroys its recorded
instance, or without a recorded id the one at its placement, found on the device, so a crash
between a create and its record leaves no orphaned instance, and since the placement was free
when the claim was recorded, the instance there is the claim's. A claim whose instance cannot be
destroyed stays recorded (its unprepare fails, and the kubelet retries it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.gpuconfig import ClaimConfigError, GpuConfig, SharingStrategy, parse_gpu_config
from contract.names import COMPUTE_CAPACITY, GPU_MILLI, MEMORY_CAPACITY
from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, ClaimRecord, PreparedDevice
from dra_driver.claimconfig import effective_sharing, parse_quantity
from dra_driver.config import API_TIMEOUT_S
from dra_driver.devices.model import Gpu, MigInstance, NodeDevice
from dra_driver.devices.naming import (
    gpu_device_name,
    mig_device_name,
    placement_device_name,
    published_memory,
)
from dra_driver.devices.profile import DeviceProfile, Partitioner
from dra_driver.devices.share import (
    ContainerEdits,
    GpuShare,
    MigPartition,
    PartitionNotMade,
    PlacedInstance,
    SharingCommandError,
)
from dra_driver.sharing import SharingConflict, SharingManager
from dra_driver.slices import memory_quantity, read_json

log = logging.getLogger(__name__)

CLAIM_OPERATIONS = Counter(
    "tessera_dra_claim_operations_total", "Claims prepared/unprepared, by outcome", ["operation", "outcome"]
)
# One kubelet call (NodePrepareResources / NodeUnprepareResources: a pod's claims); the kubelet
# waits for it before the pod's containers start (prepare) or its claims are freed (unprepare).
CALL_DURATION = Histogram(
    "tessera_dra_request_duration_seconds",
    "Time to answer one kubelet call, by operation (prepare, unprepare)",
    ["operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RECOVERED_CLAIMS = Gauge(
    "tessera_dra_recovered_claims",
    "Claims the checkpoint had lost, recovered from their CDI specs at the driver's last start",
)
UNACCOUNTED_SPECS = Gauge(
    "tessera_dra_unaccounted_claim_specs",
    "CDI specs of claims neither the checkpoint nor the spec can describe; their GPUs are not reset",
)


class ClaimPrepareError(RuntimeError):
    """This claim cannot be prepared; the message becomes the pod event."""


# ---- the ResourceClaim as this driver reads it (API edge; unknown fields are ignored) ----


class _ApiModel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Opaque(_ApiModel):
    driver: str
    parameters: Any = None


class _AllocatedConfig(_ApiModel):
    source: str = "FromClaim"  # FromClass | FromClaim
    requests: tuple[str, ...] = ()
    opaque: _Opaque | None = None


class _AllocationResult(_ApiModel):
    request: str
    driver: str
    pool: str
    device: str
    consumedCapacity: dict[str, str | int] = Field(default_factory=dict)
    shareID: str | None = None


class _DeviceAllocation(_ApiModel):
    results: tuple[_AllocationResult, ...] = ()
    config: tuple[_AllocatedConfig, ...] = ()


class _Allocation(_ApiModel):
    devices: _DeviceAllocation | None = None


class _ClaimStatus(_ApiModel):
    allocation: _Allocation | None = None


class _Metadata(_ApiModel):
    uid: str
    name: str = ""
    namespace: str = ""


class ResourceClaimView(_ApiModel):
    metadata: _Metadata
    status: _ClaimStatus | None = None


# ---- what the node has ----


def node_devices(gpus: Sequence[Gpu], profile: DeviceProfile) -> dict[str, NodeDevice]:
    """Published device name -> NodeDevice, using the same naming as the ResourceSlices.

    A GPU in MIG mode is published as its MIG devices only: work cannot run outside them. A
    partitionable one (``mig_layout``) also as its placements and the whole GPU as the full-size
    placement (published so only where the cluster serves partitionable devices; known here
    either way, since only what is published is allocated). Its device nodes are the profile's
    (a MIG device's are its GPU's).
    """
    devices: dict[str, NodeDevice] = {}
    for gpu in gpus:
        nodes = profile.device_nodes(gpu)
        if gpu.mig_layout is not None:
            full = gpu.mig_layout.full
            name = gpu_device_name(gpu)
            devices[name] = NodeDevice(name, gpu.uuid, published_memory(gpu), nodes, placement=full)
            for placement in gpu.mig_layout.placements:
                if placement != full:
                    name = placement_device_name(gpu, placement)
                    devices[name] = NodeDevice(
                        name, gpu.uuid, placement.memory_bytes, nodes, is_mig=True, placement=placement
                    )
        elif not gpu.mig_enabled:
            name = gpu_device_name(gpu)
            devices[name] = NodeDevice(name, gpu.uuid, published_memory(gpu), nodes)
        for mig in gpu.mig_devices:
            name = mig_device_name(gpu, mig)
            instance = MigInstance(gpu.uuid, mig.gi, mig.ci)
            devices[name] = NodeDevice(
                name, mig.uuid, mig.memory_bytes, nodes, is_mig=True, instance=instance
            )
    return devices


def without_driver_instances(gpus: Sequence[Gpu], records: Iterable[ClaimRecord]) -> list[Gpu]:
    """The GPUs as published: a partitionable GPU's MIG instances this driver made (for the
    claims ``records`` hold) left out of its ``mig_devices``, so that only instances someone
    else made are published as such (NVML lists every instance there is). A claim's instance is
    the one with its recorded GPU instance id or, when a crash kept the id from being recorded,
    the one at its placement (the ``started`` record is written before the instance is made)."""
    partitions = [
        (share.gpu_uuid, share.partition)
        for record in records
        for share in record.shares
        if share.partition is not None
    ]
    made_ids = {(gpu, p.gpu_instance) for gpu, p in partitions if p.gpu_instance is not None}
    made_at = {(gpu, p.start) for gpu, p in partitions}
    return [
        replace(
            gpu,
            mig_devices=tuple(
                mig
                for mig in gpu.mig_devices
                if (gpu.uuid, mig.gi) not in made_ids and (gpu.uuid, mig.placement_start) not in made_at
            ),
        )
        if gpu.mig_layout is not None
        else gpu
        for gpu in gpus
    ]


# ---- pure planning ----


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PlannedDevice:
    request: str
    device: NodeDevice
    share: GpuShare
    pool: str
    share_id: str | None


def parent_request(request: str) -> str:
    """The claim request a result belongs to. A result of a prioritized list's subrequest is named
    "<request>/<subrequest>", but containers name "<request>", and the kubelet hands a container
    the devices whose request names contain exactly that name."""
    return request.split("/", 1)[0]


def _configs_for(request: str, allocated: Sequence[_AllocatedConfig], driver: str) -> list[GpuConfig]:
    # Configs may name the subrequest or its parent request.
    parent = parent_request(request)
    chosen = [
        c
        for c in allocated
        if c.opaque is not None
        and c.opaque.driver == driver
        and (not c.requests or request in c.requests or parent in c.requests)
    ]
    chosen.sort(key=lambda c: 0 if c.source == "FromClass" else 1)  # stable: class, then claim
    return [parse_gpu_config(c.opaque.parameters) for c in chosen if c.opaque is not None]


def _thread_percentage(result: _AllocationResult, memory: int, whole_memory: int) -> int:
    compute = parse_quantity(result.consumedCapacity.get(COMPUTE_CAPACITY, 0))
    if compute > 0:
        return max(1, min(100, math.ceil(compute * 100 / GPU_MILLI)))
    return max(1, min(100, math.ceil(memory * 100 / whole_memory)))


def plan_claim(
    claim: ResourceClaimView,
    expected_uid: str,
    driver: str,
    pool: str,
    devices: Mapping[str, NodeDevice],
    profile: DeviceProfile,
) -> list[PlannedDevice]:
    """Decide, without side effects, which devices the claim gets and how each is shared (only
    ``profile.strategies`` are read of the profile)."""
    if claim.metadata.uid != expected_uid:
        raise ClaimPrepareError(
            f"claim UID is {claim.metadata.uid}, the kubelet asked for {expected_uid} (recreated claim?)"
        )
    allocation = claim.status.allocation if claim.status else None
    if allocation is None or allocation.devices is None:
        raise ClaimPrepareError("claim is not allocated")
    planned: list[PlannedDevice] = []
    for result in allocation.devices.results:
        if result.driver != driver:
            continue
        if result.pool != pool:
            raise ClaimPrepareError(f"device {result.device} is from pool {result.pool}, this is {pool}")
        device = devices.get(result.device)
        if device is None:
            raise ClaimPrepareError(f"device {result.device} is not on this node (known: {sorted(devices)})")
        try:
            sharing = effective_sharing(_configs_for(result.request, allocation.devices.config, driver))
            memory = parse_quantity(result.consumedCapacity.get(MEMORY_CAPACITY, device.memory_bytes))
        except ClaimConfigError as err:
            raise ClaimPrepareError(f"request {result.request}: {err}") from None
        if memory > device.memory_bytes:
            raise ClaimPrepareError(
                f"request {result.request} consumes {memory_quantity(memory)} ({memory} bytes) of memory, "
                f"more than device {device.name} has ({memory_quantity(device.memory_bytes)}, "
                f"{device.memory_bytes} bytes)"
            )
        fraction = memory < device.memory_bytes
        default = SharingStrategy.MPS if fraction else SharingStrategy.EXCLUSIVE
        strategy = sharing.strategy if sharing else default
        if strategy not in profile.strategies:
            asked = (
                f"holds {memory} of {device.memory_bytes} bytes of {device.name}: a fraction needs {strategy}"
                if fraction and not sharing
                else f"asks for {strategy} on {device.name}"
            )
            raise ClaimPrepareError(
                f"request {result.request} {asked}, which the {profile.name} device profile does not set "
                f"up (it supports {', '.join(sorted(profile.strategies))} only)"
            )
        if fraction and strategy != SharingStrategy.MPS:
            raise ClaimPrepareError(
                f"request {result.request} holds {memory} of {device.memory_bytes} bytes of {device.name}; "
                f"a fraction is shared with MPS (its memory limit), not {strategy}"
            )
        if (device.is_mig or device.placement is not None) and strategy != SharingStrategy.EXCLUSIVE:
            raise ClaimPrepareError(f"MIG device {device.name} is not shared; {strategy} is not supported")
        threads = _thread_percentage(result, memory, device.memory_bytes)
        if sharing is not None and sharing.mps is not None and sharing.mps.activeThreadPercentage is not None:
            threads = sharing.mps.activeThreadPercentage
        share = GpuShare(
            gpu_uuid=device.uuid,
            device_name=device.name,
            strategy=strategy,
            memory_limit_bytes=memory if strategy == SharingStrategy.MPS else 0,
            active_thread_percentage=threads if strategy == SharingStrategy.MPS else 100,
            timeslice=sharing.timeSlicing.interval if sharing and sharing.timeSlicing else "Default",
            partition=_partition_of(device),
        )
        planned.append(PlannedDevice(result.request, device, share, result.pool, result.shareID))
    if sum(1 for p in planned if p.share.strategy == SharingStrategy.MPS) > 1:
        # The per-client MPS limits address the container's device 0; one fraction per claim.
        raise ClaimPrepareError("a claim may hold at most one MPS-shared GPU")
    return planned


def _taken_by(partition: MigPartition, found: Iterable[PlacedInstance]) -> str:
    """What of the partition's placement the listed GPU instances cover ("" when none), e.g.
    ``memory slices 4-7 are taken by GPU instance 1``."""
    taken = sorted(i.gpu_instance for i in found if partition.overlaps(i))
    if not taken:
        return ""
    last = partition.start + partition.memory_slices - 1
    slices = f"memory slice {last}" if last == partition.start else f"memory slices {partition.start}-{last}"
    verb = "is" if last == partition.start else "are"
    return f"{slices} {verb} taken by GPU instance {', '.join(map(str, taken))}"


def _partition_of(device: NodeDevice) -> MigPartition | None:
    """The instance to make for a placement device (its ids come once it is made)."""
    placement = device.placement
    if placement is None:
        return None
    return MigPartition(placement.profile, placement.profile_id, placement.start, placement.memory_slices)


def _merged(first: ContainerEdits, second: ContainerEdits) -> ContainerEdits:
    return ContainerEdits(
        env={**first.env, **second.env},
        device_nodes=first.device_nodes + second.device_nodes,
        mounts=first.mounts + second.mounts,
        char_devices=first.char_devices + second.char_devices,
    )


def _shared(shares: Iterable[GpuShare]) -> tuple[GpuShare, ...]:
    """The shares the sharing manager handles: all but MIG partitions (made and destroyed by the
    partitioner; a GPU's partitions are held by different claims, each exclusively)."""
    return tuple(share for share in shares if share.partition is None)


# ---- I/O: reading claims, and the preparer ----


class ClaimReader(Protocol):
    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as a JSON-like dict; raises ClaimPrepareError when unreadable."""
        ...


class ApiClaimReader:
    """Reads claims from the API server, each read bounded by ``timeout_s``."""

    def __init__(self, api: client.ApiClient, timeout_s: float = API_TIMEOUT_S) -> None:
        # Typed Any: the raw call (``_preload_content=False``) returns the response, not a model.
        self._resource: Any = client.ResourceV1Api(api)
        self._timeout_s = timeout_s

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        what = f"reading ResourceClaim {namespace}/{name}"
        try:
            # Raw JSON: every field the apiserver has, without a round trip through the models.
            call = self._resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
            return await read_json(call, self._timeout_s)
        except TimeoutError:
            raise ClaimPrepareError(
                f"{what}: no answer from the API server within {self._timeout_s:g} s"
            ) from None
        except ApiException as err:
            raise ClaimPrepareError(f"{what}: {err.status} {err.reason}") from None
        except (aiohttp.ClientError, OSError, ValueError) as err:
            raise ClaimPrepareError(f"{what}: {err!r}") from None


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class _LockEntry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ClaimLocks:
    """One lock per claim UID, kept only while someone holds or waits for it."""

    def __init__(self) -> None:
        self._entries: dict[str, _LockEntry] = {}

    @contextlib.asynccontextmanager
    async def hold(self, claim_uids: Iterable[str]) -> AsyncIterator[None]:
        # One order for every caller, so two requests sharing claims cannot deadlock.
        async with contextlib.AsyncExitStack() as stack:
            for claim_uid in sorted(set(claim_uids)):
                await stack.enter_async_context(self._one(claim_uid))
            yield

    @contextlib.asynccontextmanager
    async def _one(self, claim_uid: str) -> AsyncIterator[None]:
        entry = self._entries.setdefault(claim_uid, _LockEntry())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[claim_uid]


def _with_intact_specs(completed: Mapping[str, ClaimRecord]) -> set[str]:
    """The completed claims whose CDI spec is still whole on disk (a power cut may take a spec,
    which is written without a disk sync, or the reboot may empty a tmpfs)."""
    return {
        uid
        for uid, record in completed.items()
        if not record.cdi_spec or cdi.read_claim_spec(Path(record.cdi_spec)) is not None
    }


def _spec_record(spec: Mapping[str, Any], driver: str, path: Path) -> ClaimRecord | None:
    """The completed record a claim's spec carries, or None (none, or not one of ours)."""
    text = cdi.spec_annotation(spec, cdi.record_annotation(driver))
    if text is None:
        return None
    try:
        record = ClaimRecord.model_validate_json(text)
    except ValidationError:
        return None
    return record if record.state == "completed" and record.cdi_spec == str(path) else None


@dataclass
class RecoveryReport:
    """What recover() found: logged, set in the gauges, and posted as a Warning event on the
    Node when claims had to be recovered (``plugin.report_recovery``)."""

    doubts: tuple[str, ...] = ()  # why the checkpoint may have lacked acknowledged claims
    adopted: dict[str, ClaimRecord] = field(default_factory=dict)  # restored from their specs
    unaccounted: list[Path] = field(default_factory=list)  # specs kept without a record
    removed: list[Path] = field(default_factory=list)

    @property
    def degraded(self) -> bool:
        return bool(self.adopted or self.unaccounted)

    def summary(self) -> str:
        """One line for the Node event ("" when the checkpoint accounted for every claim)."""
        if not self.degraded:
            return ""
        kept = f"{len(self.unaccounted)} spec(s) kept without a record"
        if self.unaccounted:
            kept += " (the GPUs they name are not reset while they exist)"
        return (
            f"checkpoint incomplete ({'; '.join(self.doubts) or 'no checkpoint file'}): "
            f"{len(self.adopted)} claim(s) recovered from their CDI specs, {kept}"
        )

    def log(self) -> None:
        for doubt in self.doubts:
            (log.error if self.degraded else log.warning)("checkpoint: %s", doubt)
        for uid, record in sorted(self.adopted.items()):
            log.error(
                "claim %s/%s (%s) was missing from the checkpoint; recovered from %s",
                record.namespace,
                record.name,
                uid,
                record.cdi_spec,
            )
        for path in self.unaccounted:
            log.error(
                "%s names a claim the checkpoint lacks and holds no record; kept, its GPUs are not reset",
                path,
            )


@dataclass(frozen=True)
class _Planned:
    """A claim of a prepare request whose plan is known (empty: no device of this driver)."""

    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]


class Preparer:
    """Prepares and unprepares claims for one driver on one node; safe to call concurrently.

    Two kinds of locks: one per claim, held for the whole operation on that claim (API read
    included), and one for the node's shared state (GPU sharing and the checkpoint), held only
    for local work, never across an API call. So a hanging API read delays only its own claims.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: Callable[[], Mapping[str, NodeDevice]],
        profile: DeviceProfile,
        claims: ClaimReader,
        checkpoint: Checkpoint,
        sharing: SharingManager,
        cdi_dir: Path,
        partitioner: Partitioner | None = None,
        instances_changed: Callable[[str], None] | None = None,
    ) -> None:
        self._driver = driver_name
        # Told (with why) once a prepare or unprepare that made, destroyed or found MIG instances
        # has written its records: the slice publisher then publishes from what is there now.
        self._instances_changed = instances_changed or (lambda reason: None)
        self._profile = profile
        self._pool = node_name
        self._devices = devices
        self._claims = claims
        self._checkpoint = checkpoint
        self._sharing = sharing
        self._partitioner = partitioner
        self._cdi_dir = cdi_dir
        self._claim_locks = ClaimLocks()
        self._state_lock = asyncio.Lock()
        # Claims known only by a CDI spec without a record: UID -> (spec, GPUs it may use).
        self._unaccounted: dict[str, tuple[Path, frozenset[str]]] = {}
        self.recovery = RecoveryReport()
        self._restore_sharing()

    def _restore_sharing(self) -> None:
        completed = {
            uid: _shared(rec.shares)
            for uid, rec in self._checkpoint.claims.items()
            if rec.state == "completed"
        }
        self._sharing.restore(completed)

    async def recover(self) -> RecoveryReport:
        """Start from the disk, before serving: read the checkpoint again (another instance may
        have written it until it let go), recover the claims it may have lost from their CDI
        specs, roll back every claim a crash interrupted (each GPU reset at most once), and
        remove what a crash left behind (temp files; when the checkpoint is complete, the CDI
        specs of claims it does not know: a prepare that ran no command records nothing before
        its spec is written, and the kubelet was not answered)."""
        async with self._state_lock:
            report = await asyncio.to_thread(self._recover_files)
            self._restore_sharing()
            interrupted = {uid: r for uid, r in self._checkpoint.claims.items() if r.state == "started"}
            # Under the lock, but nothing is served before recover() returns: no request waits.
            await self._roll_back(interrupted)
        for path in report.removed:
            log.info("removed %s, left behind by an interrupted prepare", path)
        if interrupted:
            log.info("rolled back %d claim(s) a crash interrupted", len(interrupted))
        report.log()
        RECOVERED_CLAIMS.set(len(report.adopted))
        UNACCOUNTED_SPECS.set(len(report.unaccounted))
        self.recovery = report
        return report

    def _recover_files(self) -> RecoveryReport:
        self._checkpoint.reload()
        known = self._checkpoint.claims
        specs = cdi.claim_specs(self._cdi_dir, self._driver)
        if self._checkpoint.complete:
            orphans = [path for uid, path in specs.items() if uid not in known]
            cdi.remove_claim_specs(orphans)
            report = RecoveryReport(removed=orphans)
        else:
            report = self._adopt_specs(specs, known)
        report.removed += self._checkpoint.remove_temp_files()
        if self._cdi_dir.is_dir():
            report.removed += cdi.remove_leftover_temp_files(self._cdi_dir, self._driver)
        return report

    def _adopt_specs(self, specs: Mapping[str, Path], known: Mapping[str, ClaimRecord]) -> RecoveryReport:
        """The checkpoint may lack acknowledged claims: every claim spec it does not record as
        completed is taken for a prepared claim (the kubelet may have been answered) and its
        record is restored from the spec. A spec without a readable record (an older driver's,
        or torn) is kept, and the GPUs it names are never reset while it exists."""
        report = RecoveryReport(doubts=self._checkpoint.doubts)
        self._unaccounted.clear()
        for uid, path in sorted(specs.items()):
            record = known.get(uid)
            if record is not None and record.state == "completed":
                continue
            spec = cdi.read_claim_spec(path)
            adopted = _spec_record(spec, self._driver, path) if spec is not None else None
            if adopted is not None:
                report.adopted[uid] = adopted
                continue
            if record is not None:  # "started", its spec without a record: rolled back below
                continue
            names = cdi.spec_device_names(spec, uid) if spec is not None else set()
            devices = self._devices()
            gpus = frozenset(devices[name].uuid for name in names if name in devices)
            # Unknown devices: every GPU, since which one it uses cannot be told.
            self._unaccounted[uid] = (path, gpus or frozenset(d.uuid for d in devices.values()))
            report.unaccounted.append(path)
        self._checkpoint.update(dict(report.adopted))
        return report

    def _unaccounted_gpus(self) -> frozenset[str]:
        return frozenset(uuid for _, gpus in self._unaccounted.values() for uuid in gpus)

    async def _roll_back(self, leftovers: Mapping[str, ClaimRecord]) -> None:
        """Undo claims (interrupted, or their spec was lost) at once: each GPU they leave unused
        is reset once, their MIG partitions destroyed, then their specs and records go (one
        checkpoint write). A claim whose partition cannot be destroyed stays recorded, to be
        undone again by its next prepare or unprepare."""
        if not leftovers:
            return
        await self._sharing.release_claims(
            {uid: _shared(record.shares) for uid, record in leftovers.items()}, self._unaccounted_gpus()
        )
        undone: dict[str, ClaimRecord] = {}
        for uid, record in leftovers.items():
            try:
                await self._destroy_partitions(record.shares)
            except SharingCommandError as err:
                log.error("claim %s: its MIG partition is not destroyed, kept recorded: %s", uid, err)
                continue
            undone[uid] = record
        specs = [Path(record.cdi_spec) for record in undone.values() if record.cdi_spec]
        await asyncio.to_thread(cdi.remove_claim_specs, specs)
        await self._save(dict.fromkeys(undone))

    async def _destroy_partitions(self, shares: Iterable[GpuShare]) -> None:
        for share in shares:
            if share.partition is not None and self._partitioner is not None:
                await self._partitioner.destroy(share.gpu_uuid, share.partition)

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        started = time.perf_counter()
        outcomes: dict[str, PrepareOutcome] = {}
        async with self._claim_locks.hold(ref.uid for ref in refs):
            records = {ref.uid: self._checkpoint.get(ref.uid) for ref in refs}
            completed = {uid: r for uid, r in records.items() if r is not None and r.state == "completed"}
            done = await asyncio.to_thread(_with_intact_specs, completed) if completed else set()
            to_plan: list[ClaimRef] = []
            for ref in refs:
                record = records[ref.uid]
                if record is not None and ref.uid in done:
                    outcomes[ref.uid] = PrepareOutcome(devices=record.devices)
                else:
                    to_plan.append(ref)
            # The API reads, concurrently and with no shared lock held.
            planned: list[_Planned] = []
            for ref, result in zip(to_plan, await asyncio.gather(*map(self._plan, to_plan)), strict=True):
                if isinstance(result, str):
                    outcomes[ref.uid] = PrepareOutcome(error=result)
                else:
                    planned.append(result)
            if to_plan:
                async with self._state_lock:
                    outcomes.update(await self._prepare_planned(to_plan, planned))
        # Its records written: an instance made (hidden from the slices as the claim's) or one
        # someone else made at a claim's placement (published, the placements it overlaps
        # withdrawn). Asked after the writes, so the publish reads the claims as they ended.
        self._tell_instances_changed("prepare", (d.share for p in planned for d in p.devices))
        for outcome in outcomes.values():
            CLAIM_OPERATIONS.labels("prepare", "error" if outcome.error else "ok").inc()
        CALL_DURATION.labels("prepare").observe(time.perf_counter() - started)
        return outcomes

    async def _plan(self, ref: ClaimRef) -> _Planned | str:
        """The claim's plan, or the error that costs this claim (and only it) its prepare."""
        try:
            claim = ResourceClaimView.model_validate(await self._claims.read_claim(ref.namespace, ref.name))
            devices = plan_claim(claim, ref.uid, self._driver, self._pool, self._devices(), self._profile)
        except ValidationError as err:
            return self._failed("prepare", ref, f"unexpected ResourceClaim shape: {err}")
        except ClaimPrepareError as err:
            return self._failed("prepare", ref, str(err))
        except Exception as err:  # a bug must cost one claim (retried by the kubelet), not the batch
            log.exception("prepare of claim %s (%s): unexpected error", ref.name, ref.uid)
            return f"internal error: {err!r}"
        return _Planned(ref, tuple(devices))

    @staticmethod
    def _failed(operation: str, ref: ClaimRef, error: str) -> str:
        log.warning("%s of claim %s/%s (%s): %s", operation, ref.namespace, ref.name, ref.uid, error)
        return error

    async def _prepare_planned(
        self, to_plan: Sequence[ClaimRef], planned: Sequence[_Planned]
    ) -> dict[str, PrepareOutcome]:
        """Roll back crash leftovers, set up sharing, write the CDI specs and record the claims
        (under the state lock). Every checkpoint change of the request is written at once."""
        outcomes: dict[str, PrepareOutcome] = {}
        changes: dict[str, ClaimRecord | None] = {}
        # "started" (a crash interrupted it and recover() has not run), or its spec was lost.
        leftovers = {ref.uid: r for ref in to_plan if (r := self._checkpoint.get(ref.uid)) is not None}
        if leftovers:
            log.info("claims %s were left half-prepared; rolling them back first", sorted(leftovers))
            await self._roll_back(leftovers)
        with_devices = [p for p in planned if p.devices]
        for p in planned:
            if not p.devices:  # allocated only to other drivers: nothing to prepare, no spec
                outcomes[p.ref.uid] = PrepareOutcome()
        for uid, error in (await self._taken_placements(with_devices)).items():
            outcomes[uid] = PrepareOutcome(error=error)
        for uid, error in self._drivers_own_instances(with_devices).items():
            outcomes.setdefault(uid, PrepareOutcome(error=error))
        with_devices = [p for p in with_devices if p.ref.uid not in outcomes]
        if not with_devices:  # nothing to record: no checkpoint write
            return outcomes
        specs = {p.ref.uid: cdi.spec_path(self._cdi_dir, self._driver, p.ref.uid) for p in with_devices}
        started = {
            p.ref.uid: ClaimRecord(
                namespace=p.ref.namespace,
                name=p.ref.name,
                state="started",
                shares=tuple(d.share for d in p.devices),
                cdi_spec=str(specs[p.ref.uid]),
            )
            for p in with_devices
        }
        # "started" reaches the disk before any command runs, so a crash is rolled back later. A
        # request that runs no command changes nothing but its specs, which recover() cleans.
        if any(
            d.share.partition is not None or self._sharing.needs_setup(p.ref.uid, d.share)
            for p in with_devices
            for d in p.devices
        ):
            try:
                await self._save({**changes, **started})
            except OSError as err:  # nothing was set up: these claims fail, the kubelet retries
                for p in with_devices:
                    error = self._failed("prepare", p.ref, f"recording the claim before its setup: {err}")
                    outcomes[p.ref.uid] = PrepareOutcome(error=error)
                return outcomes
            changes = {}
        edits: dict[str, list[ContainerEdits]] = {}
        shares: dict[str, tuple[GpuShare, ...]] = {}
        for p in with_devices:
            try:
                self._check_not_pinned(p.ref.uid, p.devices)
                edits[p.ref.uid], shares[p.ref.uid] = await self._acquire(p.ref.uid, p.devices)
            except (SharingConflict, SharingCommandError, OSError) as err:
                outcomes[p.ref.uid] = PrepareOutcome(error=self._failed("prepare", p.ref, str(err)))
                changes[p.ref.uid] = None
        acquired = [p for p in with_devices if p.ref.uid in edits]
        answers = {p.ref.uid: self._answer(p) for p in acquired}
        completed = {
            uid: started[uid].model_copy(
                update={"state": "completed", "devices": devices, "shares": shares[uid]}
            )
            for uid, devices in answers.items()
        }
        claim_specs = {
            specs[p.ref.uid]: self._claim_spec(p, edits[p.ref.uid], completed[p.ref.uid]) for p in acquired
        }
        try:
            # One trip to a worker thread: the specs, then the records saying they exist.
            await asyncio.to_thread(self._write_prepared, claim_specs, {**changes, **completed})
        except OSError as err:
            # Nothing of these claims is recorded as done: undo them (the disk may still say
            # "started", which the next prepare or unprepare rolls back).
            for p in acquired:
                try:
                    await self._release(p.ref.uid, shares[p.ref.uid])
                except SharingCommandError as undo:  # still "started" on disk: undone again later
                    log.error("claim %s: undoing its preparation: %s", p.ref.uid, undo)
                error = self._failed("prepare", p.ref, f"recording the prepared claim: {err}")
                outcomes[p.ref.uid] = PrepareOutcome(error=error)
            await asyncio.to_thread(cdi.remove_claim_specs, [specs[p.ref.uid] for p in acquired])
            return outcomes
        for uid, devices in answers.items():
            self._unaccounted.pop(uid, None)  # its spec now carries its record
            outcomes[uid] = PrepareOutcome(devices=devices)
            log.info("prepared claim %s: %s", uid, [d.device_name for d in devices])
        return outcomes

    async def _taken_placements(self, planned: Sequence[_Planned]) -> dict[str, str]:
        """Claim UID -> why it fails, for each claim with a partition where an instance already
        is (made since the slice was published), from one listing per GPU taken before anything
        of the request is recorded or made. A claim is so recorded ``started`` only where its
        placement was free: the undo of an interrupted create, which takes the instance at the
        placement for the claim's, finds no one else's there."""
        partitioned = [(p, d) for p in planned for d in p.devices if d.share.partition is not None]
        if not partitioned or self._partitioner is None:
            return {}
        listed: dict[str, tuple[PlacedInstance, ...] | str] = {}
        for gpu_uuid in dict.fromkeys(d.share.gpu_uuid for _, d in partitioned):
            try:
                listed[gpu_uuid] = await self._partitioner.instances(gpu_uuid)
            except SharingCommandError as err:
                listed[gpu_uuid] = f"listing the MIG instances of GPU {gpu_uuid}: {err}"
        refused: dict[str, str] = {}
        for p, device in partitioned:
            partition, found = device.share.partition, listed[device.share.gpu_uuid]
            if p.ref.uid in refused or partition is None:
                continue
            if isinstance(found, str):
                refused[p.ref.uid] = self._failed("prepare", p.ref, found)
                continue
            taken = _taken_by(partition, found)
            if taken:
                refused[p.ref.uid] = self._failed(
                    "prepare",
                    p.ref,
                    f"{device.device.name}: {taken}, made since the slice was published; nothing was made",
                )
        return refused

    def _drivers_own_instances(self, planned: Sequence[_Planned]) -> dict[str, str]:
        """Claim UID -> why it fails, for each claim of an existing MIG device that is a partition
        this driver made for another claim. Discovery lists every instance there is, the
        driver's too; only someone else's is published (``without_driver_instances``), but an
        allocation can outlive its device: an administrator's instance published as
        ``gpu-0-mig-1-0`` and destroyed, then the driver's next partition there given GPU
        instance id 1 (the lowest free), would be handed to the stale claim as well."""
        made = {
            (share.gpu_uuid, share.partition.gpu_instance): uid
            for uid, record in self._checkpoint.claims.items()
            for share in record.shares
            if share.partition is not None and share.partition.gpu_instance is not None
        }
        refused: dict[str, str] = {}
        for p in planned:
            for device in p.devices:
                instance = device.device.instance
                holder = made.get((instance.gpu_uuid, instance.gpu_instance)) if instance else None
                if instance is not None and holder not in (None, p.ref.uid):
                    refused[p.ref.uid] = self._failed(
                        "prepare",
                        p.ref,
                        f"{device.device.name}: GPU instance {instance.gpu_instance} is this driver's "
                        f"partition of claim {holder}, not an instance someone else made; nothing was made",
                    )
                    break
        return refused

    async def _why_not_made(self, share: GpuShare, refusal: PartitionNotMade) -> PartitionNotMade:
        """A create refused after a clear listing: listed again, an instance now covering the
        placement was made between the two (an administrator's ``-cgi``, or, were the scheduler
        to allocate overlapping placements to one request, its claim before); the refusal then
        says so, with its id. Otherwise the refusal as the command gave it."""
        assert share.partition is not None and self._partitioner is not None
        try:
            found = await self._partitioner.instances(share.gpu_uuid)
        except SharingCommandError as err:
            log.warning("listing GPU %s again after a refused create: %s", share.gpu_uuid, err)
            return refusal
        taken = _taken_by(share.partition, found)
        if not taken:
            return refusal
        return PartitionNotMade(
            f"{share.device_name}: {taken}, made between the driver's listing and its create; "
            "nothing was made"
        )

    def _check_not_pinned(self, claim_uid: str, devices: Sequence[PlannedDevice]) -> None:
        """A GPU a spec without a record names may run that claim's pod, set up in a way nobody
        knows: setting it up again (its first known claim) could break the pod, so it waits."""
        for device in devices:
            share = device.share
            holders = sorted(uid for uid, (_, gpus) in self._unaccounted.items() if share.gpu_uuid in gpus)
            if holders and self._sharing.needs_setup(claim_uid, share):
                raise SharingConflict(
                    f"GPU {share.gpu_uuid} may be in use by claim(s) {', '.join(holders)}, known only by "
                    f"a CDI spec without a record (how they share it is unknown): it is set up for "
                    f"{share.strategy} once they are unprepared"
                )

    async def _acquire(
        self, claim_uid: str, devices: Sequence[PlannedDevice]
    ) -> tuple[list[ContainerEdits], tuple[GpuShare, ...]]:
        """Sharing and partitions for every device of the claim, or for none of them; the edits,
        and the shares with the partitions as made."""
        acquired: list[ContainerEdits] = []
        shares = [d.share for d in devices]
        try:
            for index, device in enumerate(devices):
                if device.share.partition is None:
                    # Read before the sharing is set up: a failure then leaves nothing to undo.
                    instance = await self._instance_edits(device.device.instance)
                    edits = await self._sharing.acquire(claim_uid, device.share)
                    acquired.append(_merged(edits, instance))
                    continue
                made = await self._make_partition(shares, index)
                acquired.append(await self._instance_edits(made))
        except BaseException as failure:
            # Up to the device that failed: a partition it began is found at its placement; one
            # whose create made nothing is not looked for (what is there is someone else's).
            undo = len(acquired) + (0 if isinstance(failure, PartitionNotMade) else 1)
            try:
                await self._release(claim_uid, shares[:undo], begun=len(acquired))
            except SharingCommandError as err:
                log.error("claim %s: undoing its partial preparation: %s", claim_uid, err)
            raise
        return acquired, tuple(shares)

    async def _make_partition(self, shares: list[GpuShare], index: int) -> MigInstance:
        """Make the MIG instance of ``shares[index]`` (its ``started`` record is on disk)."""
        share = shares[index]
        assert share.partition is not None
        if self._partitioner is None:
            raise SharingConflict(
                f"{share.device_name}: the {self._profile.name} device profile makes no MIG partitions"
            )
        try:
            made = await self._partitioner.create(share.gpu_uuid, share.partition)
        except PartitionNotMade as refusal:
            raise await self._why_not_made(share, refusal) from None
        shares[index] = replace(share, partition=made)
        assert made.gpu_instance is not None and made.compute_instance is not None
        return MigInstance(share.gpu_uuid, made.gpu_instance, made.compute_instance)

    async def _instance_edits(self, instance: MigInstance | None) -> ContainerEdits:
        """A MIG device's own container edits (its capability nodes), from the partitioner."""
        if instance is None or self._partitioner is None:
            return ContainerEdits()
        return await self._partitioner.instance_edits(instance)

    def _claim_spec(
        self, planned: _Planned, edits: Sequence[ContainerEdits], record: ClaimRecord
    ) -> dict[str, Any]:
        """The profile's edits for the claim, with each share's environment added to them, and
        the claim's record (to recover it from, should the checkpoint lose it)."""
        # A MIG partition's containers see its MIG device, made by prepare.
        devices = [
            replace(d.device, uuid=share.partition.uuid) if share.partition is not None else d.device
            for d, share in zip(planned.devices, record.shares, strict=True)
        ]
        common = self._profile.claim_edits(devices)
        env = dict(common.env)
        cdi_devices: list[cdi.CdiDevice] = []
        for device, edit in zip(planned.devices, edits, strict=True):
            env.update(edit.env)
            nodes = device.device.device_nodes + edit.device_nodes
            cdi_devices.append(cdi.CdiDevice(device.device.name, nodes, edit.mounts, edit.char_devices))
        claim_edits = ContainerEdits(env=env, device_nodes=common.device_nodes, mounts=common.mounts)
        annotations = {cdi.record_annotation(self._driver): record.model_dump_json()}
        return cdi.build_claim_spec(self._driver, planned.ref.uid, cdi_devices, claim_edits, annotations)

    def _answer(self, planned: _Planned) -> tuple[PreparedDevice, ...]:
        return tuple(
            PreparedDevice(
                request_names=(parent_request(d.request),),
                pool_name=d.pool,
                device_name=d.device.name,
                cdi_device_ids=(cdi.cdi_device_id(self._driver, planned.ref.uid, d.device.name),),
                share_id=d.share_id,
            )
            for d in planned.devices
        )

    def _write_prepared(
        self, specs: Mapping[Path, Mapping[str, Any]], changes: Mapping[str, ClaimRecord | None]
    ) -> None:
        cdi.write_claim_specs(specs)
        self._checkpoint.update(changes)

    async def _save(self, changes: Mapping[str, ClaimRecord | None]) -> None:
        if changes:
            await asyncio.to_thread(self._checkpoint.update, changes)

    async def _release(self, claim_uid: str, shares: Sequence[GpuShare], begun: int | None = None) -> None:
        """Release the claim's sharing and destroy its partitions (raises SharingCommandError when
        one cannot be: the claim must stay recorded). ``begun``: the index of a share whose setup
        was begun, not finished (released only when a partition: a sharing setup that failed
        added no user)."""
        sharing = [s for i, s in enumerate(shares) if i != begun]
        await self._sharing.release_claims({claim_uid: _shared(sharing)}, self._unaccounted_gpus())
        await self._destroy_partitions(shares)

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error message ("" when done). Unknown claims succeed; no API call is made."""
        started = time.perf_counter()
        errors: dict[str, str] = {}
        async with self._claim_locks.hold(ref.uid for ref in refs):
            known: dict[str, tuple[ClaimRef, ClaimRecord]] = {}
            for ref in refs:
                record = self._checkpoint.get(ref.uid)
                if record is not None:
                    known[ref.uid] = (ref, record)
                elif ref.uid in self._unaccounted:
                    async with self._state_lock:
                        errors[ref.uid] = await self._unprepare_unaccounted(ref)
                else:
                    errors[ref.uid] = ""
            if known:
                async with self._state_lock:
                    errors.update(await self._unprepare_known(known))
        self._tell_instances_changed("unprepare", (s for _, record in known.values() for s in record.shares))
        for error in errors.values():
            CLAIM_OPERATIONS.labels("unprepare", "error" if error else "ok").inc()
        CALL_DURATION.labels("unprepare").observe(time.perf_counter() - started)
        return errors

    def _tell_instances_changed(self, operation: str, shares: Iterable[GpuShare]) -> None:
        gpus = sorted({share.gpu_uuid for share in shares if share.partition is not None})
        if gpus:
            self._instances_changed(f"{operation} of MIG partitions on {', '.join(gpus)}")

    async def _unprepare_known(self, known: Mapping[str, tuple[ClaimRef, ClaimRecord]]) -> dict[str, str]:
        errors: dict[str, str] = {}
        released: dict[str, ClaimRecord] = {}
        for uid, (ref, record) in known.items():
            try:
                await self._release(uid, record.shares)
                released[uid] = record
            except Exception as err:
                # Kept in the checkpoint, so the kubelet's retry starts over; other claims go on.
                log.exception("unprepare of claim %s (%s) failed", ref.name, uid)
                errors[uid] = f"{err!r}"
        try:
            failed = await asyncio.to_thread(self._forget, released)
        except OSError as err:  # the checkpoint write: every claim stays for the retry
            failed = {uid: f"recording the unprepared claim: {err!r}" for uid in released}
        for uid, record in released.items():
            if uid in failed:
                errors[uid] = self._failed("unprepare", known[uid][0], failed[uid])
            else:
                errors[uid] = ""
                log.info("unprepared claim %s/%s (%s)", record.namespace, record.name, uid)
        return errors

    async def _unprepare_unaccounted(self, ref: ClaimRef) -> str:
        """A claim known only by a spec without a record: remove the spec, then reset each GPU it
        may have used that no claim uses any more, from every strategy (which one is unknown)."""
        path, gpus = self._unaccounted[ref.uid]
        try:
            await asyncio.to_thread(cdi.remove_claim_specs, [path])
        except OSError as err:
            return self._failed("unprepare", ref, f"removing {path}: {err!r}")
        del self._unaccounted[ref.uid]
        UNACCOUNTED_SPECS.set(len(self._unaccounted))
        still_held = self._unaccounted_gpus()
        for gpu_uuid in sorted(gpus - still_held):
            await self._sharing.reset_idle(gpu_uuid, self._profile.strategies)
        log.info("unprepared claim %s/%s (%s), known only by its CDI spec", ref.namespace, ref.name, ref.uid)
        return ""

    def _forget(self, released: Mapping[str, ClaimRecord]) -> dict[str, str]:
        """Remove the claims' specs, then their records (one write); claim UID -> error, for the
        claims whose spec could not be removed (they stay recorded)."""
        failed: dict[str, str] = {}
        for uid, record in released.items():
            if record.cdi_spec:
                try:
                    cdi.remove_claim_specs([Path(record.cdi_spec)])
                except OSError as err:
                    failed[uid] = f"removing {record.cdi_spec}: {err!r}"
        self._checkpoint.update({uid: None for uid in released if uid not in failed})
        return failed
