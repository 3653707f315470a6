"""The calls a kubelet makes to a DRA driver, built only from the kubelet's ``.proto`` files.

Nothing here comes from ``dra_driver``: the ``.proto`` files in ``proto/`` (same packages, services
and field numbers as ``k8s.io/kubelet`` v0.37.2) are compiled at first use into a descriptor set
and loaded into a private descriptor pool, so these messages never meet the driver's own
generated classes, and the driver is judged by the wire alone. Calls go by method path, as the
kubelet's gRPC client sends them.

Two kubelet rules are reproduced from the v1.37 kubelet code (pkg/kubelet/cm/dra):
- a container that names a request of a claim (``resources.claims[].request``) gets the CDI
  devices whose ``request_names`` contain exactly that name, or are empty (``container_cdi_ids``);
- a device's health is what the plugin last said, until ``health_check_timeout_seconds`` (30 s
  when not set) pass without a word about it; then it is Unknown (``HealthView``).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent / "proto"
PROTO_FILES = ("registration.proto", "dra_v1.proto", "health_v1.proto")
DRA_V1 = "k8s.io.kubelet.pkg.apis.dra.v1"
DEFAULT_HEALTH_TIMEOUT_S = 30
RPC_TIMEOUT_S = 45.0  # what the kubelet allows a NodePrepareResources call


@functools.cache
def _pool() -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        descriptor_set = Path(tmp) / "kubelet.pb"
        code = protoc.main(
            ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={descriptor_set}", *PROTO_FILES]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed ({code}) on {PROTO_DIR}")
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


def message(full_name: str) -> Any:
    """The message class of ``full_name`` (e.g. ``v1.DeviceHealth``), from the private pool."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def _unary(channel: grpc.aio.Channel, method: str, request: str, response: str) -> Any:
    return channel.unary_unary(
        method,
        request_serializer=message(request).SerializeToString,
        response_deserializer=message(response).FromString,
    )


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class Kubelet:
    """One kubelet's view of one driver: registration, then prepare/unprepare and health."""

    def __init__(self, registration_socket: Path) -> None:
        self.registration_socket = registration_socket

    async def register(self) -> Any:
        """GetInfo and NotifyRegistrationStatus, as the plugin watcher does; the PluginInfo."""
        async with grpc.aio.insecure_channel(f"unix:{self.registration_socket}") as channel:
            info = await _unary(
                channel, "/pluginregistration.Registration/GetInfo", "pluginregistration.InfoRequest",
                "pluginregistration.PluginInfo",
            )(message("pluginregistration.InfoRequest")(), timeout=RPC_TIMEOUT_S)  # fmt: skip
            problem = ""
            if info.type != "DRAPlugin":
                problem = f"plugin type {info.type!r}"
            elif "v1.DRAPlugin" not in info.supported_versions:
                problem = f"no v1.DRAPlugin in {list(info.supported_versions)}"
            elif not Path(info.endpoint).is_absolute():
                problem = f"endpoint {info.endpoint!r} is not an absolute path"
            status = message("pluginregistration.RegistrationStatus")(
                plugin_registered=not problem, error=problem
            )
            await _unary(
                channel, "/pluginregistration.Registration/NotifyRegistrationStatus",
                "pluginregistration.RegistrationStatus", "pluginregistration.RegistrationStatusResponse",
            )(status, timeout=RPC_TIMEOUT_S)  # fmt: skip
        return info

    @staticmethod
    def _claims(kind: str, refs: Iterable[ClaimRef]) -> Any:
        claim = message(f"{DRA_V1}.Claim")
        return message(f"{DRA_V1}.{kind}")(
            claims=[claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]
        )

    async def prepare(
        self, endpoint: str, refs: Sequence[ClaimRef], timeout: float = RPC_TIMEOUT_S
    ) -> dict[str, Any]:
        """NodePrepareResources (v1): claim UID -> NodePrepareResourceResponse."""
        async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
            call = _unary(
                channel, f"/{DRA_V1}.DRAPlugin/NodePrepareResources",
                f"{DRA_V1}.NodePrepareResourcesRequest", f"{DRA_V1}.NodePrepareResourcesResponse",
            )  # fmt: skip
            response = await call(self._claims("NodePrepareResourcesRequest", refs), timeout=timeout)
        return dict(response.claims)

    async def unprepare(
        self, endpoint: str, refs: Sequence[ClaimRef], timeout: float = RPC_TIMEOUT_S
    ) -> dict[str, str]:
        """NodeUnprepareResources (v1): claim UID -> error ("" when done)."""
        async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
            call = _unary(
                channel, f"/{DRA_V1}.DRAPlugin/NodeUnprepareResources",
                f"{DRA_V1}.NodeUnprepareResourcesRequest", f"{DRA_V1}.NodeUnprepareResourcesResponse",
            )  # fmt: skip
            response = await call(self._claims("NodeUnprepareResourcesRequest", refs), timeout=timeout)
        return {uid: entry.error for uid, entry in response.claims.items()}

    @staticmethod
    async def watch_health(endpoint: str) -> AsyncGenerator[Any, None]:
        """NodeWatchResources (v1): every message of the stream, until the caller stops."""
        async with grpc.aio.insecure_channel(f"unix:{endpoint}") as channel:
            stream = channel.unary_stream(
                "/v1.DRAResourceHealth/NodeWatchResources",
                request_serializer=message("v1.NodeWatchResourcesRequest").SerializeToString,
                response_deserializer=message("v1.NodeWatchResourcesResponse").FromString,
            )(message("v1.NodeWatchResourcesRequest")())
            try:
                async for response in stream:
                    yield response
            finally:
                stream.cancel()


def container_cdi_ids(prepared: Any, request: str) -> list[str]:
    """The CDI device ids the kubelet gives a container naming ``request`` of a prepared claim."""
    return [
        cdi_id
        for device in prepared.devices
        if not request or not device.request_names or request in device.request_names
        for cdi_id in device.cdi_device_ids
    ]


@dataclass
class HealthView:
    """Device health as the kubelet keeps it: pool/device -> (health, when last heard, timeout)."""

    devices: dict[tuple[str, str], tuple[str, float, float]] = field(default_factory=dict)

    def record(self, response: Any, received_at: float | None = None) -> None:
        now = time.monotonic() if received_at is None else received_at
        status = message("v1.DeviceHealth").DESCRIPTOR.fields_by_name["health"].enum_type
        for device in response.devices:
            timeout = device.health_check_timeout_seconds
            key = (device.device.pool_name, device.device.device_name)
            health = status.values_by_number[device.health].name
            self.devices[key] = (health, now, timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT_S)

    def health(self, pool: str, device: str, at: float | None = None) -> str:
        now = time.monotonic() if at is None else at
        entry = self.devices.get((pool, device))
        if entry is None:
            return "UNKNOWN"
        health, heard, timeout = entry
        return "UNKNOWN" if now - heard > timeout else health
