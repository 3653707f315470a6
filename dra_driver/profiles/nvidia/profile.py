"""The NVIDIA device profile: GPUs found by NVML (``--backend nvml``) or described by a YAML file
(``--backend simulated``), handed to containers as ``/dev/nvidia<minor>`` plus the control and
UVM nodes with ``NVIDIA_VISIBLE_DEVICES``, shared with time-slicing or MPS (``sharing.py``); a MIG
device adds its capability nodes (``migcaps.py``) and is named by its ``MIG-<uuid>``.

The simulated backend is this profile with simulated discovery: same attributes, environment and
commands, but its GPUs have no device nodes (a runtime refuses a CDI spec naming a node that does
not exist, e.g. on a kind node) and its commands are recorded instead of run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from contract.gpuconfig import SharingStrategy
from dra_driver.devices.model import Gpu, NodeDevice
from dra_driver.devices.profile import Discovery
from dra_driver.devices.share import ContainerEdits, RunCommand
from dra_driver.profiles.nvidia.mig import InstanceUuid, NvidiaMig, SimulatedSmi
from dra_driver.profiles.nvidia.migcaps import MigCapabilities, SimulatedCapabilities
from dra_driver.profiles.nvidia.sharing import NvidiaSharing

# Nodes every CUDA container needs besides its GPUs' own /dev/nvidia<minor>.
COMMON_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
STRATEGIES = frozenset(SharingStrategy)  # every one the contract names: nvidia-smi and MPS set them up
SIMULATED_MIG_STATE = "simulated-mig.json"  # the simulated GPUs' MIG instances, kept across restarts
SIMULATED_PROC = "simulated-proc"  # their capability files, as a real driver shows them under /proc
PROC_ROOT = Path("/proc")


class NvidiaProfile:
    def __init__(
        self,
        name: str,
        discovery: Discovery,
        *,
        simulated: bool,
        mig_device_uuid: InstanceUuid | None = None,
        simulated_mig_command_s: float = 0.0,
    ) -> None:
        self._name = name
        self._discovery = discovery
        self._simulated = simulated
        self._mig_device_uuid = mig_device_uuid
        self._simulated_mig_command_s = simulated_mig_command_s

    @property
    def name(self) -> str:
        return self._name

    @property
    def discovery(self) -> Discovery:
        return self._discovery

    @property
    def simulated(self) -> bool:
        return self._simulated

    @property
    def strategies(self) -> frozenset[SharingStrategy]:
        return STRATEGIES

    def device_nodes(self, gpu: Gpu) -> tuple[str, ...]:
        return () if gpu.simulated else (f"/dev/nvidia{gpu.minor}",)

    def claim_edits(self, devices: Sequence[NodeDevice]) -> ContainerEdits:
        # The common nodes come with GPUs that have nodes of their own: simulated ones name none.
        return ContainerEdits(
            env={VISIBLE_DEVICES_ENV: ",".join(device.uuid for device in devices)},
            device_nodes=COMMON_DEVICE_NODES if any(device.device_nodes for device in devices) else (),
        )

    def sharing(self, state_dir: Path) -> NvidiaSharing:
        return NvidiaSharing(state_dir)

    def partitioner(self, run: RunCommand, state_dir: Path) -> NvidiaMig | None:
        gpus = self._discovery.inventory()
        if self._simulated:
            proc_root = state_dir / SIMULATED_PROC
            capabilities = SimulatedCapabilities(proc_root)
            for gpu in gpus:  # the instances an administrator made have their files from the start
                for mig in gpu.mig_devices:
                    capabilities.add(gpu.minor, mig.gi)
                    capabilities.add(gpu.minor, mig.gi, mig.ci)
            smi = SimulatedSmi(
                state_dir / SIMULATED_MIG_STATE, gpus, run, self._simulated_mig_command_s, capabilities
            )
            return NvidiaMig(smi.run, smi.instance_uuid, MigCapabilities(proc_root), gpus)
        if self._mig_device_uuid is None:
            return None
        return NvidiaMig(run, self._mig_device_uuid, MigCapabilities(PROC_ROOT), gpus)
