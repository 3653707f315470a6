"""The owner reader: reads the custom resources whose spec states a gang's minimum.

A gang of a PodGroup, a JobSet, a Kubeflow job (PyTorchJob, TFJob, MPIJob, XGBoostJob, JAXJob,
PaddleJob) or a RayCluster takes its minimum from that object's spec (the table in
`extender.policy.workloads`). Those are custom resources the cluster may not have, so the picture
does not watch them: it lists the ones its gangs name (`WorkloadMap.wanted`), and about every
fifth of a second this controller GETs them, in every replica (the picture is the same
everywhere). Until an owner is read, its gang's pods are refused ("reading the spec"), so a gang
is never admitted with the few pods its operator created first. An owner
that cannot be read - the CRD is not installed (404), the chart grants no access to its group
(403), the apiserver fails - is asked for again a minute later; meanwhile the minimum comes from
the pod (the annotation, or the members present). Reads are few: one per owner while its
workload has members.
"""

from __future__ import annotations

import logging

from kubernetes_asyncio.client import ApiClient

from extender.controllers.periodic import PeriodicPass
from extender.kubeapi import KubeError, request
from extender.picture.cluster import ClusterPicture
from extender.picture.workloads import OwnerRef

log = logging.getLogger(__name__)

# Resource names of the owner kinds whose spec states a minimum (the chart grants `get` on these).
PLURALS = {
    "PodGroup": "podgroups",
    "JobSet": "jobsets",
    "PyTorchJob": "pytorchjobs",
    "TFJob": "tfjobs",
    "MPIJob": "mpijobs",
    "XGBoostJob": "xgboostjobs",
    "JAXJob": "jaxjobs",
    "PaddleJob": "paddlejobs",
    "RayCluster": "rayclusters",
}
READ_TIMEOUT_S = 5.0


def owner_path(ref: OwnerRef) -> str | None:
    """The API path of an owner object (None: not a kind Tessera reads)."""
    api_version, kind, key = ref
    plural = PLURALS.get(kind)
    namespace, _, name = key.partition("/")
    if plural is None or "/" not in api_version or not namespace or not name:
        return None
    return f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}"


class OwnerReader:
    def __init__(self, api: ApiClient, picture: ClusterPicture, interval_s: float = 0.2) -> None:
        self.api = api
        self.picture = picture
        self._pass = PeriodicPass("owner-reader", interval_s, picture.ready, self.run_once)

    def start(self) -> None:
        self._pass.start()

    async def stop(self) -> None:
        await self._pass.stop()

    async def run_once(self) -> None:
        for ref in self.picture.owners_to_read():
            path = owner_path(ref)
            if path is None:
                self.picture.read_owner(ref, None)
                continue
            try:
                obj = await request(self.api, "GET", path, timeout=READ_TIMEOUT_S)
            except (KubeError, OSError, TimeoutError) as exc:
                log.info(
                    "owner %s %s not read (its pods' minimum comes from the pods): %s", ref[1], ref[2], exc
                )
                self.picture.read_owner(ref, None)
                continue
            self.picture.read_owner(ref, obj)
            log.info("read %s %s: its spec states its gang's minimum", ref[1], ref[2])
