"""The committed plain install (manifests/install.yaml, rendered from charts/tessera): consistent
with the shared manifests and wired together. Pure YAML; the helm and apiserver checks are in
tests/integration/test_install.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

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
    assert config["profiles"] == [{"schedulerName": "tessera"}]
    assert config["leaderElection"]["resourceName"] == "tessera-scheduler"
    service = one(install, "Service", "tessera-extender")
    port = service["spec"]["ports"][0]["port"]
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://tessera-extender.{NAMESPACE}.svc:{port}"
    assert extender["bindVerb"] == "bind" and extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False

    scheduler = one(install, "Deployment", "tessera-scheduler")["spec"]["template"]["spec"]
    assert scheduler["serviceAccountName"] == "tessera-scheduler"
    (volume,) = (v for v in scheduler["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == "tessera-scheduler-config"


def test_the_extender_service_selects_the_extender_pods(install: list[dict[str, Any]]) -> None:
    service = one(install, "Service", "tessera-extender")
    deployment = one(install, "Deployment", "tessera-extender")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["tessera-extender"]
    # Queue demand from the chart's scheduler only; GPUs of the chart's driver.
    assert {"--scheduler-name=tessera", "--gpu-driver=gpu.tessera.dev"} <= set(container["args"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


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
    assert set(host_paths.values()) == {
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/var/lib/tessera-dra",
    }
