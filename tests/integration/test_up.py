"""`tessera up` as a newcomer runs it: the README's main command, then the examples it prints."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tessera.dev.localcluster import REPO_ROOT, find_binaries


def _wait_for_line(process: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines
    raise AssertionError(f"`tessera up` never printed {marker!r}; it printed:\n" + "\n".join(lines))


def test_up_runs_the_examples_and_tears_down_on_ctrl_c() -> None:
    bin_dir = find_binaries()
    # Short on purpose: the driver's unix sockets live below it (sun_path holds 107 bytes).
    state_dir = Path(tempfile.mkdtemp(prefix="tessera-up-"))
    process = subprocess.Popen(
        [sys.executable, "-m", "tessera", "up", "--nodes=2", f"--state-dir={state_dir}"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TESSERA_K8S_BIN": str(bin_dir)},
    )
    kubeconfig = state_dir / "admin.kubeconfig"

    def kubectl(*args: str) -> str:
        return subprocess.run(
            [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    try:
        printed = _wait_for_line(process, "Press Ctrl-C", timeout=120)
        assert any(f"export KUBECONFIG={kubeconfig}" in line for line in printed)
        slices = json.loads(kubectl("get", "resourceslices", "-o", "json"))["items"]
        assert sorted(s["spec"]["nodeName"] for s in slices) == ["gpu-node-0", "gpu-node-1"]

        kubectl("apply", "-f", str(REPO_ROOT / "manifests/examples/quarter-gpu.yaml"))
        kubectl("apply", "-f", str(REPO_ROOT / "manifests/examples/whole-gpu.yaml"))
        deadline = time.monotonic() + 60
        phases: dict[str, str] = {}
        while time.monotonic() < deadline:
            pods = json.loads(kubectl("get", "pods", "-o", "json"))["items"]
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase", "") for p in pods}
            if len(phases) == 2 and set(phases.values()) == {"Running"}:
                break
            time.sleep(0.5)
        assert phases == {"quarter-gpu-inference": "Running", "whole-gpu-trainer": "Running"}
        queues = kubectl("get", "queues")
        assert queues.splitlines()[0].split()[:3] == ["NAME", "PARENT", "PRIORITY"]
        assert "default" in queues
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
