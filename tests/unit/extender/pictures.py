"""Builders shared by the picture's unit tests (`test_picture_*.py`): a picture synced from a list
of objects, two GPU nodes, an object at a resourceVersion, a pod running on a claim.

The picture's parts are private to it; the few tests that look inside one (a reservation's
expiry, which pods a cache reads again, the entries of one filter call) do it through the
helpers here, so that a change of a part's insides is mended in one file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from extender.picture.running import PlannerFeed
from extender.picture.store import Stored
from extender.policy.placement import NodeGpus, WorkloadMix
from extender.policy.snapshot import RunningPod
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"


def synced_picture(objs: Sequence[Mapping[str, Any]], **config: Any) -> ClusterPicture:
    picture = ClusterPicture(PictureConfig(**config))
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


def two_nodes() -> list[dict[str, Any]]:
    return [
        objects.node("a"),
        objects.node("b"),
        objects.gpu_slice("a", 4, shareable=True),
        objects.gpu_slice("b", 4, model="A100-40GB", memory="40Gi"),
        objects.device_class(CLASS),
    ]


def with_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def running_on(name: str, node: str, claim_name: str, queue: str = "q") -> dict[str, Any]:
    pod = objects.pod("ns", name, queue=queue, claim_name=claim_name, node_name=node)
    return pod


def objects_of(picture: ClusterPicture) -> list[Stored]:
    """Every object the picture holds (to sync a fresh picture from, say)."""
    return [obj for kind in WATCHED_PATHS for obj in picture.kind(kind).values()]


def supply(picture: ClusterPicture, key: str, node: str, owner: str = "", queue: str = "") -> NodeGpus:
    """What pod `key` (of workload `owner`, in `queue`) may use of `node`."""
    return picture.supplies(key, [node], owner, queue)[0]


# ---- inside the parts --------------------------------------------------------------------------


def reserved_pods(picture: ClusterPicture) -> dict[str, Mapping[str, Any]]:
    """The pods a filter reserved whose bind has not come yet, with their wire pods."""
    return dict(picture._accounting.reserved_pods)


def ledger_mix(picture: ClusterPicture) -> WorkloadMix:
    """The workload mix as the ledger holds it now, read without a recount first."""
    return picture._accounting.ledger.mix()


def reserved_gangs(picture: ClusterPicture) -> list[str]:
    """The gang workloads admitted whole whose reservations hold slots, in the order reserved."""
    return picture._gangs.reserved_workloads()


def lapse_gang_reservations(picture: ClusterPicture) -> None:
    """A gang reservation lapses at its next recount from now on unless a member was placed."""
    picture._gangs.hold_s = 0.0


def gang_members(picture: ClusterPicture) -> dict[str, set[str]]:
    """Gang workload -> its pods' keys, every gang the picture knows."""
    return {workload: set(keys) for workload, keys in picture._workloads.members.items()}


def owner_read(picture: ClusterPicture, kind: str, key: str) -> bool:
    """The owner reader's answer for the owner `kind` `key` reached the picture."""
    return (kind, key) in picture._workloads.owners


def assumed_nodes(picture: ClusterPicture) -> dict[str, str]:
    """Pods the binder bound that the watch has not shown bound yet -> their nodes."""
    return dict(picture._inventory.assumed_nodes)


def remembered_nodes(picture: ClusterPicture) -> set[str]:
    """The nodes whose free GPUs the inventory keeps computed."""
    return set(picture._inventory._node_gpus)


def running_feed(picture: ClusterPicture) -> PlannerFeed:
    """The planners' running-pod feed as the next snapshot would read it."""
    picture.settle()  # (what `snapshot` does first: the recount marks the moved pods stale)
    return picture._running.feed({name: picture.node_gpus(name) for name in picture.kind("Node")})


def running_reads(picture: ClusterPicture, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the pods the running-pod feed reads (builds a `RunningPod` for) from now on."""
    reads: list[str] = []
    read = picture._running._running_pod

    def counted(key: str, node: str) -> tuple[RunningPod | None, int]:
        reads.append(key)
        return read(key, node)

    monkeypatch.setattr(picture._running, "_running_pod", counted)
    return reads


def demand_parses(picture: ClusterPicture, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the pods whose demand is read (parsed) from now on, in order."""
    reads: list[str] = []
    parse = picture._demands._parse

    def counted(pod: Mapping[str, Any]) -> Any:
        reads.append(pod["metadata"]["name"])
        return parse(pod)

    monkeypatch.setattr(picture._demands, "_parse", counted)
    return reads


class _Counted:
    """A part of the picture that counts each attribute the picture reads of it (an entry)."""

    def __init__(self, part: object, name: str, counts: Counter[str]) -> None:
        self._part, self._name, self._counts = part, name, counts

    def __getattr__(self, attribute: str) -> Any:
        self._counts[self._name] += 1
        return getattr(self._part, attribute)


@contextmanager
def counting_entries(picture: ClusterPicture) -> Iterator[Counter[str]]:
    """Count the picture's entries into each of its parts while inside: part attribute (`_store`,
    `_accounting`, ...) -> how many times the picture read something of it. The parts' own calls
    to one another are theirs, not counted: what is counted is what the picture asks."""
    counts: Counter[str] = Counter()
    parts = {
        name: part
        for name, part in vars(picture).items()
        if name.startswith("_") and type(part).__module__.startswith("extender.picture.")
    }
    for name, part in parts.items():
        setattr(picture, name, _Counted(part, name, counts))
    try:
        yield counts
    finally:
        for name, part in parts.items():
            setattr(picture, name, part)
