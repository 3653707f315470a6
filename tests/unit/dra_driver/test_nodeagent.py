"""The node agent's kubelet parts that need no API server: claim names and the registration handshake."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.nodeagent import Registrar, pod_claim_names
from dra_driver.plugin import build_plugin
from dra_driver.sharing import RecordingRunner

from .fakes import DRIVER, NODE, FakeClaims, gpu


def _pod(spec_claims: list[dict[str, Any]], statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"spec": {"resourceClaims": spec_claims}, "status": {"resourceClaimStatuses": statuses or []}}


def test_claim_names_from_direct_and_generated_claims() -> None:
    pod = _pod(
        [{"name": "a", "resourceClaimName": "shared"}, {"name": "b", "resourceClaimTemplateName": "t"}],
        [{"name": "b", "resourceClaimName": "pod-b-xyz"}],
    )
    assert pod_claim_names(pod) == ["shared", "pod-b-xyz"]
    assert pod_claim_names({"spec": {}}) == []


def test_generated_claim_not_named_yet_means_wait() -> None:
    assert pod_claim_names(_pod([{"name": "b", "resourceClaimTemplateName": "t"}])) is None


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_registrar_handshakes_and_notices_a_restart(root: Path) -> None:
    def make() -> Any:
        plugin, _ = build_plugin(
            driver_name=DRIVER,
            node_name=NODE,
            gpus=[gpu(0)],
            claims=FakeClaims(),
            runner=RecordingRunner(),
            plugin_dir=root / "plugins",
            registry_dir=root / "registry",
            cdi_dir=root / "cdi",
            checkpoint_dir=root / "state",
        )
        return plugin

    registrar = Registrar(root / "registry")
    plugin = make()
    await plugin.start()
    await registrar.refresh()
    assert registrar.drivers[DRIVER].endpoint == str(plugin.sockets.dra)
    assert plugin.registered.is_set()
    await plugin.stop(grace_s=0)
    await registrar.refresh()
    assert registrar.drivers == {}  # socket removed = deregistered

    restarted = make()
    await restarted.start()
    await registrar.refresh()
    assert DRIVER in registrar.drivers and restarted.registered.is_set()
    await restarted.stop(grace_s=0)
