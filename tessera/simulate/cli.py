"""``tessera simulate``: packing replays of the Alibaba trace and queue-fairness workloads.

    tessera simulate trace [--all | --pods FILE ...] [--policies fgd,tessera,...] [--seed N | --seeds 0,1,2]
                           [--replay paper,creation] [--scheduler-profile shipped|stock]
                           [--extender-weight N] [--device-choice first-fit|tessera]
                           [--moves-per-100-pods 0,1,2,5] [--moves-per-pod N] [--bound [TARGET]]
    tessera simulate mig [--gpus 64] [--target 130] [--seeds 0,1,2]
    tessera simulate timeline [--policies random,...,tessera+moves] [--loads 1,1.5,2,3] [--seeds 0,1,2]
                              [--cluster-share 0.02] [--move-budget 5] [--min-runtime 300] [--smoke]
                              [--queues N]
    tessera simulate queues WORKLOAD.yaml [--policy tessera] [--reclaim-interval S] [--termination-delay S]
                            [--partly-owed-wait-s S] [--whole-owed-wait-s S] [--max-victim-evictions K]
                            [--victim-lead-s S] [--victim-lead-per-wait X] [--collect-for-owed on|off]
                            [--no-topology-asks] [--history on|off]

All print a table, write CSV files and PNG plots under ``--out`` and are deterministic for a seed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from contract.names import GPU_MILLI
from extender.rule_flags import add_rule_flags, rule_flags

from .bound import placed_prefix_capping
from .deployed import DEVICE_CHOICES, SHIPPED_PROFILE, STOCK_PROFILE, DeviceChoice, SchedulerProfile
from .mig import MODELS as MIG_MODELS
from .mig import SYNTHETIC_MIX, mig_table, replay_mig
from .packing import REPLAYS, PackingResult, Replay, arrivals, replay_packing
from .policies import DEFAULT_POLICIES, DEPLOYED, POLICY_NAMES, policy_names
from .queues import WorkloadError, load_workload, run_queue_workload
from .report import (
    PUBLISHED_ALLOCATION,
    bound_table,
    gang_table,
    gpu_hours_table,
    margin_lines,
    move_budget_table,
    packing_seeds_table,
    packing_table,
    plot_move_budget,
    plot_packing,
    plot_queues,
    queue_table,
    write_packing_csv,
    write_queue_csv,
)
from .timeline import (
    DEFAULT_LOADS,
    DEFAULT_MOVE_BUDGET,
    DEFAULT_RULES,
    TIMELINE_POLICIES,
    TimelineResult,
    replay_timeline,
    sample_nodes,
)
from .timeline_queues import TimelineQueuesResult, replay_timeline_queues
from .timeline_report import (
    MULTI_GPU_P95_LIMIT_S,
    comparison_lines,
    first_load_over,
    plot_timeline,
    timeline_queues_table,
    timeline_table,
    waits_table,
    worst_queues_table,
    write_timeline_csv,
    write_timeline_queues_csv,
)
from .trace import (
    DEFAULT_PODS_FILE,
    NODES_FILE,
    SimNode,
    SimPod,
    TraceError,
    default_trace_dir,
    load_nodes,
    load_pods,
)

ALL_POD_FILES = (
    DEFAULT_PODS_FILE,
    "openb_pod_list_gpushare40.csv",
    "openb_pod_list_multigpu20.csv",
)
DEFAULT_OUT = Path("out") / "simulate"  # out/ is git-ignored
# Relative replay time per policy (measured on the default trace), to start the slow ones first.
_EXPECTED_COST = {DEPLOYED: 5, "tessera": 3, "tessera-spread": 2, "fgd": 2}
SCHEDULER_PROFILES = {"shipped": SHIPPED_PROFILE, "stock": STOCK_PROFILE}

_last_reported: dict[str, int] = {}


def _report_progress(policy: str, fraction: float) -> None:
    """One line per tenth of the replay; runs in worker processes, so it writes straight to stderr."""
    tenth = min(10, int(fraction * 10))
    if tenth > _last_reported.get(policy, 0):
        _last_reported[policy] = tenth
        bar = "#" * tenth + "." * (10 - tenth)
        print(f"  [{bar}] {policy:<14} {10 * tenth:3d}%", file=sys.stderr, flush=True)


def _replay_task(
    nodes_csv: Path,
    pods_csv: Path,
    policy: str,
    seed: int,
    replay: Replay,
    arrival: float,
    quiet: bool,
    profile: SchedulerProfile,
    device_choice: DeviceChoice,
    budget: float | None,
    moves_per_pod: int,
) -> PackingResult:
    """One replay; runs in a worker process."""
    return replay_packing(
        load_nodes(nodes_csv),
        load_pods(pods_csv),
        policy,
        seed=seed,
        replay=replay,
        target_arrival_pct=arrival,
        progress=None if quiet else _report_progress,
        profile=profile,
        device_choice=device_choice,
        moves_per_100_pods=budget,
        moves_per_pod=moves_per_pod,
    )


def _scheduler_profile(args: argparse.Namespace) -> SchedulerProfile:
    profile = SCHEDULER_PROFILES[args.scheduler_profile]
    if args.extender_weight is None:
        return profile
    if not 1 <= args.extender_weight <= 100:
        raise ValueError("--extender-weight must be in 1..100")
    return replace(profile, extender_weight=args.extender_weight)


def _replays(spec: str) -> list[Replay]:
    chosen: list[Replay] = []
    for name in (part.strip() for part in spec.split(",") if part.strip()):
        replay = next((known for known in REPLAYS if known == name), None)
        if replay is None:
            raise ValueError(f"unknown replay {name!r}; choose from {', '.join(REPLAYS)}")
        chosen.append(replay)
    if not chosen:
        raise ValueError(f"no replay given; choose from {', '.join(REPLAYS)}")
    return chosen


def _trace_name(pods_csv: Path) -> str:
    return pods_csv.stem.removeprefix("openb_pod_list_")


def capping_line(
    nodes: Sequence[SimNode], pods: Sequence[SimPod], replay: Replay, seed: int, args: argparse.Namespace
) -> str:
    """From what arrival on every replay of this seed is capped below the ``--bound`` target."""
    arrived = [pod.demand for pod in arrivals(nodes, pods, replay, seed, args.arrival)]
    gpus = sum(node.gpus for node in nodes)
    target = args.bound
    count = placed_prefix_capping(gpus, arrived, round(target / 100 * GPU_MILLI * gpus))
    if count is None:
        return f"seed {seed}: no prefix of the arrivals caps the gap bound below {target:g}%"
    share = 100.0 * sum(d.total_milli for d in arrived[:count]) / (GPU_MILLI * gpus)
    return (
        f"seed {seed}: once the first {count} pods are placed (arrival {share:.2f}%), no moves can "
        f"take any replay to {target:g}% (gap bound)"
    )


def _run_trace(args: argparse.Namespace) -> int:
    trace_dir: Path | None = args.trace_dir or default_trace_dir()
    if trace_dir is None and (args.nodes is None or not args.pods):
        print("error: no trace directory found; pass --trace-dir, or --nodes and --pods", file=sys.stderr)
        return 2
    nodes_csv: Path = args.nodes or (trace_dir / NODES_FILE if trace_dir else Path(NODES_FILE))
    pod_files = [Path(p) for p in args.pods] if args.pods else [Path(DEFAULT_PODS_FILE)]
    if args.all:
        pod_files = [Path(name) for name in ALL_POD_FILES]
    pod_files = [p if p.is_file() or trace_dir is None else trace_dir / p for p in pod_files]
    try:
        policies = policy_names([name.strip() for name in args.policies.split(",") if name.strip()])
        seeds = [int(seed) for seed in args.seeds.split(",")] if args.seeds else [args.seed]
        replays = _replays(args.replay)
        profile = _scheduler_profile(args)
        budgets = [float(b) for b in args.moves_per_100_pods.split(",")] if args.moves_per_100_pods else []
        if any(budget < 0 for budget in budgets):
            raise ValueError("--moves-per-100-pods cannot be negative")
        if args.moves_per_pod < 1:
            raise ValueError("--moves-per-pod must be at least 1")
        load_nodes(nodes_csv)  # fail fast on a bad file, before starting workers
        untimed = [p for p in pod_files if all(pod.creation_time is None for pod in load_pods(p))]
    except (TraceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # One replay per policy, plus tessera with consolidation per move budget (None: no moves).
    runs: list[tuple[str, float | None]] = [(policy, None) for policy in policies]
    runs += [("tessera", budget) for budget in budgets]
    # Longest replays first, so the last worker is not left alone with a slow one.
    tasks = sorted(
        (
            (pods_csv, replay, run, seed)
            for pods_csv in pod_files
            for replay in replays
            for run in runs
            for seed in seeds
        ),
        key=lambda task: _EXPECTED_COST.get(task[2][0], 1) * (1 if task[2][1] is None else 2),
        reverse=True,
    )
    print(
        f"replaying {len(pod_files)} trace(s) x {len(replays)} replay(s) x {len(runs)} policies and "
        f"move budgets x {len(seeds)} seed(s) to {args.arrival:g}% arrival, {args.jobs} worker(s)",
        file=sys.stderr,
    )
    if DEPLOYED in policies:
        print(f"{DEPLOYED}: {profile.describe()}, devices {args.device_choice}")
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            task: pool.submit(
                _replay_task,
                nodes_csv,
                task[0],
                task[2][0],
                task[3],
                task[1],
                args.arrival,
                args.quiet,
                profile,
                args.device_choice,
                task[2][1],
                args.moves_per_pod,
            )
            for task in tasks
        }
        results = {task: future.result() for task, future in futures.items()}
    by_trace: dict[str, list[PackingResult]] = {}
    for pods_csv in pod_files:
        trace = _trace_name(pods_csv)
        mine_all: list[PackingResult] = []
        for replay in replays:
            mine = [results[(pods_csv, replay, run, seed)] for run in runs for seed in seeds]
            mine_all += mine
            published = PUBLISHED_ALLOCATION.get(trace) if replay == "paper" and args.arrival == 130 else None
            order = (
                "pods shuffled per seed"
                if replay == "paper"
                else "creation-time order"
                + (" (no creation_time: file order)" if pods_csv in untimed else "")
            )
            seed_list = ", ".join(map(str, seeds))
            print(f"\ntrace {trace} ({pods_csv.name}), replay {replay}: {order}; seed(s) {seed_list}")
            print(packing_table(mine, published) if len(seeds) == 1 else packing_seeds_table(mine, published))
            for label in dict.fromkeys(r.label for r in mine if r.policy in ("tessera", DEPLOYED)):
                for line in margin_lines(mine, label, "fgd"):
                    print(line)
            if args.bound is not None:
                print(f"\nidle GPU capacity at the end and upper bounds on what moves could reach, {trace}:")
                print(bound_table(mine))
                for seed in seeds:
                    print(capping_line(load_nodes(nodes_csv), load_pods(pods_csv), replay, seed, args))
            if budgets:
                print(f"\nallocation vs move budget, {trace}, replay {replay}:")
                print(move_budget_table(mine))
                if replay == replays[0]:
                    by_trace[trace] = mine
            if not args.no_plots:
                print(f"wrote {plot_packing(mine, f'{trace}-{replay}', args.out)}")
        written = write_packing_csv(mine_all, trace, args.out)
        print("wrote " + ", ".join(str(path) for path in written))
    if by_trace and not args.no_plots:
        print(f"wrote {plot_move_budget(by_trace, args.out)}")
    return 0


Replayed = TypeVar("Replayed")

SMOKE_PODS = 300  # --smoke: the first pods by arrival, enough for waits on a small share


def _timeline_task(
    nodes_csv: Path,
    pods_csv: Path,
    share: float,
    policy: str,
    seed: int,
    load: float,
    max_pods: int | None,
    budget: float,
    min_runtime_s: float,
) -> TimelineResult:
    """One timeline replay; runs in a worker process."""
    return replay_timeline(
        sample_nodes(load_nodes(nodes_csv), share),
        load_pods(pods_csv),
        policy,
        seed=seed,
        load=load,
        max_pods=max_pods,
        move_budget=budget,
        rules=replace(DEFAULT_RULES, min_runtime_s=min_runtime_s),
    )


def _timeline_queues_task(
    nodes_csv: Path,
    pods_csv: Path,
    share: float,
    policy: str,
    seed: int,
    load: float,
    max_pods: int | None,
    queues: int,
    budget: float,
    min_runtime_s: float,
) -> TimelineQueuesResult:
    """One timeline replay with queues and reclaim (and moves); runs in a worker process."""
    return replay_timeline_queues(
        sample_nodes(load_nodes(nodes_csv), share),
        load_pods(pods_csv),
        policy,
        queues=queues,
        seed=seed,
        load=load,
        max_pods=max_pods,
        move_budget=budget,
        rules=replace(DEFAULT_RULES, min_runtime_s=min_runtime_s),
    )


def _in_pool(
    args: argparse.Namespace,
    task: Callable[..., Replayed],
    inputs: tuple[Path, Path, int | None],
    runs: Sequence[tuple[str, int, float]],
    options: tuple[object, ...],
    said: Callable[[Replayed], str],
) -> list[Replayed]:
    """Each (policy, seed, load) of `runs` replayed by `task` (`inputs`: the nodes and pods CSVs
    and the pod cap; then the run; then `options`) in `args.jobs` processes, each end told on
    stderr as `said` puts it; the results in the order of `runs`."""
    nodes_csv, pods_csv, max_pods = inputs
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [
            pool.submit(task, nodes_csv, pods_csv, args.cluster_share, policy, seed, load, max_pods, *options)
            for policy, seed, load in runs
        ]
        for done, future in enumerate(as_completed(futures), start=1):
            print(f"  [{done}/{len(futures)}] {said(future.result())}", file=sys.stderr, flush=True)
        return [future.result() for future in futures]


def _comma_list(spec: str) -> list[str]:
    return [part.strip() for part in spec.split(",") if part.strip()]


def _run_timeline(args: argparse.Namespace) -> int:
    trace_dir: Path | None = args.trace_dir or default_trace_dir()
    if trace_dir is None and (args.nodes is None or args.pods is None):
        print("error: no trace directory found; pass --trace-dir, or --nodes and --pods", file=sys.stderr)
        return 2
    nodes_csv: Path = args.nodes or (trace_dir / NODES_FILE if trace_dir else Path(NODES_FILE))
    pods_csv: Path = args.pods or (trace_dir / DEFAULT_PODS_FILE if trace_dir else Path(DEFAULT_PODS_FILE))
    try:
        policies = _comma_list(args.policies)
        unknown = [name for name in policies if name not in TIMELINE_POLICIES]
        if unknown or not policies:
            raise ValueError(
                f"unknown policy {', '.join(unknown)}; choose from {', '.join(TIMELINE_POLICIES)}"
            )
        loads = [float(load) for load in _comma_list(args.loads)]
        seeds = [int(seed) for seed in _comma_list(args.seeds)]
        if not loads or min(loads) <= 0:
            raise ValueError("--loads must be positive numbers")
        if args.move_budget < 0 or args.min_runtime < 0:
            raise ValueError("--move-budget and --min-runtime cannot be negative")
        max_pods = SMOKE_PODS if args.smoke else args.max_pods
        if max_pods is not None and max_pods < 1:
            raise ValueError("--max-pods must be at least 1")
        if args.queues is not None and args.queues < 1:
            raise ValueError("--queues must be at least 1")
        nodes = sample_nodes(load_nodes(nodes_csv), args.cluster_share)  # fail fast, before workers
        load_pods(pods_csv)
    except (TraceError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    gpus = sum(node.gpus for node in nodes)
    print(
        f"timeline {pods_csv.name}: {len(nodes)} nodes ({gpus} GPUs, share {args.cluster_share:g}), "
        f"{len(policies)} policies x {len(loads)} load(s) x {len(seeds)} seed(s)"
        + (f", first {max_pods} pods" if max_pods else "")
        + f"; moves: budget {args.move_budget:g} per 100 pods started, "
        f"minimum runtime {args.min_runtime:g} s",
        file=sys.stderr,
    )
    tasks = [(policy, seed, load) for load in loads for policy in policies for seed in seeds]
    results = _in_pool(
        args,
        _timeline_task,
        (nodes_csv, pods_csv, max_pods),
        tasks,
        (args.move_budget, args.min_runtime),
        lambda r: f"{r.policy} {r.load:g}x seed {r.seed}: {r.seconds:.1f} s",
    )
    first = results[0]
    print(
        f"{first.pods} pods replayed ({first.never_ran} never ran in the trace, "
        f"{first.never_fit} fit no node); waits in minutes, alloc % time-averaged over the arrival "
        "span and while a GPU pod waits"
    )
    print(timeline_table(results))
    over = first_load_over(results)
    limit = MULTI_GPU_P95_LIMIT_S / 60
    per_seed = ", ".join(
        f"seed {seed}: " + (f"{load:g}x" if load is not None else "never")
        for seed in seeds
        for load in [first_load_over([r for r in results if r.seed == seed])]
    )
    print(
        (
            f"\nfgd's multi-GPU p95 wait (mean over seeds) first passes {limit:g} min at {over:g}x"
            if over is not None
            else f"\nfgd's multi-GPU p95 wait (mean over seeds) stays within {limit:g} min at every load"
        )
        + f" ({per_seed})"
    )
    focus = over if over is not None else max(loads)
    print(f"\nwaits by pod size at {focus:g}x (minutes):")
    print(waits_table(results, focus))
    print("\nper seed, against fgd (a cut > 0: less waiting):")
    for load in loads:
        for line in comparison_lines(results, load):
            print(line)
    written = write_timeline_csv(results, args.out)
    if not args.no_plots:
        written += [plot_timeline(results, load, args.out) for load in loads]
    if args.queues is not None:
        written.append(_run_timeline_queues(args, nodes_csv, pods_csv, policies, loads, seeds, max_pods))
    print("wrote " + ", ".join(str(path) for path in written))
    return 0


def _run_timeline_queues(
    args: argparse.Namespace,
    nodes_csv: Path,
    pods_csv: Path,
    policies: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
    max_pods: int | None,
) -> Path:
    """The queue replays of `--queues`: the tables per queue and of the worst queues, the CSV."""
    print(
        f"\nqueues: {args.queues}, pods by crc32(name) mod {args.queues}, equal GPU quotas summing to "
        "the cluster; admission and reclaim (and for tessera+moves consolidation) as the extender's "
        "(docs/simulator.md)"
    )
    tasks = [(policy, seed, load) for load in loads for policy in policies for seed in seeds]
    results = _in_pool(
        args,
        _timeline_queues_task,
        (nodes_csv, pods_csv, max_pods),
        tasks,
        (args.queues, args.move_budget, args.min_runtime),
        lambda r: f"{r.policy} {r.load:g}x seed {r.seed}, {r.queues} queues: {r.seconds:.1f} s",
    )
    print("per queue, over the whole run (waits in minutes):")
    print(timeline_queues_table(results))
    print("\nthe worst queue of each figure:")
    print(worst_queues_table(results))
    return write_timeline_queues_csv(results, args.out)


def _run_queues(args: argparse.Namespace) -> int:
    try:
        workload = load_workload(args.workload)
        policy_names([args.policy])
        if args.policy == DEPLOYED:
            raise ValueError(f"{DEPLOYED} models the packing replay only; use tessera for queue workloads")
        if min(args.reclaim_interval or 0.0, args.termination_delay or 0.0) < 0:
            raise ValueError("--reclaim-interval and --termination-delay cannot be negative")
        flags = rule_flags(args)
    except (WorkloadError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = run_queue_workload(
        workload,
        args.policy,
        args.seed,
        reclaim_interval_s=args.reclaim_interval,
        termination_delay_s=args.termination_delay,
        flags=flags,
        topology_asks=not args.no_topology_asks,
        history=None if args.history is None else args.history == "on",
    )
    print(
        f"workload {result.name}: {len(workload.nodes)} nodes, policy {result.policy}, "
        f"makespan {result.makespan_s:.0f} s"
    )
    print(queue_table(result))
    if result.gangs:
        print(gang_table(result))
    if result.history or args.history is not None:
        top = {q.name: q.over_quota_weight.get("gpu", 1.0) for q in workload.queues if q.parent is None}
        print(gpu_hours_table(result, top))
    if result.refusals:
        print("refusals: " + ", ".join(f"{k} {v}" for k, v in sorted(result.refusals.items())))
    written = write_queue_csv(result, args.out)
    if not args.no_plots:
        written.append(plot_queues(result, args.out))
    print("wrote " + ", ".join(str(path) for path in written))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    trace = sub.add_parser("trace", help="packing replay of the Alibaba GPU trace (openb 2023 format)")
    trace.add_argument(
        "--trace-dir", type=Path, help="folder with the trace CSVs (default: shared/traces/alibaba-gpu-v2023)"
    )
    trace.add_argument("--nodes", type=Path, help=f"nodes CSV (default: TRACE_DIR/{NODES_FILE})")
    trace.add_argument("--pods", action="append", help=f"pods CSV, repeatable (default: {DEFAULT_PODS_FILE})")
    trace.add_argument(
        "--all", action="store_true", help="every shared pods CSV: " + ", ".join(ALL_POD_FILES)
    )
    trace.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"comma-separated, from {', '.join(POLICY_NAMES)} (default: %(default)s)",
    )
    trace.add_argument(
        "--replay",
        default="paper",
        help="comma-separated: paper (pods shuffled per seed, the FGD paper's experiment; default) "
        "and/or creation (creation-time order)",
    )
    trace.add_argument("--arrival", type=float, default=130.0, help="stop at this arrival %% (default 130)")
    trace.add_argument(
        "--moves-per-100-pods",
        help="comma-separated move budgets: per budget B, a tessera replay with consolidation that moves "
        "at most B placed pods per 100 placed (tessera+movesB; 0: the plain replay through the same path)",
    )
    trace.add_argument(
        "--moves-per-pod",
        type=int,
        default=1,
        help="with --moves-per-100-pods: at most this many moves serve one pod (the planner's "
        "max_moves_per_pod; default %(default)s, the extender's is 2)",
    )
    trace.add_argument(
        "--bound",
        nargs="?",
        type=float,
        const=98.5,
        metavar="TARGET",
        help="per replay, where the idle GPU capacity of its end state is and upper bounds on the GPU "
        "allocation any moves could reach, and per seed from what arrival %% on every replay is capped "
        "below TARGET %% (default 98.5; tessera/simulate/bound.py)",
    )
    trace.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    trace.add_argument(
        "--scheduler-profile",
        choices=sorted(SCHEDULER_PROFILES),
        default="shipped",
        help=f"the kube-scheduler profile {DEPLOYED} models: shipped "
        f"(the chart's: {SHIPPED_PROFILE.describe()}) or stock "
        f"(kube-scheduler's default plugins: {STOCK_PROFILE.describe()}); default %(default)s",
    )
    trace.add_argument("--extender-weight", type=int, help="the extender's weight in that profile")
    trace.add_argument(
        "--device-choice",
        choices=DEVICE_CHOICES,
        default="first-fit",
        help=f"who picks the GPUs in {DEPLOYED}: first-fit (the DRA allocator, as deployed; default) "
        "or tessera (choose_gpus, had Tessera a say)",
    )
    trace.add_argument("--quiet", action="store_true", help="no progress lines")
    timeline = sub.add_parser(
        "timeline", help="the Alibaba trace over time: arrivals, departures, waiting (and moves)"
    )
    timeline.add_argument("--trace-dir", type=Path, help="folder with the trace CSVs")
    timeline.add_argument("--nodes", type=Path, help=f"nodes CSV (default: TRACE_DIR/{NODES_FILE})")
    timeline.add_argument(
        "--pods", type=Path, help=f"pods CSV with time columns (default: {DEFAULT_PODS_FILE})"
    )
    timeline.add_argument(
        "--policies",
        default=",".join(TIMELINE_POLICIES),
        help=f"comma-separated, from {', '.join(TIMELINE_POLICIES)} (default: all)",
    )
    timeline.add_argument(
        "--loads",
        default=",".join(f"{load:g}" for load in DEFAULT_LOADS),
        help="comma-separated load factors: inter-arrival gaps divided by each (default %(default)s)",
    )
    timeline.add_argument("--seeds", default="0", help="comma-separated seeds (default %(default)s)")
    timeline.add_argument(
        "--cluster-share",
        type=float,
        default=0.02,
        help="keep this share of the nodes, every model and size in proportion (default %(default)s: "
        "the trace's pods are a sample that fills about 1%% of the whole cluster; docs/simulator.md)",
    )
    timeline.add_argument(
        "--move-budget",
        type=float,
        default=DEFAULT_MOVE_BUDGET,
        help="tessera+moves: at most this many moves per 100 pods started (default %(default)s)",
    )
    timeline.add_argument(
        "--min-runtime",
        type=float,
        default=DEFAULT_RULES.min_runtime_s,
        help="tessera+moves: seconds a pod runs before it may be moved (default %(default)s, the extender's)",
    )
    timeline.add_argument("--max-pods", type=int, help="replay only the first N pods by arrival")
    timeline.add_argument("--smoke", action="store_true", help=f"a short replay: the first {SMOKE_PODS} pods")
    timeline.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    timeline.add_argument(
        "--queues",
        type=int,
        help="also replay with N equal queues, admission and reclaim (and moves for tessera+moves)",
    )
    queues = sub.add_parser("queues", help="queue-fairness workload in the native YAML format")
    queues.add_argument("workload", type=Path, help="workload YAML (see docs/simulator.md)")
    queues.add_argument("--policy", default="tessera", help="placement policy (default tessera)")
    queues.add_argument(
        "--reclaim-interval",
        type=float,
        help="seconds between reclaim cycles, 0 for none (default: the workload's, else 1)",
    )
    queues.add_argument(
        "--termination-delay",
        type=float,
        help="seconds an evicted pod takes to go (default: the workload's, else 0)",
    )
    add_rule_flags(queues)
    trace.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    trace.add_argument("--seeds", help="comma-separated seeds: one replay each, table of mean/min/max")
    queues.add_argument("--seed", type=int, default=None, help="random seed (default: the workload's)")
    queues.add_argument(
        "--no-topology-asks",
        action="store_true",
        help="place gangs as if they asked no topology level (the domains they span are still reported)",
    )
    queues.add_argument(
        "--history",
        choices=("on", "off"),
        help="fair share over time on or off, and the GPU-hours table (default: the workload's)",
    )
    mig = sub.add_parser(
        "mig", help="MIG-capable GPUs: partitions on demand vs carved ahead vs MPS (synthetic mix)"
    )
    mig.add_argument("--gpus", type=int, default=64, help="H100 80GB GPUs (default 64)")
    mig.add_argument(
        "--target", type=float, default=130.0, help="arrival in %% of compute slices (default 130)"
    )
    mig.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    for mode in (trace, queues, timeline):
        mode.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default %(default)s)")
        mode.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.mode == "trace":
        return _run_trace(args)
    if args.mode == "mig":
        return _run_mig(args)
    if args.mode == "timeline":
        return _run_timeline(args)
    return _run_queues(args)


def _run_mig(args: argparse.Namespace) -> int:
    seeds = [int(seed) for seed in args.seeds.split(",")]
    results = [replay_mig(model, args.gpus, args.target, seed) for seed in seeds for model in MIG_MODELS]
    print(f"MIG packing, {args.gpus} H100 80GB, synthetic mix {dict(SYNTHETIC_MIX)}, seeds {seeds}")
    print(mig_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
