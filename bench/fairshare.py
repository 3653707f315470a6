"""Benchmark 5: fair-share recompute time, against the quadratic water-filling it replaced.

``compute_fair_shares`` for (a) 1000 queues in three levels (10 roots x 9 children x 10
grandchildren, every queue with its own demand, quota, weight and priority) and (b) 4000 sibling
queues with distinct demands, each timed with today's O(n log n) water-filling and with the
earlier quadratic one (``quadratic_water_fill``, kept here as the baseline and as the oracle of
tests/unit/extender/test_fairness_differential.py) in the same run. Pure CPU, no cluster.

Then what a new pending pod costs (`--updates`): one leaf queue's demand grows by one GPU, and the
kept shares re-divide what that reaches (``FairShares.update``), against dividing the whole tree
again (``compute_fair_shares``) in the same run - each update checked equal to it. Where a pool
is contended (demand above capacity) a change reaches every queue below it; where it is not (a
cluster whose queues are not all asking for more), only the queue's path.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from unittest import mock

from extender.policy import fairness
from extender.policy.fairness import (
    EPSILON,
    FairShareInputs,
    FairShares,
    QueueSpec,
    QueueUsage,
    _Claimant,
    compute_fair_shares,
)
from tessera.simulate.report import format_table

from . import SMOKE_HELP

WaterFill = Callable[[float, Sequence[tuple[_Claimant, float]], dict[str, float]], float]


def quadratic_water_fill(
    amount: float, members: Sequence[tuple[_Claimant, float]], shares: dict[str, float]
) -> float:
    """The water-filling Tessera used before: one round per member that becomes satisfied, each
    round over every member still active, so O(n^2) for n siblings. Same contract as
    ``fairness._water_fill``."""
    active = [(c, w) for c, w in members if shares[c.key] < c.demand]
    while active and amount > EPSILON:
        total_weight = sum(w for _, w in active)
        level = amount / total_weight
        saturating = min((c.demand - shares[c.key]) / w for c, w in active)
        if level <= saturating:
            for claimant, weight in active:
                shares[claimant.key] += level * weight
            return 0.0
        for claimant, weight in active:
            gap = claimant.demand - shares[claimant.key]
            if gap / weight <= saturating:
                shares[claimant.key] = claimant.demand
                amount -= gap
            else:
                shares[claimant.key] += saturating * weight
                amount -= saturating * weight
        active = [(c, w) for c, w in active if shares[c.key] < c.demand]
    return amount


def water_filling(fill: WaterFill) -> AbstractContextManager[object]:
    """Run ``compute_fair_shares`` with another water-filling (the baseline, or the oracle)."""
    return mock.patch.object(fairness, "_water_fill", fill)


Picture = tuple[list[QueueSpec], dict[str, QueueUsage], dict[str, float]]


def three_levels(rng: random.Random, roots: int = 10, children: int = 9, grandchildren: int = 10) -> Picture:
    specs: list[QueueSpec] = []
    usage: dict[str, QueueUsage] = {}

    def add(name: str, parent: str | None) -> None:
        specs.append(
            QueueSpec(
                name=name,
                parent=parent,
                priority=rng.choice((0, 0, 1)),
                quota={"gpu": float(rng.randint(0, 4))},
                over_quota_weight={"gpu": rng.choice((0.5, 1.0, 2.0))},
            )
        )
        usage[name] = QueueUsage(
            allocated={"gpu": float(rng.randint(0, 3))}, requested={"gpu": float(rng.randint(0, 40))}
        )

    for r in range(roots):
        add(f"r{r}", None)
        for c in range(children):
            add(f"r{r}-c{c}", f"r{r}")
            for g in range(grandchildren):
                add(f"r{r}-c{c}-g{g}", f"r{r}-c{c}")
    return specs, usage, {"gpu": 8.0 * len(specs)}


def siblings(rng: random.Random, count: int = 4000) -> Picture:
    specs = [
        QueueSpec(name=f"q{i}", quota={"gpu": 1.0}, over_quota_weight={"gpu": rng.uniform(0.5, 2.0)})
        for i in range(count)
    ]
    usage = {
        spec.name: QueueUsage(allocated={}, requested={"gpu": float(rng.randint(1, 4 * count))})
        for spec in specs
    }
    # Demand far above capacity, spread so that members saturate one by one.
    return specs, usage, {"gpu": float(count * count)}


@dataclass(frozen=True)
class FairShareRow:
    """One case: the time of the code measured and of its baseline in the same run."""

    case: str
    queues: int
    fast_ms: float
    baseline_ms: float

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.fast_ms


def _median_ms(picture: Picture, repeats: int) -> tuple[float, dict[str, dict[str, float]]]:
    times = []
    result: dict[str, dict[str, float]] = {}
    for _ in range(repeats):
        started = time.perf_counter()
        result = compute_fair_shares(FairShareInputs(*picture))
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


# The tree's fan-out per level (10 x 9 x 10 = 900 leaves) and the siblings' count; the smoke's.
TREE, SIBLINGS = (10, 9, 10), 4000
SMOKE_TREE, SMOKE_SIBLINGS = (2, 2, 3), 50


def run_fairshare(
    repeats: int = 3, seed: int = 7, tree: tuple[int, int, int] = TREE, sibling_count: int = SIBLINGS
) -> list[FairShareRow]:
    rng = random.Random(seed)
    rows = []
    for case, picture in (("3 levels", three_levels(rng, *tree)), ("siblings", siblings(rng, sibling_count))):
        fast, fast_result = _median_ms(picture, repeats)
        with water_filling(quadratic_water_fill):
            slow, slow_result = _median_ms(picture, repeats)
        worst = max(
            abs(fast_result[q]["gpu"] - slow_result[q]["gpu"]) / max(1.0, slow_result[q]["gpu"])
            for q in slow_result
        )
        if worst > 1e-9:
            raise AssertionError(f"{case}: shares differ from the quadratic baseline by {worst:g}")
        rows.append(FairShareRow(case, len(picture[0]), fast, slow))
    return rows


def run_updates(
    updates: int = 20, seed: int = 7, shape: tuple[int, int, int] = TREE, sibling_count: int = SIBLINGS
) -> list[FairShareRow]:
    """Median time of `updates` new pending pods (a random leaf's demand +1 GPU) per case."""
    rng = random.Random(seed)
    tree = three_levels(rng, *shape)
    roomy = (
        tree[0],
        tree[1],
        {"gpu": 2 * sum(u.allocated["gpu"] + u.requested["gpu"] for u in tree[1].values())},
    )
    rows = []
    for case, (specs, usage, capacity) in (
        ("3 levels, contended", tree),
        ("3 levels, with room", roomy),
        ("siblings, contended", siblings(rng, sibling_count)),
    ):
        parents = {spec.parent for spec in specs}
        leaves = [spec.name for spec in specs if spec.name not in parents]
        kept = FairShares(FairShareInputs(specs, usage, capacity))
        update_ms, full_ms = [], []
        for _ in range(updates):
            leaf = rng.choice(leaves)
            old = usage[leaf]
            usage = {**usage, leaf: QueueUsage(old.allocated, {"gpu": old.requested.get("gpu", 0.0) + 1.0})}
            started = time.perf_counter()
            kept.update(usage, [leaf])
            update_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            full = compute_fair_shares(FairShareInputs(specs, usage, capacity))
            full_ms.append((time.perf_counter() - started) * 1000)
            if kept.shares != full:
                raise AssertionError(f"{case}: kept shares differ from a division of the whole tree")
        rows.append(FairShareRow(case, len(specs), statistics.median(update_ms), statistics.median(full_ms)))
    return rows


def fairshare_table(
    rows: Sequence[FairShareRow],
    headers: Sequence[str] = ("O(n log n) ms", "quadratic ms", "quadratic / new"),
) -> str:
    return format_table(
        ["case", "queues", *headers],
        [
            [r.case, str(r.queues), f"{r.fast_ms:.2f}", f"{r.baseline_ms:.2f}", f"{r.speedup:.1f}x"]
            for r in rows
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairshare", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    parser.add_argument("--updates", type=int, default=20, help="new pending pods timed per case")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(list(argv) if argv is not None else None)
    tree, sibling_count = (SMOKE_TREE, SMOKE_SIBLINGS) if args.smoke else (TREE, SIBLINGS)
    repeats, updates = (1, 3) if args.smoke else (args.repeats, args.updates)
    print("\n[6] fair-share recompute (compute_fair_shares, one resource), median of", repeats)
    print(fairshare_table(run_fairshare(repeats, tree=tree, sibling_count=sibling_count)))
    print(f"\n[6] a new pending pod: kept shares updated vs the whole tree divided, median of {updates}")
    rows = run_updates(updates, shape=tree, sibling_count=sibling_count)
    print(fairshare_table(rows, ("update ms", "whole tree ms", "whole / update")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
