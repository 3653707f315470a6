"""Running per-queue totals of what pods hold and wait for. Pure: no I/O.

The cluster picture changes a few pods at a time (a bind, a claim allocation, a deletion), so
instead of summing every pod after each change it keeps each pod's last contribution and moves
only the difference: a change costs O(resources of that pod), not O(pods). Besides what each queue
holds and waits for, it keeps what its non-preemptible pods hold (the use a quota guarantees).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from extender.policy.fairness import QueueUsage
from extender.policy.placement import GpuDemand, WorkloadMix, rounded_mix

Bucket = Literal["allocated", "requested", "none"]
# Totals are sums and differences of floats; what is left below this after a pod leaves is zero.
_RESIDUE = 1e-9


@dataclass(frozen=True)
class Contribution:
    """What one pod adds to its queue: held (`allocated`), waited for (`requested`) or neither."""

    queue: str
    bucket: Bucket
    amounts: Mapping[str, float]
    demand: GpuDemand | None = None  # its placement demand (GPUs, CPU, memory), for the workload mix
    preemptible: bool = True  # not: what it holds also counts as its queue's non-preemptible use

    @property
    def gpu_demand(self) -> GpuDemand | None:
        """Its placement demand if it asks for GPUs (what the planners serve), else None."""
        return self.demand if self.demand is not None and self.demand.count else None


def _move(totals: dict[str, dict[str, float]], queue: str, amounts: Mapping[str, float], sign: float) -> None:
    into = totals.setdefault(queue, {})
    for resource, amount in amounts.items():
        value = into.get(resource, 0.0) + sign * amount
        if abs(value) > _RESIDUE:
            into[resource] = value
        else:
            into.pop(resource, None)


@dataclass
class QueueLedger:
    contributions: dict[str, Contribution] = field(default_factory=dict)
    allocated: dict[str, dict[str, float]] = field(default_factory=dict)
    requested: dict[str, dict[str, float]] = field(default_factory=dict)
    non_preemptible: dict[str, dict[str, float]] = field(default_factory=dict)  # of `allocated`
    pending: Counter[str] = field(default_factory=Counter)
    waiting: set[str] = field(default_factory=set)  # pods whose contribution is `requested`
    demands: Counter[GpuDemand] = field(default_factory=Counter)
    _mix: WorkloadMix = field(default_factory=lambda: WorkloadMix(demands=()))
    _mix_stale: bool = False
    # The last `usage` handed out, and the queues whose totals moved since (only those are built
    # again; `take_touched` tells them to whoever keeps something derived from usage).
    _usage: dict[str, QueueUsage] = field(default_factory=dict)
    _named: frozenset[str] = frozenset()
    _moved: set[str] = field(default_factory=set)
    _touched: set[str] = field(default_factory=set)
    # The same for `pending_pods`.
    _pending_pods: dict[str, int] = field(default_factory=dict)
    _pending_moved: set[str] = field(default_factory=set)

    def put(self, key: str, contribution: Contribution | None) -> None:
        """Set the contribution of pod `key` (None: it contributes nothing any more)."""
        old = self.contributions.pop(key, None)
        if old is not None:
            self._account(old, -1.0)
        self.waiting.discard(key)
        if contribution is not None:
            self.contributions[key] = contribution
            self._account(contribution, 1.0)
            if contribution.bucket == "requested":
                self.waiting.add(key)

    def _account(self, contribution: Contribution, sign: float) -> None:
        if contribution.bucket == "allocated":
            _move(self.allocated, contribution.queue, contribution.amounts, sign)
            if not contribution.preemptible:
                _move(self.non_preemptible, contribution.queue, contribution.amounts, sign)
        elif contribution.bucket == "requested":
            _move(self.requested, contribution.queue, contribution.amounts, sign)
            self.pending[contribution.queue] += int(sign)
            self._pending_moved.add(contribution.queue)
        if contribution.bucket != "none":
            self._moved.add(contribution.queue)
            self._touched.add(contribution.queue)
        if contribution.demand is not None:
            self.demands[contribution.demand] += int(sign)
            self._mix_stale = True

    def clear(self) -> None:
        self.contributions.clear()
        self.waiting.clear()
        self.allocated.clear()
        self.requested.clear()
        self.non_preemptible.clear()
        self.pending.clear()
        self.demands.clear()
        self._mix_stale = True
        self._moved.update(self._usage)
        self._touched.update(self._usage)
        self._pending_moved.update(self._pending_pods)

    def usage(self, queues: Iterable[str]) -> dict[str, QueueUsage]:
        """Usage of every queue that is named or has pods (a new mapping when some total moved, the
        last one otherwise; the usage of a queue whose totals did not move since the last call is
        the same object).

        O(queues whose totals moved) while the named queues stay those of the last call (pass the
        same frozenset to skip even comparing them); O(queues) when they change.
        """
        named = queues if isinstance(queues, frozenset) else frozenset(queues)
        if named is not self._named and named != self._named:
            self._named = named
            self._moved.update(named | self.allocated.keys() | self.requested.keys())
            self._usage = {}
        if not self._moved and self._usage:
            return self._usage
        usage = dict(self._usage)
        for queue in self._moved:
            if queue in named or queue in self.allocated or queue in self.requested:
                usage[queue] = QueueUsage(
                    allocated=dict(self.allocated.get(queue, {})),
                    requested=dict(self.requested.get(queue, {})),
                    non_preemptible=dict(self.non_preemptible.get(queue, {})),
                )
            else:  # not named, and its pods are gone (`clear`)
                usage.pop(queue, None)
        self._moved.clear()
        self._usage = usage  # never changed in place: the next call copies it
        return usage

    def take_touched(self) -> set[str]:
        """The queues whose totals moved since the last call (and forget them)."""
        touched, self._touched = self._touched, set()
        return touched

    def pending_pods(self) -> dict[str, int]:
        """Pods waiting in each queue that has some (a new mapping when a count moved, the last
        one otherwise: O(queues whose count moved))."""
        if self._pending_moved:
            pending = dict(self._pending_pods)
            for queue in self._pending_moved:
                count = self.pending.get(queue, 0)
                if count > 0:
                    pending[queue] = count
                else:
                    pending.pop(queue, None)
            self._pending_moved.clear()
            self._pending_pods = pending  # never changed in place: the next call copies it
        return self._pending_pods

    def mix(self) -> WorkloadMix:
        """Placement demands of the pods seen, weighted by how many there are rounded to two
        significant digits (`rounded_mix`; the object is kept while unchanged)."""
        if self._mix_stale:
            fresh = rounded_mix(self.demands)
            if fresh != self._mix:  # keep the object, and what it has cached, while equal
                self._mix = fresh
            self._mix_stale = False
        return self._mix
