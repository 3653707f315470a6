"""Seeded fuzzing of the extender's HTTP verbs: bad input costs only itself.

A few thousand requests are generated from valid filter, prioritize, preempt and bind bodies by
mutating them - fields dropped, values swapped for other JSON types, absurd quantities ("1e400",
"1e308" twice), broken JSON, truncated bodies, a false Content-Encoding. Every answer must be a
4xx naming the problem or a 200 (an `Error` field is fine), never a 5xx; a valid filter right
after each bad request must still succeed with the same answer; memory must stay bounded.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from kubernetes_asyncio.client import ApiClient

from extender.binder import Binder
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.server import build_app
from extender.status import WaitingPods
from tests import extender_objects as objects
from tests.unit.extender.serving import serve

CLASS = "gpu.tessera.dev"
REQUESTS = 2500
ODD_VALUES: list[Any] = [
    None,
    [],
    {},
    "",
    "1e400",
    "1e308",
    "-1",
    "lots",
    1e308,
    -1,
    True,
    "x" * 10_000,
    [[[[]]]],
    {"a": {"b": {"c": []}}},
    2**70,
]


def cluster() -> list[dict[str, Any]]:
    held = objects.pod("ns", "held", queue="team", template="one", node_name="a")
    held["status"]["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": "held-gpus"}]
    return [
        *objects.two_nodes_of_two_gpus(CLASS),
        objects.claim("ns", "held-gpus", objects.claim_spec(CLASS), allocated=[("a", "gpu-0", None)]),
        held,
        objects.queue("team", resources={"gpu": {"quota": 2, "limit": 3}}),
    ]


def valid_bodies() -> dict[str, dict[str, Any]]:
    pod = objects.pod("ns", "p", queue="team", template="one")
    return {
        "filter": {"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]},
        "prioritize": {"Pod": pod, "Nodes": None, "NodeNames": ["a", "b"]},
        "preempt": {"Pod": pod, "NodeNameToMetaVictims": {"a": {"Pods": [{"UID": "uid-ns-held"}]}}},
        "bind": {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-ns-p", "Node": "zz"},
    }


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found.extend(_paths(inner, (*prefix, key)))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found.extend(_paths(inner, (*prefix, index)))
    return found


def _set(body: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value


def mutate(rng: random.Random, body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """A bad request: raw bytes and headers."""
    choice = rng.random()
    headers = {"Content-Type": "application/json"}
    if choice < 0.05:
        return json.dumps(body).encode()[: rng.randrange(1, 200)], headers  # truncated
    if choice < 0.08:
        # A lie (the body is plain JSON), or an encoding not supported: a 4xx, and the connection
        # (kept alive by the client) serves the valid filter that follows.
        headers["Content-Encoding"] = rng.choice(["gzip", "deflate", "br", "compress"])
        return json.dumps(body).encode(), headers
    if choice < 0.1:
        return rng.choice([b"", b"null", b"[]", b"{", b"\xff\xfe", b'{"Pod": 1}']), headers
    mutated = copy.deepcopy(body)
    for _ in range(rng.randrange(1, 4)):
        paths = _paths(mutated)
        if not paths:
            break
        path = rng.choice(paths)
        _set(mutated, path, copy.deepcopy(rng.choice(ODD_VALUES)), delete=rng.random() < 0.3)
    return json.dumps(mutated).encode(), headers


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    picture, api = ClusterPicture(), ApiClient()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in cluster() if o["kind"] == kind])
    app = build_app(picture, Binder(api, picture), WaitingPods(), ExtenderMetrics(picture), 256 * 1024)
    async with serve(app) as test_client:
        yield test_client
    await api.close()


async def test_fuzzed_requests_cost_only_themselves(client: TestClient[Any, Any]) -> None:
    rng = random.Random(20261201)
    bodies = valid_bodies()
    good = json.dumps(bodies["filter"])
    first = await client.post("/filter", data=good)
    assert first.status == 200
    expected = await first.json()
    assert expected["NodeNames"] == ["b", "a"] or set(expected["NodeNames"]) == {"a", "b"}
    statuses: dict[int, int] = {}
    start = rss_mib()
    for index in range(REQUESTS):
        verb = rng.choice(list(bodies))
        data, headers = mutate(rng, bodies[verb])
        response = await client.post(f"/{verb}", data=data, headers=headers)
        text = await response.text()
        statuses[response.status] = statuses.get(response.status, 0) + 1
        assert response.status < 500, (
            f"request {index} to {verb}: {response.status} {text[:300]}\n{data[:300]!r}"
        )
        if 400 <= response.status < 500:
            assert len(text) > 10 and ("malformed" in text or "too large" in text), text[:300]
        check = await client.post("/filter", data=good)
        assert check.status == 200, f"a valid filter after request {index} failed: {await check.text()}"
        assert (await check.json())["NodeNames"] == expected["NodeNames"]
    assert statuses.get(400, 0) > REQUESTS // 4  # most mutations are refused as malformed
    assert rss_mib() - start < 64, "memory grew with bad requests"


async def test_the_reported_poison_inputs_cost_only_themselves(client: TestClient[Any, Any]) -> None:
    good = valid_bodies()["filter"]
    baseline = await (await client.post("/filter", data=json.dumps(good))).json()
    # A filtered pod with `status.phase: []` used to be stored as a reservation and fail every
    # later filter for 15 s; and quantities beyond any real amount used to raise overflows.
    odd_phase = copy.deepcopy(good)
    odd_phase["Pod"]["metadata"]["name"] = "odd-phase"
    odd_phase["Pod"]["status"]["phase"] = []
    huge = copy.deepcopy(good)
    huge["Pod"]["metadata"]["name"] = "huge"
    huge["Pod"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1e400"
    twice = copy.deepcopy(good)
    twice["Pod"]["metadata"]["name"] = "twice"
    container = twice["Pod"]["spec"]["containers"][0]
    container["resources"]["requests"]["cpu"] = "1e308"
    twice["Pod"]["spec"]["containers"].append(copy.deepcopy(container) | {"name": "second"})
    for body in (odd_phase, huge, twice):
        response = await client.post("/filter", data=json.dumps(body))
        assert response.status in (200, 400), await response.text()
        after = await client.post("/filter", data=json.dumps(good))
        assert after.status == 200 and (await after.json()) == baseline
        scored = await client.post("/prioritize", data=json.dumps(good))
        assert scored.status == 200
