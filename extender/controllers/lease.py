"""Leader election over a coordination.k8s.io/v1 Lease: one extender replica acts, the others wait.

The holder renews the Lease every `duration_s / 3`; a replica takes it over when the holder has
not renewed for `duration_s`. Updates carry the resourceVersion they read, so two replicas racing
for an expired Lease cannot both win (the loser gets 409 and stays a follower). A replica that
cannot renew in time stops acting at once (`is_leader` is False), before anyone can take over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from kubernetes_asyncio.client import ApiClient

from extender.kubeapi import JsonObject, KubeError, request

log = logging.getLogger(__name__)


def _micro_time(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    for layout in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, layout).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderLease:
    def __init__(
        self, api: ApiClient, namespace: str, name: str, identity: str, duration_s: float = 15.0
    ) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.name, self.identity = namespace, name, identity
        self.duration_s = duration_s
        self._valid_until = 0.0  # monotonic: we may act until then
        self._task: asyncio.Task[None] | None = None

    def is_leader(self) -> bool:
        return time.monotonic() < self._valid_until

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leader-lease")

    async def stop(self, release: bool = False) -> None:
        """Stop acting; with ``release``, a leader also hands the Lease over at once (a graceful
        shutdown), so a standby takes over on its next try instead of after the Lease duration."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        was_leader = self.is_leader()
        self._valid_until = 0.0
        if release and was_leader:
            try:
                await self._release()
            except Exception as exc:  # it expires on its own
                log.warning("lease %s/%s: not released: %r", self.namespace, self.name, exc)

    async def _release(self) -> None:
        lease = await request(self.api, "GET", f"{self.path}/{self.name}")
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        body = self._lease(datetime.now(UTC), int(spec.get("leaseTransitions") or 0))
        body["metadata"]["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
        # An expired Lease held by nobody: the next try of any replica takes it.
        body["spec"].update(
            holderIdentity=None,
            leaseDurationSeconds=1,
            renewTime=_micro_time(datetime(1970, 1, 1, tzinfo=UTC)),
        )
        await request(self.api, "PUT", f"{self.path}/{self.name}", body=body)
        log.info("lease %s/%s released by %s", self.namespace, self.name, self.identity)

    async def _run(self) -> None:
        while True:
            try:
                await self.try_acquire()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API is away: stop acting, try again
                self._valid_until = 0.0
                log.warning("lease %s/%s: %r", self.namespace, self.name, exc)
            await asyncio.sleep(self.duration_s / 3)

    async def try_acquire(self) -> bool:
        """Create, renew or take over the Lease; True while this replica holds it."""
        started = time.monotonic()
        now = datetime.now(UTC)
        try:
            lease = await request(self.api, "GET", f"{self.path}/{self.name}")
        except KubeError as exc:
            if exc.status != 404:
                raise
            return await self._write("POST", self.path, self._lease(now, transitions=0), started)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _parse_micro_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder != self.identity and not expired:
            self._valid_until = 0.0
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        body = self._lease(now, transitions)
        body["metadata"]["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
        if holder == self.identity:
            body["spec"]["acquireTime"] = spec.get("acquireTime")
        return await self._write("PUT", f"{self.path}/{self.name}", body, started)

    async def _write(self, verb: str, path: str, body: JsonObject, started: float) -> bool:
        try:
            await request(self.api, verb, path, body=body)
        except KubeError as exc:
            if exc.status == 409:  # another replica wrote first
                self._valid_until = 0.0
                return False
            raise
        if not self.is_leader():
            log.info("lease %s/%s acquired by %s", self.namespace, self.name, self.identity)
        # Count from before the read: never act longer than the others will wait.
        self._valid_until = started + self.duration_s
        return True

    def _lease(self, now: datetime, transitions: int) -> JsonObject:
        stamp = _micro_time(now)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.duration_s),
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": transitions,
            },
        }
