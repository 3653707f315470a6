"""What hack/kind-up.sh installs, checked against a real apiserver: the chart rendered with
hack/kind/values.yaml is accepted object by object (server-side dry run), runs the driver on the
simulated backend on exactly the labelled workers, and the feature gates of hack/kind/config.yaml
are gates this Kubernetes release knows."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tessera.dev.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "hack" / "kind"
CONFIG = yaml.safe_load((KIND / "config.yaml").read_text())
# The Kubernetes release of the kind node image (kindest/node:<version>@sha256:...).
KIND_KUBERNETES = CONFIG["nodes"][0]["image"].split(":")[1].split("@")[0]


def _rendered(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [
            str(cluster.bin_dir / "helm"),
            "template",
            "tessera",
            str(ROOT / "charts" / "tessera"),
            "--namespace",
            namespace,
            "--include-crds",
            "--kube-version",
            KIND_KUBERNETES,
            "--values",
            str(KIND / "values.yaml"),
            "--set",
            "image.repository=tessera",
            "--set",
            "image.tag=dev",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_chart_as_kind_up_installs_it_is_accepted(local_cluster: LocalCluster, namespace: str) -> None:
    objects = _rendered(local_cluster, namespace)
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in objects if o["kind"] != "CustomResourceDefinition"]
    local_cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input_text=yaml.safe_dump_all(crds)
    )
    local_cluster.wait_established(*(f"crd/{crd['metadata']['name']}" for crd in crds))
    applied = local_cluster.kubectl(
        "apply", "--dry-run=server", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(rest)
    )
    assert applied.stdout.count("serverside-applied (server dry run)") == len(rest), applied.stdout

    (driver,) = [o for o in rest if o["kind"] == "DaemonSet"]
    pod = driver["spec"]["template"]["spec"]
    node_selector = yaml.safe_load((KIND / "values.yaml").read_text())["draDriver"]["nodeSelector"]
    assert pod["nodeSelector"] == node_selector
    (container,) = [
        c for c in pod["containers"] if "--backend=simulated" in c.get("args", c.get("command", []))
    ]
    assert container["image"] == "tessera:dev" and container["imagePullPolicy"] == "Never"


def test_the_kind_feature_gates_are_live_in_this_release(local_cluster: LocalCluster) -> None:
    # A component refuses an unknown gate, and warns about a GA one (to be removed, then refused).
    gates = CONFIG["featureGates"]
    flag = "--feature-gates=" + ",".join(f"{gate}={str(on).lower()}" for gate, on in gates.items())
    for component in ("kube-apiserver", "kube-scheduler", "kube-controller-manager"):
        result = subprocess.run(
            [str(local_cluster.bin_dir / component), flag, "--version"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0 and "GA feature gate" not in result.stderr, (component, result.stderr)
