"""NVIDIA's sharing setup: ``nvidia-smi`` and the MPS control daemon.

- Exclusive: no command.
- TimeSlicing: ``nvidia-smi`` sets the compute mode to DEFAULT and the time-slice interval; both
  are reset when the last claim on the GPU goes away.
- MPS: one MPS control daemon per GPU (compute mode EXCLUSIVE_PROCESS), its pipe and log
  directories under the driver's state directory; each claim's containers get their own
  pinned-memory limit (= allocated memory) and active-thread percentage through environment
  variables, and the MPS directories mounted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from contract.gpuconfig import TIMESLICE_INTERVALS, SharingStrategy
from dra_driver.devices.share import Command, ContainerEdits, GpuShare

# Where the MPS directories appear inside a container.
MPS_CONTAINER_PIPE_DIR = "/tmp/nvidia-mps"
MPS_CONTAINER_LOG_DIR = "/var/log/nvidia-mps"
_MIB = 1 << 20


class NvidiaSharing:
    """The commands and MPS directories of NVIDIA's strategies; the directories of a GPU live
    under ``<mps_root>/<gpu uuid>/``."""

    def __init__(self, mps_root: Path) -> None:
        self.root = mps_root

    def pipe(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "pipe"

    def log(self, gpu_uuid: str) -> Path:
        return self.root / gpu_uuid / "log"

    def _daemon_env(self, gpu_uuid: str) -> tuple[tuple[str, str], ...]:
        return (
            ("CUDA_VISIBLE_DEVICES", gpu_uuid),
            ("CUDA_MPS_PIPE_DIRECTORY", str(self.pipe(gpu_uuid))),
            ("CUDA_MPS_LOG_DIRECTORY", str(self.log(gpu_uuid))),
        )

    def setup_commands(self, share: GpuShare) -> list[Command]:
        uuid = share.gpu_uuid
        if share.strategy == SharingStrategy.TIME_SLICING:
            interval = str(TIMESLICE_INTERVALS.index(share.timeslice))
            return [
                Command(("nvidia-smi", "-i", uuid, "-c", "DEFAULT")),
                Command(("nvidia-smi", "compute-policy", "-i", uuid, "--set-timeslice", interval)),
            ]
        if share.strategy == SharingStrategy.MPS:
            return [
                Command(("nvidia-smi", "-i", uuid, "-c", "EXCLUSIVE_PROCESS")),
                Command(("nvidia-cuda-mps-control", "-d"), env=self._daemon_env(uuid)),
            ]
        return []

    def reset_commands(self, strategy: SharingStrategy, gpu_uuid: str) -> list[Command]:
        if strategy == SharingStrategy.TIME_SLICING:
            return [Command(("nvidia-smi", "compute-policy", "-i", gpu_uuid, "--set-timeslice", "0"))]
        if strategy == SharingStrategy.MPS:
            return [
                Command(("nvidia-cuda-mps-control",), env=self._daemon_env(gpu_uuid), stdin="quit\n"),
                Command(("nvidia-smi", "-i", gpu_uuid, "-c", "DEFAULT")),
            ]
        return []

    def prepare_host(self, share: GpuShare) -> None:
        if share.strategy == SharingStrategy.MPS:
            self.pipe(share.gpu_uuid).mkdir(parents=True, exist_ok=True)
            self.log(share.gpu_uuid).mkdir(parents=True, exist_ok=True)

    def clean_host(self, strategy: SharingStrategy, gpu_uuid: str) -> None:
        if strategy == SharingStrategy.MPS:
            shutil.rmtree(self.root / gpu_uuid, ignore_errors=True)

    def container_edits(self, share: GpuShare) -> ContainerEdits:
        if share.strategy != SharingStrategy.MPS:
            return ContainerEdits()
        limit_mib = max(1, share.memory_limit_bytes // _MIB)
        return ContainerEdits(
            env={
                "CUDA_MPS_PIPE_DIRECTORY": MPS_CONTAINER_PIPE_DIR,
                "CUDA_MPS_LOG_DIRECTORY": MPS_CONTAINER_LOG_DIR,
                # Device ordinal 0: the container sees exactly this GPU.
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={limit_mib}M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share.active_thread_percentage),
            },
            mounts=(
                (str(self.pipe(share.gpu_uuid)), MPS_CONTAINER_PIPE_DIR),
                (str(self.log(share.gpu_uuid)), MPS_CONTAINER_LOG_DIR),
            ),
        )
