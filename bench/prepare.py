"""Benchmark 5: the DRA driver's NodePrepareResources / NodeUnprepareResources, as the kubelet calls
them, against a do-nothing gRPC server on the same socket.

The driver runs in its own process (``python -m bench.prepare serve driver``): the real kubelet
plugin (``dra_driver.plugin.build_plugin``: checkpoint, CDI specs, sharing, gRPC) for a simulated
8x H100 node, reading claims through the real API client from a small stand-in API server in the
benchmark process that answers each read at once. Its checkpoint and CDI directories are on the
benchmark's temp directory (a disk, like ``/var/lib``; a node's ``/var/run/cdi`` is usually tmpfs).
Every measured claim is new: a 1Gi fraction (MPS) of one of the GPUs, each of which already holds
one resident fraction, as on a busy node (so no MPS daemon starts in the measured calls). Per
request size (1, 10, 100 claims) the benchmark prepares, then unprepares, fresh claims, one request
at a time; then the floor process (``serve floor``, same socket path) answers the same requests
with one empty entry per claim: the cost of gRPC over a unix socket alone.

The MIG rows: one-claim requests of a 1g.10gb placement on an 8x H100 node in MIG mode (partitions
made on demand: each prepare lists the GPU's instances and makes a GPU instance with its compute
instance, two ``nvidia-smi mig`` commands answered by the simulated GPUs, and writes the
checkpoint twice, ``started`` before the create and ``completed`` after it; each unprepare lists,
destroys the compute and then the GPU instance, and writes it once), against the whole-GPU
baseline measured in the same run: one-claim requests of a whole H100 (exclusive: no command, one
checkpoint write).

The recovery row: the driver died while 150 claims (MPS fractions spread over the 8 GPUs) were
being prepared, so all 150 are ``started`` in its checkpoint. After the restart the driver rolls
them back and the kubelet prepares each pod's claim again (150 concurrent one-claim requests).
Measured in-process, with each sharing command costing ``SIMULATED_COMMAND_S`` (an
``nvidia-smi`` call is tens of milliseconds, mostly NVML start-up): once as the driver does it now
(``recover()`` rolls all of them back, each GPU reset once), and once as before (each claim
released on its own, so each finds its GPU idle and resets it again).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, Configuration

from dra_driver.checkpoint import Checkpoint
from dra_driver.devices.share import Command
from dra_driver.plugin import DeviceInventory, build_plugin
from dra_driver.prepare import ApiClaimReader, ClaimRef, Preparer
from dra_driver.profiles.nvidia.simulated import PROFILE_DIR
from dra_driver.profiles.registry import build_profile
from dra_driver.proto import dra_v1_pb2, dra_v1_pb2_grpc
from dra_driver.sharing import RecordingRunner, SharingManager
from tessera.simulate.report import format_table

from . import SMOKE_HELP
from .hotpath import _percentile

DRIVER = "gpu.tessera.dev"
NODE = "bench-node"
PROFILE = "h100x8"
GPUS = 8
CLAIM_MEMORY = "1Gi"
SIZES = (1, 10, 100)
SMOKE = ((1, 10), 20)  # run_prepare's sizes and claims per size in the smoke
TARGET_P99_MS = 20.0
TITLE = "DRA driver prepare/unprepare over its unix socket vs a do-nothing gRPC server (ms)"
RECOVERY_CLAIMS = 150
SMOKE_RECOVERY_CLAIMS = 12  # the smoke's interrupted claims (the old path costs ~0.1 s each)
SIMULATED_COMMAND_S = 0.03
MIG_TITLE = "DRA driver prepare/unprepare of MIG placements (1g.10gb, made on demand) vs whole GPUs (ms)"
MIG_PROFILE = "mig.yaml"  # h100x8 in MIG mode, written into the benchmark's directory
TARGET_RECOVERY_S = 2.0
RECOVERY_TITLE = (
    f"DRA driver crash recovery: {RECOVERY_CLAIMS} interrupted claims on {GPUS} GPUs rolled back and "
    f"prepared again, {SIMULATED_COMMAND_S * 1000:g} ms per sharing command"
)


def _device(name: str) -> tuple[str, dict[str, str]]:
    """The device claim ``name`` is allocated and what it consumes: ``r-``/``c-<n>`` a 1Gi
    fraction, ``w-<n>`` a whole GPU, ``m-<n>`` a 1g.10gb placement (its start cycling over 0..6)."""
    kind, number_text = name.split("-", 1)
    number = int(number_text)
    if kind == "w":
        return f"gpu-{number % GPUS}", {}
    if kind == "m":
        return f"gpu-{number % GPUS}-mig-1g-10gb-at-{(number // GPUS) % 7}", {}
    return f"gpu-{number % GPUS}", {"memory": CLAIM_MEMORY}


def claim_object(namespace: str, name: str) -> dict[str, Any]:
    """The allocated ResourceClaim ``name`` (``r-<gpu>`` resident, ``c-``/``w-``/``m-<n>`` measured)."""
    device, consumed = _device(name)
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    if consumed:
        result["consumedCapacity"] = consumed
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


async def _read_claim(request: web.Request) -> web.Response:
    return web.json_response(claim_object(request.match_info["namespace"], request.match_info["name"]))


# ---- the two server processes ----


class _FloorService:
    """Decodes each request and answers one empty entry per claim: gRPC alone."""

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_v1_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response


async def _serve(kind: str, root: Path, api_url: str) -> None:
    loop = asyncio.get_running_loop()
    if kind == "floor":
        server = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(_FloorService(), server)
        server.add_insecure_port(f"unix:{dra_socket(root)}")
        await server.start()
        print("READY", flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
        await server.stop(0)
        return
    api = ApiClient(Configuration(host=api_url))
    settings = root / MIG_PROFILE if kind == "driver-mig" else Path(PROFILE)
    profile = build_profile("simulated", settings, node_name=NODE)
    plugin, _ = build_plugin(
        driver_name=DRIVER,
        node_name=NODE,
        profile=profile,
        gpus=profile.discovery.inventory(),
        claims=ApiClaimReader(api),
        runner=RecordingRunner(),
        plugin_dir=root / "plugins",
        registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        checkpoint_dir=root / "state",
    )
    await plugin.start()
    print("READY", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await plugin.stop(grace_s=0)
    await api.close()


def dra_socket(root: Path) -> Path:
    return root / "plugins" / DRIVER / "dra.sock"


class ServerProcess:
    """A ``serve`` child process; closing its stdin stops it."""

    def __init__(self, kind: str, root: Path, api_url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.prepare", "serve", kind, str(root), api_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "READY":
            self.stop()
            raise RuntimeError(f"bench.prepare {kind} server failed to start (exit {self.process.poll()})")

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---- the kubelet side ----


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Latency:
        return cls(_percentile(list(samples), 50), _percentile(list(samples), 99))


@dataclass(frozen=True)
class PrepareRow:
    claims: int
    requests: int
    prepare: Latency
    unprepare: Latency
    floor_prepare: Latency
    floor_unprepare: Latency


def _request(kind: str, names: Sequence[str]) -> Any:
    claims = [dra_v1_pb2.Claim(namespace="bench", uid=f"uid-{name}", name=name) for name in names]
    if kind == "prepare":
        return dra_v1_pb2.NodePrepareResourcesRequest(claims=claims)
    return dra_v1_pb2.NodeUnprepareResourcesRequest(claims=claims)


async def _measure(
    socket: Path, size: int, requests: int, first: int, prefix: str = "c"
) -> tuple[list[float], list[float]]:
    """Prepare then unprepare ``requests`` requests of ``size`` new claims; each call's ms."""
    prepared: list[float] = []
    unprepared: list[float] = []
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        for index in range(requests):
            start = first + index * size
            names = [f"{prefix}-{n}" for n in range(start, start + size)]
            began = time.perf_counter()
            response = await stub.NodePrepareResources(_request("prepare", names))
            prepared.append((time.perf_counter() - began) * 1000)
            errors = [entry.error for entry in response.claims.values() if entry.error]
            if len(response.claims) != size or errors:
                raise RuntimeError(f"prepare of {size} claims answered {len(response.claims)}: {errors[:3]}")
            began = time.perf_counter()
            await stub.NodeUnprepareResources(_request("unprepare", names))
            unprepared.append((time.perf_counter() - began) * 1000)
    return prepared, unprepared


async def _claim_server() -> tuple[web.AppRunner, str]:
    """The stand-in API server answering every claim read at once; its runner and URL."""
    app = web.Application()
    app.router.add_get("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}", _read_claim)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _run(sizes: Sequence[int], calls: int) -> list[PrepareRow]:
    runner, api_url = await _claim_server()
    root = Path(tempfile.mkdtemp(prefix="tbp-", dir="/tmp"))  # short: unix socket paths
    socket = dra_socket(root)
    plan = [(size, max(20, calls // size)) for size in sizes]
    try:
        driver = await asyncio.to_thread(ServerProcess, "driver", root, api_url)
        try:
            async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
                resident = [f"r-{gpu}" for gpu in range(GPUS)]  # one fraction per GPU, kept
                await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    _request("prepare", resident)
                )
            driver_times = []
            first = 0
            for size, requests in plan:
                await _measure(socket, size, 2, first)  # warm-up, not counted
                driver_times.append(await _measure(socket, size, requests, first + 2 * size))
                first += (requests + 2) * size
        finally:
            await asyncio.to_thread(driver.stop)
        floor = await asyncio.to_thread(ServerProcess, "floor", root, api_url)
        try:
            floor_times = []
            for size, requests in plan:
                await _measure(socket, size, 2, 0)
                floor_times.append(await _measure(socket, size, requests, 0))
        finally:
            await asyncio.to_thread(floor.stop)
    finally:
        await runner.cleanup()
        await asyncio.to_thread(shutil.rmtree, root, ignore_errors=True)
    return [
        PrepareRow(
            claims=size,
            requests=requests,
            prepare=Latency.of(tessera[0]),
            unprepare=Latency.of(tessera[1]),
            floor_prepare=Latency.of(base[0]),
            floor_unprepare=Latency.of(base[1]),
        )
        for (size, requests), tessera, base in zip(plan, driver_times, floor_times, strict=True)
    ]


def run_prepare(sizes: Sequence[int] = SIZES, calls: int = 400) -> list[PrepareRow]:
    """About ``calls`` claims per size (at least 20 requests each)."""
    return asyncio.run(_run(sizes, calls))


def prepare_table(rows: Sequence[PrepareRow]) -> str:
    headers = [
        "claims/req",
        "requests",
        "prep p50",
        "prep p99",
        "floor p50",
        "floor p99",
        "p50 / floor",
        "p99 / floor",
        "unprep p50",
        "unprep p99",
        "floor p50",
        "floor p99",
        "p50 / floor",
        "p99 / floor",
    ]
    body = []
    for r in rows:
        body.append(
            [
                str(r.claims),
                str(r.requests),
                *(f"{v:.2f}" for v in (r.prepare.p50_ms, r.prepare.p99_ms)),
                *(f"{v:.2f}" for v in (r.floor_prepare.p50_ms, r.floor_prepare.p99_ms)),
                f"{r.prepare.p50_ms / r.floor_prepare.p50_ms:.1f}x",
                f"{r.prepare.p99_ms / r.floor_prepare.p99_ms:.1f}x",
                *(f"{v:.2f}" for v in (r.unprepare.p50_ms, r.unprepare.p99_ms)),
                *(f"{v:.2f}" for v in (r.floor_unprepare.p50_ms, r.floor_unprepare.p99_ms)),
                f"{r.unprepare.p50_ms / r.floor_unprepare.p50_ms:.1f}x",
                f"{r.unprepare.p99_ms / r.floor_unprepare.p99_ms:.1f}x",
            ]
        )
    return format_table(headers, body)


# ---- MIG placements against whole GPUs ----


@dataclass(frozen=True)
class MigRow:
    devices: str
    requests: int
    prepare: Latency
    unprepare: Latency


async def _run_mig(requests: int) -> list[MigRow]:
    runner, api_url = await _claim_server()
    root = Path(tempfile.mkdtemp(prefix="tbm-", dir="/tmp"))
    whole_profile = (PROFILE_DIR / f"{PROFILE}.yaml").read_text()
    (root / MIG_PROFILE).write_text(
        whole_profile.replace("    memory: 80Gi\n", "    memory: 80Gi\n    mig: dynamic\n")
    )
    rows = []
    try:
        for kind, prefix, devices in (
            ("driver", "w", "whole H100"),
            ("driver-mig", "m", "1g.10gb placement"),
        ):
            shutil.rmtree(root / "state", ignore_errors=True)
            driver = await asyncio.to_thread(ServerProcess, kind, root, api_url)
            try:
                await _measure(dra_socket(root), 1, 2, 0, prefix)  # warm-up, not counted
                prepared, unprepared = await _measure(dra_socket(root), 1, requests, 2, prefix)
            finally:
                await asyncio.to_thread(driver.stop)
            rows.append(MigRow(devices, requests, Latency.of(prepared), Latency.of(unprepared)))
    finally:
        await runner.cleanup()
        await asyncio.to_thread(shutil.rmtree, root, ignore_errors=True)
    return rows


def run_mig(requests: int = 400) -> list[MigRow]:
    return asyncio.run(_run_mig(requests))


def mig_table(rows: Sequence[MigRow]) -> str:
    whole = rows[0]
    body = [
        [
            r.devices,
            str(r.requests),
            *(f"{v:.2f}" for v in (r.prepare.p50_ms, r.prepare.p99_ms)),
            f"{r.prepare.p50_ms / whole.prepare.p50_ms:.1f}x",
            f"{r.prepare.p99_ms / whole.prepare.p99_ms:.1f}x",
            *(f"{v:.2f}" for v in (r.unprepare.p50_ms, r.unprepare.p99_ms)),
            f"{r.unprepare.p50_ms / whole.unprepare.p50_ms:.1f}x",
            f"{r.unprepare.p99_ms / whole.unprepare.p99_ms:.1f}x",
        ]
        for r in rows
    ]
    ratios = ["p50 / whole", "p99 / whole"]
    headers = ["claim (1/request)", "requests", "prep p50", "prep p99", *ratios]
    return format_table([*headers, "unprep p50", "unprep p99", *ratios], body)


# ---- crash recovery ----


class _BenchClaims:
    """The claims as the stand-in API server would answer them, without the HTTP round trip."""

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return claim_object(namespace, name)


class _TimedRunner(RecordingRunner):
    """Records each command after a simulated command's run time."""

    async def run(self, command: Command) -> str:
        await asyncio.sleep(SIMULATED_COMMAND_S)
        return await super().run(command)


@dataclass(frozen=True)
class RecoveryRow:
    path: str
    claims: int
    seconds: float
    commands: int


def _node(root: Path, runner: RecordingRunner) -> tuple[Preparer, SharingManager, Checkpoint]:
    """A preparer of the simulated node on ``root``, with the sharing and checkpoint it uses."""
    profile = build_profile("simulated", Path(PROFILE), node_name=NODE)
    inventory = DeviceInventory(NODE, profile, profile.discovery.inventory())
    sharing = SharingManager(runner, profile.sharing(root / "mps"))
    checkpoint = Checkpoint(root / "state")
    preparer = Preparer(
        driver_name=DRIVER,
        node_name=NODE,
        devices=inventory.devices,
        profile=profile,
        claims=_BenchClaims(),
        checkpoint=checkpoint,
        sharing=sharing,
        cdi_dir=root / "cdi",
    )
    return preparer, sharing, checkpoint


async def _recover_once(root: Path, claims: int, bulk: bool) -> RecoveryRow:
    refs = [ClaimRef("bench", f"uid-c-{n}", f"c-{n}") for n in range(claims)]
    crashed, _, checkpoint = _node(root, RecordingRunner())
    await crashed.prepare(refs)
    # The crash: every claim still "started".
    checkpoint.update(
        {uid: r.model_copy(update={"state": "started"}) for uid, r in checkpoint.claims.items()}
    )
    runner = _TimedRunner()
    restarted, sharing, checkpoint = _node(root, runner)
    began = time.perf_counter()
    if bulk:
        await restarted.recover()
    else:  # as before: each interrupted claim released on its own (its GPU idle each time)
        for uid, record in checkpoint.claims.items():
            for share in record.shares:
                await sharing.release(uid, share)
            checkpoint.update({uid: None})
    outcomes = await asyncio.gather(*(restarted.prepare([ref]) for ref in refs))
    seconds = time.perf_counter() - began
    errors = [o.error for outcome in outcomes for o in outcome.values() if o.error]
    if errors:
        raise RuntimeError(f"re-preparing after the crash: {errors[:3]}")
    path = "recover(): each GPU once" if bulk else "per claim (before)"
    return RecoveryRow(path, claims, seconds, len(runner.commands))


async def _recovery(claims: int) -> list[RecoveryRow]:
    rows = []
    for bulk in (False, True):
        root = Path(tempfile.mkdtemp(prefix="tbr-"))
        try:
            rows.append(await _recover_once(root, claims, bulk))
        finally:
            await asyncio.to_thread(shutil.rmtree, root, ignore_errors=True)
    return rows


def run_recovery(claims: int = RECOVERY_CLAIMS) -> list[RecoveryRow]:
    """The old path first, then the new one, on fresh directories."""
    return asyncio.run(_recovery(claims))


def recovery_table(rows: Sequence[RecoveryRow]) -> str:
    before = rows[0]
    body = [
        [r.path, str(r.claims), f"{r.seconds:.2f}", str(r.commands), f"{before.seconds / r.seconds:.1f}x"]
        for r in rows
    ]
    return format_table(["rollback", "claims", "seconds", "commands", "speed-up"], body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prepare", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="(internal) a server process of the benchmark")
    serve.add_argument("kind", choices=("driver", "driver-mig", "floor"))
    serve.add_argument("root", type=Path)
    serve.add_argument("api_url")
    parser.add_argument("--calls", type=int, default=400, help="claims per request size (default 400)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args.kind, args.root, args.api_url))
        return 0
    print(f"\n[5] {TITLE}")
    rows = run_prepare(*SMOKE) if args.smoke else run_prepare(calls=args.calls)
    print(prepare_table(rows))
    single = next(r for r in rows if r.claims == 1)
    verdict = "met" if single.prepare.p99_ms < TARGET_P99_MS else "NOT met"
    p99 = single.prepare.p99_ms
    print(f"prepare p99 for 1 claim/request: {p99:.2f} ms, target {TARGET_P99_MS:g} ms: {verdict}")
    print(f"\n[5 MIG] {MIG_TITLE}")
    mig = run_mig(SMOKE[1] if args.smoke else args.calls)
    print(mig_table(mig))
    p99 = mig[-1].prepare.p99_ms
    verdict = "met" if p99 < TARGET_P99_MS else "NOT met"
    ratio = p99 / mig[0].prepare.p99_ms
    print(
        f"MIG prepare p99: {p99:.2f} ms ({ratio:.1f}x the whole GPU's), target {TARGET_P99_MS:g} ms:", verdict
    )
    print(f"\n[5b] {RECOVERY_TITLE}")
    claims = SMOKE_RECOVERY_CLAIMS if args.smoke else RECOVERY_CLAIMS
    recovery = run_recovery(claims)
    print(recovery_table(recovery))
    seconds = recovery[-1].seconds
    verdict = "met" if seconds < TARGET_RECOVERY_S else "NOT met"
    print(f"recovery of {claims} claims: {seconds:.2f} s, target {TARGET_RECOVERY_S:g} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
