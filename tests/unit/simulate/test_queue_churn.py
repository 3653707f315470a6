"""Churn: capacity that frees on its own goes first to the most owed queue's pod (docs/queues.md,
"No churn"); declarative scenarios through `tessera simulate queues`, the arithmetic in comments."""

from __future__ import annotations

import math

import pytest

from extender.rule_flags import RuleFlags
from tessera.simulate.queues import parse_workload, run_queue_workload
from tests.unit.simulate.test_queue_reclaim import first_time, job, queue, run, state_at


def test_freed_gpus_go_to_the_owed_queue_not_to_the_older_borrower() -> None:
    # 1 node x 4 GPUs; a and b, quota 2 each; a's pods may be reclaimed after 60 s of runtime.
    # a's first 4 pods run 0-50; its next 4 are created at t=1, b's 2 at t=10: from t=10 shares
    # are a 2, b 2 (b wants 2, a more). At t=50 the 4 GPUs free by themselves.
    # kube-scheduler's order alone (priority, then creation) gives all 4 to a's older pods, and
    # at t=110 (their 60 s min runtime) reclaim evicts 2 of them for b: 120 GPU-s thrown away,
    # b waited 100 s. Deferring, a's pods leave 2 GPUs to b's (a at 2 of 2 would borrow them
    # and reclaim would take them back): b starts at t=50, a takes the other 2, no eviction.
    result = run(
        nodes=[{"name": "n", "gpus": 4}],
        queues=[queue("a", 2, reclaimMinRuntime=60), queue("b", 2)],
        jobs=[
            job("a-first", "a", 4, duration=50),
            job("a-next", "a", 4, arrival=1, duration=200),
            job("b", "b", 2, arrival=10, duration=200),
        ],
    )
    assert result.evictions == []
    assert first_time(result, "b", 2) == 50
    assert state_at(result, 50)["a"].allocated_gpu == 2  # nothing idles
    assert result.refusals.get("defers_to_owed") == 2  # a's two pods that left GPUs to b's


def test_a_pod_restarted_after_an_eviction_is_not_the_next_victim() -> None:
    # 1 node x 3 GPUs; a, b, c quota 1 each. a runs a-short (0-20 s) and a-long/1, a-long/2
    # (from t=0 and t=1). t=10: b's pod comes, shares a 2, b 1: reclaim evicts a's newest,
    # a-long/2. t=20: a-short ends, a-long/2 starts again (a at 1 of 2). t=30: c's pod comes,
    # shares 1 / 1 / 1, a holds 2: the newest of a's pods is a-long/2 again (started at t=20).
    # Restarted 10 s ago, within the 60 s window (rule 8), it is spared: a-long/1 goes.
    result = run(
        nodes=[{"name": "n", "gpus": 3}],
        queues=[queue("a", 1), queue("b", 1), queue("c", 1)],
        jobs=[
            job("a-short", "a", 1, duration=20),
            job("a-long", "a", 2, interval=1),
            job("b", "b", 1, arrival=10),
            job("c", "c", 1, arrival=30),
        ],
    )
    victims = [(e.time, e.victim.split("/")[0], e.served_queue) for e in result.evictions]
    # Pods are numbered by creation: a-short 0, a-long 1 and 2.
    assert victims == [(10, "a-long", "b"), (30, "a-long", "c")]
    assert len({e.victim for e in result.evictions}) == 2  # two pods, once each
    # Work lost, per queue: a-long/2 had run 9 s (t=1-10), a-long/1 30 s (t=0-30), 1 GPU each.
    assert {q.name: q.lost_gpu_s for q in result.queues} == {"a": 39.0, "b": 0.0, "c": 0.0}
    assert result.most_evictions_of_one_pod == 1


@pytest.mark.parametrize(
    ("wait_s", "victims", "b_second_at"),
    [
        # Before rule 9 (no wait): at t=10 b's pod reclaims one of a's pods (all started at t=0;
        # a-short, the first by key), which had run 10 s.
        (0.0, [(10, "a-short", "b")], 10),
        # A 60 s wait: b's pod reclaims at t=70, the cycles before it planning nothing.
        (60.0, [(70, "a-short", "b")], 70),
        # Now (the default: a queue owed less than its pod does not reclaim): b's pod waits for
        # a-short's GPU at t=120, which a's older waiting pod leaves to it (deference).
        (math.inf, [], 120),
    ],
)
def test_a_queue_owed_less_than_its_pod_waits_for_freed_capacity(
    wait_s: float, victims: list[tuple[float, str, str]], b_second_at: float
) -> None:
    # 1 node x 5 GPUs; a, b, c quota 1 each, every one wanting more than 5/3: shares 1.67 each.
    # From t=0 a runs 3 pods (a-short ends at t=120), b and c one each; a's 2 more wait from t=1,
    # b's and c's second pods from t=10. b (1 of 1.67) is owed 0.67, less than its 1-GPU pod: a
    # partly owed queue (rule 9). Rule 1 would let it take one of a's (a, 3 of 1.67, ends 0.33
    # above): a small fairness gain that throws away the victim's work. At t=120 a-short's GPU
    # frees; a's waiting pod would bring a to 3 and be reclaimable, so it defers to b's. c (1 of
    # 1.67, owed 0.67) is next: a at 2 would end owed 0.67, as owed as c - no fairer, no reclaim.
    result = run_queue_workload(
        parse_workload(
            {
                "name": "partly-owed",
                "nodes": [{"name": "n", "gpus": 5}],
                "queues": [queue("a", 1), queue("b", 1), queue("c", 1)],
                "jobs": [
                    job("a-short", "a", 1, duration=120),
                    job("a-long", "a", 2),
                    job("a-more", "a", 2, arrival=1),
                    job("b-run", "b", 1),
                    job("c-run", "c", 1),
                    job("b-more", "b", 1, arrival=10),
                    job("c-more", "c", 1, arrival=10),
                ],
            }
        ),
        flags=RuleFlags(partly_owed_wait_s=wait_s),
    )
    assert [(e.time, e.victim.split("/")[0], e.served_queue) for e in result.evictions] == victims
    assert first_time(result, "b", 2) == b_second_at
    assert result.idle_gpu_s_while_fitting_pod_waits == 0.0


@pytest.mark.parametrize(
    ("wait_s", "victims", "b_starts_at"),
    [
        # Before rule 13 (no wait): at t=10 b's pod reclaims one of a's 4 pods (all started at
        # t=0; a-short, the first by key), which had run 10 s: 10 GPU-s thrown away.
        (0.0, [(10, "a-short", "b")], 10),
        # A 20 s wait: a-short ends at t=25 by itself, a's waiting pod defers to b's, which takes
        # the GPU - served 15 s later (b below its share t=10-25), no eviction.
        (20.0, [], 25),
    ],
)
def test_a_queue_owed_a_whole_pod_waits_for_freed_capacity(
    wait_s: float, victims: list[tuple[float, str, str]], b_starts_at: float
) -> None:
    # 1 node x 4 GPUs; a and b quota 2 each. From t=0 a runs 4 pods (a-short ends at t=25), 2 more
    # of a's wait from t=1; b's pod comes at t=10: shares b 1 (all it asks), a 3. b, at 0 of 1, is
    # owed a whole pod: rule 1 lets it take one of a's (a, 4 of 3, ends at its share).
    result = run_queue_workload(
        parse_workload(
            {
                "name": "whole-owed",
                "nodes": [{"name": "n", "gpus": 4}],
                "queues": [queue("a", 2), queue("b", 2)],
                "jobs": [
                    job("a-short", "a", 1, duration=25),
                    job("a-long", "a", 3),
                    job("a-more", "a", 2, arrival=1),
                    job("b", "b", 1, arrival=10),
                ],
            }
        ),
        flags=RuleFlags(whole_owed_wait_s=wait_s),
    )
    assert [(e.time, e.victim.split("/")[0], e.served_queue) for e in result.evictions] == victims
    assert first_time(result, "b", 1) == b_starts_at
    b = next(q for q in result.queues if q.name == "b")
    assert b.longest_below_fair_share_s == b_starts_at - 10  # owed its pod from t=10 until served
    assert result.idle_gpu_s_while_fitting_pod_waits == 0.0


@pytest.mark.parametrize(
    ("patience_s", "victims", "b_starts_at"),
    [
        # No patience (the default): every borrower is a 2-GPU pod, rule 4 refuses 2 GPUs for 1,
        # and b waits until a-short ends at t=300.
        (math.inf, [], 300),
        # Rule 16 at 30 s: at t=40 the newer of a's long pods goes (2 GPUs for 1) and b starts.
        (30.0, [(40.0, "a-long", "b")], 40),
    ],
)
def test_a_queue_owed_a_whole_pod_takes_a_bigger_victim_after_its_patience(
    patience_s: float, victims: list[tuple[float, str, str]], b_starts_at: float
) -> None:
    # 1 node x 4 GPUs; a and b quota 2 each. From t=0 a runs 2-GPU pods: a-short (ends at t=300)
    # and a-long; b's two 1-GPU pods come at t=10: shares 2 / 2, b owed 2, a whole pod.
    result = run_queue_workload(
        parse_workload(
            {
                "name": "beyond-ratio",
                "nodes": [{"name": "n", "gpus": 4}],
                "queues": [queue("a", 2), queue("b", 2)],
                "jobs": [
                    job("a-short", "a", 1, gpus=2, duration=300),
                    job("a-long", "a", 1, gpus=2, arrival=1),
                    job("b", "b", 2, arrival=10),
                ],
            }
        ),
        flags=RuleFlags(ratio_after_s=patience_s),
    )
    assert [(e.time, e.victim.split("/")[0], e.served_queue) for e in result.evictions] == victims
    assert first_time(result, "b", 2) == b_starts_at  # both of b's pods: the second takes the other GPU


@pytest.mark.parametrize(
    ("limit", "victims"),
    [
        # No budget (the default): a-long/1, the newest of a's pods each time (it restarts when
        # b's pod ends), is evicted by each of b's 6 pods.
        (0, ["a-long/1"] * 6),
        # Rule 14 at 3: a-long/1 goes 3 times, then a-long/0 3 times; b's last pods wait.
        (3, ["a-long/1"] * 3 + ["a-long/0"] * 3),
        # At 2: each twice, then nothing: b's 5th and 6th pods wait for a GPU to free.
        (2, ["a-long/1"] * 2 + ["a-long/0"] * 2),
    ],
)
def test_a_pod_evicted_its_budget_is_spared(limit: int, victims: list[str]) -> None:
    # 1 node x 2 GPUs; a and b quota 1 each. a's 2 long pods borrow both GPUs; b's pods of 100 s
    # come every 200 s from t=100: b at 0 of 1 is owed a whole pod, a at 2 of 1 gives its newest
    # (a-long/1 first; after each of b's pods ends it restarts, the newest again, 100 s before the
    # next b pod: past rule 8's 60 s).
    workload = parse_workload(
        {
            "name": "budget",
            "nodes": [{"name": "n", "gpus": 2}],
            "queues": [queue("a", 1), queue("b", 1)],
            "jobs": [
                job("a-long", "a", 2, interval=1, duration=5000),
                job("b", "b", 6, arrival=100, interval=200, duration=100),
            ],
        }
    )
    result = run_queue_workload(workload, flags=RuleFlags(max_victim_evictions=limit))
    assert [e.victim for e in result.evictions] == victims  # job/index: a-long's are pods 0 and 1
    assert result.most_evictions_of_one_pod == (6 if limit == 0 else limit)


@pytest.mark.parametrize(
    ("lead_s", "per_wait", "evicted_at"),
    [
        # Rule 15 off (the default): b's pod reclaims at once, at t=100; a-long/1 loses 99 s.
        (math.inf, 0.0, [100.0]),
        # Lead 0, growing 1 s per second waited: a-long/1 started 99 s before b's pod began to wait
        # (t=1 against t=100), so it is a victim once b's pod has waited 99 s: t=199, having run
        # 198 s - the wait paid for it. The simulator's skipped cycles wake up for it.
        (0.0, 1.0, [199.0]),
        # Lead 0, not growing: only pods started while b's pod waits; none does, nothing goes.
        (0.0, 0.0, []),
    ],
)
def test_a_victim_started_long_before_the_wait_is_taken_once_the_wait_pays_for_it(
    lead_s: float, per_wait: float, evicted_at: list[float]
) -> None:
    # 1 node x 2 GPUs; a and b quota 1 each; a's 2 long pods borrow both GPUs from t=0 and t=1;
    # b's pod comes at t=100 (owed a whole pod: shares 1 / 1).
    workload = parse_workload(
        {
            "name": "lead",
            "nodes": [{"name": "n", "gpus": 2}],
            "queues": [queue("a", 1), queue("b", 1)],
            "jobs": [job("a-long", "a", 2, interval=1, duration=5000), job("b", "b", 1, arrival=100)],
        }
    )
    result = run_queue_workload(
        workload, flags=RuleFlags(victim_lead_s=lead_s, victim_lead_per_wait=per_wait)
    )
    assert [e.time for e in result.evictions] == evicted_at
    assert all(e.victim == "a-long/1" for e in result.evictions)


@pytest.mark.parametrize(
    ("collect", "wait_s", "victims", "lost_gpu_s", "idle_gpu_s"),
    [
        # No wait: b's pod reclaims at t=10, before anything frees: a's 4 newest by key go, 10 s
        # into their runs (40 GPU-s lost), collecting or not.
        (False, 0.0, ["a-20/0", "a-30/1", "a-40/2", "a-long/3"], 40.0, 0.0),
        (True, 0.0, ["a-20/0", "a-30/1", "a-40/2", "a-long/3"], 40.0, 0.0),
        # A 40 s wait, no collecting (before): a-20, a-30, a-40 end at t=20, 30, 40 and each time
        # a's waiting pod takes the one GPU (b's 4-GPU pod fits none of these holes). At t=50
        # reclaim evicts 4 for b: the three backfills (run 30, 20, 10 s) and a-long/3 (50 s):
        # 110 GPU-s lost, three of them pods that started while b waited.
        (False, 40.0, ["a-more/10", "a-more/9", "a-more/8", "a-long/3"], 110.0, 0.0),
        # Collecting: n is collected for b's pod, a's waiting pods defer there, the three GPUs
        # freed by t=40 stay free; at t=50 reclaim evicts only the missing 4 - 3 = 1 (a-long/3,
        # 50 s: 50 GPU-s lost). The price: GPUs idle t=20-50, 30-50, 40-50: 60 GPU-s.
        (True, 40.0, ["a-long/3"], 50.0, 60.0),
        # A 20 s wait: at t=30 two have freed (a-20, a-30): reclaim takes the missing 2, a-40/2 and
        # a-long/3 (30 s each); before, 4 (the backfills of t=20 and t=30 among them).
        (False, 20.0, ["a-more/9", "a-more/8", "a-40/2", "a-long/3"], 70.0, 0.0),
        (True, 20.0, ["a-40/2", "a-long/3"], 60.0, 10.0),
    ],
)
def test_a_node_collects_for_an_owed_pod_of_several_gpus(
    collect: bool, wait_s: float, victims: list[str], lost_gpu_s: float, idle_gpu_s: float
) -> None:
    # 1 node x 8 GPUs; a and b, quota 4 each. From t=0 a runs 8 one-GPU pods: a-20, a-30, a-40
    # end at t=20, 30, 40, the 5 of a-long run on; 8 more of a's wait from t=1. b's 4-GPU pod
    # comes at t=10: shares 4 / 4, b at 0 of 4 is owed the whole pod (rule 13: it reclaims once
    # it has waited `wait_s`).
    result = run_queue_workload(
        parse_workload(
            {
                "name": "collect",
                "nodes": [{"name": "n", "gpus": 8}],
                "queues": [queue("a", 4), queue("b", 4)],
                "jobs": [
                    job("a-20", "a", 1, duration=20),
                    job("a-30", "a", 1, duration=30),
                    job("a-40", "a", 1, duration=40),
                    job("a-long", "a", 5),
                    job("a-more", "a", 8, arrival=1, duration=300),
                    job("b", "b", 1, gpus=4, arrival=10),
                ],
            }
        ),
        flags=RuleFlags(whole_owed_wait_s=wait_s, collect_for_owed=collect),
    )
    assert sorted(e.victim for e in result.evictions) == sorted(victims)
    assert {e.time for e in result.evictions} == {10 + wait_s}
    assert first_time(result, "b", 4) == 10 + wait_s  # served as soon as reclaim may, either way
    assert {q.name: q.lost_gpu_s for q in result.queues}["a"] == lost_gpu_s
    assert result.idle_gpu_s_while_fitting_pod_waits == idle_gpu_s


def test_work_lost_for_share_above_the_quota_is_told_apart() -> None:
    # 1 node x 4 GPUs; a (quota 0) borrowed all 4 from t=0; at t=10 b (quota 1) asks 3 GPUs.
    # Shares: b's quota 1, and the 3 GPUs above the quotas split by weight between the two
    # queues that want them: a 1.5, b 1 + 1.5 = 2.5. b's first pod is within its quota (0 + 1
    # <= 1); its second takes b to 2, past its quota of 1, still owed a whole pod (2.5 - 1 >= 1):
    # both reclaim at t=10, each victim having run 10 s. b's third would find b owed 0.5, less
    # than the pod: it waits (rule 9).
    result = run(
        nodes=[{"name": "n", "gpus": 4}],
        queues=[queue("a", 0), queue("b", 1)],
        jobs=[job("a", "a", 4), job("b", "b", 3, arrival=10)],
    )
    assert [(e.time, e.served_queue, e.served_past_quota) for e in result.evictions] == [
        (10, "b", False),
        (10, "b", True),
    ]
    assert result.lost_gpu_s == 20.0  # 2 victims x 1 GPU x 10 s
    assert result.lost_past_quota_gpu_s == 10.0  # the second one's
