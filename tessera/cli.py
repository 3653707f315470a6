"""`tessera` command line: `tessera up` (local cluster demo), `tessera simulate` and `tessera snapshot`
(`tessera simulate snapshot FILE` replays one: tessera.snapshot)."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from dra_driver.profiles.nvidia.simulated import PROFILE_DIR
from tessera import snapshot
from tessera.dev.demo import DEMO_DIR, DemoError, run_demo, summary
from tessera.dev.localcluster import (
    BLOCK_LABEL,
    RACK_LABEL,
    REPO_ROOT,
    ClusterError,
    LocalCluster,
    NodeLayout,
    free_port,
    node_layout,
)

DEFAULT_STATE_DIR = REPO_ROOT / ".tessera" / "cluster"
# The scheduler profile that calls the extender, named as the chart names it
# (charts/tessera values scheduler.schedulerName): the examples work here and after a Helm install.
TESSERA_SCHEDULER = "tessera"
# What `tessera up` installs before starting the components, in order.
INSTALL_FIRST = ("manifests/crds/queues.yaml", "manifests/deviceclasses.yaml", "manifests/default-queue.yaml")


def _up_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = subcommands.add_parser(
        "up",
        help="run a local cluster with simulated GPU nodes, the DRA driver and the extender until Ctrl-C",
        description="Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local "
        "processes, a second kube-scheduler (profile 'tessera') that calls the Tessera extender, and "
        "the DRA driver on fake GPU nodes, then prints how to use the cluster. Ctrl-C tears "
        "everything down.",
    )
    up.add_argument(
        "--demo",
        action="store_true",
        help="show three teams sharing the GPUs (a burst, borrowing, reclaim) live, then a summary; "
        "the cluster stays up afterwards",
    )
    up.add_argument(
        "--nodes",
        type=_layout,
        default=node_layout("2"),
        help="the fake GPU nodes: a count (default 2), or a topology layout RACKSxN or BLOCKSxRACKSxN "
        f"(2x4x4: 2 blocks of 4 racks of 4 nodes, labelled {BLOCK_LABEL} and {RACK_LABEL}; the "
        "extender's topology levels are block, rack, host)",
    )
    up.add_argument(
        "--profile",
        default="h100x8",
        help="simulated GPU profile of each node: a shipped name "
        f"({', '.join(sorted(p.stem for p in PROFILE_DIR.glob('*.yaml')))}) or a YAML file",
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where certificates, kubeconfig, logs and driver state go (default {DEFAULT_STATE_DIR})",
    )


def _layout(text: str) -> NodeLayout:
    try:
        return node_layout(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _profile_path(profile: str) -> Path:
    shipped = PROFILE_DIR / f"{profile}.yaml"
    return shipped if shipped.exists() else Path(profile)


# The scoring of the chart's scheduler profile (charts/tessera, scheduler.*; docs/install.md):
# every node scored, the plugins that spread by CPU and memory off for scoring, the extender at 5.
SCHEDULER_PROFILE: dict[str, object] = {
    "percentageOfNodesToScore": 100,
    "plugins": {
        "score": {"disabled": [{"name": "NodeResourcesFit"}, {"name": "NodeResourcesBalancedAllocation"}]}
    },
}
EXTENDER_WEIGHT = 5
# A local cluster's pods may be moved once they have run this long (the chart's default is 300 s).
# The DRA allocator now and then splits the demo's four quarter-GPU pods 3 + 1 over two GPUs; only
# a move of the lone quarter then gives team-a its last whole GPU, and a demo step waits 240 s.
LOCAL_MOVE_MIN_RUNTIME_S = 15


def extender_config(port: int) -> dict[str, object]:
    """The chart's extender entry, for a plain-HTTP extender on loopback."""
    return {
        "urlPrefix": f"http://127.0.0.1:{port}",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "preemptVerb": "preempt",
        "weight": EXTENDER_WEIGHT,
        "nodeCacheCapable": True,
        "enableHTTPS": False,
    }


def _start_tessera(cluster: LocalCluster, layout: NodeLayout, profile: Path) -> str:
    """Starts Tessera's parts on the cluster; returns the extender's URL (for `kubectl tessera`)."""
    nodes = list(layout.nodes)
    for manifest in INSTALL_FIRST:
        cluster.apply(REPO_ROOT / manifest)
    python = sys.executable
    extender_port, webhook_port = free_port(), free_port()
    # The admission webhooks (queue defaults, the admission gate, Queue and GpuConfig checks)
    # over HTTPS with a certificate of the cluster's CA, as the chart runs them.
    webhook_cert = cluster.webhook_certificate("tessera-extender")
    extender = cluster.spawn(
        "tessera-extender",
        [
            python,
            "-m",
            "extender",
            f"--kubeconfig={cluster.kubeconfig}",
            "--listen-address=127.0.0.1",
            f"--port={extender_port}",
            f"--scheduler-name={TESSERA_SCHEDULER}",
            "--queue-status-interval=1",
            f"--webhook-port={webhook_port}",
            f"--webhook-cert-file={webhook_cert.cert_path}",
            f"--webhook-key-file={webhook_cert.key_path}",
            f"--webhook-scheduler-name={TESSERA_SCHEDULER}",
            f"--move-min-runtime={LOCAL_MOVE_MIN_RUNTIME_S}",
            *([f"--topology-levels={layout.levels}"] if layout.levels else []),
        ],
    )
    cluster.wait_healthy(extender, f"http://127.0.0.1:{extender_port}/readyz", tls=False)
    cluster.register_webhooks(f"https://127.0.0.1:{webhook_port}")
    cluster.start_scheduler(TESSERA_SCHEDULER, [extender_config(extender_port)], profile=SCHEDULER_PROFILE)
    cluster.spawn(
        "tessera-node-agent",
        [
            python,
            "-m",
            "tessera.dev.nodeagent",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--profile={profile}",
            f"--state-dir={cluster.workdir / 'nodes'}",
            "--create-nodes",
            *(f"--node-name={node}" for node in nodes),
            *(
                f"--node-label={node}:{key}={value}"
                for node, labels in layout.nodes.items()
                for key, value in labels.items()
            ),
        ],
    )
    deadline = time.monotonic() + 60
    while len(_slices(cluster)) < len(nodes):
        if time.monotonic() > deadline:
            raise ClusterError(f"the DRA driver published no ResourceSlices:\n{cluster.logs()}")
        time.sleep(0.5)
    return f"http://127.0.0.1:{extender_port}"


def _slices(cluster: LocalCluster) -> list[str]:
    output = cluster.kubectl("get", "resourceslices", "-o", "name").stdout
    return output.split()


def _server_version(cluster: LocalCluster) -> str:
    version: str = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    return version


def _usage(cluster: LocalCluster, layout: NodeLayout, extender_url: str) -> str:
    nodes = list(layout.nodes)
    topology = (
        [f"  topology:       --topology-levels={layout.levels} (gangs ask e.g. topology-required: rack)"]
        if layout.levels
        else []
    )
    return "\n".join(
        [
            "",
            f"Tessera is up on a local Kubernetes {_server_version(cluster)} control plane"
            f" at {cluster.server}",
            f"  fake GPU nodes: {', '.join(nodes)} (DRA driver: simulated GPUs, kubelet stand-in)",
            *topology,
            f"  scheduler:      profile '{TESSERA_SCHEDULER}' calls the Tessera extender (filter, prioritize,"
            " preempt); pods opt in with schedulerName: tessera and name their queue with the"
            " label scheduling.tessera.dev/queue (on the pod, its Job or Deployment, or as the"
            " Namespace's default: label scheduling.tessera.dev/default-queue)",
            f"  logs:           {cluster.workdir / 'logs'}",
            "",
            "Use it from another shell:",
            # (kubectl finds the `kubectl-tessera` plugin beside this Python, in the venv.)
            f"  export KUBECONFIG={cluster.kubeconfig}"
            f" PATH={cluster.bin_dir}:{Path(sys.executable).parent}:$PATH",
            "  kubectl get nodes,resourceslices",
            "  kubectl describe resourceslice",
            "  kubectl get queues",
            "  kubectl get pods,resourceclaims -o wide",
            f"  kubectl tessera queues --extender-url {extender_url}   # also: why POD, gpus, position POD",
            "  kubectl apply -f manifests/examples/quarter-gpu.yaml     # a fractional GPU",
            "  kubectl apply -f manifests/examples/training-job.yaml    # a Job on whole GPUs",
            "",
            "Press Ctrl-C to stop and remove everything.",
        ]
    )


def run_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    shutil.rmtree(state_dir, ignore_errors=True)
    layout: NodeLayout = args.nodes
    print("[tessera] starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler", flush=True)
    with LocalCluster(workdir=state_dir) as cluster:
        print(
            "[tessera] installing the Queue CRD and DeviceClasses; starting the extender, its "
            f"scheduler profile '{TESSERA_SCHEDULER}' and the DRA driver",
            flush=True,
        )
        try:
            extender_url = _start_tessera(cluster, layout, _profile_path(args.profile))
            if args.demo:
                print(f"[tessera] demo: the workloads of {DEMO_DIR.relative_to(REPO_ROOT)}/, step by step\n")
                result = run_demo(cluster, sys.stdout)
                print("\n".join(summary(result)), flush=True)
            print(_usage(cluster, layout, extender_url), flush=True)
            while all(c.process.poll() is None for c in cluster.components):
                time.sleep(1)
            print("[tessera] a component exited; the tails of the logs follow", file=sys.stderr)
            print(cluster.logs(), file=sys.stderr)
            return 1
        except DemoError as error:
            print(f"[tessera] the demo failed: {error}\n{cluster.logs()}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("\n[tessera] stopping", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tessera", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subcommands = parser.add_subparsers(dest="command", required=True)
    _up_parser(subcommands)
    subcommands.add_parser(
        "simulate",
        help="replay a workload through the placement policies; `simulate snapshot FILE`: a snapshot",
        add_help=False,
    )
    subcommands.add_parser(
        "snapshot", help="write the objects the extender watches, from the API, to a file", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.command == "snapshot":
        return snapshot.snapshot_main(rest)
    if args.command == "simulate" and rest[:1] == ["snapshot"]:
        return snapshot.simulate_main(rest[1:])
    if args.command == "simulate":
        from tessera.simulate.cli import main as simulate_main

        return simulate_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return run_up(args)
