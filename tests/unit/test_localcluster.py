"""Pure parts of the control-plane harness: certificates and ports (no processes started)."""

from __future__ import annotations

import socket
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.dev.localcluster import free_port
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
