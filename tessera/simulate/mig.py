"""Packing MIG-capable GPUs: partitions made on demand against partitions carved ahead, and MPS.

The Alibaba traces have no MIG-capable GPU, so this replay uses a small synthetic mix on H100 80GB
nodes (``SYNTHETIC_MIX``: the share of pods asking for each MIG profile, or a whole GPU). Pods
arrive in a seeded random order until they ask for ``target_pct`` of the cluster's compute
slices; none leaves. Each pod goes where its model allows, or is skipped:

* ``dynamic`` - the DRA driver's partitionable devices: a pod takes a placement of its profile
  (the real placement table, ``dra_driver.profiles.nvidia.migtables``) whose memory slices are
  free, on the GPU with the fewest free compute slices that has one (best fit, as Tessera's
  binpacking), at the first free start; a whole-GPU pod takes a GPU without any partition.
* ``static`` - today's static MIG: every GPU carved ahead into ``STATIC_LAYOUT`` (a common admin
  choice: 3g + 2g + 1g + 1g), pods take a free instance of their profile on the best-fit GPU; a
  profile the layout lacks (4g, a whole GPU) never fits.
* ``mps`` - fractions with no placement rule (MPS), for reference: a pod takes its compute slices
  on the best-fit GPU with enough free.

Allocation is the placed pods' compute slices in % of the cluster's (a MIG placement is charged
its compute slices of the 7, as the extender charges it); an instance carved ahead but unused is
idle, and so are the compute slices a placement rule strands.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dra_driver.devices.model import MigLayout, MigPlacement
from dra_driver.profiles.nvidia.migtables import mig_layout

from .report import format_table

Model = Literal["dynamic", "static", "mps"]
MODELS: tuple[Model, ...] = ("dynamic", "static", "mps")
WHOLE = "whole"
# Pods asking for each profile (of an H100 80GB), in % of pods.
SYNTHETIC_MIX: Mapping[str, float] = {"1g.10gb": 40, "2g.20gb": 20, "3g.40gb": 15, "4g.40gb": 5, WHOLE: 20}
# (profile, start): 3g at slices 4-7, 2g at 0-1, 1g at 2 and at 3 (all 7 compute slices).
STATIC_LAYOUT = (("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3))
H100 = mig_layout("NVIDIA H100 80GB HBM3", 80 << 30)


@dataclass
class _Gpu:
    used_memory: set[int] = field(default_factory=set)  # memory slices taken
    free_compute: int = 7
    whole: bool = False  # held by a whole-GPU pod
    instances: dict[int, tuple[str, bool]] = field(default_factory=dict)  # static: start -> (profile, held)


@dataclass(frozen=True)
class MigPackingResult:
    model: Model
    seed: int
    pods: int
    placed: int
    allocation_pct: float  # compute slices held, of the cluster's
    skipped_by_profile: Mapping[str, int]


def _layout() -> MigLayout:
    assert H100 is not None
    return H100


def _compute(profile: str) -> int:
    return _layout().compute_slices if profile == WHOLE else int(profile.split("g", 1)[0])


def synthetic_pods(gpus: int, target_pct: float, seed: int) -> list[str]:
    """Profiles drawn from the mix until they ask for ``target_pct`` of the compute slices."""
    rng = random.Random(f"mig/{seed}")
    target = gpus * _layout().compute_slices * target_pct / 100
    profiles, weights = list(SYNTHETIC_MIX), list(SYNTHETIC_MIX.values())
    pods: list[str] = []
    asked = 0
    while asked < target:
        profile = rng.choices(profiles, weights)[0]
        pods.append(profile)
        asked += _compute(profile)
    return pods


def _placements(profile: str) -> list[MigPlacement]:
    return [p for p in _layout().placements if p.profile == profile]


def _carve(gpu: _Gpu) -> None:
    """The static layout's instances, none held yet."""
    for profile, start in STATIC_LAYOUT:
        gpu.instances[start] = (profile, False)


class _Packer:
    def __init__(self, model: Model, gpus: int) -> None:
        self.model = model
        self.gpus = [_Gpu() for _ in range(gpus)]
        if model == "static":
            for gpu in self.gpus:
                _carve(gpu)

    def place(self, profile: str) -> bool:
        # Best fit: the GPU with the fewest free compute slices that takes the pod.
        for gpu in sorted(self.gpus, key=lambda g: g.free_compute):
            if gpu.whole or gpu.free_compute < _compute(profile):
                continue
            if self._take(gpu, profile):
                gpu.free_compute -= _compute(profile)
                return True
        return False

    def _take(self, gpu: _Gpu, profile: str) -> bool:
        if self.model == "mps":
            gpu.whole = profile == WHOLE
            return True
        if self.model == "static":
            return self._take_instance(gpu, profile)
        if profile == WHOLE:
            if gpu.used_memory:
                return False
            gpu.whole = True
            return True
        for placement in _placements(profile):
            cover = set(range(placement.start, placement.start + placement.memory_slices))
            if not cover & gpu.used_memory:
                gpu.used_memory |= cover
                return True
        return False

    @staticmethod
    def _take_instance(gpu: _Gpu, profile: str) -> bool:
        for start, (carved, held) in gpu.instances.items():
            if carved == profile and not held:
                gpu.instances[start] = (carved, True)
                return True
        return False


def replay_mig(model: Model, gpus: int = 64, target_pct: float = 130.0, seed: int = 0) -> MigPackingResult:
    pods = synthetic_pods(gpus, target_pct, seed)
    packer = _Packer(model, gpus)
    placed = 0
    held = 0
    skipped: dict[str, int] = {}
    for profile in pods:
        if packer.place(profile):
            placed += 1
            held += _compute(profile)
        else:
            skipped[profile] = skipped.get(profile, 0) + 1
    total = gpus * _layout().compute_slices
    return MigPackingResult(model, seed, len(pods), placed, 100 * held / total, skipped)


def mig_table(results: Sequence[MigPackingResult]) -> str:
    profiles = list(SYNTHETIC_MIX)
    rows = [
        [
            r.model,
            str(r.seed),
            str(r.pods),
            str(r.placed),
            f"{r.allocation_pct:.1f}",
            *(str(r.skipped_by_profile.get(p, 0)) for p in profiles),
        ]
        for r in results
    ]
    return format_table(
        ["model", "seed", "pods", "placed", "alloc %", *(f"skipped {p}" for p in profiles)], rows
    )
