"""Shared test data for the kubelet-plugin tests: GPUs, allocated ResourceClaims, a claim source."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.model import Gpu
from dra_driver.plugin import HEALTH_REFRESH_S, DeviceInventory, DraPlugin, build_plugin
from dra_driver.prepare import ClaimPrepareError, ClaimReader, Preparer, node_devices
from dra_driver.profiles.nvidia.attributes import nvidia_attributes
from dra_driver.profiles.nvidia.profile import NvidiaProfile
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.sharing import RecordingRunner, SharingManager

DRIVER = "gpu.tessera.dev"
NODE = "node-a"
GIB = 1 << 30


def gpu(minor: int, memory_gib: int = 80, healthy: bool = True) -> Gpu:
    return Gpu(
        minor=minor,
        index=minor,
        uuid=f"GPU-{minor:08d}-test",
        product_name="NVIDIA H100 80GB HBM3",
        pci_bus_id=f"00000000:{minor + 10:02x}:00.0",
        memory_bytes=memory_gib * GIB,
        healthy=healthy,
        health_message="" if healthy else "XID 79",
        attributes=nvidia_attributes(
            brand="Nvidia",
            architecture="Hopper",
            cuda_compute_capability="9.0",
            driver_version="570.124.06",
            cuda_driver_version="12.8",
        ),
    )


def nvidia(gpus: list[Gpu] | None = None) -> NvidiaProfile:
    """The NVIDIA profile as on a real node (device nodes, real commands), over ``gpus``."""
    return NvidiaProfile(
        "nvml", SimulatedDiscovery(gpus if gpus is not None else [gpu(0), gpu(1)]), simulated=False
    )


@dataclass(frozen=True)
class Result:
    device: str
    request: str = "gpu"
    memory: str | None = None  # consumedCapacity.memory
    compute: str | None = None  # consumedCapacity.compute
    driver: str = DRIVER
    pool: str = NODE
    share_id: str | None = None


def claim(
    uid: str,
    results: list[Result],
    configs: list[dict[str, Any]] | None = None,
    name: str = "claim",
    namespace: str = "ns",
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the API returns it (camelCase JSON)."""

    def result_json(r: Result) -> dict[str, Any]:
        out: dict[str, Any] = {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
        consumed = {k: v for k, v in (("memory", r.memory), ("compute", r.compute)) if v is not None}
        if consumed:
            out["consumedCapacity"] = consumed
        if r.share_id:
            out["shareID"] = r.share_id
        return out

    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": [result_json(r) for r in results], "config": configs or []},
            "nodeSelector": {"nodeSelectorTerms": []},
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"uid": uid, "name": name, "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]}
        },
        "status": status,
    }


def opaque(parameters: Any, source: str = "FromClaim", requests: list[str] | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": DRIVER, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def gpu_config(sharing: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"apiVersion": "gpu.tessera.dev/v1alpha1", "kind": "GpuConfig", **extra}
    if sharing is not None:
        config["sharing"] = sharing
    return config


@dataclass
class FakeClaims:
    """Claims by (namespace, name); counts reads so tests can tell a checkpoint answer from a redo."""

    claims: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0

    def add(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimPrepareError(f"reading ResourceClaim {namespace}/{name}: 404 Not Found") from None


def make_preparer(
    tmp_path: Path, claims: FakeClaims, runner: RecordingRunner, gpus: list[Gpu] | None = None
) -> Preparer:
    """A Preparer on tmp dirs; build a second one on the same tmp_path to simulate a restart."""
    profile = nvidia(gpus)
    devices = node_devices(profile.discovery.inventory(), profile)
    return Preparer(
        driver_name=DRIVER,
        node_name=NODE,
        devices=lambda: devices,
        profile=profile,
        claims=claims,
        checkpoint=Checkpoint(tmp_path / "checkpoint"),
        sharing=SharingManager(runner, profile.sharing(tmp_path / "mps")),
        cdi_dir=tmp_path / "cdi",
    )


def make_plugin(
    root: Path,
    claims: ClaimReader,
    gpus: list[Gpu] | None = None,
    health_refresh_s: float = HEALTH_REFRESH_S,
    runner: RecordingRunner | None = None,
) -> tuple[DraPlugin, DeviceInventory]:
    """A plugin (not started) with all its directories under ``root``, recording sharing commands
    (into ``runner`` when given); a second one on the same ``root`` is a second instance of the
    driver on the same node."""
    profile = nvidia(gpus)
    return build_plugin(
        driver_name=DRIVER,
        node_name=NODE,
        profile=profile,
        gpus=profile.discovery.inventory(),
        claims=claims,
        runner=runner if runner is not None else RecordingRunner(),
        plugin_dir=root / "plugins",
        registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        checkpoint_dir=root / "state",
        health_refresh_s=health_refresh_s,
    )
