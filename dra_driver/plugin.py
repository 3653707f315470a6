"""The kubelet-facing half of the driver: gRPC services on unix sockets.

- Registration (``<registry-dir>/<driver>-reg.sock``): the kubelet finds it, calls GetInfo (also as
  a liveness check) and NotifyRegistrationStatus.
- DRAPlugin v1 and v1beta1 plus DRAResourceHealth v1 and v1alpha1, all on
  ``<plugin-dir>/<driver>/dra.sock``.

Sockets are only reachable by the driver's user (0600, in 0750 directories). One instance of a
driver serves a node at a time: an instance holds ``<checkpoint-dir>/instance.lock`` while it
serves, and a second one (a DaemonSet rolling update overlaps two pods) waits for it, and for any
live socket at its paths, before it reads the checkpoint and binds. A dead socket is replaced,
any other file refused. At shutdown an instance removes only the socket files it bound and that
are still the ones it bound (which the kubelet takes as deregistration).

Entry point for the driver process: ``serve_plugin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import grpc
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dra_driver.checkpoint import Checkpoint
from dra_driver.config import API_TIMEOUT_S, DriverConfig
from dra_driver.devices.model import Gpu, NodeDevice
from dra_driver.devices.profile import DeviceProfile
from dra_driver.prepare import ApiClaimReader, ClaimReader, ClaimRef, Preparer, RecoveryReport, node_devices
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
# How long the kubelet should trust a health report without hearing again...
HEALTH_CHECK_TIMEOUT_S = 60
# ...and how often the full picture is sent again even when nothing changed: well within that
# timeout, and within the fixed 30 s that kubelets ignoring the declared timeout apply.
HEALTH_REFRESH_S = 10.0
INSTANCE_LOCK_FILE = "instance.lock"
# How often a waiting instance checks whether the previous one has gone.
_TAKEOVER_POLL_S = 0.5
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
        # Absolute: GetInfo hands the DRA path to the kubelet, which resolves it from its own cwd.
        return cls(
            registry_dir.absolute() / f"{driver_name}-reg.sock",
            plugin_dir.absolute() / driver_name / "dra.sock",
        )


class SocketState(StrEnum):
    ABSENT = "absent"
    STALE = "stale"  # a socket file nobody listens on: left by a killed process
    LIVE = "live"  # another process serves it


def socket_state(path: Path) -> SocketState:
    """What is at ``path``; FileExistsError for anything that is not a socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return SocketState.ABSENT
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return SocketState.STALE
    except TimeoutError:  # a full backlog: somebody is there
        return SocketState.LIVE
    finally:
        probe.close()
    return SocketState.LIVE


def _binding_path(path: Path) -> Path:
    """A private name next to ``path`` for gRPC to bind: gRPC unlinks the socket file at the
    name it bound when it stops, whoever's it is by then, so it never gets the public name."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}")


def _check_socket_path(path: Path) -> None:
    length = len(os.fsencode(_binding_path(path)))
    if length > _MAX_SOCKET_PATH:
        raise ValueError(
            f"socket path {path} needs {length} bytes while binding; unix sockets allow at most "
            f"{_MAX_SOCKET_PATH}: choose a shorter plugin/registry directory"
        )


async def wait_for_free_socket(path: Path) -> None:
    """Return once nobody serves ``path`` (removing a stale socket file there)."""
    waited = False
    while (state := await asyncio.to_thread(socket_state, path)) is SocketState.LIVE:
        if not waited:
            log.info("%s is served by another live process; waiting for it to stop", path)
            waited = True
        await asyncio.sleep(_TAKEOVER_POLL_S)
    if state is SocketState.STALE:
        log.info("removing stale socket %s", path)
        await asyncio.to_thread(path.unlink, missing_ok=True)


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """Which file is at ``path``: the inode alone is not enough, a new socket may reuse it."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class InstanceLock:
    """An exclusive lock on a file, held while this instance serves the node; the kernel drops it
    when the process dies, however it dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _try(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fd = fd
        return True

    async def acquire(self) -> None:
        waited = False
        while not await asyncio.to_thread(self._try):
            if not waited:
                log.info("another instance of this driver holds %s; waiting for it to stop", self.path)
                waited = True
            await asyncio.sleep(_TAKEOVER_POLL_S)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


# ---- device health ----


@dataclass(frozen=True)
class DeviceHealthReport:
    device_name: str
    healthy: bool
    message: str


class DeviceHealthBoard:
    """The latest health of every published device; watchers wake on each change."""

    def __init__(self, pool_name: str) -> None:
        self.pool_name = pool_name
        self._reports: dict[str, DeviceHealthReport] = {}
        self._changed = asyncio.Event()

    def update(self, reports: Mapping[str, DeviceHealthReport]) -> None:
        if reports != self._reports:
            self._reports = dict(reports)
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def snapshot(self) -> list[DeviceHealthReport]:
        return [self._reports[name] for name in sorted(self._reports)]

    async def watch(self, refresh_s: float) -> AsyncIterator[list[DeviceHealthReport]]:
        """The current picture now, again after every change, and at least every ``refresh_s``
        until the caller stops."""
        while True:
            changed = self._changed
            yield self.snapshot()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(refresh_s):
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

    def __init__(self, board: DeviceHealthBoard, messages: ModuleType, refresh_s: float) -> None:
        self._board = board
        self._messages = messages
        self._refresh_s = refresh_s

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        m = self._messages
        async for reports in self._board.watch(self._refresh_s):
            # Every message carries every device: the kubelet keeps a device's health only as
            # long as the timeout after it last heard of it. The time is when it was confirmed.
            now = int(time.time())
            yield m.NodeWatchResourcesResponse(
                devices=[
                    m.DeviceHealth(
                        device=m.DeviceIdentifier(pool_name=self._board.pool_name, device_name=r.device_name),
                        health=m.HEALTHY if r.healthy else m.UNHEALTHY,
                        last_updated_time=now,
                        health_check_timeout_seconds=HEALTH_CHECK_TIMEOUT_S,
                        message=r.message,
                    )
                    for r in reports
                ]
            )


class DraPlugin:
    """The two gRPC servers; ``start`` takes over the node and binds the sockets, ``stop`` shuts
    down and removes the sockets that are still its own."""

    def __init__(
        self,
        *,
        driver_name: str,
        preparer: Preparer,
        health: DeviceHealthBoard,
        sockets: PluginSockets,
        instance_lock: Path,
        health_refresh_s: float = HEALTH_REFRESH_S,
    ) -> None:
        self.sockets = sockets
        self.health = health
        self._registration = _RegistrationService(driver_name, sockets.dra)
        self._preparer = preparer
        self._instance = InstanceLock(instance_lock)
        self._health_refresh_s = health_refresh_s
        self._servers: list[Any] = []
        self._bound: dict[Path, tuple[int, int, int] | None] = {}  # socket path -> its file's identity

    @property
    def registered(self) -> asyncio.Event:
        """Set once the kubelet (or the node agent) confirmed the registration."""
        return self._registration.registered

    @property
    def serving(self) -> bool:
        return len(self._servers) == 2

    @property
    def recovery(self) -> RecoveryReport:
        """What the last start recovered (claims the checkpoint had lost, specs kept)."""
        return self._preparer.recovery

    async def start(self) -> None:
        """Wait until no other instance serves this driver here, then start from the checkpoint
        and serve. Cancel it to give up waiting."""
        for path in (self.sockets.dra, self.sockets.registration):
            _check_socket_path(path)
        try:
            await self._instance.acquire()
            for path in (self.sockets.dra, self.sockets.registration):
                path.parent.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
                await wait_for_free_socket(path)  # an instance that does not take the lock
            await self._preparer.recover()
            await self._serve()
        except BaseException:
            await self.stop(grace_s=0)
            raise

    async def _serve(self) -> None:
        dra_server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DraService(self._preparer, dra_v1_pb2, True), dra_server
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DraService(self._preparer, dra_v1beta1_pb2, False), dra_server
        )
        health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _HealthService(self.health, health_v1_pb2, self._health_refresh_s), dra_server
        )
        health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
            _HealthService(self.health, health_v1alpha1_pb2, self._health_refresh_s), dra_server
        )
        registration_server = grpc.aio.server()
        registration_pb2_grpc.add_RegistrationServicer_to_server(self._registration, registration_server)
        # The DRA socket first: once the registration socket appears the kubelet may call at once.
        bindings = ((dra_server, self.sockets.dra), (registration_server, self.sockets.registration))
        for server, path in bindings:
            private = _binding_path(path)
            server.add_insecure_port(f"unix:{private}")
            await server.start()
            self._servers.append(server)
            private.chmod(_SOCKET_MODE)
            # Atomic: the socket appears at its public name serving, and replaces a stale one.
            private.rename(path)
            self._bound[path] = _file_identity(path)
            log.info("serving %s", path)

    async def stop(self, grace_s: float = 5.0) -> None:
        # Registration first, so the kubelet stops sending work before the DRA service goes away.
        for server in reversed(self._servers):
            await server.stop(grace_s)
        self._servers.clear()
        for path, identity in reversed(self._bound.items()):
            if identity is not None and _file_identity(path) == identity:
                path.unlink(missing_ok=True)
                log.info("removed socket %s", path)
            else:
                log.warning("%s is no longer the socket this instance bound; left in place", path)
        self._bound.clear()
        self._instance.release()


class DeviceInventory:
    """The node's devices as prepare and the health service see them; fed by the profile's
    discovery."""

    def __init__(self, node_name: str, profile: DeviceProfile, gpus: Sequence[Gpu]) -> None:
        self.health = DeviceHealthBoard(pool_name=node_name)
        self._profile = profile
        self._devices: Mapping[str, NodeDevice] = {}
        self.update(gpus)

    def update(self, gpus: Sequence[Gpu]) -> None:
        self._devices = node_devices(gpus, self._profile)
        # A device inherits its physical GPU's health (MIG devices included).
        self.health.update(
            {
                name: DeviceHealthReport(name, gpu.healthy, gpu.health_message)
                for gpu in gpus
                for name in node_devices([gpu], self._profile)
            }
        )

    def devices(self) -> Mapping[str, NodeDevice]:
        return self._devices

    async def follow(self) -> None:
        async for gpus in self._profile.discovery.watch_health():
            self.update(gpus)


def build_plugin(
    *,
    driver_name: str,
    node_name: str,
    profile: DeviceProfile,
    gpus: Sequence[Gpu],
    claims: ClaimReader,
    runner: CommandRunner,
    plugin_dir: Path,
    registry_dir: Path,
    cdi_dir: Path,
    checkpoint_dir: Path,
    health_refresh_s: float = HEALTH_REFRESH_S,
    instances_changed: Callable[[str], None] | None = None,
) -> tuple[DraPlugin, DeviceInventory]:
    """Wire checkpoint, sharing, preparer and servers together (nothing is started yet);
    ``gpus`` is the profile's first inventory. ``instances_changed`` is told once a prepare or
    unprepare that made, destroyed or found MIG instances has written its records (the slice
    publisher's ``request_republish``)."""
    inventory = DeviceInventory(node_name, profile, gpus)
    sockets = PluginSockets.for_driver(driver_name, plugin_dir, registry_dir)
    preparer = Preparer(
        driver_name=driver_name,
        node_name=node_name,
        devices=inventory.devices,
        profile=profile,
        claims=claims,
        checkpoint=Checkpoint(checkpoint_dir),
        # Named for MPS, the one strategy that keeps host state today (its pipe and log directories).
        sharing=SharingManager(runner, profile.sharing(plugin_dir / driver_name / "mps")),
        cdi_dir=cdi_dir,
        partitioner=profile.partitioner(runner.run, checkpoint_dir),
        instances_changed=instances_changed,
    )
    plugin = DraPlugin(
        driver_name=driver_name,
        preparer=preparer,
        health=inventory.health,
        sockets=sockets,
        instance_lock=checkpoint_dir / INSTANCE_LOCK_FILE,
        health_refresh_s=health_refresh_s,
    )
    return plugin, inventory


def default_runner(config: DriverConfig, profile: DeviceProfile) -> CommandRunner:
    """Real commands on real devices; on simulated ones, recorded to a JSON-lines file."""
    if profile.simulated:
        return RecordingRunner(log_path=config.checkpoint_dir / SIMULATED_COMMAND_LOG)
    return ProcessRunner()


async def serve_plugin(
    config: DriverConfig,
    profile: DeviceProfile,
    api: client.ApiClient,
    stop: asyncio.Event,
    *,
    runner: CommandRunner | None = None,
    started: asyncio.Event | None = None,
    instances_changed: Callable[[str], None] | None = None,
) -> None:
    """Run the kubelet plugin until ``stop`` is set, then shut down gracefully.

    ``runner`` performs sharing commands (default: ``default_runner(config, profile)``). ``started``
    (optional) is set once both sockets are served. ``instances_changed``: see ``build_plugin``.
    """
    config.checkpoint_dir.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
    plugin, inventory = build_plugin(
        driver_name=config.driver_name,
        node_name=config.node_name,
        profile=profile,
        gpus=profile.discovery.inventory(),
        claims=ApiClaimReader(api),
        runner=runner if runner is not None else default_runner(config, profile),
        plugin_dir=config.plugin_dir,
        registry_dir=config.registry_dir,
        cdi_dir=config.cdi_dir,
        checkpoint_dir=config.checkpoint_dir,
        instances_changed=instances_changed,
    )
    # Starting may wait for a previous instance to go; a stop during that wait ends it.
    starting = asyncio.create_task(plugin.start(), name="plugin-start")
    stopping = asyncio.create_task(stop.wait(), name="plugin-stop")
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    starting.result()
    if plugin.recovery.degraded:
        await report_recovery(api, config.node_name, config.driver_name, plugin.recovery)
    follower = asyncio.create_task(inventory.follow(), name="plugin-inventory")
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await plugin.stop()


RECOVERY_EVENT_REASON = "DRACheckpointRecovered"
_EVENT_MESSAGE_LIMIT = 1024  # what the apiserver keeps of an Event's message


async def report_recovery(
    api: client.ApiClient, node_name: str, driver_name: str, report: RecoveryReport
) -> None:
    """A Warning Event on the Node (``kubectl describe node`` shows it) saying the checkpoint was
    incomplete and what was recovered; a failure to post it is logged, never raised (the ERROR
    logs and the gauges already say it)."""
    now = datetime.now(UTC)
    event: Any = {  # the client takes the JSON form; its model types would add nothing here
        "metadata": {"generateName": f"{node_name}.", "namespace": "default"},
        # A node's events name the node as its UID, as the kubelet's do: describe finds them so.
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name},
        "reason": RECOVERY_EVENT_REASON,
        "message": report.summary()[:_EVENT_MESSAGE_LIMIT],
        "type": "Warning",
        "source": {"component": driver_name, "host": node_name},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        await asyncio.wait_for(client.CoreV1Api(api).create_namespaced_event("default", event), API_TIMEOUT_S)
    except (ApiException, OSError, TimeoutError, aiohttp.ClientError) as err:
        log.warning("could not post the %s event on node %s: %r", RECOVERY_EVENT_REASON, node_name, err)
