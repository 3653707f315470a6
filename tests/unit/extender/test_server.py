"""The extender's HTTP verbs over a plain-data cluster picture, through aiohttp's test client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from kubernetes_asyncio.client import ApiClient

from extender import serving
from extender.__main__ import parse_args
from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.placement import GpuDemand
from extender.policy.waiting import wait_message, wait_reason
from extender.server import build_app
from extender.status import ADMITTED_CONDITION, StatusWriter, WaitingPods
from tests import extender_objects as objects
from tests.unit.extender.serving import serve

CLASS = "gpu.tessera.dev"


class Extender:
    def __init__(
        self, client: TestClient[Any, Any], picture: ClusterPicture, waiting: WaitingPods, api: ApiClient
    ) -> None:
        self.client, self.picture, self.waiting, self.api = client, picture, waiting, api

    def sync(self, objs: list[dict[str, Any]]) -> None:
        for kind in WATCHED_PATHS:
            self.picture.replace(kind, [o for o in objs if o["kind"] == kind])

    async def call(self, verb: str, body: Any) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) else json.dumps(body)
        response = await self.client.post(f"/{verb}", data=data)
        text = await response.text()
        return response.status, (json.loads(text) if response.status == 200 else text)


@pytest.fixture
async def extender() -> AsyncIterator[Extender]:
    picture, waiting = ClusterPicture(), WaitingPods()
    api = ApiClient()
    app = build_app(
        picture, Binder(api, picture), waiting, ExtenderMetrics(picture), max_body_bytes=64 * 1024
    )
    async with serve(app) as client:
        yield Extender(client, picture, waiting, api)
    await api.close()


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Node a: 2 GPUs, one in use by team-a; node b: 2 idle GPUs; team-a may hold at most 2 GPUs."""
    held = objects.pod("ns", "held", queue="team-a", template="one", node_name="a")
    held["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "held-gpus"}]
    return [
        *objects.two_nodes_of_two_gpus(CLASS),
        objects.claim_template("ns", "two", objects.claim_spec(CLASS, count=2)),
        objects.claim("ns", "held-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
        held,
        objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": 2}}),
        objects.queue("team-b", resources={"gpu": {"quota": 3}}),
        *extra,
    ]


def args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


async def test_filter_keeps_nodes_whose_free_gpus_fit(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-b", template="two")
    extender.sync(cluster(pod))
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert status == 200
    assert result["NodeNames"] == ["b"]
    assert "not enough free GPU for 2 GPUs" in result["FailedNodes"]["a"]
    assert "1 free over 2 GPUs" in result["FailedNodes"]["a"]
    assert result["Error"] == ""


async def test_filter_answers_a_node_list_with_node_objects(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-b", template="two")
    extender.sync(cluster(pod))
    node_list = {"kind": "NodeList", "apiVersion": "v1", "items": [objects.node("a"), objects.node("b")]}
    status, result = await extender.call("filter", {"Pod": pod, "Nodes": node_list, "NodeNames": None})
    assert status == 200
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["b"]
    assert result["Nodes"]["items"][0] == objects.node("b")


async def test_filter_refuses_every_node_past_the_queue_limit(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    extender.sync(cluster(pod))
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert status == 200
    assert result["NodeNames"] == []
    reasons = result["FailedAndUnresolvableNodes"]
    assert set(reasons) == {"a", "b"}
    assert "queue 'team-a'" in reasons["a"] and "limit (2)" in reasons["a"] and "allocated 1" in reasons["a"]
    assert extender.waiting.waiting["ns/p"].reason == reasons["a"]
    assert extender.waiting.reports["ns/p"][3] is False  # a False condition is to be written


async def test_refused_pod_becomes_eligible_once_capacity_is_freed(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    extender.sync(cluster(pod))
    await extender.call("filter", args(pod, ["a", "b"]))
    writer = StatusWriter(extender.api, extender.picture, extender.waiting, ExtenderMetrics(extender.picture))
    assert writer.eligible_now() == []
    extender.picture.apply("Pod", "DELETED", objects.pod("ns", "held"))
    assert [entry.name for entry in writer.eligible_now()] == ["p"]
    extender.picture.apply("ResourceClaim", "DELETED", objects.claim("ns", "held-gpus", {}))
    # Admitted on the retry: the wait entry goes and a True condition is queued.
    _, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert result["NodeNames"] == ["a", "b"]
    assert "ns/p" not in extender.waiting.waiting
    assert extender.waiting.reports["ns/p"][3] is True


async def test_a_new_instance_picks_up_pods_an_earlier_one_refused(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    pod["status"]["conditions"] = [
        {
            "type": ADMITTED_CONDITION,
            "status": "False",
            "reason": "WaitingForQueue",
            "message": "queue 'team-a': over its limit",
        }
    ]
    extender.sync(cluster(pod))
    writer = StatusWriter(extender.api, extender.picture, extender.waiting, ExtenderMetrics(extender.picture))
    assert writer.eligible_now() == []
    assert extender.waiting.waiting["ns/p"].reason == "queue 'team-a': over its limit"
    extender.picture.apply("Pod", "DELETED", objects.pod("ns", "held"))
    extender.picture.apply("ResourceClaim", "DELETED", objects.claim("ns", "held-gpus", {}))
    assert [entry.name for entry in writer.eligible_now()] == ["p"]


async def test_pods_without_gpus_or_queue_pass_untouched(extender: Extender) -> None:
    pod = objects.pod("ns", "web")
    extender.sync(cluster(pod))
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert (status, result["NodeNames"], result["FailedNodes"]) == (200, ["a", "b"], {})


async def test_filter_before_sync_is_an_error_for_the_scheduler_to_retry(extender: Extender) -> None:
    status, result = await extender.call("filter", args(objects.pod("ns", "p"), ["a"]))
    assert status == 200
    assert "syncing" in result["Error"]
    response = await extender.client.get("/readyz")
    assert response.status == 503
    assert "Node" in await response.text()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "malformed filter request"),
        ({"Pod": {"spec": {}}, "NodeNames": ["a"]}, "Pod.metadata"),
        ({"Pod": {"metadata": {"name": "p"}}, "NodeNames": "a"}, "NodeNames"),
    ],
)
async def test_malformed_requests_get_400_with_the_reason(extender: Extender, body: Any, needle: str) -> None:
    extender.sync(cluster())
    status, text = await extender.call("filter", body)
    assert status == 400
    assert needle in text
    status, _ = await extender.call("filter", args(objects.pod("ns", "p"), ["a"]))
    assert status == 200  # still serving


async def test_a_pod_with_an_unreadable_quantity_gets_400(extender: Extender) -> None:
    extender.sync(cluster())
    pod = objects.pod("ns", "p", queue="team-b", template="one", cpu="lots")
    status, text = await extender.call("filter", args(pod, ["a"]))
    assert status == 400
    assert "malformed filter request: unreadable pod" in text and "lots" in text
    status, _ = await extender.call("prioritize", args(pod, ["a"]))
    assert status == 200  # scoring reads only the GPU demand


def test_a_stored_pod_with_an_unreadable_quantity_is_not_counted() -> None:
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [objects.pod("ns", "odd", queue="q", cpu="lots")] if kind == "Pod" else [])
    assert picture.fairness().usage["default"].allocated == {}
    assert "q" not in picture.fairness().usage


async def test_oversized_body_gets_413(extender: Extender) -> None:
    status, _ = await extender.call("filter", b"x" * (65 * 1024))
    assert status == 413


async def test_a_body_that_stops_arriving_gets_408(
    extender: Extender, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "BODY_TIMEOUT_S", 0.05)
    port = extender.client.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # 10 bytes of the 100 announced, then nothing: the server answers without waiting for more.
    writer.write(b'POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"Pod": {}')
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    assert status_line.split()[1] == b"408"


async def test_prioritize_packs_by_default_and_spreads_when_the_queue_says_so(extender: Extender) -> None:
    spread = objects.queue("team-s", placement="spread")
    packed = objects.pod("ns", "p", queue="team-b", template="one")
    spreading = objects.pod("ns", "s", queue="team-s", template="one")
    extender.sync(cluster(packed, spreading, spread))
    status, scores = await extender.call("prioritize", args(packed, ["a", "b"]))
    assert status == 200
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["a"] > by_host["b"]  # fill the partly used node, keep b's pair of GPUs whole
    _, scores = await extender.call("prioritize", args(spreading, ["a", "b"]))
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host["b"] > by_host["a"]
    # A pod without GPUs is ranked too: on a, where one GPU is idle, rather than on b (two idle),
    # so b keeps room for the GPU pods (neither node reports CPU or memory here).
    _, scores = await extender.call("prioritize", args(objects.pod("ns", "web"), ["a", "b"]))
    assert scores == [{"Host": "a", "Score": 10}, {"Host": "b", "Score": 0}]


async def test_binding_a_bound_pod_again_is_idempotent_and_elsewhere_an_error(extender: Extender) -> None:
    extender.sync(cluster())
    bind = {"PodName": "held", "PodNamespace": "ns", "PodUID": "uid-ns-held", "Node": "a"}
    status, result = await extender.call("bind", bind)
    assert (status, result) == (200, {"Error": ""})
    status, result = await extender.call("bind", {**bind, "Node": "b"})
    assert status == 200
    assert "already bound to node a" in result["Error"]
    status, text = await extender.call("bind", {"PodName": "held"})
    assert status == 400 and "missing required field `PodNamespace`" in text


async def test_metrics_show_latency_decisions_and_queue_numbers(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    extender.sync(cluster(pod))
    await extender.call("filter", args(pod, ["a", "b"]))
    response = await extender.client.get("/metrics")
    text = await response.text()
    assert 'tessera_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'tessera_extender_decisions_total{outcome="refused",reason="over_limit",verb="filter"} 1.0' in text
    assert 'tessera_queue_allocated{queue="team-a",resource="gpu"} 1.0' in text
    assert 'tessera_queue_pending_pods{queue="team-a"} 1.0' in text
    assert 'tessera_queue_fair_share{queue="team-b",resource="gpu"} 0.0' in text
    assert (await extender.client.get("/healthz")).status == 200
    assert (await extender.client.get("/readyz")).status == 200


async def test_admissions_in_flight_count_against_the_limit(extender: Extender) -> None:
    first = objects.pod("ns", "p1", queue="team-a", template="one")
    second = objects.pod("ns", "p2", queue="team-a", template="one")
    extender.sync(cluster(first, second))
    _, result = await extender.call("filter", args(first, ["a", "b"]))
    assert result["NodeNames"] == ["a", "b"]
    # p1 is not bound yet, but the scheduler already filters p2: 1 held + p1 + p2 > limit 2.
    _, result = await extender.call("filter", args(second, ["a", "b"]))
    assert "limit (2)" in result["FailedAndUnresolvableNodes"]["a"]
    # Filtering p1 again does not count p1 twice.
    _, result = await extender.call("filter", args(first, ["a", "b"]))
    assert result["NodeNames"] == ["a", "b"]


def test_command_line_flags_env_fallbacks_and_tls_pairing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_EXTENDER_PORT", "9443")
    options = parse_args(
        ["--gpu-driver", "a.example.com", "--gpu-driver", "b.example.com", "--scheduler-name", "tessera"]
    )
    assert (options.port, options.gpu_driver, options.scheduler_name) == (
        9443,
        ["a.example.com", "b.example.com"],
        ["tessera"],
    )
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert-file", "tls.crt"])  # a certificate without its key
    with pytest.raises(SystemExit):
        parse_args(["--tls-client-ca-file", "ca.crt"])  # client checking needs TLS itself


async def test_fractional_pod_is_sized_against_each_nodes_gpu(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-b", template="thirty")
    extender.sync(
        [
            objects.node("big"),
            objects.node("small"),
            objects.device_class(CLASS),
            objects.gpu_slice("big", 1, shareable=True),
            objects.gpu_slice("small", 1, model="A100-40GB", memory="40Gi", shareable=True),
            objects.claim(
                "ns",
                "other",
                objects.claim_spec(CLASS, memory="20Gi"),
                allocated=[("small", "gpu-0", "20Gi")],
            ),
            objects.claim_template("ns", "thirty", objects.claim_spec(CLASS, memory="30Gi")),
            objects.queue("team-b"),
            pod,
        ]
    )
    _, result = await extender.call("filter", args(pod, ["big", "small"]))
    assert result["NodeNames"] == ["big"]  # 30Gi is 0.375 of the 80Gi GPU, 0.75 of the 40Gi one
    assert result["FailedNodes"]["small"].startswith("not enough free GPU for 0.75 of a GPU (0.5 free")


def _held(name: str, queue: str, node: str, device: str, priority: int = 0) -> list[dict[str, Any]]:
    pod = objects.pod("ns", name, queue=queue, template="one", node_name=node)
    pod["spec"]["priority"] = priority
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    claim = objects.claim("ns", f"{name}-gpus", objects.claim_spec(CLASS), allocated=[(node, device, None)])
    return [pod, claim]


async def test_preempt_keeps_only_nodes_whose_victims_the_queue_rules_allow(extender: Extender) -> None:
    # 2 nodes x 2 GPUs, all held. Quotas: hog 1, fair 1, urgent 2; urgent waits for 1 more GPU.
    # Fair shares of 4 GPUs: urgent 2 (quota 2, wants 2), hog 1, fair 1. hog holds 2 (above its
    # share), fair holds 1 (at it), urgent holds 1 (below it).
    # Node a: victim hog-1 -> hog keeps 1 = its share: allowed, kept.
    # Node b: victim fair-0 -> fair would fall to 0 < 1: dropped with the reason.
    pending = objects.pod("ns", "p", queue="urgent", template="one")
    pending["spec"]["priority"] = 1000
    extender.sync(
        [
            objects.node("a"),
            objects.node("b"),
            objects.gpu_slice("a", 2),
            objects.gpu_slice("b", 2),
            objects.device_class(CLASS),
            objects.claim_template("ns", "one", objects.claim_spec(CLASS)),
            objects.queue("hog", resources={"gpu": {"quota": 1}}),
            objects.queue("fair", resources={"gpu": {"quota": 1}}),
            objects.queue("urgent", resources={"gpu": {"quota": 2}}),
            *_held("hog-0", "hog", "a", "gpu-0"),
            *_held("hog-1", "hog", "a", "gpu-1"),
            *_held("fair-0", "fair", "b", "gpu-0"),
            *_held("urgent-0", "urgent", "b", "gpu-1"),
            pending,
        ]
    )
    body = {
        "Pod": pending,
        "NodeNameToMetaVictims": {
            "a": {"Pods": [{"UID": "uid-ns-hog-1"}], "NumPDBViolations": 0},
            "b": {"Pods": [{"UID": "uid-ns-fair-0"}], "NumPDBViolations": 1},
        },
    }
    status, result = await extender.call("preempt", body)
    assert status == 200
    assert result == {
        "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "uid-ns-hog-1"}], "NumPDBViolations": 0}}
    }
    # The same with full pods (nodeCacheCapable=false) decides alike.
    body = {
        "Pod": pending,
        "NodeNameToVictims": {
            "a": {"Pods": [_held("hog-1", "hog", "a", "gpu-1")[0]], "NumPDBViolations": 0},
            "b": {"Pods": [_held("fair-0", "fair", "b", "gpu-0")[0]], "NumPDBViolations": 1},
        },
    }
    status, result = await extender.call("preempt", body)
    assert status == 200 and list(result["NodeNameToMetaVictims"]) == ["a"]
    status, text = await extender.call(
        "preempt", {"Pod": pending, "NodeNameToMetaVictims": {"a": {"Pods": [{}]}}}
    )
    assert status == 400 and "UID" in text


async def test_a_fraction_is_admitted_at_the_candidate_nodes_gpu_size(extender: Extender) -> None:
    # q may hold 1 GPU and holds 48Gi of an 80Gi H100 (0.6). A 20Gi fraction is 0.25 of an 80Gi
    # GPU (0.6 + 0.25 = 0.85 <= 1: node h passes) but 0.5 of a 40Gi A100 (0.6 + 0.5 = 1.1 > 1:
    # node s fails with the limit, not admitted at the largest GPU's size as before).
    held = objects.pod("ns", "held", queue="q", claim_name="held", node_name="h")
    pending = objects.pod("ns", "p", queue="q", template="small")
    extender.sync(
        [
            objects.node("h"),
            objects.node("s"),
            objects.gpu_slice("h", 2, shareable=True),
            objects.gpu_slice("s", 2, model="A100-40GB", memory="40Gi", shareable=True),
            objects.device_class(CLASS),
            objects.claim_template("ns", "small", objects.claim_spec(CLASS, memory="20Gi")),
            objects.claim("ns", "held", objects.claim_spec(CLASS, memory="48Gi"), [("h", "gpu-0", "48Gi")]),
            held,
            pending,
            objects.queue("q", resources={"gpu": {"limit": 1}}),
        ]
    )
    status, result = await extender.call("filter", args(pending, ["h", "s"]))
    assert status == 200
    assert result["NodeNames"] == ["h"]
    assert "gpu allocated 0.6 + request 0.5 would exceed its limit (1)" in result["FailedNodes"]["s"]


async def test_bind_accepts_only_a_node_the_filter_passed_for_the_pod() -> None:
    picture, api = ClusterPicture(), ApiClient()
    pod = objects.pod("ns", "p", queue="team-b", template="two")
    app = build_app(
        picture, Binder(api, picture, require_filtered=True), WaitingPods(), ExtenderMetrics(picture)
    )
    async with serve(app) as client:
        extender = Extender(client, picture, WaitingPods(), api)
        extender.sync(cluster(pod))
        status, result = await extender.call("filter", args(pod, ["a", "b"]))
        assert status == 200 and result["NodeNames"] == ["b"]  # a has 1 free GPU, p wants 2
        bind = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-ns-p", "Node": "a"}
        status, answer = await extender.call("bind", bind)
        assert status == 200 and "a" in answer["Error"] and "filter" in answer["Error"]
    await api.close()


async def test_a_refused_pod_gives_up_the_gpus_held_for_it(extender: Extender) -> None:
    # team-a is at its limit of 2 (held + one more bound below): a hold made for its next pod
    # would keep a GPU idle while admission refuses that pod, so the refusal releases it.
    pod = objects.pod("ns", "p", queue="team-a", template="one")
    second = objects.pod("ns", "second", queue="team-a", template="one", node_name="b")
    second["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "second-gpus"}]
    claim = objects.claim("ns", "second-gpus", objects.claim_spec(CLASS), allocated=[("b", "gpu-0", None)])
    extender.sync(cluster(pod, second, claim))
    extender.picture.hold("ns/p", "b", GpuDemand(count=1), ttl_s=60)
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert status == 200 and "its limit (2)" in next(iter(result["FailedAndUnresolvableNodes"].values()))
    assert extender.picture.held_for("ns/p") is None


async def test_a_default_queue_pod_no_node_fits_says_its_fair_share_is_zero(extender: Extender) -> None:
    # Quotas 1 + 3 cover the cluster's 4 GPUs and both queues ask for theirs (team-a holds 1,
    # team-b waits for 2 + 1): the default queue's fair share is 0. Node a has 1 GPU free, the
    # pod asks 2: admitted (it may borrow idle GPUs), but it fits nowhere.
    pod = objects.pod("ns", "p", template="two")
    team_b = [
        objects.pod("ns", "b1", queue="team-b", template="two"),
        objects.pod("ns", "b2", queue="team-b", template="one"),
    ]
    extender.sync(cluster(pod, *team_b))
    _, result = await extender.call("filter", args(pod, ["a"]))
    assert result["NodeNames"] == [] and "not enough free GPU" in result["FailedNodes"]["a"]
    report = extender.waiting.reports["ns/p"]
    assert (report.admitted, report.code, report.post_event) == (True, "fair_share_zero", True)
    assert (
        report.reason
        == "queue 'default' has fair share 0 GPUs (quotas of the queues that ask cover the cluster)"
    )
    assert "ns/p" not in extender.waiting.waiting  # admitted: nothing to requeue


async def test_a_pod_within_its_fair_share_no_node_fits_waits_for_reclaim(extender: Extender) -> None:
    # team-b: quota 3, nothing allocated: 0 + 2 <= its fair share, reclaim frees GPUs for it.
    pod = objects.pod("ns", "p", queue="team-b", template="two")
    extender.sync(cluster(pod))
    await extender.call("filter", args(pod, ["a"]))
    report = extender.waiting.reports["ns/p"]
    assert report.code == "waiting_for_reclaim"
    assert (
        report.reason.startswith("queue 'team-b' fair share ")
        and "0 allocated + 2 asked, within it" in report.reason
    )


async def test_a_refusal_is_reported_with_its_code(extender: Extender) -> None:
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    extender.sync(cluster(pod))
    await extender.call("filter", args(pod, ["a", "b"]))
    assert extender.waiting.reports["ns/p"].code == "over_limit"


def unschedulable(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes ..."}
    ]
    return pod


async def test_a_pod_kube_scheduler_refused_before_asking_the_extender_is_explained_once(
    extender: Extender,
) -> None:
    """No node's devices could take its claim, so the filter never saw it: the status writer's
    slow pass says why it waits. Quotas 1 + 3 cover the 4 GPUs and both queues ask for theirs:
    the default queue's pod has fair share 0; team-a's (limit 2, 1 held, asks 2) is at its limit."""
    default_pod = unschedulable(objects.pod("ns", "p", template="two"))
    capped = unschedulable(objects.pod("ns", "c", queue="team-a", template="two"))
    team_b = [
        objects.pod("ns", "b1", queue="team-b", template="two"),
        objects.pod("ns", "b2", queue="team-b", template="one"),
    ]
    extender.sync(cluster(default_pod, capped, *team_b))
    writer = StatusWriter(extender.api, extender.picture, extender.waiting, ExtenderMetrics(extender.picture))
    assert writer.explain_unschedulable() == 2  # b1 and b2 were never tried: not Unschedulable
    reports = extender.waiting.reports
    assert (reports["ns/p"].admitted, reports["ns/p"].code) == (True, "fair_share_zero")
    assert (reports["ns/c"].admitted, reports["ns/c"].code) == (False, "over_limit")
    assert "would exceed its limit (2)" in reports["ns/c"].reason
    reports.clear()
    # Judged again (the filter may never see them), said again only when the reason changes:
    # "c" is the requeue check's now; "p" still has fair share 0.
    assert writer.explain_unschedulable() == 1 and reports == {}
    # team-b's pods go: it asks for nothing, so the default queue's fair share is the 2 GPUs it
    # asks (of the 3 team-a does not hold): 0 + 2 <= 2, reclaim would come; said at once.
    for name in ("b1", "b2"):
        extender.picture.apply("Pod", "DELETED", objects.pod("ns", name))
    assert writer.explain_unschedulable() == 1
    assert (reports["ns/p"].code, reports["ns/p"].reason) == (
        "waiting_for_reclaim",
        "queue 'default' fair share 2 GPUs: 0 allocated + 2 asked, within it",
    )


async def test_a_new_instance_does_not_say_again_what_an_earlier_one_said(extender: Extender) -> None:
    """Restarted: the reason on the pod's condition is the one the filter refuses it for again, so
    no second event (it compares the reason the condition was written from, not its words)."""
    pod = objects.pod("ns", "p", queue="team-a", template="two")
    extender.sync(cluster(pod))
    _, result = await extender.call("filter", args(pod, ["a", "b"]))
    reason = result["FailedAndUnresolvableNodes"]["a"]  # team-a: limit 2, 1 held: 1 + 2 > 2
    pod["status"]["conditions"] = [
        {
            "type": ADMITTED_CONDITION,
            "status": "False",
            "reason": wait_reason("over_limit").condition,
            "message": wait_message("over_limit", reason),
        }
    ]
    restarted = WaitingPods()
    extender.sync(cluster(pod))
    writer = StatusWriter(extender.api, extender.picture, restarted, ExtenderMetrics(extender.picture))
    writer.seed_from_conditions()
    assert restarted.refused("ns", "p", "uid-ns-p", "team-a", reason, "over_limit") is False
    assert restarted.reports == {}
