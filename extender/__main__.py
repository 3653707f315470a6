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
import socket
from collections.abc import Sequence

from aiohttp import web

from contract.names import ADMISSION_GATE, DRIVER_NAME, NAMESPACE_SCHEDULER_LABEL, PREEMPTIBLE_LABEL
from extender.controllers.consolidate import ConsolidationOptions
from extender.controllers.endpoint import Advertise
from extender.controllers.evictions import EvictionLimits
from extender.controllers.history import HISTORY_SAMPLE_S, HistoryOptions
from extender.controllers.reclaim import ReclaimOptions
from extender.picture.cluster import ClusterPicture, PictureConfig
from extender.policy.backfill import DEFAULT_HOLD_BACK_AFTER_S
from extender.policy.history import DEFAULT_K, DEFAULT_UPDATE_PERIOD_S, DEFAULT_WINDOW_S, HistoryParams
from extender.policy.topology import DEFAULT_TOPOLOGY, Topology, parse_topology
from extender.queues import parse_duration
from extender.rule_flags import add_rule_flags, rule_flags
from extender.server import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CANDIDATE_NODES, operations_app
from extender.service import ExtenderService, ServiceOptions
from extender.serving import SERVER_SETTINGS, server_ssl_context
from extender.webhook import WebhookOptions
from extender.webhook_process import WebhookTLS, api_client

log = logging.getLogger("extender")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"TESSERA_EXTENDER_{name}", default)


def _topology(text: str) -> Topology:
    try:
        return parse_topology(text)
    except ValueError as exc:  # argparse turns this into a usage error naming the flag
        raise argparse.ArgumentTypeError(str(exc)) from exc


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
    parser.add_argument(
        "--non-preemptible-priority",
        type=int,
        default=100,
        help="pods at or above this priority may not be evicted by reclaim and stay within their "
        f"queue's quota, unless their {PREEMPTIBLE_LABEL} label says otherwise (default 100)",
    )
    parser.add_argument(
        "--reclaim-interval",
        type=float,
        default=1.0,
        help="seconds between reclaim/preemption cycles; 0 turns reclaim off (default 1)",
    )
    parser.add_argument(
        "--reclaim-hold", type=float, default=90.0, help="seconds freed GPUs are held for their pod"
    )
    parser.add_argument(
        "--max-evictions-per-cycle", type=int, default=16, help="pods evicted per reclaim cycle at most"
    )
    parser.add_argument(
        "--recent-victim-s",
        type=float,
        default=60.0,
        help="seconds after its restart that a pod restarted after an eviction is no victim (default 60)",
    )
    add_rule_flags(parser)
    parser.add_argument(
        "--eviction-concurrency",
        type=int,
        default=16,
        help="reclaim and consolidation: Eviction API calls in flight at once (default 16)",
    )
    parser.add_argument(
        "--eviction-timeout",
        type=float,
        default=5.0,
        help="reclaim and consolidation: seconds an Eviction API call may take before it is given "
        "up (default 5)",
    )
    parser.add_argument(
        "--max-moves-per-cycle",
        type=int,
        default=4,
        help="consolidation: running pods moved per cycle at most so waiting pods fit; 0 turns "
        "consolidation off (default 4)",
    )
    parser.add_argument(
        "--max-moves-per-pod", type=int, default=2, help="consolidation: moves to serve one pod at most"
    )
    parser.add_argument(
        "--move-min-runtime",
        type=float,
        default=300.0,
        help="consolidation: seconds a pod has run before it may be moved (default 300)",
    )
    parser.add_argument(
        "--move-replace-timeout",
        type=float,
        default=120.0,
        help="consolidation: seconds within which a moved pod's successor must be bound, else reported",
    )
    parser.add_argument(
        "--drain-gpu-nodes",
        type=int,
        default=0,
        help="scale-down: GPU nodes to empty per cycle while nothing waits, by moving their pods, "
        "for a node autoscaler to remove (default 0: off)",
    )
    parser.add_argument(
        "--drain-hold", type=float, default=600.0, help="seconds an emptied GPU node is kept empty"
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="several replicas: only the holder of a Lease runs reclaim (see --lease-namespace)",
    )
    parser.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE", "tessera-system"),
        help="namespace of the leader Lease (default $POD_NAMESPACE, else tessera-system)",
    )
    parser.add_argument("--lease-name", default="tessera-extender")
    parser.add_argument(
        "--topology-levels",
        type=_topology,
        default=DEFAULT_TOPOLOGY,
        help="topology levels gangs may ask for, outermost first, name=node-label,... (default "
        "zone=topology.kubernetes.io/zone,clique=nvidia.com/gpu.clique,host=kubernetes.io/hostname)",
    )
    parser.add_argument(
        "--gang-hold-back-after",
        type=float,
        default=DEFAULT_HOLD_BACK_AFTER_S,
        metavar="SECONDS",
        help="once the first waiting gang has waited this long, later gangs are planned off the nodes "
        "it needs (docs/workloads.md, 'Gangs that come later'; default: off)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a leader's Lease holds without renewal; a standby takes over after it (default 15)",
    )
    parser.add_argument(
        "--advertise-service",
        default=_env("ADVERTISE_SERVICE"),
        help="with --leader-elect: the (selector-less) Service whose EndpointSlice the leader points "
        "at itself, so that the scheduler reaches only the leader",
    )
    parser.add_argument(
        "--advertise-address",
        default=os.environ.get("POD_IP"),
        help="this replica's address in that EndpointSlice (default $POD_IP)",
    )
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=int(_env("WEBHOOK_PORT", "0") or 0),
        help="serve the admission webhooks (pods, Queues, ResourceClaims) over TLS on this port (0: off)",
    )
    parser.add_argument(
        "--webhook-cert-file",
        default=_env("WEBHOOK_CERT_FILE"),
        help="the webhooks' serving certificate (default --tls-cert-file)",
    )
    parser.add_argument(
        "--webhook-key-file", default=_env("WEBHOOK_KEY_FILE"), help="its key (default --tls-key-file)"
    )
    parser.add_argument(
        "--webhook-client-ca-file",
        default=_env("WEBHOOK_CLIENT_CA_FILE"),
        help="require on the webhook port a client certificate signed by this CA: the API server's, "
        "which it presents when its --admission-control-config-file names a kubeconfig for the "
        "webhook's host (docs/install.md, 'Admission webhooks'); default: no client certificate",
    )
    parser.add_argument(
        "--webhook-scheduler-name",
        default=_env("WEBHOOK_SCHEDULER_NAME"),
        help=f"give pods of Namespaces labelled {NAMESPACE_SCHEDULER_LABEL}=true this schedulerName "
        "(Tessera's own scheduler profile); default: leave it",
    )
    parser.add_argument(
        "--no-admission-gate",
        dest="admission_gate",
        action="store_false",
        help=f"do not gate pods their queue holds back ({ADMISSION_GATE}); the filter still holds them",
    )
    parser.add_argument(
        "--config-driver",
        action="append",
        default=None,
        help=f"DRA driver whose opaque configs in ResourceClaims must be valid GpuConfigs "
        f"(repeatable; default {DRIVER_NAME})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"largest verb request body, compressed or decompressed; larger ones get 413 "
        f"(default {DEFAULT_MAX_BODY_BYTES // 2**20} MiB: NodeLists of whole Nodes need room; "
        "node names far less)",
    )
    parser.add_argument(
        "--max-candidate-nodes",
        type=int,
        default=DEFAULT_MAX_CANDIDATE_NODES,
        help=f"most candidate nodes a filter or prioritize may name; more get 413 "
        f"(default {DEFAULT_MAX_CANDIDATE_NODES}: twice the nodes Kubernetes supports in a cluster)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=15.0,
        help="seconds a connection may go without completing a request (idle or half-sent) before "
        "it is closed (default 15)",
    )
    parser.add_argument(
        "--fair-share-history",
        action="store_true",
        default=_env("FAIR_SHARE_HISTORY", "") == "true",
        help="fair share over time for every queue that does not turn it off (default: off; a "
        "queue's spec.fairShareHistory.enabled turns it on for its subtree)",
    )
    parser.add_argument(
        "--history-half-life",
        type=parse_duration,
        default=0.0,
        help="half-life of past usage, a duration such as 24h (default 0: no decay)",
    )
    parser.add_argument(
        "--history-window",
        type=parse_duration,
        default=DEFAULT_WINDOW_S,
        help="how far back usage counts, at most 7 days (default 168h)",
    )
    parser.add_argument(
        "--history-k", type=float, default=DEFAULT_K, help="kValue: the weight of past usage (default 1)"
    )
    parser.add_argument(
        "--history-update-period",
        type=float,
        default=DEFAULT_UPDATE_PERIOD_S,
        help="seconds between new weight factors and Queue status writes of the history (default 60)",
    )
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
    if args.eviction_concurrency < 1 or not args.eviction_timeout > 0:
        parser.error("--eviction-concurrency must be at least 1 and --eviction-timeout above 0")
    try:
        rule_flags(args)
    except ValueError as error:
        parser.error(str(error))
    args.webhook_cert_file = args.webhook_cert_file or args.tls_cert_file
    args.webhook_key_file = args.webhook_key_file or args.tls_key_file
    if args.webhook_port and not (args.webhook_cert_file and args.webhook_key_file):
        parser.error(
            "--webhook-port needs a certificate: --webhook-cert-file and --webhook-key-file "
            "(or --tls-cert-file and --tls-key-file): the API server calls webhooks over https only"
        )
    if args.webhook_client_ca_file and not args.webhook_port:
        parser.error("--webhook-client-ca-file needs --webhook-port")
    if args.webhook_port and args.webhook_port in (args.port, args.metrics_port):
        parser.error("--webhook-port must differ from --port and --metrics-port")
    if args.history_window <= 0 or not 0 <= args.history_k <= 100 or not args.history_update_period > 0:
        parser.error(
            "--history-window and --history-update-period must be above 0, --history-k between 0 and 100"
        )
    if args.advertise_service and not (args.leader_elect and args.advertise_address):
        parser.error("--advertise-service needs --leader-elect and --advertise-address (or $POD_IP)")
    return args


def picture_config(args: argparse.Namespace) -> PictureConfig:
    """What the picture is told by the flags."""
    return PictureConfig(
        gpu_drivers=frozenset(args.gpu_driver or [DRIVER_NAME]),
        scheduler_names=frozenset(args.scheduler_name or []),
        non_preemptible_priority=args.non_preemptible_priority,
        topology=args.topology_levels,
        hold_back_after_s=args.gang_hold_back_after,
        collect_for_owed=rule_flags(args).collect_for_owed,
    )


async def run(args: argparse.Namespace) -> None:
    picture = ClusterPicture(picture_config(args))
    evictions = EvictionLimits(concurrency=args.eviction_concurrency, timeout_s=args.eviction_timeout)
    options = ServiceOptions(
        host=args.listen_address,
        port=args.port,
        max_body_bytes=args.max_body_bytes,
        max_candidate_nodes=args.max_candidate_nodes,
        ssl_context=(
            server_ssl_context(args.tls_cert_file, args.tls_key_file, args.tls_client_ca_file)
            if args.tls_cert_file
            else None
        ),
        queue_status_interval_s=args.queue_status_interval,
        idle_timeout_s=args.idle_timeout,
        picture=picture,
        reclaim=(
            ReclaimOptions(
                interval_s=args.reclaim_interval,
                hold_s=args.reclaim_hold,
                max_evictions_per_cycle=args.max_evictions_per_cycle,
                recent_victim_s=args.recent_victim_s,
                rule_flags=rule_flags(args),
                evictions=evictions,
            )
            if args.reclaim_interval > 0
            else None
        ),
        consolidation=(
            ConsolidationOptions(
                min_runtime_s=args.move_min_runtime,
                max_moves_per_pod=args.max_moves_per_pod,
                max_moves_per_cycle=args.max_moves_per_cycle,
                hold_s=args.reclaim_hold,
                replace_timeout_s=args.move_replace_timeout,
                drain_nodes=args.drain_gpu_nodes,
                drain_hold_s=args.drain_hold,
                evictions=evictions,
            )
            if args.max_moves_per_cycle > 0
            else None
        ),
        lease=(
            (args.lease_namespace, args.lease_name, f"{socket.gethostname()}-{os.getpid()}")
            if args.leader_elect
            else None
        ),
        lease_duration_s=args.lease_duration,
        webhooks=(
            WebhookOptions(
                host=args.listen_address,
                port=args.webhook_port,
                scheduler_name=args.webhook_scheduler_name,
                gate=args.admission_gate,
                config_drivers=frozenset(args.config_driver or [DRIVER_NAME]),
            )
            if args.webhook_port
            else None
        ),
        webhook_tls=(
            WebhookTLS(args.webhook_cert_file, args.webhook_key_file, args.webhook_client_ca_file)
            if args.webhook_port
            else None
        ),
        kubeconfig=args.kubeconfig,
        history=HistoryOptions(
            HistoryParams(
                enabled=args.fair_share_history,
                half_life_s=args.history_half_life or None,
                window_s=args.history_window,
                k=args.history_k,
            ),
            sample_interval_s=min(HISTORY_SAMPLE_S, args.history_update_period),
            update_period_s=args.history_update_period,
        ),
        advertise=(
            Advertise(args.lease_namespace, args.advertise_service, args.advertise_address)
            if args.advertise_service
            else None
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with await api_client(args.kubeconfig) as api:
        service = ExtenderService(api, options)
        await service.start()
        operations = web.AppRunner(
            operations_app(
                service.picture,
                service.metrics,
                service.problem,
                service.webhook_process.metrics if service.webhook_process else None,
                service.waiting,
            ),
            access_log=None,
            **SERVER_SETTINGS,
        )
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
