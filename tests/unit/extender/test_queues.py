"""Queue objects: parsing, hierarchy checks, status, and agreement with the CRD YAML."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from contract.names import DEFAULT_QUEUE, QUEUE_GROUP, QUEUE_KIND, QUEUE_PLURAL, QUEUE_VERSION
from contract.quantity import parse_quantity
from extender.policy.fairness import QueueSpec, QueueUsage
from extender.policy.history import HistoryParams, HistorySettings, QueueHistory
from extender.queues import (
    RESOURCE_NAME,
    QueueSpecError,
    format_quantity,
    history_settings,
    parse_queue,
    queue_object,
    queue_status,
    queue_statuses,
    validate_hierarchy,
    with_workloads,
)

REPO = Path(__file__).resolve().parents[3]
GIB = 2**30


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (2, 2.0),
        (0.5, 0.5),
        ("4", 4.0),
        ("0.5", 0.5),
        ("500m", 0.5),
        ("1.5k", 1500.0),
        ("64Gi", 64.0 * GIB),
        ("512Mi", 512.0 * 2**20),
        ("1e3", 1000.0),
        ("2E-3", 0.002),
        (".5", 0.5),
        ("0", 0.0),
    ],
)
def test_parse_quantity(text: object, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["-1", -1, "abc", "1Zi", "", "1.2.3", True, None, float("inf"), "64 Gi"])
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_parse_queue_full_spec() -> None:
    spec = parse_queue(
        queue_object(
            "team-a",
            {
                "parent": "org",
                "priority": 2,
                "resources": {
                    "gpu": {"quota": 4, "limit": "8", "overQuotaWeight": 2},
                    "gpu/H100-80GB": {"quota": "2"},
                    "cpu": {"quota": "1500m", "limit": 64},
                    "memory": {"limit": "256Gi"},
                },
            },
        )
    )
    assert spec == QueueSpec(
        name="team-a",
        parent="org",
        priority=2,
        quota={"gpu": 4.0, "gpu/H100-80GB": 2.0, "cpu": 1.5},
        limit={"gpu": 8.0, "cpu": 64.0, "memory": 256.0 * GIB},
        over_quota_weight={"gpu": 2.0},
    )


@pytest.mark.parametrize(
    "obj", [{"metadata": {"name": "q"}}, queue_object("q"), queue_object("q", {"resources": {}})]
)
def test_parse_queue_empty_spec_means_no_guarantee_and_no_limit(obj: dict[str, Any]) -> None:
    assert parse_queue(obj) == QueueSpec(name="q")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"spec": {}}, "no metadata.name"),
        ({"metadata": {"name": ""}}, "no metadata.name"),
        ({"metadata": {"name": "a"}, "spec": ["gpu"]}, "queue 'a': spec must be an object"),
        (queue_object("a", {"resources": {"gpu": {"quota": 4, "limit": 2}}}), "limit 2 is below quota 4"),
        (queue_object("a", {"resources": {"tpu": {"quota": 1}}}), "unknown resource names ['tpu']"),
        (queue_object("a", {"resources": {"gpu/": {"quota": 1}}}), "unknown resource names ['gpu/']"),
        (queue_object("a", {"resources": {"gpu": {"quota": "-1"}}}), "resources.gpu.quota"),
        (queue_object("a", {"resources": {"gpu": {"overQuotaWeight": -1}}}), "resources.gpu.overQuotaWeight"),
        # Weights are 0 or within [1e-3, 1e3]: 1e308 on two siblings made every share 0.
        (
            queue_object("a", {"resources": {"gpu": {"overQuotaWeight": 1e308}}}),
            "resources.gpu.overQuotaWeight",
        ),
        (queue_object("a", {"resources": {"gpu": {"overQuotaWeight": 1e-9}}}), "neither 0 (leftovers only)"),
        (queue_object("a", {"resources": {"gpu": {"limit": "1e400"}}}), "larger than any real amount"),
        (queue_object("a", {"resources": {"memory": {"quota": "8Ei"}}}), "larger than any real amount"),
        (queue_object("a", {"resources": {"gpu": {"quotaa": 1}}}), "resources.gpu.quotaa"),
        (queue_object("a", {"priority": "high"}), "queue 'a': priority"),
        (queue_object("a", {"parent": "a"}), "cannot be its own parent"),
        (queue_object("a", {"parent": ""}), "queue 'a': parent"),
        (queue_object("a", {"placement": "pack"}), "queue 'a': placement"),
    ],
)
def test_parse_queue_rejects_with_a_clear_message(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueSpecError) as error:
        parse_queue(obj)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ([QueueSpec("a"), QueueSpec("b", "a")], {"a": [], "b": []}),
        ([QueueSpec("b", "missing")], {"b": ["parent queue 'missing' of 'b' does not exist"]}),
        (  # a chain into a missing parent: every queue on it names where it breaks
            [QueueSpec("a", "b"), QueueSpec("b", "missing")],
            {
                "a": ["parent queue 'missing' of 'b' does not exist"],
                "b": ["parent queue 'missing' of 'b' does not exist"],
            },
        ),
        (
            [QueueSpec("x", "y"), QueueSpec("y", "x"), QueueSpec("z", "x")],
            {
                "x": ["parents form a cycle: x -> y -> x"],
                "y": ["parents form a cycle: y -> x -> y"],
                "z": ["parents form a cycle: x -> y -> x"],
            },
        ),
        (
            [
                QueueSpec("org", quota={"gpu": 8}),
                QueueSpec("a", "org", quota={"gpu": 6}),
                QueueSpec("b", "org", quota={"gpu": 4, "cpu": 2}),
            ],
            {
                "org": [
                    "children's cpu quota 2 (b: 2) exceeds this queue's quota 0",
                    "children's gpu quota 10 (a: 6, b: 4) exceeds this queue's quota 8",
                ],
                "a": [],
                "b": [],
            },
        ),
        ([QueueSpec("a"), QueueSpec("a", priority=1)], {"a": ["more than one queue is named 'a'"]}),
    ],
    ids=[
        "valid",
        "unknown parent",
        "chain to an unknown parent",
        "cycle",
        "children's quota above parent's",
        "duplicate",
    ],
)
def test_validate_hierarchy(specs: list[QueueSpec], expected: dict[str, list[str]]) -> None:
    assert validate_hierarchy(specs) == expected


@pytest.mark.parametrize(
    ("resource", "amount", "text"),
    [
        ("gpu", 2, "2"),
        ("gpu", 0.5, "0.5"),
        ("gpu/T4", 2.25, "2.25"),
        ("cpu", 1.25, "1250m"),
        ("memory", 64 * GIB, "64Gi"),
        ("memory", 1000, "1000"),
    ],
)
def test_format_quantity_round_trips(resource: str, amount: float, text: str) -> None:
    assert format_quantity(resource, amount) == text
    assert parse_quantity(text) == pytest.approx(amount)


NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
LATER = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)


def conditions_by_type(status: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in status["conditions"]}


def test_queue_status_amounts_and_conditions() -> None:
    spec = QueueSpec("a", quota={"gpu": 2})
    status = queue_status(spec, {"gpu": 3, "cpu": 0.5}, {"gpu": 2}, {"gpu": 4, "cpu": 0.5}, [], now=NOW)
    assert status["allocated"] == {"cpu": "500m", "gpu": "3"}
    assert status["requested"] == {"gpu": "2"}
    assert status["fairShare"] == {"cpu": "500m", "gpu": "4"}
    conditions = conditions_by_type(status)
    assert conditions["Valid"]["status"] == "True"
    assert conditions["Borrowing"]["status"] == "True"
    # The cpu held has no quota to be above (see the table below).
    assert conditions["Borrowing"]["message"] == "gpu allocated 3 above quota 2"
    assert conditions["Starved"]["status"] == "True"
    assert conditions["Starved"]["message"] == "gpu allocated 3 below fair share 4 with 2 pending"
    assert {c["lastTransitionTime"] for c in status["conditions"]} == {"2026-01-02T03:04:05Z"}


H100 = "gpu/H100-80GB"  # counted beside "gpu" for every H100 a queue holds or waits for


@pytest.mark.parametrize(
    ("spec", "allocated", "borrowing"),
    [
        # Within its GPU quota of 4: the 2 H100s (no model quota) and the cpu (no cpu quota) are
        # not borrowed. This queue said Borrowing=True before ("gpu/H100-80GB ... above quota 0").
        (QueueSpec("a", quota={"gpu": 4}), {"gpu": 2, H100: 2, "cpu": 1.5}, ""),
        (QueueSpec("a", quota={"gpu": 4}), {"gpu": 4, H100: 4}, ""),  # at the quota: 4 of 4
        (QueueSpec("a", quota={"gpu": 4}), {"gpu": 6, H100: 6}, "gpu allocated 6 above quota 4"),
        # A model quota the admin set counts: 3 H100s above its 2, within the 8 GPUs.
        (QueueSpec("a", quota={"gpu": 8, H100: 2}), {"gpu": 3, H100: 3}, f"{H100} allocated 3 above quota 2"),
        # So does a cpu quota: 3 cores above 2.
        (QueueSpec("a", quota={"gpu": 4, "cpu": 2}), {"gpu": 1, "cpu": 3}, "cpu allocated 3 above quota 2"),
        # No GPU quota guarantees no GPU (admission counts it as 0): every GPU held is borrowed.
        (
            QueueSpec("default"),
            {"gpu": 2, H100: 2},
            "gpu allocated 2 above quota 0 (none set: no GPU is guaranteed)",
        ),
        (QueueSpec("default"), {"cpu": 4}, ""),  # cpu only, no quota for it
    ],
)
def test_borrowing_means_above_a_quota_the_admin_set(
    spec: QueueSpec, allocated: dict[str, float], borrowing: str
) -> None:
    condition = conditions_by_type(queue_status(spec, allocated, {}, {}, [], now=NOW))["Borrowing"]
    if borrowing:
        assert (condition["status"], condition["reason"], condition["message"]) == (
            "True",
            "OverQuota",
            borrowing,
        )
    else:
        assert (condition["status"], condition["reason"]) == ("False", "WithinQuota")
        assert condition["message"] == "allocations are within quota"


@pytest.mark.parametrize(
    ("spec", "starved"),
    [
        # 2 GPUs held of a fair share of 2, 1 waiting; the H100 pool alone would give it 4 (the
        # model's share is divided without model quotas). Not starved: it never named the model.
        (QueueSpec("a", quota={"gpu": 2}), ""),
        # The same queue declaring the model (a limit is enough) is starved of it: 2 below 4.
        (
            QueueSpec("a", quota={"gpu": 2}, limit={H100: 8}),
            f"{H100} allocated 2 below fair share 4 with 1 pending",
        ),
        (
            QueueSpec("a", quota={"gpu": 2}, over_quota_weight={H100: 2}),
            f"{H100} allocated 2 below fair share 4 with 1 pending",
        ),
    ],
)
def test_starved_looks_at_a_gpu_model_only_where_the_queue_declares_it(spec: QueueSpec, starved: str) -> None:
    status = queue_status(spec, {"gpu": 2, H100: 2}, {"gpu": 1, H100: 1}, {"gpu": 2, H100: 4}, [], now=NOW)
    condition = conditions_by_type(status)["Starved"]
    assert condition["status"] == ("True" if starved else "False")
    assert condition["message"] == (starved or "no pending demand below fair share")


def test_queue_status_keeps_transition_time_while_unchanged() -> None:
    spec = QueueSpec("a", quota={"gpu": 2})
    first = queue_status(spec, {"gpu": 1}, {}, {"gpu": 1}, [], now=NOW)
    second = queue_status(spec, {"gpu": 1}, {}, {"gpu": 1}, ["bad parent"], first["conditions"], now=LATER)
    conditions = conditions_by_type(second)
    assert conditions["Valid"] == {
        "type": "Valid",
        "status": "False",
        "reason": "InvalidSpec",
        "message": "bad parent",
        "lastTransitionTime": "2026-01-02T04:00:00Z",
    }
    assert conditions["Borrowing"]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert conditions["Starved"]["lastTransitionTime"] == "2026-01-02T03:04:05Z"


def test_queue_statuses_sum_subtrees_and_report_problems() -> None:
    specs = [
        QueueSpec("org", quota={"gpu": 2}),
        QueueSpec("a", "org", quota={"gpu": 2}),
        QueueSpec("b", "org", quota={"gpu": 1}),
    ]
    usages = {
        "a": QueueUsage(allocated={"gpu": 2}, requested={"gpu": 1}),
        "b": QueueUsage(allocated={"gpu": 1}, requested={}),
    }
    fair = {"org": {"gpu": 4}, "a": {"gpu": 3}, "b": {"gpu": 1}}
    statuses = queue_statuses(specs, usages, fair, now=NOW)
    assert statuses["org"]["allocated"] == {"gpu": "3"}
    assert statuses["org"]["requested"] == {"gpu": "1"}
    assert statuses["org"]["fairShare"] == {"gpu": "4"}
    assert conditions_by_type(statuses["org"])["Valid"]["message"] == (
        "children's gpu quota 3 (a: 2, b: 1) exceeds this queue's quota 2"
    )
    assert statuses["a"]["allocated"] == {"gpu": "2"}
    assert conditions_by_type(statuses["b"])["Valid"]["status"] == "True"


# --- the CRD YAML and the default queue manifest -----------------------------------------------


def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((REPO / "manifests" / "crds" / "queues.yaml").read_text())
    return crd


def test_crd_names_match_the_code() -> None:
    crd = load_crd()
    assert crd["metadata"]["name"] == f"{QUEUE_PLURAL}.{QUEUE_GROUP}"
    assert crd["spec"]["group"] == QUEUE_GROUP
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["kind"] == QUEUE_KIND
    assert crd["spec"]["names"]["shortNames"] == ["q"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == QUEUE_VERSION
    assert version["subresources"] == {"status": {}}


def _value_at(document: dict[str, Any], json_path: str) -> Any:
    value: Any = document
    for part in json_path.strip(".").split("."):
        value = value[part]
    return value


def test_printer_columns_point_at_fields_the_code_writes() -> None:
    (version,) = load_crd()["spec"]["versions"]
    spec = QueueSpec("a", parent="org", priority=1, quota={"gpu": 2}, limit={"gpu": 4})
    obj = {
        "metadata": {"name": "a", "creationTimestamp": "2026-01-02T03:04:05Z"},
        "spec": {"parent": "org", "priority": 1, "resources": {"gpu": {"quota": 2, "limit": 4}}},
        "status": {
            **with_workloads(queue_status(spec, {"gpu": 1.5}, {"gpu": 1}, {"gpu": 3}, [], now=NOW), 2, 1),
            # What the history controller writes: 8 GPUs of 16 for an hour, factor 0.8.
            "history": QueueHistory(0.0, HistoryParams(enabled=True))
            .advance(3600.0, {"gpu": 8}, {"gpu": 16})
            .to_status({"gpu": 0.8}),
        },
    }
    printed = {
        column["name"]: _value_at(obj, column["jsonPath"]) for column in version["additionalPrinterColumns"]
    }
    assert printed == {
        "Parent": "org",
        "Priority": 1,
        "GPU Quota": 2,
        "GPU Limit": 4,
        "GPU Allocated": "1.5",
        "GPU Fair Share": "3",
        "GPU Pending": "1",
        "Admitted": 2,
        "Waiting": 1,
        "GPU-h History": 8.0,
        "GPU Weight Factor": 0.8,
        "Age": "2026-01-02T03:04:05Z",
    }


def test_crd_patterns_agree_with_the_parser() -> None:
    schema = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    resources = schema["properties"]["spec"]["properties"]["resources"]
    rule = resources["x-kubernetes-validations"][0]["rule"]
    crd_name_pattern = re.search(r"matches\('([^']+)'\)", rule)
    assert crd_name_pattern is not None
    quantity_pattern = re.compile(resources["additionalProperties"]["properties"]["quota"]["pattern"])
    for name in ["gpu", "cpu", "memory", "gpu/H100-80GB", "gpu/a100.40gb", "tpu", "gpu/", "GPU", "gpu/-x"]:
        assert bool(re.match(crd_name_pattern.group(1), name)) == bool(RESOURCE_NAME.match(name)), name
    for text in ["4", "500m", "64Gi", "1e3", ".5", "1.5k"]:
        assert quantity_pattern.match(text), text
        parse_quantity(text)
    for text in ["-1", "abc", "1Zi", "64 Gi"]:
        assert not quantity_pattern.match(text), text
        with pytest.raises(ValueError):
            parse_quantity(text)


def test_default_queue_manifest_parses() -> None:
    obj = yaml.safe_load((REPO / "manifests" / "default-queue.yaml").read_text())
    assert obj["apiVersion"] == f"{QUEUE_GROUP}/{QUEUE_VERSION}"
    assert parse_queue(obj) == QueueSpec(name=DEFAULT_QUEUE)


@pytest.mark.parametrize("weight", [0, 0.001, 1, 1000])
def test_over_quota_weight_bounds_are_inclusive(weight: float) -> None:
    spec = parse_queue(queue_object("a", {"resources": {"gpu": {"overQuotaWeight": weight}}}))
    assert spec.over_quota_weight == {"gpu": weight}


@pytest.mark.parametrize(
    ("section", "settings"),
    [
        (
            {"enabled": True, "halfLife": "24h", "window": "168h", "kValue": 2},
            HistorySettings(True, 86400.0, 604800.0, 2.0),
        ),
        ({"halfLife": 0}, HistorySettings(None, 0.0, None, None)),  # 0: no decay; the rest inherited
        ({}, HistorySettings()),
    ],
)
def test_fair_share_history_settings(section: dict[str, object], settings: HistorySettings) -> None:
    obj = queue_object("a", {"fairShareHistory": section})
    parse_queue(obj)  # accepted
    assert history_settings(obj) == settings


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"kValue": -1}, "kValue"),
        ({"window": "0s"}, "window"),
        ({"halfLife": "8d"}, "halfLife"),
        ({"decay": True}, "decay"),
    ],
)
def test_bad_fair_share_history_is_refused(section: dict[str, object], problem: str) -> None:
    obj = queue_object("a", {"fairShareHistory": section})
    with pytest.raises(QueueSpecError, match=problem):
        parse_queue(obj)
    assert history_settings(obj) is None
