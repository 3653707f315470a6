"""The node agent's kubelet parts that need no API server: claim names and the registration handshake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dra_driver.plugin import DraPlugin
from tessera.dev.nodeagent import Registrar, pod_claim_names

from .fakes import DRIVER, FakeClaims, gpu, make_plugin


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


async def test_registrar_handshakes_and_notices_a_restart(root: Path) -> None:
    def make() -> DraPlugin:
        return make_plugin(root, FakeClaims(), [gpu(0)])[0]

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
