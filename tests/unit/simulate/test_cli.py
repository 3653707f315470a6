"""The `tessera simulate` command end to end on tiny inputs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from extender.rule_flags import NUMERIC_RULE_FLAGS
from tessera.simulate.cli import main
from tessera.simulate.timeline import MOVES

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


@pytest.mark.parametrize("flag", [*NUMERIC_RULE_FLAGS, "--termination-delay"])
def test_queue_mode_refuses_a_negative_wait(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queues", str(EXAMPLE), flag, "-1"]) == 2
    err = capsys.readouterr().err
    assert "cannot be negative" in err and flag in err


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


def write_timed_trace(folder: Path) -> tuple[Path, Path]:
    """Two 2-GPU nodes and the pods of test_timeline's scattered fractions: a 2-GPU pod "w" waits
    from t=13 beside two 0.6 fractions on different nodes; one move serves it."""
    nodes = folder / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"n{i},32000,65536,2,T4\n" for i in range(2))
    )
    pods = folder / "timed.csv"
    rows: list[tuple[str, int, int, int, int | None]] = [
        ("y1", 2, 1000, 0, 10),
        ("f1", 1, 600, 1, 100),
        ("y2", 1, 1000, 2, 10),
        ("f2", 1, 600, 11, 100),
    ]
    rows += [("w", 2, 1000, 13, 10), ("never", 1, 1000, 14, None)]
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\n"
        + "".join(
            f"{name},1000,1024,{gpus},{milli},,LS,Running,{created},"
            + (f"{created + runs},{created}\n" if runs is not None else f"{created + 5},\n")
            for name, gpus, milli, created, runs in rows
        )
    )
    return nodes, pods


def test_timeline_mode_prints_tables_and_writes_csv_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_timed_trace(tmp_path)
    out = tmp_path / "out"
    argv = ["timeline", "--nodes", str(nodes), "--pods", str(pods), "--cluster-share", "1", "--loads", "1,2"]
    argv += ["--move-budget", "100", "--min-runtime", "20", "--jobs", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "5 pods replayed (1 never ran in the trace, 0 fit no node)" in printed
    assert "trace (recorded, 1.0x)" in printed and "tessera+moves" in printed
    with (out / "timeline-summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5 * 2  # five policies x two loads, one seed
    moved = next(r for r in rows if r["policy"] == "tessera+moves" and r["load"] == "1.0")
    # The move of test_timeline: w waits 13..21 instead of 13..101; f1 loses 0.6 GPU x 20 s.
    assert (moved["moves"], moved["wait_2-4_p99_s"], moved["lost_gpu_s"]) == ("1", "8", "12")
    plain = next(r for r in rows if r["policy"] == "tessera" and r["load"] == "1.0")
    assert plain["wait_2-4_p99_s"] == "88"
    assert (out / "timeline-1x.png").stat().st_size > 0 and (out / "timeline-2x.png").stat().st_size > 0
    assert (out / "timeline-curve.csv").stat().st_size > 0


@pytest.mark.parametrize(
    "bad",
    [["--policies", "fgd,nope"], ["--loads", "0"], ["--cluster-share", "2"], ["--move-budget", "-1"]],
)
def test_timeline_mode_refuses_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    nodes, pods = write_timed_trace(tmp_path)
    assert main(["timeline", "--nodes", str(nodes), "--pods", str(pods), "--no-plots", *bad]) == 2
    assert "error:" in capsys.readouterr().err


def test_timeline_smoke_replays_the_first_pods_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_timed_trace(tmp_path)
    argv = ["timeline", "--nodes", str(nodes), "--pods", str(pods), "--cluster-share", "1", "--smoke"]
    assert (
        main(
            [*argv, "--policies", "fgd", "--loads", "1", "--jobs", "1", "--no-plots", "--out", str(tmp_path)]
        )
        == 0
    )
    assert "5 pods replayed" in capsys.readouterr().out  # --smoke keeps 300 pods: all of these
    argv += ["--max-pods", "2", "--policies", "fgd", "--jobs", "1", "--no-plots", "--out", str(tmp_path)]
    argv.remove("--smoke")
    assert main(argv) == 0
    assert "2 pods replayed" in capsys.readouterr().out


def test_timeline_queues_adds_the_queue_tables_and_leaves_the_others_as_they_were(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_timed_trace(tmp_path)
    argv = ["timeline", "--nodes", str(nodes), "--pods", str(pods), "--cluster-share", "1", "--loads", "1"]
    argv += ["--policies", "fgd,tessera+moves", "--jobs", "1", "--no-plots", "--out", str(tmp_path)]
    assert main(argv) == 0
    without = capsys.readouterr().out
    assert "worst" not in without and not (tmp_path / "timeline-queues.csv").exists()
    assert main([*argv, "--queues", "2"]) == 0
    printed = capsys.readouterr().out
    # The tables of the run without queues come first, unchanged (but the paths written).
    assert printed.startswith(without.rsplit("wrote ", 1)[0])
    assert "the worst queue of each figure" in printed and "moves lost % of GPU work" in printed
    with (tmp_path / "timeline-queues.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    # Both policies (tessera+moves with consolidation after reclaim), two queues each; the five
    # pods that ran (one never did) split between them.
    assert [(r["policy"], r["queue"]) for r in rows] == [
        ("fgd", "q0"),
        ("fgd", "q1"),
        ("tessera+moves", "q0"),
        ("tessera+moves", "q1"),
    ]
    assert [sum(int(r["pods"]) for r in rows if r["policy"] == policy) for policy in ("fgd", MOVES)] == [5, 5]
    assert main([*argv, "--queues", "0"]) == 2
    assert "--queues must be at least 1" in capsys.readouterr().err
