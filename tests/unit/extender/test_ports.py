"""What the verbs' and the webhooks' ports refuse, and what a refusal costs: nested JSON, bodies
over the caps, Content-Encodings, a gzip bomb (memory bounded), a connection kept alive.

The apps are the real ones (`build_app`, `webhook_app`) behind aiohttp's test server, run with the
service's server settings (bodies seen as sent: `SERVER_SETTINGS`). The verb app's body limit is
64 KiB and its candidate cap 100 nodes, so every case is small.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio.client import ApiClient, Configuration

from extender.binder import Binder
from extender.metrics import ExtenderMetrics, merged_exposition
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.server import NAME_BYTES, POD_BYTES, build_app
from extender.status import WaitingPods
from extender.webhook import (
    MAX_API_READS,
    MAX_REVIEW_BYTES,
    MAX_REVIEWS_IN_FLIGHT,
    MUTATE_PODS_PATH,
    WebhookOptions,
    webhook_app,
)
from tests import extender_objects as objects
from tests.unit.extender.serving import serve

LIMIT = 64 * 1024
MAX_NODES = 100
VERBS = ("filter", "prioritize", "preempt", "bind")


def valid(verb: str) -> dict[str, Any]:
    pod = objects.pod("ns", "p", queue="team", template="one")
    bodies: dict[str, dict[str, Any]] = {
        "filter": {"Pod": pod, "NodeNames": ["a"]},
        "prioritize": {"Pod": pod, "NodeNames": ["a"]},
        "preempt": {"Pod": pod, "NodeNameToMetaVictims": {}},
        "bind": {"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "a"},
    }
    return bodies[verb]


def nested(depth: int) -> bytes:
    """A filter request whose pod holds a list nested `depth` deep."""
    return b'{"Pod": {"metadata": {"name": "p"}, "spec": ' + b"[" * depth + b"]" * depth + b"}}"


@asynccontextmanager
async def verbs(limit: int = LIMIT) -> AsyncIterator[TestClient[Any, Any]]:
    """The verbs over a picture of one node, "a"."""
    picture, api = ClusterPicture(), ApiClient()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [objects.node("a")] if kind == "Node" else [])
    app = build_app(
        picture,
        Binder(api, picture),
        WaitingPods(),
        ExtenderMetrics(picture),
        max_body_bytes=limit,
        max_candidate_nodes=MAX_NODES,
    )
    async with serve(app) as test_client:
        yield test_client
    await api.close()


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with verbs() as test_client:
        yield test_client


@pytest.mark.parametrize("verb", VERBS)
async def test_json_nested_deeper_than_the_decoder_goes_is_a_400_on_every_verb(
    client: TestClient[Any, Any], verb: str
) -> None:
    # 1000 levels: msgspec raises RecursionError (not a DecodeError), which used to answer 500.
    response = await client.post(f"/{verb}", data=nested(1000))
    text = await response.text()
    assert response.status == 400, text
    assert f"malformed {verb} request" in text and "recursion" in text


@pytest.mark.parametrize(
    ("names", "status"),
    [
        (MAX_NODES, 200),  # at the cap: decided
        (MAX_NODES + 1, 413),  # one more: refused before the decision, with the count
    ],
)
async def test_more_candidate_nodes_than_the_cap_get_413(
    client: TestClient[Any, Any], names: int, status: int
) -> None:
    body = {**valid("filter"), "NodeNames": [f"n{i}" for i in range(names)]}
    for verb in ("filter", "prioritize"):
        response = await client.post(f"/{verb}", data=json.dumps(body))
        text = await response.text()
        assert response.status == status, text
        if status == 413:
            assert f"{names} candidate nodes, more than {MAX_NODES}" in text


async def test_a_names_body_over_its_bound_is_refused_without_decoding_the_names(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound is POD_BYTES + NAME_BYTES x the cap; with POD_BYTES shrunk to 0 here it is
    # 256 x 100 = 25,600 bytes, and 3000 names of 8 characters (~33,000 bytes) pass it while the
    # body stays under the 64 KiB limit. The answer names the bytes, not a count: none was made.
    monkeypatch.setattr("extender.server.POD_BYTES", 0)
    body = json.dumps({**valid("filter"), "NodeNames": [f"n{i:07d}" for i in range(3000)]}).encode()
    assert NAME_BYTES * MAX_NODES < len(body) < LIMIT
    response = await client.post("/filter", data=body)
    text = await response.text()
    assert response.status == 413 and "bytes of node names: more than 100 candidate nodes" in text
    assert POD_BYTES > 0


async def test_content_length_over_the_limit_is_refused_before_the_body_is_read(
    client: TestClient[Any, Any],
) -> None:
    # The headers say 1 GiB; the server answers without waiting for a byte of it.
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), timeout=30)
    writer.close()
    assert status_line.split()[1] == b"413"


@pytest.mark.parametrize(
    ("encoding", "body", "status", "needle"),
    [
        ("gzip", gzip.compress(json.dumps(valid("filter")).encode()), 200, ""),
        ("deflate", zlib.compress(json.dumps(valid("filter")).encode()), 200, ""),
        ("br", b"\x0b\x02\x80{}\x03", 415, "Content-Encoding 'br' is not supported"),
        ("rot13", b"{}", 415, "Content-Encoding 'rot13' is not supported"),
        ("gzip", json.dumps(valid("filter")).encode(), 400, "not valid gzip"),  # plain JSON
        ("gzip", gzip.compress(b"{}")[:-12], 400, "ends early"),  # truncated
    ],
)
async def test_content_encodings(
    client: TestClient[Any, Any], encoding: str, body: bytes, status: int, needle: str
) -> None:
    response = await client.post("/filter", data=body, headers={"Content-Encoding": encoding})
    text = await response.text()
    assert response.status == status, text
    assert needle in text


async def test_a_bad_encoding_does_not_drop_the_connection(client: TestClient[Any, Any]) -> None:
    """Four requests on one connection: a good one, one whose body is not in its Content-Encoding,
    one in an encoding not supported, a good one again: each answered on the same socket."""
    good = json.dumps(valid("filter")).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)

    async def post(body: bytes, encoding: str) -> int:
        header = f"Content-Encoding: {encoding}\r\n" if encoding else ""
        writer.write(
            f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{header}\r\n".encode() + body
        )
        await writer.drain()
        status = int((await asyncio.wait_for(reader.readline(), timeout=30)).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            assert not (name.lower() == "connection" and value.strip().lower() == "close")
        await reader.readexactly(length)
        return status

    statuses = [await post(good, encoding) for encoding in ("", "gzip", "br", "")]
    assert statuses == [200, 400, 415, 200]  # the JSON is no gzip; br is not supported
    writer.close()


def bomb(size: int) -> bytes:
    """`size` bytes of zeros, gzipped (about 1 KiB per MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(2**20)
    return b"".join([*(packer.compress(chunk) for _ in range(size // 2**20)), packer.flush()])


async def test_a_gzip_bomb_costs_the_limit_not_its_size() -> None:
    # 128 MiB of zeros in ~128 KiB of gzip, to an app whose limit is 1 MiB. Decompression stops at
    # the limit: the peak of what Python allocates while it is answered (the compressed body, at
    # most 1 MiB + 1 byte of output, the request's own objects) stays under 4 MiB. aiohttp used to
    # decompress ahead of the handler: 13.9 MiB here, ~490 MiB for a 199 KiB bomb at 64 MiB.
    payload = bomb(128 * 2**20)
    assert len(payload) < 2**20
    async with verbs(limit=2**20) as client:
        tracemalloc.start()
        try:
            response = await client.post("/filter", data=payload, headers={"Content-Encoding": "gzip"})
            text = await response.text()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert response.status == 413 and "decompresses to over 1048576 bytes" in text
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"


async def test_metrics_of_two_processes_merge_into_one_family_each() -> None:
    own, other = ExtenderMetrics(ClusterPicture()), ExtenderMetrics(ClusterPicture())
    own.decisions.labels("filter", "admitted", "fits").inc()
    other.decisions.labels("mutate_pods", "labelled", "").inc(2)
    text = merged_exposition(own.render(), other.render()).decode()
    assert text.count("# TYPE tessera_extender_decisions_total counter") == 1
    assert 'tessera_extender_decisions_total{outcome="admitted",reason="fits",verb="filter"} 1.0' in text
    assert 'tessera_extender_decisions_total{outcome="labelled",reason="",verb="mutate_pods"} 2.0' in text


@pytest.fixture
async def webhooks() -> AsyncIterator[TestClient[Any, Any]]:
    picture = ClusterPicture()
    api = ApiClient(Configuration(host="http://127.0.0.1:1"))  # nothing listens there
    app = webhook_app(api, picture, ExtenderMetrics(picture), WebhookOptions())
    async with serve(app) as test_client:
        yield test_client
    await api.close()


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [
        # pydantic-core refuses nesting past its own limit with a ValidationError: a 400.
        (
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
            b'{"uid": "u", "kind": {"version": "v1", "kind": "Pod"}, "operation": "CREATE", '
            b'"object": {"spec": ' + b"[" * 1000 + b"]" * 1000 + b"}}}",
            {},
            400,
            "recursion limit exceeded",
        ),
        (b"x" * (MAX_REVIEW_BYTES + 1), {}, 413, "too large"),
        (bomb(MAX_REVIEW_BYTES * 2), {"Content-Encoding": "gzip"}, 413, "decompresses to over"),
        (b"{}", {"Content-Encoding": "compress"}, 415, "not supported"),
    ],
)
async def test_the_webhook_port_refuses_alike(
    webhooks: TestClient[Any, Any], body: bytes, headers: dict[str, str], status: int, needle: str
) -> None:
    response = await webhooks.post(MUTATE_PODS_PATH, data=body, headers=headers)
    text = await response.text()
    assert response.status == status, text
    assert needle in text


async def test_the_webhooks_bound_their_api_reads_and_the_reviews_they_take_at_once() -> None:
    """20 pod reviews at once, each reading its Namespace from an API that answers after 0.5 s:
    16 are taken (MAX_REVIEWS_IN_FLIGHT; the other 4 get 503 at once) and at most 8 reads
    (MAX_API_READS) are in flight at the API together, however many reviews wait for one."""
    in_flight, most = 0, 0

    async def namespace(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.5)
        in_flight -= 1
        return web.json_response({"metadata": {"name": request.match_info["name"], "labels": {}}})

    fake_api = web.Application()
    fake_api.router.add_get("/api/v1/namespaces/{name}", namespace)
    async with TestServer(fake_api) as api_server:
        picture = ClusterPicture()
        api = ApiClient(Configuration(host=str(api_server.make_url(""))))
        options = WebhookOptions(lookup_timeout_s=30)
        app = webhook_app(api, picture, ExtenderMetrics(picture), options)
        async with serve(app) as webhooks:
            body = json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {
                        "uid": "u",
                        "kind": {"version": "v1", "kind": "Pod"},
                        "namespace": "ns",
                        "operation": "CREATE",
                        "object": objects.pod("ns", "p", template="one"),
                    },
                }
            )

            async def post() -> int:
                response = await webhooks.post(MUTATE_PODS_PATH, data=body)
                await response.read()
                return response.status

            statuses = await asyncio.gather(*(post() for _ in range(20)))
        await api.close()
    assert sorted(statuses) == [200] * MAX_REVIEWS_IN_FLIGHT + [503] * (20 - MAX_REVIEWS_IN_FLIGHT)
    assert most == MAX_API_READS
