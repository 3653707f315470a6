#!/usr/bin/env bash
# The DRA driver on a real NVIDIA GPU node, without Kubernetes: run as root on the node.
#
#   sudo hack/gpu-check.sh [MEMORY]      MEMORY: the fractional claim's memory, default 10Gi
#
# 1. NVML discovery: the ResourceSlices the driver would publish for this node (JSON).
# 2. A fractional claim (MEMORY of GPU 0, through MPS) prepared by the driver's own preparer with
#    the real command runner: compute mode EXCLUSIVE_PROCESS, an MPS control daemon, and the CDI
#    spec with the claim's limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, thread percentage).
# 3. CUDA allocations as that claim's client: half the limit must succeed, the limit plus 1 GiB
#    must fail (CUDA_ERROR_OUT_OF_MEMORY); either other outcome fails the check.
# 4. Unprepare: MPS stopped, compute mode back to DEFAULT, CDI spec removed (also on failure).
# 5. MIG partitions on demand, on a GPU whose MIG mode is already on, at the first 1g placement
#    the slices publish there (clear of any instance someone else made, which is left as it is):
#    a 1g claim prepared with the driver's partitioner (nvidia-smi mig -lgi, -cgi <id>:<start>
#    -C), its MIG device listed by nvidia-smi -L and used by a CUDA allocation through its uuid,
#    the two capability nodes its CDI spec names printed (/dev/nvidia-caps/nvidia-cap<m> of its
#    GPU and compute instance, with the host's node beside them), then unprepared (-lgi, -dci,
#    -dgi) and the GPU's instances exactly those before. MIG mode is never changed: it needs
#    a GPU reset, and on a shared or lent machine it is not this script's to change. Without such
#    a GPU the step says why and is skipped (steps 2-4 need a GPU not in MIG mode, likewise).
#
# Needs: the NVIDIA driver (libcuda.so.1, nvidia-smi, nvidia-cuda-mps-control), the project's
# Python environment with nvidia-ml-py ($PYTHON, default .venv/bin/python), no other GPU work on
# GPU 0 (its compute mode changes for the duration). Exit code 0 only when every step held.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
memory=${1:-10Gi}

if [[ $EUID -ne 0 ]]; then
  echo "gpu-check: run as root (compute modes and the MPS daemon need it)" >&2
  exit 2
fi
for tool in nvidia-smi nvidia-cuda-mps-control; do
  command -v "$tool" >/dev/null || { echo "gpu-check: $tool not found" >&2; exit 2; }
done
"$python" -c 'import pynvml' 2>/dev/null || {
  echo "gpu-check: $python lacks pynvml (pip install nvidia-ml-py)" >&2
  exit 2
}

work=$(mktemp -d /tmp/tgc-XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== gpu-check on $(hostname), $(date -u +%FT%TZ), work dir $work"
nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_mode --format=csv

cd "$root"
PYTHONPATH="$root" "$python" - "$work" "$memory" <<'PYTHON'
"""Steps 1-4 above, with the driver's own code (nothing here re-implements it)."""

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from contract.quantity import parse_quantity
from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.model import Gpu, NodeDevice
from dra_driver.prepare import ClaimRef, Preparer, node_devices
from dra_driver.profiles.nvidia.mig import parse_gpu_instances
from dra_driver.profiles.registry import build_profile
from dra_driver.sharing import ProcessRunner, SharingManager
from dra_driver.slices import NodeRef, SharingMode, build_devices, build_slices

DRIVER = "gpu.tessera.dev"
GIB = 1 << 30
work, memory = Path(sys.argv[1]), sys.argv[2]
node = socket.gethostname()

# A CUDA client in its own process, so each allocation starts from a fresh context.
ALLOCATE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def call(name, *args):
    code = getattr(cuda, name)(*args)
    if code:
        text = ctypes.c_char_p()
        cuda.cuGetErrorName(code, ctypes.byref(text))
        print(f"{name}: {text.value.decode()}")
        sys.exit(3 if text.value == b"CUDA_ERROR_OUT_OF_MEMORY" else 4)
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
call("cuInit", 0)
call("cuDeviceGet", ctypes.byref(device), 0)
call("cuCtxCreate_v2", ctypes.byref(context), 0, device)
call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(int(sys.argv[1])))
print(f"allocated {int(sys.argv[1]) / (1 << 30):.2f} GiB")
"""


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


class OneClaim:
    """The API's answer for the one claim of a check."""

    def __init__(self, claim: dict[str, Any]) -> None:
        self.claim = claim

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.claim


def allocate(size: int, env: dict[str, str]) -> int:
    command = [sys.executable, "-c", ALLOCATE, str(size)]
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


def compute_mode(uuid: str) -> None:
    query = ["nvidia-smi", "-i", uuid, "--query-gpu=uuid,compute_mode", "--format=csv,noheader"]
    subprocess.run(query, check=False)


def claim_of(name: str, device: str, consumed: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": node, "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    return {
        "metadata": {"namespace": "gpu-check", "name": name, "uid": f"gpu-check-{name}"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def preparer_for(profile: Any, devices: dict[str, NodeDevice], claim: dict[str, Any], state: str) -> Preparer:
    runner = ProcessRunner()
    return Preparer(
        driver_name=DRIVER,
        node_name=node,
        devices=lambda: devices,
        profile=profile,
        claims=OneClaim(claim),
        checkpoint=Checkpoint(work / state),
        sharing=SharingManager(runner, profile.sharing(work / "mps")),
        cdi_dir=work / "cdi",
        partitioner=profile.partitioner(runner.run, work / state),
    )


def run_text(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=False).stdout


async def main() -> int:
    step("1. NVML discovery: the ResourceSlices this node would publish")
    profile = build_profile("nvml")
    gpus = profile.discovery.inventory()
    slices = build_slices(
        NodeRef(node), DRIVER, gpus, SharingMode.CONSUMABLE_CAPACITY, generation=1, partitionable=True
    )
    print(json.dumps(slices, indent=2))
    if not gpus:
        print("no GPU found")
        return 1
    devices = node_devices(gpus, profile)
    results: dict[str, bool] = {}
    whole = [d for d in devices.values() if not d.is_mig and d.placement is None]
    if whole:
        results["MPS"] = await mps_check(profile, devices, whole[0])
    else:
        print("\nSKIPPED steps 2-4 (MPS): every GPU here is in MIG mode; MPS needs one that is not")
    placements = [(g, p) for g in gpus if (p := free_1g_placement(g, devices)) is not None]
    if placements:
        results["MIG"] = await mig_check(profile, devices, *placements[0])
    else:
        print(f"\nSKIPPED step 5 (MIG): {why_no_mig(gpus)}")
    print(f"\nRESULTS: {results or 'nothing could be checked on this machine'}")
    return 0 if results and all(results.values()) else 1


def free_1g_placement(gpu: Gpu, devices: dict[str, NodeDevice]) -> NodeDevice | None:
    """The first 1g placement the slices publish on a partitionable GPU: clear of every instance
    someone else made there (none is published beside an instance of unknown placement)."""
    if gpu.mig_layout is None:
        return None
    for published in build_devices([gpu], DRIVER, SharingMode.CONSUMABLE_CAPACITY, partitionable=True):
        device = devices.get(published["name"])
        placement = device.placement if device is not None and device.is_mig else None
        if placement is not None and placement.compute_slices == 1:
            return device
    return None


def why_no_mig(gpus: list[Gpu]) -> str:
    if any(g.mig_layout is not None for g in gpus):
        return (
            "the instances someone else made on every GPU in MIG mode cover each 1g placement (or "
            "their placement is unknown); they are left as they are"
        )
    if any(g.mig_enabled for g in gpus):
        return "the GPUs in MIG mode are of a model without a placement table (A100, H100, H200)"
    return (
        "no GPU here has MIG mode on, and this check never turns it on: that takes a GPU reset "
        "(nvidia-smi -i <n> -mig 1, by an administrator, on a GPU nothing else uses)"
    )


async def mps_check(profile: Any, devices: dict[str, NodeDevice], gpu0: NodeDevice) -> bool:
    step(f"2. prepare a {memory} fraction of {gpu0.name} with MPS (real commands)")
    preparer = preparer_for(profile, devices, claim_of("fraction", gpu0.name, {"memory": memory}), "state")
    ref = ClaimRef("gpu-check", "gpu-check-fraction", "fraction")
    outcome = (await preparer.prepare([ref]))[ref.uid]
    if outcome.error:
        print(f"prepare failed: {outcome.error}")
        return False
    spec_path = next((work / "cdi").iterdir())
    spec = json.loads(spec_path.read_text())
    print(json.dumps(spec, indent=2))
    await asyncio.to_thread(compute_mode, gpu0.uuid)
    env = dict(item.split("=", 1) for item in spec["containerEdits"]["env"])
    limit = int(parse_quantity(memory))
    try:
        step("3. CUDA allocations as the claim's MPS client")
        # In a container the CDI mounts put the pipe at the container path; here, the host path.
        client = {
            "CUDA_VISIBLE_DEVICES": gpu0.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(work / "mps" / gpu0.uuid / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(work / "mps" / gpu0.uuid / "log"),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"],
        }
        print(f"client environment: {client}")
        below = await asyncio.to_thread(allocate, limit // 2, client)
        print(f"below the limit ({limit // 2} bytes): exit {below} (expected 0)")
        above = await asyncio.to_thread(allocate, limit + GIB, client)
        print(f"above the limit ({limit + GIB} bytes): exit {above} (expected 3, out of memory)")
        held = below == 0 and above == 3
    finally:
        step("4. unprepare: MPS stopped, compute mode back to DEFAULT")
        print(await preparer.unprepare([ref]))
        await asyncio.to_thread(compute_mode, gpu0.uuid)
    print(f"\nRESULT: the {memory} MPS memory limit {'HOLDS' if held else 'DOES NOT HOLD'}")
    return held


def capability_nodes(spec: dict[str, Any]) -> bool:
    """Print the MIG capability nodes the spec gives the container (its GPU instance's and its
    compute instance's, read from /proc/driver/nvidia/capabilities) beside what the host's
    /dev/nvidia-caps holds; True when the spec names exactly those two."""
    nodes = [
        node
        for device in spec["devices"]
        for node in device["containerEdits"]["deviceNodes"]
        if node["path"].startswith("/dev/nvidia-caps/")
    ]
    for node in nodes:
        try:
            rdev = os.stat(node["path"]).st_rdev
            host = f"host node {os.major(rdev)}:{os.minor(rdev)}"
        except FileNotFoundError:
            host = "no host node (the runtime makes it from the numbers)"
        print(f"capability node {node['path']}: {node['type']} {node['major']}:{node['minor']}, {host}")
    print(f"the CDI spec names {len(nodes)} capability node(s) (expected 2: GPU and compute instance)")
    return len(nodes) == 2


async def mig_check(profile: Any, devices: dict[str, NodeDevice], gpu: Gpu, placement: NodeDevice) -> bool:
    step(f"5. prepare MIG placement {placement.name} of GPU {gpu.index} (real nvidia-smi mig commands)")
    before = await asyncio.to_thread(run_text, ["nvidia-smi", "mig", "-i", gpu.uuid, "-lgi"])
    print(f"GPU {gpu.index}'s instances before (someone else's, left as they are):\n{before}")
    preparer = preparer_for(profile, devices, claim_of("mig", placement.name, {}), "mig-state")
    ref = ClaimRef("gpu-check", "gpu-check-mig", "mig")
    outcome = (await preparer.prepare([ref]))[ref.uid]
    if outcome.error:
        print(f"prepare failed: {outcome.error}")
        return False
    held = False
    try:
        spec = json.loads(next((work / "cdi").glob("*gpu-check-mig*")).read_text())
        print(json.dumps(spec, indent=2))
        env = dict(item.split("=", 1) for item in spec["containerEdits"]["env"])
        mig_uuid = env["NVIDIA_VISIBLE_DEVICES"]
        caps = capability_nodes(spec)
        listed = mig_uuid in await asyncio.to_thread(run_text, ["nvidia-smi", "-L"])
        print(f"nvidia-smi -L lists {mig_uuid}: {listed}")
        used = await asyncio.to_thread(allocate, GIB, {"CUDA_VISIBLE_DEVICES": mig_uuid})
        print(f"1 GiB allocated in the MIG device: exit {used} (expected 0)")
        held = listed and used == 0 and caps
    finally:
        print(await preparer.unprepare([ref]))
        left = await asyncio.to_thread(run_text, ["nvidia-smi", "mig", "-i", gpu.uuid, "-lgi"])
        print(left)
        gone = parse_gpu_instances(left) == parse_gpu_instances(before)
        print(f"GPU {gpu.index}'s instances are those before, the claim's gone: {gone}")
    print(f"\nRESULT: a MIG partition made on demand {'WORKS' if held and gone else 'DOES NOT WORK'}")
    return held and gone


sys.exit(asyncio.run(main()))
PYTHON
