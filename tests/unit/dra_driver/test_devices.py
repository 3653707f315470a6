"""Discovery: the simulated backend's profiles, health flips, naming and NVML helpers."""

from __future__ import annotations

import asyncio
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.naming import gpu_device_name, mig_device_name
from dra_driver.devices.profile import BackendUnavailable
from dra_driver.profiles.common import parse_bytes
from dra_driver.profiles.nvidia.nvml import cuda_version_text, mig_profile_from_name
from dra_driver.profiles.nvidia.simulated import PROFILE_DIR, SimulatedDiscovery
from dra_driver.profiles.registry import build_profile
from dra_driver.sharing import RecordingRunner

GIB = 1 << 30
MIB = 1 << 20


@pytest.mark.parametrize(
    ("profile", "count", "product", "memory", "mig_counts"),
    [
        ("h100x8", 8, "NVIDIA H100 80GB HBM3", 80 * GIB, [0] * 8),
        ("a100x4-mig", 4, "NVIDIA A100-SXM4-40GB", 40 * GIB, [2, 2, 5, 5]),
        ("t4x2", 2, "Tesla T4", 15360 * MIB, [0, 0]),
        ("mixed", 4, "NVIDIA A100-SXM4-80GB", 80 * GIB, [0, 0, 3, 0]),
        ("h100x2-mig", 2, "NVIDIA H100 80GB HBM3", 80 * GIB, [0, 0]),  # mig: dynamic, none made yet
        ("mig-models", 4, "NVIDIA A100-SXM4-40GB", 40 * GIB, [0, 0, 0, 0]),
    ],
)
def test_shipped_profiles_expand_to_expected_gpus(
    profile: str, count: int, product: str, memory: int, mig_counts: list[int]
) -> None:
    gpus = build_profile("simulated", Path(profile), node_name="node-a").discovery.inventory()
    assert len(gpus) == count
    assert gpus[0].product_name == product
    assert gpus[0].memory_bytes == memory
    assert [len(g.mig_devices) for g in gpus] == mig_counts
    assert [g.minor for g in gpus] == list(range(count))
    assert len({g.uuid for g in gpus}) == count
    assert all(g.uuid.startswith("GPU-") and g.healthy for g in gpus)


def test_every_shipped_profile_is_covered() -> None:
    assert sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")) == [
        "a100x4-mig",
        "h100x2-mig",
        "h100x8",
        "mig-models",
        "mixed",
        "t4x2",
    ]


def test_uuids_are_stable_per_node_and_differ_between_nodes() -> None:
    first = build_profile("simulated", Path("t4x2"), node_name="node-a").discovery.inventory()
    again = build_profile("simulated", Path("t4x2"), node_name="node-a").discovery.inventory()
    other = build_profile("simulated", Path("t4x2"), node_name="node-b").discovery.inventory()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert not {g.uuid for g in first} & {g.uuid for g in other}


def test_mig_profile_is_read_from_yaml() -> None:
    gpus = build_profile("simulated", Path("mixed"), node_name="n").discovery.inventory()
    mig_gpu = gpus[2]
    assert mig_gpu.mig_enabled
    assert [m.profile for m in mig_gpu.mig_devices] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert mig_gpu.mig_devices[0].memory_bytes == 19968 * MIB
    assert [(m.gi, m.ci) for m in mig_gpu.mig_devices] == [(1, 0), (2, 0), (3, 0)]
    assert all(m.uuid.startswith("MIG-") for m in mig_gpu.mig_devices)


def test_device_names() -> None:
    gpu = build_profile("simulated", Path("a100x4-mig"), node_name="n").discovery.inventory()[3]
    assert gpu_device_name(gpu) == "gpu-3"
    assert mig_device_name(gpu, gpu.mig_devices[4]) == "gpu-3-mig-5-0"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (17, 17),
        ("80Gi", 80 * GIB),
        ("512Mi", 512 * MIB),
        ("4096", 4096),
        ("1Ti", 1 << 40),
        ("1.5Gi", 1536 * MIB),
    ],
)
def test_parse_bytes_accepts_ints_and_binary_quantities(text: object, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["80GB", "-1", "lots", 0, True, "0.5", "1e400"])
def test_parse_bytes_rejects_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_bad_profile_gives_a_clear_error(tmp_path: Path) -> None:
    profile = tmp_path / "bad.yaml"
    profile.write_text(
        "driverVersion: '1'\ncudaDriverVersion: '12.0'\ngpus:\n  - productName: X\n    bogus: 1\n"
    )
    with pytest.raises(BackendUnavailable, match="invalid GPU profile") as error:
        build_profile("simulated", profile)
    assert "bogus" in str(error.value)


def test_missing_profile_gives_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="cannot read GPU profile"):
        build_profile("simulated", tmp_path / "absent.yaml")


def test_simulated_backend_needs_a_profile() -> None:
    with pytest.raises(BackendUnavailable, match="needs a profile"):
        build_profile("simulated")


async def test_health_flip_wakes_every_watcher_with_the_new_inventory() -> None:
    backend = SimulatedDiscovery.from_file(Path("h100x8"), node_name="n")
    first, second = backend.watch_health(), backend.watch_health()
    next_first = asyncio.ensure_future(anext(first))
    next_second = asyncio.ensure_future(anext(second))
    await asyncio.sleep(0)
    backend.set_health(3, healthy=False, message="XID 79")
    for pending in (next_first, next_second):
        gpus = await asyncio.wait_for(pending, 5)
        assert [g.minor for g in gpus if not g.healthy] == [3]
        assert gpus[3].health_message == "XID 79"
    await first.aclose()
    await second.aclose()


async def test_change_made_while_consumer_is_busy_is_not_lost() -> None:
    backend = SimulatedDiscovery.from_file(Path("t4x2"), node_name="n")
    watcher = backend.watch_health()
    pending = asyncio.ensure_future(anext(watcher))
    await asyncio.sleep(0)
    backend.set_health(0, healthy=False, message="XID 48")
    assert not (await asyncio.wait_for(pending, 5))[0].healthy
    # The consumer is "busy": this change happens before it asks for the next one.
    backend.set_health(0, healthy=True)
    assert (await asyncio.wait_for(anext(watcher), 5))[0].healthy
    await watcher.aclose()


def test_set_health_of_unknown_gpu_is_an_error() -> None:
    backend = SimulatedDiscovery.from_file(Path("t4x2"), node_name="n")
    with pytest.raises(KeyError):
        backend.set_health(9, healthy=False)


def test_nvml_value_helpers() -> None:
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(12080) == "12.8"
    assert mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert mig_profile_from_name("NVIDIA H100 80GB HBM3") == ""


def test_nvml_backend_without_the_library_is_a_clear_error() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(BackendUnavailable, match="NVML could not start"):
        build_profile("nvml")


class FakeNvml(types.ModuleType):
    """Just enough of pynvml for two GPUs, the second in MIG mode with one instance."""

    NVML_DEVICE_MIG_ENABLE = 1
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        pass

    class NVMLError_Timeout(NVMLError):  # pynvml's own name
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.lost: set[int] = set()
        self.xids: list[tuple[int, int]] = []  # (gpu index, xid) events still to deliver
        self.freed = False
        self.second_mig = False  # GPU 1 shows a second MIG device (GPU instance 3) in slot 1

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, handle: tuple[str, int], types: int, event_set: str) -> None:
        assert types == self.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> types.SimpleNamespace:
        if not self.xids:
            time.sleep(0.01)
            raise self.NVMLError_Timeout("timeout")
        index, xid = self.xids.pop(0)
        return types.SimpleNamespace(device=("gpu", index), eventData=xid)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if index in self.lost:
            raise self.NVMLError("GPU is lost")
        return ("gpu", index)

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[str, int]) -> tuple[int, int]:
        return (8, 0)

    def nvmlDeviceGetPciInfo(self, handle: tuple[str, int]) -> types.SimpleNamespace:
        return types.SimpleNamespace(busId=f"00000000:{0x10 + handle[1]:02X}:00.0".encode())

    def nvmlDeviceGetMigMode(self, handle: tuple[str, int]) -> list[int]:
        if handle[1] == 0:
            raise self.NVMLError("Not Supported")
        return [1, 1]

    def nvmlDeviceGetMinorNumber(self, handle: tuple[str, int]) -> int:
        return handle[1]

    def nvmlDeviceGetUUID(self, handle: tuple[str, int]) -> str:
        return f"{'MIG' if handle[0] == 'mig' else 'GPU'}-{handle[1]}"

    def nvmlDeviceGetName(self, handle: tuple[str, int]) -> str:
        return "NVIDIA A100-SXM4-40GB MIG 3g.20gb" if handle[0] == "mig" else "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetBrand(self, handle: tuple[str, int]) -> int:
        return 2

    def nvmlDeviceGetArchitecture(self, handle: tuple[str, int]) -> int:
        return 7

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[str, int]) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=(20 if handle[0] == "mig" else 40) * GIB)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[str, int]) -> int:
        return 2

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple[str, int], slot: int) -> tuple[str, int]:
        if slot == 1:
            if not self.second_mig:
                raise self.NVMLError("Not Found")
            return ("mig", 8)
        return ("mig", 7)

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[str, int]) -> int:
        return 3 if handle == ("mig", 8) else 2

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[str, int]) -> int:
        return 0

    def nvmlDeviceGetGpuInstanceById(self, handle: tuple[str, int], gpu_instance: int) -> tuple[str, int]:
        return ("gi", gpu_instance)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: tuple[str, int]) -> types.SimpleNamespace:
        # GPU instance 2 is a 3g.20gb at memory slices 4-7.
        return types.SimpleNamespace(
            id=gpu_instance[1], profileId=9, placement=types.SimpleNamespace(start=4, size=4)
        )

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, int]:
        return ("gpu", int(uuid.rsplit("-", 1)[1]))


def test_nvml_backend_reads_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus = build_profile("nvml").discovery.inventory()
    assert [(g.minor, g.uuid, g.mig_enabled) for g in gpus] == [(0, "GPU-0", False), (1, "GPU-1", True)]
    whole = gpus[0]
    assert whole.product_name == "NVIDIA A100-SXM4-40GB"
    assert whole.attributes == {
        "brand": {"string": "Tesla"},
        "architecture": {"string": "Ampere"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
    }
    assert (whole.pci_bus_id, whole.memory_bytes) == ("00000000:10:00.0", 40 * GIB)
    (mig,) = gpus[1].mig_devices
    assert (mig.gi, mig.ci, mig.profile, mig.uuid, mig.memory_bytes) == (2, 0, "3g.20gb", "MIG-7", 20 * GIB)
    assert mig.placement_start == 4  # from its GPU instance's placement


async def test_nvml_gpus_in_mig_mode_get_their_placements_and_mig_device_uuids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    profile = build_profile("nvml")
    gpus = profile.discovery.inventory()
    assert gpus[0].mig_layout is None  # MIG not supported
    layout = gpus[1].mig_layout  # an A100 40GB in MIG mode
    assert layout is not None and len(layout.placements) == 18 and layout.full.profile == "7g.40gb"
    # The partitioner reads a made instance's MIG device uuid from NVML (GPU instance 2, CI 0).
    discovery: Any = profile.discovery
    assert await discovery.mig_device_uuid("GPU-1", 2, 0) == "MIG-7"
    assert profile.partitioner(RecordingRunner().run, Path("/nonexistent")) is not None


def test_nvml_gpu_that_stops_answering_is_reported_unhealthy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = build_profile("nvml").discovery
    assert all(g.healthy for g in backend.inventory())
    fake.lost.add(1)
    gpus = backend.inventory()
    assert [g.healthy for g in gpus] == [True, False]
    assert "GPU is lost" in gpus[1].health_message


async def test_nvml_xid_event_marks_the_gpu_unhealthy_but_application_xids_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = build_profile("nvml").discovery
    fake.xids = [(0, 13), (1, 79)]  # 13: the application's fault; 79: the GPU fell off the bus
    watcher = backend.watch_health()
    gpus = await asyncio.wait_for(anext(watcher), 10)
    assert [(g.healthy, g.health_message) for g in gpus] == [(True, ""), (False, "XID 79")]
    await watcher.aclose()
    await asyncio.wait_for(asyncio.to_thread(_wait_for, lambda: fake.freed), 10)


def _wait_for(condition: Callable[[], bool]) -> None:
    while not condition():
        time.sleep(0.01)
