"""Queue tenancy: the rule (extender.policy.tenancy), its parsing and CRD schema, and the places
that apply it - the pod webhook, the filter, the gate controller and the Queue webhook."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from contract.names import ADMISSION_GATE, NAMESPACE_QUEUE_LABEL
from extender.controllers.gates import GateController
from extender.metrics import ExtenderMetrics
from extender.picture.cluster import WATCHED_PATHS, ClusterPicture
from extender.policy.fairness import QueueSpec
from extender.policy.tenancy import OPEN, LabelRequirement, NamespaceSelector, Tenancy, tenancy_refusal
from extender.queues import QueueSpecError, parse_queue, queue_object
from extender.webhook import MUTATE_PODS_PATH, VALIDATE_NAMESPACES_PATH, VALIDATE_QUEUES_PATH
from tests import extender_objects as objects

# Fixtures of test_server (extender: the verbs' app) and test_webhook (webhooks: the webhooks' app).
from tests.unit.extender.test_server import Extender, args, extender  # noqa: F401
from tests.unit.extender.test_server import cluster as filter_cluster
from tests.unit.extender.test_webhook import Webhooks, namespace, patch_of, webhooks  # noqa: F401
from tests.unit.extender.test_webhook import cluster as webhook_cluster

REPO = Path(__file__).resolve().parents[3]
TEAM_Y = NamespaceSelector((LabelRequirement("team", "In", ("y",)),))


def spec(name: str, parent: str | None = None, tenancy: Tenancy = OPEN) -> QueueSpec:
    return QueueSpec(name=name, parent=parent, tenancy=tenancy)


# org (namespaces labelled team=y, or "ops") > team-y (namespaces tenant-y, tenant-y2) and
# team-y-open (no restriction of its own); retired takes nobody; open takes anybody.
QUEUES = {
    s.name: s
    for s in [
        spec("org", tenancy=Tenancy(frozenset({"ops"}), TEAM_Y)),
        spec("team-y", "org", Tenancy(frozenset({"tenant-y", "tenant-y2"}))),
        spec("team-y-open", "org"),
        spec("retired", tenancy=Tenancy(frozenset())),
        spec("open"),
        spec("orphan", "gone", Tenancy(frozenset({"tenant-y"}))),
        spec("loop-a", "loop-b", Tenancy(frozenset({"tenant-y"}))),
        spec("loop-b", "loop-a"),
    ]
}
Y_LABELS = {"team": "y"}


@pytest.mark.parametrize(
    ("queue", "namespace", "labels", "refusal"),
    [
        # Open queues, and queues that do not exist (admission refuses those itself), take anyone.
        ("open", "tenant-x", {}, ""),
        ("nobody", "tenant-x", {}, ""),
        # Listed and selected by org (team=y), listed by team-y: both say yes.
        ("team-y", "tenant-y", Y_LABELS, ""),
        # Listed by team-y, but org neither lists nor selects it (no team=y label): the ancestor
        # refuses, so a child cannot widen its parent.
        (
            "team-y",
            "tenant-y2",
            {},
            "namespace 'tenant-y2' may not use queue 'team-y': its ancestor queue 'org' takes only pods "
            "of namespace ops or namespaces labelled team=y",
        ),
        # Selected by org, not listed by team-y: team-y refuses, naming itself and its list.
        (
            "team-y",
            "tenant-x",
            Y_LABELS,
            "namespace 'tenant-x' may not use queue 'team-y': it takes only pods of namespaces "
            "tenant-y, tenant-y2",
        ),
        # A child without its own restriction takes what its parent takes: the list or the selector.
        ("team-y-open", "ops", {}, ""),
        ("team-y-open", "research", Y_LABELS, ""),
        (
            "team-y-open",
            "tenant-x",
            {"team": "x"},
            "namespace 'tenant-x' may not use queue 'team-y-open': its ancestor queue 'org' takes only "
            "pods of namespace ops or namespaces labelled team=y",
        ),
        # An empty list and no selector: nobody.
        (
            "retired",
            "tenant-y",
            Y_LABELS,
            "namespace 'tenant-y' may not use queue 'retired': it takes pods of no namespace",
        ),
        # Broken chains are judged as far as they go (their pods are refused as unusable anyway).
        ("orphan", "tenant-y", {}, ""),
        (
            "loop-a",
            "tenant-x",
            {},
            "namespace 'tenant-x' may not use queue 'loop-a': it takes only pods of namespace tenant-y",
        ),
        (
            "loop-b",
            "tenant-x",
            {},
            "namespace 'tenant-x' may not use queue 'loop-b': its ancestor queue 'loop-a' takes only pods "
            "of namespace tenant-y",
        ),
    ],
)
def test_who_may_use_a_queue(queue: str, namespace: str, labels: dict[str, str], refusal: str) -> None:
    assert tenancy_refusal(QUEUES, queue, namespace, labels) == refusal


@pytest.mark.parametrize(
    ("requirement", "labels", "matches"),
    [
        (LabelRequirement("team", "In", ("y", "z")), {"team": "z"}, True),
        (LabelRequirement("team", "In", ("y", "z")), {}, False),
        (LabelRequirement("team", "NotIn", ("x",)), {"team": "y"}, True),
        (LabelRequirement("team", "NotIn", ("x",)), {}, True),  # as Kubernetes: no label is not in
        (LabelRequirement("team", "NotIn", ("x",)), {"team": "x"}, False),
        (LabelRequirement("team", "Exists"), {"team": ""}, True),
        (LabelRequirement("team", "Exists"), {}, False),
        (LabelRequirement("team", "DoesNotExist"), {}, True),
        (LabelRequirement("team", "DoesNotExist"), {"team": "y"}, False),
    ],
)
def test_label_requirements_match_as_kubernetes_selectors_do(
    requirement: LabelRequirement, labels: dict[str, str], matches: bool
) -> None:
    assert requirement.matches(labels) is matches


def test_an_empty_selector_selects_every_namespace_and_a_selector_reads_as_kubectl_l() -> None:
    assert Tenancy(selector=NamespaceSelector()).admits("anything", {})
    selector = NamespaceSelector(
        (
            LabelRequirement("team", "In", ("y",)),
            LabelRequirement("env", "In", ("a", "b")),
            LabelRequirement("tier", "NotIn", ("x",)),
            LabelRequirement("gpu", "Exists"),
            LabelRequirement("legacy", "DoesNotExist"),
        )
    )
    assert selector.describe() == "team=y,env in (a,b),tier notin (x),gpu,!legacy"


def test_a_long_list_is_shown_in_part() -> None:
    # 10 names, 8 shown: "and 2 more".
    tenancy = Tenancy(frozenset(f"ns-{i}" for i in range(10)))
    assert tenancy.describe() == "namespaces ns-0, ns-1, ns-2, ns-3, ns-4, ns-5, ns-6, ns-7 and 2 more"


@pytest.mark.parametrize(
    ("fields", "tenancy"),
    [
        # Neither field: open (today's Queues keep working).
        ({}, OPEN),
        ({"namespaces": []}, Tenancy(frozenset())),
        ({"namespaces": ["a", "b"]}, Tenancy(frozenset({"a", "b"}))),
        ({"namespaceSelector": {}}, Tenancy(selector=NamespaceSelector())),
        (
            {
                "namespaces": ["ops"],
                "namespaceSelector": {
                    "matchLabels": {"team": "y", "example.com/org": "r"},
                    "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}],
                },
            },
            Tenancy(
                frozenset({"ops"}),
                NamespaceSelector(
                    (
                        LabelRequirement("example.com/org", "In", ("r",)),
                        LabelRequirement("team", "In", ("y",)),
                        LabelRequirement("env", "NotIn", ("dev",)),
                    )
                ),
            ),
        ),
    ],
)
def test_parse_queue_reads_tenancy(fields: dict[str, Any], tenancy: Tenancy) -> None:
    assert parse_queue(queue_object("q", fields)).tenancy == tenancy


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"namespaces": ["Tenant_X"]}, "namespaces.0"),
        ({"namespaces": "tenant-x"}, "namespaces"),
        ({"namespaces": ["a" * 64]}, "namespaces.0"),
        ({"namespaces": [f"ns-{i}" for i in range(257)]}, "namespaces"),
        ({"namespaceSelector": {"matchLabels": {"bad key!": "y"}}}, "namespaceSelector.matchLabels"),
        ({"namespaceSelector": {"matchLabels": {"team": "not ok"}}}, "namespaceSelector.matchLabels"),
        ({"namespaceSelector": {"matchLabelz": {}}}, "namespaceSelector.matchLabelz"),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "Near", "values": ["y"]}]
                }
            },
            "matchExpressions.0.operator",
        ),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}},
            "operator In needs at least one value",
        ),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "team", "operator": "Exists", "values": ["y"]}]
                }
            },
            "operator Exists takes no values",
        ),
    ],
)
def test_parse_queue_refuses_bad_tenancy_naming_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueSpecError) as error:
        parse_queue(queue_object("q", fields))
    assert message in str(error.value)


def test_crd_tenancy_patterns_agree_with_the_parser() -> None:
    crd = yaml.safe_load((REPO / "manifests" / "crds" / "queues.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    name_pattern = spec_schema["namespaces"]["items"]["pattern"]
    selector = spec_schema["namespaceSelector"]["properties"]
    key_rule = selector["matchLabels"]["x-kubernetes-validations"][0]["rule"]
    found = re.search(r"matches\('([^']+)'\)", key_rule)
    assert found is not None
    key_pattern = found.group(1).replace("\\\\", "\\")  # a CEL string literal: \\ is one backslash
    expression = selector["matchExpressions"]["items"]["properties"]
    assert expression["key"]["pattern"] == key_pattern
    value_pattern = selector["matchLabels"]["additionalProperties"]["pattern"]
    for name in ["tenant-x", "a", "0ns", "Tenant", "-x", "x-", "a.b", "a" * 63]:
        ok = bool(re.match(name_pattern, name))
        try:
            parse_queue(queue_object("q", {"namespaces": [name]}))
            assert ok, name
        except QueueSpecError:
            assert not ok, name
    for key, value in [
        ("team", "y"),
        ("example.com/team", "y-1.z_2"),
        ("a" * 63, ""),
        ("bad key", "y"),
        ("Example.com/team", "y"),
        ("team", "-y"),
        ("team", "a" * 63),
        ("/team", "y"),
    ]:
        ok = bool(re.match(key_pattern, key)) and bool(re.match(value_pattern, value))
        try:
            parse_queue(queue_object("q", {"namespaceSelector": {"matchLabels": {key: value}}}))
            assert ok, (key, value)
        except QueueSpecError:
            assert not ok, (key, value)


# -- where it is applied --------------------------------------------------------------------------

REFUSAL = "namespace 'tenant-x' may not use queue 'team-y': it takes only pods of namespace tenant-y"


def team_y(**fields: Any) -> dict[str, Any]:
    """Queue team-y (quota 1 GPU), for namespace tenant-y only unless `fields` say otherwise."""
    queue = objects.queue("team-y", resources={"gpu": {"quota": 1}})
    queue["spec"].update(fields or {"namespaces": ["tenant-y"]})
    return queue


def tenants(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The webhook tests' cluster with team-y and namespaces tenant-x (defaulting to team-y) and tenant-y."""
    return webhook_cluster(
        team_y(),
        namespace("tenant-x", {NAMESPACE_QUEUE_LABEL: "team-y"}),
        namespace("tenant-y", {}),
        *(
            objects.claim_template(ns, "one", objects.claim_spec("gpu.tessera.dev"))
            for ns in ("tenant-x", "tenant-y")
        ),
        *extra,
    )


@pytest.mark.parametrize(
    ("pod", "refusal"),
    [
        # The case: a pod of tenant-x labelled team-y, with a GPU or without.
        (objects.pod("tenant-x", "p", queue="team-y", template="one"), REFUSAL),
        (objects.pod("tenant-x", "p", queue="team-y"), REFUSAL),
        # Unlabelled in tenant-x: its namespace's default queue is team-y, which refuses it too.
        (objects.pod("tenant-x", "p", template="one"), REFUSAL),
        # team-y's own pod is admitted (and labelled: no patch needed, it names its queue).
        (objects.pod("tenant-y", "p", queue="team-y", template="one"), ""),
        # Other queues are not restricted.
        (objects.pod("tenant-x", "p", queue="team-b", template="one"), ""),
    ],
)
async def test_the_pod_webhook_refuses_a_queue_its_namespace_may_not_use(
    webhooks: Webhooks,  # noqa: F811
    pod: dict[str, Any],
    refusal: str,
) -> None:
    webhooks.sync(tenants())
    answer = await webhooks.review(MUTATE_PODS_PATH, pod)
    if refusal:
        assert answer["allowed"] is False and "patch" not in answer
        assert answer["status"] == {"code": 422, "reason": "Invalid", "message": refusal}
    else:
        assert patch_of(answer) == []


async def test_a_restricted_default_queue_refuses_gpu_pods_only(webhooks: Webhooks) -> None:  # noqa: F811
    # "default" takes only tenant-y: a plain pod of tenant-x naming no queue is not Tessera's (left
    # alone); a GPU pod there falls in the default queue and is refused.
    default = objects.queue("default")
    default["spec"]["namespaces"] = ["tenant-y"]
    webhooks.sync([*tenants(), default])
    plain = objects.pod("plain", "p")
    assert patch_of(await webhooks.review(MUTATE_PODS_PATH, plain)) == []
    answer = await webhooks.review(MUTATE_PODS_PATH, objects.pod("plain", "gpu", template="one"))
    assert answer["allowed"] is False
    assert answer["status"]["message"] == (
        "namespace 'plain' may not use queue 'default': it takes only pods of namespace tenant-y"
    )


async def test_an_unsynced_picture_refuses_nothing(webhooks: Webhooks) -> None:  # noqa: F811
    # Not synced, the Queues are not known: the filter judges the pod later.
    answer = await webhooks.review(
        MUTATE_PODS_PATH, objects.pod("tenant-x", "p", queue="team-y", template="one")
    )
    assert answer["allowed"] is True


def filter_tenants(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The filter tests' cluster (nodes a and b, team-a and team-b) with team-y and its namespaces."""
    return filter_cluster(
        team_y(),
        namespace("tenant-x", {}),
        namespace("tenant-y", {"team": "y"}),
        *(
            objects.claim_template(ns, "one", objects.claim_spec("gpu.tessera.dev"))
            for ns in ("tenant-x", "tenant-y")
        ),
        *extra,
    )


async def test_the_filter_refuses_the_pod_the_webhook_would_have_with_the_same_message(
    extender: Extender,  # noqa: F811
    webhooks: Webhooks,  # noqa: F811
) -> None:
    # Created while the webhook was bypassed: the pod reaches the scheduler with its label.
    pod = objects.pod("tenant-x", "p", queue="team-y", template="one")
    extender.sync(filter_tenants(pod))
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert status == 200
    assert result["NodeNames"] == [] and result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {"a": REFUSAL, "b": REFUSAL}
    assert extender.waiting.waiting["tenant-x/p"].reason == REFUSAL
    # The webhook says the very same words.
    webhooks.sync(tenants())
    answer = await webhooks.review(
        MUTATE_PODS_PATH, objects.pod("tenant-x", "p", queue="team-y", template="one")
    )
    assert answer["status"]["message"] == REFUSAL


@pytest.mark.parametrize(
    ("fields", "passed"),
    [
        # team-y's own namespace by name, and by a selector on its label team=y.
        ({"namespaces": ["tenant-y"]}, ["a", "b"]),
        ({"namespaceSelector": {"matchLabels": {"team": "y"}}}, ["a", "b"]),
        # A selector on the name label the API server sets (tenant-y's object here has none: the
        # picture adds it, as the API server would).
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["tenant-y"]}
                    ]
                }
            },
            ["a", "b"],
        ),
        # No namespace: refused everywhere.
        ({"namespaces": []}, []),
    ],
)
async def test_the_filter_admits_the_namespaces_a_queue_takes(
    extender: Extender,  # noqa: F811
    fields: dict[str, Any],
    passed: list[str],
) -> None:
    pod = objects.pod("tenant-y", "p", queue="team-y", template="one")
    objs = [o for o in filter_tenants(pod) if o["metadata"]["name"] != "team-y"]
    extender.sync([*objs, team_y(**fields)])
    status, result = await extender.call("filter", args(pod, ["a", "b"]))
    assert status == 200 and result["NodeNames"] == passed


async def test_a_queue_that_shuts_a_namespace_out_keeps_its_gated_pods_gated() -> None:
    # team-y (no limit) has room for both gated pods; tenant-x's stays gated, tenant-y's goes.
    def gated(namespace: str, name: str) -> dict[str, Any]:
        pod = objects.pod(namespace, name, queue="team-y", template="one")
        pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]
        return pod

    objs = tenants(gated("tenant-x", "outsider"), gated("tenant-y", "insider"))
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    async with ApiClient() as api:
        controller = GateController(api, picture, ExtenderMetrics(picture))
        assert [key for key, _ in controller.admissible()] == ["tenant-y/insider"]
        # Opened to every namespace, the outsider goes too (before the change: it stayed).
        picture.apply("Queue", "MODIFIED", {**team_y(), "spec": {**team_y()["spec"], "namespaces": None}})
        assert [key for key, _ in controller.admissible()] == ["tenant-x/outsider", "tenant-y/insider"]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"namespaces": ["tenant-y", "Not_A_Name"]}, "namespaces.1"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": []}]}},
            "operator In needs at least one value",
        ),
        ({"namespaces": ["tenant-y"], "namespaceSelector": {"matchLabels": {"team": "y"}}}, None),
    ],
)
async def test_the_queue_webhook_validates_tenancy(
    webhooks: Webhooks,  # noqa: F811
    fields: dict[str, Any],
    needle: str | None,
) -> None:
    webhooks.sync(tenants())
    queue = objects.queue("team-z")
    queue["spec"].update(fields)
    answer = await webhooks.review(VALIDATE_QUEUES_PATH, queue)
    if needle is None:
        assert answer["allowed"] is True
    else:
        assert answer["allowed"] is False and needle in answer["status"]["message"]
        assert "queue 'team-z'" in answer["status"]["message"]


def test_reclaim_plans_for_no_pod_whose_namespace_may_not_use_its_queue() -> None:
    # Both wait for a GPU in team-y; only tenant-y's is one the planners may free GPUs for.
    objs = tenants(
        objects.pod("tenant-x", "outsider", queue="team-y", template="one"),
        objects.pod("tenant-y", "insider", queue="team-y", template="one"),
    )
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    assert [pod.key for pod in picture.waiting_pods()] == ["tenant-y/insider"]


@pytest.mark.parametrize(
    ("obj", "operation", "refusal"),
    [
        # tenant-x may not use team-y (tenant-y only): its default-queue label is refused.
        (
            namespace("tenant-x", {NAMESPACE_QUEUE_LABEL: "team-y"}),
            "CREATE",
            f"label {NAMESPACE_QUEUE_LABEL}=team-y: " + REFUSAL,
        ),
        (namespace("tenant-y", {NAMESPACE_QUEUE_LABEL: "team-y"}), "UPDATE", ""),
        # A queue not known (yet) is not judged here; its pods will be.
        (namespace("tenant-x", {NAMESPACE_QUEUE_LABEL: "later"}), "CREATE", ""),
        # Selected by its labels, "research" may default to team-r; without the label it may not.
        (namespace("research", {NAMESPACE_QUEUE_LABEL: "team-r", "team": "r"}), "UPDATE", ""),
        (
            namespace("research", {NAMESPACE_QUEUE_LABEL: "team-r"}),
            "UPDATE",
            f"label {NAMESPACE_QUEUE_LABEL}=team-r: namespace 'research' may not use queue 'team-r': it "
            "takes only pods of namespaces labelled team=r",
        ),
        (namespace("tenant-x", {NAMESPACE_QUEUE_LABEL: "team-y"}), "DELETE", ""),
    ],
)
async def test_the_namespace_webhook_refuses_a_default_queue_the_namespace_may_not_use(
    webhooks: Webhooks,  # noqa: F811
    obj: dict[str, Any],
    operation: str,
    refusal: str,
) -> None:
    team_r = objects.queue("team-r")
    team_r["spec"]["namespaceSelector"] = {"matchLabels": {"team": "r"}}
    webhooks.sync(tenants(team_r))
    answer = await webhooks.review(VALIDATE_NAMESPACES_PATH, obj, operation)
    assert answer["allowed"] is (not refusal)
    assert answer.get("status", {}).get("message", "") == refusal


def test_a_pod_its_namespace_may_not_use_the_queue_of_is_no_demand_of_that_queue() -> None:
    # team-y (tenant-y only) with two pending 1-GPU pods: tenant-y's is demand (requested 1),
    # tenant-x's is not (the filter refuses it); once tenant-x carries team-y's selector label,
    # both are (requested 2); the Queue opened to all, likewise.
    objs = tenants(
        objects.pod("tenant-x", "outsider", queue="team-y", template="one"),
        objects.pod("tenant-y", "insider", queue="team-y", template="one"),
    )
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])

    def requested() -> float:
        return picture.fairness().usage["team-y"].requested.get("gpu", 0.0)

    assert requested() == 1
    picture.apply(
        "Queue", "MODIFIED", team_y(namespaces=["tenant-y"], namespaceSelector={"matchLabels": {"team": "y"}})
    )
    assert requested() == 1  # tenant-x has no label team=y yet
    picture.apply("Namespace", "MODIFIED", namespace("tenant-x", {"team": "y"}))
    assert requested() == 2
    picture.apply("Namespace", "MODIFIED", namespace("tenant-x", {}))
    assert requested() == 1
    picture.apply("Queue", "MODIFIED", {**team_y(), "spec": {**team_y()["spec"], "namespaces": None}})
    assert requested() == 2


async def test_a_queue_write_warns_of_the_namespaces_whose_default_it_shuts_out(
    webhooks: Webhooks,  # noqa: F811
) -> None:
    # team-y takes tenant-y and y-ci; y-ci and tenant-x default to it (tenant-x already may not).
    objs = [
        o
        for o in tenants(namespace("y-ci", {NAMESPACE_QUEUE_LABEL: "team-y"}))
        if o["metadata"]["name"] != "team-y"
    ]
    webhooks.sync([*objs, team_y(namespaces=["tenant-y", "y-ci"])])
    # Narrowed to tenant-y: admitted, with a warning for y-ci only (tenant-x lost nothing).
    answer = await webhooks.review(VALIDATE_QUEUES_PATH, team_y(namespaces=["tenant-y"]), "UPDATE")
    assert answer["allowed"] is True
    assert answer["warnings"] == [
        f"label {NAMESPACE_QUEUE_LABEL}=team-y of namespace 'y-ci': namespace 'y-ci' may not use queue "
        "'team-y': it takes only pods of namespace tenant-y (its pods that name no queue will be refused)"
    ]
    # A write that takes nothing away warns of nothing.
    answer = await webhooks.review(
        VALIDATE_QUEUES_PATH, team_y(namespaces=["tenant-y", "y-ci", "ops"]), "UPDATE"
    )
    assert answer["allowed"] is True and "warnings" not in answer


def test_a_restricted_queue_created_in_an_open_cluster_recounts_its_waiting_pods() -> None:
    # Every queue open, team-y not there yet: tenant-x's pod counts as its demand (1 GPU), until
    # team-y is created taking nobody (namespaces: [], falsy yet a restriction).
    waiting = objects.pod("tenant-x", "early", queue="team-y", template="one")
    objs = [o for o in tenants(waiting) if o["metadata"]["name"] != "team-y"]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    assert picture.fairness().usage["team-y"].requested.get("gpu", 0.0) == 1
    picture.apply("Queue", "ADDED", team_y(namespaces=[]))
    assert picture.fairness().usage["team-y"].requested.get("gpu", 0.0) == 0


def test_while_every_queue_is_open_a_new_queue_recounts_no_pod() -> None:
    # A full recount (told as None) costs a pass over every pod: only a tenancy edit needs one.
    objs = [o for o in webhook_cluster() if o["kind"] != "Queue"]
    picture = ClusterPicture()
    for kind in WATCHED_PATHS:
        picture.replace(kind, [o for o in objs if o["kind"] == kind])
    picture.fairness()
    told: list[object] = []
    picture.on_recount(lambda keys: told.append(keys if keys is None else sorted(keys)))
    picture.apply("Queue", "ADDED", objects.queue("team-c", parent="team-a"))
    picture.fairness()
    assert None not in told
    picture.apply("Queue", "ADDED", team_y())  # the first restricted queue: every pod is judged again
    picture.fairness()
    assert None in told
