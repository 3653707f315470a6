"""The Queue CRD on the real kube-apiserver: install, valid and invalid objects, printed columns."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from contract.names import QUEUE_GROUP, QUEUE_PLURAL
from extender.policy.fairness import QueueSpec
from extender.policy.history import HistoryParams, QueueHistory
from extender.queues import parse_queue, queue_object, queue_status, validate_hierarchy
from tessera.dev.localcluster import REPO_ROOT, LocalCluster

pytestmark = pytest.mark.integration

CRD_PATH = REPO_ROOT / "manifests" / "crds" / "queues.yaml"
CRD_NAME = f"{QUEUE_PLURAL}.{QUEUE_GROUP}"


@pytest.fixture(scope="module")
def queue_crd(local_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The CRD installed and established; removed afterwards only if this module installed it."""
    preexisting = local_cluster.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    local_cluster.apply(CRD_PATH)
    local_cluster.wait_established(f"crd/{CRD_NAME}")
    yield local_cluster
    if not preexisting:
        # Wait for the deletion so a later test that installs the CRD does not race it.
        local_cluster.kubectl("delete", "crd", CRD_NAME, "--timeout=60s", check=False)


@pytest.fixture
def unique() -> Iterator[str]:
    yield f"it-{uuid.uuid4().hex[:8]}"


def create(cluster: LocalCluster, obj: dict[str, Any]) -> tuple[int, str]:
    result = cluster.kubectl("create", "-f", "-", check=False, input_text=json.dumps(obj))
    return result.returncode, result.stderr


def table(cluster: LocalCluster, *args: str) -> list[dict[str, str]]:
    """kubectl's table output as one dict per row, cut at the header's column offsets."""
    header, *lines = cluster.kubectl("get", *args).stdout.rstrip().splitlines()
    names = re.split(r"\s{2,}", header.strip())
    starts: list[int] = []
    for name in names:
        starts.append(header.index(name, starts[-1] if starts else 0))
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{name: line[a:b].strip() for name, (a, b) in zip(names, bounds, strict=True)} for line in lines]


def test_valid_queues_round_trip_print_and_take_status(queue_crd: LocalCluster, unique: str) -> None:
    cluster = queue_crd
    parent, child = f"{unique}-org", f"{unique}-team"
    objects = [
        queue_object(
            parent,
            {
                "resources": {
                    "gpu": {"quota": 8, "limit": 16},
                    "gpu/H100-80GB": {"quota": 4},
                    "cpu": {"quota": 8},
                    "memory": {"quota": "1Ti"},
                }
            },
        ),
        queue_object(
            child,
            {
                "parent": parent,
                "priority": 1,
                "resources": {
                    "gpu": {"quota": 4, "limit": "8", "overQuotaWeight": 2},
                    "gpu/H100-80GB": {"quota": "2"},
                    "cpu": {"quota": "1500m", "limit": 64},
                    "memory": {"limit": "512Gi"},
                },
            },
        ),
    ]
    try:
        for obj in objects:
            assert create(cluster, obj) == (0, "")

        # What the apiserver hands back parses into the policy's data and forms a valid tree.
        stored = json.loads(cluster.kubectl("get", QUEUE_PLURAL, parent, child, "-o", "json").stdout)["items"]
        specs = {spec.name: spec for spec in map(parse_queue, stored)}
        assert specs[child].parent == parent and specs[child].priority == 1
        assert specs[child].quota == {"gpu": 4.0, "gpu/H100-80GB": 2.0, "cpu": 1.5}
        assert specs[child].limit == {"gpu": 8.0, "cpu": 64.0, "memory": 512.0 * 2**30}
        assert specs[parent].priority == 0  # the schema's default
        assert validate_hierarchy(list(specs.values())) == {parent: [], child: []}

        # The status subresource accepts exactly what the extender writes.
        now = datetime.now(UTC)
        status = queue_status(specs[child], {"gpu": 1.5}, {"gpu": 2}, {"gpu": 3}, [], now=now)
        cluster.kubectl(
            "patch",
            QUEUE_PLURAL,
            child,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )
        # ... and the usage history its leader writes (extender/controllers/history.py): 8 GPUs
        # for an hour of a 16-GPU cluster, 8 GPU-hours.
        history = QueueHistory(0.0, HistoryParams(enabled=True)).advance(3600.0, {"gpu": 8}, {"gpu": 16})
        cluster.kubectl(
            "patch",
            QUEUE_PLURAL,
            child,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"history": history.to_status({"gpu": 0.8})}}),
        )
        readback = json.loads(cluster.kubectl("get", QUEUE_PLURAL, child, "-o", "json").stdout)
        assert readback["status"]["allocated"] == {"gpu": "1.5"}
        assert QueueHistory.from_status(readback["status"]["history"]) == (history, {"gpu": 0.8})
        assert [c["type"] for c in readback["status"]["conditions"]] == ["Valid", "Borrowing", "Starved"]

        rows = {row["NAME"]: row for row in table(cluster, "q", parent, child)}
        assert list(rows[child]) == [
            "NAME",
            "PARENT",
            "PRIORITY",
            "GPU QUOTA",
            "GPU LIMIT",
            "GPU ALLOCATED",
            "GPU FAIR SHARE",
            "GPU-H HISTORY",
            "AGE",
        ]
        assert [rows[child][column] for column in list(rows[child])[1:8]] == [
            parent,
            "1",
            "4",
            "8",
            "1.5",
            "3",
            "8",
        ]
        assert [rows[parent][column] for column in list(rows[parent])[1:7]] == ["", "0", "8", "16", "", ""]
        (wide,) = table(cluster, QUEUE_PLURAL, child, "-o", "wide")
        assert wide["GPU PENDING"] == "2"
    finally:
        cluster.kubectl("delete", QUEUE_PLURAL, child, parent, "--ignore-not-found", check=False)


INVALID_SPECS = [
    ({"resources": {"tpu": {"quota": 1}}}, "resource names are gpu, cpu, memory or gpu/<model>"),
    ({"resources": {"gpu": {"quota": -1}}}, "spec.resources.gpu.quota"),
    ({"resources": {"gpu": {"quota": "lots"}}}, "spec.resources.gpu.quota"),
    ({"resources": {"gpu": {"quota": 4, "limit": 2}}}, "limit must not be below quota"),
    ({"resources": {"memory": {"quota": "64Gi", "limit": "1Gi"}}}, "limit must not be below quota"),
    ({"resources": {"gpu": {"overQuotaWeight": -1}}}, "spec.resources.gpu.overQuotaWeight"),
    ({"resources": {"gpu": {"overQuotaWeight": 1e308}}}, "should be less than or equal to 1000"),
    ({"resources": {"gpu": {"overQuotaWeight": 1e-9}}}, "overQuotaWeight is 0 or between 0.001 and 1000"),
    ({"resources": {"cpu": {"quota": "1e400"}}}, "an amount is at most 4Ei"),
    # Binary quantities past 2^63 - 1 are capped to it by the apiserver: still refused.
    ({"resources": {"memory": {"limit": "10Ei"}}}, "an amount is at most 4Ei"),
    ({"resources": {"gpu": {"quota": 4611686018427387905}}}, "an amount is at most 4Ei"),
    ({"resources": {"gpu": {"quotaa": 1}}}, "quotaa"),
    ({"resources": ["gpu"]}, "spec.resources"),
    ({"priority": "high"}, "spec.priority"),
    ({"parent": "Not_A_Name"}, "spec.parent"),
    ({"namespaces": ["Not_A_Name"]}, "spec.namespaces[0]"),
    ({"namespaces": "tenant-x"}, "spec.namespaces"),
    ({"namespaceSelector": {"matchLabels": {"bad key": "y"}}}, "label keys are [prefix/]name"),
    ({"namespaceSelector": {"matchLabels": {"team": "not ok"}}}, "spec.namespaceSelector.matchLabels.team"),
    (
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}},
        "In and NotIn need values; Exists and DoesNotExist take none",
    ),
    (
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["y"]}]}},
        "In and NotIn need values; Exists and DoesNotExist take none",
    ),
    (
        {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Near", "values": ["y"]}]}},
        "spec.namespaceSelector.matchExpressions[0].operator",
    ),
]


@pytest.mark.parametrize(("spec", "message"), INVALID_SPECS, ids=[m for _, m in INVALID_SPECS])
def test_schema_rejects_garbage(queue_crd: LocalCluster, unique: str, spec: Any, message: str) -> None:
    code, stderr = create(queue_crd, queue_object(unique, spec))
    if code == 0:
        queue_crd.kubectl("delete", QUEUE_PLURAL, unique, check=False)
    assert code != 0, f"apiserver accepted {spec}"
    assert message in stderr


def test_defaults_own_parent_and_bad_status(queue_crd: LocalCluster, unique: str) -> None:
    code, stderr = create(queue_crd, queue_object(unique, {"parent": unique}))
    assert code != 0 and "a queue cannot be its own parent" in stderr

    # No spec at all: the schema's defaults fill in an empty spec with priority 0.
    bare = {key: value for key, value in queue_object(unique).items() if key != "spec"}
    assert create(queue_crd, bare) == (0, "")
    try:
        stored = json.loads(queue_crd.kubectl("get", QUEUE_PLURAL, unique, "-o", "json").stdout)
        assert stored["spec"] == {"priority": 0, "placement": "binpack"}
        assert parse_queue(stored) == QueueSpec(name=unique)
        bad = queue_crd.kubectl(
            "patch",
            QUEUE_PLURAL,
            unique,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"allocated": {"gpu": "lots"}}}),
            check=False,
        )
        assert bad.returncode != 0 and "status.allocated.gpu" in bad.stderr
    finally:
        queue_crd.kubectl("delete", QUEUE_PLURAL, unique, "--ignore-not-found", check=False)


def test_default_queue_manifest_is_accepted(queue_crd: LocalCluster) -> None:
    # Server-side dry run: full validation without creating the shared `default` queue.
    result = queue_crd.kubectl(
        "apply", "--dry-run=server", "-f", str(REPO_ROOT / "manifests" / "default-queue.yaml")
    )
    assert "queue.scheduling.tessera.dev/default" in result.stdout


def test_bounds_of_weights_and_amounts_are_accepted(queue_crd: LocalCluster, unique: str) -> None:
    """The schema's maxima are inclusive, and what it accepts the extender's parser reads."""
    names = [f"{unique}-{i}" for i in range(3)]
    specs: list[dict[str, Any]] = [
        {"resources": {"gpu": {"overQuotaWeight": 0}, "cpu": {"quota": 4611686018427387904}}},
        {"resources": {"gpu": {"overQuotaWeight": 0.001}, "memory": {"limit": "4Ei"}}},
        {"resources": {"gpu": {"overQuotaWeight": 1000, "quota": "4611686018427387904"}}},
    ]
    try:
        for name, spec in zip(names, specs, strict=True):
            assert create(queue_crd, queue_object(name, spec)) == (0, "")
        stored = json.loads(queue_crd.kubectl("get", QUEUE_PLURAL, *names, "-o", "json").stdout)["items"]
        weights = sorted(parse_queue(obj).over_quota_weight["gpu"] for obj in stored)
        assert weights == [0, 0.001, 1000]
    finally:
        queue_crd.kubectl("delete", QUEUE_PLURAL, *names, "--ignore-not-found", check=False)


def test_tenancy_fields_are_accepted_and_parse_as_stored(queue_crd: LocalCluster, unique: str) -> None:
    """Every selector operator, a prefixed key, an empty value, an empty list: what the schema
    stores is what the parser reads."""
    names = [f"{unique}-{i}" for i in range(2)]
    selector = {
        "matchLabels": {"example.com/team": "y", "tier": ""},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "staging"]},
            {"key": "legacy", "operator": "NotIn", "values": ["true"]},
            {"key": "gpu", "operator": "Exists"},
            {"key": "frozen", "operator": "DoesNotExist"},
        ],
    }
    specs: list[dict[str, Any]] = [
        {"namespaces": ["tenant-y", "ops"], "namespaceSelector": selector},
        {"namespaces": []},
    ]
    try:
        for name, spec in zip(names, specs, strict=True):
            assert create(queue_crd, queue_object(name, spec)) == (0, "")
        stored = json.loads(queue_crd.kubectl("get", QUEUE_PLURAL, *names, "-o", "json").stdout)["items"]
        tenancies = {obj["metadata"]["name"]: parse_queue(obj).tenancy for obj in stored}
        assert tenancies[names[0]].admits(
            "ns", {"example.com/team": "y", "tier": "", "env": "prod", "gpu": "a100"}
        )
        assert not tenancies[names[0]].admits(
            "ns", {"example.com/team": "y", "tier": "", "env": "dev", "gpu": "a100"}
        )
        assert tenancies[names[0]].admits("ops", {})
        assert tenancies[names[1]].namespaces == frozenset() and tenancies[names[1]].selector is None
    finally:
        queue_crd.kubectl("delete", QUEUE_PLURAL, *names, "--ignore-not-found", check=False)
