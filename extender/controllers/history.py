"""Fair share over time, kept in the cluster: the Lease holder records each queue's usage and
writes its decayed history into the Queue's status; every replica divides shares under it.

Every ``sample_interval_s`` (default 10 s):

* **the leader** records what every queue holds (``FairShareHistory.record``: the allocation seen
  at the previous pass, held since), takes the rule's weight adjustment (new factors at most once
  per update period, default 60 s, moving no queue's share by more than 0.1 of its share with
  history off per minute) and hands it to the
  accounting (``QueueAccounting.adjust_weights``), so the filter, reclaim and ordering divide the
  same history-weighted shares. At most once per update period it patches ``status.history`` of
  the queues whose history moved materially (``QueueHistory.to_status``: the buckets, the
  parameters, the update time, the normalised usage, GPU-hours and the weight factors), and
  posts an Event on a queue whose factor moved by ``event_threshold`` or more since its last one.
* **a standby** reads the histories and factors back from the Queue objects' status and divides
  under those factors, so its shares are the leader's (and knows, from the Queues' parameters,
  whose shares the rule moves: ``history_moves``, for rule 9 of reclaim). When it becomes the
  leader it starts from them: a leader change loses at most what happened since the last write
  (one update period).

Off (no queue enables it, and the cluster-wide default is off): no adjustment is handed over at
all and nothing is written: today's shares.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiClient
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contract.kube import meta
from contract.names import QUEUE_GROUP, QUEUE_KIND, QUEUE_PLURAL, QUEUE_VERSION
from extender.controllers.periodic import PeriodicPass
from extender.events import InvolvedObject, post_event
from extender.kubeapi import MERGE_PATCH, KubeError, request
from extender.picture.cluster import ClusterPicture
from extender.policy.fairness import WeightAdjustment
from extender.policy.history import (
    DEFAULT_MAX_CHANGE_PER_MINUTE,
    DEFAULT_UPDATE_PERIOD_S,
    FairShareHistory,
    HistoryParams,
    HistorySettings,
    QueueHistory,
    history_moves,
    material_changes,
    resolve_params,
)
from extender.queues import history_settings

log = logging.getLogger(__name__)

EVENT_REASON = "FairShareHistory"
HISTORY_SAMPLE_S = 10.0  # usage is recorded this often (at most)


@dataclass(frozen=True)
class HistoryOptions:
    defaults: HistoryParams = field(default_factory=HistoryParams)  # cluster-wide; off
    sample_interval_s: float = HISTORY_SAMPLE_S
    update_period_s: float = DEFAULT_UPDATE_PERIOD_S
    max_change_per_minute: float = DEFAULT_MAX_CHANGE_PER_MINUTE
    event_threshold: float = 0.1  # a factor move worth an Event


def _summary(status: Mapping[str, Any]) -> tuple[object, ...]:
    """What makes a written history worth writing again: its parameters, its usage to 0.1 % of
    the capacity, its GPU-hours to 1 %, its factors to 0.01."""
    hours = float(status.get("gpuHours") or 0.0)
    return (
        status.get("enabled"),
        status.get("halfLifeSeconds"),
        status.get("windowSeconds"),
        status.get("kValue"),
        tuple(sorted((r, round(float(u), 3)) for r, u in (status.get("usage") or {}).items())),
        0 if hours <= 0 else round(math.log(hours) / math.log(1.01)),
        tuple(sorted((r, round(float(f), 2)) for r, f in (status.get("weightFactor") or {}).items())),
    )


class HistoryKeeper:
    def __init__(
        self,
        api: ApiClient,
        picture: ClusterPicture,
        options: HistoryOptions,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.picture, self.options = api, picture, options
        self.is_leader, self.clock = is_leader, clock
        self.rule = FairShareHistory(options.defaults, options.update_period_s, options.max_change_per_minute)
        self.adjustment: WeightAdjustment | None = None
        # The queues whose shares the rule moves (rule 9's wait never opens for them).
        self.moving: frozenset[str] = frozenset()
        self._leading = False
        self._written: dict[str, tuple[object, ...]] = {}  # queue -> summary of its last write
        self._reported: dict[str, dict[str, float]] = {}  # queue -> factors of its last Event
        self._last_write = -math.inf
        self._loop = PeriodicPass(
            "fair-share-history", options.sample_interval_s, picture.ready, self.run_once
        )

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    def _kept(self) -> dict[str, tuple[QueueHistory, dict[str, float], Mapping[str, Any]]]:
        """The histories the Queue objects' status keeps."""
        kept = {}
        for key, obj in self.picture.kind("Queue").items():
            status = (obj.get("status") or {}).get("history")
            found = QueueHistory.from_status(status)
            if found is not None and isinstance(status, Mapping):
                kept[key] = (*found, status)
        return kept

    def _hand_over(self, adjustment: WeightAdjustment | None) -> None:
        if adjustment != self.adjustment:
            self.adjustment = adjustment
            self.picture.adjust_weights(adjustment)

    def _settings(self) -> dict[str, HistorySettings]:
        return {
            key: found
            for key, obj in self.picture.kind("Queue").items()
            for found in (history_settings(obj),)
            if found is not None
        }

    async def run_once(self) -> None:
        now = self.clock()
        if not self.is_leader():
            self._leading = False
            view = self.picture.fairness()
            params = resolve_params(view.tree, self._settings(), self.options.defaults)
            self.moving = history_moves(view.tree, params)
            kept = self._kept()
            self.rule.restore(
                {q: h for q, (h, _, _) in kept.items()}, {q: f for q, (_, f, _) in kept.items()}
            )
            factors = {q: f for q, (_, f, _) in kept.items() if f}
            version = ("status", tuple(sorted((q, tuple(sorted(f.items()))) for q, f in factors.items())))
            self._hand_over(WeightAdjustment(version, factors) if factors else None)
            return
        if not self._leading:  # just took over: start from what the cluster keeps
            kept = self._kept()
            self.rule.restore(
                {q: h for q, (h, _, _) in kept.items()}, {q: f for q, (_, f, _) in kept.items()}
            )
            self._written = {q: _summary(status) for q, (_, _, status) in kept.items()}
            self._reported = {q: dict(f) for q, (_, f, _) in kept.items()}
            self._leading = True
        view = self.picture.fairness()
        self.rule.record(now, view.tree, view.capacity, self._settings())
        self.moving = self.rule.moving
        self._hand_over(self.rule.adjustment(now, view.tree, view.capacity))
        if self.adjustment is not None and now - self._last_write >= self.options.update_period_s:
            self._last_write = now
            await self.write(now)

    async def write(self, now: float) -> int:
        """Patch ``status.history`` of the queues whose history moved materially, post the Events
        of factors that moved; returns how many were written."""
        queues = self.picture.kind("Queue")
        written = 0
        for name, history in sorted(self.rule.histories.items()):
            obj = queues.get(name)
            if obj is None:
                continue
            status = history.to_status(self.rule.factors.get(name, {}))
            summary = _summary(status)
            if self._written.get(name) == summary:
                continue
            path = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}/{name}/status"
            try:
                await request(
                    self.api, "PATCH", path, body={"status": {"history": status}}, content_type=MERGE_PATCH
                )
            except KubeError as exc:
                if exc.status != 404:
                    log.warning("could not write the usage history of queue %s: %s", name, exc)
                continue
            self._written[name] = summary
            written += 1
        for name, moved in material_changes(
            self._reported, self.rule.factors, self.options.event_threshold
        ).items():
            obj, kept = queues.get(name), self.rule.histories.get(name)
            if obj is None or kept is None:
                continue
            message = "; ".join(
                f"{resource}: over-quota weight x{before:.2f} -> x{after:.2f} "
                f"(decayed usage {100 * kept.fraction(resource):.1f}% of the capacity over the window)"
                for resource, (before, after) in moved.items()
            )
            about = InvolvedObject(
                f"{QUEUE_GROUP}/{QUEUE_VERSION}", QUEUE_KIND, "", name, str(meta(obj).get("uid", ""))
            )
            try:
                await post_event(self.api, about, EVENT_REASON, f"fair share over time: {message}")
            except KubeError as exc:
                log.warning("could not post the fair-share history event of queue %s: %s", name, exc)
                continue
            self._reported[name] = dict(self.rule.factors.get(name, {}))
        return written


class HistoryCollector(Collector):
    """The history's gauges, read at scrape time."""

    def __init__(self, keeper: HistoryKeeper) -> None:
        self.keeper = keeper

    def collect(self) -> Iterator[GaugeMetricFamily]:
        usage = GaugeMetricFamily(
            "tessera_queue_historic_usage",
            "A queue's decayed usage over the history window, as a fraction of the decayed capacity.",
            labels=["queue", "resource"],
        )
        hours = GaugeMetricFamily(
            "tessera_queue_historic_gpu_hours",
            "A queue's decayed GPU-hours over the window.",
            labels=["queue"],
        )
        factor = GaugeMetricFamily(
            "tessera_queue_weight_factor",
            "The factor fair share over time puts on a queue's over-quota weight (1: unchanged).",
            labels=["queue", "resource"],
        )
        rule = self.keeper.rule
        for name, history in sorted(rule.histories.items()):
            resources = sorted({r for b in history.buckets for r in b.usage})
            for resource in resources:
                usage.add_metric([name, resource], history.fraction(resource))
                factor.add_metric([name, resource], rule.factors.get(name, {}).get(resource, 1.0))
            hours.add_metric([name], history.resource_seconds("gpu") / 3600.0)
        yield from (usage, hours, factor)
