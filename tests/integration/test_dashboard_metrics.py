"""The dashboard's queries against what runs on the real control plane: a live extender's /metrics
and a DRA driver process's (`python -m dra_driver`, simulated GPUs, `--http-port`). Every metric
family a query or a templating variable names is declared in the exposition of the one that
exports it (a labelled counter no event has touched yet is declared without samples), and the
gauges read at scrape time carry the numbers of what runs."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families

from extender.kubeapi import request
from tessera.dev.localcluster import LocalCluster, create_fake_node, delete_nodes, free_port, wait_until
from tests.integration.extender_harness import SLICES_PATH, gpu_cluster, h100_profile
from tests.integration.test_kubectl_plugin import bound
from tests.unit.test_dashboard import METRIC, expressions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "tessera" / "dashboards" / "tessera.json"
# A histogram is declared by its base name; a counter, as prometheus_client writes it, with `_total`.
SUFFIX = re.compile(r"_(bucket|count|sum)$")
DRIVER_PREFIX = "tessera_dra_"  # the driver's families; every other one is the extender's


def named_families(driver: bool) -> set[str]:
    """The families the dashboard's queries and variables name, of the driver or the extender."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        SUFFIX.sub("", name)
        for _, expr in expressions(dashboard)
        for name in METRIC.findall(expr)
        if name.startswith(DRIVER_PREFIX) == driver
    }


def declared(exposition: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", exposition, re.MULTILINE))


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        response.raise_for_status()
        return await response.text()


async def test_the_dashboards_extender_metrics_are_served_with_their_numbers(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        queue = await env.create_queue("dash", resources={"gpu": {"quota": 1, "limit": 2}})
        await env.submit(queue, 1, "one")
        await wait_until(lambda: bound(env, 1), timeout=60, interval=0.2, what="the pod bound")
        text = await scrape(env.url)
        assert sorted(named_families(driver=False) - declared(text)) == []
        node = env.nodes[0]
        for sample in (
            f'tessera_node_gpus{{node="{node}"}} 2.0',
            f'tessera_node_gpus_allocated{{node="{node}"}} 1.0',
            f'tessera_queue_quota{{queue="{queue}",resource="gpu"}} 1.0',
            f'tessera_queue_limit{{queue="{queue}",resource="gpu"}} 2.0',
            f'tessera_queue_allocated{{queue="{queue}",resource="gpu"}} 1.0',
        ):
            assert sample in text, sample
        # Per-GPU occupancy: the pod's GPU whole, the other idle.
        occupancy = [
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "tessera_gpu_allocated_fraction"
            for sample in family.samples
            if sample.labels["node"] == node
        ]
        assert sorted(occupancy) == [0.0, 1.0]


async def test_the_dashboards_driver_metrics_are_served_by_a_driver_process(
    local_cluster: LocalCluster, k8s: ApiClient
) -> None:
    """The driver publishing 2 simulated H100s: its /metrics declares every tessera_dra_ family the
    dashboard reads, and the health panel's gauge counts the 2 devices healthy, none unhealthy."""
    suffix = uuid.uuid4().hex[:6]
    node, driver, port = f"dash-node-{suffix}", f"dash-{suffix}.tessera.dev", free_port()
    # Unix socket paths are short: a directory straight under /tmp.
    state = Path(tempfile.mkdtemp(prefix="dash-", dir="/tmp"))
    (state / "profile.yaml").write_text(h100_profile(2))
    await create_fake_node(k8s, node)
    command = [sys.executable, "-m", "dra_driver", "--node-name", node, "--driver-name", driver]
    command += ["--backend", "simulated", "--profile", str(state / "profile.yaml")]
    command += ["--kubeconfig", str(local_cluster.kubeconfig), "--http-port", str(port)]
    for flag in ("plugin-dir", "registry-dir", "cdi-dir", "checkpoint-dir"):
        command += [f"--{flag}", str(state / flag)]
    process = await asyncio.create_subprocess_exec(*command, cwd=REPO)
    try:

        async def published() -> str | None:
            if process.returncode is not None:
                raise RuntimeError(f"the driver exited with {process.returncode}")
            try:
                text = await scrape(f"http://127.0.0.1:{port}")
            except aiohttp.ClientError:
                return None  # not listening yet
            return text if 'tessera_dra_published_devices{state="healthy"} 2.0' in text else None

        text = await wait_until(published, timeout=60, interval=0.2, what="the driver's devices published")
        assert sorted(named_families(driver=True) - declared(text)) == []
        assert 'tessera_dra_published_devices{state="unhealthy"} 0.0' in text
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)
        # The Node's deletion would collect its slices too (their owner); not waited for.
        await request(k8s, "DELETE", SLICES_PATH, query={"fieldSelector": f"spec.driver={driver}"})
        await delete_nodes(k8s, [node])
        shutil.rmtree(state, ignore_errors=True)
