"""``tessera-dra-driver``: the per-node DRA driver process (discovery, ResourceSlices, kubelet plugin).

Runs until SIGTERM/SIGINT: publishes the node's devices (found by the device profile that
``--backend`` names) as ResourceSlices and keeps them current, serves the kubelet plugin sockets,
and answers ``/healthz`` and ``/metrics`` over HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from aiohttp import web
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, Configuration
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from contract.gpuconfig import SharingStrategy
from contract.names import DRIVER_NAME
from dra_driver.checkpoint import read_claims
from dra_driver.config import (
    DEFAULT_CDI_DIR,
    DEFAULT_CHECKPOINT_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_REGISTRY_DIR,
    DriverConfig,
)
from dra_driver.devices.model import Gpu
from dra_driver.devices.profile import BackendUnavailable, DeviceProfile
from dra_driver.plugin import serve_plugin
from dra_driver.prepare import without_driver_instances
from dra_driver.profiles.registry import PROFILES, build_profile
from dra_driver.slices import SharingMode, SliceReconciler

log = logging.getLogger("dra_driver")


def parse_args(argv: Sequence[str] | None = None) -> DriverConfig:
    parser = argparse.ArgumentParser(
        prog="tessera-dra-driver", description="Tessera DRA driver for GPUs and accelerators (one per node)."
    )
    parser.add_argument(
        "--node-name", default=os.environ.get("NODE_NAME", ""), help="this node (env NODE_NAME)"
    )
    parser.add_argument("--driver-name", default=DRIVER_NAME)
    parser.add_argument(
        "--backend", choices=sorted(PROFILES), default="nvml", help="the device profile (default: nvml)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="the device profile's settings: simulated GPUs (a YAML file or a shipped name), pci settings",
    )
    parser.add_argument("--kubeconfig", type=Path, help="default: in-cluster service account")
    parser.add_argument("--plugin-dir", type=Path, default=DEFAULT_PLUGIN_DIR)
    parser.add_argument("--registry-dir", type=Path, default=DEFAULT_REGISTRY_DIR)
    parser.add_argument("--cdi-dir", type=Path, default=DEFAULT_CDI_DIR)
    parser.add_argument("--checkpoint-dir", type=Path, default=DEFAULT_CHECKPOINT_DIR)
    parser.add_argument(
        "--sharing-mode",
        choices=["auto", "consumable-capacity", "whole-device"],
        default="auto",
        help="auto: probe the apiserver for consumable capacity",
    )
    parser.add_argument(
        "--mig-mode",
        choices=["auto", "dynamic", "static"],
        default="auto",
        help="auto: probe the apiserver for partitionable devices (MIG partitions made on demand)",
    )
    parser.add_argument("--http-port", type=int, default=0, help="/healthz and /metrics; 0 disables")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    if not args.node_name:
        parser.error("--node-name (or the NODE_NAME environment variable) is required")
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    try:
        return DriverConfig(
            node_name=args.node_name,
            driver_name=args.driver_name,
            backend=args.backend,
            profile=args.profile,
            kubeconfig=args.kubeconfig,
            plugin_dir=args.plugin_dir,
            registry_dir=args.registry_dir,
            cdi_dir=args.cdi_dir,
            checkpoint_dir=args.checkpoint_dir,
            sharing_mode=args.sharing_mode,
            mig_mode=args.mig_mode,
            health_port=args.http_port,
        )
    except ValidationError as exc:
        parser.error(str(exc))


async def kube_client(kubeconfig: Path | None) -> ApiClient:
    configuration = Configuration()
    if kubeconfig is None:
        kube_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return ApiClient(configuration)


async def start_http(port: int, ready: asyncio.Event) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(
            text="ok" if ready.is_set() else "starting", status=200 if ready.is_set() else 503
        )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, port=port).start()
    return runner


def publishing_mode(config: DriverConfig, profile: DeviceProfile) -> SharingMode | None:
    """The forced slice publishing mode; None probes the apiserver. A profile that cannot share
    a device in fractions publishes whole devices, so the scheduler hands out no fraction."""
    if SharingStrategy.MPS not in profile.strategies:
        return SharingMode.WHOLE_DEVICE
    return None if config.sharing_mode == "auto" else SharingMode(config.sharing_mode)


def partition_publishing(config: DriverConfig) -> bool | None:
    """Whether GPUs in MIG mode publish their placements (partitions made on demand); None probes
    the apiserver for partitionable devices."""
    return None if config.mig_mode == "auto" else config.mig_mode == "dynamic"


def driver_instances_hidden(checkpoint_dir: Path) -> Callable[[Sequence[Gpu]], list[Gpu]]:
    """What the slices publish of an inventory: the MIG instances this driver made left out, by
    the records on disk read at each publish (the plugin writes them; the first publish comes
    after its recovery, which restores the claims a damaged checkpoint lost)."""

    def published(gpus: Sequence[Gpu]) -> list[Gpu]:
        return without_driver_instances(gpus, read_claims(checkpoint_dir).values())

    return published


async def _set_after(event: asyncio.Event, *preconditions: asyncio.Event) -> None:
    for precondition in preconditions:
        await precondition.wait()
    event.set()


async def run_driver(config: DriverConfig, stop: asyncio.Event) -> None:
    """Wire discovery, slices and the kubelet plugin; return after ``stop`` is set."""
    profile = build_profile(
        config.backend, config.profile, node_name=config.node_name, state_dir=config.checkpoint_dir
    )
    gpus = profile.discovery.inventory()
    log.info("discovered %d GPU(s) on %s: %s", len(gpus), config.node_name, [g.product_name for g in gpus])
    api = await kube_client(config.kubeconfig)
    ready = asyncio.Event()
    runner = await start_http(config.health_port, ready) if config.health_port else None
    reconciler = SliceReconciler(
        api,
        config.node_name,
        config.driver_name,
        profile.discovery,
        mode=publishing_mode(config, profile),
        partitionable=partition_publishing(config),
        published=driver_instances_hidden(config.checkpoint_dir),
    )
    try:
        async with asyncio.TaskGroup() as group:
            # The plugin starts by recovering the checkpoint (claims adopted from their CDI specs,
            # interrupted ones rolled back): the slices are built on what it leaves, so they
            # publish after it, and the driver is ready once both are done.
            plugin_started = asyncio.Event()
            serving = group.create_task(
                serve_plugin(
                    config,
                    profile,
                    api,
                    stop,
                    started=plugin_started,
                    # MIG instances made, destroyed or found by a prepare: publish what is there.
                    instances_changed=reconciler.request_republish,
                ),
                name="plugin",
            )
            slices = group.create_task(reconciler.run(start_after=plugin_started), name="slices")
            readiness = group.create_task(
                _set_after(ready, plugin_started, reconciler.published_once), name="readiness"
            )
            await stop.wait()
            readiness.cancel()  # a stop while the plugin waits for a previous instance
            slices.cancel()
            await serving
    finally:
        if runner is not None:
            await runner.cleanup()
        await api.close()
    log.info("driver stopped")


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_driver(config, stop)

    try:
        asyncio.run(run())
    except BackendUnavailable as exc:
        log.error("%s", exc)
        return 2
    except ExceptionGroup as group:  # a task of the driver failed; say what, without a traceback
        for error in group.exceptions:
            log.error("driver failed: %s: %s", type(error).__name__, error)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
