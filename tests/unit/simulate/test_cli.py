"""The `tessera simulate` command end to end on tiny inputs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tessera.simulate.cli import main

EXAMPLE = Path(__file__).resolve().parents[3] / "tessera" / "simulate" / "examples" / "two-teams.yaml"


def write_trace(folder: Path) -> tuple[Path, Path]:
    nodes = folder / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,65536,4,T4\n" for i in range(4))
    )
    pods = folder / "openb_pod_list_tiny.csv"
    sizes = [500, 1000, 250, 750] * 3
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"p{i},2000,1024,1,{milli}\n" for i, milli in enumerate(sizes))
    )
    return nodes, pods


def test_trace_mode_prints_table_and_writes_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    out = tmp_path / "out"
    code = main(
        [
            "trace",
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--policies",
            "fgd,tessera",
            "--jobs",
            "1",
            "--quiet",
            "--no-plots",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "trace tiny" in printed and "tessera" in printed and "fgd" in printed
    with (out / "tiny-summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["policy"] for row in rows] == ["fgd", "tessera"]
    assert all(float(row["arrival_pct"]) <= 130.0 for row in rows)
    assert (out / "tiny-curve.csv").stat().st_size > 0


def test_trace_mode_rejects_unknown_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    assert main(["trace", "--nodes", str(nodes), "--pods", str(pods), "--policies", "magic"]) == 2
    assert "unknown policy magic" in capsys.readouterr().err


def test_queue_mode_writes_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queues", str(EXAMPLE), "--out", str(tmp_path)]) == 0
    assert "team-a" in capsys.readouterr().out
    png = tmp_path / "two-teams-queues.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_queue_mode_reports_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\n")
    assert main(["queues", str(bad)]) == 2
    assert "bad.yaml" in capsys.readouterr().err


def test_several_seeds_give_mean_min_max(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    out = tmp_path / "out"
    assert (
        main(
            [
                "trace",
                "--nodes",
                str(nodes),
                "--pods",
                str(pods),
                "--policies",
                "random",
                "--seeds",
                "1,2",
                "--jobs",
                "1",
                "--quiet",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "mean alloc %" in capsys.readouterr().out
    with (out / "tiny-summary.csv").open() as handle:
        assert [row["seed"] for row in csv.DictReader(handle)] == ["1", "2"]


def test_both_replays_and_a_file_without_times(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    out = tmp_path / "out"
    args = ["trace", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,tessera"]
    args += ["--jobs", "1", "--quiet", "--out", str(out), "--replay", "paper,creation"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "replay paper: pods shuffled per seed" in printed
    assert "replay creation: creation-time order (no creation_time: file order)" in printed
    assert "tessera - fgd (points): seed 0" in printed
    with (out / "tiny-summary.csv").open() as handle:
        assert [(row["replay"], row["policy"]) for row in csv.DictReader(handle)] == [
            ("paper", "fgd"),
            ("paper", "tessera"),
            ("creation", "fgd"),
            ("creation", "tessera"),
        ]
    for replay in ("paper", "creation"):
        assert (out / f"tiny-{replay}-packing.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_replay_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    assert main(["trace", "--nodes", str(nodes), "--pods", str(pods), "--replay", "fifo"]) == 2
    assert "unknown replay 'fifo'" in capsys.readouterr().err


def test_move_budgets_add_consolidating_replays_and_their_curve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    out = tmp_path / "out"
    argv = ["trace", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd", "--seeds", "0,1"]
    argv += ["--moves-per-100-pods", "0,5", "--jobs", "1", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "tessera+moves0 - fgd (points)" in printed and "tessera+moves5 - fgd (points)" in printed
    assert "allocation vs move budget, tiny, replay paper:" in printed
    assert (out / "move-budget.png").stat().st_size > 0
    with (out / "tiny-summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted({(r["policy"], r["moves_per_100_pods"]) for r in rows}) == [
        ("fgd", ""),
        ("tessera+moves0", "0"),
        ("tessera+moves5", "5"),
    ]
    assert all(int(r["moves"]) <= 5 * int(r["pods_placed"]) / 100 for r in rows)
    assert main([*argv, "--moves-per-100-pods", "-1"]) == 2


def test_bound_prints_the_idle_breakdown_and_the_capping_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    argv = ["trace", "--nodes", str(nodes), "--pods", str(pods), "--policies", "tessera", "--jobs", "1"]
    assert main([*argv, "--quiet", "--no-plots", "--out", str(tmp_path / "out"), "--bound"]) == 0
    printed = capsys.readouterr().out
    assert "upper bounds on what moves could reach, tiny:" in printed
    assert "gap bound % (theta: gaps - small)" in printed
    # 16 T4 GPUs and pods of 250 to 1000: the 750s leave gaps of 250 that the 250s can fill, so
    # no prefix of the arrivals caps the bound below 98.5%.
    assert "seed 0: no prefix of the arrivals caps the gap bound below 98.5%" in printed
