"""The Helm chart and the plain-YAML install, against the real control plane.

helm lint and template with the built helm; every rendered object accepted by the apiserver
(the Queue CRD applied for real first, the rest with a server-side dry run); manifests/install.yaml
equal to a fresh render; and the chart's RBAC applied for real: each ServiceAccount may do what
the code calls and no more; and the components, run with nothing but their ServiceAccount's
token: a stock kube-scheduler with the chart's configuration and the extender schedule and bind a
pod and write Queue status, the DRA driver publishes its node's ResourceSlices.
Each test renders its own release into its own namespace, so cluster-scoped names are unique.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import LocalCluster, create_fake_node, delete_nodes, free_port
from tessera.dev.pki import CertificateAuthority
from tests.extender_objects import open_crd

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tessera"
RENDER_SCRIPT = REPO / "hack" / "render-manifests.sh"
INSTALL_YAML = REPO / "manifests" / "install.yaml"
QUEUE_CRD_NAME = "queues.scheduling.tessera.dev"
# Values that switch on every optional branch of the templates.
NON_DEFAULT_VALUES = (
    "extender.tls.source=cert-manager",
    "extender.networkPolicy.metricsPeers[0].namespaceSelector.matchLabels.team=monitoring",
    "extender.networkPolicy.schedulerPeers[0].ipBlock.cidr=10.0.0.0/24",
    "draDriver.privileged=true",
    "extender.schedulerNames={tessera,other}",
    "draDriver.backend=simulated",
    "draDriver.runtimeClassName=nvidia",
    "draDriver.nodeSelector.nvidia\\.com/gpu\\.present=true",
    "imagePullSecrets[0].name=registry",
    "commonLabels.team=gpu",
    "extender.bind=true",
    "gpuPodPolicy.enabled=true",
    "grafanaDashboard.enabled=true",
    "extender.gangHoldBackAfter=120",
)


def kube_version() -> str:
    for line in (REPO / "hack" / "k8s" / "go.mod").read_text().splitlines():
        fields = line.split()
        if fields[:1] == ["k8s.io/kubernetes"]:
            return fields[1]
    raise AssertionError("hack/k8s/go.mod pins no k8s.io/kubernetes")


def helm(cluster: LocalCluster, *args: str) -> str:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), *args], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def set_flags(values: tuple[str, ...]) -> list[str]:
    return [arg for value in values for arg in ("--set", value)]


def render(cluster: LocalCluster, release: str, namespace: str, *values: str) -> list[dict[str, Any]]:
    text = helm(
        cluster,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        "--kube-version",
        kube_version(),
        *set_flags(values),
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kubectl_ok(cluster: LocalCluster, *args: str, input_text: str | None = None) -> str:
    result = cluster.kubectl(*args, check=False, input_text=input_text)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def install_crds(cluster: LocalCluster, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Applies the rendered CRDs for real (shared by every test: left installed); returns the rest."""
    crds = [obj for obj in objects if obj["kind"] == "CustomResourceDefinition"]
    assert [crd["metadata"]["name"] for crd in crds] == [QUEUE_CRD_NAME]
    kubectl_ok(
        cluster, "apply", "--server-side", "--force-conflicts", "-f", "-", input_text=yaml.safe_dump_all(crds)
    )
    kubectl_ok(cluster, "wait", "--for=condition=Established", f"crd/{QUEUE_CRD_NAME}", "--timeout=30s")
    return [obj for obj in objects if obj["kind"] != "CustomResourceDefinition"]


def names_of(objects: list[dict[str, Any]], kind: str) -> list[str]:
    return [obj["metadata"]["name"] for obj in objects if obj["kind"] == kind]


# cert-manager is not part of the local control plane: CRDs of the same group and kinds with an open
# schema let the server dry run reach the API for the Issuer and Certificate objects. The fields
# the chart sets are checked against cert-manager's documented API in
# tests/unit/test_chart_rendered.py.
CERT_MANAGER_STAND_IN: list[dict[str, Any]] = [
    open_crd("cert-manager.io", kind, plural)
    for plural, kind in (("issuers", "Issuer"), ("certificates", "Certificate"))
]


def install_cert_manager_stand_in(cluster: LocalCluster) -> None:
    kubectl_ok(
        cluster,
        "apply",
        "--server-side",
        "-f",
        "-",
        input_text=yaml.safe_dump_all(CERT_MANAGER_STAND_IN),
    )
    for crd in CERT_MANAGER_STAND_IN:
        kubectl_ok(cluster, "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}")


def test_chart_lints_and_the_plain_install_is_a_fresh_render(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    lint = helm(local_cluster, "lint", "--strict", str(CHART), "--kube-version", kube_version())
    assert "1 chart(s) linted, 0 chart(s) failed" in lint
    helm(
        local_cluster,
        "lint",
        "--strict",
        str(CHART),
        "--kube-version",
        kube_version(),
        *set_flags(NON_DEFAULT_VALUES),
    )

    fresh = subprocess.run(
        ["bash", str(RENDER_SCRIPT), "-"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HELM": str(local_cluster.bin_dir / "helm")},
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout == INSTALL_YAML.read_text(), (
        "manifests/install.yaml is stale: run hack/render-manifests.sh and commit it"
    )

    # The chart installs the very files the tests and the plain install use, through links that
    # a packaged chart replaces with their contents.
    helm(local_cluster, "package", str(CHART), "--destination", str(tmp_path))
    with tarfile.open(tmp_path / "tessera-0.1.0.tgz") as package:
        for linked, shared in (
            ("crds/queues.yaml", "crds/queues.yaml"),
            ("files/deviceclasses.yaml", "deviceclasses.yaml"),
            ("files/default-queue.yaml", "default-queue.yaml"),
        ):
            assert (CHART / linked).samefile(REPO / "manifests" / shared), linked
            packed = package.extractfile(f"tessera/{linked}")
            assert packed is not None and packed.read() == (REPO / "manifests" / shared).read_bytes()


# Only the extender (HTTPS, no client certificates) and the scheduler configuration for your own
# kube-scheduler, which the NetworkPolicy must then name.
CONFIG_ONLY_VALUES = (
    "scheduler.deploy=false",
    "draDriver.enabled=false",
    "deviceClasses.create=false",
    "extender.tls.verifyClients=false",
    "extender.networkPolicy.schedulerPeers[0].ipBlock.cidr=10.0.0.0/24",
)
# Certificates from an Issuer of your own; /metrics only behind the scheduler's mutual TLS.
OWN_ISSUER_VALUES = (
    "extender.tls.source=cert-manager",
    "extender.tls.certManager.issuerRef.name=corp-ca",
    "extender.tls.certManager.issuerRef.kind=ClusterIssuer",
    "extender.metricsPort=0",
)
# Secrets made by hand (docs/install.md), with the API server's webhook client certificate
# required; and the documented insecure opt-out.
OWN_SECRETS_VALUES = ("extender.tls.source=secrets", "extender.webhooks.clientCA.secretName=apiserver-ca")
PLAIN_HTTP_VALUES = (
    "extender.tls.enabled=false",
    "extender.networkPolicy.enabled=false",
    "extender.webhooks.enabled=false",  # the API server calls webhooks over HTTPS only
)
VALUE_SETS = {
    "defaults": (),
    "every-option": NON_DEFAULT_VALUES,
    "config-only-server-tls": CONFIG_ONLY_VALUES,
    "own-issuer-metrics-behind-tls": OWN_ISSUER_VALUES,
    "own-secrets": OWN_SECRETS_VALUES,
    "plain-http": PLAIN_HTTP_VALUES,
}


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_the_apiserver_accepts_every_rendered_object(
    local_cluster: LocalCluster, namespace: str, values: tuple[str, ...]
) -> None:
    release = f"it-{uuid.uuid4().hex[:6]}"
    objects = install_crds(local_cluster, render(local_cluster, release, namespace, *values))
    if any(obj["apiVersion"].startswith("cert-manager.io/") for obj in objects):
        install_cert_manager_stand_in(local_cluster)
    out = kubectl_ok(
        local_cluster, "apply", "--dry-run=server", "-f", "-", input_text=yaml.safe_dump_all(objects)
    )
    applied = [line for line in out.splitlines() if line.endswith("(server dry run)")]
    assert len(applied) == len(objects), out

    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ConfigMap", "Queue"} <= kinds
    if "scheduler.deploy=false" in values:
        assert names_of(objects, "Deployment") == [f"{release}-tessera-extender"]
        assert "DaemonSet" not in kinds and "DeviceClass" not in kinds
    else:
        assert sorted(names_of(objects, "Deployment")) == [
            f"{release}-tessera-extender",
            f"{release}-tessera-scheduler",
        ]
        assert names_of(objects, "DaemonSet") == [f"{release}-tessera-dra-driver"]
        shipped = yaml.safe_load_all((REPO / "manifests" / "deviceclasses.yaml").read_text())
        assert sorted(names_of(objects, "DeviceClass")) == sorted(d["metadata"]["name"] for d in shipped if d)
    binds = [
        rule
        for o in objects
        if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-tessera-extender")
        for rule in o["rules"]
        if "pods/binding" in rule["resources"]
    ]
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "scheduler" in o["metadata"]["name"])
    (entry,) = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])["extenders"]
    # The extender binds, and may bind, only with extender.bind.
    assert ("bindVerb" in entry) == bool(binds) == ("extender.bind=true" in values)
    if values == NON_DEFAULT_VALUES:
        assert_tls_wired(objects, release, namespace)
    if values == CONFIG_ONLY_VALUES:
        # Server-side TLS only: the scheduler needs just the CA; the probes use the metrics port.
        (extender,) = (o for o in objects if o["kind"] == "Deployment")
        probe = extender["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
        assert probe["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert set(entry["tlsConfig"]) == {"serverName", "caFile"}
        (policy,) = (o for o in objects if o["kind"] == "NetworkPolicy")
        assert policy["spec"]["ingress"][0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    if values == OWN_ISSUER_VALUES:
        issued = [o for o in objects if o["kind"] == "Certificate"]
        assert {o["spec"]["issuerRef"]["name"] for o in issued} == {"corp-ca"}
        assert not [o for o in objects if o["kind"] == "Issuer"]
        (extender,) = (
            o for o in objects if o["kind"] == "Deployment" and "extender" in o["metadata"]["name"]
        )
        container = extender["spec"]["template"]["spec"]["containers"][0]
        assert "tcpSocket" in container["readinessProbe"]
        assert not any(arg.startswith("--metrics-port") for arg in container["args"])
    if values == OWN_SECRETS_VALUES:
        # The webhook port requires a client certificate signed by the CA in that Secret.
        (extender,) = (
            o for o in objects if o["kind"] == "Deployment" and "extender" in o["metadata"]["name"]
        )
        pod_spec = extender["spec"]["template"]["spec"]
        (container,) = pod_spec["containers"]
        assert "--webhook-client-ca-file=/etc/tessera/webhook-client-ca/ca.crt" in container["args"]
        assert {
            "name": "webhook-client-ca",
            "mountPath": "/etc/tessera/webhook-client-ca",
            "readOnly": True,
        } in (container["volumeMounts"])
        assert {"name": "webhook-client-ca", "secret": {"secretName": "apiserver-ca"}} in pod_spec["volumes"]
    if values == PLAIN_HTTP_VALUES:
        assert not {"Secret", "NetworkPolicy", "Certificate"} & kinds
    else:
        assert "NetworkPolicy" in kinds


def test_a_chart_that_would_lock_out_your_own_scheduler_does_not_render(local_cluster: LocalCluster) -> None:
    """scheduler.deploy=false with the NetworkPolicy on must name who runs the scheduler."""
    result = subprocess.run(
        [
            str(local_cluster.bin_dir / "helm"),
            "template",
            "x",
            str(CHART),
            "--kube-version",
            kube_version(),
            "--set",
            "scheduler.deploy=false",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "extender.networkPolicy.schedulerPeers must admit your own kube-scheduler" in result.stderr


def mounted_secrets(pod: dict[str, Any]) -> dict[str, str]:
    """Secret name -> where the pod's container mounts it."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    (container,) = pod["containers"]
    return {secrets[m["name"]]: m["mountPath"] for m in container["volumeMounts"] if m["name"] in secrets}


def assert_tls_wired(objects: list[dict[str, Any]], release: str, namespace: str) -> None:
    """Both ends of the extender link read their certificates where the chart mounts them."""

    def pod(name: str) -> dict[str, Any]:
        deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name)
        return dict(deployment["spec"]["template"]["spec"])

    extender = pod(f"{release}-tessera-extender")
    serving = mounted_secrets(extender)["tessera-extender-tls"]
    args = extender["containers"][0]["args"]
    for flag, key in (
        ("--tls-cert-file", "tls.crt"),
        ("--tls-key-file", "tls.key"),
        ("--tls-client-ca-file", "ca.crt"),
    ):
        assert f"{flag}={serving}/{key}" in args
    # Kubelet probes carry no client certificate: they use the plain-HTTP metrics port.
    assert "--metrics-port=9090" in args
    assert extender["containers"][0]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}

    client = mounted_secrets(pod(f"{release}-tessera-scheduler"))["tessera-scheduler-client"]
    config_map = next(o for o in objects if o["kind"] == "ConfigMap" and "scheduler" in o["metadata"]["name"])
    (link,) = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])["extenders"]
    host = f"{release}-tessera-extender.{namespace}.svc"
    assert link["urlPrefix"] == f"https://{host}:8888" and link["enableHTTPS"] is True
    assert link["tlsConfig"] == {
        "serverName": host,
        "caFile": f"{client}/ca.crt",
        "certFile": f"{client}/tls.crt",
        "keyFile": f"{client}/tls.key",
    }


# ---- RBAC ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    verb: str
    resource: str  # resource[.group], as kubectl auth can-i takes it
    subresource: str = ""
    namespaced: bool = False

    def args(self, namespace: str) -> list[str]:
        args = [self.verb, self.resource]
        if self.subresource:
            args.append(f"--subresource={self.subresource}")
        return [*args, f"--namespace={namespace}"] if self.namespaced else args

    def __str__(self) -> str:
        target = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {target}{' (namespaced)' if self.namespaced else ''}"


def access(spec: str) -> Access:
    """'patch pods/status ns' -> Access('patch', 'pods', 'status', namespaced=True)."""
    verb, target, *scope = spec.split()
    resource, _, subresource = target.partition("/")
    return Access(verb, resource, subresource, namespaced=scope == ["ns"])


def access_list(*specs: str) -> list[Access]:
    return [access(spec) for spec in specs]


RESOURCE = "resource.k8s.io"
QUEUES = "queues.scheduling.tessera.dev"
NEVER = access_list(  # what no Tessera component has any business doing
    "delete nodes",
    "get secrets ns",
    "list secrets",
    "create pods ns",
    "update clusterroles.rbac.authorization.k8s.io",
    "create serviceaccounts/token ns",
    f"delete {QUEUES}",
    "escalate clusterroles.rbac.authorization.k8s.io",
)
NEEDS = {
    # extender/picture/watcher.py watches, binder.py, status.py
    "extender": access_list(
        "list nodes",
        "watch nodes",
        "list pods",
        "watch pods",
        "get pods ns",
        "patch pods/status ns",
        "create events ns",
        f"list resourceslices.{RESOURCE}",
        f"watch resourceslices.{RESOURCE}",
        f"list resourceclaims.{RESOURCE}",
        f"watch resourceclaims.{RESOURCE}",
        f"get resourceclaims.{RESOURCE} ns",
        f"list resourceclaimtemplates.{RESOURCE}",
        f"watch resourceclaimtemplates.{RESOURCE}",
        f"list deviceclasses.{RESOURCE}",
        f"watch deviceclasses.{RESOURCE}",
        f"list {QUEUES}",
        f"watch {QUEUES}",
        f"patch {QUEUES}/status",
        # the Namespace default queue (picture) and the pod webhook's owner walk
        "list namespaces",
        "watch namespaces",
        "get namespaces",
        "get replicasets.apps ns",
        "get deployments.apps ns",
        "get jobs.batch ns",
        "get cronjobs.batch ns",
        "get statefulsets.apps ns",
        # the gate controller lifts the admission gate (a ValidatingAdmissionPolicy allows
        # nothing else)
        "patch pods ns",
        "list jobs.batch",
        "watch jobs.batch",
    ),
    # dra_driver/slices.py and prepare.py
    "dra-driver": access_list(
        f"list resourceslices.{RESOURCE}",
        f"create resourceslices.{RESOURCE}",
        f"update resourceslices.{RESOURCE}",
        f"delete resourceslices.{RESOURCE}",
        f"get resourceclaims.{RESOURCE} ns",
        "get nodes",
    ),
    # a stock kube-scheduler with DRA, under its own leader-election lease
    "scheduler": access_list(
        "create pods/binding ns",
        "patch pods/status ns",
        "list nodes",
        "watch pods",
        f"list resourceslices.{RESOURCE}",
        f"list deviceclasses.{RESOURCE}",
        f"update resourceclaims.{RESOURCE}/status ns",
        "create leases.coordination.k8s.io ns",
    ),
}
DENIED = {
    "extender": access_list(
        "create pods/binding ns",  # kube-scheduler binds, unless extender.bind (BINDING_VALUES)
        "delete pods ns",
        "update pods ns",
        "update pods/status ns",
        "list replicasets.apps",
        "update namespaces",
        f"update {QUEUES}",
        f"create {QUEUES}",
        f"update {QUEUES}/status",
        f"create resourceslices.{RESOURCE}",
        f"update resourceclaims.{RESOURCE}/status ns",
    ),
    "dra-driver": access_list(
        "delete pods ns",
        "list nodes",
        "update nodes",
        "list pods",
        f"list resourceclaims.{RESOURCE}",
        f"update resourceclaims.{RESOURCE}/status ns",
        "create pods/binding ns",
    ),
    "scheduler": access_list(f"patch {QUEUES}/status", f"create resourceslices.{RESOURCE}"),
}


# The DeviceClasses and the default Queue have fixed names that other tests use too; the server
# dry run above covers them.
INSTALL_VALUES = ("deviceClasses.create=false", "defaultQueue.create=false")
# The extender as kube-scheduler's binder: the verb in the scheduler's configuration, and the
# extender's permission to bind.
BINDING_VALUES = ("extender.bind=true",)


class Release:
    """The chart installed for real by helm into a test namespace, under a unique release name.

    There is no kubelet (and no Deployment controller), so its pods never start: the tests run the
    components themselves with the ServiceAccounts' tokens."""

    def __init__(self, cluster: LocalCluster, namespace: str, *values: str) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = f"it-{uuid.uuid4().hex[:6]}"
        self.scheduler_name = f"tessera-{self.name}"
        self.values = (*INSTALL_VALUES, *values, f"scheduler.schedulerName={self.scheduler_name}")

    def helm(self, *args: str) -> str:
        return helm(
            self.cluster, *args, "--namespace", self.namespace, "--kubeconfig", str(self.cluster.kubeconfig)
        )

    def install(self) -> None:
        self.helm("install", self.name, str(CHART), *set_flags(self.values))

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "--wait")

    def manifest(self) -> list[dict[str, Any]]:
        """The objects helm recorded for the release."""
        return [doc for doc in yaml.safe_load_all(self.helm("get", "manifest", self.name)) if doc]

    def service_account(self, component: str) -> str:
        return f"{self.name}-tessera-{component}"

    def user(self, component: str) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account(component)}"

    def can(self, component: str, wanted: Access) -> bool:
        result = self.cluster.kubectl(
            "auth", "can-i", *wanted.args(self.namespace), f"--as={self.user(component)}", check=False
        )
        assert result.returncode in (0, 1), result.stderr
        return result.returncode == 0

    def token_kubeconfig(self, component: str, path: Path, pod: str = "") -> Path:
        """A kubeconfig that authenticates as the component's ServiceAccount, nothing more.

        A token bound to a pod also names the pod's node, as the kubelet's tokens do."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
        token = kubectl_ok(
            self.cluster,
            "create",
            "token",
            self.service_account(component),
            f"--namespace={self.namespace}",
            "--duration=15m",
            *bound,
        ).strip()
        admin = yaml.safe_load(self.cluster.kubeconfig.read_text())
        admin["users"] = [{"name": component, "user": {"token": token}}]
        admin["contexts"][0]["context"]["user"] = component
        path.write_text(yaml.safe_dump(admin))
        return path


@contextlib.contextmanager
def installed(cluster: LocalCluster, namespace: str, *values: str) -> Iterator[Release]:
    release = Release(cluster, namespace, *values)
    release.install()
    try:
        yield release
    finally:
        release.uninstall()


@pytest.fixture
def release(local_cluster: LocalCluster, namespace: str) -> Iterator[Release]:
    with installed(local_cluster, namespace) as release:
        yield release


@pytest.fixture
def binding_release(local_cluster: LocalCluster, namespace: str) -> Iterator[Release]:
    """The chart with the extender as kube-scheduler's binder (BINDING_VALUES)."""
    with installed(local_cluster, namespace, *BINDING_VALUES) as release:
        yield release


def test_helm_installs_and_uninstalls_the_release(local_cluster: LocalCluster, namespace: str) -> None:
    release = Release(local_cluster, namespace)
    release.install()
    status = yaml.safe_load(release.helm("status", release.name, "--output", "json"))
    assert status["info"]["status"] == "deployed"
    recorded = release.manifest()
    expected = [
        o
        for o in render(local_cluster, release.name, namespace, *release.values)
        if o["kind"] != "CustomResourceDefinition"
    ]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in recorded) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in expected
    )
    kubectl_ok(local_cluster, "get", f"crd/{QUEUE_CRD_NAME}")  # from the chart's crds/ (or already there)
    cluster_scoped = [
        f"{o['kind'].lower()}/{o['metadata']['name']}"
        for o in recorded
        if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
    ]
    # Extender and driver: a role and its binding each; the scheduler: bindings to the built-in roles.
    assert len(cluster_scoped) == 6
    kubectl_ok(local_cluster, "get", *cluster_scoped)

    release.uninstall()
    leftover = local_cluster.kubectl("get", *cluster_scoped, "--ignore-not-found", "-o", "name")
    assert leftover.stdout.strip() == ""


def test_each_service_account_may_do_what_its_code_calls_and_no_more(release: Release) -> None:
    checks = [(component, wanted, True) for component, needed in NEEDS.items() for wanted in needed]
    checks += [(component, wanted, False) for component, denied in DENIED.items() for wanted in denied]
    checks += [(component, wanted, False) for component in NEEDS for wanted in NEVER]
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(lambda check: release.can(check[0], check[1]), checks))
    wrong = [
        f"{component} {'cannot' if expected else 'can'} {wanted}"
        for (component, wanted, expected), answer in zip(checks, answers, strict=True)
        if answer != expected
    ]
    assert not wrong, "\n".join(wrong)


def test_the_extender_may_only_lift_its_gate_off_a_pod(release: Release) -> None:
    """patch pods is granted for the gate controller; the chart's admission policy holds it to
    removing scheduling.tessera.dev/admission."""
    cluster, namespace = release.cluster, release.namespace
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated", "namespace": namespace},
        "spec": {
            "schedulerName": "nobody",
            "schedulingGates": [{"name": "other"}, {"name": "scheduling.tessera.dev/admission"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    kubectl_ok(cluster, "apply", "-f", "-", input_text=json.dumps(pod))
    as_extender = [f"--as={release.user('extender')}", f"--namespace={namespace}"]
    # The policy becomes active once the API server has loaded it: until then a label may pass.
    deadline = time.monotonic() + 30
    attempt = 0
    while True:
        attempt += 1
        result = cluster.kubectl(
            "label", "pod", "gated", f"try={attempt}", "--overwrite", *as_extender, check=False
        )
        if result.returncode != 0:
            break
        assert time.monotonic() < deadline, "the extender could still label pods after 30 s"
        time.sleep(0.5)
    assert (
        "the extender may only remove the scheduling gate scheduling.tessera.dev/admission" in result.stderr
    )
    # Another gate is not its to lift; its own is.
    other = json.dumps([{"op": "remove", "path": "/spec/schedulingGates/0"}])
    result = cluster.kubectl("patch", "pod", "gated", "--type=json", "-p", other, *as_extender, check=False)
    assert result.returncode != 0 and "may only remove" in result.stderr
    own = json.dumps([{"op": "remove", "path": "/spec/schedulingGates/1"}])
    kubectl_ok(cluster, "patch", "pod", "gated", "--type=json", "-p", own, *as_extender)
    gates = kubectl_ok(
        cluster, "get", "pod", "gated", f"--namespace={namespace}", "-o", "jsonpath={.spec.schedulingGates}"
    )
    assert json.loads(gates) == [{"name": "other"}]


# ---- the components under their own ServiceAccounts ---------------------------------------------


def wait_for(
    condition: Callable[[], bool],
    what: str,
    process: subprocess.Popen[bytes],
    log: Path,
    timeout: float = 30.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"{what}: process exited {process.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def secret_files(cluster: LocalCluster, namespace: str, name: str, directory: Path) -> Path:
    """The Secret's keys as files in ``directory``, as the kubelet mounts them."""
    secret = yaml.safe_load(
        kubectl_ok(cluster, "get", "secret", name, f"--namespace={namespace}", "-o", "json")
    )
    directory.mkdir()
    for key, value in secret["data"].items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


def tls_client(ca: Path, cert_dir: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.check_hostname = False  # the tests reach the extender at 127.0.0.1
    if cert_dir is not None:
        context.load_cert_chain(str(cert_dir / "tls.crt"), str(cert_dir / "tls.key"))
    return context


def call_bind(url: str, context: ssl.SSLContext, body: dict[str, str]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{url}/bind", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        assert response.status == 200
        return dict(json.loads(response.read()))


async def test_the_scheduler_and_extender_bind_a_pod_with_only_their_service_accounts(
    binding_release: Release, k8s: ApiClient, tmp_path: Path
) -> None:
    """With extender.bind and the chart's own certificates: mutual TLS between the two, metrics and
    health on the plain-HTTP port, and bind refusing what it must not do, on the real control
    plane."""
    release = binding_release
    cluster, namespace = release.cluster, release.namespace
    extender_port, metrics_port, scheduler_port = free_port(), free_port(), free_port()
    extender_log, scheduler_log = tmp_path / "extender.log", tmp_path / "scheduler.log"
    extender_kubeconfig = release.token_kubeconfig("extender", tmp_path / "extender.kubeconfig")
    # The certificates helm generated at install (extender.tls.source=helm, the default).
    serving = secret_files(cluster, namespace, "tessera-extender-tls", tmp_path / "extender-tls")
    client = secret_files(cluster, namespace, "tessera-scheduler-client", tmp_path / "scheduler-client")
    extender = start(
        [
            sys.executable,
            "-m",
            "extender",
            f"--kubeconfig={extender_kubeconfig}",
            "--listen-address=127.0.0.1",
            f"--port={extender_port}",
            f"--metrics-port={metrics_port}",
            f"--tls-cert-file={serving / 'tls.crt'}",
            f"--tls-key-file={serving / 'tls.key'}",
            f"--tls-client-ca-file={serving / 'ca.crt'}",
        ],
        extender_log,
    )
    # The chart's own scheduler configuration; only the API access and the extender's address
    # differ outside the cluster.
    config_map = yaml.safe_load(
        kubectl_ok(
            cluster,
            "get",
            "configmap",
            f"--namespace={namespace}",
            f"{release.name}-tessera-scheduler-config",
            "-o",
            "json",
        )
    )
    config = yaml.safe_load(config_map["data"]["scheduler-config.yaml"])
    kubeconfig = release.token_kubeconfig("scheduler", tmp_path / "scheduler.kubeconfig")
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    (link,) = config["extenders"]
    host = f"{release.name}-tessera-extender.{namespace}.svc"
    assert link["urlPrefix"] == f"https://{host}:8888" and link["enableHTTPS"] is True
    link["urlPrefix"] = f"https://127.0.0.1:{extender_port}"
    # The serving certificate names the Service, which the configuration checks (serverName).
    assert link["tlsConfig"]["serverName"] == host
    for key, file in (("caFile", "ca.crt"), ("certFile", "tls.crt"), ("keyFile", "tls.key")):
        assert link["tlsConfig"][key] == f"/etc/tessera/extender-client/{file}"
        link["tlsConfig"][key] = str(client / file)
    (tmp_path / "scheduler.yaml").write_text(yaml.safe_dump(config))
    scheduler = start(
        [
            str(cluster.bin_dir / "kube-scheduler"),
            f"--config={tmp_path / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--secure-port={scheduler_port}",
            "--bind-address=127.0.0.1",
        ],
        scheduler_log,
    )
    node, queue = f"{release.name}-node", f"{release.name}-queue"
    try:
        # Ready only once every watch (nodes ... queues) has listed: the list/watch RBAC works.
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{metrics_port}/readyz"),
            "extender ready",
            extender,
            extender_log,
        )
        assert http_ok(f"http://127.0.0.1:{metrics_port}/metrics")

        def holds_lease() -> bool:
            lease = cluster.kubectl(
                "get",
                "lease",
                f"{release.name}-tessera-scheduler",
                f"--namespace={namespace}",
                "-o",
                "jsonpath={.spec.holderIdentity}",
                check=False,
            )
            return lease.returncode == 0 and bool(lease.stdout.strip())

        # Informers synced and the lease taken: the scheduler's RBAC and its own lease Role work.
        wait_for(holds_lease, "scheduler leader lease", scheduler, scheduler_log)

        await create_fake_node(k8s, node)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "hello", "namespace": namespace},
            "spec": {
                "schedulerName": release.scheduler_name,
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        kubectl_ok(cluster, "apply", "-f", "-", input_text=yaml.safe_dump(pod))

        def bound() -> bool:
            return (
                kubectl_ok(
                    cluster,
                    "get",
                    "pod",
                    "hello",
                    f"--namespace={namespace}",
                    "-o",
                    "jsonpath={.spec.nodeName}",
                ).strip()
                == node
            )

        # The extender is the binder (bindVerb): the Binding was created with its token, over the
        # chart's mutual TLS.
        wait_for(bound, "pod bound by the extender", extender, extender_log)
        assert f"bound {namespace}/hello to {node}" in extender_log.read_text()

        url = f"https://127.0.0.1:{extender_port}"
        # Without the scheduler's certificate, or with one of another CA: no connection at all.
        stranger = CertificateAuthority(tmp_path / "stranger-ca", name="stranger")
        stranger_cert = stranger.issue("client", "kube-scheduler")
        stranger_dir = tmp_path / "stranger-client"
        stranger_dir.mkdir()
        (stranger_dir / "tls.crt").write_bytes(stranger_cert.cert_pem)
        (stranger_dir / "tls.key").write_bytes(stranger_cert.key_pem)
        hello_uid = kubectl_ok(
            cluster, "get", "pod", "hello", f"--namespace={namespace}", "-o", "jsonpath={.metadata.uid}"
        )
        rebind = {"PodName": "hello", "PodNamespace": namespace, "PodUID": hello_uid, "Node": "elsewhere"}
        for credentials in (None, stranger_dir):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                call_bind(url, tls_client(client / "ca.crt", credentials), rebind)
        scheduler_tls = tls_client(client / "ca.crt", client)
        # With it: bind still refuses a pod already bound, and a node that does not exist.
        assert "already bound to node" in call_bind(url, scheduler_tls, rebind)["Error"]
        stray = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stray", "namespace": namespace},
            # No scheduler serves it: it stays pending unless someone binds it.
            "spec": {"schedulerName": "nobody", "containers": [{"name": "main", "image": "pause"}]},
        }
        kubectl_ok(cluster, "apply", "-f", "-", input_text=yaml.safe_dump(stray))
        stray_uid = kubectl_ok(
            cluster, "get", "pod", "stray", f"--namespace={namespace}", "-o", "jsonpath={.metadata.uid}"
        )
        answer = call_bind(
            url,
            scheduler_tls,
            {"PodName": "stray", "PodNamespace": namespace, "PodUID": stray_uid, "Node": "no-such-node"},
        )
        assert answer["Error"] == "node no-such-node does not exist"
        answer = call_bind(
            url,
            scheduler_tls,
            {"PodName": "stray", "PodNamespace": namespace, "PodUID": "not-its-uid", "Node": node},
        )
        assert "it was replaced" in answer["Error"]
        stray_node = kubectl_ok(
            cluster, "get", "pod", "stray", f"--namespace={namespace}", "-o", "jsonpath={.spec.nodeName}"
        )
        assert stray_node == ""

        kubectl_ok(
            cluster,
            "apply",
            "-f",
            "-",
            input_text=yaml.safe_dump(
                {
                    "apiVersion": "scheduling.tessera.dev/v1alpha1",
                    "kind": "Queue",
                    "metadata": {"name": queue},
                }
            ),
        )

        def queue_status_written() -> bool:
            written = kubectl_ok(cluster, "get", QUEUES, queue, "-o", "jsonpath={.status.conditions}")
            return bool(written.strip())

        wait_for(queue_status_written, "Queue status patched by the extender", extender, extender_log)
    finally:
        stop(scheduler)
        stop(extender)
        await delete_nodes(k8s, [node])
        cluster.kubectl("delete", QUEUES, queue, "--ignore-not-found", check=False)
    for log in (extender_log, scheduler_log):
        assert "forbidden" not in log.read_text().lower(), log.read_text()[-3000:]


def kubectl_as(
    cluster: LocalCluster, kubeconfig: Path, *args: str, input_text: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        input=input_text,
        check=False,
    )


def driver_pod(namespace: str, name: str, node: str, service_account: str) -> dict[str, Any]:
    """A pod on ``node`` as the DaemonSet makes them (no kubelet runs it: it only anchors a token)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "containers": [{"name": "driver", "image": "tessera:0.1.0"}],
        },
    }


def probe_slice(node: str, driver: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": f"{RESOURCE}/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-probe"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
    )


async def test_the_dra_driver_publishes_its_node_with_only_its_service_account(
    release: Release, k8s: ApiClient, tmp_path: Path
) -> None:
    cluster, namespace = release.cluster, release.namespace
    node, other_node = f"{release.name}-gpu-node", f"{release.name}-other-node"
    driver_name = "gpu.tessera.dev"  # the chart's; the slices are told apart by their node
    http_port = free_port()
    log = tmp_path / "driver.log"
    await create_fake_node(k8s, node)
    kubectl_ok(
        cluster,
        "apply",
        "-f",
        "-",
        input_text=yaml.safe_dump(
            driver_pod(namespace, "driver", node, release.service_account("dra-driver"))
        ),
    )
    kubeconfig = release.token_kubeconfig("dra-driver", tmp_path / "driver.kubeconfig", pod="driver")
    unbound = release.token_kubeconfig("dra-driver", tmp_path / "unbound.kubeconfig")
    host_dirs = [f"--{name}-dir={tmp_path / name}" for name in ("plugin", "registry", "cdi", "checkpoint")]
    driver = start(
        [
            sys.executable,
            "-m",
            "dra_driver",
            f"--node-name={node}",
            f"--driver-name={driver_name}",
            "--backend=simulated",
            "--profile=t4x2",
            f"--kubeconfig={kubeconfig}",
            *host_dirs,
            f"--http-port={http_port}",
        ],
        log,
    )

    def slices() -> list[dict[str, Any]]:
        listed = kubectl_ok(
            cluster,
            "get",
            f"resourceslices.{RESOURCE}",
            "-o",
            "json",
            f"--field-selector=spec.nodeName={node},spec.driver={driver_name}",
        )
        return list(yaml.safe_load(listed)["items"])

    try:
        # Healthy once the slices are published and the plugin sockets serve.
        wait_for(lambda: http_ok(f"http://127.0.0.1:{http_port}/healthz"), "driver healthy", driver, log)
        published = slices()
        assert sum(len(s["spec"]["devices"]) for s in published) == 2
        # The Node was readable: the slices are owned by it (garbage-collected with it).
        assert all(s["metadata"]["ownerReferences"][0]["name"] == node for s in published)

        # The admission policy: another node's slices, another driver's, or a token that names no
        # node are refused, though RBAC alone would allow them.
        for credentials, slice_node, slice_driver in (
            (kubeconfig, other_node, driver_name),
            (kubeconfig, node, "other.example.com"),
            (unbound, node, driver_name),
        ):
            refused = kubectl_as(
                cluster,
                credentials,
                "create",
                "--dry-run=server",
                "-f",
                "-",
                input_text=probe_slice(slice_node, slice_driver),
            )
            assert refused.returncode != 0, (slice_node, slice_driver)
            assert f"ValidatingAdmissionPolicy '{release.service_account('dra-driver')}-own-node-slices'" in (
                refused.stderr
            ), refused.stderr
        allowed = kubectl_as(
            cluster,
            kubeconfig,
            "create",
            "--dry-run=server",
            "-f",
            "-",
            input_text=probe_slice(node, driver_name),
        )
        assert allowed.returncode == 0, allowed.stderr
    finally:
        stop(driver)
        cluster.kubectl(
            "delete", "pod", "driver", f"--namespace={namespace}", "--grace-period=0", "--force", check=False
        )
        cluster.kubectl(
            "delete", f"resourceslices.{RESOURCE}", f"--field-selector=spec.nodeName={node}", check=False
        )
        await delete_nodes(k8s, [node])
    assert "forbidden" not in log.read_text().lower(), log.read_text()[-3000:]
