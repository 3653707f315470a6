"""Every shipped workload routes through Tessera after a Helm install: the pods name the chart's
scheduler profile and a queue - themselves, or through their shipped Namespace's labels, which
the chart's pod webhook applies - and the queues they name exist where they are meant to."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.names import (
    DEFAULT_QUEUE,
    NAMESPACE_QUEUE_LABEL,
    NAMESPACE_SCHEDULER_LABEL,
    QUEUE_KIND,
    QUEUE_LABEL,
)
from extender.policy.workloads import subgroup_refusal, workload_of

ROOT = Path(__file__).resolve().parents[2]
CHART_SCHEDULER = yaml.safe_load((ROOT / "charts/tessera/values.yaml").read_text())["scheduler"][
    "schedulerName"
]
WORKLOAD_DIRS = ("manifests/examples", "manifests/demo")
POD_TEMPLATE_KINDS = {"Job", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"}


def _documents(directory: str) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    for path in sorted((ROOT / directory).rglob("*.yaml")):  # (with examples/more/)
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                yield path, document


def _namespace_labels(directory: str) -> dict[str, Mapping[str, str]]:
    return {
        d["metadata"]["name"]: d["metadata"].get("labels", {})
        for _, d in _documents(directory)
        if d["kind"] == "Namespace"
    }


def _pod_specs(
    document: Mapping[str, Any], namespaces: Mapping[str, Mapping[str, str]]
) -> Iterator[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(labels, spec) of the pods an object creates, as the pod webhook admits them: a shipped
    Namespace's default queue and scheduler opt-in filled in."""
    if document["kind"] == "Pod":
        metadata, spec = document["metadata"], document["spec"]
    elif document["kind"] in POD_TEMPLATE_KINDS:
        template = document["spec"]["template"]
        metadata, spec = template.get("metadata", {}), template["spec"]
    else:
        return
    labels = dict(metadata.get("labels", {}))
    namespace = namespaces.get(document["metadata"].get("namespace", ""), {})
    if QUEUE_LABEL not in labels and NAMESPACE_QUEUE_LABEL in namespace:
        labels[QUEUE_LABEL] = namespace[NAMESPACE_QUEUE_LABEL]
    if "schedulerName" not in spec and namespace.get(NAMESPACE_SCHEDULER_LABEL) == "true":
        spec = {**spec, "schedulerName": CHART_SCHEDULER}
    yield labels, spec


@pytest.mark.parametrize("directory", WORKLOAD_DIRS)
def test_every_pod_names_the_charts_scheduler_and_a_queue(directory: str) -> None:
    pods = 0
    namespaces = _namespace_labels(directory)
    for path, document in _documents(directory):
        for labels, spec in _pod_specs(document, namespaces):
            pods += 1
            where = f"{path.relative_to(ROOT)}: {document['kind']} {document['metadata']['name']}"
            assert spec.get("schedulerName") == CHART_SCHEDULER, f"{where} bypasses Tessera's scheduler"
            assert QUEUE_LABEL in labels, f"{where} names no queue"
    assert pods > 0


@pytest.mark.parametrize("directory", WORKLOAD_DIRS)
def test_named_queues_are_shipped_with_the_workloads_or_are_the_default(directory: str) -> None:
    shipped = {d["metadata"]["name"] for _, d in _documents(directory) if d["kind"] == QUEUE_KIND}
    parents = {d["spec"]["parent"] for _, d in _documents(directory) if d.get("spec", {}).get("parent")}
    namespaces = _namespace_labels(directory)
    for path, document in _documents(directory):
        for labels, _ in _pod_specs(document, namespaces):
            queue = labels[QUEUE_LABEL]
            assert queue in shipped | {DEFAULT_QUEUE}, f"{path.name}: queue {queue!r} is not shipped"
            assert queue not in parents, f"{path.name}: {queue!r} has children; pods go to leaf queues"


def test_examples_include_jobs_and_a_two_team_hierarchy() -> None:
    documents = [d for _, d in _documents("manifests/examples")]
    assert sum(d["kind"] == "Job" for d in documents) >= 2
    queues = [d for d in documents if d["kind"] == QUEUE_KIND]
    children = [q for q in queues if q["spec"].get("parent")]
    assert len(children) == 2 and len({q["spec"]["parent"] for q in children}) == 1


@pytest.mark.parametrize("directory", WORKLOAD_DIRS)
def test_every_pods_subgroups_are_stated_as_the_webhook_admits_them(directory: str) -> None:
    namespaces = _namespace_labels(directory)
    for path, document in _documents(directory):
        template = document.get("spec", {}).get("template", {}) if document["kind"] != "Pod" else document
        for labels, _ in _pod_specs(document, namespaces):
            pod = {
                "metadata": {
                    "labels": labels,
                    "annotations": template.get("metadata", {}).get("annotations", {}),
                }
            }
            assert subgroup_refusal(pod) == "", f"{path.name}: {document['metadata']['name']}"


def test_the_leader_workers_example_is_one_workload_of_two_parts() -> None:
    # Leader=1 and workers=1: a minimum of 2, all of it.
    found = [
        (workload_of({"metadata": {"namespace": "ns", **d["spec"]["template"]["metadata"]}}), d)
        for _, d in _documents("manifests/examples")
        if d["kind"] == "Job" and d["metadata"]["name"].startswith("serve-")
    ]
    assert {w.key for w, _ in found} == {"Workload/ns/serve"}
    assert {(w.minimum, w.parts) for w, _ in found} == {(2, (("leader", 1), ("workers", 1)))}
    assert sum(d["spec"]["parallelism"] for _, d in found) == 2
