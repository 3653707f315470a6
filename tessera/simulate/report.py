"""Simulator output: terminal tables, CSV files and PNG plots."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .packing import PackingResult
from .queues import QueueRunResult
from .spells import LONG_SPELL_S, SPELL_CAUSES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# Published GPU allocation % at 130% arrival (Weng et al., ATC'23): the mean over the paper's ten
# seeds in its artifact's expected_results/analysis_allo_discrete.csv, per trace and baseline.
PUBLISHED_ALLOCATION = {
    "default": {"random": 87.47, "bestfit": 93.08, "fgd": 95.39},
    "gpushare40": {"random": 86.00, "bestfit": 91.69, "fgd": 94.15},
    "multigpu20": {"random": 88.69, "bestfit": 93.93, "fgd": 95.65},
}


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line.format(*headers), rule, *(line.format(*row) for row in rows)])


def packing_table(results: Sequence[PackingResult], paper: dict[str, float] | None = None) -> str:
    headers = [
        "policy",
        "arrival %",
        "GPU alloc %",
        "final alloc %",
        "unalloc %",
        "frag %",
        "placed/arrived",
        "skipped",
        "secs",
    ]
    moving = any(r.move_budget is not None for r in results)
    if moving:
        headers += ["moves", "moves % placed"]
    if paper:
        headers.append("published %")
    rows = []
    for r in results:
        row = [
            r.label,
            f"{r.arrival_pct:.2f}",
            f"{r.allocation_pct:.2f}",
            f"{r.final_allocation_pct:.2f}",
            f"{r.unallocated_pct:.2f}",
            f"{r.fragmentation_pct:.2f}",
            f"{r.pods_placed}/{r.pods_arrived}",
            str(r.pods_skipped),
            f"{r.seconds:.1f}",
        ]
        if moving:
            row += [str(r.moves), f"{r.moves_pct:.2f}"]
        if paper:
            row.append(f"{paper[r.label]:.2f}" if r.label in paper else "")
        rows.append(row)
    return format_table(headers, rows)


def packing_seeds_table(results: Sequence[PackingResult], paper: dict[str, float] | None = None) -> str:
    """One row per policy over several seeds: mean, min and max allocation."""
    headers = ["policy", "seeds", "mean alloc %", "min alloc %", "max alloc %", "mean frag %", "mean secs"]
    moving = any(r.move_budget is not None for r in results)
    if moving:
        headers.append("mean moves % placed")
    if paper:
        headers.append("published %")
    rows = []
    for policy in dict.fromkeys(r.label for r in results):
        mine = [r for r in results if r.label == policy]
        allocs = [r.allocation_pct for r in mine]
        row = [
            policy,
            ",".join(str(r.seed) for r in mine),
            f"{sum(allocs) / len(allocs):.2f}",
            f"{min(allocs):.2f}",
            f"{max(allocs):.2f}",
            f"{sum(r.fragmentation_pct for r in mine) / len(mine):.2f}",
            f"{sum(r.seconds for r in mine) / len(mine):.1f}",
        ]
        if moving:
            row.append(f"{sum(r.moves_pct for r in mine) / len(mine):.2f}")
        if paper:
            row.append(f"{paper[policy]:.2f}" if policy in paper else "")
        rows.append(row)
    return format_table(headers, rows)


def margin_lines(results: Sequence[PackingResult], policy: str, baseline: str) -> list[str]:
    """Per seed, ``policy``'s allocation minus ``baseline``'s (empty unless both ran); policies by
    label (``tessera+moves5``)."""
    ours = {r.seed: r.allocation_pct for r in results if r.label == policy}
    theirs = {r.seed: r.allocation_pct for r in results if r.label == baseline}
    seeds = [seed for seed in ours if seed in theirs]
    if not seeds:
        return []
    margins = [ours[seed] - theirs[seed] for seed in seeds]
    per_seed = ", ".join(f"seed {seed} {margin:+.2f}" for seed, margin in zip(seeds, margins, strict=True))
    return [f"{policy} - {baseline} (points): {per_seed}; smallest {min(margins):+.2f}"]


def write_packing_csv(results: Sequence[PackingResult], trace: str, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / f"{trace}-summary.csv"
    with summary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "trace",
                "replay",
                "policy",
                "seed",
                "arrival_pct",
                "allocation_pct",
                "final_allocation_pct",
                "unallocated_pct",
                "fragmentation_pct",
                "pods_arrived",
                "pods_placed",
                "pods_skipped",
                "seconds",
                "moves_per_100_pods",
                "moves",
                "moved_gpu_milli",
                "pods_served_by_moves",
            ]
        )
        for r in results:
            writer.writerow(
                [
                    trace,
                    r.replay,
                    r.label,
                    r.seed,
                    f"{r.arrival_pct:.4f}",
                    f"{r.allocation_pct:.4f}",
                    f"{r.final_allocation_pct:.4f}",
                    f"{r.unallocated_pct:.4f}",
                    f"{r.fragmentation_pct:.4f}",
                    r.pods_arrived,
                    r.pods_placed,
                    r.pods_skipped,
                    f"{r.seconds:.2f}",
                    "" if r.move_budget is None else f"{r.move_budget:g}",
                    r.moves,
                    r.moved_gpu_milli,
                    r.pods_served_by_moves,
                ]
            )
    curve = out_dir / f"{trace}-curve.csv"
    with curve.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["trace", "replay", "policy", "seed", "arrival_pct", "allocation_pct", "fragmentation_pct"]
        )
        for r in results:
            for point in r.curve:
                writer.writerow(
                    [
                        trace,
                        r.replay,
                        r.label,
                        r.seed,
                        f"{point.arrival_pct:.4f}",
                        f"{point.allocation_pct:.4f}",
                        f"{point.fragmentation_pct:.4f}",
                    ]
                )
    return [summary, curve]


def _save_figure(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pyplot() -> ModuleType:
    """pyplot on the file-only backend (imported late: the tables do not need matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_packing(results: Sequence[PackingResult], trace: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (alloc_ax, frag_ax) = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    first_seed = results[0].seed if results else 0
    for r in (r for r in results if r.seed == first_seed):
        arrival = [p.arrival_pct for p in r.curve]
        alloc_ax.plot(arrival, [p.allocation_pct for p in r.curve], label=r.label)
        frag_ax.plot(arrival, [p.fragmentation_pct for p in r.curve], label=r.label)
    alloc_ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=1)
    alloc_ax.set(
        xlabel="arrived GPU milli, % of capacity",
        ylabel="allocated GPU milli, % of capacity",
        title=f"{trace}: allocation vs arrival (seed {first_seed})",
    )
    frag_ax.set(
        xlabel="arrived GPU milli, % of capacity",
        ylabel="fragmentation, % of capacity",
        title=f"{trace}: fragmentation vs arrival",
    )
    alloc_ax.legend()
    alloc_ax.grid(alpha=0.3)
    frag_ax.grid(alpha=0.3)
    return _save_figure(fig, out_dir / f"{trace}-packing.png")


def bound_table(results: Sequence[PackingResult]) -> str:
    """Per replay: where the idle GPU milli of its end state is, and the upper bounds on the GPU
    allocation moves could reach (``bound``), all in % of the cluster's GPU milli."""
    headers = [
        "run",
        "seed",
        "final alloc %",
        "idle %",
        "whole idle GPUs % (host-short)",
        "slivers % (below smallest skipped)",
        "gap bound % (theta: gaps - small)",
        "early-pod gap bound % (first unfit at arrival %)",
        "host bound %",
        "bound %",
    ]
    rows = []
    for r in results:
        b = r.bound
        if b is None:
            continue
        idle, gaps, early = b.idle, b.gaps, b.early_gaps
        rows.append(
            [
                r.label,
                str(r.seed),
                f"{b.pct(b.allocated_milli):.2f}",
                f"{b.pct(idle.idle_milli):.2f}",
                f"{b.pct(idle.whole_milli):.2f} ({b.pct(idle.whole_host_short_milli):.2f})",
                f"{b.pct(idle.sliver_milli):.2f} ({b.pct(idle.sliver_below_smallest_milli):.2f})",
                f"{b.pct(gaps.milli):.2f} ({gaps.theta}: {b.pct(gaps.gaps_milli):.2f} - "
                f"{b.pct(gaps.small_milli):.2f})",
                f"{b.pct(early.milli):.2f} ({b.pct(b.early_milli):.2f})",
                f"{b.pct(b.host_milli):.2f}",
                f"{b.pct(b.milli):.2f}",
            ]
        )
    return format_table(headers, rows)


def move_budget_table(results: Sequence[PackingResult], baseline: str = "fgd") -> str:
    """The curve of allocation against the move budget: one row per budget, over the seeds, with
    the moves made and the margin over ``baseline`` (no moves) per seed."""
    theirs = {r.seed: r.allocation_pct for r in results if r.label == baseline}
    headers = [
        "moves per 100 pods",
        "seeds",
        "mean alloc %",
        "min alloc %",
        "max alloc %",
        "mean frag %",
        "moves % placed (max)",
        "pods served by moves",
        "same moves from budget (max)",
        f"min - {baseline} (points)",
    ]
    rows = []
    for budget in sorted({r.move_budget for r in results if r.move_budget is not None}):
        mine = [r for r in results if r.move_budget == budget]
        allocs = [r.allocation_pct for r in mine]
        margins = [r.allocation_pct - theirs[r.seed] for r in mine if r.seed in theirs]
        rows.append(
            [
                f"{budget:g}",
                ",".join(str(r.seed) for r in mine),
                f"{sum(allocs) / len(allocs):.2f}",
                f"{min(allocs):.2f}",
                f"{max(allocs):.2f}",
                f"{sum(r.fragmentation_pct for r in mine) / len(mine):.2f}",
                f"{max(r.moves_pct for r in mine):.2f}",
                f"{sum(r.pods_served_by_moves for r in mine) / len(mine):.0f}",
                f"{max(r.same_from_budget for r in mine):.2f}",
                f"{min(margins):+.2f}" if margins else "",
            ]
        )
    return format_table(headers, rows)


def plot_move_budget(
    results: Mapping[str, Sequence[PackingResult]], out_dir: Path, baseline: str = "fgd"
) -> Path:
    """Allocation at the target arrival against the move budget, per trace (mean and the seeds'
    range), each with ``baseline``'s mean (no moves) as a dashed line."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, (alloc_ax, moves_ax) = _pyplot().subplots(1, 2, figsize=(12, 4.5))
    for trace, mine in results.items():
        budgets = sorted({r.move_budget for r in mine if r.move_budget is not None})
        if not budgets:
            continue
        per_budget = [[r for r in mine if r.move_budget == b] for b in budgets]
        means = [sum(r.allocation_pct for r in rs) / len(rs) for rs in per_budget]
        low = [m - min(r.allocation_pct for r in rs) for m, rs in zip(means, per_budget, strict=True)]
        high = [max(r.allocation_pct for r in rs) - m for m, rs in zip(means, per_budget, strict=True)]
        line = alloc_ax.errorbar(budgets, means, yerr=[low, high], marker="o", capsize=3, label=trace)
        base = [r.allocation_pct for r in mine if r.label == baseline]
        if base:
            alloc_ax.axhline(
                sum(base) / len(base),
                linestyle="--",
                color=line[0].get_color(),
                label=f"{trace}: {baseline}, no moves",
            )
        moves = [sum(r.moves_pct for r in rs) / len(rs) for rs in per_budget]
        moves_ax.plot(budgets, moves, marker="o", color=line[0].get_color(), label=trace)
    alloc_ax.set(
        xlabel="move budget, moves per 100 placed pods",
        ylabel="GPU allocation at 130% arrival, %",
        title="tessera with consolidation: allocation vs move budget",
    )
    moves_ax.set(
        xlabel="move budget, moves per 100 placed pods",
        ylabel="moves made, % of placed pods",
        title="moves made",
    )
    for ax in (alloc_ax, moves_ax):
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    return _save_figure(fig, out_dir / "move-budget.png")


def gang_table(result: QueueRunResult) -> str:
    """Per gang: its ask, how long it waited to start, the domains of each level it spans; then
    the mean domains spanned per level and the p95 wait over the gangs."""
    levels = list(result.gangs[0].spanned) if result.gangs else []
    headers = ["gang", "minimum", "ask", "wait s", *(f"{level}s spanned" for level in levels)]
    rows = [
        [g.name, str(g.size), g.ask, f"{g.wait_s:.0f}", *(str(g.spanned[level]) for level in levels)]
        for g in result.gangs
    ]
    waits = sorted(g.wait_s for g in result.gangs)
    p95 = waits[min(len(waits) - 1, round(0.95 * (len(waits) - 1)))] if waits else 0.0
    means = [sum(g.spanned[level] for g in result.gangs) / len(result.gangs) for level in levels]
    rows.append(["mean / p95", "", "", f"{p95:.0f}", *(f"{mean:.2f}" for mean in means)])
    return format_table(headers, rows)


def queue_table(result: QueueRunResult) -> str:
    headers = [
        "queue",
        "pods",
        "done",
        "wait p50 s",
        "wait p95 s",
        "mean alloc GPU",
        "mean fair GPU",
        "GPU util %",
        "below fair s",
        "longest below s",
        "deficit GPU-s",
        "evicted",
        "evicted for",
        "lost GPU-s",
    ]
    rows = [
        [
            q.name,
            str(q.pods),
            str(q.finished),
            f"{q.p50_wait_s:.1f}",
            f"{q.p95_wait_s:.1f}",
            f"{q.mean_allocated_gpu:.2f}",
            f"{q.mean_fair_share_gpu:.2f}",
            f"{q.utilisation_pct:.1f}",
            f"{q.below_fair_share_s:.0f}",
            f"{q.longest_below_fair_share_s:.0f}",
            f"{q.deficit_gpu_s:.0f}",
            str(q.evicted),
            str(q.evicted_for),
            f"{q.lost_gpu_s:.0f}",
        ]
        for q in result.queues
    ]
    reclaim = (
        f"reclaim every {result.reclaim_interval_s:g} s, termination {result.termination_delay_s:g} s: "
        f"{len(result.evictions)} evictions in {result.plans} plans, GPUs evicted / needed "
        f"{result.gpus_evicted:g} / {result.gpus_needed:g} (worst plan {result.max_plan_ratio:.2f}), "
        f"ping-pong {result.ping_pong}, victims started while the served pod waited "
        f"{result.late_evictions}, most evictions of one pod {result.most_evictions_of_one_pod}, "
        f"work lost {result.lost_gpu_s:.0f} GPU-s ({result.lost_pct:.2f}% of the GPU time used), "
        f"{result.lost_past_quota_gpu_s:.0f} of them for pods past their queues' quotas"
        if result.reclaim_interval_s
        else "reclaim off"
    )
    return "\n".join(
        [
            format_table(headers, rows),
            f"GPU utilisation (time-weighted): {result.utilisation_pct:.1f}%",
            f"GPU-s idle while a pod that fits waited: {result.idle_gpu_s_while_fitting_pod_waits:.1f}",
            "GPU-s idle while a pod waited that would fit if CPU and memory were shared fairly: "
            f"{result.idle_gpu_s_while_host_starved_pod_waits:.1f}",
            reclaim,
            long_spells_line(result),
        ]
    )


def long_spells_line(result: QueueRunResult) -> str:
    """The leaf queues' spells below their shares over 60 s, by what kept reclaim from serving
    them (`tessera.simulate.spells`): how many, and the longest, of each cause."""
    spells = result.long_spells
    if not spells:
        return f"spells below share over {LONG_SPELL_S:g} s: none"
    causes = [
        f"{cause} {len(mine)} (longest {longest.length_s:.0f} s, {longest.queue} from {longest.start:.0f} s)"
        for cause in SPELL_CAUSES
        for mine in ([s for s in spells if s.cause == cause],)
        if mine
        for longest in (max(mine, key=lambda s: s.length_s),)
    ]
    return f"spells below share over {LONG_SPELL_S:g} s: {len(spells)}; " + ", ".join(causes)


def gpu_hours_table(result: QueueRunResult, weights: Mapping[str, float]) -> str:
    """Each queue's GPU-hours over the run, its part of all of them, against its part of the
    weights (of the queues in `weights`: siblings)."""
    total_hours = sum(q.gpu_hours for q in result.queues if q.name in weights)
    total_weight = sum(weights.values())
    rows = [
        [
            q.name,
            f"{q.gpu_hours:.1f}",
            f"{100 * q.gpu_hours / total_hours:.1f}" if total_hours else "-",
            f"{100 * weights[q.name] / total_weight:.1f}" if total_weight else "-",
            f"{q.mean_wait_s / 3600:.2f}",
        ]
        for q in result.queues
        if q.name in weights
    ]
    history = "on" if result.history else "off"
    return f"fair share over time {history}:\n" + format_table(
        ["queue", "GPU-hours", "% of GPU-hours", "% of weight", "mean wait h"], rows
    )


def write_queue_csv(result: QueueRunResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / f"{result.name}-queues.csv"
    columns = [
        "pods",
        "started",
        "finished",
        "mean_wait_s",
        "p50_wait_s",
        "p95_wait_s",
        "mean_allocated_gpu",
        "mean_fair_share_gpu",
        "max_allocated_gpu",
        "utilisation_pct",
        "below_fair_share_s",
        "longest_below_fair_share_s",
        "deficit_gpu_s",
        "evicted",
        "evicted_for",
        "lost_gpu_s",
    ]
    with summary.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["queue", *columns])
        for q in result.queues:
            values = [getattr(q, column) for column in columns]
            writer.writerow([q.name, *(f"{v:.4f}" if isinstance(v, float) else v for v in values)])
    timeline = out_dir / f"{result.name}-timeline.csv"
    with timeline.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["time_s", "queue", "allocated_gpu", "fair_share_gpu", "pending_jobs", "running_jobs"]
        )
        for sample in result.timeline:
            writer.writerow(
                [
                    f"{sample.time:.3f}",
                    sample.queue,
                    f"{sample.allocated_gpu:.4f}",
                    f"{sample.fair_share_gpu:.4f}",
                    sample.pending,
                    sample.running,
                ]
            )
    evictions = out_dir / f"{result.name}-evictions.csv"
    with evictions.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "time_s",
                "goal",
                "victim",
                "victim_queue",
                "served",
                "served_queue",
                "node",
                "gpus",
                "ran_s",
                "started_while_served_waited",
            ]
        )
        for e in result.evictions:
            writer.writerow(
                [
                    f"{e.time:.3f}",
                    e.goal,
                    e.victim,
                    e.victim_queue,
                    e.served,
                    e.served_queue,
                    e.node,
                    f"{e.gpus:g}",
                    f"{e.ran_s:.3f}",
                    int(e.started_while_served_waited),
                ]
            )
    return [summary, timeline, evictions]


def plot_queues(result: QueueRunResult, out_dir: Path) -> Path:
    fig, ax = _pyplot().subplots(figsize=(10, 4.5))
    for q in result.queues:
        samples = [s for s in result.timeline if s.queue == q.name]
        times = [s.time for s in samples]
        line = ax.step(times, [s.allocated_gpu for s in samples], where="post", label=f"{q.name} allocated")
        ax.step(
            times,
            [s.fair_share_gpu for s in samples],
            where="post",
            linestyle="--",
            color=line[0].get_color(),
            label=f"{q.name} fair share",
        )
    ax.set(xlabel="time, s", ylabel="GPUs", title=f"{result.name}: queue allocation vs fair share")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    return _save_figure(fig, out_dir / f"{result.name}-queues.png")
