"""The history keeper (extender.controllers.history) against a fake API server: what the leader
writes into the Queues' status over a few update periods, the Events it posts when a queue's
weight factor moves materially (and only then), and a replica that starts from a status another
one wrote.

The cluster: nodes a and b with 2 GPUs each (4 GPUs); queue `a` holds 3 of them (a-gpu-0,
a-gpu-1, b-gpu-0), queue `b` holds 1 (b-gpu-1); both have fair share over time on with a
half-life of 1 h, and 4 one-GPU pods of each wait (both want more than the cluster). The keeper's
clock is stepped an hour at a time: each step is longer than the update period (60 s), so every
step writes, and a share may move 0.1 of its share with history off per minute of it.

Each hour the queues hold the same, so each hour adds what the one before added, and the hours
before are halved: `a`'s GPU-hours after n hours are 3 / ln 2 * (1 - 0.5^n) (the decayed
integral of 3 GPUs, in hours): 2.164, 3.246, 3.787. Its usage is 3 of 4 GPUs at every age: 0.75.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from contract.names import QUEUE_GROUP, QUEUE_VERSION
from extender.controllers.history import EVENT_REASON, HistoryKeeper, HistoryOptions
from extender.controllers.reclaim import ReclaimLoop
from extender.events import CLUSTER_EVENT_NAMESPACE
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture, PictureConfig
from tests import extender_objects as objects

CLASS = "gpu.tessera.dev"
TESSERA = "tessera"
MODEL = "gpu/H100-80GB"  # the nodes' GPU model: history is kept for it beside `gpu`, alike
HOUR = 3600.0
# A multiple of the default window's bucket (168 h / 12 = 14 h): the hours stay in one bucket.
T0 = 35012 * 14 * HOUR


class FakeQueueApi:
    """Takes merge patches of Queue status and Events; keeps each queue's last status history and
    every Event's (queue, reason, message)."""

    def __init__(self) -> None:
        self.histories: dict[str, dict[str, Any]] = {}
        self.patches: list[str] = []  # queue names, in order
        self.events: list[tuple[str, str, str]] = []
        self.event_namespaces: set[tuple[str, str]] = set()
        self.app = web.Application()
        self.app.router.add_patch(f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/queues/{{name}}/status", self.patch)
        self.app.router.add_post("/api/v1/namespaces/{ns}/events", self.event)

    async def patch(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        assert request.content_type == "application/merge-patch+json"
        body = await request.json()
        self.histories[name] = body["status"]["history"]
        self.patches.append(name)
        return web.json_response({"metadata": {"name": name}, **body})

    async def event(self, request: web.Request) -> web.Response:
        body = await request.json()
        # The Event's namespace, and the Queue's in it ("": cluster-scoped, or kubectl describe
        # would not find it).
        self.event_namespaces.add((request.match_info["ns"], body["involvedObject"]["namespace"]))
        self.events.append((body["involvedObject"]["name"], body["reason"], body["message"]))
        return web.json_response(body, status=201)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[FakeQueueApi, ApiClient]]:
    fake = FakeQueueApi()
    async with TestServer(fake.app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api:
            yield fake, api


def history_queue(name: str, history: dict[str, Any] | None = None) -> dict[str, Any]:
    queue = objects.queue(name, resources={"gpu": {"quota": 0}})
    queue["spec"]["fairShareHistory"] = {"enabled": True, "halfLife": "1h"}
    if history is not None:
        queue["status"] = {"history": history}
    return queue


def held(queue: str, name: str, node: str, device: str) -> list[dict[str, Any]]:
    pod = objects.pod("ns", name, queue=queue, claim_name=f"{name}-gpu", node_name=node, scheduler=TESSERA)
    pod["status"] = {"phase": "Running"}
    claim = objects.claim("ns", f"{name}-gpu", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    return [pod, claim]


def picture_of(histories: dict[str, dict[str, Any]] | None = None) -> ClusterPicture:
    """The cluster above; each queue's status keeps `histories[queue]` when given."""
    kept = histories or {}
    picture = ClusterPicture(PictureConfig(scheduler_names=frozenset({TESSERA})))
    objs = [
        *objects.two_nodes_of_two_gpus(CLASS),
        history_queue("a", kept.get("a")),
        history_queue("b", kept.get("b")),
        *held("a", "a0", "a", "gpu-0"),
        *held("a", "a1", "a", "gpu-1"),
        *held("a", "a2", "b", "gpu-0"),
        *held("b", "b0", "b", "gpu-1"),
        # Both want more than the cluster: 4 one-GPU pods each wait.
        *(
            objects.pod("ns", f"{q}-wait-{i}", queue=q, template="one", scheduler=TESSERA)
            for q in "ab"
            for i in range(4)
        ),
    ]
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    return picture


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gpu_hours_after(hours: int) -> float:
    # 3 GPUs held `hours` hours, each hour halved by every later one: 3 / ln 2 * (1 - 0.5^n).
    return 3 / math.log(2) * (1 - 0.5**hours)


async def test_the_leader_writes_the_decayed_history_every_period(
    apiserver: tuple[FakeQueueApi, ApiClient],
) -> None:
    fake, api = apiserver
    picture, clock = picture_of(), Clock(T0)
    keeper = HistoryKeeper(api, picture, HistoryOptions(), clock=clock)
    assert picture.fairness().tree.subtree("a", "allocated", "gpu") == 3

    # t0: nothing held yet in the history: written empty, factors 1 (no weightFactor).
    await keeper.run_once()
    assert fake.histories["a"]["gpuHours"] == 0 and fake.histories["a"]["weightFactor"] == {}
    assert fake.histories["a"]["halfLifeSeconds"] == HOUR and fake.histories["a"]["updated"] == T0

    # Each hour: a's GPU-hours 2.164, 3.246, 3.787 (module docstring); b's a third of them.
    # Usage 0.75 and 0.25: P = 0.5 + (0.5 - 0.75) = 0.25 and 0.75, factors 0.5 and 1.5, reached
    # in the first hour (an hour lets a factor move 6.0, far more than the 0.5 it needs).
    for hours in (1, 2, 3):
        clock.now = T0 + hours * HOUR
        await keeper.run_once()
        a, b = fake.histories["a"], fake.histories["b"]
        assert a["updated"] == clock.now
        assert a["gpuHours"] == pytest.approx(gpu_hours_after(hours), abs=1e-3)
        assert b["gpuHours"] == pytest.approx(gpu_hours_after(hours) / 3, abs=1e-3)
        assert a["usage"] == {"gpu": 0.75, MODEL: 0.75} and b["usage"] == {"gpu": 0.25, MODEL: 0.25}
        assert a["weightFactor"] == {"gpu": 0.5, MODEL: 0.5}
        assert b["weightFactor"] == {"gpu": 1.5, MODEL: 1.5}
    # The shares the accounting divides: 4 GPUs beyond quota 0 at weights 0.5 : 1.5 -> 1 and 3.
    shares = picture.fairness().fair_shares
    assert shares["a"]["gpu"] == pytest.approx(1.0) and shares["b"]["gpu"] == pytest.approx(3.0)
    # One write per queue per step, every step changing the GPU-hours by more than 1 %.
    assert fake.patches == ["a", "b"] * 4

    # One Event per queue, when its factor moved (1 -> 0.5, 1 -> 1.5); the hours after moved no
    # factor, so no more Events: they are not repeated every period.
    assert [(q, reason) for q, reason, _ in fake.events] == [("a", EVENT_REASON), ("b", EVENT_REASON)]
    assert fake.events[0][2] == (
        "fair share over time: gpu: over-quota weight x1.00 -> x0.50 "
        "(decayed usage 75.0% of the capacity over the window); "
        f"{MODEL}: over-quota weight x1.00 -> x0.50 (decayed usage 75.0% of the capacity over the window)"
    )
    assert fake.event_namespaces == {(CLUSTER_EVENT_NAMESPACE, "")}


async def test_a_history_that_did_not_move_materially_is_not_written_again(
    apiserver: tuple[FakeQueueApi, ApiClient],
) -> None:
    fake, api = apiserver
    clock = Clock(T0)
    keeper = HistoryKeeper(api, picture_of(), HistoryOptions(), clock=clock)
    for step in (0.0, HOUR, HOUR + 60):
        clock.now = T0 + step
        await keeper.run_once()
    # At 1 h + 60 s the GPU-hours grew by 3 GPUs * 60 s * ~0.5 (decay) ~ 0.025 h on 2.164: 1.2 %,
    # more than the 1 % that makes a write; b's by a third of that on 0.721 (also 1.2 %).
    assert fake.patches == ["a", "b"] * 3
    clock.now = T0 + HOUR + 65  # 5 s later: within the update period, nothing is written
    await keeper.run_once()
    clock.now = T0 + HOUR + 125  # 60 s later: a's GPU-hours +1.2 % again, written
    await keeper.run_once()
    assert fake.patches == ["a", "b"] * 4


async def test_a_new_leader_takes_up_the_history_another_replica_wrote(
    apiserver: tuple[FakeQueueApi, ApiClient],
) -> None:
    fake, api = apiserver
    clock = Clock(T0)
    first = HistoryKeeper(api, picture_of(), HistoryOptions(), clock=clock)
    for hours in (0, 1, 2):
        clock.now = T0 + hours * HOUR
        await first.run_once()
    written = {q: dict(h) for q, h in fake.histories.items()}
    events_before = len(fake.events)

    # Another replica, whose picture holds the Queues with the status the first one wrote.
    picture = picture_of(written)
    leading = False
    second = HistoryKeeper(api, picture, HistoryOptions(), is_leader=lambda: leading, clock=clock)
    # A standby divides under the factors the status keeps (writing nothing).
    clock.now = T0 + 2 * HOUR + 30
    await second.run_once()
    assert second.adjustment is not None
    assert second.adjustment.factors == {"a": {"gpu": 0.5, MODEL: 0.5}, "b": {"gpu": 1.5, MODEL: 1.5}}
    assert picture.fairness().fair_shares["a"]["gpu"] == pytest.approx(1.0)
    assert len(fake.patches) == 6

    # It becomes the leader an hour after the last write: it counts that hour with what the
    # queues hold now, and its history is what the first would have written: 3.787 GPU-hours.
    leading = True
    clock.now = T0 + 3 * HOUR
    await second.run_once()
    assert fake.histories["a"]["gpuHours"] == pytest.approx(gpu_hours_after(3), abs=1e-3)
    assert fake.histories["a"]["weightFactor"] == {"gpu": 0.5, MODEL: 0.5}
    # The factors it took up are those the last Events reported: no Event is posted again.
    assert len(fake.events) == events_before


async def test_a_malformed_status_costs_only_its_queue(apiserver: tuple[FakeQueueApi, ApiClient]) -> None:
    fake, api = apiserver
    clock = Clock(T0 + HOUR)
    good = {
        "updated": T0,
        "enabled": True,
        "halfLifeSeconds": HOUR,
        "windowSeconds": 168 * HOUR,
        "kValue": 1.0,
        "buckets": [],
    }
    keeper = HistoryKeeper(
        api, picture_of({"a": {"updated": "yesterday"}, "b": good}), HistoryOptions(), clock=clock
    )
    await keeper.run_once()  # takes over: b's history from its status, a's from nothing
    clock.now = T0 + 2 * HOUR
    await keeper.run_once()
    # b's kept history starts at T0 and counts the two hours since (1 GPU): 1 / ln 2 * 0.75 h.
    assert fake.histories["b"]["gpuHours"] == pytest.approx(1 / math.log(2) * 0.75, abs=1e-3)
    # a's starts at T0 + 1 h, its first record: one hour of 3 GPUs.
    assert fake.histories["a"]["gpuHours"] == pytest.approx(gpu_hours_after(1), abs=1e-3)


async def test_the_reclaim_rules_know_when_history_moves_the_shares(
    apiserver: tuple[FakeQueueApi, ApiClient],
) -> None:
    # Rule 9's wait never opens for a queue whose share fair share over time moves
    # (extender.policy.reclaim): here both queues, which have it on, and the picture's default
    # queue beside them at the top level (its weight's part of the level moves with theirs).
    _, api = apiserver
    picture = picture_of()
    keeper = HistoryKeeper(api, picture, HistoryOptions(), clock=Clock(T0))
    loop = ReclaimLoop(api, picture, ExtenderMetrics(picture), history_moves=lambda: keeper.moving)
    assert loop.rules().history_moves == frozenset()  # before the keeper's first pass
    await keeper.run_once()
    assert loop.rules().history_moves == {"a", "b", "default"}
