"""Pure parts of the control-plane harness: certificates, ports and node layouts (no processes
started)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from extender.policy.topology import parse_topology
from tessera.cli import _up_parser
from tessera.dev.localcluster import BLOCK_LABEL, RACK_LABEL, free_port, node_layout
from tessera.dev.pki import CertificateAuthority, write_service_account_key


def test_issued_certificates_chain_to_the_ca_and_carry_identity(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path)
    admin = ca.issue("admin", "tessera-admin", organization="system:masters")
    serving = ca.issue("apiserver", "kube-apiserver", server=True, hosts=("127.0.0.1", "localhost"))
    ca_cert = x509.load_pem_x509_certificate(ca.cert_path.read_bytes())

    admin_cert = x509.load_pem_x509_certificate(admin.cert_pem)
    admin_cert.verify_directly_issued_by(ca_cert)
    assert admin_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    usages = admin_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]

    serving_cert = x509.load_pem_x509_certificate(serving.cert_pem)
    serving_cert.verify_directly_issued_by(ca_cert)
    names = serving_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert oct(serving.key_path.stat().st_mode & 0o777) == "0o600"


def test_service_account_keys_are_a_matching_pair(tmp_path: Path) -> None:
    private_path, public_path = write_service_account_key(tmp_path)
    private_key = serialization.load_pem_private_key(private_path.read_bytes(), password=None)
    public_key = serialization.load_pem_public_key(public_path.read_bytes())
    encoding = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert private_key.public_key().public_bytes(*encoding) == public_key.public_bytes(*encoding)
    assert oct(private_path.stat().st_mode & 0o777) == "0o600"


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = {free_port() for _ in range(5)}
    assert len(ports) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize(
    ("text", "nodes", "labels", "levels"),
    [
        # a count: flat, the extender keeps its default levels
        ("3", 3, {"gpu-node-2": {}}, ""),
        # racks x nodes: 2 x 3 = 6 nodes; node 4 is the 2nd of rack 1 (4 // 3 = 1)
        ("2x3", 6, {"gpu-node-4": {RACK_LABEL: "rack1"}}, f"rack={RACK_LABEL},host=kubernetes.io/hostname"),
        # blocks x racks x nodes, the issue's 2 x 4 x 4 = 32: node 21 is in rack 21 // 4 = 5,
        # block 5 // 4 = 1, rack 5 % 4 = 1 of it
        (
            "2x4x4",
            32,
            {
                "gpu-node-0": {BLOCK_LABEL: "block0", RACK_LABEL: "rack0"},
                "gpu-node-21": {BLOCK_LABEL: "block1", RACK_LABEL: "rack1"},
                "gpu-node-31": {BLOCK_LABEL: "block1", RACK_LABEL: "rack3"},
            },
            f"block={BLOCK_LABEL},rack={RACK_LABEL},host=kubernetes.io/hostname",
        ),
    ],
)
def test_node_layouts_label_each_node_into_its_rack_and_block(
    text: str, nodes: int, labels: dict[str, dict[str, str]], levels: str
) -> None:
    layout = node_layout(text)
    assert len(layout.nodes) == nodes
    assert {name: layout.nodes[name] for name in labels} == labels
    assert layout.levels == levels


def test_a_layout_s_levels_place_its_nodes_in_the_racks_the_labels_name() -> None:
    """What `tessera up --nodes 2x2x2` hands the extender reads back as 4 racks of 2 nodes."""
    layout = node_layout("2x2x2")
    topology = parse_topology(layout.levels)
    rack = topology.level("rack")
    assert rack is not None
    racks = {
        name: topology.domain_of({**labels, "kubernetes.io/hostname": name}, rack)
        for name, labels in layout.nodes.items()
    }
    assert racks == {
        "gpu-node-0": "block0/rack0",
        "gpu-node-1": "block0/rack0",
        "gpu-node-2": "block0/rack1",
        "gpu-node-3": "block0/rack1",
        "gpu-node-4": "block1/rack0",
        "gpu-node-5": "block1/rack0",
        "gpu-node-6": "block1/rack1",
        "gpu-node-7": "block1/rack1",
    }


@pytest.mark.parametrize("text", ["0", "2x0x4", "2x4x4x2", "two", "4x", ""])
def test_a_layout_that_is_not_counts_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="want N, RACKSxN or BLOCKSxRACKSxN"):
        node_layout(text)


def test_up_parses_a_layout_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    _up_parser(parser.add_subparsers())
    assert len(parser.parse_args(["up", "--nodes", "2x4x4"]).nodes.nodes) == 32
    assert len(parser.parse_args(["up"]).nodes.nodes) == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--nodes", "2x"])
    assert "want N, RACKSxN or BLOCKSxRACKSxN" in capsys.readouterr().err
