"""NodePrepareResources / NodeUnprepareResources: from an allocated ResourceClaim to a CDI spec.

For each claim: read it from the API (UID must match, it must be allocated), keep the allocation
results of this driver, apply the opaque configs (class first, then claim; strictly validated),
decide how each GPU is shared, record the plan in the checkpoint as ``started``, set up sharing,
write the claim's CDI spec and record it ``completed``. Every failure is reported for that claim
only. A ``completed`` claim is answered from the checkpoint; a ``started`` one (a crash
interrupted it) is rolled back and redone.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from contract.names import COMPUTE_CAPACITY, GPU_MILLI, MEMORY_CAPACITY
from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, ClaimRecord, PreparedDevice
from dra_driver.claimconfig import (
    ClaimConfigError,
    GpuConfig,
    SharingStrategy,
    effective_sharing,
    parse_gpu_config,
    parse_quantity,
)
from dra_driver.devices.model import Gpu
from dra_driver.devices.naming import gpu_device_name, mig_device_name
from dra_driver.sharing import GpuShare, SharingCommandError, SharingConflict, SharingManager
from dra_driver.slices import published_memory

log = logging.getLogger(__name__)

CLAIM_OPERATIONS = Counter(
    "tessera_dra_claim_operations_total", "Claims prepared/unprepared, by outcome", ["operation", "outcome"]
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


@dataclass(frozen=True)
class NodeDevice:
    """A device this node publishes, with what prepare needs to hand it to a container."""

    name: str
    uuid: str
    memory_bytes: int  # as published: floored to whole MiB
    device_nodes: tuple[str, ...]
    is_mig: bool = False


def node_devices(gpus: Sequence[Gpu]) -> dict[str, NodeDevice]:
    """Published device name -> NodeDevice, using the same naming as the ResourceSlices.

    A GPU in MIG mode is published as its MIG devices only: work cannot run outside them.
    """
    devices: dict[str, NodeDevice] = {}
    for gpu in gpus:
        node = f"/dev/nvidia{gpu.minor}"
        if not gpu.mig_enabled:
            name = gpu_device_name(gpu)
            devices[name] = NodeDevice(name, gpu.uuid, published_memory(gpu), (node,))
        for mig in gpu.mig_devices:
            name = mig_device_name(gpu, mig)
            devices[name] = NodeDevice(name, mig.uuid, mig.memory_bytes, (node,), is_mig=True)
    return devices


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


def _configs_for(request: str, allocated: Sequence[_AllocatedConfig], driver: str) -> list[GpuConfig]:
    # A result of a prioritized-list subrequest is named "<request>/<subrequest>"; configs may
    # name either.
    parent = request.split("/", 1)[0]
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
    claim: ResourceClaimView, expected_uid: str, driver: str, pool: str, devices: Mapping[str, NodeDevice]
) -> list[PlannedDevice]:
    """Decide, without side effects, which devices the claim gets and how each is shared."""
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
        fraction = memory < device.memory_bytes
        default = SharingStrategy.MPS if fraction else SharingStrategy.EXCLUSIVE
        strategy = sharing.strategy if sharing else default
        if fraction and strategy != SharingStrategy.MPS:
            raise ClaimPrepareError(
                f"request {result.request} holds {memory} of {device.memory_bytes} bytes of {device.name}; "
                f"a fraction is shared with MPS (its memory limit), not {strategy}"
            )
        if device.is_mig and strategy != SharingStrategy.EXCLUSIVE:
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
        )
        planned.append(PlannedDevice(result.request, device, share, result.pool, result.shareID))
    if sum(1 for p in planned if p.share.strategy == SharingStrategy.MPS) > 1:
        # The per-client MPS limits address the container's device 0; one fraction per claim.
        raise ClaimPrepareError("a claim may hold at most one MPS-shared GPU")
    return planned


# ---- I/O: reading claims, and the preparer ----


class ClaimReader(Protocol):
    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim as a JSON-like dict; raises ClaimPrepareError when unreadable."""
        ...


class ApiClaimReader:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._resource = client.ResourceV1Api(api)

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            claim = await self._resource.read_namespaced_resource_claim(name, namespace)
        except ApiException as err:
            raise ClaimPrepareError(
                f"reading ResourceClaim {namespace}/{name}: {err.status} {err.reason}"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as err:
            raise ClaimPrepareError(f"reading ResourceClaim {namespace}/{name}: {err!r}") from None
        data: dict[str, Any] = self._api.sanitize_for_serialization(claim)
        return data


@dataclass(frozen=True)
class PrepareOutcome:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class Preparer:
    """Prepares and unprepares claims for one driver on one node; safe to call concurrently."""

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: Callable[[], Mapping[str, NodeDevice]],
        claims: ClaimReader,
        checkpoint: Checkpoint,
        sharing: SharingManager,
        cdi_dir: Path,
    ) -> None:
        self._driver = driver_name
        self._pool = node_name
        self._devices = devices
        self._claims = claims
        self._checkpoint = checkpoint
        self._sharing = sharing
        self._cdi_dir = cdi_dir
        # One at a time: GPU sharing state and the checkpoint file are shared by all claims.
        self._lock = asyncio.Lock()
        completed = {uid: rec.shares for uid, rec in checkpoint.claims.items() if rec.state == "completed"}
        sharing.restore(completed)

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        async with self._lock:
            for ref in refs:
                try:
                    outcomes[ref.uid] = PrepareOutcome(devices=await self._prepare_one(ref))
                    CLAIM_OPERATIONS.labels("prepare", "ok").inc()
                except (ClaimPrepareError, SharingConflict, SharingCommandError, OSError) as err:
                    log.warning("prepare of claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, err)
                    outcomes[ref.uid] = PrepareOutcome(error=str(err))
                    CLAIM_OPERATIONS.labels("prepare", "error").inc()
                except Exception as err:
                    # A bug must cost one claim (retried by the kubelet), not the whole batch.
                    log.exception("prepare of claim %s (%s): unexpected error", ref.name, ref.uid)
                    outcomes[ref.uid] = PrepareOutcome(error=f"internal error: {err!r}")
                    CLAIM_OPERATIONS.labels("prepare", "error").inc()
        return outcomes

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error message ("" when done). Unknown claims succeed."""
        errors: dict[str, str] = {}
        async with self._lock:
            for ref in refs:
                try:
                    await self._undo(ref.uid)
                    errors[ref.uid] = ""
                    CLAIM_OPERATIONS.labels("unprepare", "ok").inc()
                except Exception as err:
                    # Kept in the checkpoint, so the kubelet's retry starts over; other claims go on.
                    log.exception("unprepare of claim %s (%s) failed", ref.name, ref.uid)
                    errors[ref.uid] = f"{err!r}"
                    CLAIM_OPERATIONS.labels("unprepare", "error").inc()
        return errors

    async def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        record = self._checkpoint.get(ref.uid)
        if record is not None and record.state == "completed":
            return record.devices
        if record is not None:
            log.info("claim %s was left half-prepared; rolling it back before preparing again", ref.uid)
            await self._release(ref.uid, record)
        try:
            claim = ResourceClaimView.model_validate(await self._claims.read_claim(ref.namespace, ref.name))
        except ValidationError as err:
            raise ClaimPrepareError(f"unexpected ResourceClaim shape: {err}") from None
        planned = plan_claim(claim, ref.uid, self._driver, self._pool, self._devices())
        spec_file = cdi.spec_path(self._cdi_dir, self._driver, ref.uid)
        started = ClaimRecord(
            namespace=ref.namespace,
            name=ref.name,
            state="started",
            shares=tuple(p.share for p in planned),
            cdi_spec=str(spec_file),
        )
        self._checkpoint.put(ref.uid, started)
        try:
            devices = await self._apply(ref.uid, planned, spec_file)
        except (SharingConflict, SharingCommandError, OSError):
            await self._release(ref.uid, started)
            raise
        self._checkpoint.put(ref.uid, started.model_copy(update={"state": "completed", "devices": devices}))
        names = [d.device_name for d in devices]
        log.info("prepared claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, names)
        return devices

    async def _apply(
        self, claim_uid: str, planned: Sequence[PlannedDevice], spec_file: Path
    ) -> tuple[PreparedDevice, ...]:
        env: dict[str, str] = {"NVIDIA_VISIBLE_DEVICES": ",".join(p.device.uuid for p in planned) or "void"}
        cdi_devices: list[cdi.CdiDevice] = []
        for p in planned:
            edits = await self._sharing.acquire(claim_uid, p.share)
            env.update(edits.env)
            cdi_devices.append(cdi.CdiDevice(p.device.name, p.device.device_nodes, edits.mounts))
        cdi.write_claim_spec(spec_file, cdi.build_claim_spec(self._driver, claim_uid, cdi_devices, env))
        return tuple(
            PreparedDevice(
                request_names=(p.request,),
                pool_name=p.pool,
                device_name=p.device.name,
                cdi_device_ids=(cdi.cdi_device_id(self._driver, claim_uid, p.device.name),),
                share_id=p.share_id,
            )
            for p in planned
        )

    async def _undo(self, claim_uid: str) -> None:
        record = self._checkpoint.get(claim_uid)
        if record is None:
            return
        await self._release(claim_uid, record)
        log.info("unprepared claim %s/%s (%s)", record.namespace, record.name, claim_uid)

    async def _release(self, claim_uid: str, record: ClaimRecord) -> None:
        """Undo a prepared claim, or whatever part of an interrupted or failed prepare happened."""
        for share in record.shares:
            await self._sharing.release(claim_uid, share)
        if record.cdi_spec:
            cdi.remove_claim_spec(Path(record.cdi_spec))
        self._checkpoint.remove(claim_uid)
