"""Timeline replay output: the tables, the CSV files and the plot of ``tessera simulate timeline``.

Figures over seeds are the mean of the per-seed figures (a percentile is taken per seed, then
averaged). Waits are in minutes in the tables, seconds in the CSV.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

from .report import _pyplot, _save_figure, format_table
from .timeline import MOVES, SIZE_CLASSES, TimelineResult, percentile

MULTI_GPU_P95_LIMIT_S = 600.0  # the threshold: FGD's multi-GPU p95 wait first above 10 minutes
PERCENTILES = (50, 95, 99)


def multi_gpu_p95(result: TimelineResult) -> float:
    """p95 wait (s) of the pods asking for 2 or more GPUs (0 when there are none)."""
    waits = result.multi_gpu_waits()
    return percentile(waits, 95) if waits else 0.0


def _minutes(seconds: float) -> str:
    return "" if math.isnan(seconds) else f"{seconds / 60:.1f}"


def _mean(values: Sequence[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return mean(present) if present else math.nan


def _groups(results: Sequence[TimelineResult]) -> dict[tuple[float, str], list[TimelineResult]]:
    groups: dict[tuple[float, str], list[TimelineResult]] = {}
    for r in sorted(results, key=lambda r: r.load):
        groups.setdefault((r.load, r.policy), []).append(r)
    return groups


def timeline_table(results: Sequence[TimelineResult]) -> str:
    """One row per (load, policy), mean over its seeds."""
    headers = [
        "load",
        "policy",
        "seeds",
        "alloc %",
        "alloc % waiting",
        "wait GPU-h",
        "stranded GPU-h",
        "p95 2+ GPU min",
        "p95 8 min",
        "p95 2-4 min",
        "p95 1 min",
        "p95 frac min",
        "moves",
        "lost work %",
        "secs",
    ]
    rows = []
    for (load, policy), mine in _groups(results).items():
        rows.append(
            [
                f"{load:g}x",
                policy,
                str(len(mine)),
                f"{_mean([r.allocation_pct for r in mine]):.2f}",
                f"{_mean([r.allocation_waiting_pct for r in mine]):.1f}",
                f"{_mean([r.wait_gpu_hours for r in mine]):.1f}",
                f"{_mean([r.stranded_gpu_s / 3600 for r in mine]):.1f}",
                _minutes(_mean([multi_gpu_p95(r) for r in mine])),
                *(
                    _minutes(_mean([r.wait(size, 95) for r in mine]))
                    for size in ("8", "2-4", "1", "fraction")
                ),
                f"{_mean([r.moves for r in mine]):.1f}",
                f"{_mean([r.lost_work_pct for r in mine]):.3f}",
                f"{_mean([r.seconds for r in mine]):.1f}",
            ]
        )
    return format_table(headers, rows)


def waits_table(results: Sequence[TimelineResult], load: float) -> str:
    """Wait p50/p95/p99 (minutes) by pod size at one load, and the trace's own recorded waits."""
    headers = ["policy", *(f"{size} p{p}" for size in SIZE_CLASSES for p in PERCENTILES)]
    rows = []
    mine = [r for r in results if r.load == load]
    for (_, policy), group in _groups(mine).items():
        rows.append(
            [policy]
            + [
                _minutes(_mean([r.wait(size, p) for r in group]))
                for size in SIZE_CLASSES
                for p in PERCENTILES
            ]
        )
    if mine:
        recorded = mine[0].recorded_waits
        rows.append(
            ["trace (recorded, 1.0x)"]
            + [_minutes(percentile(recorded.get(size, []), p)) for size in SIZE_CLASSES for p in PERCENTILES]
        )
    return format_table(headers, rows)


def first_load_over(results: Sequence[TimelineResult], policy: str = "fgd") -> float | None:
    """The lowest load at which `policy`'s multi-GPU p95 wait, mean over seeds, passes 10 minutes."""
    for (load, name), mine in _groups(results).items():
        if name == policy and _mean([multi_gpu_p95(r) for r in mine]) > MULTI_GPU_P95_LIMIT_S:
            return load
    return None


def _cut(before: float, after: float) -> str:
    return f"{100.0 * (before - after) / before:+.0f}%" if before else "n/a (baseline 0)"


def comparison_lines(results: Sequence[TimelineResult], load: float, baseline: str = "fgd") -> list[str]:
    """Per seed at `load`: what each Tessera row cuts against `baseline` (positive: less waiting)."""
    lines = []
    base = {r.seed: r for r in results if r.load == load and r.policy == baseline}
    for policy in ("tessera", MOVES):
        for r in sorted((r for r in results if r.load == load and r.policy == policy), key=lambda r: r.seed):
            b = base.get(r.seed)
            if b is None:
                continue
            lines.append(
                f"{load:g}x seed {r.seed} {policy} vs {baseline}: multi-GPU p95 "
                f"{_minutes(multi_gpu_p95(b))} -> {_minutes(multi_gpu_p95(r))} min "
                f"({_cut(multi_gpu_p95(b), multi_gpu_p95(r))}), wait GPU-h {b.wait_gpu_hours:.1f} -> "
                f"{r.wait_gpu_hours:.1f} ({_cut(b.wait_gpu_hours, r.wait_gpu_hours)}), alloc "
                f"{r.allocation_pct - b.allocation_pct:+.2f} pt (while waiting "
                f"{r.allocation_waiting_pct - b.allocation_waiting_pct:+.1f} pt), moves {r.moves}, "
                f"lost work {r.lost_work_pct:.3f}% of GPU work"
            )
    return lines


def write_timeline_csv(results: Sequence[TimelineResult], out_dir: Path) -> list[Path]:
    """``timeline-summary.csv`` (one row per replay) and ``timeline-curve.csv`` (allocation and
    queue length over time)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "timeline-summary.csv"
    wait_columns = [f"wait_{size}_p{p}_s" for size in SIZE_CLASSES for p in PERCENTILES]
    recorded_columns = [f"recorded_wait_{size}_p{p}_s" for size in SIZE_CLASSES for p in PERCENTILES]
    with summary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "policy",
                "load",
                "seed",
                "gpus",
                "pods",
                "never_ran",
                "never_fit",
                "span_s",
                "end_s",
                "allocation_pct",
                "allocation_waiting_pct",
                "waiting_s",
                "stranded_gpu_s",
                "wait_gpu_hours",
                "multi_gpu_p95_s",
                *wait_columns,
                *recorded_columns,
                "moves",
                "pods_served_by_moves",
                "lost_gpu_s",
                "work_gpu_s",
                "lost_work_pct",
                "seconds",
            ]
        )
        for r in results:
            writer.writerow(
                [
                    r.policy,
                    r.load,
                    r.seed,
                    r.gpus,
                    r.pods,
                    r.never_ran,
                    r.never_fit,
                    f"{r.span_s:.0f}",
                    f"{r.end_s:.0f}",
                    f"{r.allocation_pct:.4f}",
                    f"{r.allocation_waiting_pct:.4f}",
                    f"{r.waiting_s:.0f}",
                    f"{r.stranded_gpu_s:.0f}",
                    f"{r.wait_gpu_hours:.3f}",
                    f"{multi_gpu_p95(r):.0f}",
                    *(f"{r.wait(size, p):.0f}" for size in SIZE_CLASSES for p in PERCENTILES),
                    *(
                        f"{percentile(r.recorded_waits.get(size, []), p):.0f}"
                        for size in SIZE_CLASSES
                        for p in PERCENTILES
                    ),
                    r.moves,
                    r.pods_served_by_moves,
                    f"{r.lost_gpu_s:.0f}",
                    f"{r.work_gpu_s:.0f}",
                    f"{r.lost_work_pct:.4f}",
                    f"{r.seconds:.2f}",
                ]
            )
    curve = out_dir / "timeline-curve.csv"
    with curve.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["policy", "load", "seed", "time_s", "allocation_pct", "waiting"])
        for r in results:
            for point in r.curve:
                writer.writerow(
                    [
                        r.policy,
                        r.load,
                        r.seed,
                        f"{point.time_s:.0f}",
                        f"{point.allocation_pct:.3f}",
                        point.waiting,
                    ]
                )
    return [summary, curve]


def plot_timeline(results: Sequence[TimelineResult], load: float, out_dir: Path) -> Path:
    """Allocation and queue length over time at one load, the first seed, one line per policy."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (alloc_ax, queue_ax) = _pyplot().subplots(2, 1, figsize=(12, 7), sharex=True)
    mine = [r for r in results if r.load == load]
    first_seed = min((r.seed for r in mine), default=0)
    for r in (r for r in mine if r.seed == first_seed):
        days = [point.time_s / 86400 for point in r.curve]
        alloc_ax.plot(days, [point.allocation_pct for point in r.curve], label=r.policy, linewidth=1)
        queue_ax.plot(days, [point.waiting for point in r.curve], label=r.policy, linewidth=1)
    alloc_ax.set(
        ylabel="GPU allocation, % of capacity", title=f"timeline at {load:g}x load (seed {first_seed})"
    )
    queue_ax.set(xlabel="days since the first arrival", ylabel="pods waiting")
    alloc_ax.legend()
    alloc_ax.grid(alpha=0.3)
    queue_ax.grid(alpha=0.3)
    return _save_figure(fig, out_dir / f"timeline-{load:g}x.png")
