"""MIG placement tables of the GPUs whose partitions the driver makes on demand.

Facts from NVIDIA's MIG user guide ("Supported MIG Profiles"; ``nvidia-smi mig -lgip`` and
``-lgipp`` print the same on a GPU): A100, H100 and H200 have 8 memory slices and 7 compute
slices, and the same GPU instance profiles, named after each product's memory:

| profile | id | compute | memory slices | starts | A100-40GB | A100-80GB / H100-80GB | H200-141GB |
|---|---|---|---|---|---|---|---|
| 1g | 19 | 1 | 1 | 0 1 2 3 4 5 6 | 1g.5gb | 1g.10gb | 1g.18gb |
| 1g (2 memory slices) | 15 | 1 | 2 | 0 2 4 6 | 1g.10gb | 1g.20gb | 1g.35gb |
| 2g | 14 | 2 | 2 | 0 2 4 | 2g.10gb | 2g.20gb | 2g.35gb |
| 3g | 9 | 3 | 4 | 0 4 | 3g.20gb | 3g.40gb | 3g.71gb |
| 4g | 5 | 4 | 4 | 0 | 4g.20gb | 4g.40gb | 4g.71gb |
| 7g | 0 | 7 | 8 | 0 | 7g.40gb | 7g.80gb | 7g.141gb |

(The media-extension profiles, ``+me``, are left out: one per GPU, and they overlap 1g.)
A placement's memory is published as its share of the GPU's (memory slices / 8): the instance's
usable memory is a little less, which only makes a claim's memory request a little optimistic.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_driver.devices.model import MigLayout, MigPlacement

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
_MIB = 1 << 20


@dataclass(frozen=True)
class _Shape:
    profile_id: int
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]


# In the order the table above lists them (smallest first).
_SHAPES = (
    _Shape(19, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    _Shape(15, 1, 2, (0, 2, 4, 6)),
    _Shape(14, 2, 2, (0, 2, 4)),
    _Shape(9, 3, 4, (0, 4)),
    _Shape(5, 4, 4, (0,)),
    _Shape(0, 7, 8, (0,)),
)

# The memory (GB) in each product's profile names, by memory slices: 1, 2, 4, 8.
_PRODUCT_MEMORY_NAMES: tuple[tuple[tuple[str, ...], dict[int, int]], ...] = (
    (("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40GB"), {1: 5, 2: 10, 4: 20, 8: 40}),
    (("A100-SXM4-80GB", "A100 80GB", "A100-PCIE-80GB"), {1: 10, 2: 20, 4: 40, 8: 80}),
    (("H100 80GB", "H100-SXM5-80GB", "H100 PCIe", "H100-80GB"), {1: 10, 2: 20, 4: 40, 8: 80}),
    (("H200",), {1: 18, 2: 35, 4: 71, 8: 141}),
)


def memory_names(product_name: str) -> dict[int, int] | None:
    for markers, names in _PRODUCT_MEMORY_NAMES:
        if any(marker in product_name for marker in markers):
            return names
    return None


def mig_layout(product_name: str, memory_bytes: int) -> MigLayout | None:
    """The placements of a GPU model this table knows; None for any other GPU."""
    names = memory_names(product_name)
    if names is None:
        return None
    slice_bytes = memory_bytes // MEMORY_SLICES
    placements = tuple(
        MigPlacement(
            profile=f"{shape.compute_slices}g.{names[shape.memory_slices]}gb",
            profile_id=shape.profile_id,
            start=start,
            memory_slices=shape.memory_slices,
            compute_slices=shape.compute_slices,
            # Floored to whole MiB, as every published memory capacity.
            memory_bytes=(slice_bytes * shape.memory_slices) // _MIB * _MIB,
        )
        for shape in _SHAPES
        for start in shape.starts
    )
    return MigLayout(MEMORY_SLICES, COMPUTE_SLICES, placements)
