"""Fixtures for tests against the real local control plane (one per test session)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from tessera.dev.localcluster import LocalCluster, api_client


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture
async def k8s(local_cluster: LocalCluster) -> AsyncIterator[ApiClient]:
    client = await api_client(local_cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def namespace(k8s: ApiClient) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = CoreV1Api(k8s)
    body: Any = {"metadata": {"name": name}}
    await core.create_namespace(body)
    try:
        yield name
    finally:
        try:
            await core.delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On failure, attach the tail of every control-plane component's log to the report."""
    report: pytest.TestReport = yield
    if report.failed:
        cluster = getattr(item, "funcargs", {}).get("local_cluster")
        if isinstance(cluster, LocalCluster):
            report.sections.append(("control-plane logs", cluster.logs()))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
