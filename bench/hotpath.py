"""Benchmark 1: the extender hot path over HTTP against the HTTP floor.

Each scheduling cycle is a filter then a prioritize request for a new pending GPU pod
(alternately a whole GPU and half a GPU), sent one after the other on a keep-alive connection,
the way kube-scheduler calls an extender: prioritize is asked about the nodes the filter passed
(names, or the NodeList the filter answered); cycles/s is 1 / mean cycle time. Both
nodeCacheCapable modes: node names only, or the full NodeList. The same payloads go to two
do-nothing aiohttp extenders (decode JSON, pass every node) started in the same run, one with the
standard library's JSON codec (`floor`), one with the codec the extender uses (`fast floor`,
msgspec): the ratio to the fast floor is what the extender's own work costs. The three are
measured in slices, taking turns, so that what else runs on the machine weighs on them alike.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import msgspec

from .picture import build_picture, leaf_queues, pod_object, queue_tree

WARM_UP_CYCLES = 2  # per slice
# Each server is measured in this many slices, taking turns with the others.
SLICES = 6


@dataclass(frozen=True)
class LatencyStats:
    cycles: int
    cycles_per_s: float
    p50_ms: float
    p99_ms: float
    filter_p99_ms: float
    prioritize_p99_ms: float
    # The server's CPU time per cycle (from /proc, warm-up cycles included): what a busy machine
    # moves least, as it counts no time spent waiting for a core.
    server_cpu_ms: float = 0.0


@dataclass(frozen=True)
class HotPathRow:
    nodes: int
    pods: int
    mode: str  # "names" (nodeCacheCapable: true) or "nodelist"
    tessera: LatencyStats
    floor: LatencyStats  # do-nothing extender, stdlib json
    fast_floor: LatencyStats  # do-nothing extender, msgspec

    @property
    def p50_ratio(self) -> float:
        return self.tessera.p50_ms / self.floor.p50_ms

    @property
    def p99_ratio(self) -> float:
        return self.tessera.p99_ms / self.floor.p99_ms

    @property
    def throughput_ratio(self) -> float:
        return self.tessera.cycles_per_s / self.floor.cycles_per_s

    @property
    def fast_p50_ratio(self) -> float:
        return self.tessera.p50_ms / self.fast_floor.p50_ms

    @property
    def fast_p99_ratio(self) -> float:
        return self.tessera.p99_ms / self.fast_floor.p99_ms

    @property
    def fast_cpu_ratio(self) -> float:
        return self.tessera.server_cpu_ms / self.fast_floor.server_cpu_ms


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(pct / 100 * len(ordered)))]


class ServerProcess:
    """A ``bench.servers`` child process; closing its stdin stops it."""

    def __init__(self, kind: str, nodes: int, pods: int, tree: bool = False, port: int = 0) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.servers",
                kind,
                "--nodes",
                str(nodes),
                "--pods",
                str(pods),
                *(["--queue-tree"] if tree else []),
                *(["--port", str(port)] if port else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"bench server {kind} failed to start (exit {self.process.poll()})")
        self.url = f"http://127.0.0.1:{line[1]}"
        self.rss_mib = float(line[2])
        self.objects = int(line[3])

    def cpu_seconds(self) -> float:
        """User and system CPU time the server process has used so far."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command name
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def measure(self, payloads: Payloads, seconds: float, max_cycles: int, into: Samples) -> None:
        """Add to `into` the latencies of cycles against this server and the CPU time it used."""
        before = self.cpu_seconds()
        asyncio.run(_measure(self.url, payloads, seconds, max_cycles, into))
        into.cpu_ms += (self.cpu_seconds() - before) * 1000

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _FilterAnswer(msgspec.Struct):
    """A filter answer's passed nodes, as they came (`null` when absent)."""

    NodeNames: msgspec.Raw = msgspec.Raw(b"null")
    Nodes: msgspec.Raw = msgspec.Raw(b"null")


class Payloads:
    """Request bodies in one nodeCacheCapable mode, a fresh pending pod per cycle.

    kube-scheduler filters a pod once per scheduling attempt, so every cycle asks about a new pod
    (alternately asking for a whole GPU and for half of one); the node part is serialised once.
    Prioritize follows with the same pod and the nodes the filter answered.
    """

    def __init__(self, nodes: int, mode: str, tree: bool = False) -> None:
        self.queues = leaf_queues(queue_tree() if tree else None)
        picture = build_picture(nodes, pods=0)
        self.templates = [
            pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
            for pod in picture.pending_pods.values()
        ]
        if mode == "names":
            self.node_part = b'"NodeNames": ' + json.dumps(picture.node_names).encode()
        else:
            node_list = {"apiVersion": "v1", "kind": "NodeList", "items": picture.objects["Node"]}
            self.node_part = b'"Nodes": ' + json.dumps(node_list).encode()
        self._last = (-1, b"")  # the cycle of the last filter request, and its pod

    def _pod(self, cycle: int) -> bytes:
        """The JSON of the cycle's pending pod (a new resourceVersion at each call)."""
        template = self.templates[cycle % len(self.templates)]
        pod = pod_object(
            f"pending-{cycle:07d}", self.queues[cycle % len(self.queues)], None, template=template
        )
        return json.dumps(pod).encode()

    def body(self, cycle: int) -> bytes:
        """The filter request of the cycle's pod, every node a candidate."""
        self._last = (cycle, self._pod(cycle))
        return b'{"Pod": ' + self._last[1] + b", " + self.node_part + b"}"

    def after(self, cycle: int, answer: bytes) -> bytes:
        """The prioritize request after the filter's `answer` for the cycle's pod (the same pod as
        in its last `body`): the nodes the filter passed."""
        pod = self._last[1] if self._last[0] == cycle else self._pod(cycle)
        passed = msgspec.json.decode(answer, type=_FilterAnswer)
        return (
            b'{"Pod": ' + pod + b', "NodeNames": ' + passed.NodeNames + b', "Nodes": ' + passed.Nodes + b"}"
        )


@dataclass
class Samples:
    """One server's measured cycles, gathered over several slices of a run."""

    cycle_ms: list[float] = field(default_factory=list)
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    measured_s: float = 0.0  # the cycles' time, in all
    calls: int = 0  # cycles run, warm-ups included (each asks about a new pod)
    cpu_ms: float = 0.0  # the server's CPU time over all of them

    def stats(self) -> LatencyStats:
        return LatencyStats(
            cycles=len(self.cycle_ms),
            cycles_per_s=len(self.cycle_ms) / self.measured_s,
            p50_ms=statistics.median(self.cycle_ms),
            p99_ms=_percentile(self.cycle_ms, 99),
            filter_p99_ms=_percentile(self.filter_ms, 99),
            prioritize_p99_ms=_percentile(self.prioritize_ms, 99),
            server_cpu_ms=self.cpu_ms / self.calls,
        )


async def _measure(url: str, payloads: Payloads, seconds: float, max_cycles: int, into: Samples) -> None:
    headers = {"Content-Type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def call(verb: str, body: bytes) -> tuple[float, bytes]:
            started = time.perf_counter()
            async with session.post(f"{url}/{verb}", data=body, headers=headers) as response:
                answer = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}/{verb} answered {response.status}")
            return (time.perf_counter() - started) * 1000, answer

        async def cycle() -> tuple[float, float]:
            number = into.calls
            into.calls += 1
            f, answer = await call("filter", payloads.body(number))
            body = payloads.after(number, answer)  # not the extender's time
            p, _ = await call("prioritize", body)
            return f, p

        for _ in range(WARM_UP_CYCLES):  # the connection, caches
            await cycle()
        measured, cycles = 0.0, 0
        # Collections of the client's own garbage would land inside the timings: run them between
        # cycles instead.
        gc.disable()
        while cycles < max_cycles and (measured < seconds or cycles < 5):
            if cycles % 20 == 0:
                gc.collect()
            f, p = await cycle()
            into.filter_ms.append(f)
            into.prioritize_ms.append(p)
            into.cycle_ms.append(f + p)
            cycles += 1
            measured += (f + p) / 1000  # building the bodies is not the extender's time
        gc.enable()
        into.measured_s += measured


def run_hotpath(
    node_counts: list[int],
    pods: int,
    seconds: float,
    max_cycles: int = 5000,
    log: bool = True,
    tree: bool = False,
    modes: tuple[str, ...] = ("names", "nodelist"),
) -> list[HotPathRow]:
    """`tree`: the extender's picture has 1000 queues in three levels (pods in the 900 leaves)
    instead of two."""
    rows = []
    floor = ServerProcess("floor", 0, 0)
    fast_floor = ServerProcess("fast-floor", 0, 0)
    try:
        for nodes in node_counts:
            if log:
                print(
                    f"  hot path: building a picture of {nodes} nodes / {pods} pods in the extender...",
                    file=sys.stderr,
                    flush=True,
                )
            tessera = ServerProcess("tessera", nodes, pods, tree)
            try:
                for mode in modes:
                    bodies = Payloads(nodes, mode, tree)
                    servers = (tessera, floor, fast_floor)
                    samples = [Samples() for _ in servers]
                    # In slices, the servers taking turns (in alternate orders): what other work on
                    # the machine costs falls on the three alike.
                    for turn in range(SLICES):
                        order = range(len(servers)) if turn % 2 == 0 else reversed(range(len(servers)))
                        for i in order:
                            servers[i].measure(bodies, seconds / SLICES, max_cycles // SLICES, samples[i])
                    ours, base, fast = (sample.stats() for sample in samples)
                    rows.append(HotPathRow(nodes, pods, mode, ours, base, fast))
                    if log:
                        print(
                            f"  hot path: {nodes} nodes, {mode}: p99 {ours.p99_ms:.2f} ms "
                            f"(floor {base.p99_ms:.2f} ms, fast floor {fast.p99_ms:.2f} ms); server CPU "
                            f"{ours.server_cpu_ms:.2f} ms per cycle (fast floor {fast.server_cpu_ms:.2f} ms)",
                            file=sys.stderr,
                            flush=True,
                        )
            finally:
                tessera.stop()
    finally:
        floor.stop()
        fast_floor.stop()
    return rows
