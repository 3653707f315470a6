"""What the hot path hands the status writer: which pod conditions and Events to write."""

from __future__ import annotations

from extender.status import MIN_REWRITE_S, PodReport, WaitingPods


def test_a_refusal_is_reported_once_with_an_event() -> None:
    waiting = WaitingPods()
    waiting.refused("ns", "p", "uid", "team", "over limit")
    assert waiting.reports.pop("ns/p") == PodReport("ns", "p", "uid", False, "over limit", post_event=True)
    waiting.refused("ns", "p", "uid", "team", "over limit")
    assert waiting.reports == {}


def test_a_nudged_pod_refused_again_gets_its_false_condition_back_without_a_new_event() -> None:
    """The nudge turned the condition True; the next nudge must be a change again."""
    waiting = WaitingPods()
    waiting.refused("ns", "p", "uid", "team", "over limit")
    waiting.reports.clear()
    waiting.waiting["ns/p"].nudged = True
    waiting.refused("ns", "p", "uid", "team", "over limit")
    assert waiting.reports["ns/p"] == PodReport("ns", "p", "uid", False, "over limit", post_event=False)
    assert waiting.waiting["ns/p"].nudged is False


def test_a_new_reason_is_a_new_event_and_admission_clears_the_wait() -> None:
    waiting = WaitingPods()
    waiting.refused("ns", "p", "uid", "team", "over limit", "over_limit")
    assert waiting.refused("ns", "p", "uid", "team", "no such queue", "unknown_queue") is True
    assert waiting.reports["ns/p"] == PodReport(
        "ns", "p", "uid", False, "no such queue", True, "unknown_queue"
    )
    waiting.admitted("ns", "p", "uid", "within fair share")
    assert waiting.reports["ns/p"] == PodReport("ns", "p", "uid", True, "within fair share", post_event=False)
    assert "ns/p" not in waiting.waiting


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_new_numbers_of_the_same_reason_are_written_at_most_every_interval() -> None:
    """The gate controller asks every second; a queue whose usage moves each time costs one write
    per pod per MIN_REWRITE_S, not one per pass. A new reason is written at once."""
    clock = Clock()
    waiting = WaitingPods(clock=clock)
    assert waiting.refused("ns", "p", "uid", "team", "allocated 13 + 1 > 13", "over_limit") is True
    waiting.reports.clear()
    clock.now += MIN_REWRITE_S - 1  # 29 s later: other numbers, same code: not yet
    assert waiting.refused("ns", "p", "uid", "team", "allocated 14 + 1 > 14", "over_limit") is False
    assert waiting.reports == {} and waiting.waiting["ns/p"].reason == "allocated 13 + 1 > 13"
    clock.now += 1  # 30 s: said again, with an event
    assert waiting.refused("ns", "p", "uid", "team", "allocated 14 + 1 > 14", "over_limit") is True
    assert waiting.reports["ns/p"].post_event is True
    waiting.reports.clear()
    clock.now += 1  # 1 s later, another code: at once
    assert waiting.refused("ns", "p", "uid", "team", "namespace may not use it", "queue_not_allowed") is True
    # Its gang's placed count moved: at once, whatever the interval.
    assert waiting.refused("ns", "p", "uid", "team", "3 placed", "queue_not_allowed", moved=True) is True


def test_an_admitted_pod_no_node_fits_says_why_once_and_admission_turns_it_true() -> None:
    clock = Clock()
    waiting = WaitingPods(clock=clock)
    waiting.no_node_fits("ns", "p", "uid", "default", "fair share 0", "fair_share_zero")
    # Condition True (its queue admits it) under the wait's reason, with an event; not for requeue.
    assert waiting.reports.pop("ns/p") == PodReport(
        "ns", "p", "uid", True, "fair share 0", True, "fair_share_zero"
    )
    assert "ns/p" not in waiting.waiting
    waiting.no_node_fits("ns", "p", "uid", "default", "fair share 0", "fair_share_zero")
    assert waiting.reports == {}  # the same reason: nothing to write
    waiting.admitted("ns", "p", "uid", "fits")
    assert waiting.reports["ns/p"] == PodReport("ns", "p", "uid", True, "fits", post_event=False)
    assert waiting.unplaced == {}
