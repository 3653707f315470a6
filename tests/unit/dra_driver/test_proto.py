"""The generated gRPC code is current, and the wire names match what the kubelet calls."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

from dra_driver.proto import dra_v1_pb2, dra_v1beta1_pb2, health_v1_pb2, health_v1alpha1_pb2, registration_pb2

REPO = Path(__file__).resolve().parents[3]
PROTO_DIR = REPO / "dra_driver" / "proto"


def test_generated_files_are_up_to_date(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(REPO / "hack" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    generated = sorted(p.name for p in (tmp_path / "dra_driver" / "proto").iterdir())
    committed = sorted(p.name for p in PROTO_DIR.glob("*_pb2*"))
    assert generated == committed
    _, mismatch, errors = filecmp.cmpfiles(
        tmp_path / "dra_driver" / "proto", PROTO_DIR, generated, shallow=False
    )
    assert mismatch == [] and errors == [], f"run `make proto`: stale {mismatch + errors}"


def test_service_names_match_the_kubelet() -> None:
    services = {
        registration_pb2: "pluginregistration.Registration",
        dra_v1_pb2: "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        dra_v1beta1_pb2: "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        health_v1_pb2: "v1.DRAResourceHealth",
        health_v1alpha1_pb2: "v1alpha1.DRAResourceHealth",
    }
    for module, full_name in services.items():
        names = [s.full_name for s in module.DESCRIPTOR.services_by_name.values()]
        assert names == [full_name]


def test_field_numbers_follow_the_protocol() -> None:
    device = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in device.items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    info = registration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in info.items()} == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert health_v1_pb2.HealthStatus.Value("UNHEALTHY") == 2


def test_v1_and_v1beta1_messages_interoperate_on_the_wire() -> None:
    # A v1 answer without share_id decodes as v1beta1 and back, byte for byte.
    response = dra_v1_pb2.NodePrepareResourcesResponse()
    entry = response.claims["uid-1"]
    entry.devices.add(request_names=["gpu"], pool_name="n", device_name="gpu-0", cdi_device_ids=["k/c=x"])
    decoded = dra_v1beta1_pb2.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    assert decoded.claims["uid-1"].devices[0].device_name == "gpu-0"
    assert decoded.SerializeToString() == response.SerializeToString()
