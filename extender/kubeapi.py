"""Thin JSON access to the Kubernetes API over kubernetes-asyncio's authenticated client.

The extender works on plain Kubernetes JSON everywhere (watch events, wire pods, claims), so it
skips the generated model classes: they cost CPU per object and some (Binding) fail to decode.
Bodies and watch lines are decoded with msgspec (3-4x faster than the standard library's json on
watch events; docs/benchmarks.md, "Wire codec").
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient

JsonObject = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


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


async def request(
    api: ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, str] | None = None,
    body: object = None,
    content_type: str = "application/json",
    timeout: float = 30.0,
) -> JsonObject:
    """One API call; returns the decoded JSON body, raises KubeError on a non-2xx status."""
    response = await _send(
        api, method, path, query=query, body=body, content_type=content_type, timeout=timeout
    )
    async with response:
        if not 200 <= response.status < 300:
            raise await _error_of(response)
        decoded = msgspec.json.decode(await response.read())
    return decoded if isinstance(decoded, dict) else {}


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
