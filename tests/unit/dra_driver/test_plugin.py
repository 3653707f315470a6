"""The plugin's gRPC services, called by a real gRPC client over real unix sockets."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin import SUPPORTED_VERSIONS, DeviceInventory, DraPlugin
from dra_driver.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    registration_pb2,
    registration_pb2_grpc,
)

from .fakes import DRIVER, NODE, FakeClaims, Result, claim, gpu, gpu_config, make_plugin, opaque


@pytest.fixture
def claims() -> FakeClaims:
    fake = FakeClaims()
    fake.add(claim("uid-whole", [Result("gpu-0")], name="whole"))
    fake.add(claim("uid-frac", [Result("gpu-1", memory="20Gi", share_id="s-1")], name="frac"))
    fake.add(claim("uid-bad", [Result("gpu-1")], configs=[opaque(gpu_config(bogus=1))], name="bad"))
    return fake


@pytest.fixture
async def plugin(root: Path, claims: FakeClaims) -> AsyncIterator[tuple[DraPlugin, DeviceInventory]]:
    started, inventory = make_plugin(root, claims)
    await started.start()
    try:
        yield started, inventory
    finally:
        await started.stop(grace_s=0)


def _channel(path: Path) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"unix:{path}")


async def test_registration_handshake(plugin: tuple[DraPlugin, DeviceInventory]) -> None:
    server, _ = plugin
    async with _channel(server.sockets.registration) as channel:
        stub = registration_pb2_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(registration_pb2.InfoRequest())
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(server.sockets.dra))
        assert tuple(info.supported_versions) == SUPPORTED_VERSIONS
        assert not server.registered.is_set()
        await stub.NotifyRegistrationStatus(registration_pb2.RegistrationStatus(plugin_registered=True))
        assert server.registered.is_set()


async def test_sockets_are_private_and_removed_at_stop(plugin: tuple[DraPlugin, DeviceInventory]) -> None:
    server, _ = plugin
    for path in (server.sockets.registration, server.sockets.dra):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert server.sockets.dra == server.sockets.dra.parents[2] / "plugins" / DRIVER / "dra.sock"
    assert server.sockets.registration.name == f"{DRIVER}-reg.sock"
    await server.stop(grace_s=0)
    assert not server.sockets.registration.exists() and not server.sockets.dra.exists()


async def test_prepare_and_unprepare_v1(plugin: tuple[DraPlugin, DeviceInventory]) -> None:
    server, _ = plugin
    request_claims = [
        dra_v1_pb2.Claim(namespace="ns", uid="uid-whole", name="whole"),
        dra_v1_pb2.Claim(namespace="ns", uid="uid-frac", name="frac"),
        dra_v1_pb2.Claim(namespace="ns", uid="uid-bad", name="bad"),
        dra_v1_pb2.Claim(namespace="ns", uid="uid-gone", name="gone"),
    ]
    async with _channel(server.sockets.dra) as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(
            dra_v1_pb2.NodePrepareResourcesRequest(claims=request_claims)
        )
        # Every claim asked for has an entry; failures are per claim.
        assert set(response.claims) == {"uid-whole", "uid-frac", "uid-bad", "uid-gone"}
        whole = response.claims["uid-whole"]
        assert whole.error == ""
        assert [(d.pool_name, d.device_name, list(d.request_names)) for d in whole.devices] == [
            (NODE, "gpu-0", ["gpu"])
        ]
        assert list(whole.devices[0].cdi_device_ids) == [f"k8s.{DRIVER}/claim=uid-whole-gpu-0"]
        assert not whole.devices[0].HasField("share_id")
        frac = response.claims["uid-frac"]
        assert frac.error == "" and frac.devices[0].share_id == "s-1"
        assert "bogus: Extra inputs are not permitted" in response.claims["uid-bad"].error
        assert "404" in response.claims["uid-gone"].error

        spec_file = server.sockets.dra.parents[2] / "cdi" / f"k8s.{DRIVER}-claim_uid-frac.json"
        env = json.loads(spec_file.read_text())["containerEdits"]["env"]
        assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in env
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env

        unprepared = await stub.NodeUnprepareResources(
            dra_v1_pb2.NodeUnprepareResourcesRequest(claims=request_claims)
        )
        assert {uid: r.error for uid, r in unprepared.claims.items()} == {
            "uid-whole": "",
            "uid-frac": "",
            "uid-bad": "",
            "uid-gone": "",
        }
        assert not spec_file.exists()


async def test_prepare_v1beta1(plugin: tuple[DraPlugin, DeviceInventory]) -> None:
    server, _ = plugin
    async with _channel(server.sockets.dra) as channel:
        stub = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
        claim_ref = dra_v1beta1_pb2.Claim(namespace="ns", uid="uid-frac", name="frac")
        response = await stub.NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim_ref])
        )
        assert [d.device_name for d in response.claims["uid-frac"].devices] == ["gpu-1"]
        # Same request again: idempotent, same answer.
        again = await stub.NodePrepareResources(
            dra_v1beta1_pb2.NodePrepareResourcesRequest(claims=[claim_ref])
        )
        assert again == response


async def test_health_stream_reports_changes(plugin: tuple[DraPlugin, DeviceInventory]) -> None:
    server, inventory = plugin
    async with _channel(server.sockets.dra) as channel:
        stream = health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1_pb2.NodeWatchResourcesRequest()
        )
        first = await asyncio.wait_for(stream.read(), 10)
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
            (NODE, "gpu-0", health_v1_pb2.HEALTHY),
            (NODE, "gpu-1", health_v1_pb2.HEALTHY),
        ]
        inventory.update([gpu(0), gpu(1, healthy=False)])
        second = await asyncio.wait_for(stream.read(), 10)
        sick = second.devices[1]
        assert (sick.device.device_name, sick.health, sick.message) == (
            "gpu-1",
            health_v1_pb2.UNHEALTHY,
            "XID 79",
        )
        assert sick.health_check_timeout_seconds > 0
        stream.cancel()


async def test_stale_socket_is_replaced_but_other_files_are_not(root: Path, claims: FakeClaims) -> None:

    def make() -> DraPlugin:
        return make_plugin(root, claims, [gpu(0)])[0]

    stale = make().sockets.registration
    stale.parent.mkdir(parents=True)
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(str(stale))
    leftover.close()  # a dead socket file, as a crashed driver leaves it
    server = make()
    await server.start()
    async with _channel(stale) as channel:
        info = await registration_pb2_grpc.RegistrationStub(channel).GetInfo(registration_pb2.InfoRequest())
        assert info.name == DRIVER
    await server.stop(grace_s=0)

    stale.write_text("not a socket")
    with pytest.raises(FileExistsError, match="not a socket"):
        await make().start()


async def test_too_long_socket_path_is_a_clear_error(claims: FakeClaims) -> None:
    deep = Path("/tmp") / ("d" * 120)
    plugin = make_plugin(deep, claims, [gpu(0)])[0]
    with pytest.raises(ValueError, match="unix sockets allow at most 107"):
        await plugin.start()
    assert not deep.exists(), "nothing is created for a path that cannot work"
