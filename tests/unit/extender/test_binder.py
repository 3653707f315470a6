"""Bind verifies what it is asked, and answers with an Error (never an HTTP error) when it may
not bind or the apiserver fails. The apiserver here is a small aiohttp stand-in; the real one is
in tests/integration/test_install.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from extender import binder as binder_module
from extender.binder import Binder, FilteredNodes, bind_refusal
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.wire import ExtenderBindingArgs
from tessera.dev.localcluster import free_port
from tests import extender_objects as objects


def bind_args(node: str = "a", name: str = "p", uid: str | None = "uid-ns-p") -> ExtenderBindingArgs:
    return ExtenderBindingArgs(PodName=name, PodNamespace="ns", PodUID=uid or "", Node=node)


def cordoned(name: str) -> dict[str, Any]:
    node = objects.node(name)
    node["spec"] = {"unschedulable": True}
    return node


def deleting(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return obj


def finished(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["phase"] = "Succeeded"
    return pod


def tolerating_cordon(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    return pod


@pytest.mark.parametrize(
    ("args", "pod", "node", "expected"),
    [
        (bind_args(), objects.pod("ns", "p"), objects.node("a"), ""),
        (bind_args(), None, objects.node("a"), "pod ns/p does not exist"),
        (bind_args(uid="other"), objects.pod("ns", "p"), objects.node("a"), "has UID uid-ns-p, not other"),
        (bind_args(uid=None), objects.pod("ns", "p"), objects.node("a"), "names no pod UID"),
        (bind_args(), deleting(objects.pod("ns", "p")), objects.node("a"), "pod ns/p is being deleted"),
        (bind_args(), finished(objects.pod("ns", "p")), objects.node("a"), "has finished (phase Succeeded)"),
        (bind_args(), objects.pod("ns", "p"), None, "node a does not exist"),
        (bind_args(), objects.pod("ns", "p"), deleting(objects.node("a")), "node a is being deleted"),
        (bind_args(), objects.pod("ns", "p"), cordoned("a"), "node a is cordoned"),
        (bind_args(), tolerating_cordon(objects.pod("ns", "p")), cordoned("a"), ""),
    ],
)
def test_bind_refusal_names_what_is_wrong(
    args: ExtenderBindingArgs, pod: dict[str, Any] | None, node: dict[str, Any] | None, expected: str
) -> None:
    refusal = bind_refusal(args, pod, node)
    assert (refusal == "") if not expected else (expected in refusal), refusal


def test_bind_refusal_checks_the_scheduler_and_the_nodes_the_filter_passed() -> None:
    pod, node = objects.pod("ns", "p", scheduler="tessera"), objects.node("a")
    assert "belongs to scheduler tessera" in bind_refusal(bind_args(), pod, node, scheduler_names={"other"})
    assert bind_refusal(bind_args(), pod, node, scheduler_names={"tessera"}) == ""
    assert "was not filtered" in bind_refusal(bind_args(), pod, node, require_filtered=True)
    passed_b = bind_refusal(bind_args(), pod, node, passed={"b"}, require_filtered=True)
    assert "not among the nodes the filter passed" in passed_b
    assert bind_refusal(bind_args(), pod, node, passed={"a", "b"}, require_filtered=True) == ""


def test_filtered_nodes_are_bounded_and_forgotten() -> None:
    filtered = FilteredNodes(max_pods=2, max_names=5)
    filtered.remember("u1", ["a", "b"])
    filtered.remember("u2", ["a"])
    filtered.remember("u3", ["c"])  # a third pod: the oldest record goes
    assert filtered.passed("u1") is None
    assert filtered.passed("u2") == ("a",) and filtered.passed("u3") == ("c",)
    filtered.remember("u4", ["a", "b", "c", "d"])  # 5 names in two records would be 5: u3 + u4
    assert filtered.passed("u2") is None and filtered.passed("u4") == ("a", "b", "c", "d")
    filtered.forget("u4")
    assert filtered.passed("u4") is None
    expired = FilteredNodes(ttl_s=-1.0)
    expired.remember("u", ["a"])
    assert expired.passed("u") is None


class FakeApiserver:
    """Answers pod reads and bindings; `delay` makes every answer slow."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.delay = 0.0
        self.app = web.Application()
        self.app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self.get_pod)
        self.app.router.add_post("/api/v1/namespaces/{ns}/pods/{name}/binding", self.bind)

    async def get_pod(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        pod = self.pods.get(f"{request.match_info['ns']}/{request.match_info['name']}")
        if pod is None:
            return web.json_response({"kind": "Status", "message": "pods not found"}, status=404)
        return web.json_response(pod)

    async def bind(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        self.bindings.append(await request.json())
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[FakeApiserver, ApiClient]]:
    fake = FakeApiserver()
    async with TestServer(fake.app) as server:
        configuration = Configuration(host=str(server.make_url("")).rstrip("/"))
        async with ApiClient(configuration) as api:
            yield fake, api


def picture_of(*extra: dict[str, Any]) -> ClusterPicture:
    picture = ClusterPicture(PictureConfig(scheduler_names=frozenset({"default-scheduler"})))
    picture.replace("Node", [objects.node("a"), objects.node("b")])
    picture.replace("Pod", list(extra))
    return picture


async def test_a_pending_pod_is_bound_with_its_uid_as_precondition(
    apiserver: tuple[FakeApiserver, ApiClient],
) -> None:
    fake, api = apiserver
    picture = picture_of(objects.pod("ns", "p"))
    assert await Binder(api, picture).bind(bind_args()) == ""
    (binding,) = fake.bindings
    assert binding["metadata"]["uid"] == "uid-ns-p" and binding["target"]["name"] == "a"
    assert picture.pod_node("ns/p", picture.kind("Pod")["ns/p"]) == "a"


async def test_a_pod_the_picture_lacks_is_read_and_a_missing_one_refused(
    apiserver: tuple[FakeApiserver, ApiClient],
) -> None:
    fake, api = apiserver
    binder = Binder(api, picture_of())
    assert "pod ns/p does not exist" in await binder.bind(bind_args())
    fake.pods["ns/p"] = objects.pod("ns", "p", node_name="b")
    assert "already bound to node b, not a" in await binder.bind(bind_args())
    fake.pods["ns/q"] = objects.pod("ns", "q")
    assert (
        await binder.bind(bind_args(name="q", uid="uid-ns-q", node="nowhere"))
        == "node nowhere does not exist"
    )
    assert fake.bindings == []


async def test_only_nodes_the_filter_passed_are_bound_when_required(
    apiserver: tuple[FakeApiserver, ApiClient],
) -> None:
    fake, api = apiserver
    binder = Binder(api, picture_of(objects.pod("ns", "p")), require_filtered=True)
    assert "was not filtered" in await binder.bind(bind_args())
    binder.filtered.remember("uid-ns-p", ["b"])
    assert "not among the nodes the filter passed" in await binder.bind(bind_args(node="a"))
    assert await binder.bind(bind_args(node="b")) == ""
    assert [b["target"]["name"] for b in fake.bindings] == ["b"]
    assert binder.filtered.passed("uid-ns-p") is None  # used up by the bind


async def test_a_slow_apiserver_is_an_error_field_not_a_timeout(
    apiserver: tuple[FakeApiserver, ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, api = apiserver
    monkeypatch.setattr(binder_module, "API_TIMEOUT_S", 0.2)
    fake.delay = 5.0
    error = await Binder(api, picture_of(objects.pod("ns", "p"))).bind(bind_args())
    assert "failed: the apiserver did not answer within 0.2 s" in error
    error = await Binder(api, picture_of()).bind(bind_args())  # the pod must be read first
    assert "reading the pod failed: the apiserver did not answer" in error


async def test_an_unreachable_apiserver_is_an_error_field() -> None:
    async with ApiClient(Configuration(host=f"http://127.0.0.1:{free_port()}")) as api:
        error = await Binder(api, picture_of(objects.pod("ns", "p"))).bind(bind_args())
    assert error.startswith("binding pod ns/p to node a failed:"), error
