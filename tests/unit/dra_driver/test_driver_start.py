"""The driver process's start order (``run_driver``): the first ResourceSlice publish comes after
the plugin's recovery of the checkpoint, and ``/healthz`` says ready only once those slices are
in the API.

The slices tell the driver's own MIG instances from an administrator's by the claims the
checkpoint records. A checkpoint moved aside (what the driver asks when both slots are damaged)
records none until recovery adopts the claims from their CDI specs; published before that, the
instance a running pod holds is an "admin's instance", free to allocate to a second pod. The
apiserver is a local aiohttp stand-in holding slice writes on request; the simulated GPUs list
every instance there is, as NVML does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from dra_driver import __main__ as driver_main
from dra_driver.config import DriverConfig
from tessera.dev.localcluster import wait_until
from tests.unit.dra_driver.fakes import DRIVER, NODE
from tests.unit.dra_driver.test_mig import (
    GPU0,
    ONE_G,
    CrashingRunner,
    instances,
    mig_claims,
    mig_preparer,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class FakeApiServer:
    """ResourceSlices kept in memory (dry runs echoed), no Node (404), events accepted. While
    ``hold`` is unset, the first slice write waits: ``holding`` says one arrived."""

    stored: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: list[dict[str, Any]] = field(default_factory=list)  # every slice write, in order
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    async def _write(self, body: dict[str, Any]) -> web.Response:
        self.holding.set()
        await self.hold.wait()
        body["metadata"]["resourceVersion"] = str(len(self.written) + 1)
        self.written.append(body)
        self.stored[body["metadata"]["name"]] = body
        return web.json_response(body, status=201)

    async def create_slice(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.query.get("dryRun"):
            return web.json_response(body, status=201)
        return await self._write(body)

    async def replace_slice(self, request: web.Request) -> web.Response:
        return await self._write(await request.json())

    async def list_slices(self, _: web.Request) -> web.Response:
        return web.json_response({"items": list(self.stored.values())})

    async def delete_slice(self, request: web.Request) -> web.Response:
        return web.json_response(self.stored.pop(request.match_info["name"]))

    async def node(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)

    async def event(self, request: web.Request) -> web.Response:
        return web.json_response(await request.json(), status=201)

    def devices(self) -> list[str]:
        return [d["name"] for s in self.stored.values() for d in s["spec"].get("devices", ())]


def write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "fake", "user": {"token": "fake"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                "current-context": "fake",
            }
        )
    )


@contextlib.asynccontextmanager
async def fake_apiserver(server: FakeApiServer, kubeconfig: Path) -> AsyncIterator[None]:
    app = web.Application()
    app.router.add_post(SLICES, server.create_slice)
    app.router.add_get(SLICES, server.list_slices)
    app.router.add_put(SLICES + "/{name}", server.replace_slice)
    app.router.add_delete(SLICES + "/{name}", server.delete_slice)
    app.router.add_get("/api/v1/nodes/{name}", server.node)
    app.router.add_post("/api/v1/namespaces/{namespace}/events", server.event)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    write_kubeconfig(kubeconfig, f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        yield
    finally:
        server.hold.set()
        await runner.cleanup()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def healthz(port: int) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/healthz") as response,
    ):
        return response.status


async def test_the_first_publish_waits_for_recovery_and_ready_waits_for_the_publish(
    root: Path,
) -> None:
    # The 1g claim's instance (GPU instance 1 at memory slice 0) is made and recorded; then the
    # checkpoint's slots are moved aside, as the driver asks when both are damaged.
    await mig_preparer(root, mig_claims(), CrashingRunner()).prepare([ONE_G])
    assert instances(root) == {GPU0: {1: ("1g.10gb", 0, [0])}}
    for slot in (root / "state").glob("checkpoint.*.json"):
        slot.rename(slot.with_name(slot.name + ".aside"))

    port = free_port()
    config = DriverConfig(
        node_name=NODE,
        driver_name=DRIVER,
        backend="simulated",
        # the GPUs of two_h100s(); discovery lists every instance the simulated GPUs' state file
        # in the checkpoint directory holds, as NVML lists every instance there is
        profile=Path("h100x2-mig"),
        kubeconfig=root / "kubeconfig",
        plugin_dir=root / "plugins",
        registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        checkpoint_dir=root / "state",
        sharing_mode="whole-device",
        mig_mode="dynamic",
        health_port=port,
    )
    server = FakeApiServer()
    stop = asyncio.Event()
    async with fake_apiserver(server, config.kubeconfig or root / "kubeconfig"):
        driver = asyncio.create_task(driver_main.run_driver(config, stop))
        try:
            await asyncio.wait_for(server.holding.wait(), 10)  # the first slice write, held
            # Not ready while the slices are being written (the plugin serves already: the
            # first publish comes after its recovery).
            assert (root / "plugins" / DRIVER / "dra.sock").exists()
            assert await healthz(port) == 503
            server.hold.set()

            async def ready() -> bool:
                return await healthz(port) == 200

            await wait_until(ready, timeout=10, interval=0.05, what="/healthz answers 200")
            # Ready: the claim was adopted from its spec, so its instance is the driver's, not
            # published as someone else's (gpu-0-mig-1-0); its placement's device stands for it
            # (the scheduler counts the claim's allocation against the counters).
            on_gpu0 = [name for name in server.devices() if name.startswith("gpu-0")]
            assert "gpu-0-mig-1-0" not in on_gpu0 and len(on_gpu0) == 18
            published = [d["name"] for s in server.written for d in s["spec"].get("devices", ())]
            assert "gpu-0-mig-1-0" not in published  # in no write, the first included
        finally:
            stop.set()
            await asyncio.wait_for(driver, 10)
