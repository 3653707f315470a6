"""The committed plain install (manifests/install.yaml, rendered from charts/tessera): consistent
with the shared manifests and wired together. Pure YAML; the helm and apiserver checks are in
tests/integration/test_install.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.cli import EXTENDER_WEIGHT, SCHEDULER_PROFILE
from tessera.dev.localcluster import WEBHOOK_OBJECT_SELECTORS, WEBHOOK_RULES
from tessera.simulate.deployed import SHIPPED_PROFILE

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "tessera-system"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def install() -> list[dict[str, Any]]:
    return documents(REPO / "manifests" / "install.yaml")


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} objects"
    return matches[0]


@pytest.mark.parametrize("shared", ["crds/queues.yaml", "deviceclasses.yaml", "default-queue.yaml"])
def test_shared_manifests_are_installed_unchanged(install: list[dict[str, Any]], shared: str) -> None:
    for expected in documents(REPO / "manifests" / shared):
        assert one(install, expected["kind"], expected["metadata"]["name"]) == expected


def test_everything_lives_in_the_release_namespace(install: list[dict[str, Any]]) -> None:
    assert install[0] == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }
    namespaces = {(o["kind"], o["metadata"]["name"]): o["metadata"].get("namespace") for o in install}
    outside = {key: ns for key, ns in namespaces.items() if ns not in (None, NAMESPACE)}
    # Only the scheduler's read access to the apiserver's authentication ConfigMap sits elsewhere.
    assert outside == {("RoleBinding", "tessera-scheduler-auth-reader"): "kube-system"}
    assert all(o["kind"] != "Secret" for o in install)


def test_no_role_grants_wildcards(install: list[dict[str, Any]]) -> None:
    for role in (o for o in install if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], role["metadata"]["name"]


def test_the_scheduler_configuration_calls_the_extender_service(install: list[dict[str, Any]]) -> None:
    config_map = one(install, "ConfigMap", "tessera-scheduler-config")
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    assert config["profiles"] == [{"schedulerName": "tessera", **SCHEDULER_PROFILE}]
    assert config["leaderElection"]["resourceName"] == "tessera-scheduler"
    service = one(install, "Service", "tessera-extender")
    port = service["spec"]["ports"][0]["port"]
    (extender,) = config["extenders"]
    host = f"tessera-extender.{NAMESPACE}.svc"
    assert extender["urlPrefix"] == f"https://{host}:{port}"
    # kube-scheduler binds (extender.bind is off by default), and the extender may not.
    assert "bindVerb" not in extender and extender["nodeCacheCapable"] is True
    role = one(install, "ClusterRole", "tessera-extender")
    assert not [rule for rule in role["rules"] if "pods/binding" in rule["resources"]]
    assert extender["weight"] == EXTENDER_WEIGHT
    assert extender["ignorable"] is False
    # Mutual TLS by default: the scheduler checks the extender's name and presents its certificate.
    assert extender["enableHTTPS"] is True
    assert extender["tlsConfig"] == {
        "serverName": host,
        "caFile": "/etc/tessera/extender-client/ca.crt",
        "certFile": "/etc/tessera/extender-client/tls.crt",
        "keyFile": "/etc/tessera/extender-client/tls.key",
    }

    scheduler = one(install, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"]
    assert scheduler["serviceAccountName"] == "tessera-scheduler"
    (volume,) = (v for v in scheduler["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == "tessera-scheduler-config"


def test_the_extender_service_selects_the_extender_pods(install: list[dict[str, Any]]) -> None:
    # The scheduler's Service has no selector: the Lease holder writes its EndpointSlice. The
    # metrics Service selects every replica.
    service = one(install, "Service", "tessera-extender")
    assert "selector" not in service["spec"]
    metrics = one(install, "Service", "tessera-extender-metrics")
    deployment = one(install, "Deployment", "tessera-extender")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert metrics["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    budget = one(install, "PodDisruptionBudget", "tessera-extender")
    assert budget["spec"]["minAvailable"] == 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tessera-extender"]
    # Queue demand from the chart's scheduler only; GPUs of the chart's driver.
    assert {"--scheduler-name=tessera", "--gpu-driver=gpu.tessera.dev"} <= set(container["args"])
    assert {"--leader-elect", "--advertise-service=tessera-extender"} <= set(container["args"])
    # Evictions side by side, each with a short timeout (extender.reclaim values).
    assert {"--eviction-concurrency=16", "--eviction-timeout=5"} <= set(container["args"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # The scheduler's client certificate is required; metrics and probes on their own port.
    assert {
        "--tls-cert-file=/etc/tessera/tls/tls.crt",
        "--tls-key-file=/etc/tessera/tls/tls.key",
        "--tls-client-ca-file=/etc/tessera/tls/ca.crt",
        "--metrics-port=9090",
    } <= set(container["args"])
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"https": 8888}
    assert {p["name"]: p["port"] for p in metrics["spec"]["ports"]} == {"https": 8888, "metrics": 9090}
    assert metrics["metadata"]["annotations"]["prometheus.io/port"] == "9090"


def test_only_the_scheduler_reaches_the_extender_port(install: list[dict[str, Any]]) -> None:
    policy = one(install, "NetworkPolicy", "tessera-extender")["spec"]
    extender_pods = one(install, "Deployment", "tessera-extender")["spec"]["template"]["metadata"]["labels"]
    scheduler_pods = one(install, "Deployment", "tessera-scheduler")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= extender_pods.items()
    assert policy["policyTypes"] == ["Ingress"]
    verbs, webhooks, metrics = policy["ingress"]
    assert verbs["ports"] == [{"port": "extender", "protocol": "TCP"}]
    (peer,) = verbs["from"]
    assert peer["podSelector"]["matchLabels"].items() <= scheduler_pods.items()
    assert not peer["podSelector"]["matchLabels"].items() <= extender_pods.items()
    # Webhooks and metrics from anywhere by default (webhookPeers and metricsPeers narrow them):
    # where the API server's calls come from depends on the cluster.
    assert webhooks == {"ports": [{"port": "webhook", "protocol": "TCP"}]}
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}]}


def test_the_webhooks_reach_every_replica_with_the_rules_the_local_cluster_uses(
    install: list[dict[str, Any]],
) -> None:
    deployment = one(install, "Deployment", "tessera-extender")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {
        "--webhook-port=8443",
        "--webhook-scheduler-name=tessera",
        "--config-driver=gpu.tessera.dev",
    } <= set(container["args"])
    assert {"name": "webhook", "containerPort": 8443} in container["ports"]
    service = one(install, "Service", "tessera-extender-webhook")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook"}]
    # The serving certificate names the webhook Service; cert-manager injects its CA.
    serving = one(install, "Certificate", "tessera-extender")["spec"]
    assert f"tessera-extender-webhook.{NAMESPACE}.svc" in serving["dnsNames"]
    found = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = one(install, kind, "tessera-extender")
        assert configuration["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/tessera-extender"
        }
        for webhook in configuration["webhooks"]:
            service_ref = webhook["clientConfig"]["service"]
            assert (service_ref["name"], service_ref["namespace"], service_ref["port"]) == (
                "tessera-extender-webhook",
                NAMESPACE,
                443,
            )
            assert webhook["failurePolicy"] == "Ignore" and webhook["sideEffects"] == "None"
            found[webhook["name"]] = (kind, service_ref["path"], webhook["rules"][0])
            assert webhook.get("objectSelector") == WEBHOOK_OBJECT_SELECTORS.get(webhook["name"])
    assert found == WEBHOOK_RULES
    mutating = one(install, "MutatingWebhookConfiguration", "tessera-extender")["webhooks"][0]
    # The pod webhook never sees the system's pods nor Tessera's own.
    assert mutating["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NAMESPACE]}
    ]


def test_the_extender_may_patch_pods_only_to_lift_its_gate(install: list[dict[str, Any]]) -> None:
    role = one(install, "ClusterRole", "tessera-extender")
    pod_verbs = sorted(v for rule in role["rules"] if rule["resources"] == ["pods"] for v in rule["verbs"])
    assert pod_verbs == ["get", "list", "patch", "watch"]
    policy = one(install, "ValidatingAdmissionPolicy", "tessera-extender-gates-only")["spec"]
    assert policy["matchConditions"][0]["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:tessera-extender"'
    )
    assert policy["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
    binding = one(install, "ValidatingAdmissionPolicyBinding", "tessera-extender-gates-only")["spec"]
    assert binding == {"policyName": "tessera-extender-gates-only", "validationActions": ["Deny"]}


def test_cert_manager_issues_both_ends_of_the_link_from_one_ca(install: list[dict[str, Any]]) -> None:
    """The fields are cert-manager.io/v1's (Issuer selfSigned and ca, Certificate spec)."""
    assert one(install, "Issuer", "tessera-extender-selfsigned")["spec"] == {"selfSigned": {}}
    root = one(install, "Certificate", "tessera-extender-ca")["spec"]
    assert root["isCA"] is True and root["issuerRef"]["name"] == "tessera-extender-selfsigned"
    assert one(install, "Issuer", "tessera-extender-ca")["spec"] == {"ca": {"secretName": root["secretName"]}}
    serving = one(install, "Certificate", "tessera-extender")["spec"]
    client = one(install, "Certificate", "tessera-scheduler-client")["spec"]
    assert (
        serving["issuerRef"]
        == client["issuerRef"]
        == {
            "name": "tessera-extender-ca",
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
    )
    assert f"tessera-extender.{NAMESPACE}.svc" in serving["dnsNames"]
    assert "server auth" in serving["usages"] and "client auth" in client["usages"]
    # Each Secret lands where its side mounts it.
    extender = one(install, "Deployment", "tessera-extender")["spec"]["template"]["spec"]
    scheduler = one(install, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": serving["secretName"]}} in extender["volumes"]
    assert {"name": "extender-client", "secret": {"secretName": client["secretName"]}} in scheduler["volumes"]


def test_the_driver_runs_on_every_node_with_the_kubelet_directories(install: list[dict[str, Any]]) -> None:
    daemonset = one(install, "DaemonSet", "tessera-dra-driver")
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["tessera-dra-driver"]
    assert "--backend=nvml" in container["args"]
    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert node_name in container["env"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    # Mounted at the same paths as on the host: the kubelet and CDI read what the driver writes.
    assert host_paths == mounts
    # Its own plugin directory, not the kubelet's whole plugins directory with other drivers' sockets.
    assert set(host_paths.values()) == {
        "/var/lib/kubelet/plugins/gpu.tessera.dev",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/tessera-dra",
    }
    # backend nvml changes GPU compute modes and runs MPS daemons: privileged (docs/install.md).
    assert container["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "privileged": True}


def test_make_up_the_manual_config_and_the_simulator_score_as_the_chart_does(
    install: list[dict[str, Any]],
) -> None:
    """One scheduler profile everywhere: the chart's (rendered here), `make up`'s
    (tessera.cli.SCHEDULER_PROFILE), the hand-wiring example and the simulator's deployed mode."""
    config_map = one(install, "ConfigMap", "tessera-scheduler-config")
    (profile,) = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])["profiles"]
    manual = yaml.safe_load((REPO / "manifests" / "scheduler-config.yaml").read_text())
    assert manual["profiles"] == [profile]
    assert manual["extenders"][0]["weight"] == EXTENDER_WEIGHT
    disabled = {plugin["name"] for plugin in profile["plugins"]["score"]["disabled"]}
    assert disabled == {"NodeResourcesFit", "NodeResourcesBalancedAllocation"}
    assert SHIPPED_PROFILE.extender_weight == EXTENDER_WEIGHT
    assert SHIPPED_PROFILE.least_allocated_weight == SHIPPED_PROFILE.balanced_allocation_weight == 0
