"""Two extender replicas with leader election behind the scheduler, on the real control plane.

The scheduler reaches the extender through a Service whose EndpointSlice the Lease holder writes
(extender/controllers/endpoint.py); here a small forwarder plays kube-proxy, routing each call to
the endpoint that slice names in the real apiserver. The scheduler profile is configured as when
the extender is wired into a cluster's own scheduler: `managedResources` lists the marker resource
that GPU pods carry (ignoredByScheduler), so only they call the extender, and `ignorable: false`,
so they wait for it rather than bypass the queues. Then the serving replica is killed (SIGKILL) in
the middle of a burst of GPU pods.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject, KubeError, request
from tessera.dev.localcluster import Component, LocalCluster, free_port, wait_until
from tests import extender_objects as objects
from tests.integration.extender_harness import GpuCluster, gpu_cluster

# The marker a GPU pod carries so that a scheduler with managedResources calls the extender for
# it (docs/install.md, "When the extender is down"); nodes never have it, kubelets drop it.
GPU_MARKER = "scheduling.tessera.dev/gpu"
LEASE_DURATION_S = 10


def _host_address() -> str:
    """This machine's own non-loopback IPv4 address (an EndpointSlice refuses loopback ones).
    Connecting a UDP socket sends nothing; it only picks the route's source address."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 1))
        except OSError:
            pytest.skip("no non-loopback IPv4 address to put in an EndpointSlice")
        address: str = probe.getsockname()[0]
    return address


HOST = _host_address()
GPU_PODS, FIRST_WAVE, QUEUE_LIMIT, PLAIN_PODS = 10, 3, 6, 4


@dataclass
class Replica:
    component: Component
    port: int

    def alive(self) -> bool:
        return self.component.process.poll() is None


class ServiceRouter:
    """kube-proxy's part: forwards each call to the endpoint the Service's EndpointSlice names."""

    def __init__(self, api: ApiClient, namespace: str, service: str) -> None:
        self.api, self.path = (
            api,
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{service}",
        )
        self.target: tuple[str, int] | None = None
        self.port = free_port()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        self._runner: web.AppRunner | None = None
        self._follow: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self._follow = asyncio.create_task(self._follow_slice())

    async def stop(self) -> None:
        if self._follow is not None:
            self._follow.cancel()
            await asyncio.gather(self._follow, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
        await self._session.close()

    async def _follow_slice(self) -> None:
        while True:
            try:
                endpoint_slice = await request(self.api, "GET", self.path)
                address = endpoint_slice["endpoints"][0]["addresses"][0]
                self.target = (address, int(endpoint_slice["ports"][0]["port"]))
            except KubeError as exc:
                if exc.status != 404:
                    raise
            await asyncio.sleep(0.1)

    async def _forward(self, incoming: web.Request) -> web.StreamResponse:
        if self.target is None:
            return web.Response(status=503, text="the Service has no endpoint")
        host, port = self.target
        try:
            async with self._session.request(
                incoming.method,
                f"http://{host}:{port}{incoming.path_qs}",
                data=await incoming.read(),
                headers={"Content-Type": incoming.headers.get("Content-Type", "application/json")},
            ) as answer:
                return web.Response(
                    status=answer.status,
                    body=await answer.read(),
                    headers={"Content-Type": answer.headers.get("Content-Type", "application/json")},
                )
        except aiohttp.ClientError as exc:  # a dead endpoint: the scheduler sees the call fail
            return web.Response(status=503, text=f"endpoint {host}:{port} unreachable: {exc}")


def _start_replica(env: GpuCluster, lease: str, service: str, *flags: str) -> Replica:
    port = free_port()
    component = env.cluster.spawn(
        f"extender-{lease}-{port}",
        [
            sys.executable,
            "-m",
            "extender",
            f"--kubeconfig={env.cluster.kubeconfig}",
            f"--listen-address={HOST}",
            f"--port={port}",
            f"--gpu-driver={env.driver}",
            f"--scheduler-name={env.scheduler_name}",
            "--queue-status-interval=0.5",
            "--reclaim-interval=0",
            "--leader-elect",
            f"--lease-namespace={env.namespace}",
            f"--lease-name={lease}",
            f"--lease-duration={LEASE_DURATION_S}",
            f"--advertise-service={service}",
            f"--advertise-address={HOST}",
            *flags,
        ],
    )
    return Replica(component, port)


@asynccontextmanager
async def replicas(env: GpuCluster, lease: str, service: str, *flags: str) -> AsyncIterator[list[Replica]]:
    """Two replicas behind `service` (each with `flags` added), healthy."""
    started = [_start_replica(env, lease, service, *flags) for _ in range(2)]
    try:
        for replica in started:
            await asyncio.to_thread(
                env.cluster.wait_healthy,
                replica.component,
                f"http://{HOST}:{replica.port}/readyz",
                60,
                False,
            )
        yield started
    finally:
        for replica in started:
            replica.component.stop()
        env.cluster.components = [
            c for c in env.cluster.components if all(c is not r.component for r in started)
        ]


def _gpu_pod(env: GpuCluster, queue: str, name: str) -> JsonObject:
    pod = objects.pod(env.namespace, name, queue=queue, template="one-gpu", scheduler=env.scheduler_name)
    del pod["metadata"]["uid"]
    pod["spec"]["containers"][0]["resources"]["limits"] = {GPU_MARKER: "1"}
    return pod


def _plain_pod(env: GpuCluster, name: str) -> JsonObject:
    pod = objects.pod(env.namespace, name, scheduler=env.scheduler_name)
    del pod["metadata"]["uid"]
    return pod


async def test_the_standby_takes_over_when_the_serving_extender_dies(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=2, gpus_per_node=4, in_process=False) as env:
        lease, service = f"extender-{env.suffix}", f"tessera-extender-{env.suffix}"
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        pods_path = f"/api/v1/namespaces/{namespace}/pods"
        await request(
            k8s,
            "POST",
            f"/api/v1/namespaces/{namespace}/services",
            body={
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service},
                "spec": {"ports": [{"name": "extender", "port": 8888, "protocol": "TCP"}]},
            },
        )
        queue = await env.create_queue("team", resources={"gpu": {"limit": QUEUE_LIMIT}})
        router = ServiceRouter(k8s, namespace, service)
        await router.start()
        try:
            async with replicas(env, lease, service) as (first, second):
                await env.start_scheduler(
                    f"http://127.0.0.1:{router.port}",
                    managedResources=[{"name": GPU_MARKER, "ignoredByScheduler": True}],
                    ignorable=False,
                )

                async def serving() -> Replica | None:
                    holder = (await request(k8s, "GET", lease_path))["spec"].get("holderIdentity", "")
                    for replica in (first, second):
                        if holder.endswith(f"-{replica.component.process.pid}") and router.target == (
                            HOST,
                            replica.port,
                        ):
                            return replica
                    return None

                leader = await wait_until(serving, timeout=60, what="a leader the Service points at")
                standby = second if leader is first else first

                # GPU pods keep arriving; the leader dies between two waves of them.
                for index in range(FIRST_WAVE):
                    await request(k8s, "POST", pods_path, body=_gpu_pod(env, queue, f"gpu-{index}"))

                async def first_wave_bound() -> bool:
                    return bound(await env.pods(), "gpu-") == FIRST_WAVE

                await wait_until(first_wave_bound, timeout=60, what="the first wave of GPU pods bound")
                leader.component.process.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                for index in range(PLAIN_PODS):
                    await request(k8s, "POST", pods_path, body=_plain_pod(env, f"plain-{index}"))
                for index in range(FIRST_WAVE, GPU_PODS):
                    await request(k8s, "POST", pods_path, body=_gpu_pod(env, queue, f"gpu-{index}"))

                # Pods without GPUs never ask the extender: they bind while the Service still
                # points at the dead replica, before the standby can take over; GPU pods wait.
                async def plain_bound() -> tuple[bool, int, float] | None:
                    pods = await env.pods()
                    if bound(pods, "plain-") < PLAIN_PODS:
                        return None
                    leaderless = router.target == (HOST, leader.port)
                    return leaderless, bound(pods, "gpu-"), time.monotonic() - killed_at

                leaderless, gpu_bound, plain_after = await wait_until(
                    plain_bound, timeout=60, what="the pods without GPUs bound"
                )
                assert leaderless, (
                    f"plain pods bound only {plain_after:.1f}s after the kill, after the takeover"
                )
                assert gpu_bound == FIRST_WAVE, "a GPU pod was placed without the extender"

                async def taken_over() -> bool:
                    return await serving() is standby

                await wait_until(taken_over, timeout=3 * LEASE_DURATION_S, what="the standby serving")
                takeover_s = time.monotonic() - killed_at

                async def settled() -> bool:
                    allocated = ((await env.get_queue(queue)).get("status") or {}).get("allocated", {})
                    return bound(await env.pods(), "gpu-") == QUEUE_LIMIT and allocated.get("gpu") == str(
                        QUEUE_LIMIT
                    )

                await wait_until(
                    settled, timeout=90, what=f"{QUEUE_LIMIT} GPU pods bound, as the queue limit allows"
                )

                # Nothing double-allocated: each GPU in at most one claim, each bound pod's claim
                # allocated, and the queue never past its limit.
                claims = (
                    await request(
                        k8s, "GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
                    )
                )["items"]
                devices = [
                    (r["pool"], r["device"])
                    for c in claims
                    for r in ((c.get("status") or {}).get("allocation") or {})
                    .get("devices", {})
                    .get("results", [])
                ]
                assert len(devices) == len(set(devices)) == QUEUE_LIMIT, devices
                pods = await env.pods()
                assert bound(pods, "gpu-") == QUEUE_LIMIT
                print(
                    json.dumps(
                        {
                            "plain_pods_bound_after_kill_s": round(plain_after, 1),
                            "standby_serving_after_kill_s": round(takeover_s, 1),
                            "gpu_pods_bound": QUEUE_LIMIT,
                            "distinct_gpus_allocated": len(set(devices)),
                        }
                    )
                )

                # A graceful stop hands the Lease over at once (no waiting out its duration).
                standby.component.process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(standby.component.process.wait, 30)

                async def released() -> bool:
                    return not (await request(k8s, "GET", lease_path))["spec"].get("holderIdentity")

                await wait_until(released, timeout=10, what="the Lease released by the stopping leader")
        finally:
            await router.stop()
            await request(k8s, "DELETE", f"/api/v1/namespaces/{namespace}/services/{service}")


def bound(pods: list[JsonObject], prefix: str) -> int:
    return sum(
        1 for pod in pods if pod["metadata"]["name"].startswith(prefix) and pod["spec"].get("nodeName")
    )
