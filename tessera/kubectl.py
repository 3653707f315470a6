"""`kubectl tessera`: the queues, why a pod waits, who holds which GPU, a pod's place in line.

A kubectl plugin (the `kubectl-tessera` executable the package installs; kubectl runs any
`kubectl-<name>` on the PATH as `kubectl <name>`). It reads only the Kubernetes API (the
kubeconfig kubectl uses: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`) and the
extender's queue report (`extender.statusapi`, `GET /status/queues`), fetched through the API
server's service proxy (the chart's `<release>-extender-metrics` Service, port `metrics`) or
from `--extender-url` (a `kubectl port-forward`, or a local `tessera up`). It changes nothing.

* `queues`: the queue tree from the Queue objects (spec and the status the extender writes): GPU
  quota, limit, over-quota weight, allocated, fair share, borrowed (allocated beyond quota),
  pending GPUs, waiting workloads; and, from the report, the pods waiting in each queue.
* `why POD`: the pod's queue, the admission decision the extender wrote on it (the
  `QueueAdmitted` condition: reason, the numbers, what would let it run,
  `extender.policy.waiting`), its queue's numbers, its workload (the controller and how many of
  its pods are bound), kube-scheduler's own condition, its place in line and its latest events.
* `gpus`: per node and GPU (the driver's ResourceSlices), the fraction each claim holds
  (`consumedCapacity.memory` over the GPU's memory; a whole GPU when none is given) and the pods
  it is reserved for (a time-sliced GPU: one claim, several pods).
* `position POD`: the pod's place among its queue's pending pods in the scheduler's order
  (priority, then creation), with those ahead of it and whether the planners make room for each.

The formatting functions take plain API JSON and return lines; `main` only fetches and prints.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient

from contract.kube import controller_of, mapping, meta, sequence
from contract.names import DRIVER_NAME, MEMORY_CAPACITY, MIN_MEMBERS_ANNOTATION, MODEL_ATTRIBUTE, QUEUE_LABEL
from contract.quantity import parse_quantity
from extender.claims import allocated_devices
from extender.kubeapi import JsonObject, KubeError, request
from extender.policy.fairness import format_amount
from extender.policy.waiting import as_written, wait_reason
from extender.status import ADMITTED_CONDITION
from extender.statusapi import STATUS_PATH
from extender.webhook_process import api_client

QUEUES_PATH = "/apis/scheduling.tessera.dev/v1alpha1/queues"
DEFAULT_NAMESPACE = "tessera-system"
DEFAULT_SERVICE = "tessera-extender-metrics:metrics"
LATEST_EVENTS = 5
Report = Mapping[str, Any]


# ---- formatting (pure) ---------------------------------------------------------------------------


def _gpu(amount: float | None) -> str:
    return "-" if amount is None else format_amount("gpu", amount)


def _amount(section: object, resource: str = "gpu") -> float | None:
    value = mapping(section).get(resource)
    return None if value is None else parse_quantity(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> list[str]:
    """Columns padded to their widest cell; `align` has one letter per column: l(eft), r(ight)."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.ljust(width) if side == "l" else cell.rjust(width)
            for cell, width, side in zip(row, widths, align, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _tree_order(queues: Sequence[JsonObject]) -> list[tuple[int, JsonObject]]:
    """Queues depth-first from the roots (by name), each with its depth; a queue whose parent is
    missing is shown as a root, so none is hidden."""
    by_name = {str(meta(q).get("name")): q for q in queues}
    children: dict[str | None, list[str]] = {}
    for name, queue in by_name.items():
        parent = mapping(queue.get("spec")).get("parent")
        children.setdefault(parent if parent in by_name else None, []).append(name)
    ordered: list[tuple[int, JsonObject]] = []

    def walk(parent: str | None, depth: int) -> None:
        for name in sorted(children.get(parent, [])):
            ordered.append((depth, by_name[name]))
            walk(name, depth + 1)

    walk(None, 0)
    return ordered


def queue_lines(queues: Sequence[JsonObject], report: Report | None) -> list[str]:
    """The `queues` table: one row per queue, children indented under their parent.

    BORROWED is allocated beyond quota (allocated 14, quota 6: 8); WAITING is the waiting
    workloads of the Queue status; PODS the queue's pending pods in the extender's report ("?"
    without one)."""
    waiting = mapping(report.get("waiting")) if report else {}
    rows = []
    for depth, queue in _tree_order(queues):
        name = str(meta(queue).get("name"))
        spec, status = mapping(queue.get("spec")), mapping(queue.get("status"))
        gpu = mapping(mapping(spec.get("resources")).get("gpu"))
        quota = _amount(gpu, "quota")
        allocated = _amount(status.get("allocated"))
        borrowed = max(0.0, (allocated or 0.0) - (quota or 0.0)) if allocated is not None else None
        weight = gpu.get("overQuotaWeight", 1)
        rows.append(
            [
                "  " * depth + name,
                str(spec.get("priority", 0)),
                _gpu(quota),
                _gpu(_amount(gpu, "limit")),
                str(weight),
                _gpu(allocated),
                _gpu(_amount(status.get("fairShare"))),
                _gpu(borrowed),
                _gpu(_amount(status.get("requested"))),
                str(status.get("waitingWorkloads", "-")),
                str(len(sequence(waiting.get(name)))) if report else "?",
            ]
        )
    header = ["QUEUE", "PRIO", "QUOTA", "LIMIT", "WEIGHT", "ALLOC", "FAIR", "BORROWED", "PENDING"]
    return _table([*header, "WAITING", "PODS"], rows, "l" + "r" * 10)


def admission_lines(pod: JsonObject) -> list[str]:
    """What the extender wrote on the pod: its `QueueAdmitted` condition, split into the reason,
    the numbers and what would let it run (the suffix `extender.policy.waiting` appends)."""
    conditions = [mapping(c) for c in sequence(mapping(pod.get("status")).get("conditions"))]
    condition = next((c for c in conditions if c.get("type") == ADMITTED_CONDITION), None)
    if condition is None:
        return ["admission: nothing written yet (the extender has not judged it, or it is not a queue's pod)"]
    reason, message = str(condition.get("reason", "")), str(condition.get("message", ""))
    if condition.get("status") == "True":
        return [f"admission: admitted ({reason}): {message}"]
    code, numbers = as_written(reason, message)
    lines = [f"admission: waiting ({reason}): {numbers}"]
    lets_it_go = wait_reason(code).lets_it_go if code else ""
    lines.append(f"  would let it run: {lets_it_go or 'see the numbers above'}")
    return lines


def workload_lines(pod: JsonObject, siblings: Sequence[JsonObject]) -> list[str]:
    """The pod's workload: its controller, how many of its pods are bound, and the minimum it is
    admitted by when it declares one (a gang). `siblings`: the pods of its namespace."""
    owner = controller_of(pod)
    minimum = mapping(meta(pod).get("annotations")).get(MIN_MEMBERS_ANNOTATION)
    if not owner.get("uid"):
        return ["workload: the pod alone (no controller)"]
    members = [p for p in siblings if controller_of(p).get("uid") == owner.get("uid")]
    bound = sum(1 for p in members if mapping(p.get("spec")).get("nodeName"))
    gang = f", admitted whole at {minimum} (min-members)" if minimum else ""
    return [f"workload: {owner.get('kind')} {owner.get('name')}: {len(members)} pods, {bound} bound{gang}"]


def _place(pod_key: str, report: Report | None, queue: str) -> tuple[int, list[Mapping[str, Any]]] | None:
    """The pod's 1-based place in its queue's line and the line; None when it is not in it."""
    if not report:
        return None
    line = [mapping(entry) for entry in sequence(mapping(report.get("waiting")).get(queue))]
    for place, entry in enumerate(line, start=1):
        if entry.get("pod") == pod_key:
            return place, line
    return None


def why_lines(
    pod: JsonObject,
    queue: JsonObject | None,
    siblings: Sequence[JsonObject],
    events: Sequence[JsonObject],
    report: Report | None,
) -> list[str]:
    """The `why POD` answer (module docstring), from the objects as the API returns them."""
    key = f"{meta(pod).get('namespace')}/{meta(pod).get('name')}"
    spec, status = mapping(pod.get("spec")), mapping(pod.get("status"))
    queue_name = mapping(meta(pod).get("labels")).get(QUEUE_LABEL)
    phase = str(status.get("phase", "Pending"))
    node = spec.get("nodeName")
    lines = [f"pod {key}: {phase}" + (f" on {node}" if node else ", not bound")]
    if queue_name is None and queue is None:
        lines.append(f"queue: none named (no {QUEUE_LABEL} label; its Namespace's default, else 'default')")
    if queue is not None:
        queue_name = str(meta(queue).get("name"))
        queue_spec = mapping(mapping(mapping(queue.get("spec")).get("resources")).get("gpu"))
        queue_status = mapping(queue.get("status"))
        lines.append(
            f"queue {queue_name} (GPUs): allocated {_gpu(_amount(queue_status.get('allocated')))}, "
            f"fair share {_gpu(_amount(queue_status.get('fairShare')))}, "
            f"quota {_gpu(_amount(queue_spec, 'quota'))}, limit {_gpu(_amount(queue_spec, 'limit'))}, "
            f"pending {_gpu(_amount(queue_status.get('requested')))}"
        )
    elif queue_name is not None:
        lines.append(f"queue {queue_name}: no such Queue")
    gates = [str(mapping(g).get("name")) for g in sequence(spec.get("schedulingGates"))]
    if gates:
        lines.append(f"scheduling gates: {', '.join(gates)}")
    lines += admission_lines(pod)
    lines += workload_lines(pod, siblings)
    conditions = [mapping(c) for c in sequence(status.get("conditions"))]
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") != "True":
        lines.append(f"scheduler: {scheduled.get('reason', '')}: {scheduled.get('message', '')}")
    if not node and queue_name is not None:
        lines += _position_summary(key, report, str(queue_name))
    if events:
        lines.append("events (newest last):")
        for event in events[-LATEST_EVENTS:]:
            lines.append(f"  {event.get('type', '')} {event.get('reason', '')}: {event.get('message', '')}")
    return lines


def _position_summary(key: str, report: Report | None, queue: str) -> list[str]:
    if report is None:
        return ["place in line: unknown (no extender report)"]
    found = _place(key, report, queue)
    if found is None:
        return [f"place in line: not among queue {queue}'s pending pods in the extender's report"]
    place, line = found
    planned = (
        "the planners make room for it" if line[place - 1].get("planned") else "no room planned for it yet"
    )
    return [f"place in line: {place} of {len(line)} pending in queue {queue} ({planned})"]


def position_lines(pod: JsonObject, report: Report) -> list[str]:
    """The `position POD` answer: the pod's place, and the queue's line up to it."""
    key = f"{meta(pod).get('namespace')}/{meta(pod).get('name')}"
    queue = next(
        (name for name, line in mapping(report.get("waiting")).items() if _place(key, report, name)),
        None,
    )
    if queue is None:
        return [f"pod {key} is not pending in any queue (bound, finished, or not a queue's pod)"]
    found = _place(key, report, queue)
    assert found is not None  # (the queue was picked by it)
    place, line = found
    lines = [f"pod {key}: {place} of {len(line)} pending in queue {queue} (order: priority, then creation)"]
    rows = []
    for number, entry in enumerate(line[:place], start=1):
        created = datetime.fromtimestamp(float(entry.get("created", 0)), UTC).strftime("%H:%M:%S")
        rows.append(
            [
                f"{number}{' *' if number == place else ''}",
                str(entry.get("pod")),
                str(entry.get("priority", 0)),
                created,
                _gpu(float(entry.get("gpu", 0.0))),
                "yes" if entry.get("planned") else "no",
                str(entry.get("code") or "-"),
            ]
        )
    return lines + _table(["#", "POD", "PRIO", "CREATED", "GPU", "PLANNED", "WAITS FOR"], rows, "llrrrll")


@dataclass(frozen=True)
class Holding:
    claim: str  # namespace/name
    pods: tuple[str, ...]
    fraction: float  # of the GPU


def gpu_lines(
    slices: Sequence[JsonObject], claims: Sequence[JsonObject], driver: str = DRIVER_NAME
) -> list[str]:
    """The `gpus` table: every device of the driver's slices, node by node in slice order, with
    what it holds in all (a sum of fractions, 1 for a whole or time-sliced GPU) and who holds it.

    A claim of 20Gi on an 80Gi GPU holds 20/80 = 0.25 of it; a claim without consumedCapacity holds
    the GPU whole, however many pods it is reserved for (time-slicing)."""
    devices: list[tuple[str, str, str, str, float]] = []  # node, pool, device, model, memory bytes
    pools: dict[tuple[str, str], float] = {}  # (pool, device) -> memory bytes
    for obj in slices:
        spec = mapping(obj.get("spec"))
        if spec.get("driver") != driver:
            continue
        pool = str(mapping(spec.get("pool")).get("name", ""))
        for device in sequence(spec.get("devices")):
            device = mapping(device)
            attributes = mapping(device.get("attributes"))
            product = mapping(
                attributes.get(MODEL_ATTRIBUTE) or attributes.get(f"{driver}/{MODEL_ATTRIBUTE}")
            )
            memory = parse_quantity(
                mapping(mapping(device.get("capacity")).get(MEMORY_CAPACITY)).get("value", 0)
            )
            name = str(device.get("name"))
            node = str(spec.get("nodeName") or pool)
            devices.append((node, pool, name, str(product.get("string", "")), memory))
            pools[(pool, name)] = memory
    held: dict[tuple[str, str], list[Holding]] = {}
    for claim in claims:
        namespace = meta(claim).get("namespace")
        reserved = tuple(
            f"{namespace}/{mapping(ref).get('name')}"
            for ref in sequence(mapping(claim.get("status")).get("reservedFor"))
            if mapping(ref).get("resource") == "pods"
        )
        claim_key = f"{namespace}/{meta(claim).get('name')}"
        for device in allocated_devices(claim):
            if device.driver != driver:
                continue
            memory = pools.get((device.pool, device.device), 0.0)
            fraction = (
                device.consumed_memory / memory if device.consumed_memory is not None and memory else 1.0
            )
            held.setdefault((device.pool, device.device), []).append(Holding(claim_key, reserved, fraction))
    rows = []
    for node, pool, name, model, memory in devices:
        holdings = held.get((pool, name), [])
        used = sum(h.fraction for h in holdings)
        who = ", ".join(
            f"{'+'.join(h.pods) or h.claim + ' (no pod)'} {h.fraction:.2f}".strip() for h in holdings
        )
        rows.append([node, name, model, format_amount("memory", memory), f"{used:.2f}", who or "-"])
    if not rows:
        return [f"no devices of driver {driver} in any ResourceSlice"]
    return _table(["NODE", "GPU", "MODEL", "MEMORY", "USED", "HELD BY (pods, fraction)"], rows, "lllrrl")


# ---- fetching ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None
    extender_url: str
    namespace: str  # the extender's
    service: str  # the extender's metrics Service as NAME:PORT, for the API server's proxy
    pod_namespace: str
    driver: str


async def fetch_report(api: ApiClient, options: Options) -> tuple[Report | None, str]:
    """The extender's queue report, and '' or why there is none."""
    try:
        if options.extender_url:
            timeout = aiohttp.ClientTimeout(total=10)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.get(options.extender_url.rstrip("/") + STATUS_PATH) as response,
            ):
                response.raise_for_status()
                report: Report = await response.json()
        else:
            path = f"/api/v1/namespaces/{options.namespace}/services/{options.service}/proxy{STATUS_PATH}"
            report = await request(api, "GET", path)
    except (KubeError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
        where = options.extender_url or f"service {options.namespace}/{options.service}"
        return None, f"no report from the extender ({where}): {exc}"
    if not report.get("ready"):
        return None, "the extender's picture of the cluster is not synced yet"
    return report, ""


async def _items(api: ApiClient, path: str, **query: str) -> list[JsonObject]:
    listing = await request(api, "GET", path, query=query or None)
    return [dict(mapping(item)) for item in sequence(listing.get("items"))]


async def _pod(api: ApiClient, options: Options, name: str) -> JsonObject:
    return await request(api, "GET", f"/api/v1/namespaces/{options.pod_namespace}/pods/{name}")


async def run(api: ApiClient, options: Options, command: str, pod_name: str) -> tuple[list[str], str]:
    """The lines `command` prints, and a note for stderr ('' when none)."""
    if command == "queues":
        queues = await _items(api, QUEUES_PATH)
        report, note = await fetch_report(api, options)
        return queue_lines(queues, report), note
    if command == "gpus":
        slices = await _items(api, "/apis/resource.k8s.io/v1/resourceslices")
        claims = await _items(api, "/apis/resource.k8s.io/v1/resourceclaims")
        return gpu_lines(slices, claims, options.driver), ""
    pod = await _pod(api, options, pod_name)
    report, note = await fetch_report(api, options)
    if command == "position":
        if report is None:
            raise CommandError(note)
        return position_lines(pod, report), ""
    namespace = options.pod_namespace
    queue_name = mapping(meta(pod).get("labels")).get(QUEUE_LABEL)
    queue: JsonObject | None = None
    if queue_name:
        try:
            queue = await request(api, "GET", f"{QUEUES_PATH}/{queue_name}")
        except KubeError as exc:
            if exc.status != 404:
                raise
    siblings = await _items(api, f"/api/v1/namespaces/{namespace}/pods")
    events = await _items(
        api,
        f"/api/v1/namespaces/{namespace}/events",
        fieldSelector=f"involvedObject.kind=Pod,involvedObject.name={pod_name}",
    )
    events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return why_lines(pod, queue, siblings, events, report), note


class CommandError(Exception):
    """A command cannot answer; the message says why."""


def _kubeconfig(given: str | None) -> str | None:
    """The kubeconfig kubectl would use; None: in a pod, the service account."""
    if given:
        return given
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"].split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.exists() else None


async def _main(options: Options, command: str, pod_name: str) -> int:
    async with await api_client(_kubeconfig(options.kubeconfig)) as api:
        try:
            lines, note = await run(api, options, command, pod_name)
        except KubeError as exc:
            print(f"kubectl-tessera: {exc}", file=sys.stderr)
            return 1
        except CommandError as exc:
            print(f"kubectl-tessera: {exc}", file=sys.stderr)
            return 1
    print("\n".join(lines))
    if note:
        print(f"(note: {note})", file=sys.stderr)
    return 0


def parse_args(argv: Sequence[str] | None) -> tuple[Options, str, str]:
    # The options go on every subcommand, so they may follow it, as with kubectl itself
    # (`kubectl tessera why train-0 -n ml`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    common.add_argument(
        "-n", "--namespace", default="default", help="the pod's namespace (default 'default')"
    )
    common.add_argument(
        "--extender-url",
        default="",
        help="the extender's base URL (e.g. a port-forward: http://127.0.0.1:9090); default: the "
        "API server's proxy to the extender's metrics Service",
    )
    common.add_argument("--extender-namespace", default=DEFAULT_NAMESPACE, help="the extender's namespace")
    common.add_argument(
        "--extender-service",
        default=DEFAULT_SERVICE,
        help=f"the extender's metrics Service and port, NAME:PORT (default {DEFAULT_SERVICE})",
    )
    common.add_argument(
        "--driver", default=DRIVER_NAME, help=f"the DRA driver's name (default {DRIVER_NAME})"
    )
    parser = argparse.ArgumentParser(
        prog="kubectl tessera",
        description="Tessera's queues, why a pod waits, GPU holders and queue positions (read-only).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("queues", parents=[common], help="the queue tree: shares, borrowing, waiting")
    commands.add_parser("gpus", parents=[common], help="per node and GPU: who holds what fraction")
    for name, text in (
        ("why", "why a pod waits, and what would let it run"),
        ("position", "a pod's place in its queue"),
    ):
        commands.add_parser(name, parents=[common], help=text).add_argument("pod", help="the pod's name")
    args = parser.parse_args(argv)
    options = Options(
        args.kubeconfig,
        args.extender_url,
        args.extender_namespace,
        args.extender_service,
        args.namespace,
        args.driver,
    )
    return options, args.command, getattr(args, "pod", "")


def main(argv: Sequence[str] | None = None) -> int:
    options, command, pod_name = parse_args(argv)
    return asyncio.run(_main(options, command, pod_name))
