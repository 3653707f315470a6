"""Partitionable MIG on the simulated NVIDIA backend: the placement tables, the slices with
shared counters, and prepare/unprepare making and destroying the instances, with a crash at every
step of making one leaving no orphaned instance after the restart.

The recorded commands are checked exactly; the simulated GPUs answer ``nvidia-smi mig`` from a
state file that outlives a "crash" (the hardware), so an instance a crash left behind is seen.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contract.gpuconfig import SharingStrategy
from dra_driver import cdi
from dra_driver.__main__ import driver_instances_hidden
from dra_driver.checkpoint import Checkpoint, ClaimRecord, read_claims
from dra_driver.devices.model import Gpu, MigDevice
from dra_driver.devices.profile import BackendUnavailable
from dra_driver.devices.share import Command, GpuShare, MigPartition, RunCommand, SharingCommandError
from dra_driver.prepare import ClaimRef, Preparer, node_devices, without_driver_instances
from dra_driver.profiles.nvidia.mig import NvidiaMig, SimulatedSmi
from dra_driver.profiles.nvidia.migcaps import MigCapabilities
from dra_driver.profiles.nvidia.migtables import mig_layout
from dra_driver.profiles.nvidia.profile import SIMULATED_MIG_STATE, NvidiaProfile
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery, build_inventory, load_profile
from dra_driver.sharing import RecordingRunner, SharingManager
from dra_driver.slices import NodeRef, SharingMode, build_slices
from tests.unit.dra_driver.fakes import DRIVER, NODE, FakeClaims, Result, claim, gpu_config, opaque

GIB = 1 << 30
MIB = 1 << 20


def two_h100s() -> list[Gpu]:
    return build_inventory(load_profile(Path("h100x2-mig")), seed=NODE)


# ---- the placement tables ----


def profiles(one: int, two: int, four: int, eight: int) -> dict[str, tuple[int, list[int]]]:
    """The table every A100/H100/H200 shares: profile -> (GPU instance profile id, starts), named
    by the GB of 1, 2, 4 and 8 memory slices."""
    return {
        f"1g.{one}gb": (19, [0, 1, 2, 3, 4, 5, 6]),
        f"1g.{two}gb": (15, [0, 2, 4, 6]),
        f"2g.{two}gb": (14, [0, 2, 4]),
        f"3g.{four}gb": (9, [0, 4]),
        f"4g.{four}gb": (5, [0]),
        f"7g.{eight}gb": (0, [0]),
    }


@pytest.mark.parametrize(
    ("product", "memory", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 40 * GIB, profiles(5, 10, 20, 40)),
        ("NVIDIA A100-SXM4-80GB", 80 * GIB, profiles(10, 20, 40, 80)),
        ("NVIDIA H100 80GB HBM3", 80 * GIB, profiles(10, 20, 40, 80)),
        ("NVIDIA H200", 143771 * MIB, profiles(18, 35, 71, 141)),
    ],
)
def test_placement_tables(product: str, memory: int, expected: dict[str, tuple[int, list[int]]]) -> None:
    layout = mig_layout(product, memory)
    assert layout is not None and (layout.memory_slices, layout.compute_slices) == (8, 7)
    found: dict[str, tuple[int, list[int]]] = {}
    for p in layout.placements:
        found.setdefault(p.profile, (p.profile_id, []))[1].append(p.start)
    assert found == expected
    # 7 + 4 + 3 + 2 + 1 + 1 = 18 placements
    assert len(layout.placements) == 18
    assert layout.full.profile.startswith("7g") and layout.full.memory_slices == 8


def test_a_gpu_without_mig_has_no_table() -> None:
    assert mig_layout("NVIDIA L4", 24 * GIB) is None
    assert mig_layout("Tesla T4", 16 * GIB) is None


# ---- slices with counters ----


def _pool(gpus: list[Gpu], partitionable: bool = True) -> list[dict[str, Any]]:
    return build_slices(
        NodeRef(NODE), DRIVER, gpus, SharingMode.CONSUMABLE_CAPACITY, 1, partitionable=partitionable
    )


def _devices(pool: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in pool for d in s["spec"].get("devices", ())}


def _consumed(device: Mapping[str, Any]) -> dict[str, str]:
    (consumption,) = device["consumesCounters"]
    return {name: c["value"] for name, c in consumption["counters"].items()}


def test_a_partitionable_pool_has_a_counter_slice_then_device_slices() -> None:
    pool = _pool(two_h100s())
    # Slice 0: the counter sets (never beside devices); slice 1: 2 x 18 devices (<= 64).
    assert [sorted(s["spec"]) for s in pool] == [
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["devices", "driver", "nodeName", "pool"],
    ]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 2 for s in pool)
    sets = pool[0]["spec"]["sharedCounters"]
    assert [s["name"] for s in sets] == ["gpu-0", "gpu-1"]
    assert {k: v["value"] for k, v in sets[0]["counters"].items()} == {
        **{f"memory-slice-{i}": "1" for i in range(8)},
        "compute-slices": "7",
    }
    assert len(pool[1]["spec"]["devices"]) == 36


@pytest.mark.parametrize(
    ("device", "type_", "memory", "memory_slices", "compute"),
    [
        # the whole GPU: every memory slice and all 7 compute slices
        ("gpu-0", "gpu", "80Gi", [0, 1, 2, 3, 4, 5, 6, 7], "7"),
        ("gpu-0-mig-1g-10gb-at-0", "mig", "10Gi", [0], "1"),  # 80Gi x 1/8
        ("gpu-0-mig-1g-10gb-at-6", "mig", "10Gi", [6], "1"),
        ("gpu-0-mig-1g-20gb-at-6", "mig", "20Gi", [6, 7], "1"),  # the only 1g reaching slice 7
        ("gpu-0-mig-2g-20gb-at-4", "mig", "20Gi", [4, 5], "2"),
        ("gpu-0-mig-3g-40gb-at-4", "mig", "40Gi", [4, 5, 6, 7], "3"),
        ("gpu-0-mig-4g-40gb-at-0", "mig", "40Gi", [0, 1, 2, 3], "4"),
    ],
)
def test_each_device_consumes_its_memory_slices_and_compute(
    device: str, type_: str, memory: str, memory_slices: list[int], compute: str
) -> None:
    published = _devices(_pool(two_h100s()))[device]
    assert published["attributes"]["type"] == {"string": type_}
    assert published["capacity"] == {"memory": {"value": memory}}
    assert published["consumesCounters"][0]["counterSet"] == "gpu-0"
    assert _consumed(published) == {
        **{f"memory-slice-{i}": "1" for i in memory_slices},
        "compute-slices": compute,
    }
    # No fractions on a partitionable GPU: MIG and MPS do not mix.
    assert "allowMultipleAllocations" not in published


def test_the_7g_placement_is_the_whole_gpu_not_a_second_device() -> None:
    names = set(_devices(_pool(two_h100s())))
    assert "gpu-0" in names and not any("7g" in name for name in names)
    mig = _devices(_pool(two_h100s()))["gpu-0-mig-3g-40gb-at-0"]["attributes"]
    assert mig["profile"] == {"string": "3g.40gb"} and mig["placementStart"] == {"int": 0}
    assert "uuid" not in mig  # the MIG device exists only once prepared
    assert mig["parentUUID"] == {"string": two_h100s()[0].uuid}


def test_eight_gpus_split_into_slices_within_the_api_limits() -> None:
    gpus = [g for _ in range(4) for g in two_h100s()]
    gpus = [Gpu(**{**vars(g), "minor": i, "index": i}) for i, g in enumerate(gpus)]
    pool = _pool(gpus)
    # 8 counter sets fit one slice (at most 8); 8 x 18 = 144 devices in 64 + 64 + 16.
    assert [len(s["spec"].get("sharedCounters", ())) for s in pool] == [8, 0, 0, 0]
    assert [len(s["spec"].get("devices", ())) for s in pool] == [0, 64, 64, 16]


def test_without_partitionable_devices_a_mig_gpu_publishes_what_exists() -> None:
    # The static fallback: MIG mode on and no instance made -> nothing of the GPU is published.
    pool = _pool(two_h100s(), partitionable=False)
    assert pool[0]["spec"]["devices"] == []
    assert all("sharedCounters" not in s["spec"] for s in pool)


# ---- prepare and unprepare ----


class Crash(BaseException):
    """The driver process dies here: no cleanup code of the driver runs any command after it."""


class CrashingRunner(RecordingRunner):
    """Records like the simulated backend; ``crash_on`` kills the "process" before that command
    runs, after which every command fails (a dead process runs none)."""

    def __init__(self, crash_on: str = "") -> None:
        super().__init__()
        self.crash_on = crash_on
        self.dead = False

    async def run(self, command: Command) -> str:
        if self.dead:
            raise SharingCommandError("the driver is dead")
        if self.crash_on and self.crash_on in " ".join(command.argv):
            self.dead = True
            raise Crash(command.describe())
        return await super().run(command)


class CrashingCheckpoint(Checkpoint):
    """Dies at its ``crash_at``-th write, before writing it (0: never)."""

    def __init__(self, directory: Path, runner: CrashingRunner) -> None:
        super().__init__(directory)
        self._runner = runner
        self.crash_at = 0
        self.writes = 0

    def update(self, changes: Mapping[str, ClaimRecord | None]) -> None:
        self.writes += 1
        if self.writes == self.crash_at:
            self._runner.dead = True
            raise Crash(f"checkpoint write {self.writes}")
        super().update(changes)


def mig_preparer(
    tmp_path: Path,
    claims: FakeClaims,
    runner: CrashingRunner,
    checkpoint: Checkpoint | None = None,
    gpus: list[Gpu] | None = None,
    partitioner: NvidiaMig | None = None,
    instances_changed: Callable[[str], None] | None = None,
) -> Preparer:
    profile = NvidiaProfile("simulated", SimulatedDiscovery(gpus or two_h100s()), simulated=True)
    devices = node_devices(profile.discovery.inventory(), profile)
    return Preparer(
        driver_name=DRIVER,
        node_name=NODE,
        devices=lambda: devices,
        profile=profile,
        claims=claims,
        checkpoint=checkpoint or Checkpoint(tmp_path / "state"),
        sharing=SharingManager(runner, profile.sharing(tmp_path / "mps")),
        cdi_dir=tmp_path / "cdi",
        partitioner=partitioner or profile.partitioner(runner.run, tmp_path / "state"),
        instances_changed=instances_changed,
    )


def instances(
    tmp_path: Path, gpus: list[Gpu] | None = None
) -> dict[str, dict[int, tuple[str, int, list[int]]]]:
    return SimulatedSmi(
        tmp_path / "state" / SIMULATED_MIG_STATE, gpus or two_h100s(), RecordingRunner().run
    ).instances()


GPU0, GPU1 = (g.uuid for g in two_h100s())
ONE_G = ClaimRef("ns", "uid-1g", "one-g")
THREE_G = ClaimRef("ns", "uid-3g", "three-g")
WHOLE = ClaimRef("ns", "uid-whole", "whole")


def mig_claims() -> FakeClaims:
    claims = FakeClaims()
    claims.add(claim(ONE_G.uid, [Result("gpu-0-mig-1g-10gb-at-0")], name=ONE_G.name))
    claims.add(claim(THREE_G.uid, [Result("gpu-0-mig-3g-40gb-at-4")], name=THREE_G.name))
    claims.add(claim(WHOLE.uid, [Result("gpu-1")], name=WHOLE.name))
    return claims


def commands(runner: RecordingRunner) -> list[str]:
    return [" ".join(c.argv) for c in runner.commands]


def visible_devices(tmp_path: Path, ref: ClaimRef) -> str:
    spec = cdi.read_claim_spec(cdi.spec_path(tmp_path / "cdi", DRIVER, ref.uid))
    assert spec is not None
    env = dict(item.split("=", 1) for item in spec["containerEdits"]["env"])
    return str(env["NVIDIA_VISIBLE_DEVICES"])


async def test_prepare_makes_the_instance_of_each_placement_and_unprepare_destroys_it(tmp_path: Path) -> None:
    runner = CrashingRunner()
    preparer = mig_preparer(tmp_path, mig_claims(), runner)
    outcomes = await preparer.prepare([ONE_G, THREE_G, WHOLE])
    assert {uid: o.error for uid, o in outcomes.items()} == {ONE_G.uid: "", THREE_G.uid: "", WHOLE.uid: ""}
    assert commands(runner) == [
        # Each GPU's instances listed once, before anything is recorded: the placements are free.
        f"nvidia-smi mig -i {GPU0} -lgi",
        f"nvidia-smi mig -i {GPU1} -lgi",
        # GPU instance profile:start, and -C its default compute instance spanning it
        f"nvidia-smi mig -i {GPU0} -cgi 19:0 -C",  # 1g.10gb at memory slice 0
        f"nvidia-smi mig -i {GPU0} -cgi 9:4 -C",  # 3g.40gb at slices 4-7
        f"nvidia-smi mig -i {GPU1} -cgi 0:0 -C",  # the whole GPU is its 7g.80gb instance
    ]
    assert instances(tmp_path) == {
        GPU0: {1: ("1g.10gb", 0, [0]), 2: ("3g.40gb", 4, [0])},
        GPU1: {1: ("7g.80gb", 0, [0])},
    }
    # The containers see the MIG device made for the claim, not the GPU.
    smi = SimulatedSmi(tmp_path / "state" / SIMULATED_MIG_STATE, two_h100s(), RecordingRunner().run)
    assert visible_devices(tmp_path, ONE_G) == await smi.instance_uuid(GPU0, 1, 0)
    assert visible_devices(tmp_path, WHOLE) == await smi.instance_uuid(GPU1, 1, 0)
    # A repeated prepare is answered from the checkpoint: no command.
    runner.commands.clear()
    again = await preparer.prepare([ONE_G])
    assert again[ONE_G.uid] == outcomes[ONE_G.uid] and commands(runner) == []
    # Unprepare finds the instance at its placement and destroys compute, then GPU instance.
    assert await preparer.unprepare([ONE_G]) == {ONE_G.uid: ""}
    assert commands(runner) == [
        f"nvidia-smi mig -i {GPU0} -lgi",
        f"nvidia-smi mig -i {GPU0} -gi 1 -dci",
        f"nvidia-smi mig -i {GPU0} -gi 1 -dgi",
    ]
    assert instances(tmp_path) == {GPU0: {2: ("3g.40gb", 4, [0])}, GPU1: {1: ("7g.80gb", 0, [0])}}
    assert await preparer.unprepare([THREE_G, WHOLE]) == {THREE_G.uid: "", WHOLE.uid: ""}
    assert instances(tmp_path) == {}
    assert Checkpoint(tmp_path / "state").claims == {}


async def test_a_restarted_driver_unprepares_from_the_checkpoint(tmp_path: Path) -> None:
    await mig_preparer(tmp_path, mig_claims(), CrashingRunner()).prepare([THREE_G])
    runner = CrashingRunner()
    restarted = mig_preparer(tmp_path, FakeClaims(), runner)  # no API: the claim may be gone
    await restarted.recover()
    assert commands(runner) == []  # a completed claim is left as it is
    assert await restarted.unprepare([THREE_G]) == {THREE_G.uid: ""}
    assert commands(runner)[-1] == f"nvidia-smi mig -i {GPU0} -gi 1 -dgi" and instances(tmp_path) == {}


async def test_a_placement_already_taken_fails_that_claim_only(tmp_path: Path) -> None:
    # The scheduler never allocates overlapping placements; were it to, the listing before the
    # create shows the second's taken (2g.20gb at 0 covers slices 0-1; the 1g holds slice 0).
    claims = mig_claims()
    overlapping = ClaimRef("ns", "uid-2g", "two-g")
    claims.add(claim(overlapping.uid, [Result("gpu-0-mig-2g-20gb-at-0")], name=overlapping.name))
    runner = CrashingRunner()
    preparer = mig_preparer(tmp_path, claims, runner)
    assert (await preparer.prepare([ONE_G]))[ONE_G.uid].error == ""
    runner.commands.clear()
    error = (await preparer.prepare([overlapping]))[overlapping.uid].error
    assert error == (
        "gpu-0-mig-2g-20gb-at-0: memory slices 0-1 are taken by GPU instance 1, made since the "
        "slice was published; nothing was made"
    )
    assert commands(runner) == [f"nvidia-smi mig -i {GPU0} -lgi"]
    assert instances(tmp_path) == {GPU0: {1: ("1g.10gb", 0, [0])}}
    assert set(Checkpoint(tmp_path / "state").claims) == {ONE_G.uid}


@pytest.mark.parametrize(
    ("crash_on_command", "crash_at_write", "recorded", "left_on_the_gpu", "undo"),
    [
        # 1. listing the GPU's instances, before anything is recorded: nothing to undo
        ("-lgi", 0, None, {}, []),
        # 2. after "started" is on disk, before the instance is made: nothing to destroy
        ("-cgi", 0, "started", {}, ["-lgi"]),
        # 3. the instance made (GPU and compute instance), the "completed" write (the request's
        #    second) never happens, the CDI spec was written: found at its placement (the record
        #    has no id) and destroyed
        ("", 2, "started", {2: ("1g.10gb", 0, [0])}, ["-lgi", "-gi 2 -dci", "-gi 2 -dgi"]),
    ],
)
async def test_a_crash_at_each_step_leaves_no_orphaned_instance(
    tmp_path: Path,
    crash_on_command: str,
    crash_at_write: int,
    recorded: str | None,
    left_on_the_gpu: dict[int, tuple[str, int, list[int]]],
    undo: list[str],
) -> None:
    claims = mig_claims()
    dying = CrashingRunner()
    checkpoint = CrashingCheckpoint(tmp_path / "state", dying)
    preparer = mig_preparer(tmp_path, claims, dying, checkpoint)
    # A node that has run a while: both checkpoint slots written (with one slot only, the
    # checkpoint cannot prove it is complete, and the claim's spec would be adopted instead);
    # the 3g claim's instance, GPU instance 1, is gone again.
    await preparer.prepare([THREE_G])
    await preparer.unprepare([THREE_G])
    # Ids are the lowest free: 1g's GPU instance would be 1 but for a 3g kept meanwhile at 4-7.
    await preparer.prepare([THREE_G])
    dying.crash_on = crash_on_command
    checkpoint.crash_at = checkpoint.writes + crash_at_write if crash_at_write else 0
    with pytest.raises(Crash):
        await preparer.prepare([ONE_G])
    assert instances(tmp_path) == {GPU0: {**left_on_the_gpu, 1: ("3g.40gb", 4, [0])}}
    record = Checkpoint(tmp_path / "state").get(ONE_G.uid)
    assert (record.state if record else None) == recorded
    # The restart rolls the claim back before serving: whatever exists at its placement goes.
    runner = CrashingRunner()
    restarted = mig_preparer(tmp_path, claims, runner)
    await restarted.recover()
    assert commands(runner) == [f"nvidia-smi mig -i {GPU0} {step}" for step in undo]
    assert instances(tmp_path) == {GPU0: {1: ("3g.40gb", 4, [0])}}  # the other claim's stays
    assert set(Checkpoint(tmp_path / "state").claims) == {THREE_G.uid}
    assert not cdi.spec_path(tmp_path / "cdi", DRIVER, ONE_G.uid).exists()
    # The kubelet's retry prepares it from scratch, on the instance ids the GPU hands out first.
    runner.commands.clear()
    assert (await restarted.prepare([ONE_G]))[ONE_G.uid].error == ""
    assert commands(runner) == [f"nvidia-smi mig -i {GPU0} -lgi", f"nvidia-smi mig -i {GPU0} -cgi 19:0 -C"]
    assert instances(tmp_path) == {GPU0: {1: ("3g.40gb", 4, [0]), 2: ("1g.10gb", 0, [0])}}


async def test_mps_is_refused_on_a_partitionable_gpu(tmp_path: Path) -> None:
    claims = FakeClaims()
    ref = ClaimRef("ns", "uid-mps", "mps")
    claims.add(claim(ref.uid, [Result("gpu-0")], [opaque(gpu_config({"strategy": "MPS"}))], name=ref.name))
    runner = CrashingRunner()
    error = (await mig_preparer(tmp_path, claims, runner).prepare([ref]))[ref.uid].error
    assert error == "MIG device gpu-0 is not shared; MPS is not supported"
    assert commands(runner) == [] and instances(tmp_path) == {}


async def test_a_gpu_instance_without_its_compute_instance_is_destroyed_too(tmp_path: Path) -> None:
    # nvidia-smi's -C can fail after it made the GPU instance: the undo finds the lone instance.
    gpus = two_h100s()
    record = RecordingRunner()
    smi = SimulatedSmi(tmp_path / SIMULATED_MIG_STATE, gpus, record.run)
    await smi.run(Command(("nvidia-smi", "mig", "-i", GPU0, "-cgi", "9:4")))
    assert smi.instances() == {GPU0: {1: ("3g.40gb", 4, [])}}
    mig = NvidiaProfile("simulated", SimulatedDiscovery(gpus), simulated=True).partitioner(
        record.run, tmp_path
    )
    assert mig is not None
    await mig.destroy(GPU0, MigPartition("3g.40gb", 9, 4, 4))
    assert SimulatedSmi(tmp_path / SIMULATED_MIG_STATE, gpus, record.run).instances() == {}
    assert commands(record)[1:] == [
        f"nvidia-smi mig -i {GPU0} -lgi",
        f"nvidia-smi mig -i {GPU0} -gi 1 -dci",  # answered "No compute instances found"
        f"nvidia-smi mig -i {GPU0} -gi 1 -dgi",
    ]


async def test_destroy_leaves_another_instance_at_the_placement_alone(tmp_path: Path) -> None:
    # The record names GPU instance 2; the one at the placement now is 1 (made for another claim
    # after this claim's went): it stays.
    gpus = two_h100s()
    record = RecordingRunner()
    smi = SimulatedSmi(tmp_path / SIMULATED_MIG_STATE, gpus, record.run)
    await smi.run(Command(("nvidia-smi", "mig", "-i", GPU0, "-cgi", "19:3", "-C")))
    mig = NvidiaProfile("simulated", SimulatedDiscovery(gpus), simulated=True).partitioner(
        record.run, tmp_path
    )
    assert mig is not None
    await mig.destroy(GPU0, MigPartition("1g.10gb", 19, 3, 1, gpu_instance=2, compute_instance=0))
    assert SimulatedSmi(tmp_path / SIMULATED_MIG_STATE, gpus, record.run).instances() == {
        GPU0: {1: ("1g.10gb", 3, [0])}
    }


async def test_a_crash_before_a_young_checkpoint_records_the_claim_adopts_it_from_its_spec(
    tmp_path: Path,
) -> None:
    # The first claim of a node: one checkpoint slot only, so the checkpoint cannot prove it is
    # complete and the claim's spec (written before the "completed" write the crash took) is taken
    # for a prepared claim. Its instance is then the claim's, destroyed by its unprepare.
    claims = mig_claims()
    dying = CrashingRunner()
    checkpoint = CrashingCheckpoint(tmp_path / "state", dying)
    checkpoint.crash_at = 2
    with pytest.raises(Crash):
        await mig_preparer(tmp_path, claims, dying, checkpoint).prepare([ONE_G])
    runner = CrashingRunner()
    restarted = mig_preparer(tmp_path, claims, runner)
    report = await restarted.recover()
    assert list(report.adopted) == [ONE_G.uid] and commands(runner) == []
    assert instances(tmp_path) == {GPU0: {1: ("1g.10gb", 0, [0])}}
    assert await restarted.unprepare([ONE_G]) == {ONE_G.uid: ""}
    assert commands(runner)[-1] == f"nvidia-smi mig -i {GPU0} -gi 1 -dgi" and instances(tmp_path) == {}


def test_mig_dynamic_needs_a_gpu_with_a_placement_table(tmp_path: Path) -> None:
    profile = tmp_path / "t4-mig.yaml"
    profile.write_text(
        "driverVersion: '550.54.15'\ncudaDriverVersion: '12.4'\ngpus:\n"
        "  - {productName: Tesla T4, architecture: Turing, cudaComputeCapability: '7.5',\n"
        "     memory: 15Gi, mig: dynamic}\n"
    )
    with pytest.raises(BackendUnavailable, match="mig: dynamic needs a GPU with known MIG placements"):
        load_profile(profile)


# ---- instances an administrator made on a partitionable GPU ----

ADMIN_NODE = """driverVersion: '550.54.15'
cudaDriverVersion: '12.4'
gpus:
  - productName: NVIDIA H100 80GB HBM3
    architecture: Hopper
    cudaComputeCapability: '9.0'
    memory: 80Gi
    mig: dynamic
    madeByAdmin: [{profile: 3g.40gb, start: 4}]
  - productName: NVIDIA H100 80GB HBM3
    architecture: Hopper
    cudaComputeCapability: '9.0'
    memory: 80Gi
    mig: dynamic
"""


def admin_h100s(tmp_path: Path) -> list[Gpu]:
    """GPU 0 holds a 3g.40gb at memory slices 4-7 someone made by hand (GPU instance 1); GPU 1
    holds none."""
    node = tmp_path / "admin-node.yaml"
    node.write_text(ADMIN_NODE)
    return build_inventory(load_profile(node), seed=NODE)


def test_an_admin_instance_is_published_with_its_counters_and_nothing_overlapping_it(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    devices = _devices(_pool(gpus))
    on_gpu0 = sorted(name for name in devices if name.startswith("gpu-0"))
    # Of the 18 placements, those clear of slices 4-7: 1g.10gb at 0-3 (4), 1g.20gb at 0 and 2,
    # 2g.20gb at 0 and 2, 3g.40gb at 0, 4g.40gb at 0 (6 more): 10; the whole GPU overlaps it.
    assert on_gpu0 == sorted(
        [f"gpu-0-mig-1g-10gb-at-{start}" for start in range(4)]
        + ["gpu-0-mig-1g-20gb-at-0", "gpu-0-mig-1g-20gb-at-2", "gpu-0-mig-2g-20gb-at-0"]
        + ["gpu-0-mig-2g-20gb-at-2", "gpu-0-mig-3g-40gb-at-0", "gpu-0-mig-4g-40gb-at-0"]
        + ["gpu-0-mig-1-0"]  # the instance itself, by its GPU and compute instance ids
    )
    admin = devices["gpu-0-mig-1-0"]
    assert _consumed(admin) == {**{f"memory-slice-{i}": "1" for i in (4, 5, 6, 7)}, "compute-slices": "3"}
    attributes = admin["attributes"]
    assert attributes["type"] == {"string": "mig"} and attributes["uuid"] == {
        "string": gpus[0].mig_devices[0].uuid
    }
    assert (attributes["gpuInstance"], attributes["placementStart"]) == ({"int": 1}, {"int": 4})
    assert admin["capacity"] == {"memory": {"value": "40Gi"}}
    assert sum(name.startswith("gpu-1") for name in devices) == 18  # the other GPU: every placement


def test_an_instance_whose_placement_is_unknown_leaves_nothing_else_on_its_gpu(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    unplaced = replace(gpus[0], mig_devices=(replace(gpus[0].mig_devices[0], placement_start=None),))
    devices = _devices(_pool([unplaced, gpus[1]]))
    assert [name for name in devices if name.startswith("gpu-0")] == ["gpu-0-mig-1-0"]
    assert "consumesCounters" not in devices["gpu-0-mig-1-0"]


def test_the_drivers_own_instances_are_not_published_as_someone_elses(tmp_path: Path) -> None:
    # NVML lists every instance: the admin's (GPU instance 1 at 4) and two the driver made, one
    # recorded with its id (2, a 1g.10gb at 0), one by its placement only (a crash kept the id
    # from the record: 1g.10gb at 1, GPU instance 3).
    gpu = admin_h100s(tmp_path)[0]
    admin = gpu.mig_devices[0]
    made = (
        MigDevice(2, 0, "1g.10gb", "MIG-made-2", 10 * GIB, placement_start=0),
        MigDevice(3, 0, "1g.10gb", "MIG-made-3", 10 * GIB, placement_start=1),
    )
    listed = replace(gpu, mig_devices=(admin, *made))
    share = GpuShare(gpu.uuid, "gpu-0-mig-1g-10gb-at-0", SharingStrategy.EXCLUSIVE)
    records = [
        ClaimRecord(
            namespace="ns",
            name="a",
            state="completed",
            shares=(replace(share, partition=MigPartition("1g.10gb", 19, 0, 1, 2, 0, "MIG-made-2")),),
        ),
        ClaimRecord(
            namespace="ns",
            name="b",
            state="started",
            shares=(replace(share, partition=MigPartition("1g.10gb", 19, 1, 1)),),
        ),
    ]
    (published,) = without_driver_instances([listed], records)
    assert published.mig_devices == (admin,)
    assert without_driver_instances([listed], []) == [listed]  # no record: all someone else's


async def test_the_slices_read_the_drivers_instances_from_the_checkpoint_on_disk(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    runner = CrashingRunner()
    await mig_preparer(tmp_path, mig_claims(), runner, gpus=gpus).prepare([ONE_G])  # GPU instance 2
    made = MigDevice(2, 0, "1g.10gb", "MIG-made", 10 * GIB, placement_start=0)
    listed = [replace(gpus[0], mig_devices=(*gpus[0].mig_devices, made)), gpus[1]]
    published = driver_instances_hidden(tmp_path / "state")
    assert published(listed) == gpus
    # The newest slot (generation 2, "completed" with GPU instance 2, in slot 0) torn as by a
    # write under way: generation 1 is read, whose "started" record has the placement only (1g
    # at slice 0), which hides the instance all the same; no copy of the torn slot is kept (the
    # driver's own Checkpoint keeps one before it reuses the slot).
    newest = tmp_path / "state" / "checkpoint.0.json"
    newest.write_bytes(newest.read_bytes()[:10])
    assert read_claims(tmp_path / "state")[ONE_G.uid].state == "started"
    assert published(listed) == gpus
    assert not list((tmp_path / "state").glob("*.unreadable"))


async def test_a_claim_of_an_admin_instance_runs_no_command_and_leaves_it(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    claims = FakeClaims()
    ref = ClaimRef("ns", "uid-admin", "admin")
    claims.add(claim(ref.uid, [Result("gpu-0-mig-1-0")], name=ref.name))
    runner = CrashingRunner()
    preparer = mig_preparer(tmp_path, claims, runner, gpus=gpus)
    assert (await preparer.prepare([ref]))[ref.uid].error == ""
    assert visible_devices(tmp_path, ref) == gpus[0].mig_devices[0].uuid
    assert await preparer.unprepare([ref]) == {ref.uid: ""}
    assert commands(runner) == []
    assert instances(tmp_path, gpus) == {gpus[0].uuid: {1: ("3g.40gb", 4, [0])}}


async def test_claims_beside_an_admin_instance_make_and_destroy_only_their_own(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    gpu0 = gpus[0].uuid
    runner = CrashingRunner()
    preparer = mig_preparer(tmp_path, mig_claims(), runner, gpus=gpus)
    assert (await preparer.prepare([ONE_G]))[ONE_G.uid].error == ""
    # GPU instance 1 is the admin's: the claim's is 2.
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0]), 2: ("1g.10gb", 0, [0])}}
    assert await preparer.unprepare([ONE_G]) == {ONE_G.uid: ""}
    assert commands(runner)[2:] == [
        f"nvidia-smi mig -i {gpu0} {step}" for step in ("-lgi", "-gi 2 -dci", "-gi 2 -dgi")
    ]
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0])}}


@pytest.mark.parametrize(
    ("crash_on_command", "crash_at_write", "crashes"),
    [
        # 1. dies listing GPU 0's instances, before anything is recorded or made
        ("-lgi", 0, True),
        # 2. the listing shows slices 4-7 taken: the claim fails there and writes nothing, so no
        #    crash comes between a "started" record and the claim's failure record (before: the
        #    record was written and the create refused; a crash then left a "started" record
        #    whose undo at the restart took the admin's instance, at the claim's placement and
        #    profile, for the claim's, and destroyed it)
        ("", 1, False),
        # 3. no create is run, so none dies on it (before: a crash there had the same undo)
        ("-cgi", 0, False),
    ],
)
async def test_a_claim_at_an_admin_instances_placement_leaves_it_at_every_crash_step(
    tmp_path: Path, crash_on_command: str, crash_at_write: int, crashes: bool
) -> None:
    # Allocated from a slice published before the admin made the 3g.40gb at 4 (GPU instance 1).
    gpus = admin_h100s(tmp_path)
    gpu0 = gpus[0].uuid
    dying = CrashingRunner(crash_on_command)
    checkpoint = CrashingCheckpoint(tmp_path / "state", dying)
    checkpoint.crash_at = crash_at_write
    preparer = mig_preparer(tmp_path, mig_claims(), dying, checkpoint, gpus=gpus)
    if crashes:
        with pytest.raises(Crash):
            await preparer.prepare([THREE_G])
    else:
        error = (await preparer.prepare([THREE_G]))[THREE_G.uid].error
        assert error == (
            "gpu-0-mig-3g-40gb-at-4: memory slices 4-7 are taken by GPU instance 1, made since the "
            "slice was published; nothing was made"
        )
    assert commands(dying) == ([] if crashes else [f"nvidia-smi mig -i {gpu0} -lgi"])
    assert checkpoint.writes == 0 and THREE_G.uid not in read_claims(tmp_path / "state")
    # The restart has nothing to undo: the admin's instance stays, published as theirs.
    runner = CrashingRunner()
    await mig_preparer(tmp_path, mig_claims(), runner, gpus=gpus).recover()
    assert commands(runner) == []
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0])}}
    published = driver_instances_hidden(tmp_path / "state")(gpus)
    assert published[0].mig_devices == gpus[0].mig_devices


async def test_a_create_refused_after_a_clear_listing_destroys_nothing(tmp_path: Path) -> None:
    # An admin's create landing between the listing and the claim's own (slice 0 free when
    # listed): the refused create made nothing, and its undo does not look at the placement.
    gpus = admin_h100s(tmp_path)
    gpu0 = gpus[0].uuid
    runner = CrashingRunner()
    runner.fail_when = lambda command: "-cgi" in command.argv
    preparer = mig_preparer(tmp_path, mig_claims(), runner, gpus=gpus)
    assert "injected failure" in (await preparer.prepare([ONE_G]))[ONE_G.uid].error
    # The refused create is not recorded; listed again, slice 0 is still free: the refusal as it came.
    assert commands(runner) == [f"nvidia-smi mig -i {gpu0} -lgi"] * 2
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0])}}
    assert ONE_G.uid not in Checkpoint(tmp_path / "state").claims


class RacingSmi(SimulatedSmi):
    """The simulated GPUs with an administrator's ``-cgi`` landing just before the driver's first
    create: after the driver listed the GPU's instances, before its own create reaches the GPU."""

    def __init__(self, state_file: Path, gpus: list[Gpu], record: RunCommand, admin_create: Command) -> None:
        super().__init__(state_file, gpus, record)
        self.admin_create: Command | None = admin_create

    async def run(self, command: Command) -> str:
        if "-cgi" in command.argv and self.admin_create is not None:
            admin, self.admin_create = self.admin_create, None
            await super().run(admin)
        return await super().run(command)


@pytest.mark.parametrize(
    ("admin_makes", "taken", "left_on_gpu0"),
    [
        # the claim's own placement and profile: 1g.10gb (profile 19) at slice 0
        ("19:0", "memory slice 0 is taken by GPU instance 1", {1: ("1g.10gb", 0, [0])}),
        # an overlapping one: 2g.20gb (profile 14) at slices 0-1 covers the 1g's slice 0
        ("14:0", "memory slice 0 is taken by GPU instance 1", {1: ("2g.20gb", 0, [0])}),
    ],
)
async def test_an_admin_create_between_the_listing_and_the_create_is_named_on_the_claim(
    tmp_path: Path, admin_makes: str, taken: str, left_on_gpu0: dict[int, tuple[str, int, list[int]]]
) -> None:
    # The known window: the listing shows slice 0 free, then an administrator makes an instance
    # there; the driver's create is refused (Insufficient Resources). Listed again, the GPU shows
    # who took the placement: the claim's error names it, nothing is made, recorded or destroyed.
    gpus = two_h100s()
    runner = CrashingRunner()
    admin = Command(("nvidia-smi", "mig", "-i", GPU0, "-cgi", admin_makes, "-C"))
    smi = RacingSmi(tmp_path / "state" / SIMULATED_MIG_STATE, gpus, runner.run, admin)
    # Simulated GPUs name no capability node, so none is read.
    partitioner = NvidiaMig(smi.run, smi.instance_uuid, MigCapabilities(tmp_path / "proc"), gpus)
    preparer = mig_preparer(tmp_path, mig_claims(), runner, partitioner=partitioner)
    error = (await preparer.prepare([ONE_G]))[ONE_G.uid].error
    assert error == (
        f"gpu-0-mig-1g-10gb-at-0: {taken}, made between the driver's listing and its create; nothing was made"
    )
    assert commands(runner) == [
        f"nvidia-smi mig -i {GPU0} -lgi",  # slice 0 free
        f"nvidia-smi mig -i {GPU0} -cgi {admin_makes} -C",  # the administrator's
        f"nvidia-smi mig -i {GPU0} -cgi 19:0 -C",  # the claim's, refused
        f"nvidia-smi mig -i {GPU0} -lgi",  # listed again: GPU instance 1 covers slice 0
    ]
    assert instances(tmp_path) == {GPU0: left_on_gpu0}
    assert ONE_G.uid not in Checkpoint(tmp_path / "state").claims
    # The kubelet's retry fails at the listing, before anything is recorded or run.
    runner.commands.clear()
    retry = (await preparer.prepare([ONE_G]))[ONE_G.uid].error
    assert retry == f"gpu-0-mig-1g-10gb-at-0: {taken}, made since the slice was published; nothing was made"
    assert commands(runner) == [f"nvidia-smi mig -i {GPU0} -lgi"]
    # A restart has nothing to undo: the administrator's instance stays.
    restarted = CrashingRunner()
    await mig_preparer(tmp_path, mig_claims(), restarted).recover()
    assert commands(restarted) == [] and instances(tmp_path) == {GPU0: left_on_gpu0}


async def test_recovery_undoes_an_interrupted_claim_and_leaves_the_admin_instance(tmp_path: Path) -> None:
    gpus = admin_h100s(tmp_path)
    gpu0 = gpus[0].uuid
    claims = mig_claims()
    dying = CrashingRunner()
    checkpoint = CrashingCheckpoint(tmp_path / "state", dying)
    preparer = mig_preparer(tmp_path, claims, dying, checkpoint, gpus=gpus)
    await preparer.prepare([ONE_G])  # both slots written: the checkpoint is complete
    await preparer.unprepare([ONE_G])
    checkpoint.crash_at = checkpoint.writes + 2  # the instance made, its "completed" write lost
    with pytest.raises(Crash):
        await preparer.prepare([ONE_G])
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0]), 2: ("1g.10gb", 0, [0])}}
    runner = CrashingRunner()
    await mig_preparer(tmp_path, claims, runner, gpus=gpus).recover()
    assert commands(runner) == [
        f"nvidia-smi mig -i {gpu0} {step}" for step in ("-lgi", "-gi 2 -dci", "-gi 2 -dgi")
    ]
    assert instances(tmp_path, gpus) == {gpu0: {1: ("3g.40gb", 4, [0])}}


@pytest.mark.parametrize(
    ("made_by_admin", "mig", "message"),
    [
        ("[{profile: 3g.40gb, start: 2}]", "dynamic", "has no placement 3g.40gb at 2"),  # 3g starts at 0 or 4
        ("[{profile: 4g.40gb, start: 0}, {profile: 1g.10gb, start: 3}]", "dynamic", "1g.10gb at 3 overlaps"),
        ("[{profile: 1g.10gb, start: 0}]", "[]", "madeByAdmin lists instances of a GPU with mig: dynamic"),
    ],
)
def test_made_by_admin_must_fit_the_placement_table(
    tmp_path: Path, made_by_admin: str, mig: str, message: str
) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(
        "driverVersion: '550.54.15'\ncudaDriverVersion: '12.4'\ngpus:\n"
        "  - {productName: NVIDIA H100 80GB HBM3, architecture: Hopper, cudaComputeCapability: '9.0',\n"
        f"     memory: 80Gi, mig: {mig}, madeByAdmin: {made_by_admin}}}\n"
    )
    with pytest.raises(BackendUnavailable, match=message):
        load_profile(node)
