"""`tessera-extender`: run the kube-scheduler extender service.

Flags fall back to TESSERA_EXTENDER_* environment variables, so a Deployment can configure it
either way. Without --kubeconfig (or KUBECONFIG) it uses the in-cluster service account.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Sequence

from aiohttp import web
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient

from contract.names import DRIVER_NAME
from extender.server import (
    DEFAULT_MAX_BODY_BYTES,
    METRICS_KEY,
    STATE_KEY,
    ExtenderService,
    ServiceOptions,
    handle_healthz,
    handle_metrics,
    handle_readyz,
    server_ssl_context,
)
from extender.state import ClusterState, StateConfig

log = logging.getLogger("extender")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TESSERA_EXTENDER_{name}", default)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tessera-extender", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG", os.environ.get("KUBECONFIG")),
        help="kubeconfig file; default: in-cluster service account",
    )
    parser.add_argument("--listen-address", default=_env("LISTEN_ADDRESS", "0.0.0.0"))
    parser.add_argument(
        "--port", type=int, default=int(_env("PORT", "8888") or 8888), help="listen port (0: pick a free one)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "0") or 0),
        help="also serve /metrics, /healthz and /readyz over plain HTTP on this port, for Prometheus "
        "and kubelet probes that cannot present the scheduler's client certificate (0: off)",
    )
    parser.add_argument("--tls-cert-file", default=_env("TLS_CERT_FILE"))
    parser.add_argument("--tls-key-file", default=_env("TLS_KEY_FILE"))
    parser.add_argument(
        "--tls-client-ca-file",
        default=_env("TLS_CLIENT_CA_FILE"),
        help="require scheduler client certificates signed by this CA",
    )
    parser.add_argument(
        "--gpu-driver",
        action="append",
        default=None,
        help=f"DRA driver whose devices are GPUs (repeatable; default {DRIVER_NAME})",
    )
    parser.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        help="count pending pods of these schedulers as queue demand (repeatable; default all)",
    )
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--queue-status-interval", type=float, default=2.0, help="seconds between Queue status updates"
    )
    parser.add_argument(
        "--log-level", default=_env("LOG_LEVEL", "INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        parser.error("--tls-cert-file and --tls-key-file go together")
    if args.tls_client_ca_file and not args.tls_cert_file:
        parser.error("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
    if args.metrics_port and args.metrics_port == args.port:
        parser.error("--metrics-port must differ from --port")
    return args


def operations_app(service: ExtenderService) -> web.Application:
    """/metrics, /healthz and /readyz of a running service: no verb, so no authentication needed."""
    app = web.Application()
    app[STATE_KEY] = service.state
    app[METRICS_KEY] = service.metrics
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/readyz", handle_readyz)
    return app


async def _api_client(kubeconfig: str | None) -> ApiClient:
    if kubeconfig:
        await kube_config.load_kube_config(config_file=kubeconfig)
    else:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    return ApiClient()


async def run(args: argparse.Namespace) -> None:
    state = ClusterState(
        StateConfig(
            gpu_drivers=frozenset(args.gpu_driver or [DRIVER_NAME]),
            scheduler_names=frozenset(args.scheduler_name or []),
        )
    )
    options = ServiceOptions(
        host=args.listen_address,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        ssl_context=(
            server_ssl_context(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
            if args.tls_cert_file
            else None
        ),
        queue_status_interval_s=args.queue_status_interval,
        state=state,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with await _api_client(args.kubeconfig) as api:
        service = ExtenderService(api, options)
        await service.start()
        operations = web.AppRunner(operations_app(service), access_log=None)
        if args.metrics_port:
            await operations.setup()
            await web.TCPSite(operations, args.listen_address, args.metrics_port).start()
            log.info("metrics and health on %s:%d (plain HTTP)", args.listen_address, args.metrics_port)
        await stop.wait()
        log.info("shutting down")
        await operations.cleanup()
        await service.stop()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
