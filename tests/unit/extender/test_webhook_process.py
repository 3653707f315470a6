"""The webhooks' own process: spawned, served over TLS with the API server's client certificate
required, its metrics relayed to the parent, stopped with the pipe, and a failure to start told.

The child's API client points at a closed port (a kubeconfig written here): its watches retry,
its lookups fail, and the pod webhook answers from what it has (allowed, nothing added).
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp
import pytest

from extender.metrics import ExtenderMetrics, merged_exposition
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.webhook import MUTATE_PODS_PATH, WebhookOptions
from extender.webhook_process import WebhookProcess, WebhookProcessConfig, WebhookTLS
from tessera.dev.localcluster import wait_until
from tessera.dev.pki import CertificateAuthority
from tests import extender_objects as objects

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


def review(pod: dict[str, object]) -> bytes:
    request = {
        "uid": "review-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "ns",
        "operation": "CREATE",
        "object": pod,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


async def test_the_webhooks_run_in_their_own_process_behind_the_api_servers_client_certificate(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority(tmp_path / "pki", name="webhook-test-ca")
    serving = ca.issue("webhook", "tessera-webhook", server=True, hosts=("127.0.0.1",))
    apiserver = ca.issue("apiserver", "kube-apiserver")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    webhooks = WebhookProcess(
        WebhookProcessConfig(
            WebhookOptions(host="127.0.0.1", port=0),
            PictureConfig(),
            str(kubeconfig),
            WebhookTLS(str(serving.cert_path), str(serving.key_path), str(ca.cert_path)),
        )
    )
    port = await webhooks.start()
    try:
        url = f"https://127.0.0.1:{port}{MUTATE_PODS_PATH}"
        anonymous = ssl.create_default_context(cafile=str(ca.cert_path))
        with_certificate = ssl.create_default_context(cafile=str(ca.cert_path))
        with_certificate.load_cert_chain(str(apiserver.cert_path), str(apiserver.key_path))
        body = review(objects.pod("ns", "p", template="one"))
        async with aiohttp.ClientSession() as session:
            # No client certificate: the TLS handshake fails, no review is read.
            with pytest.raises(aiohttp.ClientError):
                async with session.post(url, data=body, ssl=anonymous) as response:
                    await response.read()
            async with session.post(url, data=body, ssl=with_certificate) as response:
                assert response.status == 200
                answer = (await response.json())["response"]
        assert (answer["uid"], answer["allowed"]) == ("review-1", True)
        assert webhooks.problem() == "" and not webhooks.ready()  # its watches cannot list

        # The child's counters reach the parent with its next report, and merge into its /metrics.
        async def relayed() -> bool:
            return b'verb="mutate_pods"' in webhooks.metrics()

        await wait_until(relayed, timeout=30, what="the child's metrics")
        parent = ExtenderMetrics(ClusterPicture()).render()
        merged = merged_exposition(parent, webhooks.metrics()).decode()
        assert 'tessera_extender_request_duration_seconds_count{verb="mutate_pods"} 1.0' in merged
    finally:
        await webhooks.stop()
    assert "exited" in webhooks.problem()  # closing the pipe stopped it


async def test_a_webhook_process_that_cannot_start_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # No kubeconfig and not in a cluster: the child cannot make its API client.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    webhooks = WebhookProcess(WebhookProcessConfig(WebhookOptions(host="127.0.0.1", port=0), PictureConfig()))
    with pytest.raises(RuntimeError, match="the webhook process failed: ConfigException"):
        await webhooks.start()
    assert "failed" in webhooks.problem()
