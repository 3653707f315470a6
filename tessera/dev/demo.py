"""`tessera up --demo`: three teams share the local cluster's GPUs while the terminal shows it.

The steps apply the manifests of manifests/demo/ one after the other and each waits for what it
should lead to, observed in the cluster (Queue status, running pods), never for a fixed time:

1. the teams' queues;
2. team-c's inference: quarter GPUs by memory (MPS) and a time-sliced GPU shared by two pods;
3. team-a's burst: a 16-worker Job borrows every idle GPU beyond its quota, up to its limit;
4. team-b arrives: reclaim evicts team-a's borrowed workers until team-b holds its fair share.

A terminal gets the table refreshed in place every second; a pipe (tests, logs) gets one frame
per finished step. The summary's numbers are the Queue status that `kubectl get queues` prints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from kubernetes_asyncio.client import ApiClient

from contract.kube import mapping, meta
from contract.names import DRIVER_NAME, QUEUE_GROUP, QUEUE_LABEL, QUEUE_PLURAL, QUEUE_VERSION
from extender.kubeapi import request
from tessera.dev.demoview import Frame, gpus, queue_rows, render
from tessera.dev.localcluster import REPO_ROOT, LocalCluster, api_client

DEMO_DIR = REPO_ROOT / "manifests" / "demo"
REFRESH_S = 1.0
STEP_TIMEOUT_S = 240.0


class DemoError(RuntimeError):
    """A step did not reach its goal in time; the message shows the last frame."""


@dataclass(frozen=True)
class Observation:
    frame: Frame
    running: dict[str, int]  # queue -> running pods (not terminating)


@dataclass(frozen=True)
class Step:
    title: str
    manifest: Path
    goal: str
    reached: Callable[[Observation], bool]


def _holds(queue: str, allocated: float, fair_share: float, running: int) -> Callable[[Observation], bool]:
    def check(seen: Observation) -> bool:
        row = seen.frame.queue(queue)
        return (
            row.allocated == allocated and row.fair_share == fair_share and seen.running.get(queue) == running
        )

    return check


def _all(*checks: Callable[[Observation], bool]) -> Callable[[Observation], bool]:
    return lambda seen: all(check(seen) for check in checks)


STEPS = (
    Step(
        "queues team-a, team-b, team-c",
        DEMO_DIR / "00-queues.yaml",
        "the extender reports the three queues",
        lambda seen: {"team-a", "team-b", "team-c"} <= {row.name for row in seen.frame.queues},
    ),
    Step(
        "team-c: 4 inference pods on a quarter GPU each, 2 notebooks on one time-sliced GPU",
        DEMO_DIR / "10-team-c-inference.yaml",
        "team-c holds 2 GPUs with 6 pods running",
        _holds("team-c", 2, 2, 6),
    ),
    Step(
        "team-a bursts: a 16-worker training Job, whole GPUs",
        DEMO_DIR / "20-team-a-training.yaml",
        "team-a borrows every idle GPU up to its limit of 14",
        _holds("team-a", 14, 14, 14),
    ),
    Step(
        "team-b arrives: a 6-worker Job, while team-a holds everything",
        DEMO_DIR / "30-team-b-training.yaml",
        "reclaim gives team-b its fair share of 6 back from team-a",
        _all(_holds("team-b", 6, 6, 6), _holds("team-a", 8, 8, 8)),
    ),
)


async def _items(api: ApiClient, path: str) -> list[dict[str, Any]]:
    listing = await request(api, "GET", path)
    items: list[dict[str, Any]] = listing.get("items") or []
    return items


async def observe(api: ApiClient, heading: str) -> Observation:
    queues, slices, claims, pods = await asyncio.gather(
        _items(api, f"/apis/{QUEUE_GROUP}/{QUEUE_VERSION}/{QUEUE_PLURAL}"),
        _items(api, "/apis/resource.k8s.io/v1/resourceslices"),
        _items(api, "/apis/resource.k8s.io/v1/resourceclaims"),
        _items(api, "/api/v1/pods"),
    )
    running: dict[str, int] = {}
    for pod in pods:
        if mapping(pod.get("status")).get("phase") == "Running" and not meta(pod).get("deletionTimestamp"):
            queue = str(mapping(meta(pod).get("labels")).get(QUEUE_LABEL, ""))
            running[queue] = running.get(queue, 0) + 1
    frame = Frame(heading, queue_rows(queues), gpus(slices, claims, pods, DRIVER_NAME))
    return Observation(frame, running)


class Screen:
    """Redraws in place on a terminal; on a pipe, prints only the frames it is asked to keep."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.live = out.isatty()
        self._drawn = 0

    def show(self, lines: Sequence[str], keep: bool = False) -> None:
        if self.live:
            erase = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            self.out.write(erase + "\n".join(lines) + "\n")
            self._drawn = 0 if keep else len(lines)
        elif keep:
            self.out.write("\n".join(lines) + "\n\n")
        self.out.flush()


@dataclass(frozen=True)
class DemoResult:
    final: Frame
    step_seconds: tuple[float, ...]
    peak_allocated: dict[str, float]


async def run_steps(cluster: LocalCluster, out: TextIO, steps: Sequence[Step] = STEPS) -> DemoResult:
    screen = Screen(out)
    began = time.monotonic()
    peak: dict[str, float] = {}
    durations: list[float] = []
    api = await api_client(cluster.kubeconfig)
    try:
        seen: Observation | None = None
        for number, step in enumerate(steps, start=1):
            await asyncio.to_thread(cluster.apply, step.manifest)
            started = time.monotonic()
            while True:
                heading = (
                    f"step {number}/{len(steps)} [{time.monotonic() - began:5.1f}s] {step.title}\n"
                    f"  waiting until {step.goal}"
                )
                seen = await observe(api, heading)
                for row in seen.frame.queues:
                    peak[row.name] = max(peak.get(row.name, 0.0), row.allocated)
                if step.reached(seen):
                    break
                if time.monotonic() - started > STEP_TIMEOUT_S:
                    raise DemoError(
                        f"step {number} did not reach its goal ({step.goal}) in {STEP_TIMEOUT_S:.0f}s:\n"
                        + "\n".join(render(seen.frame))
                    )
                screen.show(render(seen.frame))
                await asyncio.sleep(REFRESH_S)
            durations.append(time.monotonic() - started)
            done = Frame(
                f"step {number}/{len(steps)} [{time.monotonic() - began:5.1f}s] {step.title}\n"
                f"  done in {durations[-1]:.1f}s: {step.goal}",
                seen.frame.queues,
                seen.frame.gpus,
            )
            screen.show(render(done), keep=True)
        assert seen is not None
        return DemoResult(seen.frame, tuple(durations), peak)
    finally:
        await api.close()


def summary(result: DemoResult) -> list[str]:
    """The closing lines; the numbers are the Queue status, as `kubectl get queues` prints it."""
    final = result.final
    lines = ["Summary (Queue status written by the extender; `kubectl get queues` shows the same):"]
    lines.append(
        f"  {'queue':<8} {'allocated':>9} {'fair share':>10} {'peak':>5} {'evicted':>8} {'reclaimed':>9}"
    )
    for row in final.queues:
        peak = result.peak_allocated.get(row.name, 0.0)
        lines.append(
            f"  {row.name:<8} {row.allocated:>9g} {row.fair_share:>10g} {peak:>5g}"
            f" {row.evicted:>8} {row.reclaimed:>9}"
        )
    evictions = sum(row.evicted for row in final.queues)
    lines.append(f"  GPUs in use: {final.gpus_in_use:g} of {final.capacity}")
    lines.append(
        f"  team-b from arrival to its fair share: {result.step_seconds[-1]:.1f}s,"
        f" {evictions} borrowed pod(s) of team-a evicted by reclaim"
    )
    return lines


def run_demo(cluster: LocalCluster, out: TextIO) -> DemoResult:
    return asyncio.run(run_steps(cluster, out))
