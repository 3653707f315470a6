"""The API client looks the environment up once (proxy for the API server), not per request."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration

from extender.kubeapi import resolve_environment_once


def _client(host: str) -> ApiClient:
    configuration = Configuration()
    configuration.host = host
    return ApiClient(configuration)


@pytest.mark.parametrize(
    ("no_proxy", "expected"),
    [
        ("", "http://proxy.example:3128"),  # the API server is reached through the proxy
        ("api.example", None),  # NO_PROXY names the API server: direct
        (".example", None),  # ... or its domain
    ],
)
async def test_the_proxy_is_resolved_once_and_aiohttp_stops_looking(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, expected: str | None
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    api = _client("https://api.example:6443")
    assert api.rest_client.pool_manager.trust_env  # kubernetes-asyncio's default
    resolve_environment_once(api)
    assert api.rest_client.proxy == expected
    # The attribute behind ClientSession.trust_env in the pinned aiohttp: the per-request
    # lookups (a thread hand-off each) are off.
    assert api.rest_client.pool_manager.trust_env is False
    await api.close()


async def test_a_configured_proxy_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://other.example:8080")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    configuration = Configuration()
    configuration.host = "https://api.example:6443"
    configuration.proxy = "http://chosen.example:3128"
    api = resolve_environment_once(ApiClient(configuration))
    assert api.rest_client.proxy == "http://chosen.example:3128"
    await api.close()
