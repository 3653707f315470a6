"""A real Kubernetes control plane as local processes, for tests, benchmarks and the demo.

Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the binaries built by
hack/build-k8s.sh) on free loopback ports, waits for each to be healthy, writes an admin
kubeconfig and tears everything down again, also when the Python process dies: every child is
started with a parent-death signal, and ``stop`` runs at exit and on SIGTERM.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import ctypes
import json
import logging
import math
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import kube_config

from contract.names import NAMESPACE_QUEUE_LABEL
from tessera.dev.pki import CertificateAuthority, KeyPair, write_service_account_key

log = logging.getLogger(__name__)
T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s.sh"
DEFAULT_SCHEDULER = "default-scheduler"
# Controllers a cluster without kubelets needs: claims from templates, namespace deletion,
# owner-reference garbage collection, the workload controllers real workloads run on (Jobs,
# Deployments and their ReplicaSets, StatefulSets - which LeaderWorkerSets are made of - recreate
# what is evicted; finished Jobs go after their ttlSecondsAfterFinished) and
# PodDisruptionBudgets' status (which the Eviction API enforces). Never the node-lifecycle
# controller: fake nodes send no heartbeats, so it would taint them unreachable.
CONTROLLERS = (
    "resourceclaim-controller",
    "namespace-controller",
    "garbage-collector-controller",
    "job-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "ttl-after-finished-controller",
    "disruption-controller",
)
_PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A component failed to start or answer; the message carries the tail of its log."""


# The node labels of `tessera up --nodes` layouts: a block of racks, a rack of nodes (the names
# docs/workloads.md's examples ask for: `topology-required: rack`).
BLOCK_LABEL = "example.com/block"
RACK_LABEL = "example.com/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class NodeLayout:
    """Fake nodes by name with their topology labels, and the extender's `--topology-levels` for
    them ("": a flat layout, the extender's default levels)."""

    nodes: dict[str, dict[str, str]]
    levels: str = ""


def node_layout(text: str) -> NodeLayout:
    """`tessera up --nodes`: a count ("4": 4 nodes, no topology labels), racks x nodes ("4x4"),
    or blocks x racks x nodes ("2x4x4": 32 nodes, racks block0/rack0 .. block1/rack3, rack names
    repeating per block as a domain path allows). Nodes are numbered across the layout
    (gpu-node-0 .. gpu-node-31), rack by rack. Raises ValueError on anything else.

    "2x2x2": gpu-node-0, 1 in block0/rack0; 2, 3 in block0/rack1; 4, 5 in block1/rack0; 6, 7 in
    block1/rack1."""
    parts = text.strip().lower().split("x")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"--nodes {text!r}: want N, RACKSxN or BLOCKSxRACKSxN (positive counts), e.g. 2x4x4")
    sizes = [int(part) for part in parts]
    levels = [("block", BLOCK_LABEL), ("rack", RACK_LABEL)][3 - len(sizes) :]
    nodes: dict[str, dict[str, str]] = {}
    per_node = sizes[-1]
    for index in range(math.prod(sizes)):
        labels, position = {}, index // per_node
        for (name, label), size in reversed(list(zip(levels, sizes[:-1], strict=True))):
            labels[label] = f"{name}{position % size}"
            position //= size
        nodes[f"gpu-node-{index}"] = labels
    if not levels:
        return NodeLayout(nodes)
    flag = ",".join(f"{name}={label}" for name, label in levels)
    return NodeLayout(nodes, f"{flag},host={HOSTNAME_LABEL}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def find_binaries(build: bool = True) -> Path:
    """The directory holding the control-plane binaries, building them first if asked to."""
    override = os.environ.get("TESSERA_K8S_BIN")
    if override:
        return Path(override)
    if not build:
        raise ClusterError("set TESSERA_K8S_BIN or allow building the binaries")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(result.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if the test process is killed, so is the child.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Component:
    """One running control-plane process and the log it writes."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class SchedulerHandle:
    """An extra kube-scheduler process whose one profile is named ``name``."""

    name: str
    component: Component
    config_path: Path
    _cluster: LocalCluster = field(repr=False)

    def stop(self) -> None:
        self.component.stop()
        self._cluster.components = [c for c in self._cluster.components if c is not self.component]


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback ports."""

    def __init__(
        self,
        workdir: Path | None = None,
        bin_dir: Path | None = None,
        feature_gates: Mapping[str, bool] | None = None,
        scheduler_extenders: Sequence[Mapping[str, Any]] = (),
        controller_manager_qps: int = 20,
        controller_manager_burst: int = 30,
    ) -> None:
        self._owns_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="tessera-cluster-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = bin_dir or find_binaries()
        self.feature_gates = dict(feature_gates or {})
        self.scheduler_extenders = list(scheduler_extenders)
        # The controller-manager creates a claim per pod from its template; at its default client
        # rate (20/s) that, not the scheduler, paces large benchmarks.
        self.controller_manager_qps = controller_manager_qps
        self.controller_manager_burst = controller_manager_burst
        self.components: list[Component] = []
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.server = ""
        self._ca_path: Path | None = None
        self.ca: CertificateAuthority | None = None
        self._admin: KeyPair | None = None
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        began = time.monotonic()
        atexit.register(self.stop)
        self._install_sigterm_handler()
        try:
            pki = self._make_pki()
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url, pki)
            self._start_controller_manager()
            self.start_scheduler(DEFAULT_SCHEDULER, self.scheduler_extenders)
        except BaseException:
            self.stop()
            raise
        log.info("local control plane ready in %.1fs at %s", time.monotonic() - began, self.server)
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        if self._owns_workdir and not os.environ.get("TESSERA_KEEP_CLUSTER_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _install_sigterm_handler(self) -> None:
        # Only the main thread may install handlers; a SIGTERM then unwinds like Ctrl-C does.
        with contextlib.suppress(ValueError):
            previous = signal.getsignal(signal.SIGTERM)
            if previous in (signal.SIG_DFL, None):

                def on_sigterm(signum: int, frame: object) -> None:
                    raise KeyboardInterrupt

                signal.signal(signal.SIGTERM, on_sigterm)

    # -- components --------------------------------------------------------------------------

    def spawn(self, name: str, command: Sequence[str], env: Mapping[str, str] | None = None) -> Component:
        """Runs ``command`` as a component of this cluster: logged, and stopped with it."""
        log_path = self.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(exist_ok=True)
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                list(command),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.workdir,
                env={**os.environ, **env} if env else None,
                preexec_fn=_die_with_parent,
            )
        component = Component(name, process, log_path)
        self.components.append(component)
        return component

    def wait_healthy(self, component: Component, url: str, timeout: float = 60.0, tls: bool = True) -> None:
        context = self._ssl_context() if tls else None
        deadline = time.monotonic() + timeout
        last_error = ""
        while time.monotonic() < deadline:
            if component.process.poll() is not None:
                raise ClusterError(
                    f"{component.name} exited with code {component.process.returncode}:\n"
                    f"{component.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError) as error:
                last_error = str(error)
            time.sleep(0.2)
        raise ClusterError(
            f"{component.name} not healthy at {url} after {timeout:.0f}s ({last_error}):\n"
            f"{component.log_tail()}"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        # Health probes of the scheduler and controller-manager hit their self-signed serving
        # certs; the apiserver's is checked against our CA through the kubeconfig elsewhere.
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if self._admin is not None:
            context.load_cert_chain(self._admin.cert_path, self._admin.key_path)
        return context

    def _feature_gate_flag(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _make_pki(self) -> dict[str, Path]:
        pki_dir = self.workdir / "pki"
        ca = CertificateAuthority(pki_dir)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            hosts=("127.0.0.1", "localhost", "10.0.0.1", "kubernetes", "kubernetes.default"),
        )
        self._admin = ca.issue("admin", "tessera-admin", organization="system:masters")
        self._ca_path = ca.cert_path
        self.ca = ca
        sa_private, sa_public = write_service_account_key(pki_dir)
        return {
            "ca": ca.cert_path,
            "serving_cert": serving.cert_path,
            "serving_key": serving.key_path,
            "sa_private": sa_private,
            "sa_public": sa_public,
        }

    def _start_etcd(self) -> str:
        client_port, peer_port = free_port(), free_port()
        url = f"http://127.0.0.1:{client_port}"
        etcd = self.spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self.wait_healthy(etcd, f"{url}/health", tls=False)
        return url

    def _start_apiserver(self, etcd_url: str, pki: dict[str, Path]) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        apiserver = self.spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--tls-cert-file={pki['serving_cert']}",
                f"--tls-private-key-file={pki['serving_key']}",
                f"--client-ca-file={pki['ca']}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={self.server}/",
                f"--service-account-key-file={pki['sa_public']}",
                f"--service-account-signing-key-file={pki['sa_private']}",
                "--allow-privileged=true",
                # No token controller and no node-lifecycle controller run here: without these
                # two, pods would wait for tokens and new nodes would carry a not-ready taint.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--endpoint-reconciler-type=none",
                *self._feature_gate_flag(),
            ],
        )
        self._write_kubeconfig()
        self.wait_healthy(apiserver, f"{self.server}/readyz", timeout=90)

    def _write_kubeconfig(self) -> None:
        assert self._admin is not None and self._ca_path is not None

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tessera-local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64(self._ca_path.read_bytes()),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate-data": b64(self._admin.cert_pem),
                        "client-key-data": b64(self._admin.key_pem),
                    },
                }
            ],
            "contexts": [{"name": "tessera-local", "context": {"cluster": "tessera-local", "user": "admin"}}],
            "current-context": "tessera-local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def _start_controller_manager(self) -> None:
        port = free_port()
        manager = self.spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                f"--controllers={','.join(CONTROLLERS)}",
                f"--kube-api-qps={self.controller_manager_qps}",
                f"--kube-api-burst={self.controller_manager_burst}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                *self._feature_gate_flag(),
            ],
        )
        self.wait_healthy(manager, f"https://127.0.0.1:{port}/healthz")

    def start_scheduler(
        self,
        name: str,
        extenders: Iterable[Mapping[str, Any]] | None = None,
        qps: int = 50,
        burst: int = 100,
        profile: Mapping[str, Any] | None = None,
    ) -> SchedulerHandle:
        """Runs a kube-scheduler whose single profile is ``name`` (with the fields of ``profile``,
        e.g. its plugins); pods pick it by schedulerName."""
        port = free_port()
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": qps, "burst": burst},
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": name, **(profile or {})}],
        }
        extender_list = [dict(extender) for extender in extenders or ()]
        if extender_list:
            config["extenders"] = extender_list
        config_path = self.workdir / f"scheduler-{name}.yaml"
        config_path.write_text(yaml.safe_dump(config))
        component = self.spawn(
            f"kube-scheduler-{name}",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={config_path}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                *self._feature_gate_flag(),
            ],
        )
        self.wait_healthy(component, f"https://127.0.0.1:{port}/healthz")
        return SchedulerHandle(name, component, config_path, self)

    # -- helpers for callers -----------------------------------------------------------------

    def kubectl(
        self, *args: str, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            check=False,
            capture_output=True,
            text=True,
            input=input_text,
        )
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def wait_established(self, *crds: str, timeout_s: float = 60.0) -> None:
        """Waits until each CustomResourceDefinition named (``crd/<name>``) is Established. kubectl
        wait fails at once on a CRD whose status has no conditions yet (a CRD created a moment
        ago: ".status.conditions accessor error"), so it is asked again until ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(1, math.ceil(deadline - time.monotonic()))
            result = self.kubectl(
                "wait", "--for=condition=Established", f"--timeout={left}s", *crds, check=False
            )
            if result.returncode == 0:
                return
            if time.monotonic() >= deadline:
                raise ClusterError(f"CRDs not established in {timeout_s:g}s: {result.stderr.strip()}")
            time.sleep(0.5)

    def apply(self, manifest: Mapping[str, Any] | str | Path) -> str:
        """kubectl apply of a file path or an object; returns kubectl's output."""
        if isinstance(manifest, Path):
            return self.kubectl("apply", "-f", str(manifest)).stdout
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", input_text=text).stdout

    def webhook_certificate(self, name: str) -> KeyPair:
        """A serving certificate for 127.0.0.1 from the cluster's CA (which the API server trusts
        through the caBundle of `webhook_configurations`)."""
        if self.ca is None:
            raise ClusterError("the cluster is not started")
        return self.ca.issue(f"webhook-{name}", name, server=True, hosts=("127.0.0.1",))

    def register_webhooks(self, url: str, name: str = "tessera", **scope: Any) -> list[dict[str, Any]]:
        """Point the admission webhooks at an extender serving them at `url` (https, a certificate
        of `webhook_certificate`); returns the configurations applied (see webhook_configurations)."""
        if self._ca_path is None:
            raise ClusterError("the cluster is not started")
        configurations = webhook_configurations(name, url, self._ca_path.read_bytes(), **scope)
        for configuration in configurations:
            self.apply(configuration)
        return configurations

    def logs(self, lines: int = 40) -> str:
        """The tail of every component's log, for a failing test's report."""
        return "\n".join(
            f"----- {component.name} ({component.log_path}) -----\n{component.log_tail(lines)}"
            for component in self.components
        )


# -- admission webhooks -----------------------------------------------------------------------

# What the chart's webhook configurations say (charts/tessera/templates/_webhooks.tpl), with a url
# instead of a Service; tests/unit/test_chart_rendered.py holds the two to the same rules.
WEBHOOK_RULES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "pods.scheduling.tessera.dev": (
        "MutatingWebhookConfiguration",
        "/mutate-pods",
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        },
    ),
    "queues.scheduling.tessera.dev": (
        "ValidatingWebhookConfiguration",
        "/validate-queues",
        {
            "apiGroups": ["scheduling.tessera.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["queues"],
            "scope": "Cluster",
        },
    ),
    "namespaces.scheduling.tessera.dev": (
        "ValidatingWebhookConfiguration",
        "/validate-namespaces",
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["namespaces"],
            "scope": "Cluster",
        },
    ),
    "resourceclaims.scheduling.tessera.dev": (
        "ValidatingWebhookConfiguration",
        "/validate-resourceclaims",
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["resourceclaims", "resourceclaimtemplates"],
            "scope": "Namespaced",
        },
    ),
}

# The objects a webhook is sent, beyond its rule (the chart's objectSelector, the same here).
WEBHOOK_OBJECT_SELECTORS: dict[str, dict[str, Any]] = {
    "namespaces.scheduling.tessera.dev": {
        "matchExpressions": [{"key": NAMESPACE_QUEUE_LABEL, "operator": "Exists"}]
    },
}


def webhook_configurations(
    name: str,
    url: str,
    ca_pem: bytes,
    namespaces: Sequence[str] | None = None,
    queue_suffix: str | None = None,
    failure_policy: str = "Ignore",
) -> list[dict[str, Any]]:
    """The Mutating- and ValidatingWebhookConfiguration `name` calling the webhooks at `url`.

    Scope (tests share one control plane): `namespaces` limits pods and claims to those
    namespaces (None: all but kube-system), `queue_suffix` Queues (and Namespaces with a
    default-queue label) to names ending in it."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for webhook, (kind, path, rule) in WEBHOOK_RULES.items():
        entry: dict[str, Any] = {
            "name": webhook,
            "clientConfig": {"url": f"{url}{path}", "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [rule],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": failure_policy,
            "timeoutSeconds": 5,
        }
        if rule["scope"] == "Namespaced":
            operator, values = (
                ("In", list(namespaces)) if namespaces is not None else ("NotIn", ["kube-system"])
            )
            entry["namespaceSelector"] = {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": operator, "values": values}
                ]
            }
        elif queue_suffix is not None:
            entry["matchConditions"] = [
                {
                    "name": "this-test",
                    "expression": f"object.metadata.name.endsWith({json.dumps(queue_suffix)})",
                }
            ]
        if webhook in WEBHOOK_OBJECT_SELECTORS:
            entry["objectSelector"] = WEBHOOK_OBJECT_SELECTORS[webhook]
        if kind == "MutatingWebhookConfiguration":
            entry["reinvocationPolicy"] = "Never"
        by_kind.setdefault(kind, []).append(entry)
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": name},
            "webhooks": hooks,
        }
        for kind, hooks in by_kind.items()
    ]


# -- fake nodes -------------------------------------------------------------------------------


async def api_client(kubeconfig: Path) -> ApiClient:
    """A kubernetes-asyncio client for the given kubeconfig; the caller closes it."""
    configuration = Configuration()
    await kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return ApiClient(configuration)


async def create_fake_node(
    api: ApiClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "250",
) -> None:
    """A Node the scheduler accepts: Ready, schedulable, untainted, with allocatable resources.

    There is no kubelet behind it, so the status is written once through the status subresource.
    """
    core = CoreV1Api(api)
    node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "fake"}
    node_labels.update(labels or {})
    # kubernetes-asyncio serialises plain dicts as they are; its model classes lag new fields.
    node: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}}
    await core.create_node(node)
    resources = {"cpu": cpu, "memory": memory, "pods": pods}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status: Any = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "FakeNodeReady",
                    "message": "fake node created by tessera.dev.localcluster",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "bootID": "",
                "containerRuntimeVersion": "",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        }
    }
    await core.patch_node_status(name, status)


async def delete_nodes(api: ApiClient, names: Iterable[str]) -> None:
    core = CoreV1Api(api)
    for name in names:
        try:
            await core.delete_node(name)
        except ApiException as error:
            if error.status != 404:
                raise


async def wait_until(
    condition: Callable[[], Awaitable[T | None]],
    timeout: float = 30.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Polls ``condition`` until it returns something other than None/False, or times out."""
    deadline = time.monotonic() + timeout
    while True:
        result = await condition()
        if result is not None and result is not False:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)
