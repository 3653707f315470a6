"""What the hot path hands the status writer: which pod conditions and Events to write."""

from __future__ import annotations

from extender.status import PodReport, WaitingPods


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
    waiting.refused("ns", "p", "uid", "team", "over limit")
    waiting.refused("ns", "p", "uid", "team", "over fair share")
    assert waiting.reports["ns/p"].post_event is True
    waiting.admitted("ns", "p", "uid", "within fair share")
    assert waiting.reports["ns/p"] == PodReport("ns", "p", "uid", True, "within fair share", post_event=False)
    assert "ns/p" not in waiting.waiting
