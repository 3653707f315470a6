"""Timeline replay output: the tables, the CSV files and the plot of ``tessera simulate timeline``.

Figures over seeds are the mean of the per-seed figures (a percentile is taken per seed, then
averaged). Waits are in minutes in the tables, seconds in the CSV. The queue replays
(``--queues``) are reported per seed and per queue, with the worst queue of each figure: a mean
over queues or seeds would hide the one that starves.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

from .queues import QueueSummary
from .report import _pyplot, _save_figure, format_table
from .timeline import MOVES, SIZE_CLASSES, TimelineResult, percentile
from .timeline_queues import TimelineQueuesResult

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
                *(f"wait_gpu_hours_{size}" for size in SIZE_CLASSES),
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
                    *(f"{r.wait_gpu_hours_by_size.get(size, 0.0):.3f}" for size in SIZE_CLASSES),
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


def fair_share_gpu_hours(queue: QueueSummary, result: TimelineQueuesResult) -> float:
    """The queue's fair share integrated over the run, in GPU-hours."""
    return queue.mean_fair_share_gpu * result.run.makespan_s / 3600


def used_pct_of_share(queue: QueueSummary, result: TimelineQueuesResult) -> float:
    """GPU-hours used, % of the fair share's (NaN: it deserved nothing)."""
    share = fair_share_gpu_hours(queue, result)
    return 100.0 * queue.gpu_hours / share if share else math.nan


def _queue_figures(queue: QueueSummary, result: TimelineQueuesResult) -> dict[str, float]:
    """The per-queue figures the worst-queue table ranks; each one's worst is its highest but the
    first's, the lowest."""
    return {
        "used % of share": used_pct_of_share(queue, result),
        "h below share": queue.below_fair_share_s / 3600,
        "p95 wait min": queue.p95_wait_s / 60,
        "max wait min": queue.max_wait_s / 60,
        "wait GPU-h": queue.wait_gpu_hours,
        "evictions": float(queue.evicted),
        "lost GPU-s": queue.lost_gpu_s,
    }


_FIGURE_FORMATS = {
    "used % of share": "{:.1f}",
    "h below share": "{:.1f}",
    "p95 wait min": "{:.1f}",
    "max wait min": "{:.0f}",
    "wait GPU-h": "{:.0f}",
    "evictions": "{:.0f}",
    "lost GPU-s": "{:.0f}",
}


def _ordered(results: Sequence[TimelineQueuesResult]) -> list[TimelineQueuesResult]:
    return sorted(results, key=lambda r: (r.load, r.queues, r.policy, r.seed))


def timeline_queues_table(results: Sequence[TimelineQueuesResult]) -> str:
    """One row per queue of each queue replay."""
    headers = ["load", "policy", "seed", "queue", "pods", "GPU-h used", "GPU-h fair share", *_FIGURE_FORMATS]
    rows = []
    for r in _ordered(results):
        for queue in r.run.queues:
            figures = _queue_figures(queue, r)
            rows.append(
                [
                    f"{r.load:g}x",
                    r.policy,
                    str(r.seed),
                    queue.name,
                    str(queue.pods),
                    f"{queue.gpu_hours:.0f}",
                    f"{fair_share_gpu_hours(queue, r):.0f}",
                    *("" if math.isnan(v) else _FIGURE_FORMATS[k].format(v) for k, v in figures.items()),
                ]
            )
    return format_table(headers, rows)


def worst_queue(result: TimelineQueuesResult, figure: str) -> tuple[str, float]:
    """The queue worst off by `figure` (``used % of share``: the lowest; the others: the highest;
    the first queue among equals) and its value; ("", NaN) when no queue has the figure."""
    lowest = figure == "used % of share"
    values = [
        (queue.name, value)
        for queue in result.run.queues
        for value in (_queue_figures(queue, result)[figure],)
        if not math.isnan(value)
    ]
    if not values:
        return "", math.nan
    return (min if lowest else max)(values, key=lambda pair: pair[1])


def worst_queues_table(results: Sequence[TimelineQueuesResult]) -> str:
    """One row per queue replay: each figure's worst queue, and the replay's GPU-hours of waiting,
    evictions and the work they lost, moves and the work they lost (% of the GPU-seconds held),
    all queues together."""
    headers = [
        "load",
        "policy",
        "seed",
        "queues",
        *(f"worst {figure}" for figure in _FIGURE_FORMATS),
        "wait GPU-h",
        "evictions",
        "lost % of GPU work",
        "moves",
        "moves lost % of GPU work",
        "secs",
    ]
    rows = []
    for r in _ordered(results):
        worst = []
        for figure, form in _FIGURE_FORMATS.items():
            name, value = worst_queue(r, figure)
            worst.append(f"{form.format(value)} ({name})" if name else "")
        rows.append(
            [
                f"{r.load:g}x",
                r.policy,
                str(r.seed),
                str(r.queues),
                *worst,
                f"{sum(q.wait_gpu_hours for q in r.run.queues):.0f}",
                str(len(r.run.evictions)),
                f"{r.run.lost_pct:.3f}",
                str(r.moves),
                f"{r.move_lost_pct:.3f}",
                f"{r.seconds:.1f}",
            ]
        )
    return format_table(headers, rows)


def write_timeline_queues_csv(results: Sequence[TimelineQueuesResult], out_dir: Path) -> Path:
    """``timeline-queues.csv``: one row per queue of each queue replay, waits in seconds."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "timeline-queues.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "policy",
                "load",
                "seed",
                "queues",
                "queue",
                "pods",
                "started",
                "gpu_hours",
                "fair_share_gpu_hours",
                "below_fair_share_s",
                "mean_wait_s",
                "p95_wait_s",
                "max_wait_s",
                "wait_gpu_hours",
                "evicted",
                "evicted_for",
                "lost_gpu_s",
                "makespan_s",
            ]
        )
        for r in _ordered(results):
            for q in r.run.queues:
                writer.writerow(
                    [
                        r.policy,
                        r.load,
                        r.seed,
                        r.queues,
                        q.name,
                        q.pods,
                        q.started,
                        f"{q.gpu_hours:.3f}",
                        f"{fair_share_gpu_hours(q, r):.3f}",
                        f"{q.below_fair_share_s:.0f}",
                        f"{q.mean_wait_s:.0f}",
                        f"{q.p95_wait_s:.0f}",
                        f"{q.max_wait_s:.0f}",
                        f"{q.wait_gpu_hours:.3f}",
                        q.evicted,
                        q.evicted_for,
                        f"{q.lost_gpu_s:.0f}",
                        f"{r.run.makespan_s:.0f}",
                    ]
                )
    return path
