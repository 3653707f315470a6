"""The scheduler's Service points at the leader: the Lease holder writes the Service's EndpointSlice.

With several replicas only one may answer the scheduler (admission reservations live in memory),
yet every replica should be Ready - a rolling update and a PodDisruptionBudget count Ready pods.
So the Service has no selector; the replica holding the leader Lease writes its one EndpointSlice
with its own address, and kube-proxy (or whatever routes the Service) follows it. A standby never
writes it. When the leader dies, its slice stays until the standby's Lease takeover (at most the
Lease duration) rewrites it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes_asyncio.client import ApiClient

from extender.controllers.periodic import BackgroundLoop
from extender.kubeapi import JsonObject, KubeError, request

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "extender.tessera.dev"  # not the endpointslice controller: it leaves the slice alone


@dataclass(frozen=True)
class Advertise:
    """The Service the leader publishes itself behind, and its own address (the pod IP)."""

    namespace: str
    service: str
    address: str
    port_name: str = "extender"


def endpoint_slice(advertise: Advertise, port: int) -> JsonObject:
    """The Service's slice with the one leader endpoint (pure)."""
    address_type = "IPv6" if ":" in advertise.address else "IPv4"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": advertise.service,
            "namespace": advertise.namespace,
            "labels": {SERVICE_NAME_LABEL: advertise.service, MANAGED_BY_LABEL: MANAGED_BY},
        },
        "addressType": address_type,
        "endpoints": [{"addresses": [advertise.address], "conditions": {"ready": True}}],
        "ports": [{"name": advertise.port_name, "port": port, "protocol": "TCP"}],
    }


class LeaderEndpoint(BackgroundLoop):
    """While this replica leads, keeps the Service's EndpointSlice pointing at it."""

    name = "leader-endpoint"

    def __init__(
        self,
        api: ApiClient,
        advertise: Advertise,
        port: Callable[[], int],
        is_leader: Callable[[], bool],
        interval_s: float = 0.5,
        refresh_s: float = 10.0,
    ) -> None:
        self.api, self.advertise = api, advertise
        self.port, self.is_leader = port, is_leader
        self.interval_s, self.refresh_s = interval_s, refresh_s
        self.path = f"/apis/discovery.k8s.io/v1/namespaces/{advertise.namespace}/endpointslices"
        self._published: JsonObject | None = None  # what this replica last wrote while leading
        self._published_at = 0.0

    async def _run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API is away: try again next round
                self._published = None
                log.warning("endpoint slice %s/%s: %r", self.advertise.namespace, self.advertise.service, exc)
            await asyncio.sleep(self.interval_s)

    async def reconcile(self) -> None:
        if not self.is_leader():
            self._published = None  # leading again later means writing again
            return
        wanted = endpoint_slice(self.advertise, self.port())
        # Rewritten now and then too, in case anything else changed it while this replica led.
        if wanted == self._published and time.monotonic() - self._published_at < self.refresh_s:
            return
        try:
            await request(self.api, "PUT", f"{self.path}/{self.advertise.service}", body=wanted)
        except KubeError as exc:
            if exc.status != 404:
                raise
            await request(self.api, "POST", self.path, body=wanted)  # 409 if created meanwhile: retried
        self._published = wanted
        self._published_at = time.monotonic()
        log.debug(
            "service %s/%s points at this replica (%s:%d)",
            self.advertise.namespace,
            self.advertise.service,
            self.advertise.address,
            self.port(),
        )
