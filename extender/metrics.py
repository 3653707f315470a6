"""Prometheus metrics of the extender: verb latency, decisions by reason, per-queue numbers.

Each service instance owns its registry (tests build several apps in one process). Per-queue and
per-GPU gauges are read from the cluster picture at scrape time, so they are never stale. Every
series of a per-queue gauge is one resource (its `resource` label: gpu and gpu/<model> in GPUs,
cpu in cores, memory in bytes), so a query selects one before it sums.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contract.names import GPU_MILLI
from extender.picture.cluster import ClusterPicture

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Filter and prioritize should answer in milliseconds; the scheduler gives up after 5 s.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _QueueCollector(Collector):
    def __init__(self, picture: ClusterPicture) -> None:
        self.picture = picture

    def collect(self) -> Iterator[GaugeMetricFamily]:
        allocated = GaugeMetricFamily(
            "tessera_queue_allocated", "Resources held by a queue's bound pods.", labels=["queue", "resource"]
        )
        fair = GaugeMetricFamily(
            "tessera_queue_fair_share", "Computed fair share of a queue.", labels=["queue", "resource"]
        )
        requested = GaugeMetricFamily(
            "tessera_queue_requested", "Pending demand of a queue.", labels=["queue", "resource"]
        )
        pending = GaugeMetricFamily(
            "tessera_queue_pending_pods", "Pods of a queue waiting to be scheduled.", labels=["queue"]
        )
        quota = GaugeMetricFamily(
            "tessera_queue_quota",
            "A queue's quota (deserved share) of a resource.",
            labels=["queue", "resource"],
        )
        limit = GaugeMetricFamily(
            "tessera_queue_limit",
            "A queue's limit of a resource (none: unlimited).",
            labels=["queue", "resource"],
        )
        if self.picture.ready():
            view = self.picture.fairness()
            for spec in view.specs:
                for resource, amount in spec.quota.items():
                    quota.add_metric([spec.name, resource], amount)
                for resource, amount in spec.limit.items():
                    limit.add_metric([spec.name, resource], amount)
            for queue, usage in view.usage.items():
                for resource, amount in usage.allocated.items():
                    allocated.add_metric([queue, resource], amount)
                for resource, amount in usage.requested.items():
                    requested.add_metric([queue, resource], amount)
                pending.add_metric([queue], view.pending_pods.get(queue, 0))
            for queue, shares in view.fair_shares.items():
                for resource, amount in shares.items():
                    fair.add_metric([queue, resource], amount)
        yield from (allocated, fair, requested, pending, quota, limit)


class _GpuCollector(Collector):
    """Per node and GPU, how much of each GPU is allocated (fractions summed: two quarter-GPU
    claims on a GPU are 0.5 of it)."""

    def __init__(self, picture: ClusterPicture) -> None:
        self.picture = picture

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gpus = GaugeMetricFamily("tessera_node_gpus", "GPUs of a node.", labels=["node"])
        allocated = GaugeMetricFamily(
            "tessera_node_gpus_allocated", "GPUs of a node allocated (fractions summed).", labels=["node"]
        )
        occupancy = GaugeMetricFamily(
            "tessera_gpu_allocated_fraction",
            "The allocated fraction of one GPU (0: idle, 1: whole), by node and GPU index.",
            labels=["node", "gpu"],
        )
        if self.picture.ready():
            for node in sorted(self.picture.kind("Node")):
                free = self.picture.node_gpus(node).free_milli
                if not free:
                    continue
                used = [(GPU_MILLI - milli) / GPU_MILLI for milli in free]
                gpus.add_metric([node], len(free))
                allocated.add_metric([node], sum(used))
                for index, fraction in enumerate(used):
                    occupancy.add_metric([node, str(index)], fraction)
        yield from (gpus, allocated, occupancy)


class ExtenderMetrics:
    def __init__(self, picture: ClusterPicture) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "tessera_extender_request_duration_seconds",
            "Time to answer one extender call.",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "tessera_extender_decisions_total",
            "Pods decided by a verb, by outcome and reason.",
            ["verb", "outcome", "reason"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "tessera_extender_bad_requests_total",
            "Requests refused as malformed or too large.",
            ["verb"],
            registry=self.registry,
        )
        self.requeue_nudges = Counter(
            "tessera_extender_requeue_nudges_total",
            "Refused pods nudged back into the scheduling queue once eligible.",
            registry=self.registry,
        )
        self.evictions = Counter(
            "tessera_reclaim_evictions_total",
            "Pods the reclaim loop asked the Eviction API to evict, by goal (reclaim, preempt), the "
            "victim's queue and outcome (evicted, blocked by a PodDisruptionBudget, gone, timed_out: no "
            "answer within the timeout, failed).",
            ["goal", "queue", "outcome"],
            registry=self.registry,
        )
        self.lost_work = Counter(
            "tessera_reclaim_lost_gpu_seconds_total",
            "Work the reclaim loop's evictions threw away: GPU-seconds the evicted pods had run "
            "(GPUs held x runtime since their start), by the victim's queue.",
            ["queue"],
            registry=self.registry,
        )
        self.holds_lost = Counter(
            "tessera_reclaim_holds_lost_total",
            "Holds of GPUs a plan freed that a pod they were not held for took (one of another "
            "scheduler, which sees no holds); each is let go and its pod planned again.",
            registry=self.registry,
        )
        self.plans = Counter(
            "tessera_reclaim_plans_total",
            "Plans made by the reclaim loop, by goal and the queue they served.",
            ["goal", "queue"],
            registry=self.registry,
        )
        self.reclaim_cycle = Histogram(
            "tessera_reclaim_cycle_duration_seconds",
            "Time to plan one reclaim cycle (snapshot, plan), excluding the API calls.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.reclaim_skipped = Counter(
            "tessera_reclaim_cycles_skipped_total",
            "Reclaim cycles not planned: no waiting pod was one the scheduler could not place, and "
            "consolidation had nothing of its own to do.",
            registry=self.registry,
        )
        self.planning_cut_off = Counter(
            "tessera_planning_cut_off_total",
            "Waiting pods (or nodes to empty) a planning cycle left untried because its work "
            "budget ran out, by planner (reclaim, consolidate, drain); they wait for a later cycle.",
            ["planner"],
            registry=self.registry,
        )
        self.time_to_fair_share = Histogram(
            "tessera_queue_time_to_fair_share_seconds",
            "From a queue being starved (below its fair share with pods waiting) to holding it again.",
            ["queue"],
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=self.registry,
        )
        self.moves = Counter(
            "tessera_consolidation_moves_total",
            "Pods the consolidation loop asked the Eviction API to evict so they are recreated "
            "elsewhere, by goal (consolidate, drain) and outcome (evicted, blocked by a "
            "PodDisruptionBudget, gone, timed_out, failed).",
            ["goal", "outcome"],
            registry=self.registry,
        )
        self.move_plans = Counter(
            "tessera_consolidation_plans_total",
            "Consolidation plans by goal and result (carried_out; blocked or failed: a move could "
            "not be made, the plan was dropped).",
            ["goal", "result"],
            registry=self.registry,
        )
        self.gpus_freed = Counter(
            "tessera_consolidation_gpus_freed_total",
            "GPUs made usable by carried-out consolidation plans: the served pod's GPUs on its node "
            "(consolidate), or the GPUs of an emptied node (drain).",
            ["goal"],
            registry=self.registry,
        )
        self.replacements = Counter(
            "tessera_consolidation_replacements_total",
            "Moved pods whose controller's new pod was bound within the timeout (replaced) or not "
            "(not_replaced).",
            ["outcome"],
            registry=self.registry,
        )
        self.replace_seconds = Histogram(
            "tessera_consolidation_replace_seconds",
            "From a pod's eviction by a move to its successor (a new pod of the same controller) "
            "being bound.",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.consolidation_cycle = Histogram(
            "tessera_consolidation_cycle_duration_seconds",
            "Time to plan consolidation in one cycle, excluding the API calls.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_QueueCollector(picture))
        self.registry.register(_GpuCollector(picture))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merged_exposition(own: bytes, other: bytes) -> bytes:
    """Two processes' metrics as one text exposition: the samples of a family both have go under
    one HELP and TYPE (Prometheus refuses a family named twice). A family is the lines from its
    `# HELP` line to the next, as prometheus_client writes them."""
    families: dict[bytes, tuple[list[bytes], list[bytes]]] = {}  # name: (HELP and TYPE, samples)
    for text in (own, other):
        family: tuple[list[bytes], list[bytes]] = ([], [])
        first = False
        for line in text.splitlines(keepends=True):
            if line.startswith(b"# HELP "):
                name = line.split(b" ", 3)[2]
                first = name not in families
                family = families.setdefault(name, ([], []))
            if line.startswith((b"# HELP ", b"# TYPE ")):
                if first:
                    family[0].append(line)
            else:
                family[1].append(line)
    return b"".join(b"".join(header) + b"".join(samples) for header, samples in families.values())
