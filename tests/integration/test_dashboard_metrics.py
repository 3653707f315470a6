"""The dashboard's extender queries against a live extender's /metrics on the real control plane:
every metric family they name is declared in the exposition (a labelled counter no event has
touched yet is declared without samples), and the gauges read at scrape time carry the numbers
of what runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import LocalCluster, wait_until
from tests.integration.extender_harness import gpu_cluster
from tests.integration.test_kubectl_plugin import bound

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "tessera" / "dashboards" / "tessera.json"
# A histogram is declared by its base name; a counter, as prometheus_client writes it, with `_total`.
SUFFIX = re.compile(r"_(bucket|count|sum)$")


async def test_the_dashboards_extender_metrics_are_served_with_their_numbers(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=2) as env:
        queue = await env.create_queue("dash", resources={"gpu": {"quota": 1, "limit": 2}})
        await env.submit(queue, 1, "one")
        await wait_until(lambda: bound(env, 1), timeout=60, interval=0.2, what="the pod bound")
        async with aiohttp.ClientSession() as session, session.get(f"{env.url}/metrics") as response:
            text = await response.text()
        declared = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
        dashboard = json.loads(DASHBOARD.read_text())
        names = {
            name
            for panel in dashboard["panels"]
            for target in panel.get("targets", [])
            for name in re.findall(r"\btessera_[a-z0-9_]+\b", target["expr"])
            if not name.startswith("tessera_dra_")  # the driver's own /metrics
        }
        missing = sorted({SUFFIX.sub("", name) for name in names} - declared)
        assert missing == []
        node = env.nodes[0]
        for sample in (
            f'tessera_node_gpus{{node="{node}"}} 2.0',
            f'tessera_node_gpus_allocated{{node="{node}"}} 1.0',
            f'tessera_queue_quota{{queue="{queue}",resource="gpu"}} 1.0',
            f'tessera_queue_limit{{queue="{queue}",resource="gpu"}} 2.0',
            f'tessera_queue_allocated{{queue="{queue}",resource="gpu"}} 1.0',
        ):
            assert sample in text, sample
