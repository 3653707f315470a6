"""What the hot path hands the status writer (which pod conditions and Events to write), and what
the writer writes: on each pod and, summed up, on its owner, once per reason."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from contract.names import QUEUE_GROUP, QUEUE_PLURAL, QUEUE_VERSION
from extender.kubeapi import JsonObject
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.status import MIN_REWRITE_S, PodReport, StatusWriter, WaitingPods
from tests import extender_objects as objects
from tests.unit.extender.test_gangs import cluster, job, member

QUEUES_PATH = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"


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


class RecordingApi:
    """The API calls the status writer makes: pod status patches and events."""

    def __init__(self) -> None:
        self.conditions: list[tuple[str, JsonObject]] = []  # (pod, the condition written)
        self.events: list[JsonObject] = []

    async def patch_status(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.conditions.append((request.match_info["name"], body["status"]["conditions"][0]))
        return web.json_response({})

    async def post_event(self, request: web.Request) -> web.Response:
        self.events.append(await request.json())
        return web.json_response({}, status=201)

    def said(self) -> list[tuple[str, str, str, str]]:
        """Each event as (kind, name, reason, message), in order; forgets them."""
        found = [
            (e["involvedObject"]["kind"], e["involvedObject"]["name"], e["reason"], e["message"])
            for e in self.events
        ]
        self.events.clear()
        return found


@contextlib.asynccontextmanager
async def recording_api(recorder: RecordingApi) -> AsyncIterator[ApiClient]:
    app = web.Application()
    app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{name}/status", recorder.patch_status)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", recorder.post_event)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = ApiClient(Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}"))
    try:
        yield api
    finally:
        await api.close()
        await runner.cleanup()


LIMIT = "queue 'team': gpu allocated 4 + request 1 would exceed its limit (4)"
SAID = f"{LIMIT}; waits for the queue's running pods to finish, or for its limit to be raised"


async def test_pods_and_their_job_hear_why_once_per_reason() -> None:
    # Job "ja": 3 pods (each a pod alone: minimum 1), 2 of them held back at the limit.
    pods = [member("ja", i, min_members=1) for i in range(3)]
    picture = ClusterPicture()
    objs = cluster(job("ja", 3), *pods)
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    recorder, waiting = RecordingApi(), WaitingPods()
    async with recording_api(recorder) as api:
        writer = StatusWriter(api, picture, waiting, ExtenderMetrics(picture))
        for name in ("ja-0", "ja-1"):
            waiting.refused("ns", name, f"uid-ns-{name}", "team", LIMIT, "over_limit")
        await writer._report_once()
        assert sorted(recorder.said()) == [
            ("Job", "ja", "PodsWaiting", f"2 of 3 pods wait: {SAID}"),
            ("Pod", "ja-0", "QueueAtLimit", SAID),
            ("Pod", "ja-1", "QueueAtLimit", SAID),
        ]
        assert {c["reason"] for _, c in recorder.conditions} == {"QueueAtLimit"}
        # The third waits for the same reason: its own event; the Job's summary says the same.
        waiting.refused("ns", "ja-2", "uid-ns-ja-2", "team", LIMIT, "over_limit")
        await writer._report_once()
        assert recorder.said() == [("Pod", "ja-2", "QueueAtLimit", SAID)]
        # Another reason for all three (the queue is gone): each pod and the Job hear it once.
        for index in range(3):
            waiting.refused(
                "ns",
                f"ja-{index}",
                f"uid-ns-ja-{index}",
                "team",
                "queue 'team' does not exist",
                "unknown_queue",
            )
        await writer._report_once()
        gone = (
            "queue 'team' does not exist; waits for that Queue to be created; "
            "or recreate the pod naming an existing queue"
        )
        assert recorder.said().count(("Job", "ja", "PodsWaiting", f"3 of 3 pods wait: {gone}")) == 1
        # Admitted: the conditions turn True, no event; the next wait is news for the Job again.
        recorder.conditions.clear()
        for index in range(3):
            waiting.admitted("ns", f"ja-{index}", f"uid-ns-ja-{index}", "admitted")
        await writer._report_once()
        assert recorder.said() == [] and {c["status"] for _, c in recorder.conditions} == {"True"}
        waiting.refused("ns", "ja-0", "uid-ns-ja-0", "team", LIMIT, "over_limit")
        await writer._report_once()
        assert ("Job", "ja", "PodsWaiting", f"1 of 3 pods wait: {SAID}") in recorder.said()


async def test_a_queue_created_while_statuses_are_written_waits_for_the_next_pass() -> None:
    # Queues a and b need their status written; while a's PATCH is in flight, the watch delivers
    # a new queue c. The pass goes on with a and b (before: "dictionary changed size during
    # iteration", the pass lost); c's status is the next pass's.
    picture = ClusterPicture()
    picture.replace("Queue", [objects.queue("a"), objects.queue("b")])
    for kind in WATCHED_PATHS:
        if kind != "Queue":
            picture.replace(kind, [])
    patched: list[str] = []

    async def patch_queue_status(request: web.Request) -> web.Response:
        patched.append(request.match_info["name"])
        if len(patched) == 1:
            picture.apply("Queue", "ADDED", objects.queue("c"))
        return web.json_response({})

    app = web.Application()
    app.router.add_patch(f"{QUEUES_PATH}/{{name}}/status", patch_queue_status)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    async with ApiClient(Configuration(host=f"http://127.0.0.1:{runner.addresses[0][1]}")) as api:
        writer = StatusWriter(api, picture, WaitingPods(), ExtenderMetrics(picture))
        await writer.write_queue_statuses()
        assert sorted(patched) == ["a", "b"]
        await writer.write_queue_statuses()
        assert sorted(patched) == ["a", "b", "c"]
    await runner.cleanup()
