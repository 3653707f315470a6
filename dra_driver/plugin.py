"""The kubelet-facing half of the driver: gRPC services on unix sockets.

- Registration (``<registry-dir>/<driver>-reg.sock``): the kubelet finds it, calls GetInfo (also as
  a liveness check) and NotifyRegistrationStatus.
- DRAPlugin v1 and v1beta1 plus DRAResourceHealth v1 and v1alpha1, all on
  ``<plugin-dir>/<driver>/dra.sock``.

Sockets are only reachable by the driver's user (0600, in 0750 directories); a stale socket from a
previous run is removed before binding, and both are removed at shutdown (which the kubelet takes
as deregistration).

Entry point for the driver process: ``serve_plugin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from kubernetes_asyncio import client

from dra_driver.checkpoint import Checkpoint
from dra_driver.config import DriverConfig
from dra_driver.devices.backend import Backend
from dra_driver.devices.model import Gpu
from dra_driver.prepare import ApiClaimReader, ClaimReader, ClaimRef, NodeDevice, Preparer, node_devices
from dra_driver.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)
from dra_driver.sharing import CommandRunner, ProcessRunner, RecordingRunner, SharingManager

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_VERSIONS = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)
# How long the kubelet should trust a health report without hearing again.
HEALTH_CHECK_TIMEOUT_S = 60
_SOCKET_MODE = 0o600
_DIR_MODE = 0o750
# sun_path holds 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107
SIMULATED_COMMAND_LOG = "sharing-commands.jsonl"


@dataclass(frozen=True)
class PluginSockets:
    registration: Path
    dra: Path

    @classmethod
    def for_driver(cls, driver_name: str, plugin_dir: Path, registry_dir: Path) -> PluginSockets:
        return cls(registry_dir / f"{driver_name}-reg.sock", plugin_dir / driver_name / "dra.sock")


def _prepare_socket_path(path: Path) -> None:
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ValueError(
            f"socket path {path} is {len(os.fsencode(path))} bytes; unix sockets allow at most "
            f"{_MAX_SOCKET_PATH}: choose a shorter plugin/registry directory"
        )
    path.parent.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
        log.info("removing stale socket %s", path)
        path.unlink()


# ---- device health ----


@dataclass(frozen=True)
class DeviceHealthReport:
    device_name: str
    healthy: bool
    message: str
    updated_at: int  # unix seconds


class DeviceHealthBoard:
    """The latest health of every published device; watchers wake on each change."""

    def __init__(self, pool_name: str) -> None:
        self.pool_name = pool_name
        self._reports: dict[str, DeviceHealthReport] = {}
        self._changed = asyncio.Event()

    def update(self, gpus: Sequence[Gpu]) -> None:
        now = int(time.time())
        reports: dict[str, DeviceHealthReport] = {}
        for gpu in gpus:
            # A device inherits its physical GPU's health (MIG devices included).
            for name in node_devices([gpu]):
                old = self._reports.get(name)
                if old is not None and old.healthy == gpu.healthy and old.message == gpu.health_message:
                    reports[name] = old
                else:
                    reports[name] = DeviceHealthReport(name, gpu.healthy, gpu.health_message, now)
        if reports != self._reports:
            self._reports = reports
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def snapshot(self) -> list[DeviceHealthReport]:
        return [self._reports[name] for name in sorted(self._reports)]

    async def watch(self) -> AsyncIterator[list[DeviceHealthReport]]:
        """The current picture now, then again after every change, until the caller stops."""
        while True:
            changed = self._changed
            yield self.snapshot()
            await changed.wait()


# ---- gRPC services ----


class _RegistrationService:
    def __init__(self, driver_name: str, dra_socket: Path) -> None:
        self._driver = driver_name
        self._endpoint = str(dra_socket)
        self.registered = asyncio.Event()

    async def GetInfo(self, request: Any, context: Any) -> registration_pb2.PluginInfo:
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=self._endpoint,
            supported_versions=SUPPORTED_VERSIONS,
        )

    async def NotifyRegistrationStatus(
        self, request: registration_pb2.RegistrationStatus, context: Any
    ) -> registration_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered driver %s", self._driver)
            self.registered.set()
        else:
            log.error("kubelet refused to register driver %s: %s", self._driver, request.error)
            self.registered.clear()
        return registration_pb2.RegistrationStatusResponse()


class _DraService:
    """DRAPlugin for one API version; ``messages`` is that version's generated module."""

    def __init__(self, preparer: Preparer, messages: ModuleType, with_share_id: bool) -> None:
        self._preparer = preparer
        self._messages = messages
        self._with_share_id = with_share_id

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        outcomes = await self._preparer.prepare(refs)
        response = self._messages.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            entry.error = outcome.error
            for device in outcome.devices:
                added = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self._with_share_id and device.share_id:
                    added.share_id = device.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        errors = await self._preparer.unprepare(refs)
        response = self._messages.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class _HealthService:
    """DRAResourceHealth for one API version; ``messages`` is that version's generated module."""

    def __init__(self, board: DeviceHealthBoard, messages: ModuleType) -> None:
        self._board = board
        self._messages = messages

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        m = self._messages
        async for reports in self._board.watch():
            yield m.NodeWatchResourcesResponse(
                devices=[
                    m.DeviceHealth(
                        device=m.DeviceIdentifier(pool_name=self._board.pool_name, device_name=r.device_name),
                        health=m.HEALTHY if r.healthy else m.UNHEALTHY,
                        last_updated_time=r.updated_at,
                        health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S,
                        message=r.message,
                    )
                    for r in reports
                ]
            )


class DraPlugin:
    """The two gRPC servers; ``start`` binds the sockets, ``stop`` shuts down and removes them."""

    def __init__(
        self, *, driver_name: str, preparer: Preparer, health: DeviceHealthBoard, sockets: PluginSockets
    ) -> None:
        self.sockets = sockets
        self.health = health
        self._registration = _RegistrationService(driver_name, sockets.dra)
        self._preparer = preparer
        self._servers: list[Any] = []

    @property
    def registered(self) -> asyncio.Event:
        """Set once the kubelet (or the node agent) confirmed the registration."""
        return self._registration.registered

    @property
    def serving(self) -> bool:
        return len(self._servers) == 2

    async def start(self) -> None:
        dra_server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DraService(self._preparer, dra_v1_pb2, True), dra_server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DraService(self._preparer, dra_v1beta1_pb2, False), dra_server
        )
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _HealthService(self.health, health_v1_pb2), dra_server
        )
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _HealthService(self.health, health_v1alpha1_pb2), dra_server
        )
        registration_server = grpc.aio.server()
        registration_pb2_grpc.add_RegistrationServicer_to_server(self._registration, registration_server)
        # The DRA socket first: once the registration socket appears the kubelet may call at once.
        bindings = ((dra_server, self.sockets.dra), (registration_server, self.sockets.registration))
        try:
            for server, path in bindings:
                _prepare_socket_path(path)
                server.add_insecure_port(f"unix:{path}")
                await server.start()
                self._servers.append(server)
                path.chmod(_SOCKET_MODE)
                log.info("serving %s", path)
        except BaseException:
            await self.stop(grace_s=0)
            raise

    async def stop(self, grace_s: float = 5.0) -> None:
        # Registration first, so the kubelet stops sending work before the DRA service goes away.
        for server in reversed(self._servers):
            await server.stop(grace_s)
        self._servers.clear()
        for path in (self.sockets.registration, self.sockets.dra):
            path.unlink(missing_ok=True)
        log.info("plugin sockets removed")


class DeviceInventory:
    """The node's devices as prepare and the health service see them; fed by the backend."""

    def __init__(self, node_name: str, gpus: Sequence[Gpu]) -> None:
        self.health = DeviceHealthBoard(pool_name=node_name)
        self._devices: Mapping[str, NodeDevice] = {}
        self.update(gpus)

    def update(self, gpus: Sequence[Gpu]) -> None:
        self._devices = node_devices(gpus)
        self.health.update(gpus)

    def devices(self) -> Mapping[str, NodeDevice]:
        return self._devices

    async def follow(self, backend: Backend) -> None:
        async for gpus in backend.watch_health():
            self.update(gpus)


def build_plugin(
    *,
    driver_name: str,
    node_name: str,
    gpus: Sequence[Gpu],
    claims: ClaimReader,
    runner: CommandRunner,
    plugin_dir: Path,
    registry_dir: Path,
    cdi_dir: Path,
    checkpoint_dir: Path,
) -> tuple[DraPlugin, DeviceInventory]:
    """Wire checkpoint, sharing, preparer and servers together (nothing is started yet)."""
    inventory = DeviceInventory(node_name, gpus)
    sockets = PluginSockets.for_driver(driver_name, plugin_dir, registry_dir)
    preparer = Preparer(
        driver_name=driver_name,
        node_name=node_name,
        devices=inventory.devices,
        claims=claims,
        checkpoint=Checkpoint(checkpoint_dir),
        sharing=SharingManager(runner, mps_root=plugin_dir / driver_name / "mps"),
        cdi_dir=cdi_dir,
    )
    plugin = DraPlugin(driver_name=driver_name, preparer=preparer, health=inventory.health, sockets=sockets)
    return plugin, inventory


def default_runner(config: DriverConfig) -> CommandRunner:
    """Real commands on real GPUs; with the simulated backend, recorded to a JSON-lines file."""
    if config.backend == "simulated":
        return RecordingRunner(log_path=config.checkpoint_dir / SIMULATED_COMMAND_LOG)
    return ProcessRunner()


async def serve_plugin(
    config: DriverConfig,
    backend: Backend,
    api: client.ApiClient,
    stop: asyncio.Event,
    *,
    runner: CommandRunner | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """Run the kubelet plugin until ``stop`` is set, then shut down gracefully.

    ``runner`` performs GPU sharing commands (default: ``default_runner(config)``). ``started``
    (optional) is set once both sockets are served.
    """
    config.checkpoint_dir.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
    plugin, inventory = build_plugin(
        driver_name=config.driver_name,
        node_name=config.node_name,
        gpus=backend.inventory(),
        claims=ApiClaimReader(api),
        runner=runner if runner is not None else default_runner(config),
        plugin_dir=config.plugin_dir,
        registry_dir=config.registry_dir,
        cdi_dir=config.cdi_dir,
        checkpoint_dir=config.checkpoint_dir,
    )
    await plugin.start()
    follower = asyncio.create_task(inventory.follow(backend), name="plugin-inventory")
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await plugin.stop()
