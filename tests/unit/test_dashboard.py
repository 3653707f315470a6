"""The Grafana dashboard the chart ships (charts/tessera/dashboards/tessera.json, the ConfigMap
of templates/grafana-dashboard.yaml): rendered by helm with its sidecar label, off by default,
and every query names only metrics the extender and the DRA driver register."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import dra_driver.prepare
import dra_driver.slices
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from tessera.dev.localcluster import find_binaries

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tessera"
# A metric name in a PromQL expression (all of Tessera's start so; PromQL's functions do not).
METRIC = re.compile(r"\btessera_[a-z0-9_]+\b")
# The samples a family of each type exports (prometheus_client strips a counter's `_total`).
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def render(*values: str) -> list[dict[str, Any]]:
    helm = find_binaries() / "helm"
    flags = [arg for value in values for arg in ("--set", value)]
    result = subprocess.run(
        [str(helm), "template", "t", str(CHART), "--kube-version", "v1.37.2", *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def exported(registry: CollectorRegistry, prefix: str = "tessera_") -> set[str]:
    """The sample names the registry's families export."""
    return {
        family.name + suffix
        for family in registry.collect()
        if family.name.startswith(prefix)
        for suffix in SUFFIXES[family.type]
    }


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expression) of every query, the templating variables' too."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield f"variable {variable['name']}", variable["definition"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    (config_map,) = [
        o
        for o in render("grafanaDashboard.enabled=true")
        if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    loaded: dict[str, Any] = json.loads(config_map["data"]["tessera.json"])
    return loaded


def test_the_dashboard_is_off_by_default() -> None:
    assert [o["metadata"]["name"] for o in render() if "dashboard" in o["metadata"]["name"]] == []


def test_every_query_names_a_metric_the_extender_or_the_driver_exports(dashboard: dict[str, Any]) -> None:
    # The driver registers its metrics in the default registry when its modules load (above).
    assert dra_driver.prepare.CALL_DURATION is not None and dra_driver.slices.PUBLISHED_DEVICES is not None
    known = exported(ExtenderMetrics(ClusterPicture()).registry) | exported(REGISTRY, "tessera_dra_")
    unknown = [
        f"{title}: {name}"
        for title, expr in expressions(dashboard)
        for name in METRIC.findall(expr)
        if name not in known
    ]
    assert unknown == []
    used = {name for _, expr in expressions(dashboard) for name in METRIC.findall(expr)}
    # The list: allocated vs quota vs fair share, waiting, time to fair share, evictions,
    # work lost; per node and per GPU; verb latency, cut-offs, reclaim cycles; prepare, health.
    for wanted in (
        "tessera_queue_allocated",
        "tessera_queue_quota",
        "tessera_queue_fair_share",
        "tessera_queue_pending_pods",
        "tessera_queue_time_to_fair_share_seconds_bucket",
        "tessera_reclaim_evictions_total",
        "tessera_reclaim_lost_gpu_seconds_total",
        "tessera_node_gpus_allocated",
        "tessera_gpu_allocated_fraction",
        "tessera_extender_request_duration_seconds_bucket",
        "tessera_planning_cut_off_total",
        "tessera_reclaim_cycle_duration_seconds_count",
        "tessera_dra_request_duration_seconds_bucket",
        "tessera_dra_published_devices",
    ):
        assert wanted in used, wanted


def test_per_queue_series_are_read_one_resource_at_a_time(dashboard: dict[str, Any]) -> None:
    """tessera_queue_{allocated,requested,fair_share,quota,limit} have one series per resource
    (gpu, gpu/<model>, cpu in cores, memory in bytes): a query that sums them without choosing one
    would add GPUs to bytes."""
    per_resource = re.compile(r"tessera_queue_(?:allocated|requested|fair_share|quota|limit)(\{[^}]*\})?")
    loose = [
        f"{title}: {expr}"
        for title, expr in expressions(dashboard)
        for match in per_resource.finditer(expr)
        if not title.startswith("variable") and 'resource="gpu"' not in (match.group(1) or "")
    ]
    assert loose == []


def test_every_panel_reads_the_chosen_data_source_and_has_distinct_query_ids(
    dashboard: dict[str, Any],
) -> None:
    assert dashboard["uid"] == "tessera-overview"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        ids = [target["refId"] for target in panel["targets"]]
        assert len(ids) == len(set(ids)) > 0, panel["title"]
