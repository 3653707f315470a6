"""Thin JSON access to the Kubernetes API over kubernetes-asyncio's authenticated client.

The extender works on plain Kubernetes JSON everywhere (watch events, wire pods, claims), so it
skips the generated model classes: they cost CPU per object and some (Binding) fail to decode.
Bodies and watch lines are decoded with msgspec (3-4x faster than the standard library's json on
watch events; docs/benchmarks.md, "Wire codec").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypedDict, Unpack
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient

JsonObject = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


def resolve_environment_once(api: ApiClient) -> ApiClient:
    """Look the API server's proxy up in the environment once, instead of on every request.

    kubernetes-asyncio opens its aiohttp session with `trust_env=True`, and aiohttp then reads
    the proxy variables (HTTPS_PROXY, NO_PROXY) and ~/.netrc on a worker thread for every
    request: two thread hand-offs per API call, a measurable part of the extender's CPU per pod.
    The proxy is resolved here for the API server's host, as client-go would pick it, and set on
    the client; the per-request lookups are then turned off. (netrc credentials never apply: a
    kubeconfig or the service account authenticates.) `_trust_env` is the attribute behind
    `ClientSession.trust_env` in the pinned aiohttp; a unit test checks it still is.
    """
    configuration = api.configuration
    server = urlsplit(str(configuration.host))
    proxy = getproxies().get(server.scheme or "https")
    if not configuration.proxy and proxy and not proxy_bypass(server.hostname or ""):
        configuration.proxy = api.rest_client.proxy = proxy
    api.rest_client.pool_manager._trust_env = False
    return api


class KubeError(Exception):
    """A non-2xx answer from the API server, with its status code and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


async def _error_of(response: aiohttp.ClientResponse) -> KubeError:
    text = await response.text()
    try:
        message = str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        message = text
    return KubeError(response.status, message[:500])


async def _send(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    body: object = None,
    content_type: str = "application/json",
    timeout: float | None = 30.0,
) -> aiohttp.ClientResponse:
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=list((query or {}).items()),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=timeout,
    )
    return response


class CallOptions(TypedDict, total=False):
    """How one API call is made beyond its method and path (the keywords of `_send`)."""

    query: Mapping[str, str] | None
    body: object
    content_type: str
    timeout: float | None


async def request(api: ApiClient, method: str, path: str, **options: Unpack[CallOptions]) -> JsonObject:
    """One API call; returns the decoded JSON body, raises KubeError on a non-2xx status."""
    decoded = msgspec.json.decode(await request_bytes(api, method, path, **options))
    return decoded if isinstance(decoded, dict) else {}


async def request_bytes(api: ApiClient, method: str, path: str, **options: Unpack[CallOptions]) -> bytes:
    """One API call; returns the body as sent (e.g. the text of /metrics), raises KubeError on a
    non-2xx status."""
    response = await _send(api, method, path, **options)
    async with response:
        if not 200 <= response.status < 300:
            raise await _error_of(response)
        return await response.read()


async def watch_lines(api: ApiClient, path: str, query: Mapping[str, str]) -> AsyncIterator[JsonObject]:
    """Stream a watch: one decoded event per line until the server ends the watch."""
    response = await _send(api, "GET", path, query={**query, "watch": "true"}, timeout=None)
    async with response:
        if response.status != 200:
            raise await _error_of(response)
        async for line in response.content:
            if line.strip():
                event = msgspec.json.decode(line)
                if isinstance(event, dict):
                    yield event
