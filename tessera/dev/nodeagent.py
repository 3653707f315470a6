"""A simulated node: the DRA driver with a simulated GPU profile, plus a stand-in for the kubelet.

For tests, the demo and users' scale tests on a control plane without kubelets. Per fake node the
agent runs the real driver (discovery, ResourceSlices, gRPC plugin) and plays the kubelet's part
of DRA over the real sockets:

- registration: finds ``*-reg.sock`` in the registry directory, calls GetInfo and
  NotifyRegistrationStatus, and forgets a driver whose socket disappears or changes;
- pods bound to the node: reads their ResourceClaims, calls NodePrepareResources on the owning
  drivers, and once every claim is prepared marks the pod Running through the status subresource
  (a per-claim error is logged and retried, like the kubelet's FailedPrepareDynamicResources);
- pods being deleted: calls NodeUnprepareResources for claims no other pod on the node still
  uses, then finishes the deletion (grace period 0), as the kubelet does; pods force-deleted
  (gone without a graceful termination) get their claims unprepared on the next pass, and so do
  pods marked Succeeded or Failed (tests finish a Job's pods that way: containers never exit here).

Usage: ``tessera-node-agent --kubeconfig KC --profile dra_driver/profiles/nvidia/nodes/h100x8.yaml
--node-name sim-1 --node-name sim-2 --state-dir /tmp/tessera-nodes --create-nodes``, with
``--node-label sim-1:example.com/rack=rack0`` (repeatable) for the created Nodes' topology labels.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from contract.kube import pod_claim_refs
from contract.names import DRIVER_NAME
from dra_driver.__main__ import run_driver
from dra_driver.config import DriverConfig, SharingModeSetting
from dra_driver.prepare import ApiClaimReader, ClaimPrepareError
from dra_driver.proto import dra_v1_pb2, dra_v1_pb2_grpc, registration_pb2, registration_pb2_grpc

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 45.0  # what the kubelet allows a plugin call
FINISHED = ("Succeeded", "Failed")


class AgentError(RuntimeError):
    """Something about one pod or driver that a later pass may resolve (logged, retried)."""


# ---- registration ----


@dataclass
class RegisteredDriver:
    name: str
    endpoint: str
    registration_socket: Path
    socket_identity: tuple[int, int]  # (inode, ctime): a restarted driver gets a new socket


class Registrar:
    """Finds driver registration sockets and performs the kubelet's handshake."""

    def __init__(self, registry_dir: Path) -> None:
        self.registry_dir = registry_dir
        self.drivers: dict[str, RegisteredDriver] = {}

    @staticmethod
    def _identity(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def refresh(self) -> None:
        for name, driver in list(self.drivers.items()):
            if self._identity(driver.registration_socket) != driver.socket_identity:
                log.info("driver %s deregistered (registration socket gone or replaced)", name)
                del self.drivers[name]
        known = {d.registration_socket for d in self.drivers.values()}
        for path in sorted(self.registry_dir.glob("*-reg.sock")):
            if path not in known:
                await self._handshake(path)

    async def _handshake(self, path: Path) -> None:
        identity = self._identity(path)
        if identity is None:
            return
        try:
            async with grpc.aio.insecure_channel(f"unix:{path}") as channel:
                stub = registration_pb2_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(registration_pb2.InfoRequest(), timeout=RPC_TIMEOUT_S)
                problem = ""
                if info.type != "DRAPlugin":
                    problem = f"plugin type {info.type!r} is not DRAPlugin"
                elif "v1.DRAPlugin" not in info.supported_versions:
                    problem = f"no supported DRA version in {list(info.supported_versions)}"
                await stub.NotifyRegistrationStatus(
                    registration_pb2.RegistrationStatus(plugin_registered=not problem, error=problem),
                    timeout=RPC_TIMEOUT_S,
                )
        except grpc.aio.AioRpcError as err:
            log.warning("registration handshake on %s failed: %s", path, err.details())
            return
        if problem:
            log.error("refusing plugin on %s: %s", path, problem)
            return
        self.drivers[info.name] = RegisteredDriver(info.name, info.endpoint, path, identity)
        log.info("registered DRA driver %s at %s", info.name, info.endpoint)


# ---- claims of a pod ----


@dataclass(frozen=True)
class PodClaim:
    namespace: str
    name: str
    uid: str
    drivers: frozenset[str]


def pod_claim_names(pod: Mapping[str, Any]) -> list[str] | None:
    """Names of the ResourceClaims a pod uses; None while a generated claim has no name yet."""
    refs = pod_claim_refs(pod)
    if any(ref.claim is None for ref in refs):
        return None
    return [ref.claim for ref in refs if ref.claim]


def _claim_from_api(obj: Mapping[str, Any]) -> PodClaim:
    meta = obj["metadata"]
    allocation = (obj.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return PodClaim(meta["namespace"], meta["name"], meta["uid"], frozenset(r["driver"] for r in results))


def running_status(pod: Mapping[str, Any], node_name: str) -> dict[str, Any]:
    """The status a kubelet writes for a pod whose containers all started (a merge patch's body);
    bench.scale's light kubelet writes it too."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": kind, "status": "True", "lastTransitionTime": now}
        for kind in ("PodScheduled", "Initialized", "PodReadyToStartContainers", "ContainersReady", "Ready")
    ]
    containers = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": f"tessera-sim://{pod['metadata']['uid']}/{c['name']}",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in pod.get("spec", {}).get("containers", [])
    ]
    return {
        "status": {
            "phase": "Running",
            "conditions": conditions,
            "containerStatuses": containers,
            "startTime": now,
            "hostIP": "127.0.0.1",
            "message": f"simulated by tessera node agent on {node_name}",
        }
    }


# ---- the kubelet stand-in ----


@dataclass
class KubeletStandIn:
    """Reconciles the pods bound to one node against the registered drivers."""

    api: client.ApiClient
    node_name: str
    registrar: Registrar
    prepared: dict[str, list[PodClaim]] = field(default_factory=dict)  # pod uid -> its claims
    last_errors: dict[str, str] = field(default_factory=dict)  # pod uid -> why it is not running

    def __post_init__(self) -> None:
        self._core = client.CoreV1Api(self.api)
        self._claims = ApiClaimReader(self.api)

    async def sync_once(self) -> None:
        await self.registrar.refresh()
        pods = await self._list_pods()
        active = [
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp") and p.get("status", {}).get("phase") not in FINISHED
        ]
        for pod in pods:
            uid = pod["metadata"]["uid"]
            phase = pod.get("status", {}).get("phase", "Pending")
            try:
                if pod["metadata"].get("deletionTimestamp"):
                    await self._finish_deletion(pod, active)
                elif phase == "Pending":
                    await self._start(pod)
                elif phase in FINISHED and uid in self.prepared:
                    # Its containers exited: the kubelet unprepares the claims of a finished pod.
                    await self._unprepare(self.prepared[uid], active)
                    del self.prepared[uid]
                self.last_errors.pop(uid, None)
            except AgentError as err:
                if self.last_errors.get(uid) != str(err):
                    log.warning("pod %s/%s: %s", pod["metadata"]["namespace"], pod["metadata"]["name"], err)
                self.last_errors[uid] = str(err)
        live = {p["metadata"]["uid"] for p in pods}
        for uid in [uid for uid in self.prepared if uid not in live]:
            # Deleted without a graceful termination (force): the kubelet's cleanup unprepares
            # the claims of pods it no longer has, or their devices would stay taken.
            try:
                await self._unprepare(self.prepared[uid], active)
                del self.prepared[uid]
            except AgentError as err:
                log.warning("claims of a force-deleted pod (uid %s): %s", uid, err)

    async def _list_pods(self) -> list[dict[str, Any]]:
        listing = await self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}"
        )
        pods: list[dict[str, Any]] = self.api.sanitize_for_serialization(listing).get("items", [])
        return pods

    async def _claims_of(self, pod: Mapping[str, Any]) -> list[PodClaim]:
        names = pod_claim_names(pod)
        if names is None:
            raise AgentError("waiting for the resourceclaim controller to name the generated claims")
        namespace = pod["metadata"]["namespace"]
        claims: list[PodClaim] = []
        for name in names:
            try:
                claims.append(_claim_from_api(await self._claims.read_claim(namespace, name)))
            except ClaimPrepareError as err:
                raise AgentError(str(err)) from None
        return claims

    async def _start(self, pod: Mapping[str, Any]) -> None:
        claims = await self._claims_of(pod)
        for driver, refs in self._by_driver(claims).items():
            response = await self._call(driver, "NodePrepareResources", refs)
            failures = {uid: r.error for uid, r in response.claims.items() if r.error}
            missing = {c.uid for c in refs} - set(response.claims)
            if failures or missing:
                raise AgentError(f"FailedPrepareDynamicResources from {driver}: {failures or missing}")
        self.prepared[pod["metadata"]["uid"]] = claims
        meta = pod["metadata"]
        try:
            await self._core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                running_status(pod, self.node_name),
            )
        except ApiException as err:
            raise AgentError(f"marking the pod Running: {err.status} {err.reason}") from None
        log.info("pod %s/%s running on %s", meta["namespace"], meta["name"], self.node_name)

    async def _finish_deletion(self, pod: Mapping[str, Any], active: Sequence[Mapping[str, Any]]) -> None:
        uid = pod["metadata"]["uid"]
        claims = self.prepared.get(uid)
        if claims is None:
            # Prepared by an earlier agent run; the claims may be gone already, so skip missing ones.
            claims = []
            for name in pod_claim_names(pod) or []:
                with contextlib.suppress(ClaimPrepareError):
                    claims.append(
                        _claim_from_api(await self._claims.read_claim(pod["metadata"]["namespace"], name))
                    )
        await self._unprepare(claims, active)
        meta = pod["metadata"]
        try:
            await self._core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise AgentError(f"deleting the pod: {err.status} {err.reason}") from None
        self.prepared.pop(uid, None)
        log.info("pod %s/%s removed from %s", meta["namespace"], meta["name"], self.node_name)

    async def _unprepare(self, claims: Sequence[PodClaim], active: Sequence[Mapping[str, Any]]) -> None:
        # A claim shared with another pod on this node stays prepared until its last pod goes.
        still_used = {(p["metadata"]["namespace"], n) for p in active for n in pod_claim_names(p) or []}
        unused = [c for c in claims if (c.namespace, c.name) not in still_used]
        for driver, refs in self._by_driver(unused).items():
            response = await self._call(driver, "NodeUnprepareResources", refs)
            failures = {u: r.error for u, r in response.claims.items() if r.error}
            if failures:
                raise AgentError(f"unprepare by {driver} failed: {failures}")

    def _by_driver(self, claims: Iterable[PodClaim]) -> dict[str, list[PodClaim]]:
        grouped: dict[str, list[PodClaim]] = {}
        for claim in claims:
            for driver in sorted(claim.drivers):
                grouped.setdefault(driver, []).append(claim)
        return grouped

    async def _call(self, driver: str, method: str, claims: Sequence[PodClaim]) -> Any:
        registered = self.registrar.drivers.get(driver)
        if registered is None:
            raise AgentError(f"DRA driver {driver} is not registered on {self.node_name}")
        request_type = (
            dra_v1_pb2.NodePrepareResourcesRequest
            if method == "NodePrepareResources"
            else dra_v1_pb2.NodeUnprepareResourcesRequest
        )
        request = request_type(
            claims=[dra_v1_pb2.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        try:
            async with grpc.aio.insecure_channel(f"unix:{registered.endpoint}") as channel:
                stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
                return await getattr(stub, method)(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as err:
            raise AgentError(f"{method} on {driver}: {err.code().name} {err.details()}") from None


async def run_kubelet_stand_in(
    stand_in: KubeletStandIn, stop: asyncio.Event, interval_s: float = 0.5
) -> None:
    """Reconcile until ``stop``; API hiccups are logged and retried on the next pass."""
    while not stop.is_set():
        try:
            await stand_in.sync_once()
        except (ApiException, OSError, aiohttp.ClientError) as err:
            log.warning("node %s: sync failed: %s", stand_in.node_name, err)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


# ---- one simulated node, and the console entry ----


def node_driver_config(
    node_name: str,
    state_dir: Path,
    profile: Path,
    kubeconfig: Path,
    driver_name: str = DRIVER_NAME,
    sharing_mode: SharingModeSetting = "auto",
) -> DriverConfig:
    """Driver settings for a simulated node: all of its directories live under ``state_dir/node``."""
    root = state_dir / node_name
    return DriverConfig(
        node_name=node_name,
        driver_name=driver_name,
        backend="simulated",
        profile=profile,
        kubeconfig=kubeconfig,
        plugin_dir=root / "plugins",
        registry_dir=root / "plugins_registry",
        cdi_dir=root / "cdi",
        checkpoint_dir=root / "state",
        sharing_mode=sharing_mode,
    )


async def run_simulated_node(config: DriverConfig, api: client.ApiClient, stop: asyncio.Event) -> None:
    """The driver and the kubelet stand-in for one fake node, until ``stop``."""
    config.registry_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
    stand_in = KubeletStandIn(api, config.node_name, Registrar(config.registry_dir))
    async with asyncio.TaskGroup() as group:
        group.create_task(run_driver(config, stop), name=f"driver-{config.node_name}")
        group.create_task(run_kubelet_stand_in(stand_in, stop), name=f"kubelet-{config.node_name}")


def _node_label(text: str) -> tuple[str, str, str]:
    """`NODE:KEY=VALUE` -> (node, key, value)."""
    node, _, label = text.partition(":")
    key, sep, value = label.partition("=")
    if not node or not key or not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: want NODE:KEY=VALUE")
    return node, key, value


def labels_by_node(labels: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, str]]:
    """The `--node-label` triples grouped by node."""
    grouped: dict[str, dict[str, str]] = {}
    for node, key, value in labels:
        grouped.setdefault(node, {})[key] = value
    return grouped


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tessera-node-agent",
        description="Fake GPU nodes: Tessera DRA driver on a simulated profile, plus a kubelet stand-in.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--profile", type=Path, required=True, help="simulated GPU profile (YAML)")
    parser.add_argument("--node-name", action="append", required=True, help="fake node to serve (repeatable)")
    parser.add_argument("--state-dir", type=Path, default=Path("/tmp/tessera-nodes"))
    parser.add_argument("--driver-name", default=DRIVER_NAME)
    parser.add_argument(
        "--sharing-mode",
        default="auto",
        choices=["auto", "consumable-capacity", "whole-device"],
        help="how the driver publishes the GPUs (auto: consumable capacity where the apiserver has it)",
    )
    parser.add_argument("--create-nodes", action="store_true", help="create the fake Node objects first")
    parser.add_argument(
        "--node-label",
        action="append",
        default=[],
        type=_node_label,
        metavar="NODE:KEY=VALUE",
        help="a label the created Node gets (repeatable), e.g. gpu-node-0:example.com/rack=rack0",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    # The dev tooling's helpers, imported only here: the driver itself never depends on tessera.
    from tessera.dev.localcluster import api_client, create_fake_node

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    api = await api_client(args.kubeconfig)
    try:
        if args.create_nodes:
            labels = labels_by_node(args.node_label)
            for name in args.node_name:
                with contextlib.suppress(ApiException):  # already there: reuse it
                    await create_fake_node(api, name, labels.get(name))
        async with asyncio.TaskGroup() as group:
            for name in args.node_name:
                config = node_driver_config(
                    name, args.state_dir, args.profile, args.kubeconfig, args.driver_name, args.sharing_mode
                )
                group.create_task(run_simulated_node(config, api, stop), name=name)
    finally:
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
