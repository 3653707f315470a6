"""Benchmark: filter latency on the verbs' port while AdmissionReviews flood the webhook port.

The server is the extender's two ports as deployed: the verbs over a synthetic picture
(`bench.servers.tessera_app`) and the admission webhooks in their own process
(`extender.webhook_process`: the `process` arrangement, the product). For contrast, `shared` serves
the webhooks on the verbs' event loop, as before they had a process of their own. The webhooks'
API client points at a closed port: their lookups fail at once, so what a review costs is what
the port does with it (TLS aside: plain HTTP here), mostly decoding it.

In the same run, per arrangement: filter requests (node names, a new pending pod each, one at a
time) are timed for `--seconds` in all with nothing else running, and as long while `--senders`
processes post large valid reviews (a pod with `--review-kib` KiB of environment, `--concurrency`
at once each) as fast as they are answered. Quiet and flooded phases alternate (ROUNDS of each),
so that whatever else the machine runs weighs on both. Printed: filter p50 and p99 quiet and
flooded, the ratio of the p99s (the target: within 2x, `process`), reviews answered per second,
the p99 of those answered 200 (the API server waits 5 s at most) and the statuses (503: over
the webhooks' limit of reviews in flight).

The senders run at the lowest priority (nice 19): in a cluster they are elsewhere (the API
server, or whoever reaches the port), not on the extender's CPUs; here they share the machine.
The webhook process nices itself (`WEBHOOK_NICENESS`).

    python -m bench.webhookflood [--nodes 500] [--seconds 12] [--senders 2] [--review-kib 2048]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from extender.metrics import ExtenderMetrics
from extender.picture.cluster import ClusterPicture
from extender.server import PICTURE_KEY
from extender.serving import SERVER_SETTINGS
from extender.webhook import MUTATE_PODS_PATH, WebhookOptions, webhook_app
from extender.webhook_process import WebhookProcess, WebhookProcessConfig
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import Payloads
from .picture import pod_object
from .servers import tessera_app

ARRANGEMENTS = ("process", "shared")
NOWHERE = "http://127.0.0.1:1"  # the webhooks' API server: nothing listens
KUBECONFIG = f"""apiVersion: v1
kind: Config
clusters: [{{name: none, cluster: {{server: "{NOWHERE}"}}}}]
users: [{{name: none, user: {{token: none}}}}]
contexts: [{{name: none, context: {{cluster: none, user: none}}}}]
current-context: none
"""
WARM_UP = 20
ROUNDS = 6
SENDER_NICENESS = 19


def review(kib: int) -> bytes:
    """A valid AdmissionReview of a pod CREATE, about `kib` KiB (its container's environment)."""
    pod = pod_object("flood", "default", None)
    pod["spec"]["containers"][0]["env"] = [{"name": f"VAR_{i}", "value": "x" * 100} for i in range(kib * 8)]
    request = {
        "uid": "flood",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "namespace": "flood",
        "operation": "CREATE",
        "object": pod,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


# -- the server (a child process) -------------------------------------------------------------


async def _serve(arrangement: str, nodes: int, pods: int) -> None:
    api = ApiClient()
    app, _ = tessera_app(nodes, pods, api)
    runner = web.AppRunner(app, access_log=None, **SERVER_SETTINGS)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    options = WebhookOptions(host="127.0.0.1", port=0)
    webhooks: WebhookProcess | web.AppRunner
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as kubeconfig:
        kubeconfig.write(KUBECONFIG)
        kubeconfig.flush()
        if arrangement == "process":
            webhooks = WebhookProcess(WebhookProcessConfig(options, app[PICTURE_KEY].config, kubeconfig.name))
            webhook_port = await webhooks.start()
        else:
            nowhere = ApiClient(Configuration(host=NOWHERE))
            shared = webhook_app(nowhere, app[PICTURE_KEY], ExtenderMetrics(ClusterPicture()), options)
            webhooks = web.AppRunner(shared, access_log=None, **SERVER_SETTINGS)
            await webhooks.setup()
            await web.TCPSite(webhooks, "127.0.0.1", 0).start()
            webhook_port = int(webhooks.addresses[0][1])
        print(f"READY {runner.addresses[0][1]} {webhook_port}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes
        if isinstance(webhooks, WebhookProcess):
            await webhooks.stop()
        else:
            await webhooks.cleanup()
            await nowhere.close()
    await runner.cleanup()
    await api.close()


# -- a flood sender (a child process) ---------------------------------------------------------


async def _flood(url: str, concurrency: int, kib: int, seconds: float) -> None:
    body = review(kib)
    statuses: Counter[str] = Counter()
    answered_ms: list[float] = []  # of the reviews answered 200
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def sender() -> None:
            while time.monotonic() < deadline:
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body) as response:
                        await response.read()
                        statuses[str(response.status)] += 1
                    if response.status == 200:
                        answered_ms.append((time.perf_counter() - started) * 1000)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1

        await asyncio.gather(*(sender() for _ in range(concurrency)))
    print(json.dumps({"statuses": statuses, "answered_ms": answered_ms}), flush=True)


# -- the measurement --------------------------------------------------------------------------


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(pct / 100 * len(ordered)))]


async def _filters(url: str, payloads: Payloads, seconds: float, first: int) -> list[float]:
    """Milliseconds of each filter, one at a time, for `seconds`."""
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + seconds
        cycle = first
        gc.disable()  # the client's own collections would land in the timings
        while time.monotonic() < deadline or len(latencies) < WARM_UP + 5:
            body = payloads.body(cycle)
            started = time.perf_counter()
            async with session.post(f"{url}/filter", data=body) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"filter answered {response.status}")
            latencies.append((time.perf_counter() - started) * 1000)
            cycle += 1
            if cycle % 50 == 0:
                gc.collect()
        gc.enable()
    return latencies[WARM_UP:]


@dataclass(frozen=True)
class FloodRow:
    arrangement: str
    quiet_p50: float
    quiet_p99: float
    flood_p50: float
    flood_p99: float
    reviews_per_s: float
    review_p99: float  # ms, of the reviews answered 200
    statuses: dict[str, int]

    @property
    def ratio(self) -> float:
        return self.flood_p99 / self.quiet_p99


def _spawn(*args: str, nice: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.webhookflood", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )


def run_flood(
    arrangement: str,
    nodes: int,
    pods: int,
    seconds: float,
    senders: int,
    concurrency: int,
    kib: int,
    rounds: int = ROUNDS,
) -> FloodRow:
    server = _spawn("serve", arrangement, "--nodes", str(nodes), "--pods", str(pods))
    try:
        assert server.stdout is not None
        ready = server.stdout.readline().split()
        if not ready or ready[0] != "READY":
            raise RuntimeError(f"bench server failed to start (exit {server.poll()})")
        verbs, webhook = f"http://127.0.0.1:{ready[1]}", f"http://127.0.0.1:{ready[2]}{MUTATE_PODS_PATH}"
        payloads = Payloads(nodes, "names")
        # Quiet and flooded phases alternate, so that what else the machine runs weighs on both.
        quiet: list[float] = []
        flooded: list[float] = []
        statuses: Counter[str] = Counter()
        answered: list[float] = []
        phase_s = seconds / rounds
        flood_s = phase_s + 2.0  # the senders ramp up before, and still send after, the timing
        for _ in range(rounds):
            quiet += asyncio.run(_filters(verbs, payloads, phase_s, len(quiet) + len(flooded)))
            floods = [
                _spawn("flood", webhook, str(concurrency), str(kib), str(flood_s), nice=SENDER_NICENESS)
                for _ in range(senders)
            ]
            time.sleep(1.0)
            flooded += asyncio.run(_filters(verbs, payloads, phase_s, len(quiet) + len(flooded)))
            for flood in floods:
                out, _ = flood.communicate(timeout=120)
                report = json.loads(out.strip().splitlines()[-1])
                statuses.update(report["statuses"])
                answered += report["answered_ms"]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=60)
    return FloodRow(
        arrangement,
        _percentile(quiet, 50),
        _percentile(quiet, 99),
        _percentile(flooded, 50),
        _percentile(flooded, 99),
        sum(statuses.values()) / (flood_s * rounds),
        _percentile(answered, 99) if answered else float("nan"),
        dict(statuses),
    )


def flood_table(rows: Sequence[FloodRow]) -> str:
    headers = [
        "webhooks",
        "quiet p50 ms",
        "quiet p99 ms",
        "flood p50 ms",
        "flood p99 ms",
        "p99 flood / quiet",
        "reviews/s",
        "review p99 ms",
        "statuses",
    ]
    body = [
        [
            row.arrangement,
            f"{row.quiet_p50:.2f}",
            f"{row.quiet_p99:.2f}",
            f"{row.flood_p50:.2f}",
            f"{row.flood_p99:.2f}",
            f"{row.ratio:.2f}x",
            f"{row.reviews_per_s:.1f}",
            f"{row.review_p99:.0f}",
            " ".join(f"{status}:{count}" for status, count in sorted(row.statuses.items())),
        ]
        for row in rows
    ]
    return format_table(headers, body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhookflood", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    serve = sub.add_parser("serve")
    serve.add_argument("arrangement", choices=ARRANGEMENTS)
    serve.add_argument("--nodes", type=int, default=500)
    serve.add_argument("--pods", type=int, default=5000)
    flood = sub.add_parser("flood")
    flood.add_argument("url")
    flood.add_argument("concurrency", type=int)
    flood.add_argument("kib", type=int)
    flood.add_argument("seconds", type=float)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=12.0, help="filter timing, quiet and again flooded")
    parser.add_argument("--senders", type=int, default=2, help="flood processes")
    parser.add_argument("--concurrency", type=int, default=24, help="reviews in flight per sender")
    parser.add_argument("--review-kib", type=int, default=2048, help="size of each review")
    parser.add_argument("--arrangements", default=",".join(ARRANGEMENTS))
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="quiet and flooded phases, alternating")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.smoke:
        args.nodes, args.pods, args.seconds = 50, 400, 1.0
        args.senders, args.concurrency, args.review_kib, args.rounds = 1, 4, 256, 1
    if args.role == "serve":
        asyncio.run(_serve(args.arrangement, args.nodes, args.pods))
        return 0
    if args.role == "flood":
        asyncio.run(_flood(args.url, args.concurrency, args.kib, args.seconds))
        return 0
    print(
        f"\nFilter latency ({args.nodes} nodes, names) with nothing else, then with {args.senders} x "
        f"{args.concurrency} reviews of {args.review_kib} KiB in flight on the webhook port"
    )
    rows = [
        run_flood(
            arrangement,
            args.nodes,
            args.pods,
            args.seconds,
            args.senders,
            args.concurrency,
            args.review_kib,
            args.rounds,
        )
        for arrangement in args.arrangements.split(",")
    ]
    print(flood_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
