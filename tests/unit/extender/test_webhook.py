"""The admission webhooks over HTTP: AdmissionReviews in, answers out (aiohttp's test client).

The picture is plain data; the API client points at a closed port, so every lookup fails the way
an unreachable API does and the webhooks answer from what they have.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from kubernetes_asyncio.client import ApiClient, Configuration

from contract.names import ADMISSION_GATE, NAMESPACE_QUEUE_LABEL, NAMESPACE_SCHEDULER_LABEL
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.webhook import (
    MUTATE_PODS_PATH,
    VALIDATE_CLAIMS_PATH,
    VALIDATE_QUEUES_PATH,
    WebhookOptions,
    webhook_app,
)
from tests import extender_objects as objects
from tests.unit.extender.serving import serve
from tests.unit.extender.test_gangs import job, member

CLASS = "gpu.tessera.dev"


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def cluster(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Node a: 2 GPUs, one held by team-a, whose limit is 1 GPU; namespace "ml" defaults to team-b."""
    held = objects.pod("plain", "held", queue="team-a", template="one", node_name="a")
    held["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "held-gpus"}]
    return [
        objects.node("a"),
        objects.gpu_slice("a", 2),
        objects.device_class(CLASS),
        namespace("plain", {}),
        namespace("ml", {NAMESPACE_QUEUE_LABEL: "team-b", NAMESPACE_SCHEDULER_LABEL: "true"}),
        *(objects.claim_template(ns, "one", objects.claim_spec(CLASS)) for ns in ("plain", "ml")),
        objects.claim("plain", "held-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
        held,
        objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": 1}}),
        objects.queue("team-b", resources={"gpu": {"quota": 1}}),
        *extra,
    ]


class Webhooks:
    def __init__(self, client: TestClient[Any, Any], picture: ClusterPicture) -> None:
        self.client, self.picture = client, picture

    def sync(self, objs: list[dict[str, Any]]) -> None:
        for kind in WATCHED_PATHS:
            self.picture.replace(kind, [o for o in objs if o["kind"] == kind])

    async def review(self, path: str, obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
        kind = obj["kind"]
        group = obj["apiVersion"].rpartition("/")[0]
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "review-1",
                "kind": {"group": group, "version": "v1", "kind": kind},
                "namespace": obj["metadata"].get("namespace", ""),
                "operation": operation,
                "object": obj,
            },
        }
        response = await self.client.post(path, data=json.dumps(body))
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = (await response.json())["response"]
        assert answer["uid"] == "review-1"
        return answer


@pytest.fixture
async def webhooks() -> AsyncIterator[Webhooks]:
    picture = ClusterPicture()
    api = ApiClient(Configuration(host="http://127.0.0.1:1"))  # nothing listens there
    app = webhook_app(api, picture, ExtenderMetrics(picture), WebhookOptions(scheduler_name="tessera"))
    async with serve(app) as client:
        yield Webhooks(client, picture)
    await api.close()


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer["allowed"] is True
    if "patch" not in answer:
        return []
    assert answer["patchType"] == "JSONPatch"
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(answer["patch"]))
    return patch


def gated(pod: dict[str, Any]) -> dict[str, Any]:
    return {**pod, "spec": {**pod["spec"], "schedulingGates": [{"name": ADMISSION_GATE}]}}


LABEL_PATH = "/metadata/labels/scheduling.tessera.dev~1queue"


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        # "ml" defaults to team-b and opts in to the tessera scheduler; team-b has room.
        (
            objects.pod("ml", "p", template="one"),
            [
                {"op": "add", "path": LABEL_PATH, "value": "team-b"},
                {"op": "add", "path": "/spec/schedulerName", "value": "tessera"},
            ],
        ),
        # A pod that names its queue and scheduler keeps them.
        (objects.pod("ml", "p", queue="team-b", template="one", scheduler="other"), []),
        # "plain" has no default and no opt-in: a pod naming nothing is left alone.
        (objects.pod("plain", "p", template="one"), []),
        # team-a holds 1 GPU of its limit 1: a GPU pod of team-a is gated (1 + 1 > 1) ...
        (
            objects.pod("plain", "p", queue="team-a", template="one"),
            [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}],
        ),
        # ... a pod without GPUs of team-a is not (its cpu has no limit) ...
        (objects.pod("plain", "p", queue="team-a"), []),
        # ... and neither is a bound one or one of a queue with room.
        (objects.pod("plain", "p", queue="team-a", template="one", node_name="a"), []),
        (objects.pod("plain", "p", queue="team-b", template="one"), []),
        # A queue that does not exist holds the pod back too: it is gated until the queue appears.
        (
            objects.pod("plain", "p", queue="nobody", template="one"),
            [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}],
        ),
    ],
)
async def test_pod_mutation(webhooks: Webhooks, pod: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    webhooks.sync(cluster())
    answer = await webhooks.review(MUTATE_PODS_PATH, pod)
    assert patch_of(answer) == expected
    gated = any(op["path"] == "/spec/schedulingGates" for op in expected)
    assert bool(answer.get("warnings")) is gated
    if gated:
        assert ADMISSION_GATE in answer["warnings"][0] and "queue '" in answer["warnings"][0]


async def test_pods_the_scheduler_already_has_count_ahead(webhooks: Webhooks) -> None:
    # team-b (no limit) aside, give team-a room for 2: limit 3, 1 held, 1 pending ungated -> 1 + 1 + 1 = 3.
    waiting = objects.pod("plain", "waiting", queue="team-a", template="one")
    objs = [o for o in cluster(waiting) if o["metadata"]["name"] != "team-a"]
    objs.append(objects.queue("team-a", resources={"gpu": {"quota": 1, "limit": 3}}))
    webhooks.sync(objs)
    assert (
        patch_of(
            await webhooks.review(MUTATE_PODS_PATH, objects.pod("plain", "p", queue="team-a", template="one"))
        )
        == []
    )
    # With a second pending pod ahead: 1 + 2 + 1 = 4 > 3, gated.
    webhooks.picture.apply(
        "Pod", "ADDED", {**objects.pod("plain", "waiting-2", queue="team-a", template="one")}
    )
    answer = await webhooks.review(
        MUTATE_PODS_PATH, objects.pod("plain", "p2", queue="team-a", template="one")
    )
    assert [op["path"] for op in patch_of(answer)] == ["/spec/schedulingGates"]


async def test_a_gang_pod_is_gated_until_the_one_being_created_completes_its_gang(webhooks: Webhooks) -> None:
    # An indexed Job of 3 in team-b (no limit): with 1 pod there, the one created makes 1 + 1 < 3.
    workers = [member("train", i, queue="team-b", namespace="plain") for i in range(3)]
    webhooks.sync(cluster(job("train", 3, namespace="plain"), workers[0]))
    answer = await webhooks.review(MUTATE_PODS_PATH, workers[1])
    assert [op["path"] for op in patch_of(answer)] == ["/spec/schedulingGates"]
    # The filter's words (one admission rule): the gang, its numbers, what it waits for.
    assert (
        "workload Job/plain/train (minimum 3 pods, 0 placed, 2 present) waits for its pods: "
        "2 of its minimum 3 exist" in answer["warnings"][0]
    )
    # With 2 there (gated ones count), the third completes it: 2 + 1 = 3, and team-b takes all 3.
    webhooks.picture.apply("Pod", "ADDED", gated(workers[1]))
    assert patch_of(await webhooks.review(MUTATE_PODS_PATH, workers[2])) == []


async def test_an_unsynced_picture_gates_nothing_and_updates_pass(webhooks: Webhooks) -> None:
    pod = objects.pod("plain", "p", queue="team-a", template="one")
    assert patch_of(await webhooks.review(MUTATE_PODS_PATH, pod)) == []  # not synced: no gate
    webhooks.sync(cluster())
    assert patch_of(await webhooks.review(MUTATE_PODS_PATH, pod, operation="UPDATE")) == []


@pytest.mark.parametrize(
    ("queue", "needle"),
    [
        (objects.queue("x", resources={"gpu": {"quota": 4, "limit": 2}}), "limit 2 is below quota 4"),
        (objects.queue("x", parent="nobody"), "parent queue 'nobody' of 'x' does not exist"),
        (objects.queue("team-a", parent="x"), "parent queue 'x' of 'team-a' does not exist"),
        (objects.queue("x", parent="team-b"), None),
    ],
)
async def test_queue_validation(webhooks: Webhooks, queue: dict[str, Any], needle: str | None) -> None:
    # The API is unreachable: the stored Queues are read from the picture.
    webhooks.sync(cluster())
    answer = await webhooks.review(VALIDATE_QUEUES_PATH, queue)
    if needle is None:
        assert answer["allowed"] is True and "status" not in answer
    else:
        assert answer["allowed"] is False
        assert answer["status"]["code"] == 422 and needle in answer["status"]["message"]


async def test_claim_validation_names_the_field(webhooks: Webhooks) -> None:
    parameters = {
        "apiVersion": "gpu.tessera.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Magic"},
    }
    spec = objects.claim_spec(CLASS)
    spec["devices"]["config"] = [{"opaque": {"driver": "gpu.tessera.dev", "parameters": parameters}}]
    template = objects.claim_template("ns", "bad", spec)
    answer = await webhooks.review(VALIDATE_CLAIMS_PATH, template)
    assert answer["allowed"] is False
    assert "spec.spec.devices.config[0].opaque.parameters: sharing.strategy" in answer["status"]["message"]
    parameters["sharing"] = {"strategy": "MPS"}
    assert (await webhooks.review(VALIDATE_CLAIMS_PATH, template))["allowed"] is True


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "malformed mutate_pods request"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
            "apiVersion",
        ),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
            ).encode(),
            "uid",
        ),
    ],
)
async def test_a_malformed_review_gets_400_and_the_next_one_an_answer(
    webhooks: Webhooks, body: bytes, needle: str
) -> None:
    response = await webhooks.client.post(MUTATE_PODS_PATH, data=body)
    assert response.status == 400
    assert needle in await response.text()
    webhooks.sync(cluster())
    answer = await webhooks.review(MUTATE_PODS_PATH, objects.pod("ml", "p", queue="team-b"))
    assert answer["allowed"] is True


async def test_the_picture_counts_an_unlabelled_pod_in_its_namespace_default_queue() -> None:
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(
            kind, [o for o in cluster(objects.pod("ml", "p", template="one")) if o["kind"] == kind]
        )
    assert picture.demand(picture.get("Pod", "ml/p") or {}).queue == "team-b"
    assert picture.fairness().pending_pods.get("team-b") == 1
    # The Namespace's default changes: its pods move with it.
    picture.apply("Namespace", "MODIFIED", namespace("ml", {NAMESPACE_QUEUE_LABEL: "team-a"}))
    assert picture.fairness().pending_pods.get("team-a") == 1
    assert not picture.fairness().pending_pods.get("team-b")


@pytest.mark.parametrize(
    "odd",
    [
        {"metadata": 5, "spec": "x"},
        {"metadata": {"labels": ["a"], "ownerReferences": "me"}, "spec": {"containers": "zz"}},
        {"metadata": {"ownerReferences": [{"controller": True, "apiVersion": 3, "kind": {}, "name": None}]}},
        {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}], "schedulingGates": 7}},
    ],
)
async def test_an_odd_pod_is_admitted_unchanged_and_costs_only_itself(
    webhooks: Webhooks, odd: dict[str, Any]
) -> None:
    webhooks.sync(cluster())
    pod = {"apiVersion": "v1", "kind": "Pod", **odd}
    for namespace in ("../x", "plain", "ml"):  # no namespace name; no default; a default queue
        request = {"uid": "u", "kind": {"version": "v1", "kind": "Pod"}, "namespace": namespace}
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {**request, "operation": "CREATE", "object": pod},
        }
        response = await webhooks.client.post(MUTATE_PODS_PATH, data=json.dumps(body))
        assert response.status == 200, await response.text()
        assert (await response.json())["response"]["allowed"] is True
