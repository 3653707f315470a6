"""Evictions go out together, a bounded number at a time, each given up after a short timeout.

Against a fake API server (in-process aiohttp, the real kubernetes-asyncio client in front of it)
that counts the evictions in flight at once and can be made slow: it answers none before a given
number are in flight (`together`), or leaves one unanswered (HANG). A cycle's 16 evictions are
so shown to run side by side - against a slow API they cost the cycle one wait, not 16 - without
timing anything: evictions made one after the other would never be answered. Each outcome
(evicted, blocked by a budget, gone, failed, no answer in time) is handled as the reclaim and
consolidation executors always did.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from extender.__main__ import parse_args
from extender.controllers.consolidate import ConsolidationOptions, Consolidator
from extender.controllers.evictions import EvictionLimits, evict_all
from extender.controllers.reclaim import ReclaimLoop, ReclaimOptions
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.policy.consolidation import Move, MovePlan
from extender.policy.fairness import FairnessSnapshot
from extender.policy.placement import GpuDemand, WorkloadMix
from extender.policy.reclaim import Eviction, PendingPod, Plan, Rules
from extender.policy.snapshot import ClusterSnapshot, HeldGpus, RunningPod
from extender.rule_flags import RuleFlags, rule_flags
from tests import extender_objects as objects

HANG = 0  # an answer the fake never gives: the call waits until the client gives up
# The timeout where a call is meant to go unanswered: the test waits it out, so it is short, yet
# the calls answered beside it must arrive within it on a busy machine.
SHORT_S = 1.0
# The timeout where every call is answered: far above what reaching the fake takes on a busy
# machine, so `together` calls are in flight before any is given up.
LONG_S = 30.0


class FakeEvictionApi:
    """Answers evictions with the status set per pod (201 by default, HANG for none) and takes
    events; counts the evictions in flight at once. With `together` set, no eviction is answered
    before that many are in flight (calls made one after the other would wait for ever)."""

    def __init__(self) -> None:
        self.answers: dict[str, int] = {}
        self.default = 201
        self.calls: list[str] = []
        self.in_flight = 0
        self.peak = 0
        self.together = 0
        self.all_in = asyncio.Event()
        self.events: list[tuple[str, str]] = []  # (pod name, reason)
        self.messages: dict[tuple[str, str], str] = {}  # (pod name, reason) -> the last message
        self.release = asyncio.Event()  # ends the unanswered calls at teardown
        self.on_evict: Callable[[str], None] = lambda name: None  # told each eviction as it comes
        self.app = web.Application()
        self.app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/eviction", self.evict)
        self.app.router.add_post("/api/v1/namespaces/{ns}/events", self.event)

    async def evict(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls.append(name)
        self.on_evict(name)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= self.together:
            self.all_in.set()
        try:
            status = self.answers.get(name, self.default)
            await (self.release if status == HANG else self.all_in).wait()
            return web.json_response(
                {"kind": "Status", "code": status, "message": f"answer {status}"}, status=status
            )
        finally:
            self.in_flight -= 1

    async def event(self, request: web.Request) -> web.Response:
        body = await request.json()
        subject = (body["involvedObject"]["name"], body["reason"])
        self.events.append(subject)
        self.messages[subject] = body["message"]
        return web.json_response(body, status=201)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[FakeEvictionApi, ApiClient]]:
    fake = FakeEvictionApi()
    async with TestServer(fake.app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api:
            yield fake, api
        fake.release.set()


def keys(count: int, prefix: str = "a") -> list[str]:
    return [f"ns/{prefix}-{i}" for i in range(count)]


@pytest.mark.parametrize(
    ("concurrency", "peak"),
    [
        (16, 16),  # all 16 at once: the cycle waits for the API server once
        (4, 4),  # 4 at a time (the slow API answers the first 4 together), never more
        (32, 16),  # the bound above the number of victims: all of them
    ],
)
async def test_sixteen_slow_evictions_are_in_flight_together(
    apiserver: tuple[FakeEvictionApi, ApiClient], concurrency: int, peak: int
) -> None:
    fake, api = apiserver
    fake.together = peak  # nothing is answered before `peak` evictions are in flight
    outcomes = await evict_all(api, keys(16), EvictionLimits(concurrency, LONG_S))
    assert outcomes == dict.fromkeys(keys(16), "evicted")
    assert fake.peak == peak
    assert sorted(fake.calls) == sorted(f"a-{i}" for i in range(16))  # each tried once


async def test_each_outcome_of_an_eviction(apiserver: tuple[FakeEvictionApi, ApiClient]) -> None:
    fake, api = apiserver
    fake.answers = {"ok": 201, "budget": 429, "gone": 404, "broken": 500, "slow": HANG}
    outcomes = await evict_all(api, [f"ns/{name}" for name in fake.answers], EvictionLimits(4, SHORT_S))
    assert outcomes == {
        "ns/ok": "evicted",
        "ns/budget": "blocked",  # a PodDisruptionBudget refused (429): reported, never bypassed
        "ns/gone": "gone",
        "ns/broken": "failed",
        "ns/slow": "timed_out",  # given up; the picture shows later whether the pod went
    }


async def test_an_unreachable_api_server_is_a_failed_eviction() -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ApiClient(Configuration(host=f"http://127.0.0.1:{port}")) as api:
        assert await evict_all(api, ["ns/p"], EvictionLimits(1, SHORT_S)) == {"ns/p": "failed"}


def picture_of(*names: str) -> ClusterPicture:
    picture = ClusterPicture()
    picture.replace("Pod", [objects.pod("ns", name, queue=name.split("-")[0]) for name in names])
    return picture


PLANNED = 1_700_000_000.0  # when a test's plans were made (epoch s)


def victim(key: str, gpu: int) -> RunningPod:
    return RunningPod(key, "a", "n1", ((gpu, 1000),))


def waiting(key: str, gpus: int = 1) -> PendingPod:
    return PendingPod(key, "b", GpuDemand(gpus), {"gpu": float(gpus)})


def reclaim_plan(served: str, victims: list[str]) -> Plan:
    """A plan as `apply_plan` leaves it: it holds the GPUs its victims free for the served pod."""
    evictions = tuple(Eviction(victim(key, i), f"reclaimed for {served}") for i, key in enumerate(victims))
    hold = HeldGpus(served, "b", "n1", tuple((i, 1000) for i in range(len(victims))))
    return Plan(
        "reclaim", waiting(served, len(victims)), "n1", evictions, len(victims), len(victims), (hold,)
    )


def counter(metrics: ExtenderMetrics, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


async def test_a_sixteen_victim_plan_evicts_side_by_side_and_holds_the_gpus(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    fake, api = apiserver
    fake.together = 16  # a slow Eviction API: it answers once all 16 are asked
    picture = picture_of("b-0", *(f"a-{i}" for i in range(16)))
    metrics = ExtenderMetrics(picture)
    loop = ReclaimLoop(api, picture, metrics, ReclaimOptions(evictions=EvictionLimits(16, LONG_S)))
    chosen = reclaim_plan("ns/b-0", keys(16))
    assert await loop.carry_out([chosen]) == [chosen]
    assert fake.peak == 16
    assert picture.held_for("ns/b-0") is not None
    assert counter(metrics, "tessera_reclaim_evictions_total", outcome="evicted") == 16
    assert loop.counts.evicted_from["a"] == 16 and loop.counts.reclaimed_for["b"] == 16
    assert sorted(fake.events) == sorted(
        [*((f"a-{i}", "Reclaimed") for i in range(16)), ("b-0", "ReclaimPlanned")]
    )


async def test_the_freed_gpus_are_held_before_the_first_eviction(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    # A victim can be gone, and its controller's replacement filtered, before the cycle's other
    # evictions and events are done: the replacement must find what the plan frees held already
    # (made after them, the hold came too late for a waiting gang in 1 live run of 4 under load).
    fake, api = apiserver
    picture = picture_of("b-0", "a-0", "a-1")
    loop = ReclaimLoop(
        api, picture, ExtenderMetrics(picture), ReclaimOptions(evictions=EvictionLimits(16, LONG_S))
    )
    held_when_evicted: dict[str, bool] = {}
    fake.on_evict = lambda name: held_when_evicted.update({name: picture.held_for("ns/b-0") is not None})
    chosen = reclaim_plan("ns/b-0", ["ns/a-0", "ns/a-1"])
    assert await loop.carry_out([chosen]) == [chosen]
    assert held_when_evicted == {"a-0": True, "a-1": True}


async def test_the_work_each_eviction_throws_away_is_counted_per_queue(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    _, api = apiserver
    picture = picture_of("b-0", "a-0", "a-1")
    metrics = ExtenderMetrics(picture)
    loop = ReclaimLoop(api, picture, metrics, ReclaimOptions(evictions=EvictionLimits(16, LONG_S)))
    chosen = reclaim_plan("ns/b-0", ["ns/a-0", "ns/a-1"])
    # a-0 started 100 s before the plan, a-1 30 s: 1 GPU each, 100 + 30 GPU-seconds lost.
    chosen = replace(
        chosen,
        evictions=(
            replace(chosen.evictions[0], pod=replace(chosen.evictions[0].pod, started=PLANNED - 100)),
            replace(chosen.evictions[1], pod=replace(chosen.evictions[1].pod, started=PLANNED - 30)),
        ),
    )
    assert await loop.carry_out([chosen], PLANNED) == [chosen]
    assert counter(metrics, "tessera_reclaim_lost_gpu_seconds_total", queue="a") == 130


async def test_a_victim_without_an_answer_still_leaves_the_gpus_held(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    fake, api = apiserver
    fake.answers = {"a-1": HANG}
    picture = picture_of("b-0", "a-0", "a-1")
    metrics = ExtenderMetrics(picture)
    loop = ReclaimLoop(api, picture, metrics, ReclaimOptions(evictions=EvictionLimits(16, SHORT_S)))
    chosen = reclaim_plan("ns/b-0", ["ns/a-0", "ns/a-1"])
    assert await loop.carry_out([chosen]) == [chosen]
    # No answer is no refusal: as for a failed call, the GPUs are held for the served pod (a-1
    # may well be going; the next cycle sees it in the picture), and a-1 is not counted evicted.
    assert picture.held_for("ns/b-0") is not None
    timed_out = counter(metrics, "tessera_reclaim_evictions_total", outcome="timed_out")
    assert (timed_out, loop.counts.evicted_from["a"]) == (1, 1)
    assert sorted(fake.events) == [("a-0", "Reclaimed"), ("b-0", "ReclaimPlanned")]


async def test_a_blocked_victim_drops_its_plan_only(apiserver: tuple[FakeEvictionApi, ApiClient]) -> None:
    fake, api = apiserver
    fake.answers = {"a-1": 429, "a-3": 404}
    fake.together = 4  # both plans' victims at once, or no answer
    picture = picture_of("b-0", "b-1", "a-0", "a-1", "a-2", "a-3")
    metrics = ExtenderMetrics(picture)
    loop = ReclaimLoop(api, picture, metrics, ReclaimOptions(evictions=EvictionLimits(16, LONG_S)))
    blocked = reclaim_plan("ns/b-0", ["ns/a-0", "ns/a-1"])
    served = reclaim_plan("ns/b-1", ["ns/a-2", "ns/a-3"])
    assert await loop.carry_out([blocked, served]) == [served]
    # b-0's plan: a-1's budget refused; a-0 went (its GPU goes to whoever the scheduler picks),
    # no hold for b-0, and a-1 is left alone for blocked_retry_s.
    assert picture.held_for("ns/b-0") is None and "ns/a-1" in loop._blocked
    # b-1's plan: a-2 evicted, a-3 was gone already: carried out, its GPUs held.
    assert picture.held_for("ns/b-1") is not None
    assert loop.counts.evicted_from["a"] == 2 and loop.counts.reclaimed_for["b"] == 2  # a-0, a-2
    assert sorted(fake.events) == [
        ("a-0", "Reclaimed"),
        ("a-1", "EvictionBlocked"),
        ("a-2", "Reclaimed"),
        ("b-0", "EvictionBlocked"),
        ("b-1", "ReclaimPlanned"),
    ]
    outcomes = {
        o: counter(metrics, "tessera_reclaim_evictions_total", outcome=o)
        for o in ("evicted", "blocked", "gone")
    }
    assert outcomes == {"evicted": 2, "blocked": 1, "gone": 1}


def move_plan(served: str, movers: list[str], first_gpu: int) -> MovePlan:
    moves = tuple(
        Move(RunningPod(key, "a", "n1", ((first_gpu + i, 500),), movable=True), "n2", f"moved for {served}")
        for i, key in enumerate(movers)
    )
    return MovePlan("consolidate", "n1", moves, 1.0, waiting(served))


async def test_a_rack_freed_for_a_gang_holds_each_members_gpus_for_the_gang(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    # The plan of `plan_domain_moves`: a-0 (n3) and a-1 (n4) move out of rack r2 so that gang
    # Job/ns/g's members g-0 and g-1 fit there, one on each node.
    fake, api = apiserver
    picture = picture_of("g-0", "g-1", "a-0", "a-1")
    options = ConsolidationOptions(evictions=EvictionLimits(16, LONG_S))
    consolidator = Consolidator(api, picture, ExtenderMetrics(picture), options)
    members = tuple(
        (replace(waiting(f"ns/g-{i}"), workload="Job/ns/g"), node) for i, node in enumerate(["n3", "n4"])
    )
    moves = tuple(
        Move(RunningPod(f"ns/a-{i}", "a", node, ((0, 1000),), movable=True), "n1", "moved out of r2")
        for i, node in enumerate(["n3", "n4"])
    )
    chosen = MovePlan("consolidate", "n3", moves, 2.0, members[0][0], "r2", members)
    assert await consolidator.carry_out([chosen]) == [chosen]
    # Each member's GPU is held on its node for any member of the gang (not only for that pod).
    for member, node in members:
        hold = picture.held_for(member.key)
        assert hold is not None and (hold.node, hold.owner) == (node, "Job/ns/g")
    assert sorted(fake.events) == [("a-0", "Moved"), ("a-1", "Moved"), ("g-0", "ConsolidationPlanned")]
    assert "so the 2 waiting pods of its gang fit in r2" in fake.messages[("g-0", "ConsolidationPlanned")]


@pytest.mark.parametrize(
    ("answer", "result", "why"),
    [
        (429, "blocked", "is blocked by a PodDisruptionBudget; not bypassed"),
        (500, "failed", "failed"),
        (HANG, "failed", "got no answer within 1s"),
    ],
)
async def test_a_mover_not_evicted_drops_its_move_plan(
    apiserver: tuple[FakeEvictionApi, ApiClient], answer: int, result: str, why: str
) -> None:
    fake, api = apiserver
    fake.answers = {"a-1": answer}
    picture = picture_of("b-0", "b-1", "a-0", "a-1", "a-2", "a-3")
    metrics = ExtenderMetrics(picture)
    # (only the unanswered call is waited out; an answer may take long on a busy machine)
    options = ConsolidationOptions(evictions=EvictionLimits(16, SHORT_S if answer == HANG else LONG_S))
    consolidator = Consolidator(api, picture, metrics, options)
    dropped = move_plan("ns/b-0", ["ns/a-0", "ns/a-1"], 0)
    moved = move_plan("ns/b-1", ["ns/a-2", "ns/a-3"], 2)
    assert await consolidator.carry_out([dropped, moved]) == [moved]
    # b-0's plan is dropped and its hold released; a-1 is not tried again for blocked_retry_s.
    assert picture.held_for("ns/b-0") is None and "ns/a-1" in consolidator._pinned()
    assert picture.held_for("ns/b-1") is not None
    # Every mover evicted is followed up (its successor checked), a-0 too.
    assert sorted(m.key for m in consolidator.moved) == ["ns/a-0", "ns/a-2", "ns/a-3"]
    assert counter(metrics, "tessera_consolidation_plans_total", result=result) == 1
    assert counter(metrics, "tessera_consolidation_plans_total", result="carried_out") == 1
    assert sorted(fake.events) == [
        ("a-0", "Moved"),
        ("a-1", "MoveBlocked"),
        ("a-2", "Moved"),
        ("a-3", "Moved"),
        ("b-0", "MoveBlocked"),
        ("b-1", "ConsolidationPlanned"),
    ]
    assert f"moving ns/a-1 for ns/b-0 {why}; the plan is dropped" in fake.messages[("b-0", "MoveBlocked")]


def owned(name: str, owner: str, created: str = "") -> dict[str, object]:
    """A pod of queue `a` whose controller is the ReplicaSet `owner` (created at `created`, an
    RFC 3339 time, when given)."""
    pod = objects.pod("ns", name, queue="a")
    if created:
        pod["metadata"]["creationTimestamp"] = created
    pod["metadata"]["ownerReferences"] = [objects.replica_set_owner(owner)]
    return pod


async def test_pods_of_an_owner_evicted_from_are_spared_for_a_while_after_their_restart(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    # a-0 (ReplicaSet rs-a) is evicted for b-0. Its replacement a-1 (rs-a, started after the
    # eviction) is no victim for recent_victim_s (rule 8); a-2 of another ReplicaSet is.
    _, api = apiserver
    picture = ClusterPicture()
    picture.replace("Pod", [owned("a-0", "rs-a"), objects.pod("ns", "b-0", queue="b")])
    loop = ReclaimLoop(
        api, picture, ExtenderMetrics(picture), ReclaimOptions(evictions=EvictionLimits(16, LONG_S))
    )
    assert await loop.carry_out([reclaim_plan("ns/b-0", ["ns/a-0"])])
    picture.replace("Pod", [owned("a-1", "rs-a"), owned("a-2", "rs-other")])
    restarted = time.time()  # after the eviction was recorded
    running = {
        key: RunningPod(key, "a", "n1", ((gpu, 1000),), {"gpu": 1.0}, started=restarted)
        for gpu, key in enumerate(["ns/a-1", "ns/a-2"])
    }
    rules = loop.rules()
    for now, spared in [(restarted + 10, {"ns/a-1"}), (restarted + rules.recent_victim_s, set())]:
        snapshot = ClusterSnapshot({}, running, FairnessSnapshot.build([], {}, {}), WorkloadMix(()))
        loop._spare_restarts(snapshot, now, rules)
        assert {key for key, pod in snapshot.running.items() if not pod.preemptible} == spared


@pytest.mark.parametrize(
    ("argv", "name", "value"),
    [
        ([], "partly_owed_wait_s", math.inf),  # the default: owed less than its pod, never (rule 9)
        (["--partly-owed-wait-s=120"], "partly_owed_wait_s", 120.0),
        (["--partly-owed-wait-s=0"], "partly_owed_wait_s", 0.0),  # at once, as before rule 9
        ([], "whole_owed_wait_s", Rules.whole_owed_wait_s),  # the planner's own default (rule 13)
        (["--whole-owed-wait-s=20"], "whole_owed_wait_s", 20.0),
        (["--whole-owed-wait-s=0"], "whole_owed_wait_s", 0.0),  # at once, as before rule 13
        ([], "max_victim_evictions", 0),  # the default: no budget (rule 14 off, today's victims)
        (["--max-victim-evictions=3"], "max_victim_evictions", 3),
        ([], "victim_lead_s", math.inf),  # the default: any victim (rule 15 off)
        (["--victim-lead-s=60"], "victim_lead_s", 60.0),
        (["--victim-lead-per-wait=0.5"], "victim_lead_per_wait", 0.5),
    ],
)
async def test_a_reclaim_flag_reaches_the_planners_rules(
    apiserver: tuple[FakeEvictionApi, ApiClient], argv: list[str], name: str, value: float
) -> None:
    # The flag's parsed value, read back as the extender does, is the rule of that name.
    _, api = apiserver
    picture = ClusterPicture()
    options = ReclaimOptions(rule_flags=rule_flags(parse_args(argv)))
    loop = ReclaimLoop(api, picture, ExtenderMetrics(picture), options)
    assert getattr(loop.rules(), name) == value


async def test_a_replacement_of_a_pod_evicted_its_budget_is_spared(
    apiserver: tuple[FakeEvictionApi, ApiClient],
) -> None:
    # Budget 2. a-0 (ReplicaSet rs-a) is evicted for b-0, and its replacement a-1 for b-1: two
    # evictions of one replica. a-2, a-1's replacement, inherits 2 and is no victim (rule 14);
    # a-9 of another ReplicaSet is. With rule 8's window 0, only the budget spares.
    _, api = apiserver
    picture = ClusterPicture()
    options = ReclaimOptions(
        evictions=EvictionLimits(16, LONG_S), recent_victim_s=0, rule_flags=RuleFlags(max_victim_evictions=2)
    )
    loop = ReclaimLoop(api, picture, ExtenderMetrics(picture), options)

    later = "2999-01-01T00:00:00Z"  # created after the evictions: a replacement
    for victim, served in [("a-0", "b-0"), ("a-1", "b-1")]:
        picture.replace("Pod", [owned(victim, "rs-a", later), objects.pod("ns", served, queue="b")])
        loop.spent_victims.follow(picture.kind("Pod"), time.time())
        assert await loop.carry_out([reclaim_plan(f"ns/{served}", [f"ns/{victim}"])])
    picture.replace("Pod", [owned("a-2", "rs-a", later), owned("a-9", "rs-other")])
    running = {
        key: RunningPod(key, "a", "n1", ((gpu, 1000),), {"gpu": 1.0}, started=time.time())
        for gpu, key in enumerate(["ns/a-2", "ns/a-9"])
    }
    snapshot = ClusterSnapshot({}, running, FairnessSnapshot.build([], {}, {}), WorkloadMix(()))
    loop._spare_spent(snapshot, time.time(), loop.rules())
    assert {key for key, pod in snapshot.running.items() if not pod.preemptible} == {"ns/a-2"}
    assert loop.spent_victims.replica_of == {"ns/a-2": "ns/a-1"}
