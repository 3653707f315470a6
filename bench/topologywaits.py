"""Benchmark: what a preferred topology level costs gangs in waiting, in the queue simulator,
against the same gangs placed without it.

Each seed draws one mixed workload (`mixed_workload`): 2 blocks x 4 racks x 4 nodes of 4 GPUs
(128 GPUs in 8 racks of 16), 32 lone one-GPU pods of a second queue scattered over the racks
first (they run long, so the racks stay fragmented), then gangs of 2 to 32 GPUs (sizes drawn from
2, 4, 6, 8, 12, 16, 24, 32; one, two or four GPUs a member) arriving at random (exponential gaps)
at about the cluster's capacity (`--load 1`: the gangs' GPU-seconds per second equal the GPUs the
lone pods leave), each preferring one rack. The workload is replayed twice by
`tessera.simulate.queues.run_queue_workload`: with the asks and with `topology_asks=False` (the
same gangs placed by the plain binpack). Per seed: the gangs' wait p95 with the preference over
the one without (the issue's target: at most 1.10x) and the mean racks each gang's minimum
started across, both ways; the last row is the worst seed. The seeds are not tuned on: every
seed of `--seeds` is a fresh draw.

`--hold-back-after S` replays both ways with the backfill rule on (`extender.policy.backfill`, the
extender's `--gang-hold-back-after`): once the first waiting gang has waited S seconds, later
gangs are planned off the nodes held back for it. The mean wait columns say what a rule costs
the gangs that do not make the p95.

`--gangs-in-order` replays both ways with a counterfactual the extender does not do: gangs start
in the order they came, none while an older one waits (`run_queue_workload(gangs_in_order=True)`).
It tells what the domain choice costs apart from which gangs start ahead of older ones: without
it a gang that fits starts while an older, larger one waits, and the p95 of 40 gangs (the third
longest wait) turns on those overtakes.

`--placebo` is an A/A test: the "with" replay is replaced by a second replay without the asks, on
another placement draw (`run_queue_workload`'s seed, which breaks ties among equally ranked nodes:
`PLACEBO_DRAW` added to the workload's seed). Nothing differs but which of equally good nodes each
pod takes, so its per-seed ratios are what chance alone does to the p95 of 40 gangs: the yardstick
for the per-seed ratios of the real comparison.

    python -m bench.topologywaits [--seeds 0-9] [--gangs 40] [--load 1.0] [--hold-back-after S]
                                  [--gangs-in-order] [--placebo]
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tessera.simulate.queues import QueueRunResult, parse_workload, run_queue_workload
from tessera.simulate.report import format_table

from . import SMOKE_HELP

GANG_GPUS = (2, 4, 6, 8, 12, 16, 24, 32)
MEMBER_GPUS = (1, 2, 4)
CLUSTER_GPUS = 128  # 2 blocks x 4 racks x 4 nodes x 4 GPUs
LONE_PODS = 32
PLACEBO_DRAW = 1_000_003  # added to a seed for the placebo's other placement draw


@dataclass(frozen=True)
class DrawnGang:
    """One gang of a drawn workload: its GPUs, split into members of ``per_member`` GPUs each, when
    it arrives and how long it runs once started (seconds of the workload's clock)."""

    gpus: int
    per_member: int
    arrival_s: float
    duration_s: float

    @property
    def members(self) -> int:
        return self.gpus // self.per_member


def draw_gangs(
    draw: random.Random, gangs: int, free_gpus: int, load: float, sizes: Sequence[int] = GANG_GPUS
) -> list[DrawnGang]:
    """``gangs`` gangs of ``sizes`` GPUs (one, two or four GPUs a member, at least two members),
    200-900 s each, arriving from t=30 with exponential gaps such that their GPU-seconds per
    second are ``load`` times ``free_gpus``."""
    chosen = [draw.choice(sizes) for _ in range(gangs)]
    durations = [draw.uniform(200, 900) for _ in range(gangs)]
    mean_gap = sum(s * d for s, d in zip(chosen, durations, strict=True)) / gangs / free_gpus / load
    arrival = 30.0
    drawn: list[DrawnGang] = []
    for gpus, duration in zip(chosen, durations, strict=True):
        per_member = draw.choice([m for m in MEMBER_GPUS if gpus % m == 0 and gpus // m >= 2])
        drawn.append(DrawnGang(gpus, per_member, arrival, duration))
        arrival += draw.expovariate(1 / mean_gap)
    return drawn


def mixed_workload(seed: int, gangs: int, load: float = 1.0) -> dict[str, Any]:
    """The seed's workload, as a queue-simulator YAML would state it (see the module docstring);
    `load`: the gangs' offered GPU-seconds per second over the GPUs the lone pods leave."""
    jobs: list[dict[str, Any]] = [
        {"name": "lone", "queue": "batch", "count": LONE_PODS, "interval": 0.5, "duration": 3600, "gpus": 1}
    ]
    for index, gang in enumerate(draw_gangs(random.Random(seed), gangs, CLUSTER_GPUS - LONE_PODS, load)):
        jobs.append(
            {
                "name": f"g{gang.gpus}-{index}",
                "queue": "train",
                "count": gang.members,
                "minMembers": gang.members,
                "arrival": round(gang.arrival_s, 1),
                "duration": round(gang.duration_s),
                "gpus": gang.per_member,
                "topologyPreferred": "rack",
            }
        )
    return {
        "name": f"topology-mixed-seed{seed}",
        "topology": [
            {"name": "block", "label": "example.com/block"},
            {"name": "rack", "label": "example.com/rack"},
        ],
        "nodes": [{"name": "n", "count": 32, "gpus": 4, "cpu": 64, "memory": "512Gi", "layout": [2, 4]}],
        "queues": [
            {"name": "train", "spec": {"resources": {"gpu": {"quota": CLUSTER_GPUS - LONE_PODS}}}},
            {"name": "batch", "spec": {"resources": {"gpu": {"quota": LONE_PODS}}}},
        ],
        "jobs": jobs,
    }


@dataclass(frozen=True)
class SeedRow:
    seed: int
    gangs: int
    p95_with_s: float
    p95_without_s: float
    mean_with_s: float
    mean_without_s: float
    racks_with: float
    racks_without: float
    waits_with_s: tuple[float, ...] = ()  # each gang's wait, for the pooled p95
    waits_without_s: tuple[float, ...] = ()

    @property
    def ratio(self) -> float:
        """p95 with the preference over without (equal waits: 1; none without, some with: inf)."""
        return _ratio(self.p95_with_s, self.p95_without_s)


def _ratio(with_s: float, without_s: float) -> float:
    if with_s == without_s:
        return 1.0
    return with_s / without_s if without_s else float("inf")


def p95(waits: Sequence[float]) -> float:
    """The wait p95, nearest rank (as the simulator's gang table)."""
    ordered = sorted(waits)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _p95(result: QueueRunResult) -> float:
    return p95([gang.wait_s for gang in result.gangs])


def _mean_wait(result: QueueRunResult) -> float:
    return sum(gang.wait_s for gang in result.gangs) / len(result.gangs)


def _mean_racks(result: QueueRunResult) -> float:
    return sum(gang.spanned["rack"] for gang in result.gangs) / len(result.gangs)


def run_seed(
    seed: int,
    gangs: int,
    load: float,
    in_order: bool = False,
    hold_back_after_s: float | None = None,
    placebo: bool = False,
) -> SeedRow:
    """The seed's workload replayed with the asks and without; `placebo`: the first replay is
    without them too, on the placement draw ``seed + PLACEBO_DRAW`` (see the module docstring)."""
    workload = parse_workload(mixed_workload(seed, gangs, load), f"seed {seed}")
    first = (False, seed + PLACEBO_DRAW) if placebo else (True, seed)
    asked, plain = (
        run_queue_workload(
            workload,
            "tessera",
            draw,
            topology_asks=topology,
            gangs_in_order=in_order,
            hold_back_after_s=hold_back_after_s,
        )
        for topology, draw in (first, (False, seed))
    )
    return SeedRow(
        seed,
        len(asked.gangs),
        _p95(asked),
        _p95(plain),
        _mean_wait(asked),
        _mean_wait(plain),
        _mean_racks(asked),
        _mean_racks(plain),
        tuple(gang.wait_s for gang in asked.gangs),
        tuple(gang.wait_s for gang in plain.gangs),
    )


def table(rows: Sequence[SeedRow]) -> str:
    headers = [
        "seed",
        "gangs",
        "wait p95 s",
        "without s",
        "p95 / without",
        "mean wait s",
        "without s",
        "racks spanned",
        "without",
    ]
    body = [
        [
            str(r.seed),
            str(r.gangs),
            f"{r.p95_with_s:.0f}",
            f"{r.p95_without_s:.0f}",
            f"{r.ratio:.2f}x",
            f"{r.mean_with_s:.0f}",
            f"{r.mean_without_s:.0f}",
            f"{r.racks_with:.2f}",
            f"{r.racks_without:.2f}",
        ]
        for r in rows
    ]
    worst = max(rows, key=lambda r: r.ratio)
    body.append(["worst", f"seed {worst.seed}", "", "", f"{worst.ratio:.2f}x", "", "", "", ""])
    count = len(rows)
    means = [
        sum(r.p95_with_s for r in rows) / count,
        sum(r.p95_without_s for r in rows) / count,
        sum(r.mean_with_s for r in rows) / count,
        sum(r.mean_without_s for r in rows) / count,
        sum(r.racks_with for r in rows) / count,
        sum(r.racks_without for r in rows) / count,
    ]
    body.append(["mean", "", *(f"{m:.0f}" for m in means[:2]), "", *(f"{m:.0f}" for m in means[2:4])])
    body[-1].extend(f"{m:.2f}" for m in means[4:])
    pooled_with = [wait for r in rows for wait in r.waits_with_s]
    pooled_without = [wait for r in rows for wait in r.waits_without_s]
    if pooled_with and pooled_without:
        with_s, without_s = p95(pooled_with), p95(pooled_without)
        body.append(
            [
                "pooled",
                str(len(pooled_with)),
                f"{with_s:.0f}",
                f"{without_s:.0f}",
                f"{_ratio(with_s, without_s):.2f}x",
            ]
            + [""] * 4
        )
    return format_table(headers, body)


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if last else [int(s) for s in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.topologywaits", description=__doc__)
    parser.add_argument("--seeds", default="0-9", help="FIRST-LAST or a comma list (default 0-9)")
    parser.add_argument("--gangs", type=int, default=40, help="gangs per workload (default 40)")
    parser.add_argument("--load", type=float, default=1.0, help="offered load of the gangs (default 1.0)")
    parser.add_argument(
        "--hold-back-after",
        type=float,
        default=None,
        metavar="S",
        help="both ways, hold the first waiting gang's nodes back from later gangs once it has waited S s",
    )
    parser.add_argument(
        "--gangs-in-order",
        action="store_true",
        help="both ways, start gangs in the order they came (a counterfactual, see above)",
    )
    parser.add_argument(
        "--placebo",
        action="store_true",
        help="an A/A test: both replays without the asks, on two placement draws (see above)",
    )
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_HELP} (seed 0, 6 gangs)")
    args = parser.parse_args(argv)
    seeds, gangs = ([0], 6) if args.smoke else (_seeds(args.seeds), args.gangs)
    rows = [
        run_seed(seed, gangs, args.load, args.gangs_in_order, args.hold_back_after, args.placebo)
        for seed in seeds
    ]
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
