"""Fair share over time: each queue's past usage, decayed, lowers its over-quota weight.

A queue that ran 40 GPUs all night otherwise gets the same share of the morning's idle capacity
as one that ran nothing. The rule follows KAI Scheduler's time-based fair share (its proportion
plugin and usage database at the pinned revision; docs/queues.md compares the two):

1. **Usage.** Each queue's allocation (its whole subtree's) per resource - GPUs, and CPU or memory
   where some queue declares a quota for them - integrated over time and decayed with a half-life
   ``t_half``: an amount ``A`` held ``dt`` ago counts ``U = 0.5^(dt / t_half) * A``. No half-life:
   no decay. Only the last ``window`` counts (a sliding window, kept as ``BUCKETS_PER_WINDOW``
   buckets of ``window / BUCKETS_PER_WINDOW``: the window's edge moves a bucket at a time).
2. **Normalised to capacity.** The cluster's capacity is integrated and decayed alike, so a
   queue's usage is the fraction of the capacity it held over the window: ``U_i`` in [0, 1]
   (10 GPUs for 10 hours, 24 GPU-hours used: 0.24).
3. **The weight.** Among the children of one parent that take part for a resource (an over-quota
   weight above 0 and some demand), ``W'_i = w_i / sum(w)`` and ``U'_i`` their usage relative to
   the level's - for top-level queues ``U_i`` itself (the fraction of the cluster, as KAI), below
   a parent ``U_i / U_parent`` (siblings are compared with siblings, not with the cluster):

       P_i = max(W'_i + k * (W'_i - U'_i), 0),  normalised: P_i / sum(P)

   and the queue's weight is multiplied by the factor ``P_i / W'_i``, so the level's over-quota
   split follows ``P`` where every taking part queue wants more than it gets. A queue with the
   rule off takes part with ``U'_i = W'_i`` (it neither gains nor loses). Quotas, limits and
   priorities are untouched: only the over-quota weights move (``WeightAdjustment``, whose bounds
   keep a weighted queue weighted).
4. **Smoothly, per queue.** History alone moves each queue's fair share of each resource by at
   most ``max_change_per_minute`` (default 0.1) of its fair share with history off, per minute
   elapsed (``bounded_factors``); the factors are recomputed at most once per update period
   (default 60 s). Bounding each factor instead was not enough: the shares of a level follow the
   ratios of its weights, so a newcomer whose factor rose 0.1 while its two siblings' fell 0.1 got
   1.38 times the bound in a minute. Each level's factors move together, as parts of the level's
   over-quota weight (``W'_i`` times the factor, over their sum), along the straight line to their
   targets, as far along it as the most constrained queue allows (where every queue of the level
   wants more than it gets the shares follow that line, and the furthest point is found at once;
   where demand caps or the weight bounds bend the shares, in a few steps). So history never
   frees a burst of capacity for reclaim at once. And while the rule is on, reclaim serves only a
   queue owed a whole pod among the queues whose shares it moves (``history_moves``: the rule is
   on for a queue of their level or of an ancestor's level; ``Rules.history_moves`` in
   ``extender.policy.reclaim``, rule 9): the shares drift by themselves as the holder's usage
   grows, and a partial deficit would change sides with every pod moved (an eviction storm).

Parameters are per queue (``spec.fairShareHistory``: enabled, halfLife, window, kValue), each one
missing taken from the nearest ancestor that sets it, else the cluster-wide defaults; KAI's
defaults are a one-week sliding window, no half-life and kValue 1.0, and so are these, with the
rule off. Off everywhere: no adjustment at all (None), today's shares bit for bit.

Pure: plain data in, plain data out; the extender's ``controllers.history`` records usage and
keeps it in the Queue objects' status (``QueueHistory.to_status`` / ``from_status``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from extender.policy.fairness import (
    GPU_MODEL_PREFIX,
    FairShareInputs,
    QueueTree,
    WeightAdjustment,
    compute_fair_shares,
)

DAY_S = 24 * 3600.0
DEFAULT_WINDOW_S = 7 * DAY_S  # KAI's default window: one week
DEFAULT_K = 1.0  # KAI's default kValue
DEFAULT_UPDATE_PERIOD_S = 60.0
DEFAULT_MAX_CHANGE_PER_MINUTE = 0.1
BUCKETS_PER_WINDOW = 12
# A factor that moved less than this since the last version is not a new version.
FACTOR_TOLERANCE = 1e-6
# A share within this many units of its bound is within it (the arithmetic's rounding).
SHARE_TOLERANCE = 1e-9
# `bounded_factors` shortens its step at most this many times (then keeps the factors as they were).
MAX_STEPS = 20


@dataclass(frozen=True)
class HistoryParams:
    """The rule's parameters for one queue, resolved (its own, an ancestor's, the defaults)."""

    enabled: bool = False
    half_life_s: float | None = None  # None: no decay
    window_s: float = DEFAULT_WINDOW_S
    k: float = DEFAULT_K


@dataclass(frozen=True)
class HistorySettings:
    """What one Queue object sets (``spec.fairShareHistory``); None: inherited."""

    enabled: bool | None = None
    half_life_s: float | None = None  # 0: no decay (overrides an ancestor's half-life)
    window_s: float | None = None
    k: float | None = None


def resolve_params(
    tree: QueueTree, settings: Mapping[str, HistorySettings], defaults: HistoryParams
) -> dict[str, HistoryParams]:
    """Every queue's parameters: each field from the queue, else its nearest ancestor that sets
    it, else ``defaults``."""
    resolved: dict[str, HistoryParams] = {}
    for name in tree.top_down():
        parent = tree.specs[name].parent
        base = resolved.get(parent, defaults) if parent is not None else defaults
        own = settings.get(name)
        if own is None:
            resolved[name] = base
            continue
        half_life = base.half_life_s if own.half_life_s is None else (own.half_life_s or None)
        resolved[name] = HistoryParams(
            enabled=base.enabled if own.enabled is None else own.enabled,
            half_life_s=half_life,
            window_s=base.window_s if own.window_s is None else own.window_s,
            k=base.k if own.k is None else own.k,
        )
    return resolved


def _decay(elapsed_s: float, half_life_s: float | None) -> float:
    return 1.0 if half_life_s is None else 0.5 ** (elapsed_s / half_life_s)


def decayed_integral(amount: float, start: float, end: float, now: float, half_life_s: float | None) -> float:
    """``amount`` held from ``start`` to ``end``, each second weighed ``0.5^((now - t) / t_half)``:
    ``amount * t_half / ln 2 * (0.5^((now - end) / t_half) - 0.5^((now - start) / t_half))``
    (no half-life: ``amount * (end - start)``)."""
    if half_life_s is None:
        return amount * (end - start)
    return (
        amount
        * half_life_s
        / math.log(2)
        * (_decay(now - end, half_life_s) - _decay(now - start, half_life_s))
    )


@dataclass(frozen=True)
class Bucket:
    """What was held from ``start`` for a bucket's length, decayed to the history's ``updated``."""

    start: float
    usage: Mapping[str, float]  # resource -> resource-seconds of the queue
    capacity: Mapping[str, float]  # resource -> resource-seconds of the cluster


@dataclass(frozen=True)
class QueueHistory:
    """One queue's decayed usage and the capacity it is normalised to, as of ``updated``."""

    updated: float
    params: HistoryParams
    buckets: tuple[Bucket, ...] = ()

    @property
    def bucket_s(self) -> float:
        return self.params.window_s / BUCKETS_PER_WINDOW

    def advance(
        self, now: float, allocated: Mapping[str, float], capacity: Mapping[str, float]
    ) -> QueueHistory:
        """The history at ``now``, the queue having held ``allocated`` of ``capacity`` since
        ``updated`` (constant over the span): every bucket decayed by ``0.5^(dt / t_half)``, the
        span's integral added to the buckets it falls in, buckets past the window dropped."""
        if now <= self.updated:
            return self
        half_life, length = self.params.half_life_s, self.bucket_s
        decay = _decay(now - self.updated, half_life)
        kept: dict[float, tuple[dict[str, float], dict[str, float]]] = {
            b.start: (
                {r: v * decay for r, v in b.usage.items()},
                {r: v * decay for r, v in b.capacity.items()},
            )
            for b in self.buckets
        }
        horizon = now - self.params.window_s
        start = max(self.updated, math.floor(horizon / length) * length)
        while capacity and start < now:
            bucket = math.floor(start / length) * length
            if bucket + length <= start:  # (a start on a boundary that rounding put below it)
                bucket += length
            end = min(now, bucket + length)
            usage, held = kept.setdefault(bucket, ({}, {}))
            for resource, total in capacity.items():
                held[resource] = held.get(resource, 0.0) + decayed_integral(total, start, end, now, half_life)
                amount = allocated.get(resource, 0.0)
                usage[resource] = usage.get(resource, 0.0) + decayed_integral(
                    amount, start, end, now, half_life
                )
            start = end
        buckets = tuple(
            Bucket(begin, usage, held)
            for begin, (usage, held) in sorted(kept.items())
            if begin + length > horizon
        )
        return QueueHistory(now, self.params, buckets)

    def resource_seconds(self, resource: str) -> float:
        return sum(b.usage.get(resource, 0.0) for b in self.buckets)

    def fraction(self, resource: str) -> float:
        """The queue's decayed usage over the window's decayed capacity: ``U_i`` in [0, 1]."""
        capacity = sum(b.capacity.get(resource, 0.0) for b in self.buckets)
        return self.resource_seconds(resource) / capacity if capacity > 0 else 0.0

    def with_params(self, params: HistoryParams) -> QueueHistory:
        """Under other parameters: a new window re-buckets what is kept (each bucket into the one
        of the new length its start falls in); a new half-life applies from now on."""
        if params == self.params:
            return self
        if params.window_s == self.params.window_s:
            return replace(self, params=params)
        length = params.window_s / BUCKETS_PER_WINDOW
        merged: dict[float, tuple[dict[str, float], dict[str, float]]] = {}
        for b in self.buckets:
            usage, held = merged.setdefault(math.floor(b.start / length) * length, ({}, {}))
            for r, v in b.usage.items():
                usage[r] = usage.get(r, 0.0) + v
            for r, v in b.capacity.items():
                held[r] = held.get(r, 0.0) + v
        buckets = tuple(Bucket(s, u, c) for s, (u, c) in sorted(merged.items()))
        return QueueHistory(self.updated, params, buckets)

    def to_status(self, factors: Mapping[str, float]) -> dict[str, Any]:
        """The Queue status field ``history`` (``from_status`` reads it back)."""
        resources = sorted({r for b in self.buckets for r in b.usage})
        return {
            "updated": round(self.updated, 3),
            "enabled": self.params.enabled,
            "halfLifeSeconds": self.params.half_life_s or 0,
            "windowSeconds": self.params.window_s,
            "kValue": self.params.k,
            "usage": {r: round(self.fraction(r), 6) for r in resources},
            "gpuHours": round(self.resource_seconds("gpu") / 3600.0, 3),
            "weightFactor": {r: round(f, 6) for r, f in sorted(factors.items())},
            "buckets": [
                {
                    "start": b.start,
                    "usage": {r: round(v, 3) for r, v in sorted(b.usage.items())},
                    "capacity": {r: round(v, 3) for r, v in sorted(b.capacity.items())},
                }
                for b in self.buckets
            ],
        }

    @staticmethod
    def from_status(status: object) -> tuple[QueueHistory, dict[str, float]] | None:
        """A history and its factors from a Queue's ``status.history``; None if it is not one
        (a malformed status costs only itself: the queue starts with no history)."""
        if not isinstance(status, Mapping):
            return None
        try:
            half_life = float(status.get("halfLifeSeconds") or 0)
            params = HistoryParams(
                enabled=bool(status.get("enabled", True)),
                half_life_s=half_life if half_life > 0 else None,
                window_s=float(status["windowSeconds"]),
                k=float(status.get("kValue", DEFAULT_K)),
            )
            buckets = tuple(
                Bucket(
                    float(b["start"]),
                    {str(r): float(v) for r, v in b["usage"].items()},
                    {str(r): float(v) for r, v in b["capacity"].items()},
                )
                for b in status.get("buckets") or ()
            )
            factors = {str(r): float(f) for r, f in (status.get("weightFactor") or {}).items()}
            history = QueueHistory(float(status["updated"]), params, buckets)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        values = [history.updated, params.window_s, params.k, *factors.values()]
        if not all(math.isfinite(v) for v in values) or params.window_s <= 0:
            return None
        return history, factors


def tracked_resources(tree: QueueTree, capacity: Mapping[str, float]) -> list[str]:
    """The resources history is kept for: GPUs (and GPU models), and CPU or memory where some
    queue declares a quota for them."""
    declared = {r for spec in tree.specs.values() for r in spec.quota}
    return sorted(r for r in capacity if r == "gpu" or r.startswith(GPU_MODEL_PREFIX) or r in declared)


def _taking_part(tree: QueueTree, children: Sequence[str], resource: str) -> list[tuple[str, float]]:
    """The children of one parent that take part for ``resource`` (an over-quota weight above 0
    and some demand), with their weights."""
    return [
        (child, weight)
        for child in children
        if child not in tree.broken
        for weight in (tree.specs[child].over_quota_weight.get(resource, 1.0),)
        if weight > 0
        and tree.subtree(child, "allocated", resource) + tree.subtree(child, "requested", resource) > 0
    ]


def history_moves(tree: QueueTree, params: Mapping[str, HistoryParams]) -> frozenset[str]:
    """The queues whose fair shares the rule may move: the children of every level where some
    child has it on (their weights are adjusted), and everything below them (their parents'
    shares move). Elsewhere shares are today's."""
    adjusted = {
        parent
        for parent, children in tree.children.items()
        if any(params.get(child, HistoryParams()).enabled for child in children)
    }
    moving: set[str] = set()
    for name in tree.top_down():
        parent = tree.specs[name].parent
        if parent in adjusted or parent in moving:
            moving.add(name)
    return frozenset(moving)


def target_factors(
    tree: QueueTree,
    fractions: Mapping[str, Mapping[str, float]],
    params: Mapping[str, HistoryParams],
    resources: Sequence[str],
) -> dict[str, dict[str, float]]:
    """Per queue and resource, ``P_i / W'_i`` (module docstring, step 3) for the queues that take
    part at their level; ``fractions`` is each queue's ``U_i``. Queues not taking part: 1."""
    factors: dict[str, dict[str, float]] = {name: {} for name in tree.specs}
    for parent, children in tree.children.items():
        for resource in resources:
            taking_part = _taking_part(tree, children, resource)
            if len(taking_part) < 2:
                continue
            level = 1.0 if parent is None else fractions.get(parent, {}).get(resource, 0.0)
            total_weight = sum(weight for _, weight in taking_part)
            raw: dict[str, tuple[float, float]] = {}
            for child, weight in taking_part:
                normalised_weight = weight / total_weight
                own = params.get(child, HistoryParams())
                if own.enabled:
                    used = fractions.get(child, {}).get(resource, 0.0)
                    normalised_usage = used / level if level > 0 else 0.0
                else:
                    normalised_usage = normalised_weight
                p = max(normalised_weight + own.k * (normalised_weight - normalised_usage), 0.0)
                raw[child] = (normalised_weight, p)
            total_p = sum(p for _, p in raw.values())
            if total_p <= 0:
                continue
            for child, (normalised_weight, p) in raw.items():
                factors[child][resource] = (p / total_p) / normalised_weight
    return factors


def _along(
    tree: QueueTree,
    previous: Mapping[str, Mapping[str, float]],
    targets: Mapping[str, Mapping[str, float]],
    resources: Sequence[str],
    progress: float,
) -> dict[str, dict[str, float]]:
    """The factors ``progress`` (0 to 1) of the way from ``previous`` to ``targets`` (missing: 1).
    At a level with two or more queues taking part, in parts of the level's over-quota weight
    (``W'_i * f_i / sum(W' * f)``): ``progress`` 0 gives the previous ratios (the same shares),
    1 the targets. Elsewhere a factor changes no share: it moves alike, factor by factor."""
    factors: dict[str, dict[str, float]] = {name: {} for name in tree.specs}
    for children in tree.children.values():
        for resource in resources:
            before = {child: previous.get(child, {}).get(resource, 1.0) for child in children}
            wanted = {child: targets.get(child, {}).get(resource, 1.0) for child in children}
            for child in children:
                factors[child][resource] = before[child] + progress * (wanted[child] - before[child])
            taking_part = _taking_part(tree, children, resource)
            if len(taking_part) < 2:
                continue
            total_weight = sum(weight for _, weight in taking_part)
            normalised = {child: weight / total_weight for child, weight in taking_part}
            held = sum(w * before[child] for child, w in normalised.items())
            aimed = sum(w * wanted[child] for child, w in normalised.items())
            for child, w in normalised.items():
                part = w * before[child] / held if held > 0 else w
                goal = w * wanted[child] / aimed if aimed > 0 else w
                factors[child][resource] = (part + progress * (goal - part)) / w
    return factors


def bounded_factors(
    tree: QueueTree,
    capacity: Mapping[str, float],
    previous: Mapping[str, Mapping[str, float]],
    targets: Mapping[str, Mapping[str, float]],
    resources: Sequence[str],
    max_change: float,
) -> dict[str, dict[str, float]]:
    """The factors as far from ``previous`` toward ``targets`` as moves no queue's fair share of
    a resource by more than ``max_change`` times its fair share with history off (module
    docstring, step 4): every level along its line (``_along``) by one common ``progress``. The
    targets if they are within it; else the progress shortened by the tightest share's
    ``allowed / moved``, again until every share is within its bound: exact at once where the
    shares are straight lines in the progress (where each level's queues all want more than they
    get), a few steps where demand caps or the weight bounds bend them."""
    specs = tuple(tree.specs.values())

    def divided(factors: Mapping[str, Mapping[str, float]] | None) -> dict[str, dict[str, float]]:
        adjustment = None if factors is None else WeightAdjustment("bounded", factors)
        return compute_fair_shares(FairShareInputs(specs, tree.usage, capacity, adjustment))

    start, off = divided(previous), divided(None)

    def moves(shares: Mapping[str, Mapping[str, float]]) -> list[tuple[float, float]]:
        """(how far each share moved, how far it may move), per queue and resource."""
        return [
            (abs(shares[q].get(r, 0.0) - start[q].get(r, 0.0)), max_change * off[q].get(r, 0.0))
            for q in start
            for r in resources
        ]

    def within(shares: Mapping[str, Mapping[str, float]]) -> bool:
        return all(moved <= allowed + SHARE_TOLERANCE for moved, allowed in moves(shares))

    progress = 1.0
    for _ in range(MAX_STEPS):
        candidate = _along(tree, previous, targets, resources, progress)
        over = [
            allowed / moved
            for moved, allowed in moves(divided(candidate))
            if moved > allowed + SHARE_TOLERANCE
        ]
        if not over:
            return candidate
        progress *= min(over)
        if progress <= 0:
            break
    return _along(tree, previous, targets, resources, 0.0)


def material_changes(
    before: Mapping[str, Mapping[str, float]],
    after: Mapping[str, Mapping[str, float]],
    threshold: float,
) -> dict[str, dict[str, tuple[float, float]]]:
    """Queue -> resource -> (factor before, after) where a factor moved by ``threshold`` or more
    (a missing factor is 1): the changes worth an event."""
    changes: dict[str, dict[str, tuple[float, float]]] = {}
    for queue in sorted(set(before) | set(after)):
        old, new = before.get(queue, {}), after.get(queue, {})
        for resource in sorted(set(old) | set(new)):
            pair = (old.get(resource, 1.0), new.get(resource, 1.0))
            if abs(pair[1] - pair[0]) >= threshold:
                changes.setdefault(queue, {})[resource] = pair
    return changes


@dataclass
class FairShareHistory:
    """The rule's state over time: each queue's history, the factors last handed out, and the
    version of the adjustment they make.

    ``record(now, tree, capacity)`` integrates what every queue held since the previous record
    (the allocation seen then) and notes what it holds now; ``adjustment(now, ...)`` recomputes
    the factors at most once per ``update_period_s``, each moved toward its target by at most
    ``max_change_per_minute`` per minute, and gives the adjustment a new version only when a
    factor moved. None while the rule is off for every queue."""

    defaults: HistoryParams = field(default_factory=HistoryParams)
    update_period_s: float = DEFAULT_UPDATE_PERIOD_S
    max_change_per_minute: float = DEFAULT_MAX_CHANGE_PER_MINUTE
    histories: dict[str, QueueHistory] = field(default_factory=dict)
    factors: dict[str, dict[str, float]] = field(default_factory=dict)
    version: int = 0
    factors_at: float | None = None  # when the factors were last computed
    _holding: dict[str, dict[str, float]] = field(default_factory=dict)
    _capacity: dict[str, float] = field(default_factory=dict)
    _recorded: float | None = None
    _params: dict[str, HistoryParams] = field(default_factory=dict)
    moving: frozenset[str] = frozenset()  # `history_moves` at the last record

    def restore(
        self, histories: Mapping[str, QueueHistory], factors: Mapping[str, Mapping[str, float]]
    ) -> None:
        """Take up histories and factors kept elsewhere (the Queue objects' status)."""
        self.histories = dict(histories)
        self.factors = {q: dict(f) for q, f in factors.items() if f}
        self.version += 1
        # The time since they were kept is counted at the next record, with what is held then.
        self._recorded, self._holding, self.factors_at = None, {}, None

    def record(
        self,
        now: float,
        tree: QueueTree,
        capacity: Mapping[str, float],
        settings: Mapping[str, HistorySettings],
    ) -> None:
        self._params = params = resolve_params(tree, settings, self.defaults)
        self.moving = history_moves(tree, params)
        if not any(p.enabled for p in params.values()):
            self._holding, self._recorded = {}, now
            return
        resources = tracked_resources(tree, capacity)
        held_capacity = {r: capacity.get(r, 0.0) for r in resources}
        holding = {
            name: {r: tree.subtree(name, "allocated", r) for r in resources}
            for name, own in params.items()
            if own.enabled
        }
        for name, own in params.items():
            if not own.enabled:
                continue
            history = self.histories.get(name)
            if history is None:
                history = QueueHistory(now, own)
            elif self._recorded is not None:
                # What it held since the last record, against the capacity of then.
                history = history.with_params(own).advance(now, self._holding.get(name, {}), self._capacity)
            else:
                # Restored from where it was kept: what it holds now is the best guess of what
                # it held since (a leader change keeps the allocation as it was).
                history = history.with_params(own).advance(now, holding[name], held_capacity)
            self.histories[name] = history
        self._holding = holding
        self._capacity, self._recorded = held_capacity, now

    def adjustment(
        self, now: float, tree: QueueTree, capacity: Mapping[str, float]
    ) -> WeightAdjustment | None:
        params = self._params
        if not any(p.enabled for p in params.values()):
            return None
        if self.factors_at is None or now - self.factors_at >= self.update_period_s:
            elapsed = self.update_period_s if self.factors_at is None else now - self.factors_at
            resources = tracked_resources(tree, capacity)
            fractions = {
                name: {r: history.fraction(r) for r in resources}
                for name, history in self.histories.items()
                if params.get(name, HistoryParams()).enabled
            }
            targets = target_factors(tree, fractions, params, resources)
            kept = sorted({r for f in self.factors.values() for r in f} - set(resources))
            step = self.max_change_per_minute * elapsed / 60.0
            bounded = bounded_factors(tree, capacity, self.factors, targets, [*resources, *kept], step)
            moved = False
            factors: dict[str, dict[str, float]] = {}
            for name, resources_of in bounded.items():
                previous = self.factors.get(name, {})
                own: dict[str, float] = {}
                for resource, value in sorted(resources_of.items()):
                    moved = moved or abs(value - previous.get(resource, 1.0)) > FACTOR_TOLERANCE
                    if abs(value - 1.0) > FACTOR_TOLERANCE:
                        own[resource] = value
                if own:
                    factors[name] = own
            self.factors, self.factors_at = factors, now
            if moved:
                self.version += 1
        return WeightAdjustment(("history", self.version), self.factors)
