"""The queue ledger (`extender.picture.ledger`): per-queue totals kept by difference, equal to
those of a ledger given the same contributions afresh, with no residue.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

import pytest

from extender.picture.ledger import Bucket, Contribution, QueueLedger
from extender.policy.fairness import (
    QueueUsage,
)
from extender.policy.placement import GpuDemand


@pytest.mark.parametrize("seed", range(100))
def test_usage_and_pending_counts_kept_by_the_ledger_equal_those_of_a_fresh_one(seed: int) -> None:
    # Pods of queues a-d, 40 random steps: a pod's contribution set (waiting, holding, neither)
    # or dropped, sometimes the ledger cleared and some of its pods put again (a relist),
    # sometimes other queues named. After each, `usage` and `pending_pods` equal those of a
    # ledger given the same contributions afresh (running totals: approx), the usage of a queue
    # no step touched is the same object as before, and what was handed out before is unchanged.
    rng = random.Random(seed)
    ledger = QueueLedger()
    named: frozenset[str] = frozenset("ab")
    usage = ledger.usage(named)
    handed_out: list[tuple[Mapping[str, QueueUsage], dict[str, int], object]] = []

    def frozen(usage: Mapping[str, QueueUsage], pending: Mapping[str, int]) -> object:
        return {q: (dict(u.allocated), dict(u.requested)) for q, u in usage.items()}, dict(pending)

    for _ in range(40):
        touched: set[str] = set()
        roll = rng.random()
        if roll < 0.85:
            key = f"p{rng.randrange(8)}"
            old = ledger.contributions.get(key)
            touched.update([old.queue] if old is not None and old.bucket != "none" else [])
            new = None
            if roll < 0.7:
                bucket: Bucket = rng.choice(("allocated", "requested", "none"))
                amounts = {"gpu": rng.choice((0.5, 1.0)), "cpu": rng.choice((0.1, 2.0))}
                new = Contribution(rng.choice("abcd"), bucket, amounts)
                touched.update([new.queue] if bucket != "none" else [])
            ledger.put(key, new)
        elif roll < 0.95:
            kept = dict(ledger.contributions)
            ledger.clear()
            touched.update(usage)
            for key, contribution in rng.sample(sorted(kept.items()), k=rng.randint(0, len(kept))):
                ledger.put(key, contribution)
        else:
            named = frozenset(rng.sample("abcde", k=rng.randint(0, 3)))
            touched.update("abcde")  # every usage may be built again
        before = usage
        usage, pending = ledger.usage(named), ledger.pending_pods()
        fresh = QueueLedger()
        for key, contribution in ledger.contributions.items():
            fresh.put(key, contribution)
        expected = fresh.usage(named)
        # (a queue whose pods all left keeps an empty usage until the next clear)
        waiting = Counter(c.queue for c in ledger.contributions.values() if c.bucket == "requested")
        assert usage.keys() >= expected.keys() and pending == dict(waiting)
        for queue, kept_usage in usage.items():
            expected_usage = expected.get(queue, QueueUsage(allocated={}, requested={}))
            assert kept_usage.allocated == pytest.approx(expected_usage.allocated)
            assert kept_usage.requested == pytest.approx(expected_usage.requested)
            if queue in before and queue not in touched:
                assert kept_usage is before[queue]
        for usage_then, pending_then, as_then in handed_out:
            assert frozen(usage_then, pending_then) == as_then
        handed_out.append((usage, pending, frozen(usage, pending)))


def test_ledger_moves_only_the_difference_and_leaves_no_residue() -> None:
    ledger = QueueLedger()
    third = {"gpu": 1 / 3}
    ledger.put("a", Contribution("q", "requested", third, GpuDemand(count=1, milli=333)))
    ledger.put("b", Contribution("q", "allocated", third))
    ledger.put("a", Contribution("q", "allocated", third, GpuDemand(count=1, milli=333)))
    assert ledger.allocated["q"]["gpu"] == pytest.approx(2 / 3)
    assert ledger.requested["q"] == {} and ledger.pending_pods() == {}
    ledger.put("a", None)
    ledger.put("b", None)
    assert ledger.allocated["q"] == {}
    assert ledger.mix().demands == ()
