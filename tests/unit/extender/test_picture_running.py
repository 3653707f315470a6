"""The running-pod feed for planners (`extender.picture.running.RunningPods`): kept from one feed to
the next, it reads again only the pods the accounting recounted since, and each feed is a copy a
planner may change.

Picture (`test_snapshot.picture`): node a has 4 H100s; team-a runs w0 (gpu-0), w1 (gpu-1) and
half (40Gi of gpu-2); team-b's pod "waiting" has no node yet.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from tests import extender_objects as objects
from tests.unit.extender.pictures import running_feed, running_reads
from tests.unit.extender.test_snapshot import CLASS, picture


def fresh(live: ClusterPicture) -> ClusterPicture:
    again = ClusterPicture()
    for kind in WATCHED_PATHS:
        again.replace(kind, list(live.kind(kind).values()))
    return again


def with_condition(pod: Mapping[str, Any]) -> dict[str, Any]:
    status = {**pod["status"], "conditions": [{"type": "Ready", "status": "True"}]}
    return {**pod, "status": status}


def test_a_feed_reads_again_only_the_pods_recounted_since_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    live = picture()
    reads = running_reads(live, monkeypatch)
    assert sorted(running_feed(live).running) == ["ns/half", "ns/w0", "ns/w1"]
    assert sorted(reads) == ["ns/half", "ns/w0", "ns/w1"]  # the first feed: every pod on a node
    reads.clear()
    running_feed(live)
    assert reads == []  # nothing moved: nothing read
    live.apply("Pod", "MODIFIED", with_condition(live.kind("Pod")["ns/w0"]))
    running_feed(live)
    assert reads == ["ns/w0"]  # its status changed: only it
    reads.clear()
    # "waiting" bound to a, its claim allocated gpu-3: read, and in the feed from now on.
    bound = objects.pod("ns", "waiting", queue="team-b", template="one", node_name="a")
    bound["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "waiting-gpus"}]
    claim = objects.claim("ns", "waiting-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-3", None)])
    live.apply("ResourceClaim", "ADDED", claim)
    live.apply("Pod", "MODIFIED", bound)
    kept = running_feed(live)
    assert reads == ["ns/waiting"]
    assert kept.running["ns/waiting"].gpus == ((3, 1000),)
    assert kept == running_feed(fresh(live))


def test_a_feed_is_a_copy_the_planner_may_change() -> None:
    # A planner's fork evicts pods from the feed it was given; the next feed is as it was.
    live = picture()
    first = running_feed(live)
    as_given = copy.deepcopy(first)
    first.running.pop("ns/w0")
    first.terminating.add("ns/w1")
    first.victims["team-a"].clear()
    first.movers.clear()
    again = running_feed(live)
    assert again == as_given == running_feed(fresh(live))
    assert again.victims == {"team-a": {"a": 3}}  # team-a's three preemptible pods on node a
