"""The filter's decision timed in process for two source trees in the same run: an A/B of a change
to the hot path that the HTTP benchmark (`bench.hotpath`) would bury in its noise.

    git archive <base commit> | tar -x -C /tmp/ab_base
    nice -n -15 .venv/bin/python hack/ab_filter.py --base /tmp/ab_base --nodes 1000 5000

Each tree gets one child process per node count, which builds `bench.picture`'s cluster (4 pods
per node) and then, on each turn, calls `decide_filter` for `--calls` new pending pods of one
shape (a whole GPU, or half of one), every node a candidate. The children take turns slice by
slice (the order swapped every round), so that what else runs on the machine weighs on both
alike. Printed: per node count and shape, the median over `--rounds` of each tree's mean time per
call, and the ratio of this tree's to the base's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# Run inside each tree: build the picture once, then time a slice of filter calls per line read.
CHILD = """
import json, sys, time
from bench import picture as bench_picture
from bench.picture import build_picture, leaf_queues, pod_object
from extender.verbs import decide_filter
from extender.wire import ExtenderArgs

nodes = int(sys.argv[1])
built = build_picture(nodes, pods=4 * nodes)
# (`load_state` before issue 27's renames: a base tree of then still loads)
load = getattr(bench_picture, "load_picture", None) or getattr(bench_picture, "load_state")
picture = load(built)
templates = {
    label: pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    for label, pod in built.pending_pods.items()
}
queue = leaf_queues(None)[0]
names = built.node_names
made = 0
print("ready", flush=True)
for line in sys.stdin:
    shape, calls = line.split()
    pods = []
    for _ in range(int(calls)):
        made += 1
        pods.append(pod_object(f"ab-{made:07d}", queue, None, template=templates[shape]))
    start = time.perf_counter()
    for pod in pods:
        decide_filter(picture, ExtenderArgs(Pod=pod, NodeNames=names))
    print(json.dumps((time.perf_counter() - start) / len(pods)), flush=True)
"""

SHAPES = ("whole", "half")


class Child:
    """One tree's picture of one size, timing slices on request."""

    def __init__(self, tree: Path, nodes: int) -> None:
        environment = {**os.environ, "PYTHONPATH": str(tree)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(nodes)],
            cwd=tree,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        if self.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the child in {tree} did not build its picture")

    def slice(self, shape: str, calls: int) -> float:
        """Seconds per filter call over `calls` calls of pods of `shape`."""
        self.stdin.write(f"{shape} {calls}\n")
        self.stdin.flush()
        return float(json.loads(self.stdout.readline()))

    def close(self) -> None:
        self.stdin.close()
        self.process.wait()


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--base", type=Path, required=True, help="the base tree (an exported commit)")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200, help="filter calls per slice")
    args = parser.parse_args(argv)
    this = Path(__file__).resolve().parent.parent
    print(f"{'nodes':>6}  {'shape':<5}  {'base us':>8}  {'this us':>8}  ratio")
    for nodes in args.nodes:
        children = {"base": Child(args.base, nodes), "this": Child(this, nodes)}
        for shape in SHAPES:
            for child in children.values():
                child.slice(shape, args.calls // 4)  # warm up: node kinds, memos, the allocator
            times: dict[str, list[float]] = {"base": [], "this": []}
            for round_ in range(args.rounds):
                order = ("base", "this") if round_ % 2 == 0 else ("this", "base")
                for name in order:
                    times[name].append(children[name].slice(shape, args.calls))
            base, mine = (statistics.median(times[name]) * 1e6 for name in ("base", "this"))
            print(f"{nodes:>6}  {shape:<5}  {base:>8.1f}  {mine:>8.1f}  {mine / base:.3f}x", flush=True)
        for child in children.values():
            child.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
