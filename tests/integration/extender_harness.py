"""A small GPU cluster on the real control plane with the extender in-process and a scheduler calling it.

Every name is unique to the test (driver, DeviceClass, nodes, queues, scheduler), so leftovers of
other tests never enter the extender's picture, and everything cluster-scoped is deleted at the end.
With `agent`, every node runs the node agent (the DRA driver on a simulated profile and the kubelet
stand-in): pods become Running, and evicted or deleted pods really go away after
their graceful termination, as on a node with a kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from contract.names import MIN_MEMBERS_ANNOTATION, QUEUE_GROUP, QUEUE_LABEL, QUEUE_PLURAL, QUEUE_VERSION
from extender.controllers.history import HistoryOptions
from extender.controllers.reclaim import ReclaimOptions
from extender.kubeapi import JsonObject, KubeError, request
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.policy.topology import DEFAULT_TOPOLOGY, Topology
from extender.service import ExtenderService, ServiceOptions
from extender.webhook import WebhookOptions
from extender.webhook_process import WebhookTLS
from tessera.dev.localcluster import (
    LocalCluster,
    SchedulerHandle,
    api_client,
    create_fake_node,
    delete_nodes,
    wait_until,
)
from tests import extender_objects as objects

REPO = Path(__file__).resolve().parents[2]
QUEUE_CRD = REPO / "manifests" / "crds" / "queues.yaml"
QUEUES_PATH = f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"
TEMPLATE = "one-gpu"
QUARTER_TEMPLATE = "quarter-gpu"  # 20Gi of an 80Gi GPU, on shareable slices only
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


def h100_profile(gpus: int) -> str:
    """A simulated node profile with `gpus` H100 80GB (the node agent's YAML format)."""
    return (
        f"description: {gpus}x NVIDIA H100 80GB HBM3, for tests\n"
        'driverVersion: "570.124.06"\n'
        'cudaDriverVersion: "12.8"\n'
        "gpus:\n"
        f"  - count: {gpus}\n"
        "    productName: NVIDIA H100 80GB HBM3\n"
        "    architecture: Hopper\n"
        '    cudaComputeCapability: "9.0"\n'
        "    memory: 80Gi\n"
    )


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
    topology: Topology = DEFAULT_TOPOLOGY  # the levels gangs may ask for (`--topology-levels`)

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

    def pod(self, queue: str, name: str, template: str = TEMPLATE, cpu: str = "100m") -> JsonObject:
        pod = objects.pod(
            self.namespace, name, queue=queue, template=template, scheduler=self.scheduler_name, cpu=cpu
        )
        del pod["metadata"]["uid"], pod["status"]
        return pod

    async def submit(
        self, queue: str, count: int, prefix: str, template: str = TEMPLATE, cpu: str = "100m"
    ) -> list[str]:
        names = []
        for index in range(count):
            pod = self.pod(queue, f"{prefix}-{index}", template, cpu)
            await request(self.api, "POST", f"/api/v1/namespaces/{self.namespace}/pods", body=pod)
            names.append(pod["metadata"]["name"])
        return names

    async def create_replicaset(
        self, queue: str, name: str, replicas: int, template: str = TEMPLATE, cpu: str = "100m"
    ) -> None:
        """A ReplicaSet of GPU pods (label app=`name`): the controller replaces evicted pods."""
        pod = self.pod(queue, name, template, cpu)
        pod_labels = {**pod["metadata"]["labels"], "app": name}
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": pod_labels}, "spec": pod["spec"]},
            },
        }
        await request(self.api, "POST", f"/apis/apps/v1/namespaces/{self.namespace}/replicasets", body=body)

    async def create_job(
        self,
        queue: str,
        name: str,
        parallelism: int,
        min_members: int | None = None,
        template: str = TEMPLATE,
        gates: tuple[str, ...] = (),
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """An indexed Job of `parallelism` GPU pods (a gang of that many, or of `min_members`);
        `gates`: scheduling gates its pods are created with (the test lifts them one by one);
        `annotations`: more on its pod template (a topology ask)."""
        pod = self.pod(queue, name, template)
        pod["spec"]["restartPolicy"] = "Never"
        if gates:
            pod["spec"]["schedulingGates"] = [{"name": gate} for gate in gates]
        annotations = {**(annotations or {})}
        if min_members is not None:
            annotations[MIN_MEMBERS_ANNOTATION] = str(min_members)
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "parallelism": parallelism,
                "completions": parallelism,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": pod["metadata"]["labels"], "annotations": annotations},
                    "spec": pod["spec"],
                },
            },
        }
        await request(self.api, "POST", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", body=body)

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

    async def new_extender(
        self,
        port: int = 0,
        reclaim: ReclaimOptions | None = None,
        lease: tuple[str, str, str] | None = None,
        webhooks: WebhookOptions | None = None,
        webhook_tls: WebhookTLS | None = None,
        history: HistoryOptions | None = None,
    ) -> ExtenderService:
        """An extender service of this cluster, started and synced (the caller stops it); its
        webhooks, if any, in their own process."""
        picture = ClusterPicture(
            PictureConfig(
                gpu_drivers=frozenset({self.driver}),
                scheduler_names=frozenset({self.scheduler_name}),
                topology=self.topology,
            )
        )
        extender_api = await api_client(self.cluster.kubeconfig)
        service = ExtenderService(
            extender_api,
            ServiceOptions(
                host="127.0.0.1",
                port=port,
                picture=picture,
                queue_status_interval_s=0.5,
                reclaim=reclaim or ReclaimOptions(),
                lease=lease,
                webhooks=webhooks,
                webhook_tls=webhook_tls,
                kubeconfig=str(self.cluster.kubeconfig),
                history=history or HistoryOptions(),
            ),
        )
        await service.start()
        await service.wait_ready()
        return service

    async def start_extender(
        self,
        port: int = 0,
        lease: tuple[str, str, str] | None = None,
        webhooks: WebhookOptions | None = None,
        webhook_tls: WebhookTLS | None = None,
        history: HistoryOptions | None = None,
    ) -> ExtenderService:
        """The extender the scheduler calls."""
        self.service = await self.new_extender(
            port, lease=lease, webhooks=webhooks, webhook_tls=webhook_tls, history=history
        )
        return self.service

    async def stop_extender(self) -> None:
        if self.service is not None:
            await stop_service(self.service)
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
            "weight": 1,
            "nodeCacheCapable": True,
            "enableHTTPS": False,
            **extender_fields,
        }
        self.scheduler = await asyncio.to_thread(self.cluster.start_scheduler, self.scheduler_name, [config])


async def stop_service(service: ExtenderService) -> None:
    await service.stop()
    await service.watcher.api.close()


@asynccontextmanager
async def node_agents(
    cluster: LocalCluster, api: ApiClient, driver: str, nodes: list[str], gpus: int
) -> AsyncIterator[None]:
    """`tessera-node-agent` for the nodes, in its own process (gRPC in this one would break the
    fork of every later control-plane process): the DRA driver publishing `gpus` simulated H100s
    per node, and the kubelet stand-in. Returns once every node's slices are published."""
    # Unix socket paths are short: a directory straight under /tmp.
    with tempfile.TemporaryDirectory(prefix="tsr-", dir="/tmp") as state:
        profile = Path(state) / "profile.yaml"
        profile.write_text(h100_profile(gpus))
        agent = cluster.spawn(
            f"node-agent-{driver}",
            [
                sys.executable, "-m", "tessera.dev.nodeagent", f"--kubeconfig={cluster.kubeconfig}",
                f"--profile={profile}", f"--driver-name={driver}", f"--state-dir={state}",
                *(f"--node-name={node}" for node in nodes),
            ],
        )  # fmt: skip

        async def published() -> bool:
            if agent.process.poll() is not None:
                raise RuntimeError(f"the node agent exited:\n{agent.log_tail()}")
            listing = await request(api, "GET", SLICES_PATH, query={"fieldSelector": f"spec.driver={driver}"})
            return {item["spec"]["nodeName"] for item in listing.get("items") or []} == set(nodes)

        try:
            await wait_until(published, timeout=60, what=f"slices of {driver} on {nodes}")
            yield
        finally:
            agent.stop()
            cluster.components.remove(agent)
            with contextlib.suppress(KubeError):
                await request(api, "DELETE", SLICES_PATH, query={"fieldSelector": f"spec.driver={driver}"})


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
    agent: bool = False,
    topology: Topology = DEFAULT_TOPOLOGY,
) -> AsyncIterator[GpuCluster]:
    """GPU nodes, slices, a DeviceClass and claim templates; with `in_process`, also the extender
    in this process and a scheduler calling it. `shareable` GPUs take fractional claims. With
    `agent`, the node agent publishes the slices and plays the kubelet (see the module docstring)."""
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
        topology=topology,
    )
    await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(QUEUE_CRD))
    await asyncio.to_thread(cluster.wait_established, "crd/queues.scheduling.tessera.dev")
    try:
        async with contextlib.AsyncExitStack() as stack:
            await request(
                api,
                "POST",
                "/apis/resource.k8s.io/v1/deviceclasses",
                body=objects.device_class(driver, driver=driver),
            )
            for node in env.nodes:
                await create_fake_node(api, node)
                if not agent:
                    await request(
                        api,
                        "POST",
                        SLICES_PATH,
                        body=objects.gpu_slice(
                            node, gpus_per_node, driver=driver, name=f"{node}-gpus", shareable=shareable
                        ),
                    )
            if agent:
                await stack.enter_async_context(node_agents(cluster, api, driver, env.nodes, gpus_per_node))
            templates = {TEMPLATE: objects.claim_spec(driver)}
            if shareable:
                templates[QUARTER_TEMPLATE] = objects.claim_spec(driver, memory="20Gi")
            templates_path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates"
            for name, spec in templates.items():
                await request(api, "POST", templates_path, body=objects.claim_template(namespace, name, spec))
            if in_process:
                await env.start_extender()
                await env.start_scheduler(env.url)
            try:
                yield env
            finally:  # no controller may recreate pods while the rest is torn down
                await _ignore_missing(f"/apis/apps/v1/namespaces/{namespace}/replicasets", api)
                await _ignore_missing(f"/apis/batch/v1/namespaces/{namespace}/jobs", api)
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
