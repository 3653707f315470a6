"""A snapshot of what the extender watches, and its replay: what admission, reclaim and
consolidation do next.

`tessera snapshot` lists, from the API, every kind the extender's picture watches
(`extender.picture.cluster.WATCHED_PATHS`: nodes, pods, ResourceSlices and claims, DeviceClasses,
Queues, Namespaces, Jobs) and writes them to one JSON file. `tessera simulate snapshot FILE`
builds the extender's own `ClusterPicture` from it - the same parsing, accounting and fair
shares - and asks the same policy code the live extender asks:

* admission: every pending pod, in its queue's order (priority, then creation), gets the filter's
  decision with every node a candidate (`extender.verbs.waiting_decision`, as the extender's
  status writer judges pods kube-scheduler found no node for: the queue's tenancy, the rule of
  `extender.policy.admission.admit`, a gang judged whole): refused with its reason code and
  numbers, or admitted - and, when kube-scheduler found no node for it, why it waits with the
  code and numbers the extender writes on it (reclaim comes for it, or it waits for free GPUs);
* reclaim: the reclaim loop's next cycle (`extender.policy.reclaim.plan` on the picture's
  snapshot and waiting list, with the queues' rules): each plan's served pod, goal and victims;
* consolidation: the same cycle's follow-up (`extender.policy.consolidation.plan_moves`, with
  reclaim's plans applied first, as the executor gets them): the running pods it would move so a
  waiting pod reclaim does not serve fits, with the extender's default rules except the minimum
  run time before a move (`--move-min-runtime`, the extender's flag of that name).

"What if" edits change the objects before the picture reads them: `--quota QUEUE=N` and
`--limit QUEUE=N` set a queue's GPU quota or limit, `--add-queue NAME=QUOTA` adds a root queue,
`--add-nodes N` clones the first GPU node (its Node and ResourceSlices) N times. What the
extender keeps only in memory is not in a snapshot: slots it holds for pods it reclaimed or
moved for, nodes it is draining, moves a disruption budget blocked lately.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.kube import mapping, meta, sequence
from contract.names import DRIVER_NAME
from extender.kubeapi import JsonObject, request
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from extender.picture.demands import pod_created
from extender.policy.consolidation import ConsolidationRules, MovePlan, plan_moves
from extender.policy.fairness import AdmissionDecision
from extender.policy.reclaim import Budget, Plan, Rules, plan
from extender.verbs import unschedulable, waiting_decision, why_unplaced
from extender.webhook_process import api_client

SNAPSHOT_VERSION = 1


async def take(api: ApiClient) -> dict[str, Any]:
    """Every watched kind, listed now."""
    objects: dict[str, list[JsonObject]] = {}
    for kind, path in WATCHED_PATHS.items():
        listing = await request(api, "GET", path)
        objects[kind] = [dict(mapping(item)) for item in sequence(listing.get("items"))]
    taken = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"version": SNAPSHOT_VERSION, "taken": taken, "objects": objects}


@dataclass(frozen=True)
class WhatIf:
    quotas: Mapping[str, float]  # queue -> GPU quota
    limits: Mapping[str, float]  # queue -> GPU limit
    new_queues: Mapping[str, float]  # name -> GPU quota
    new_nodes: int = 0


def edited(
    objects: Mapping[str, Sequence[JsonObject]], what_if: WhatIf, driver: str
) -> dict[str, list[JsonObject]]:
    """The objects with the edits applied (the snapshot itself is not changed)."""
    result = {kind: [copy.deepcopy(obj) for obj in items] for kind, items in objects.items()}
    queues = result.setdefault("Queue", [])
    for name, quota in what_if.new_queues.items():
        queues.append({"metadata": {"name": name}, "spec": {"resources": {"gpu": {"quota": quota}}}})
    for queue in queues:
        name = str(meta(queue).get("name"))
        gpu = queue.setdefault("spec", {}).setdefault("resources", {}).setdefault("gpu", {})
        if name in what_if.quotas:
            gpu["quota"] = what_if.quotas[name]
        if name in what_if.limits:
            gpu["limit"] = what_if.limits[name]
    slices = [s for s in result.get("ResourceSlice", []) if mapping(s.get("spec")).get("driver") == driver]
    if what_if.new_nodes and slices:
        model = str(mapping(slices[0].get("spec")).get("nodeName"))
        node = next(n for n in result.get("Node", []) if meta(n).get("name") == model)
        for index in range(what_if.new_nodes):
            name = f"{model}-what-if-{index}"
            clone = copy.deepcopy(node)
            clone["metadata"] = {**clone["metadata"], "name": name, "uid": f"what-if-{index}"}
            result["Node"].append(clone)
            for original in (s for s in slices if mapping(s.get("spec")).get("nodeName") == model):
                copied = copy.deepcopy(original)
                copied["metadata"] = {"name": f"{meta(original).get('name')}-what-if-{index}"}
                copied["spec"]["nodeName"] = name
                copied["spec"]["pool"] = {**copied["spec"]["pool"], "name": name}
                result["ResourceSlice"].append(copied)
        # kube-scheduler tries the pods it found no node for again when a node comes: what it
        # found before says nothing of the new nodes.
        for pod in result.get("Pod", []):
            if unschedulable(pod):
                status = pod["status"]
                status["conditions"] = [c for c in status["conditions"] if c.get("type") != "PodScheduled"]
    return result


def picture_of(objects: Mapping[str, Sequence[JsonObject]], config: PictureConfig) -> ClusterPicture:
    picture = ClusterPicture(config)
    for kind in WATCHED_PATHS:
        picture.replace(kind, list(objects.get(kind, [])))
    return picture


@dataclass(frozen=True)
class Decision:
    pod: str
    queue: str
    admitted: bool
    code: str
    reason: str
    no_node: bool = False  # admitted, and kube-scheduler found no node for it


def admissions(picture: ClusterPicture) -> list[Decision]:
    """For every pending pod of a queue, in queue order, the admission decision with every node a
    candidate (`extender.verbs.waiting_decision`: its queue's tenancy, the admission rule, a gang
    judged whole); for one admitted that kube-scheduler found no node for, why it waits as the
    extender writes it on the pod (`why_unplaced`: reclaim comes for it, or free GPUs must)."""
    nodes = list(picture.kind("Node"))
    gangs: dict[str, AdmissionDecision] = {}
    found: list[tuple[tuple[str, int, float, str], Decision]] = []
    for key, pod in picture.kind("Pod").items():
        if not picture.is_pending(key, pod):
            continue
        demand = picture.demand(pod)
        if demand.problem or not (demand.labelled or demand.wants_gpu):
            continue
        decision, context = waiting_decision(picture, nodes, key, pod, demand, gangs)
        unplaced = decision.admit and unschedulable(pod)
        code, reason = why_unplaced(context) if unplaced else (decision.kind, decision.reason)
        order = (demand.queue, -demand.priority, pod_created(pod), key)
        found.append((order, Decision(key, demand.queue, decision.admit, code, reason, unplaced)))
    return [decision for _, decision in sorted(found, key=lambda item: item[0])]


def reclaim_plans(picture: ClusterPicture, now: float | None = None) -> list[Plan]:
    """The reclaim loop's next plans, with the queues' runtime rules."""
    specs = picture.fairness().specs
    rules = Rules(
        reclaim_min_runtime_s={s.name: s.reclaim_min_runtime_s for s in specs},
        preempt_min_runtime_s={s.name: s.preempt_min_runtime_s for s in specs},
    )
    return plan(
        picture.snapshot(),
        picture.waiting_pods(),
        time.time() if now is None else now,
        rules,
        Budget(rules.max_trials),
    )


def consolidation_moves(
    picture: ClusterPicture, served: Sequence[Plan], rules: ConsolidationRules, now: float | None = None
) -> list[MovePlan]:
    """The consolidation executor's plans in the same cycle, after reclaim's (`served`)."""
    return plan_moves(
        picture.snapshot(), picture.waiting_pods(), time.time() if now is None else now, rules, served
    )


def report(decisions: Sequence[Decision], plans: Sequence[Plan], moves: Sequence[MovePlan]) -> list[str]:
    lines = ["admission (the filter's decision, every node a candidate):"]
    for decision in decisions:
        verdict = (
            f"refused ({decision.code})"
            if not decision.admitted
            else f"admitted, no node fits ({decision.code})"
            if decision.no_node
            else "admitted"
        )
        lines.append(f"  {decision.pod} [{decision.queue}]: {verdict}: {decision.reason}")
    if not decisions:
        lines.append("  no pending pod of a queue")
    lines.append("reclaim (the next cycle's plans):")
    for chosen in plans:
        victims = ", ".join(f"{e.pod.key} [{e.pod.queue}]" for e in chosen.evictions) or "nothing"
        lines.append(
            f"  {chosen.goal} for {chosen.pod.key} [{chosen.pod.queue}] on {chosen.node}: evict {victims}"
        )
    if not plans:
        lines.append("  none")
    lines.append("consolidation (the same cycle's moves, after reclaim's):")
    for move_plan in moves:
        served = f" for {move_plan.pod.key} [{move_plan.pod.queue}]" if move_plan.pod else ""
        moved = ", ".join(f"{m.pod.key} [{m.pod.queue}] to {m.to_node}" for m in move_plan.moves)
        lines.append(f"  {move_plan.goal}{served} on {move_plan.node}: move {moved}")
    if not moves:
        lines.append("  none")
    return lines


def load(path: Path) -> dict[str, list[JsonObject]]:
    snapshot = json.loads(path.read_text())
    if snapshot.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"{path}: not a Tessera snapshot of version {SNAPSHOT_VERSION}")
    return dict(snapshot["objects"])


def _pairs(values: Sequence[str], flag: str) -> dict[str, float]:
    pairs: dict[str, float] = {}
    for value in values:
        name, sep, amount = value.partition("=")
        try:
            pairs[name] = float(amount)
        except ValueError:
            raise SystemExit(f"{flag} wants NAME=GPUS, not {value!r}") from None
        if not sep or not name:
            raise SystemExit(f"{flag} wants NAME=GPUS, not {value!r}")
    return pairs


def snapshot_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera snapshot",
        description="Write the objects the extender watches, from the API, to a file.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the snapshot file (JSON)")
    args = parser.parse_args(argv)

    async def run() -> dict[str, Any]:
        async with await api_client(args.kubeconfig or os.environ.get("KUBECONFIG")) as api:
            return await take(api)

    snapshot = asyncio.run(run())
    args.output.write_text(json.dumps(snapshot))
    counts = ", ".join(f"{len(items)} {kind}" for kind, items in snapshot["objects"].items())
    print(f"[tessera] snapshot {args.output}: {counts}")
    return 0


def simulate_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tessera simulate snapshot",
        description="Replay a snapshot: what the extender's admission, reclaim and consolidation "
        "would do next, with what-if edits.",
    )
    parser.add_argument("file", type=Path, help="a file of `tessera snapshot`")
    parser.add_argument("--driver", default=DRIVER_NAME, help=f"the GPU driver (default {DRIVER_NAME})")
    parser.add_argument(
        "--scheduler-name", action="append", default=[], help="Tessera's schedulers (default: any)"
    )
    parser.add_argument("--quota", action="append", default=[], metavar="QUEUE=GPUS", help="set a GPU quota")
    parser.add_argument("--limit", action="append", default=[], metavar="QUEUE=GPUS", help="set a GPU limit")
    parser.add_argument("--add-queue", action="append", default=[], metavar="NAME=GPUS", help="a new queue")
    parser.add_argument("--add-nodes", type=int, default=0, help="clones of the first GPU node")
    parser.add_argument(
        "--move-min-runtime",
        type=float,
        default=ConsolidationRules().min_runtime_s,
        help="consolidation: seconds a pod has run before it may be moved (the extender's flag; "
        "default %(default)s; `tessera up` runs 15)",
    )
    parser.add_argument("--json", action="store_true", help="print the decisions and plans as JSON")
    args = parser.parse_args(argv)
    try:
        objects = load(args.file)
    except (OSError, ValueError, KeyError) as exc:
        print(f"[tessera] {exc}", file=sys.stderr)
        return 1
    what_if = WhatIf(
        _pairs(args.quota, "--quota"),
        _pairs(args.limit, "--limit"),
        _pairs(args.add_queue, "--add-queue"),
        args.add_nodes,
    )
    config = PictureConfig(
        gpu_drivers=frozenset({args.driver}), scheduler_names=frozenset(args.scheduler_name)
    )
    picture = picture_of(edited(objects, what_if, args.driver), config)
    now = time.time()
    decisions, plans = admissions(picture), reclaim_plans(picture, now)
    moves = consolidation_moves(picture, plans, ConsolidationRules(min_runtime_s=args.move_min_runtime), now)
    if args.json:
        print(
            json.dumps(
                {
                    "admission": [vars(decision) for decision in decisions],
                    "reclaim": [
                        {
                            "goal": chosen.goal,
                            "pod": chosen.pod.key,
                            "node": chosen.node,
                            "evict": [e.pod.key for e in chosen.evictions],
                        }
                        for chosen in plans
                    ],
                    "consolidation": [
                        {
                            "goal": move_plan.goal,
                            "pod": move_plan.pod.key if move_plan.pod else None,
                            "node": move_plan.node,
                            "move": [{"pod": m.pod.key, "to": m.to_node} for m in move_plan.moves],
                        }
                        for move_plan in moves
                    ],
                }
            )
        )
    else:
        print("\n".join(report(decisions, plans, moves)))
    return 0
