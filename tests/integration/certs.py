"""A throwaway PKI for TLS tests: a CA, a server certificate and client certificates.

``make_pki(directory, ["alice", "bob"])`` writes PEM files (keys unencrypted) and returns their
paths: the CA, a server certificate for ``localhost`` and ``127.0.0.1`` (SANs), and one client
certificate per name with subject ``CN=<name>,OU=clients,O=pidgate-test``. ``renew_server_cert``
overwrites the server certificate and key in place with a new key pair and serial (for reload
tests). Needs the ``cryptography`` package.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ORGANIZATION = "pidgate-test"
CLIENT_OU = "clients"


@dataclass(frozen=True)
class ClientCert:
    name: str
    cert: Path
    key: Path

    @property
    def subject(self) -> str:
        """As Kafka's SSL principal builder writes it (RFC 2253, most specific first)."""
        return f"CN={self.name},OU={CLIENT_OU},O={ORGANIZATION}"


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    clients: dict[str, ClientCert]

    def client(self, name: str) -> ClientCert:
        return self.clients[name]


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, mode: int) -> None:
    """Atomically (write + rename), so a watcher never reads a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(path, pem, 0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    _write(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _name(cn: str, ou: str | None = None) -> x509.Name:
    # x509 order is least specific first; RFC 2253 strings (and Kafka principals) print reversed.
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION)]
    if ou is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def _leaf(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    usage: x509.ObjectIdentifier,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    builder = (
        _builder(subject, ca_cert.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def _issue_server(pki: Pki) -> None:
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _new_key()
    cert = _leaf(
        _name("localhost"),
        key,
        ca_cert,
        ca_key,
        ExtendedKeyUsageOID.SERVER_AUTH,
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    # Two files can't change atomically together: reload tests should act after this returns.
    _write_key(key, pki.server_key)
    _write_cert(cert, pki.server_cert)


def make_pki(directory: Path, client_names: list[str]) -> Pki:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_name = _name("pidgate-test-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    clients: dict[str, ClientCert] = {}
    for name in client_names:
        key = _new_key()
        cert = _leaf(_name(name, CLIENT_OU), key, ca_cert, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
        client = ClientCert(
            name, directory / f"client-{name}.pem", directory / f"client-{name}.key"
        )
        _write_cert(cert, client.cert)
        _write_key(key, client.key)
        clients[name] = client
    pki = Pki(
        directory=directory,
        ca_cert=directory / "ca.pem",
        ca_key=directory / "ca.key",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        clients=clients,
    )
    _write_cert(ca_cert, pki.ca_cert)
    _write_key(ca_key, pki.ca_key)
    _issue_server(pki)
    return pki


def renew_server_cert(pki: Pki) -> int:
    """Write a new server key and certificate (new serial) over the old files; return the serial."""
    _issue_server(pki)
    return server_serial(pki)


def server_serial(pki: Pki) -> int:
    return x509.load_pem_x509_certificate(pki.server_cert.read_bytes()).serial_number
