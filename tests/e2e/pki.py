"""Certificates and kubeconfigs for a throw-away test cluster.

One CA signs the API server's serving certificate and one client certificate
per identity (the Common Name is the user, each Organisation a group), as
kubeadm does; the service-account key pair signs tokens. EC P-256 keys: fast
to make, accepted by every component of Kubernetes 1.26.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = dt.timedelta(days=1)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Identity:
    user: str
    cert_file: Path
    key_file: Path


class Pki:
    """A CA in ``folder`` that issues serving and client certificates."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-e2e-ca")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 7 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = cert.public_bytes(serialization.Encoding.PEM)
        self.ca_file = _write(folder / "ca.crt", self.ca_pem)
        self.ca_key_file = _write(folder / "ca.key", _pem_key(self._key))
        sa_key = ec.generate_private_key(ec.SECP256R1())
        self.sa_key_file = _write(folder / "sa.key", _pem_key(sa_key))
        self.sa_pub_file = _write(
            folder / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )

    def _issue(
        self,
        stem: str,
        *,
        common_name: str,
        groups: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
    ) -> Identity:
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 7 * _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server_names:
            sans: list[x509.GeneralName] = []
            for name in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(name)))
                except ValueError:
                    sans.append(x509.DNSName(name))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return Identity(
            user=common_name,
            cert_file=_write(
                self.folder / f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM)
            ),
            key_file=_write(self.folder / f"{stem}.key", _pem_key(key)),
        )

    def serving(self, stem: str, *, names: tuple[str, ...]) -> Identity:
        return self._issue(stem, common_name=names[0], server_names=names)

    def client(self, stem: str, *, user: str, groups: tuple[str, ...] = ()) -> Identity:
        return self._issue(stem, common_name=user, groups=groups)

    def kubeconfig(self, identity: Identity, *, server: str, path: Path) -> Path:
        """A kubeconfig file for ``identity`` talking to ``server``."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [
                {
                    "name": identity.user,
                    "user": {
                        "client-certificate": str(identity.cert_file),
                        "client-key": str(identity.key_file),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": identity.user}}],
            "current-context": "e2e",
        }
        path.write_text(yaml.safe_dump(doc))
        return path
