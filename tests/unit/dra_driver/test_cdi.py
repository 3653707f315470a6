"""CDI spec content, naming and the atomic write."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from dra_driver import cdi
from dra_driver.devices.share import ContainerEdits

NODES = ContainerEdits(env={"B": "2", "A": "1"}, device_nodes=("/dev/ctl",))


def test_spec_has_the_claim_edits_and_per_device_edits() -> None:
    devices = [
        cdi.CdiDevice("gpu-0", ("/dev/nvidia0",), mounts=(("/host/mps/pipe", "/tmp/nvidia-mps"),)),
        cdi.CdiDevice("gpu-1", ("/dev/nvidia1",)),
    ]
    record = {cdi.record_annotation("gpu.tessera.dev"): '{"state":"completed"}'}
    spec = cdi.build_claim_spec("gpu.tessera.dev", "uid-1", devices, NODES, record)
    assert spec["cdiVersion"] == cdi.CDI_VERSION
    assert spec["annotations"] == {"gpu.tessera.dev/claim-record": '{"state":"completed"}'}
    assert cdi.spec_annotation(spec, "gpu.tessera.dev/claim-record") == '{"state":"completed"}'
    assert cdi.spec_device_names(spec, "uid-1") == {"gpu-0", "gpu-1"}
    assert spec["kind"] == "k8s.gpu.tessera.dev/claim"
    assert spec["containerEdits"]["env"] == ["A=1", "B=2"]
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/ctl"}]
    assert "mounts" not in spec["containerEdits"]  # written only when the profile has some
    first, second = spec["devices"]
    assert first["name"] == "uid-1-gpu-0"
    assert first["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert first["containerEdits"]["mounts"] == [
        {
            "hostPath": "/host/mps/pipe",
            "containerPath": "/tmp/nvidia-mps",
            "options": ["rw", "nosuid", "nodev", "bind"],
        }
    ]
    assert second["containerEdits"]["mounts"] == []


def test_device_id_names_the_spec_device() -> None:
    assert cdi.cdi_device_id("gpu.tessera.dev", "uid-1", "gpu-3") == "k8s.gpu.tessera.dev/claim=uid-1-gpu-3"


def test_write_is_atomic_readable_and_removable(tmp_path: Path) -> None:
    path = cdi.spec_path(tmp_path / "cdi", "gpu.tessera.dev", "uid-1")
    assert path.name == "k8s.gpu.tessera.dev-claim_uid-1.json"
    spec = cdi.build_claim_spec(
        "gpu.tessera.dev", "uid-1", [cdi.CdiDevice("gpu-0", ("/dev/nvidia0",))], ContainerEdits(), {}
    )
    cdi.write_claim_specs({path: spec})
    cdi.write_claim_specs({path: spec})  # replacing an existing spec works the same way
    assert json.loads(path.read_text()) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left behind
    assert cdi.claim_specs(path.parent, "gpu.tessera.dev") == {"uid-1": path}
    cdi.remove_claim_specs([path])
    cdi.remove_claim_specs([path])  # idempotent
    assert not path.exists()


def test_many_specs_in_one_write(tmp_path: Path) -> None:
    specs = {
        cdi.spec_path(tmp_path, "gpu.tessera.dev", f"uid-{i}"): cdi.build_claim_spec(
            "gpu.tessera.dev", f"uid-{i}", [cdi.CdiDevice("gpu-0", ("/dev/nvidia0",))], ContainerEdits(), {}
        )
        for i in range(20)
    }
    cdi.write_claim_specs(specs)
    assert {path: json.loads(path.read_text()) for path in specs} == specs
    assert sorted(cdi.claim_specs(tmp_path, "gpu.tessera.dev")) == sorted(f"uid-{i}" for i in range(20))


def test_leftover_temp_files_of_this_driver_only_are_removed(tmp_path: Path) -> None:
    ours = tmp_path / ".k8s.gpu.tessera.dev-claim_uid-1.json.x8k2.tmp"
    theirs = tmp_path / ".k8s.other.example.com-claim_uid-2.json.a1b2.tmp"
    spec = tmp_path / "k8s.gpu.tessera.dev-claim_uid-3.json"
    for path in (ours, theirs, spec):
        path.write_text("{")
    assert cdi.remove_leftover_temp_files(tmp_path, "gpu.tessera.dev") == [ours]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([theirs.name, spec.name])
