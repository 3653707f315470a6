"""A hung extender is restarted by its liveness probe and serves again with a correct picture, on
the real control plane.

The extender runs as its own process (`python -m extender`), as in the chart's Deployment; this
test plays the kubelet: it probes `/healthz` on the plain-HTTP operations port (the chart's
`--metrics-port` probe) every `PERIOD_S` with a `TIMEOUT_S` timeout, and after `FAILURES`
consecutive failures kills the process (SIGKILL) and starts it again with the same flags, as the
kubelet does for a container whose liveness probe fails (the chart keeps the kubelet's defaults,
timeout 1 s and threshold 3, with a 10 s period; the test probes every second so it runs in
seconds).

The broken state is a process that no longer answers: SIGSTOP freezes it (as a deadlock or an
event loop stuck in a long computation would), so every filter the scheduler sends and every
probe times out. While it is frozen, pods come and go: a bound GPU pod is deleted and new GPU pods
arrive. The restarted process lists everything afresh; the new pods are scheduled through it onto
the GPUs that are free, and the Queue status it writes agrees with the pods bound in the API.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass, field

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

from tessera.dev.localcluster import Component, LocalCluster, free_port, wait_until
from tests.integration.extender_harness import GpuCluster, gpu_cluster
from tests.integration.test_extender_fairness import converge, queue_status_equals

pytestmark = pytest.mark.integration

PERIOD_S, TIMEOUT_S, FAILURES = 1.0, 1.0, 3  # the kubelet's probe rules, with a short period


@dataclass
class Supervisor:
    """The kubelet's part for one extender container: start it, probe it, restart it."""

    env: GpuCluster
    port: int = field(default_factory=free_port)
    probe_port: int = field(default_factory=free_port)
    restarts: int = 0
    component: Component | None = None
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.component = self.env.cluster.spawn(
            f"extender-{self.env.suffix}-{self.restarts}",
            [
                sys.executable,
                "-m",
                "extender",
                f"--kubeconfig={self.env.cluster.kubeconfig}",
                "--listen-address=127.0.0.1",
                f"--port={self.port}",
                f"--metrics-port={self.probe_port}",
                f"--gpu-driver={self.env.driver}",
                f"--scheduler-name={self.env.scheduler_name}",
                "--queue-status-interval=0.5",
                "--reclaim-interval=0",
            ],
        )

    async def probe(self, session: aiohttp.ClientSession) -> bool:
        try:
            async with session.get(f"http://127.0.0.1:{self.probe_port}/healthz") as answer:
                return answer.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _supervise(self) -> None:
        """Liveness probes once the container has started (answered once: the kubelet's startup
        probe), so a process still importing is not killed."""
        failures, started = 0, True
        timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await asyncio.sleep(PERIOD_S)
                healthy = await self.probe(session)
                if not started:
                    started = healthy
                    continue
                failures = 0 if healthy else failures + 1
                if failures >= FAILURES and self.component is not None:
                    self.component.process.kill()  # SIGKILL also ends a stopped process
                    await asyncio.to_thread(self.component.process.wait)
                    self.restarts += 1
                    self.start()
                    failures, started = 0, False

    async def run(self) -> None:
        self.start()
        assert self.component is not None
        await asyncio.to_thread(
            self.env.cluster.wait_healthy,
            self.component,
            f"http://127.0.0.1:{self.probe_port}/readyz",
            60,
            False,
        )
        self._task = asyncio.create_task(self._supervise())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.component is not None:
            self.component.process.kill()
            await asyncio.to_thread(self.component.process.wait)


async def test_a_hung_extender_is_restarted_and_serves_a_correct_picture(
    local_cluster: LocalCluster, k8s: ApiClient, namespace: str
) -> None:
    async with gpu_cluster(local_cluster, k8s, namespace, nodes=1, gpus_per_node=4, in_process=False) as env:
        supervisor = Supervisor(env)
        await supervisor.run()
        try:
            # The scheduler gives up on a call after 5 s (a hung extender fails the cycle, the pod
            # is retried); ignorable: false, so GPU pods wait for the extender rather than bypass it.
            await env.start_scheduler(f"http://127.0.0.1:{supervisor.port}", httpTimeout="5s")
            team = await env.create_queue("r", resources={"gpu": {"quota": 4}})
            first = await env.submit(team, 3, "before")
            await converge(env, {team: 3}, {team: 4})
            await queue_status_equals(env, team, "3", "3")  # fair share: its demand

            assert supervisor.component is not None
            frozen = supervisor.component
            frozen.process.send_signal(signal.SIGSTOP)
            stopped_at = time.monotonic()
            # While it is frozen: one bound pod goes, two new ones come (only three GPUs fit them
            # if the restarted extender sees the deletion: 4 GPUs - 2 still bound = 2 free).
            await env.delete_pods(first[:1])
            await env.submit(team, 2, "during")

            async def restarted() -> bool:
                return supervisor.restarts >= 1

            await wait_until(restarted, timeout=60, what="the supervisor restarting the hung extender")
            assert frozen.process.poll() is not None  # the frozen process is gone
            # The new process syncs, the waiting pods go through it, and what it reports is right.
            await converge(env, {team: 4}, {team: 4}, timeout=60)
            await queue_status_equals(env, team, "4", "4")
            bound = [p["metadata"]["name"] for p in await env.pods() if p["spec"].get("nodeName")]
            assert sorted(bound) == sorted([*first[1:], "during-0", "during-1"])
            assert supervisor.restarts == 1, "restarted once, then healthy"
            print(f"restarted {time.monotonic() - stopped_at:.1f}s after the freeze")
        finally:
            await supervisor.stop()
