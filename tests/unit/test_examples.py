"""Every shipped workload routes through Tessera after a Helm install: the pods name the chart's
scheduler profile and a queue, and the queues they name exist where they are meant to."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.names import DEFAULT_QUEUE, QUEUE_KIND, QUEUE_LABEL

ROOT = Path(__file__).resolve().parents[2]
CHART_SCHEDULER = yaml.safe_load((ROOT / "charts/tessera/values.yaml").read_text())["scheduler"][
    "schedulerName"
]
WORKLOAD_DIRS = ("manifests/examples", "manifests/demo")
POD_TEMPLATE_KINDS = {"Job", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"}


def _documents(directory: str) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    for path in sorted((ROOT / directory).glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def _pod_specs(document: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(metadata, spec) of the pods an object creates."""
    if document["kind"] == "Pod":
        yield document["metadata"], document["spec"]
    elif document["kind"] in POD_TEMPLATE_KINDS:
        template = document["spec"]["template"]
        yield template.get("metadata", {}), template["spec"]


@pytest.mark.parametrize("directory", WORKLOAD_DIRS)
def test_every_pod_names_the_charts_scheduler_and_a_queue(directory: str) -> None:
    pods = 0
    for path, document in _documents(directory):
        for metadata, spec in _pod_specs(document):
            pods += 1
            where = f"{path.relative_to(ROOT)}: {document['kind']} {document['metadata']['name']}"
            assert spec.get("schedulerName") == CHART_SCHEDULER, f"{where} bypasses Tessera's scheduler"
            assert QUEUE_LABEL in metadata.get("labels", {}), f"{where} names no queue"
    assert pods > 0


@pytest.mark.parametrize("directory", WORKLOAD_DIRS)
def test_named_queues_are_shipped_with_the_workloads_or_are_the_default(directory: str) -> None:
    shipped = {d["metadata"]["name"] for _, d in _documents(directory) if d["kind"] == QUEUE_KIND}
    parents = {d["spec"]["parent"] for _, d in _documents(directory) if d.get("spec", {}).get("parent")}
    for path, document in _documents(directory):
        for metadata, _ in _pod_specs(document):
            queue = metadata["labels"][QUEUE_LABEL]
            assert queue in shipped | {DEFAULT_QUEUE}, f"{path.name}: queue {queue!r} is not shipped"
            assert queue not in parents, f"{path.name}: {queue!r} has children; pods go to leaf queues"


def test_examples_include_jobs_and_a_two_team_hierarchy() -> None:
    documents = [d for _, d in _documents("manifests/examples")]
    assert sum(d["kind"] == "Job" for d in documents) >= 2
    queues = [d for d in documents if d["kind"] == QUEUE_KIND]
    children = [q for q in queues if q["spec"].get("parent")]
    assert len(children) == 2 and len({q["spec"]["parent"] for q in children}) == 1
