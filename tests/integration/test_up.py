"""`tessera up` as a newcomer runs it: the demo (README's first command), then the quiet mode with
every shipped example, each torn down by Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.quantity import parse_quantity
from tessera.dev.localcluster import REPO_ROOT, find_binaries


@dataclass
class UpProcess:
    process: subprocess.Popen[str]
    state_dir: Path
    bin_dir: Path

    def kubectl(self, *args: str) -> str:
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.state_dir / 'admin.kubeconfig'}", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def read_until(self, marker: str, timeout: float) -> list[str]:
        assert self.process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if marker in line:
                return lines
        raise AssertionError(f"`tessera up` never printed {marker!r}; it printed:\n" + "\n".join(lines))


def _default_sigint() -> None:
    # A test run in the background inherits SIGINT ignored; `tessera up` must see Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# `kubectl-tessera` as its console script runs it (the test's venv may predate the script).
PLUGIN = "import sys; from tessera.kubectl import main; sys.exit(main(sys.argv[1:]))"


@contextmanager
def tessera_up(*flags: str) -> Iterator[UpProcess]:
    bin_dir = find_binaries()
    # Short on purpose: the driver's unix sockets live below it (sun_path holds 107 bytes).
    state_dir = Path(tempfile.mkdtemp(prefix="tessera-up-"))
    process = subprocess.Popen(
        [sys.executable, "-m", "tessera", "up", "--nodes=2", f"--state-dir={state_dir}", *flags],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TESSERA_K8S_BIN": str(bin_dir)},
        preexec_fn=_default_sigint,
    )
    try:
        yield UpProcess(process, state_dir, bin_dir)
    finally:
        process.send_signal(signal.SIGINT)
        remaining, _ = process.communicate(timeout=60)
    assert process.returncode == 0, remaining
    assert "[tessera] stopping" in remaining
    leftover = subprocess.run(
        ["pgrep", "-f", str(state_dir)], capture_output=True, text=True, check=False
    ).stdout
    assert leftover == "", f"processes outlived `tessera up`: {leftover}"
    shutil.rmtree(state_dir, ignore_errors=True)


def _summary_rows(printed: list[str]) -> dict[str, tuple[float, float]]:
    """queue -> (allocated, fair share) from the demo's summary table."""
    start = next(i for i, line in enumerate(printed) if line.startswith("Summary"))
    rows: dict[str, tuple[float, float]] = {}
    for line in printed[start + 2 :]:
        name, *numbers = line.split()
        if not all(number.replace(".", "", 1).isdigit() for number in numbers):
            break  # the table ends where the totals begin
        rows[name] = (float(numbers[0]), float(numbers[1]))
    return rows


def test_demo_shows_borrow_and_reclaim_and_its_summary_is_the_clusters() -> None:
    with tessera_up("--demo") as up:
        printed = up.read_until("Press Ctrl-C", timeout=300)
        text = "\n".join(printed)
        for step in range(1, 5):
            assert f"step {step}/4" in text
        assert any(
            line.startswith(f"  export KUBECONFIG={up.state_dir / 'admin.kubeconfig'}") for line in printed
        )

        shown = _summary_rows(printed)
        assert shown["team-a"] == (8, 8) and shown["team-b"] == (6, 6) and shown["team-c"] == (2, 2)
        # What `kubectl get queues` prints (its columns read the same status fields).
        table = up.kubectl("get", "queues", "-o", "wide").splitlines()
        header = table[0]
        allocated_at, fair_at = header.index("GPU ALLOCATED"), header.index("GPU FAIR SHARE")
        for line in table[1:]:
            name = line.split()[0]
            if name not in shown:
                continue
            allocated = line[allocated_at:fair_at].strip() or "0"
            fair = line[fair_at : header.index("GPU PENDING")].strip() or "0"
            assert (parse_quantity(allocated), parse_quantity(fair)) == shown[name], line

        # The borrow happened and reclaim took it back: the peak and the evictions shown are the
        # cluster's Reclaimed events and team-a's Queue status.
        team_a = next(line.split() for line in printed if line.startswith("  team-a "))
        assert float(team_a[3]) == 14
        evicted = int(team_a[4])
        status = json.loads(up.kubectl("get", "queue", "team-a", "-o", "json"))["status"]
        assert status["evictedPods"] == evicted == 6
        events = json.loads(up.kubectl("get", "events", "--field-selector=reason=Reclaimed", "-o", "json"))
        assert len({e["involvedObject"]["name"] for e in events["items"]}) == evicted

        # Every GPU is held, by the claims of running pods.
        claims = json.loads(up.kubectl("get", "resourceclaims", "-o", "json"))["items"]
        held = {
            (r["pool"], r["device"])
            for c in claims
            if c.get("status", {}).get("reservedFor")
            for r in c["status"]["allocation"]["devices"]["results"]
        }
        assert "  GPUs in use: 16 of 16" in printed and len(held) == 16


def test_quiet_up_runs_every_example() -> None:
    examples = sorted((REPO_ROOT / "manifests" / "examples").glob("*.yaml"))
    with tessera_up() as up:
        printed = up.read_until("Press Ctrl-C", timeout=180)
        assert not any(line.startswith("step ") for line in printed)
        slices = json.loads(up.kubectl("get", "resourceslices", "-o", "json"))["items"]
        assert sorted(s["spec"]["nodeName"] for s in slices) == ["gpu-node-0", "gpu-node-1"]

        for example in examples:
            up.kubectl("apply", "-f", str(example))
        expected = 15  # quarter 1, time-sliced 2, whole GPU 1, training Job 2, two teams 3 + 2, gang 4
        deadline = time.monotonic() + 120
        phases: dict[str, str] = {}
        while time.monotonic() < deadline:
            pods = json.loads(up.kubectl("get", "pods", "-o", "json"))["items"]
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase", "") for p in pods}
            if len(phases) == expected and set(phases.values()) == {"Running"}:
                break
            time.sleep(0.5)
        assert len(phases) == expected and set(phases.values()) == {"Running"}, phases
        # The extender writes Queue status every few seconds: wait for it to count the running pods.
        allocated: dict[str, str] = {}
        while time.monotonic() < deadline:
            queues = json.loads(up.kubectl("get", "queues", "team-vision", "team-speech", "-o", "json"))
            allocated = {
                q["metadata"]["name"]: (q.get("status") or {}).get("allocated", {}).get("gpu", "")
                for q in queues["items"]
            }
            if allocated == {"team-vision": "3", "team-speech": "2"}:
                break
            time.sleep(0.5)
        assert allocated == {"team-vision": "3", "team-speech": "2"}
        # The plugin line `tessera up` prints, run as printed: the queue table from the extender's
        # report, and the driver's 16 GPUs with the examples' fractions on them.
        plugin = next(line.split() for line in printed if line.startswith("  kubectl tessera queues"))
        url = plugin[plugin.index("--extender-url") + 1]
        kubeconfig = str(up.state_dir / "admin.kubeconfig")
        for command, wanted in (("queues", "team-vision"), ("gpus", "gpu-node-1")):
            shown = subprocess.run(
                [sys.executable, "-c", PLUGIN, command, "--kubeconfig", kubeconfig, "--extender-url", url],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            if command == "queues":
                row = next(line.split() for line in shown if line.split()[0] == wanted)  # maybe a child
                assert row[5] == "3" and row[-1] == "0", shown  # ALLOC 3, no pod waiting
            else:
                assert len(shown) == 17 and any(line.startswith(wanted) for line in shown), shown
        # namespace-defaults.yaml: the Job names neither queue nor scheduler; its Namespace does.
        nlp: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            nlp = json.loads(up.kubectl("get", "pods", "-n", "team-nlp", "-o", "json"))["items"]
            if nlp and nlp[0].get("status", {}).get("phase") == "Running":
                break
            time.sleep(0.5)
        assert [p["metadata"]["labels"].get("scheduling.tessera.dev/queue") for p in nlp] == ["team-nlp"]
        assert nlp[0]["spec"]["schedulerName"] == "tessera" and nlp[0]["status"]["phase"] == "Running"
        # The admission webhooks are registered against the extender: an invalid Queue is refused.
        refused = subprocess.run(
            [
                str(up.bin_dir / "kubectl"),
                f"--kubeconfig={up.state_dir / 'admin.kubeconfig'}",
                "apply",
                "-f",
                "-",
            ],
            input=json.dumps(
                {
                    "apiVersion": "scheduling.tessera.dev/v1alpha1",
                    "kind": "Queue",
                    "metadata": {"name": "orphan"},
                    "spec": {"parent": "no-such-queue"},
                }
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        assert refused.returncode != 0
        assert "parent queue 'no-such-queue' of 'orphan' does not exist" in refused.stderr
