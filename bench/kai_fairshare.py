"""Fair share over time beside KAI Scheduler's own simulator: the same queues and usage, the shares.

KAI ships ``cmd/time-based-fairshare-simulator`` (built from the pinned source, hack/kai/pin.env):
it runs KAI's scheduler on an envtest control plane, one cycle every 10 ms, and writes each
queue's GPU allocation and fair share per cycle (CSV: Time, QueueID, Allocation, FairShare). Its
usage database is a fake one fed with the allocations of the cycles so far (one cycle counts as
one second; window and half-life in cycles).

This script runs it on a configuration (KAI's own two-queue oscillation by default), then feeds
Tessera's rule (``extender.policy.history``) exactly that allocation history, cycle by cycle -
the same queues, weights, window, half-life and kValue - and divides Tessera's fair shares
(``compute_fair_shares`` under the rule's ``WeightAdjustment``; no smoothing, as KAI has none) for
the demand the configuration's jobs make. Printed: how often the two shares agree within 0.01 GPU
and the largest difference, for Tessera's shares from the history before the cycle and shifted by
up to ``MAX_LAG`` cycles (KAI's scheduler reads its usage asynchronously, a cycle or two behind).

Three variants of Tessera's side take the differences apart (docs/queues.md, "Against KAI"):

* ``tessera``: the rule as shipped - usage from ``QueueHistory`` (12 buckets per window, the
  window's edge moving a bucket at a time), shares as divided (fractions of a GPU);
* ``whole GPUs``: the same shares rounded as KAI hands out an over-quota split among queues that
  want more: each queue's part rounded down to whole GPUs, what that leaves given out one GPU at
  a time to the queues with the largest remainders (the earlier queue on a tie);
* ``whole GPUs, per-cycle window``: rounded alike, with the usage KAI's fake usage database
  computes - the last ``window`` cycles exactly (the edge moving one cycle at a time), each
  cycle's allocation weighed ``0.5^(age / half-life)``, over the capacity weighed alike;
* ``whole GPUs, KAI's usage``: that, and children compared as fractions of the cluster at every
  level, as KAI does (Tessera: of the parent's usage).

    python -m bench.kai_fairshare [--kai-src DIR] [--config FILE] [--csv FILE]

``--kai-src``: a checkout of KAI at the pin with ``bin/time-based-fairshare-simulator`` built in
it (``go build -o bin/time-based-fairshare-simulator ./cmd/time-based-fairshare-simulator``);
``--csv``: an output of that simulator already written (then nothing is run).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extender.policy.fairness import (
    FairShareInputs,
    QueueSpec,
    QueueTree,
    QueueUsage,
    WeightAdjustment,
    compute_fair_shares,
)
from extender.policy.history import HistoryParams, QueueHistory, target_factors
from tessera.simulate.report import format_table

GPU = "gpu"
AGREE_GPUS = 0.01
MAX_LAG = 3
# KAI's own example: a department with two queues, each submitting 16-GPU single-pod jobs.
OSCILLATING = "cmd/time-based-fairshare-simulator/examples/simulation_config_oscillating.yaml"


@dataclass(frozen=True)
class Setup:
    """A KAI simulator configuration, read as Tessera's rule sees it."""

    specs: tuple[QueueSpec, ...]
    capacity: float
    demand: Mapping[str, float]  # leaf queue -> GPUs its jobs ask for in all
    params: HistoryParams


def read_setup(config: Mapping[str, Any]) -> Setup:
    """KAI's defaults where the file says nothing (its README): weight 1, deserved 0, priority
    100, window 5 cycles, no half-life, kValue 1."""
    specs = tuple(
        QueueSpec(
            name=str(q["Name"]),
            parent=str(q["Parent"]) if q.get("Parent") else None,
            priority=int(q.get("Priority") if q.get("Priority") is not None else 100),
            quota={GPU: float(q.get("DeservedGPUs") or 0.0)},
            over_quota_weight={GPU: float(q.get("Weight") if q.get("Weight") is not None else 1.0)},
        )
        for q in config["Queues"]
    )
    capacity = sum(float(n["GPUs"]) * int(n.get("Count") or 1) for n in config["Nodes"])
    demand = {
        str(queue): float(job["GPUs"]) * int(job.get("NumPods") or 1) * int(job.get("NumJobs") or 1)
        for queue, job in (config.get("Jobs") or {}).items()
    }
    half_life = float(config.get("HalfLifePeriod") or 0)
    k_value = config.get("KValue")
    params = HistoryParams(
        enabled=True,
        half_life_s=half_life or None,
        window_s=float(config.get("WindowSize") or 5),
        k=1.0 if k_value is None else float(k_value),
    )
    return Setup(specs, capacity, demand, params)


def read_kai_csv(path: Path) -> dict[int, dict[str, tuple[float, float]]]:
    """cycle -> queue -> (allocation, fair share) from the simulator's output."""
    rows: dict[int, dict[str, tuple[float, float]]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            rows.setdefault(int(row["Time"]), {})[row["QueueID"]] = (
                float(row["Allocation"]),
                float(row["FairShare"]),
            )
    return rows


VARIANTS = ("tessera", "whole GPUs", "whole GPUs, per-cycle window", "whole GPUs, KAI's usage")


def whole_gpus(tree: QueueTree, shares: Mapping[str, float]) -> dict[str, float]:
    """``shares`` rounded as KAI rounds an over-quota split (module docstring): among the children
    of each parent, those that want more than their share keep its whole GPUs, and what that
    leaves goes one GPU (or what is left of one) at a time to the largest remainders, the queue
    listed first on a tie."""
    rounded = dict(shares)
    for children in tree.children.values():
        wanting = [
            c
            for c in children
            if tree.subtree(c, "allocated", GPU) + tree.subtree(c, "requested", GPU) > shares[c]
        ]
        left = sum(shares[c] - math.floor(shares[c]) for c in wanting)
        order = sorted(wanting, key=lambda c: (-(shares[c] - math.floor(shares[c])), children.index(c)))
        for child in wanting:
            rounded[child] = math.floor(shares[child])
        for child in order:
            if left <= 1e-9:
                break
            extra = min(1.0, left)
            rounded[child] += extra
            left -= extra
    return rounded


def sliding_fractions(
    held: Sequence[Mapping[str, float]], capacity: float, params: HistoryParams
) -> dict[str, float]:
    """Each queue's usage from the cycles in ``held`` (oldest first) as KAI's fake usage database
    computes it: the last ``window`` cycles, the cycle ``age`` cycles back weighed
    ``0.5^(age / half-life)`` (1 without a half-life), over the capacity weighed alike."""
    recent = held[-int(params.window_s) :] if held else []
    weights = [
        1.0 if params.half_life_s is None else 0.5 ** ((len(recent) - i) / params.half_life_s)
        for i in range(len(recent))
    ]
    total = capacity * sum(weights)
    names = {name for cycle in recent for name in cycle}
    return (
        {
            name: sum(w * cycle.get(name, 0.0) for w, cycle in zip(weights, recent, strict=True)) / total
            for name in names
        }
        if total > 0
        else {}
    )


def tessera_shares(
    setup: Setup, allocations: Sequence[Mapping[str, float]], variant: str = VARIANTS[0]
) -> list[dict[str, float]]:
    """Tessera's GPU fair share of every queue at each cycle, from the history of the cycles
    before it (``allocations[t]``: each leaf queue's GPUs at cycle t; a parent's is its children's),
    as one of ``VARIANTS`` computes it."""
    tree = QueueTree(setup.specs, {})
    params = dict.fromkeys(tree.specs, setup.params)
    histories = {name: QueueHistory(0.0, setup.params) for name in tree.specs}
    subtree_held: list[dict[str, float]] = []  # each queue's (subtree's) GPUs, cycle by cycle
    shares: list[dict[str, float]] = []
    for cycle, held in enumerate(allocations):
        usage = {
            name: QueueUsage({GPU: held.get(name, 0.0)}, {GPU: max(0.0, want - held.get(name, 0.0))})
            for name, want in setup.demand.items()
        }
        now_tree = QueueTree(setup.specs, usage)
        if variant in VARIANTS[2:]:
            sliding = sliding_fractions(subtree_held, setup.capacity, setup.params)
            fractions = {name: {GPU: sliding.get(name, 0.0)} for name in tree.specs}
        else:
            fractions = {name: {GPU: history.fraction(GPU)} for name, history in histories.items()}
        if variant == VARIANTS[3]:
            for parent in tree.children:  # children compared as fractions of the cluster
                if parent is not None:
                    fractions[parent] = {GPU: 1.0}
        factors = target_factors(now_tree, fractions, params, [GPU])
        adjustment = WeightAdjustment(cycle, factors)
        divided = compute_fair_shares(FairShareInputs(setup.specs, usage, {GPU: setup.capacity}, adjustment))
        ours = {name: divided[name][GPU] for name in tree.specs}
        shares.append(ours if variant == "tessera" else whole_gpus(now_tree, ours))
        subtree_held.append({name: now_tree.subtree(name, "allocated", GPU) for name in tree.specs})
        for name in tree.specs:  # the cycle's allocation, held for one second, joins the history
            amount = subtree_held[-1][name]
            histories[name] = histories[name].advance(cycle + 1.0, {GPU: amount}, {GPU: setup.capacity})
    return shares


def compare(
    kai: Mapping[int, Mapping[str, tuple[float, float]]], setup: Setup, leaves: Sequence[str]
) -> list[list[str]]:
    """Per variant and lag, over the leaf queues and cycles: agreeing within AGREE_GPUS, the
    largest and the mean absolute difference."""
    cycles = sorted(kai)
    allocations = [{q: kai[c].get(q, (0.0, 0.0))[0] for q in leaves} for c in cycles]
    rows = []
    ours_by_variant = {variant: tessera_shares(setup, allocations, variant) for variant in VARIANTS}
    for variant, lag in ((v, lag) for v in VARIANTS for lag in range(MAX_LAG + 1)):
        ours = ours_by_variant[variant]
        differences = [
            abs(ours[index - lag][queue] - kai[cycle][queue][1])
            for index, cycle in enumerate(cycles)
            if index >= lag
            for queue in leaves
            if queue in kai[cycle]
        ]
        agree = sum(1 for d in differences if d <= AGREE_GPUS)
        rows.append(
            [
                variant,
                str(lag),
                str(len(differences)),
                f"{100 * agree / len(differences):.1f}" if differences else "-",
                f"{max(differences, default=0.0):.3f}",
                f"{sum(differences) / len(differences):.3f}" if differences else "-",
            ]
        )
    return rows


def run_kai(kai_src: Path, config: Path, out: Path, assets: str) -> None:
    """KAI's simulator on `config`, from its checkout (it reads its CRDs there), niced."""
    binary = kai_src / "bin" / "time-based-fairshare-simulator"
    env = {**os.environ, "KUBEBUILDER_ASSETS": assets}
    subprocess.run(
        ["nice", str(binary), "-input", str(config), "-output", str(out)],
        cwd=kai_src,
        env=env,
        check=True,
        timeout=900,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.kai_fairshare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--kai-src", type=Path, help="KAI checkout at the pin with the simulator built")
    parser.add_argument("--config", type=Path, help=f"simulator configuration (default: KAI's {OSCILLATING})")
    parser.add_argument("--csv", type=Path, help="the simulator's output, already written (nothing is run)")
    parser.add_argument(
        "--assets",
        default=os.environ.get("KUBEBUILDER_ASSETS", ""),
        help="kube-apiserver and etcd for envtest",
    )
    parser.add_argument("--out", type=Path, default=Path("kai-fairshare.csv"), help="where KAI's CSV goes")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.config is None and args.kai_src is None:
        parser.error("--config, or --kai-src (for KAI's own example), is needed")
    config = args.config or args.kai_src / OSCILLATING
    setup = read_setup(yaml.safe_load(config.read_text()))
    if args.csv is None:
        if args.kai_src is None:
            parser.error("--kai-src is needed to run KAI's simulator (or give --csv)")
        run_kai(args.kai_src, config.resolve(), args.out.resolve(), args.assets)
    kai = read_kai_csv(args.csv or args.out)
    leaves = sorted(setup.demand)
    print(
        f"\nKAI's time-based-fairshare-simulator and Tessera's rule on the same history ({config.name}: "
        f"{len(kai)} cycles, window {setup.params.window_s:g}, half-life {setup.params.half_life_s or 0:g}, "
        f"k {setup.params.k:g}; leaf queues {', '.join(leaves)})"
    )
    headers = [
        "Tessera's side",
        "lag (cycles)",
        "shares compared",
        f"agree within {AGREE_GPUS} GPU %",
        "max |diff|",
        "mean |diff|",
    ]
    print(format_table(headers, compare(kai, setup, leaves)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
