"""Sharing setup and reset commands (NVIDIA's, through the manager), conflicts between claims, and
the MPS container limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.gpuconfig import SharingStrategy
from dra_driver.devices.share import GpuShare
from dra_driver.profiles.nvidia.sharing import MPS_CONTAINER_PIPE_DIR, NvidiaSharing
from dra_driver.sharing import RecordingRunner, SharingConflict, SharingManager

GIB = 1 << 30
UUID = "GPU-aaaa"


def mps(memory_gib: int = 20, threads: int = 25) -> GpuShare:
    return GpuShare(UUID, "gpu-0", SharingStrategy.MPS, memory_gib * GIB, threads)


def timesliced(interval: str = "Short") -> GpuShare:
    return GpuShare(UUID, "gpu-0", SharingStrategy.TIME_SLICING, timeslice=interval)  # type: ignore[arg-type]


async def test_mps_daemon_starts_once_and_stops_after_the_last_claim(tmp_path: Path) -> None:
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    edits = await sharing.acquire("c1", mps(20, 25))
    await sharing.acquire("c2", mps(40, 50))
    await sharing.acquire("c2", mps(40, 50))  # a repeated prepare changes nothing
    assert [c.argv for c in runner.commands] == [
        ("nvidia-smi", "-i", UUID, "-c", "EXCLUSIVE_PROCESS"),
        ("nvidia-cuda-mps-control", "-d"),
    ]
    assert dict(runner.commands[1].env)["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / UUID / "pipe")
    assert (tmp_path / UUID / "pipe").is_dir()
    assert edits.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert edits.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert edits.env["CUDA_MPS_PIPE_DIRECTORY"] == MPS_CONTAINER_PIPE_DIR
    assert (str(tmp_path / UUID / "pipe"), MPS_CONTAINER_PIPE_DIR) in edits.mounts
    assert sharing.users(UUID) == {"c1", "c2"}

    await sharing.release("c1", mps(20, 25))
    assert len(runner.commands) == 2  # c2 still uses the daemon
    await sharing.release("c2", mps(40, 50))
    assert [(c.argv, c.stdin) for c in runner.commands[2:]] == [
        (("nvidia-cuda-mps-control",), "quit\n"),
        (("nvidia-smi", "-i", UUID, "-c", "DEFAULT"), ""),
    ]
    assert not (tmp_path / UUID).exists()
    assert sharing.users(UUID) == frozenset()


async def test_time_slicing_sets_and_resets_the_interval(tmp_path: Path) -> None:
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    edits = await sharing.acquire("c1", timesliced("Long"))
    assert edits.env == {} and edits.mounts == ()
    await sharing.release("c1", timesliced("Long"))
    assert [c.argv for c in runner.commands] == [
        ("nvidia-smi", "-i", UUID, "-c", "DEFAULT"),
        ("nvidia-smi", "compute-policy", "-i", UUID, "--set-timeslice", "3"),
        ("nvidia-smi", "compute-policy", "-i", UUID, "--set-timeslice", "0"),
    ]


async def test_exclusive_runs_no_command(tmp_path: Path) -> None:
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    whole = GpuShare(UUID, "gpu-0", SharingStrategy.EXCLUSIVE)
    await sharing.acquire("c1", whole)
    await sharing.release("c1", whole)
    assert runner.commands == []


@pytest.mark.parametrize(
    ("held", "asked", "message"),
    [
        (mps(), timesliced(), "shared with MPS"),
        (timesliced("Short"), timesliced("Long"), "interval Short"),
        (GpuShare(UUID, "gpu-0", SharingStrategy.EXCLUSIVE), mps(), "held by 1 other claim"),
        (mps(), GpuShare(UUID, "gpu-0", SharingStrategy.EXCLUSIVE), "cannot share it"),
    ],
)
async def test_conflicting_claims_on_one_gpu_are_refused(
    tmp_path: Path, held: GpuShare, asked: GpuShare, message: str
) -> None:
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    await sharing.acquire("c1", held)
    before = list(runner.commands)
    with pytest.raises(SharingConflict, match=message):
        await sharing.acquire("c2", asked)
    assert runner.commands == before
    assert sharing.users(UUID) == {"c1"}


async def test_restore_rebuilds_users_without_commands(tmp_path: Path) -> None:
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    sharing.restore({"c1": [mps()], "c2": [mps()]})
    assert runner.commands == []
    await sharing.release("c1", mps())
    assert runner.commands == []
    await sharing.acquire("c3", mps())  # joins the running daemon
    assert runner.commands == []


async def test_reset_failure_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = RecordingRunner(fail_when=lambda c: c.stdin == "quit\n")
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    await sharing.acquire("c1", mps())
    await sharing.release("c1", mps())
    assert "resetting GPU GPU-aaaa" in caplog.text
    assert runner.commands[-1].argv == ("nvidia-smi", "-i", UUID, "-c", "DEFAULT")
    assert sharing.users(UUID) == frozenset()


async def test_recording_runner_writes_a_command_log(tmp_path: Path) -> None:
    log_path = tmp_path / "commands.jsonl"
    sharing = SharingManager(RecordingRunner(log_path=log_path), NvidiaSharing(tmp_path / "mps"))
    await sharing.acquire("c1", timesliced())
    lines = log_path.read_text().splitlines()
    assert len(lines) == 2 and '"--set-timeslice", "1"' in lines[1]


async def test_claims_released_together_reset_each_idle_gpu_once_and_never_a_kept_one(tmp_path: Path) -> None:
    """Three interrupted MPS claims on GPU-aaaa and two on GPU-bbbb, none restored as users:
    released one by one, each would find its GPU idle (5 resets of 2 commands); together, each GPU
    is reset once (2 x 2). A GPU in ``keep`` (a spec the driver cannot account for names it) is
    not reset at all."""
    runner = RecordingRunner()
    sharing = SharingManager(runner, NvidiaSharing(tmp_path))
    other = GpuShare("GPU-bbbb", "gpu-1", SharingStrategy.MPS, 10 * GIB, 13)
    interrupted = {"c1": (mps(),), "c2": (mps(),), "c3": (mps(),), "c4": (other,), "c5": (other,)}
    await sharing.release_claims(interrupted)
    assert [c.argv for c in runner.commands] == [
        ("nvidia-cuda-mps-control",),
        ("nvidia-smi", "-i", UUID, "-c", "DEFAULT"),
        ("nvidia-cuda-mps-control",),
        ("nvidia-smi", "-i", "GPU-bbbb", "-c", "DEFAULT"),
    ]
    runner.commands.clear()
    await sharing.release_claims(interrupted, keep={UUID})
    assert [c.argv for c in runner.commands] == [
        ("nvidia-cuda-mps-control",),
        ("nvidia-smi", "-i", "GPU-bbbb", "-c", "DEFAULT"),
    ]
