"""The node agent's kubelet parts that need no API server: claim names, the registration handshake
and the created Nodes' labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.plugin import DraPlugin
from tessera.dev.nodeagent import Registrar, _parse_args, labels_by_node, pod_claim_names

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


def test_node_labels_are_grouped_by_node_and_a_malformed_one_refused() -> None:
    args = _parse_args(
        [
            "--kubeconfig=kc",
            "--profile=p.yaml",
            "--node-name=a",
            "--node-name=b",
            "--node-label=a:example.com/rack=rack0",
            "--node-label=a:example.com/block=block0",
            "--node-label=b:example.com/rack=rack1",
        ]
    )
    assert labels_by_node(args.node_label) == {
        "a": {"example.com/rack": "rack0", "example.com/block": "block0"},
        "b": {"example.com/rack": "rack1"},
    }
    with pytest.raises(SystemExit):
        _parse_args(["--kubeconfig=kc", "--profile=p.yaml", "--node-name=a", "--node-label=a-rack0"])
