"""A small GPU cluster on the real control plane with the extender in-process and a scheduler calling it.

Every name is unique to the test (driver, DeviceClass, nodes, queues, scheduler), so leftovers of
other tests never enter the extender's picture, and everything cluster-scoped is deleted at the end.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.names import QUEUE_GROUP, QUEUE_LABEL, QUEUE_PLURAL, QUEUE_VERSION
from extender.kubeapi import JsonObject, KubeError, request
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.service import ExtenderService, ServiceOptions
from tessera.dev.localcluster import LocalCluster, SchedulerHandle, api_client, create_fake_node, delete_nodes
from tests import extender_objects as objects

REPO = Path(__file__).resolve().parents[2]
QUEUE_CRD = REPO / "manifests" / "crds" / "queues.yaml"
QUEUES_PATH = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
TEMPLATE = "one-gpu"
QUARTER_TEMPLATE = "quarter-gpu"  # 20Gi of an 80Gi GPU, on shareable slices only


@dataclass
class GpuCluster:
    cluster: LocalCluster
    api: ApiClient
    namespace: str
    suffix: str
    driver: str
    scheduler_name: str
    nodes: list[str]
    service: ExtenderService | None = None
    scheduler: SchedulerHandle | None = None
    queues: list[str] = field(default_factory=list)

    def queue_name(self, short: str) -> str:
        return f"{short}-{self.suffix}"

    async def create_queue(self, short: str, **spec: Any) -> str:
        name = self.queue_name(short)
        await request(self.api, "POST", QUEUES_PATH, body=objects.queue(name, **spec))
        self.queues.append(name)
        return name

    async def patch_queue(self, name: str, spec: JsonObject) -> None:
        await request(
            self.api,
            "PATCH",
            f"{QUEUES_PATH}/{name}",
            body={"spec": spec},
            content_type="application/merge-patch+json",
        )

    async def get_queue(self, name: str) -> JsonObject:
        return await request(self.api, "GET", f"{QUEUES_PATH}/{name}")

    async def submit(self, queue: str, count: int, prefix: str, template: str = TEMPLATE) -> list[str]:
        names = []
        for index in range(count):
            pod = objects.pod(
                self.namespace,
                f"{prefix}-{index}",
                queue=queue,
                template=template,
                scheduler=self.scheduler_name,
            )
            del pod["metadata"]["uid"]
            await request(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/pods", body=pod)
            names.append(pod["metadata"]["name"])
        return names

    async def pods(self) -> list[JsonObject]:
        listing = await request(self.api, "GET", f"/api/v1/namespaces/{self.namespace}/pods")
        return list(listing.get("items") or [])

    async def bound_by_queue(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for pod in await self.pods():
            if pod["spec"].get("nodeName"):
                queue = pod["metadata"]["labels"][QUEUE_LABEL]
                counts[queue] = counts.get(queue, 0) + 1
        return counts

    async def delete_pods(self, names: list[str]) -> None:
        """Force delete: no kubelet runs on fake nodes to finish a graceful deletion."""
        for name in names:
            await request(
                self.api,
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                query={"gracePeriodSeconds": "0"},
            )

    async def start_extender(self, port: int = 0) -> ExtenderService:
        state = ClusterPicture(
            PictureConfig(
                gpu_drivers=frozenset({self.driver}), scheduler_names=frozenset({self.scheduler_name})
            )
        )
        extender_api = await api_client(self.cluster.kubeconfig)
        service = ExtenderService(
            extender_api,
            ServiceOptions(host="127.0.0.1", port=port, picture=state, queue_status_interval_s=0.5),
        )
        await service.start()
        await service.wait_ready()
        self.service = service
        return service

    async def stop_extender(self) -> None:
        if self.service is not None:
            await self.service.stop()
            await self.service.watcher.api.close()
            self.service = None

    @property
    def url(self) -> str:
        assert self.service is not None
        return f"http://127.0.0.1:{self.service.port}"

    async def start_scheduler(self, url: str, **extender_fields: Any) -> None:
        """A kube-scheduler (profile `scheduler_name`) calling the extender at `url`."""
        config = {
            "urlPrefix": url,
            "filterVerb": "filter",
            "prioritizeVerb": "prioritize",
            "preemptVerb": "preempt",
            "bindVerb": "bind",
            "weight": 1,
            "nodeCacheCapable": True,
            "enableHTTPS": False,
            **extender_fields,
        }
        self.scheduler = await asyncio.to_thread(self.cluster.start_scheduler, self.scheduler_name, [config])


async def _ignore_missing(path: str, api: ApiClient) -> None:
    try:
        await request(api, "DELETE", path, query={"gracePeriodSeconds": "0"})
    except KubeError as exc:
        if exc.status != 404:
            raise


@asynccontextmanager
async def gpu_cluster(
    cluster: LocalCluster,
    api: ApiClient,
    namespace: str,
    nodes: int = 2,
    gpus_per_node: int = 4,
    in_process: bool = True,
    shareable: bool = False,
) -> AsyncIterator[GpuCluster]:
    """GPU nodes, slices, a DeviceClass and claim templates; with `in_process`, also the extender
    in this process and a scheduler calling it. `shareable` GPUs take fractional claims."""
    suffix = uuid.uuid4().hex[:6]
    driver = f"gpu-{suffix}.tessera.dev"
    env = GpuCluster(
        cluster,
        api,
        namespace,
        suffix,
        driver,
        f"tessera-{suffix}",
        [f"gpu-node-{suffix}-{i}" for i in range(nodes)],
    )
    await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(QUEUE_CRD))
    await asyncio.to_thread(
        cluster.kubectl,
        "wait",
        "--for=condition=established",
        "--timeout=30s",
        "crd/queues.scheduling.tessera.dev",
    )
    try:
        await request(
            api,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            body=objects.device_class(driver, driver=driver),
        )
        for node in env.nodes:
            await create_fake_node(api, node)
            await request(
                api,
                "POST",
                "/apis/resource.k8s.io/v1/resourceslices",
                body=objects.gpu_slice(
                    node, gpus_per_node, driver=driver, name=f"{node}-gpus", shareable=shareable
                ),
            )
        templates = {TEMPLATE: objects.claim_spec(driver)}
        if shareable:
            templates[QUARTER_TEMPLATE] = objects.claim_spec(driver, memory="20Gi")
        templates_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
        for name, spec in templates.items():
            await request(api, "POST", templates_path, body=objects.claim_template(namespace, name, spec))
        if in_process:
            await env.start_extender()
            await env.start_scheduler(env.url)
        yield env
    finally:
        if env.scheduler is not None:
            env.scheduler.stop()
        await env.stop_extender()
        await _ignore_missing(f"/api/v1/namespaces/{namespace}/pods", api)
        for queue in env.queues:
            await _ignore_missing(f"{QUEUES_PATH}/{queue}", api)
        for node in env.nodes:
            await _ignore_missing(f"/apis/resource.k8s.io/v1/resourceslices/{node}-gpus", api)
        await delete_nodes(api, env.nodes)
        await _ignore_missing(f"/apis/resource.k8s.io/v1/deviceclasses/{driver}", api)
