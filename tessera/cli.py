"""`tessera` command line: `tessera up` (local cluster demo) and `tessera simulate`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import time
from pathlib import Path

from tessera.localcluster import REPO_ROOT, LocalCluster, api_client, create_fake_node

DEFAULT_STATE_DIR = REPO_ROOT / ".tessera" / "cluster"


def _up_parser(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = subcommands.add_parser(
        "up",
        help="run a local control plane with simulated GPU nodes until Ctrl-C",
        description="Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local "
        "processes, adds fake GPU nodes, and prints how to use the cluster. Ctrl-C tears it down.",
    )
    up.add_argument("--nodes", type=int, default=2, help="number of fake GPU nodes (default 2)")
    up.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where certificates, kubeconfig and logs go (default {DEFAULT_STATE_DIR})",
    )


async def _add_nodes(cluster: LocalCluster, count: int) -> list[str]:
    names = [f"gpu-node-{index}" for index in range(count)]
    client = await api_client(cluster.kubeconfig)
    try:
        for name in names:
            await create_fake_node(client, name, labels={"tessera.dev/simulated": "true"})
    finally:
        await client.close()
    return names


def _usage(cluster: LocalCluster, nodes: list[str]) -> str:
    return "\n".join(
        [
            "",
            f"Local Kubernetes control plane is up at {cluster.server}",
            f"  fake nodes: {', '.join(nodes)}",
            f"  logs:       {cluster.workdir / 'logs'}",
            "",
            "Use it from another shell:",
            f"  export KUBECONFIG={cluster.kubeconfig}",
            f"  export PATH={cluster.bin_dir}:$PATH",
            "  kubectl get nodes",
            "",
            "Press Ctrl-C to stop and remove everything.",
        ]
    )


def run_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    shutil.rmtree(state_dir, ignore_errors=True)
    print("[tessera] starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler", flush=True)
    with LocalCluster(workdir=state_dir) as cluster:
        nodes = asyncio.run(_add_nodes(cluster, args.nodes))
        print(_usage(cluster, nodes), flush=True)
        try:
            while all(c.process.poll() is None for c in cluster.components):
                time.sleep(1)
            print("[tessera] a component exited; see its log above", file=sys.stderr)
            print(cluster.logs(), file=sys.stderr)
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
        "simulate", help="replay a workload through the placement policies", add_help=False
    )
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if args.command == "simulate":
        from tessera.simulate.cli import main as simulate_main

        return simulate_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return run_up(args)
