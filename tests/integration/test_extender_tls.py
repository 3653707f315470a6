"""`tessera-extender` as its own process: HTTPS with client certificates, the NodeList mode, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import LocalCluster, free_port, wait_until
from tessera.dev.pki import CertificateAuthority
from tests.integration.extender_harness import gpu_cluster
from tests.integration.test_extender_fairness import converge, waiting_condition

pytestmark = pytest.mark.integration


def client_context(ca: CertificateAuthority, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    return context


async def test_scheduler_talks_to_the_extender_process_over_mutual_tls(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str, tmp_path: Path
) -> None:
    ca = CertificateAuthority(tmp_path / "pki", name="tessera-extender-test-ca")
    serving = ca.issue("extender", "tessera-extender", server=True, hosts=("127.0.0.1",))
    scheduler_client = ca.issue("scheduler", "kube-scheduler")
    port = free_port()
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, in_process=False) as env:
        log_path = tmp_path / "extender.log"
        with log_path.open("w") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "extender",
                f"--kubeconfig={local_cluster.kubeconfig}",
                "--listen-address=127.0.0.1",
                f"--port={port}",
                f"--gpu-driver={env.driver}",
                f"--scheduler-name={env.scheduler_name}",
                f"--tls-cert-file={serving.cert_path}",
                f"--tls-key-file={serving.key_path}",
                f"--tls-client-ca-file={ca.cert_path}",
                "--queue-status-interval=0.5",
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        try:
            url = f"https://127.0.0.1:{port}"
            trusted = client_context(ca, scheduler_client.cert_path, scheduler_client.key_path)
            async with aiohttp.ClientSession() as session:

                async def ready() -> bool:
                    try:
                        async with session.get(f"{url}/readyz", ssl=trusted) as response:
                            return response.status == 200
                    except aiohttp.ClientError:
                        return False

                await wait_until(ready, timeout=30, what="the extender process to be ready")
                with pytest.raises(aiohttp.ClientError):  # no client certificate: refused
                    await session.get(f"{url}/healthz", ssl=client_context(ca, None, None))

            await env.start_scheduler(
                url,
                bindVerb="bind",  # every verb over the TLS link, bind too (the chart's extender.bind)
                enableHTTPS=True,
                nodeCacheCapable=False,
                tlsConfig={
                    "caFile": str(ca.cert_path),
                    "certFile": str(scheduler_client.cert_path),
                    "keyFile": str(scheduler_client.key_path),
                },
            )
            team = await env.create_queue("t", resources={"gpu": {"limit": 2}})
            await env.submit(team, 3, "p")
            await converge(env, {team: 2}, {team: 2})

            async def refused() -> bool:
                waiting = [waiting_condition(p) for p in await env.pods() if not p["spec"].get("nodeName")]
                return len(waiting) == 1 and waiting[0] is not None and "limit (2)" in waiting[0]["message"]

            await wait_until(refused, timeout=20, what="the third pod's wait reason")
        finally:
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 15)
        output = log_path.read_text()
        assert code == 0, output
        assert "shutting down" in output and "bound " in output
