"""Rule 8 of extender.policy.reclaim: a pod restarted after an eviction is no victim for
`recent_victim_s` after its restart (`protected_restarts`)."""

from __future__ import annotations

import pytest

from extender.policy.reclaim import Rules, protected_restarts
from extender.policy.snapshot import RunningPod

NOW = 1000.0


def started_at(started: float) -> RunningPod:
    return RunningPod("ns/p", "a", "n1", ((0, 1000),), {"gpu": 1.0}, started=started)


@pytest.mark.parametrize(
    ("evicted", "started", "window", "protected"),
    [
        (None, 990.0, 60.0, False),  # never evicted: an ordinary victim
        (900.0, 950.0, 60.0, True),  # restarted 50 s ago, after the eviction at 900: spared
        (900.0, 930.0, 60.0, False),  # restarted 70 s ago: the window is over
        (960.0, 950.0, 60.0, False),  # started before its (owner's) last eviction: not a restart
        (900.0, 950.0, 0.0, False),  # window 0: no protection
    ],
)
def test_restarts_within_the_window_are_spared(
    evicted: float | None, started: float, window: float, protected: bool
) -> None:
    pod = started_at(started)
    spared = protected_restarts([pod], lambda _: evicted, NOW, Rules(recent_victim_s=window))
    assert spared == (["ns/p"] if protected else [])
