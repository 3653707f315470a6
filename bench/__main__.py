"""``python -m bench`` (``make bench``): Tessera's benchmarks, each against a baseline of the same run.

1. extender hot path over HTTP (filter + prioritize) vs a do-nothing aiohttp extender;
2. end to end on the local control plane: time to bind single-GPU pods, kube-scheduler with and
   without the extender (``bench.e2e``);
3. fairness reaction: time for a second queue to reach its fair share, with and without the
   extender (``bench.reaction``);
4. extender memory with a large cluster picture vs the same process holding none;
5. DRA driver NodePrepareResources / NodeUnprepareResources (1, 10, 100 claims per request) vs a
   do-nothing gRPC server on the same unix socket, and crash recovery of 150 claims vs the
   per-claim rollback it replaced, and MIG placements made on demand vs whole GPUs (``bench.prepare``);
6. fair-share recompute for 1000 queues in three levels and 4000 siblings vs the quadratic
   water-filling it replaced (``bench.fairshare``);
7. one planning cycle (reclaim, then consolidation) on a large picture vs taking its snapshot alone
   (``bench.planning``);
8. reclaim: time for a queue to get back its lent fair share, Tessera's reclaim beside
   kube-scheduler's priority preemption, then churn counting evictions later undone
   (``bench.reclaim``);
9. packing: a 50-node slice of the Alibaba trace end to end (kube-scheduler + extender + DRA
   allocator) beside the simulator's deployed mode on the same slice and order (``bench.packing``);
10. filter latency while large AdmissionReviews flood the webhook port, against the same filters
   with nothing else, the webhooks in their own process and (for contrast) on the verbs' event
   loop (``bench.webhookflood``);
11. the scale suite, KAI Scheduler's nightly shape on 500 or 1000 simulated nodes: fill rate,
   time to reclaim one GPU, churn, control-plane CPU (``bench.scale``): not in the full run (its
   own command, or ``--only scale``: a round takes tens of minutes at 500 nodes); in the smoke;
12. gangs preferring one rack, live, on 128 GPUs in 8 racks: racks spanned per gang and time to
   start, Tessera beside KAI Scheduler with its Topology (``bench.topology_live``): not in the full
   run either (``--only topology_live``: about 20 minutes a round of its three contenders); in
   the smoke;
13. the fragmented cluster: every GPU half used by a half-GPU pod, then a whole-GPU pod arrives:
   time until it is bound and moves made, Tessera's consolidation beside KAI Scheduler's
   (``bench.fragmented``): not in the full run (``--only fragmented``); in the smoke.

Default sizes fit a 2-core machine in a few minutes; ``--full`` runs the sizes of the issue
(hot path: 500 and 5000 nodes x 8 GPUs with 50,000 pods; 500 nodes / 4000 pods end to end;
memory: 5000 nodes, 100,000 pods; reclaim: 16 nodes and a 10-minute churn). 2, 3, 8 and 9 need
the control-plane binaries (``make bench`` builds them); ``--no-cluster`` skips them. 2, 3 and 8
race KAI Scheduler too when ``hack/build-kai.sh`` built it (``bench.kai``; ``--no-kai`` leaves it
out); without that build they say so and run without it.

``--smoke`` runs every benchmark module at tiny sizes, one round each (the in-process ones not in
the list above, ``bench.codec``, ``bench.queuecycle``, ``bench.topology``, ``bench.topologywaits``,
``bench.history`` and ``bench.history_weeks``, too): what ``make test`` runs to catch a benchmark
that no longer works, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Sequence

from tessera.simulate.report import format_table

from . import (
    SMOKE_HELP,
    codec,
    e2e,
    fairshare,
    fragmented,
    history,
    history_weeks,
    packing,
    planning,
    prepare,
    queuecycle,
    reaction,
    reclaim,
    scale,
    topology,
    topology_live,
    topologywaits,
    webhookflood,
)
from .hotpath import HotPathRow, run_hotpath
from .memory import MemoryRow, run_memory
from .prepare import mig_table, prepare_table, recovery_table, run_mig, run_prepare, run_recovery

# What --only picks; 2, 3, 8 and 9 need the local control plane.
BENCHMARKS = (
    "hotpath",
    "e2e",
    "reaction",
    "memory",
    "prepare",
    "fairshare",
    "planning",
    "reclaim",
    "packing",
    "webhookflood",
    "codec",
    "queuecycle",
    "topology",
    "topologywaits",
    "history",
    "history_weeks",
    "scale",
    "topology_live",
    "fragmented",
)
ON_A_CLUSTER = ("e2e", "reaction", "reclaim", "packing", "scale", "topology_live", "fragmented")
# The smoke's in-process sizes: one small cluster picture, a fraction of a second per hot-path case.
SMOKE_NODES = [50]
SMOKE_PODS = 400
SMOKE_HOT_SECONDS = 0.3


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, {platform.system()}"


def hotpath_table(rows: Sequence[HotPathRow]) -> str:
    headers = [
        "nodes",
        "pods",
        "mode",
        "cycles",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "filter p99",
        "prio p99",
        "floor cycles/s",
        "floor p50",
        "floor p99",
        "p50 / floor",
        "p99 / floor",
        "rate / floor",
        "fast p50",
        "fast p99",
        "p50 / fast",
        "p99 / fast",
        "cpu ms",
        "fast cpu ms",
        "cpu / fast",
    ]
    body = [
        [
            str(r.nodes),
            str(r.pods),
            r.mode,
            str(r.tessera.cycles),
            f"{r.tessera.cycles_per_s:.1f}",
            f"{r.tessera.p50_ms:.2f}",
            f"{r.tessera.p99_ms:.2f}",
            f"{r.tessera.filter_p99_ms:.2f}",
            f"{r.tessera.prioritize_p99_ms:.2f}",
            f"{r.floor.cycles_per_s:.1f}",
            f"{r.floor.p50_ms:.2f}",
            f"{r.floor.p99_ms:.2f}",
            f"{r.p50_ratio:.2f}x",
            f"{r.p99_ratio:.2f}x",
            f"{r.throughput_ratio:.2f}x",
            f"{r.fast_floor.p50_ms:.2f}",
            f"{r.fast_floor.p99_ms:.2f}",
            f"{r.fast_p50_ratio:.2f}x",
            f"{r.fast_p99_ratio:.2f}x",
            f"{r.tessera.server_cpu_ms:.2f}",
            f"{r.fast_floor.server_cpu_ms:.2f}",
            f"{r.fast_cpu_ratio:.2f}x",
        ]
        for r in rows
    ]
    return format_table(headers, body)


def memory_table(row: MemoryRow) -> str:
    headers = ["nodes", "pods", "objects", "extender RSS MiB", "floor RSS MiB", "RSS / floor", "bytes/object"]
    return format_table(
        headers,
        [
            [
                str(row.nodes),
                str(row.pods),
                str(row.objects),
                f"{row.rss_mib:.0f}",
                f"{row.floor_rss_mib:.0f}",
                f"{row.ratio:.1f}x",
                f"{row.bytes_per_object:.0f}",
            ]
        ],
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="the issue's sizes (slower, more memory)")
    parser.add_argument(
        "--only",
        choices=BENCHMARKS,
        help="run one benchmark",
    )
    parser.add_argument("--no-cluster", action="store_true", help="skip 2, 3, 8 and 9 (local control plane)")
    parser.add_argument("--seconds", type=float, help="measuring time per hot-path case")
    parser.add_argument(
        "--hot-nodes", help="hot-path cluster sizes, comma-separated (default 500,5000)", default="500,5000"
    )
    parser.add_argument(
        "--queue-tree",
        action="store_true",
        help="hot path with 1000 queues in three levels (node names only) instead of two queues",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs of each scheduler in 2, 3 and 5; the median is reported (default 3)",
    )
    parser.add_argument("--no-kai", action="store_true", help="leave KAI Scheduler out of 2, 3 and 8")
    parser.add_argument("--smoke", action="store_true", help=f"every benchmark module: {SMOKE_HELP}")
    args = parser.parse_args(list(argv) if argv is not None else None)
    smoke = ["--smoke"] if args.smoke else []
    cluster_args = [
        f"--rounds={args.rounds}",
        *(["--full"] if args.full else []),
        *(["--no-kai"] if args.no_kai else []),
        *smoke,
    ]

    hot_nodes = SMOKE_NODES if args.smoke else [int(n) for n in args.hot_nodes.split(",")]
    hot_pods = SMOKE_PODS if args.smoke else 50_000 if args.full else 20_000
    mem_nodes, mem_pods = (
        (SMOKE_NODES[0], SMOKE_PODS) if args.smoke else (5000, 100_000) if args.full else (1000, 20_000)
    )
    seconds = SMOKE_HOT_SECONDS if args.smoke else args.seconds or (10.0 if args.full else 3.0)
    print(f"Tessera benchmarks, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {_machine()}")
    failed = False  # a benchmark that could not run (it said why), the others run all the same
    if args.only in (None, "hotpath"):
        print(f"\n[1] extender hot path over HTTP, {seconds:g} s per case (cycle = filter + prioritize)")
        modes = ("names",) if args.queue_tree else ("names", "nodelist")
        rows = run_hotpath(hot_nodes, hot_pods, seconds, tree=args.queue_tree, modes=modes)
        print(hotpath_table(rows))
    for name, runner in (("e2e", e2e.main), ("reaction", reaction.main)):
        if args.only in (None, name) and not (args.no_cluster and args.only is None):
            failed |= runner(cluster_args) != 0
    if args.only in (None, "memory"):
        print(f"\n[4] extender memory, {mem_nodes} nodes x 8 GPUs, {mem_pods} pods in the picture")
        print(memory_table(run_memory(mem_nodes, mem_pods)))
    if args.only in (None, "prepare"):
        print(f"\n[5] {prepare.TITLE}")
        print(prepare_table(run_prepare(*prepare.SMOKE if args.smoke else ())))
        print(f"\n[5 MIG] {prepare.MIG_TITLE}")
        print(mig_table(run_mig(prepare.SMOKE[1] if args.smoke else 400)))
        print(f"\n[5b] {prepare.RECOVERY_TITLE}")
        print(
            recovery_table(
                run_recovery(prepare.SMOKE_RECOVERY_CLAIMS if args.smoke else prepare.RECOVERY_CLAIMS)
            )
        )
    if args.only in (None, "fairshare"):
        failed |= fairshare.main(smoke) != 0
    if args.only in (None, "planning"):
        failed |= planning.main(smoke or ([] if args.full else ["--nodes", "1000", "--pods", "10000"])) != 0
    if args.only in (None, "reclaim") and not (args.no_cluster and args.only is None):
        failed |= reclaim.main(cluster_args) != 0
    if args.only in (None, "packing") and not (args.no_cluster and args.only is None):
        failed |= packing.main(smoke) != 0
    if args.only in (None, "webhookflood"):
        print("\n[12] webhook flood")
        failed |= webhookflood.main(smoke) != 0
    # Not in the full run (their own commands measure them); in the smoke, so they keep working.
    for name, module_main in (
        ("codec", codec.main),
        ("queuecycle", queuecycle.main),
        ("topology", topology.main),
        ("topologywaits", topologywaits.main),
        ("history", history.main),
        ("history_weeks", history_weeks.main),
    ):
        if args.only == name or (args.only is None and args.smoke):
            failed |= module_main(smoke) != 0
    if args.only == "scale" or (args.only is None and args.smoke and not args.no_cluster):
        failed |= scale.main(cluster_args) != 0
    if args.only == "topology_live" or (args.only is None and args.smoke and not args.no_cluster):
        failed |= topology_live.main(cluster_args) != 0
    if args.only == "fragmented" or (args.only is None and args.smoke and not args.no_cluster):
        failed |= fragmented.main(cluster_args) != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
