"""NVIDIA discovery and health through NVML (the ``pynvml`` module of nvidia-ml-py).

Every NVML call goes through this module. Health comes from an NVML event set listening for
critical XID errors; where events are not supported (some vGPU and container setups) a poll
re-reads each GPU and marks the ones NVML can no longer answer for. NVML has no event for a MIG
instance made or destroyed, so the same thread lists the MIG devices of the GPUs in MIG mode
every ``PARTITION_POLL_S`` and reports a change like a health change (a new inventory): an
administrator's instance is published, or withdrawn, within seconds.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import ModuleType
from typing import Any

from dra_driver.devices.model import Gpu, MigDevice
from dra_driver.devices.profile import BackendUnavailable
from dra_driver.devices.share import SharingCommandError
from dra_driver.profiles.common import PARTITION_POLL_S, SYSFS_PCI_DEVICES, pcie_root_of
from dra_driver.profiles.nvidia.attributes import nvidia_attributes
from dra_driver.profiles.nvidia.migtables import mig_layout

log = logging.getLogger(__name__)

# XIDs caused by the application (bad memory access, user-aborted kernels, ...): the GPU is fine.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
EVENT_WAIT_MS = 1000
POLL_INTERVAL_S = 10.0

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
_BRANDS = {
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    5: "GeForce",
    6: "Titan",
    12: "Quadro RTX",
    13: "Nvidia RTX",
    14: "Nvidia",
}


def _import_pynvml() -> ModuleType:
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendUnavailable(
            "the nvml backend needs the 'pynvml' module (pip install nvidia-ml-py); "
            "use --backend simulated on machines without NVIDIA GPUs"
        ) from exc
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def cuda_version_text(encoded: int) -> str:
    """NVML encodes the CUDA driver version as 1000*major + 10*minor (12040 -> "12.4")."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def mig_profile_from_name(name: str) -> str:
    """The profile from a MIG device's NVML name, e.g. "NVIDIA A100-SXM4-40GB MIG 1g.5gb"."""
    _, marker, profile = name.rpartition("MIG ")
    return profile.strip() if marker else ""


def sysfs_bus_id(pci_bus_id: str) -> str:
    """NVML pads the PCI domain to 8 hex digits; sysfs uses 4."""
    return pci_bus_id.lower()[-12:]


class _PartitionPoll:
    """Lists the MIG devices (``list_now``) at most every ``PARTITION_POLL_S``; says when they
    differ from the last listing."""

    def __init__(self, list_now: Callable[[], object]) -> None:
        self._list_now = list_now
        self._listed = list_now()
        self._due = time.monotonic() + PARTITION_POLL_S

    def changed(self) -> bool:
        if time.monotonic() < self._due:
            return False
        self._due = time.monotonic() + PARTITION_POLL_S
        listed = self._list_now()
        if listed == self._listed:
            return False
        self._listed = listed
        return True


class NvmlDiscovery:
    """Reads the node's GPUs from NVML; health from XID events or polling, MIG instances made or
    destroyed by polling."""

    def __init__(self) -> None:
        self._nvml = _import_pynvml()
        self._lock = threading.Lock()
        self._unhealthy: dict[str, str] = {}  # uuid -> reason, sticky until the process restarts
        self._last_seen: dict[int, Gpu] = {}  # index -> last successful read, for GPUs that stop answering
        with self._session():
            log.info("NVML ready: driver %s", _text(self._nvml.nvmlSystemGetDriverVersion()))

    @contextmanager
    def _session(self) -> Iterator[ModuleType]:
        """nvmlInit/nvmlShutdown are reference counted, so short sessions nest safely."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise BackendUnavailable(
                f"NVML could not start ({exc}); is the NVIDIA driver installed and the device visible?"
            ) from exc
        try:
            yield nvml
        finally:
            nvml.nvmlShutdown()

    def inventory(self) -> list[Gpu]:
        with self._session() as nvml:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            cuda = cuda_version_text(nvml.nvmlSystemGetCudaDriverVersion_v2())
            gpus: list[Gpu] = []
            for index in range(nvml.nvmlDeviceGetCount()):
                try:
                    gpu: Gpu | None = self._read_gpu(nvml, index, driver, cuda)
                except nvml.NVMLError as exc:
                    gpu = self._lost_gpu(index, str(exc))
                if gpu is None:
                    log.error("GPU %d cannot be read and was never seen before", index)
                    continue
                self._last_seen[index] = gpu
                gpus.append(gpu)
        with self._lock:
            unhealthy = dict(self._unhealthy)
        marked = [
            replace(gpu, healthy=False, health_message=unhealthy[gpu.uuid]) if gpu.uuid in unhealthy else gpu
            for gpu in gpus
        ]
        return sorted(marked, key=lambda gpu: gpu.minor)

    def _lost_gpu(self, index: int, error: str) -> Gpu | None:
        """A GPU that stopped answering keeps its last known identity and is marked unhealthy."""
        last = self._last_seen.get(index)
        if last is None:
            return None
        self._mark_unhealthy(last.uuid, f"NVML query failed: {error}")
        return last

    def _read_gpu(self, nvml: ModuleType, index: int, driver: str, cuda: str) -> Gpu:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        pci_bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        mig_enabled = self._mig_enabled(nvml, handle)
        product_name = _text(nvml.nvmlDeviceGetName(handle))
        memory_bytes = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        return Gpu(
            minor=int(nvml.nvmlDeviceGetMinorNumber(handle)),
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            product_name=product_name,
            pci_bus_id=pci_bus_id,
            memory_bytes=memory_bytes,
            mig_enabled=mig_enabled,
            mig_devices=self._mig_devices(nvml, handle) if mig_enabled else (),
            mig_layout=mig_layout(product_name, memory_bytes) if mig_enabled else None,
            pcie_root=pcie_root_of(SYSFS_PCI_DEVICES / sysfs_bus_id(pci_bus_id)),
            attributes=nvidia_attributes(
                brand=_BRANDS.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown"),
                architecture=self._architecture(nvml, handle),
                cuda_compute_capability=f"{major}.{minor_cc}",
                driver_version=driver,
                cuda_driver_version=cuda,
            ),
        )

    @staticmethod
    def _architecture(nvml: ModuleType, handle: Any) -> str:
        try:
            return _ARCHITECTURES.get(int(nvml.nvmlDeviceGetArchitecture(handle)), "Unknown")
        except nvml.NVMLError:
            return "Unknown"

    @staticmethod
    def _mig_enabled(nvml: ModuleType, handle: Any) -> bool:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:  # GPUs without MIG answer NOT_SUPPORTED
            return False
        return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)

    @staticmethod
    def _mig_devices(nvml: ModuleType, handle: Any) -> tuple[MigDevice, ...]:
        devices: list[MigDevice] = []
        for slot in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:  # empty slot
                continue
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            devices.append(
                MigDevice(
                    gi=gi,
                    ci=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                    profile=mig_profile_from_name(_text(nvml.nvmlDeviceGetName(mig))),
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(mig).total),
                    placement_start=NvmlDiscovery._placement_start(nvml, handle, gi),
                )
            )
        return tuple(sorted(devices, key=lambda m: (m.gi, m.ci)))

    @staticmethod
    def _placement_start(nvml: ModuleType, handle: Any, gpu_instance: int) -> int | None:
        """The GPU instance's first memory slice; None where NVML will not say (it needs
        privileges): the instance then blocks every placement of its GPU."""
        try:
            info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance))
        except nvml.NVMLError:
            return None
        return int(info.placement.start)

    async def mig_device_uuid(self, gpu_uuid: str, gpu_instance: int, compute_instance: int) -> str:
        """The uuid of the MIG device a GPU and compute instance make (read after creating them)."""
        return await asyncio.to_thread(self._read_mig_device_uuid, gpu_uuid, gpu_instance, compute_instance)

    def _read_mig_device_uuid(self, gpu_uuid: str, gpu_instance: int, compute_instance: int) -> str:
        with self._session() as nvml:
            handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
            for mig in self._mig_devices(nvml, handle):
                if (mig.gi, mig.ci) == (gpu_instance, compute_instance):
                    return mig.uuid
        raise SharingCommandError(f"GPU {gpu_uuid} has no MIG device {gpu_instance}/{compute_instance}")

    def _partitions(self, nvml: ModuleType) -> list[tuple[int, tuple[MigDevice, ...]]]:
        """The MIG devices of each GPU in MIG mode, by index (a GPU that does not answer is left
        out: its health is the health watch's business)."""
        listed: list[tuple[int, tuple[MigDevice, ...]]] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                if self._mig_enabled(nvml, handle):
                    listed.append((index, self._mig_devices(nvml, handle)))
            except nvml.NVMLError:
                continue
        return listed

    def _mark_unhealthy(self, gpu_uuid: str, reason: str) -> bool:
        with self._lock:
            if gpu_uuid in self._unhealthy:
                return False
            self._unhealthy[gpu_uuid] = reason
        log.warning("GPU %s marked unhealthy: %s", gpu_uuid, reason)
        return True

    async def watch_health(self) -> AsyncGenerator[list[Gpu], None]:
        changes: asyncio.Queue[None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def notify() -> None:
            loop.call_soon_threadsafe(changes.put_nowait, None)

        watcher = threading.Thread(
            target=self._watch_events, args=(notify, stop), name="nvml-health", daemon=True
        )
        watcher.start()
        try:
            while True:
                await changes.get()
                yield await asyncio.to_thread(self.inventory)
        finally:
            stop.set()

    def _watch_events(self, notify: Callable[[], None], stop: threading.Event) -> None:
        """Blocking loop on its own thread: XID events when supported, else polling; the MIG
        devices listed every ``PARTITION_POLL_S`` either way."""
        with self._session() as nvml:
            partitions = _PartitionPoll(lambda: self._partitions(nvml))
            try:
                event_set = self._register_xid_events(nvml)
            except nvml.NVMLError as exc:
                log.warning("NVML events unavailable (%s); polling health every %ss", exc, POLL_INTERVAL_S)
                event_set = None
            if event_set is None:
                self._poll(nvml, notify, stop, partitions)
                return
            try:
                while not stop.is_set():
                    if partitions.changed():
                        notify()
                    try:
                        event = nvml.nvmlEventSetWait_v2(event_set, EVENT_WAIT_MS)
                    except nvml.NVMLError_Timeout:
                        continue
                    xid = int(event.eventData)
                    if xid in APPLICATION_XIDS:
                        log.info("ignoring application XID %d", xid)
                        continue
                    gpu_uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
                    if self._mark_unhealthy(gpu_uuid, f"XID {xid}"):
                        notify()
            finally:
                nvml.nvmlEventSetFree(event_set)

    @staticmethod
    def _register_xid_events(nvml: ModuleType) -> Any:
        event_set = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        return event_set

    def _poll(
        self, nvml: ModuleType, notify: Callable[[], None], stop: threading.Event, partitions: _PartitionPoll
    ) -> None:
        known = {
            index: _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))
            for index in range(nvml.nvmlDeviceGetCount())
        }
        health_due = time.monotonic() + POLL_INTERVAL_S
        while not stop.wait(min(PARTITION_POLL_S, POLL_INTERVAL_S)):
            if partitions.changed():
                notify()
            if time.monotonic() < health_due:
                continue
            health_due = time.monotonic() + POLL_INTERVAL_S
            for index, gpu_uuid in known.items():
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    nvml.nvmlDeviceGetMemoryInfo(handle)
                except nvml.NVMLError as exc:
                    if self._mark_unhealthy(gpu_uuid, f"NVML query failed: {exc}"):
                        notify()
