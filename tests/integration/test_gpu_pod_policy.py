"""The chart's gpuPodPolicy on the real API server: rendered only when enabled, accepted, and
refusing GPU pods of other schedulers in the Namespaces it selects - nothing else."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import yaml

from contract.names import CLASSIC_GPU_RESOURCE, NAMESPACE_SCHEDULER_LABEL
from tessera.dev.localcluster import LocalCluster
from tests.integration.test_install import kubectl_ok, render


def pod(name: str, scheduler: str, gpu: bool = False, claim: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if gpu:
        container["resources"] = {"limits": {CLASSIC_GPU_RESOURCE: "1"}}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(cluster: LocalCluster, namespace: str, obj: dict[str, Any]) -> str:
    """Create the pod as a server dry run (admission runs, nothing is stored): '' or the refusal."""
    result = cluster.kubectl(
        "create",
        "--dry-run=server",
        f"--namespace={namespace}",
        "-f",
        "-",
        check=False,
        input_text=json.dumps(obj),
    )
    return "" if result.returncode == 0 else result.stderr


def test_the_gpu_pod_policy_is_off_by_default_and_refuses_gpu_pods_of_other_schedulers(
    local_cluster: LocalCluster, namespace: str
) -> None:
    release = f"vap-{uuid.uuid4().hex[:6]}"
    default = render(local_cluster, release, "tessera-system")
    assert not [o for o in default if o["metadata"]["name"] == f"{release}-tessera-gpu-pods"]
    rendered = [
        o
        for o in render(local_cluster, release, "tessera-system", "gpuPodPolicy.enabled=true")
        if o["metadata"]["name"] == f"{release}-tessera-gpu-pods"
    ]
    assert sorted(o["kind"] for o in rendered) == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    (binding,) = (o for o in rendered if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {NAMESPACE_SCHEDULER_LABEL: "true"}
    }
    elsewhere = f"{namespace}-off"
    kubectl_ok(local_cluster, "create", "namespace", elsewhere)
    try:
        kubectl_ok(local_cluster, "apply", "-f", "-", input_text=yaml.safe_dump_all(rendered))
        kubectl_ok(local_cluster, "label", "namespace", namespace, f"{NAMESPACE_SCHEDULER_LABEL}=true")
        # The policy is enforced once the API server has loaded it (a second or so).
        deadline = time.monotonic() + 30
        while not (
            refusal := create(local_cluster, namespace, pod("classic", "default-scheduler", gpu=True))
        ):
            assert time.monotonic() < deadline, "a default-scheduler GPU pod was still admitted after 30 s"
            time.sleep(0.5)
        assert (
            f"GPU pods in namespace {namespace} must use Tessera's scheduler (schedulerName tessera): "
            "this pod asks nvidia.com/gpu with schedulerName default-scheduler, which would bypass its queue"
        ) in refusal, refusal
        claim_refusal = create(local_cluster, namespace, pod("claim", "default-scheduler", claim=True))
        assert "this pod asks a ResourceClaim with schedulerName default-scheduler" in claim_refusal
        # Tessera's pods, pods without GPUs, and any pod where the selector does not reach pass.
        assert create(local_cluster, namespace, pod("ours", "tessera", gpu=True, claim=True)) == ""
        assert create(local_cluster, namespace, pod("cpu-only", "default-scheduler")) == ""
        assert create(local_cluster, elsewhere, pod("classic", "default-scheduler", gpu=True)) == ""
    finally:
        kubectl_ok(
            local_cluster, "delete", "--ignore-not-found", "-f", "-", input_text=yaml.safe_dump_all(rendered)
        )
        kubectl_ok(local_cluster, "delete", "namespace", elsewhere, "--wait=false")
