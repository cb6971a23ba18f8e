"""Development certificates: a CA, a serving certificate signed by it and,
when asked, a client certificate signed by it too.

``make_dev_certs(out_dir, dns=[...], ips=[...], client="hcs-kube-scheduler")``
writes ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key`` (and ``client.crt``,
``client.key`` for the client named; keys 0600) and returns their paths with
the ``caBundle`` (base64 PEM of the CA) a MutatingWebhookConfiguration needs.
Used by ``hcs certs``, ``hcs up`` and the tests; for production use
cert-manager or your own PKI.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class DevCerts:
    ca_file: Path
    ca_key_file: Path
    cert_file: Path
    key_file: Path
    ca_bundle_b64: str
    client_cert_file: Path | None = None  # signed by the same CA (client auth only)
    client_key_file: Path | None = None


def make_dev_certs(
    out_dir: Path,
    *,
    dns: list[str],
    ips: list[str],
    client: str | None = None,
    days: int = 365,
    now: dt.datetime | None = None,
) -> DevCerts:
    """A fresh CA and a serving certificate for ``dns`` names and ``ips``;
    with ``client``, a client certificate whose Common Name is ``client``."""
    if not dns and not ips:
        raise ValueError("a serving certificate needs at least one DNS name or IP")
    now = now or dt.datetime.now(dt.UTC)
    out_dir.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-dev-ca")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now=now, days=days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    key, cert = _leaf(
        (dns or ips)[0],
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        names=names,
        now=now,
        days=days,
    )
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    files = DevCerts(
        ca_file=out_dir / "ca.crt",
        ca_key_file=out_dir / "ca.key",
        cert_file=out_dir / "tls.crt",
        key_file=out_dir / "tls.key",
        ca_bundle_b64=base64.b64encode(ca_pem).decode(),
    )
    _write(files.ca_key_file, _key_pem(ca_key), private=True)
    _write(files.ca_file, ca_pem)
    _write(files.key_file, _key_pem(key), private=True)
    _write(files.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    if client is None:
        return files
    key, cert = _leaf(
        client,
        ca_name,
        ca_key,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        names=[],
        now=now,
        days=days,
    )
    client_key, client_cert = out_dir / "client.key", out_dir / "client.crt"
    _write(client_key, _key_pem(key), private=True)
    _write(client_cert, cert.public_bytes(serialization.Encoding.PEM))
    return DevCerts(
        ca_file=files.ca_file,
        ca_key_file=files.ca_key_file,
        cert_file=files.cert_file,
        key_file=files.key_file,
        ca_bundle_b64=files.ca_bundle_b64,
        client_cert_file=client_cert,
        client_key_file=client_key,
    )


def _leaf(
    common_name: str,
    ca_name: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    usage: x509.ObjectIdentifier,
    names: list[x509.GeneralName],
    now: dt.datetime,
    days: int,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and its certificate, signed by the CA, for ``usage`` (server or client auth)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _builder(subject, ca_name, key.public_key(), now=now, days=days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    *,
    now: dt.datetime,
    days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not ca,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
