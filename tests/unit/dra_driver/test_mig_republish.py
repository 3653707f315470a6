"""The slices follow MIG instances that change after the driver started: an administrator's
instance made or destroyed on a partitionable GPU is listed by discovery (the simulated GPUs'
state file, or NVML, polled every ``PARTITION_POLL_S``) and published, with the placements it
overlaps withdrawn; a prepare or unprepare of partitions asks the slice publisher to publish
again once its records are written (``request_republish``, coalesced).

Every test keeps its state under its own ``tmp_path`` and waits for what it checks (the next
pool the reconciler would write) with a deadline, never for a fixed time. A change is published
from the inventory read with the driver's records, not from the listing the change carried. The reconciler's
publish is recorded as the pool it would write, not sent to an API (the real apiserver's view is
``tests/integration/test_dra_mig.py``'s).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from dra_driver.__main__ import driver_instances_hidden
from dra_driver.devices.model import Gpu, MigDevice
from dra_driver.devices.share import Command
from dra_driver.prepare import ClaimRef
from dra_driver.profiles.nvidia import nvml, simulated
from dra_driver.profiles.nvidia.mig import NvidiaMig, SimulatedSmi, simulated_mig_uuid
from dra_driver.profiles.nvidia.migcaps import MigCapabilities
from dra_driver.profiles.nvidia.profile import SIMULATED_MIG_STATE
from dra_driver.profiles.nvidia.simulated import SimulatedDiscovery
from dra_driver.profiles.registry import build_profile
from dra_driver.sharing import RecordingRunner
from dra_driver.slices import NodeRef, SharingMode, SliceReconciler, build_slices
from tests.unit.dra_driver.fakes import DRIVER, NODE, Result, claim
from tests.unit.dra_driver.test_devices import FakeNvml
from tests.unit.dra_driver.test_mig import (
    GPU0,
    ONE_G,
    CrashingRunner,
    RacingSmi,
    _consumed,
    _devices,
    mig_claims,
    mig_preparer,
    two_h100s,
)

GIB = 1 << 30
DEADLINE_S = 10.0  # a pool or change not there by then is a failure, not a slow machine
# The placements overlapping memory slice 0 of an H100 (each starting there), and the whole GPU.
AT_SLICE_0 = {f"gpu-0-mig-{p}-at-0" for p in ("1g-10gb", "1g-20gb", "2g-20gb", "3g-40gb", "4g-40gb")}


def state_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / SIMULATED_MIG_STATE


def admin_smi(tmp_path: Path) -> SimulatedSmi:
    """An administrator's ``nvidia-smi`` on the same simulated GPUs: another object (as another
    process would be) on the driver's state file."""
    state_file(tmp_path).parent.mkdir(exist_ok=True)
    return SimulatedSmi(state_file(tmp_path), two_h100s(), RecordingRunner().run)


def admin(*args: str) -> Command:
    return Command(("nvidia-smi", "mig", "-i", GPU0, *args))


class PoolRecorder(SliceReconciler):
    """The reconciler's loop with each publish recorded as the pool it would write."""

    def __init__(self, api: ApiClient, discovery: SimulatedDiscovery, state_dir: Path) -> None:
        super().__init__(
            api,
            NODE,
            DRIVER,
            discovery,
            mode=SharingMode.CONSUMABLE_CAPACITY,
            partitionable=True,
            published=driver_instances_hidden(state_dir),
        )
        self.pools: asyncio.Queue[dict[str, dict[str, Any]]] = asyncio.Queue()

    async def publish(self, gpus: Sequence[Gpu]) -> bool:
        assert self.mode is not None
        self.generation += 1
        published = self._published_gpus(gpus)
        pool = build_slices(NodeRef(NODE), DRIVER, published, self.mode, self.generation, partitionable=True)
        self.pools.put_nowait(_devices(pool))
        return True

    async def next_pool(self) -> dict[str, dict[str, Any]]:
        return await asyncio.wait_for(self.pools.get(), DEADLINE_S)


class HeldBack(logging.Handler):
    """Sets ``held`` when the reconciler logs that it holds a republish back."""

    def __init__(self, held: asyncio.Event) -> None:
        super().__init__()
        self._held = held

    def emit(self, record: logging.LogRecord) -> None:
        if "held back" in record.getMessage():
            self._held.set()


@asynccontextmanager
async def running(slices: PoolRecorder, min_interval_s: float = 3600) -> AsyncIterator[None]:
    loop = asyncio.create_task(slices.run(min_interval_s=min_interval_s))
    try:
        yield
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_an_instance_an_admin_makes_after_the_start_is_published_and_withdrawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the first publish an administrator makes a 1g.10gb at memory slice 0 of GPU 0 (GPU
    # instance 1, compute instance 0). Discovery's poll (here every 10 ms) lists it: the next
    # pool has it as gpu-0-mig-1-0, consuming slice 0 and 1 compute slice, and lacks the five
    # placements starting at slice 0 and the whole GPU (18 - 6 + 1 = 13 devices on GPU 0). He
    # destroys it: the pool is the first one again.
    monkeypatch.setattr(simulated, "PARTITION_POLL_S", 0.01)
    discovery = SimulatedDiscovery(two_h100s(), mig_state=state_file(tmp_path))
    async with ApiClient() as api:
        slices = PoolRecorder(api, discovery, tmp_path / "state")
        async with running(slices):
            before = await slices.next_pool()
            assert "gpu-0" in before and len([n for n in before if n.startswith("gpu-0")]) == 18
            smi = admin_smi(tmp_path)
            await smi.run(admin("-cgi", "19:0", "-C"))
            made = await slices.next_pool()
            await smi.run(admin("-gi", "1", "-dci"))
            await smi.run(admin("-gi", "1", "-dgi"))
            gone = await slices.next_pool()
    assert _consumed(made["gpu-0-mig-1-0"]) == {"memory-slice-0": "1", "compute-slices": "1"}
    assert made["gpu-0-mig-1-0"]["attributes"]["uuid"] == {"string": simulated_mig_uuid(GPU0, 1, 0)}
    assert before.keys() - made.keys() == {"gpu-0", *AT_SLICE_0}
    assert made.keys() - before.keys() == {"gpu-0-mig-1-0"}
    assert len([n for n in made if n.startswith("gpu-0")]) == 13
    assert gone.keys() == before.keys()


async def test_a_prepare_refused_for_an_admins_instance_republishes_the_slices_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The admin's 1g.10gb lands at slice 0 between the driver's listing and its create. The
    # claim was recorded `started` at slice 0 before the create and its record removed after the
    # refusal; only then does the preparer ask for a republish (asked earlier, the publish could
    # read the `started` record and hide the admin's instance as the claim's). Discovery's own
    # poll is an hour here, so the request alone publishes: gpu-0-mig-1-0 appears, the six
    # devices at slice 0 go. The kubelet's retry is refused at the listing and asks again.
    monkeypatch.setattr(simulated, "PARTITION_POLL_S", 3600)
    discovery = SimulatedDiscovery(two_h100s(), mig_state=state_file(tmp_path))
    reasons: list[str] = []
    async with ApiClient() as api:
        slices = PoolRecorder(api, discovery, tmp_path / "state")

        def instances_changed(reason: str) -> None:
            reasons.append(reason)
            slices.request_republish(reason)

        async with running(slices):
            before = await slices.next_pool()
            runner = CrashingRunner()
            smi = RacingSmi(state_file(tmp_path), two_h100s(), runner.run, admin("-cgi", "19:0", "-C"))
            partitioner = NvidiaMig(
                smi.run, smi.instance_uuid, MigCapabilities(tmp_path / "proc"), two_h100s()
            )
            preparer = mig_preparer(
                tmp_path, mig_claims(), runner, partitioner=partitioner, instances_changed=instances_changed
            )
            refused = (await preparer.prepare([ONE_G]))[ONE_G.uid].error
            assert "made between the driver's listing and its create" in refused
            after = await slices.next_pool()
            retried = (await preparer.prepare([ONE_G]))[ONE_G.uid].error
    assert _consumed(after["gpu-0-mig-1-0"]) == {"memory-slice-0": "1", "compute-slices": "1"}
    assert before.keys() - after.keys() == {"gpu-0", *AT_SLICE_0}
    assert after.keys() - before.keys() == {"gpu-0-mig-1-0"}
    assert "made since the slice was published" in retried
    assert reasons == [f"prepare of MIG partitions on {GPU0}"] * 2


async def test_a_republish_request_held_back_neither_delays_a_health_change_nor_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A request within the rate limit (here an hour) of the last one it served waits; a health
    # change arriving meanwhile is published at once, and the request stays pending after it.
    held = asyncio.Event()
    logger = logging.getLogger("dra_driver.slices")
    monkeypatch.setattr(logger, "level", logging.DEBUG)
    monkeypatch.setattr(logger, "handlers", [HeldBack(held)])
    discovery = SimulatedDiscovery(two_h100s())
    async with ApiClient() as api:
        slices = PoolRecorder(api, discovery, tmp_path / "state")
        async with running(slices):
            await slices.next_pool()  # the first publish
            slices.request_republish("a refusal")  # none served before: served at once
            await slices.next_pool()
            slices.request_republish("the kubelet's retry")

            await asyncio.wait_for(held.wait(), DEADLINE_S)  # the loop took the request, holds it
            discovery.set_health(1, healthy=False, message="XID 79")
            changed = await slices.next_pool()
            assert "taints" in changed["gpu-1"]  # GPU 1 marked unhealthy
            assert slices._republish_requested.is_set()  # still to be served, once the hour is up


async def test_the_driver_and_an_admin_share_the_simulated_gpus_state(tmp_path: Path) -> None:
    # Two simulated nvidia-smi on one state file (the driver's and an administrator's): each
    # change is read, made and written under the file's lock, so neither loses the other's. The
    # driver's 1g at slice 0 is GPU instance 1; the admin's at slice 1 then gets id 2 (the
    # lowest free) and the driver lists both; the admin's create at slice 0 is refused.
    driver, other = admin_smi(tmp_path), admin_smi(tmp_path)
    await driver.run(admin("-cgi", "19:0", "-C"))
    await other.run(admin("-cgi", "19:1", "-C"))
    listing = await driver.run(admin("-lgi"))
    assert [line.split()[4:7] for line in listing.splitlines() if "MIG 1g" in line] == [
        ["19", "1", "0:1"],
        ["19", "2", "1:1"],
    ]
    with pytest.raises(Exception, match="Insufficient Resources"):
        await other.run(admin("-cgi", "19:0", "-C"))
    assert driver.instances() == {GPU0: {1: ("1g.10gb", 0, [0]), 2: ("1g.10gb", 1, [0])}}


def test_the_simulated_backend_lists_the_instances_in_its_state_directory(tmp_path: Path) -> None:
    # build_profile's state directory is the driver's checkpoint directory: the simulated GPUs
    # list what its state file holds (here an admin's 3g.40gb at slices 4-7 of GPU 0); without
    # one they list the profile's madeByAdmin instances (none on h100x2-mig).
    asyncio.run(admin_smi(tmp_path).run(admin("-cgi", "9:4", "-C")))
    watched = build_profile("simulated", Path("h100x2-mig"), NODE, state_dir=tmp_path / "state")
    (mig,) = watched.discovery.inventory()[0].mig_devices
    assert (mig.gi, mig.ci, mig.profile, mig.placement_start, mig.memory_bytes) == (
        1,
        0,
        "3g.40gb",
        4,
        40 * GIB,
    )
    unwatched = build_profile("simulated", Path("h100x2-mig"), NODE)
    assert [gpu.mig_devices for gpu in unwatched.discovery.inventory()] == [(), ()]


async def test_nvml_reports_a_mig_instance_made_after_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML has no event for a MIG instance: the health thread lists the MIG devices every
    # PARTITION_POLL_S (here 10 ms) and yields a new inventory when they differ. The fake's
    # GPU 1 has GPU instance 2 (3g.20gb at slices 4-7); a second MIG device appears in slot 1.
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(nvml, "PARTITION_POLL_S", 0.01)
    made = fake.nvmlEventSetCreate

    def made_once_watching() -> str:  # the thread listed the MIG devices, then asks for events
        fake.second_mig = True
        return made()

    monkeypatch.setattr(fake, "nvmlEventSetCreate", made_once_watching)
    watcher = build_profile("nvml").discovery.watch_health()
    gpus = await asyncio.wait_for(anext(watcher), DEADLINE_S)
    assert [(m.gi, m.uuid) for m in gpus[1].mig_devices] == [(2, "MIG-7"), (3, "MIG-8")]
    await watcher.aclose()


class StaleListing(SimulatedDiscovery):
    """Its one change carries a listing taken before the driver destroyed its instance (GPU
    instance 1 of GPU 0, a 1g.10gb at slice 0); the inventory read now has none."""

    def __init__(self, gpus: list[Gpu], stale: list[Gpu]) -> None:
        super().__init__(gpus)
        self._stale = stale

    async def _changes(self) -> AsyncIterator[list[Gpu]]:
        yield self._stale
        await asyncio.Event().wait()  # no change after it

    def watch_health(self) -> Any:
        return self._changes()


async def test_a_change_is_published_from_the_inventory_read_with_the_records(tmp_path: Path) -> None:
    # The change's listing still shows the driver's instance, whose claim was unprepared since
    # (destroyed, then its record removed: the records hold no claim). Published from that
    # listing, the instance would be someone else's (gpu-0-mig-1-0) and the placements at slice
    # 0 withdrawn; the reconciler reads the inventory again with the records, and publishes the
    # 18 placements of GPU 0.
    gpus = two_h100s()
    stale = [replace(gpus[0], mig_devices=(MigDevice(1, 0, "1g.10gb", "MIG-gone", 10 * GIB, 0),)), gpus[1]]
    async with ApiClient() as api:
        slices = PoolRecorder(api, StaleListing(gpus, stale), tmp_path / "state")
        async with running(slices):
            await slices.next_pool()  # the first publish
            after_change = await slices.next_pool()
    assert "gpu-0-mig-1-0" not in after_change
    assert len([name for name in after_change if name.startswith("gpu-0")]) == 18


async def test_a_stale_claim_of_a_destroyed_admin_instance_gets_no_partition_of_the_driver(
    tmp_path: Path,
) -> None:
    # An administrator's instance was published as gpu-0-mig-1-0 and a claim allocated it; the
    # admin destroyed it, and the driver's next partition (ONE_G's 1g.10gb at slice 0) got GPU
    # instance id 1, the lowest free. Discovery lists that one too, as gpu-0-mig-1-0: the stale
    # claim is refused, naming the claim whose partition it is, and ONE_G's instance is left.
    claims = mig_claims()
    stale = ClaimRef("ns", "uid-stale", "stale")
    claims.add(claim(stale.uid, [Result("gpu-0-mig-1-0")], name=stale.name))
    runner = CrashingRunner()
    assert (await mig_preparer(tmp_path, claims, runner).prepare([ONE_G]))[ONE_G.uid].error == ""
    listed = SimulatedDiscovery(two_h100s(), mig_state=state_file(tmp_path)).inventory()
    assert [(m.gi, m.ci) for m in listed[0].mig_devices] == [(1, 0)]
    restarted = mig_preparer(tmp_path, claims, runner, gpus=listed)
    error = (await restarted.prepare([stale]))[stale.uid].error
    assert error == (
        "gpu-0-mig-1-0: GPU instance 1 is this driver's partition of claim uid-1g, not an instance "
        "someone else made; nothing was made"
    )
    assert admin_smi(tmp_path).instances() == {GPU0: {1: ("1g.10gb", 0, [0])}}
