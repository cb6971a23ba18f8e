"""Development certificates verify; the server picks up a rotated certificate."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from hcs_bus.certs import DevCerts, make_dev_certs


def test_dev_certs_make_a_chain_that_verifies(tmp_path: Path) -> None:
    certs = make_dev_certs(tmp_path, dns=["hcs-webhook.hcs-system.svc"], ips=["127.0.0.1"])
    ca = x509.load_pem_x509_certificate(certs.ca_file.read_bytes())
    leaf = x509.load_pem_x509_certificate(certs.cert_file.read_bytes())
    leaf.verify_directly_issued_by(ca)
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["hcs-webhook.hcs-system.svc"]
    assert base64.b64decode(certs.ca_bundle_b64) == certs.ca_file.read_bytes()
    assert certs.key_file.stat().st_mode & 0o077 == 0
    # and the standard library accepts the chain for that name
    context = ssl.create_default_context(cafile=str(certs.ca_file))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.cert_file, certs.key_file)
    assert context.check_hostname


async def _served_serial(url: str, ca_file: Path) -> int:
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca_file))
    _, writer = await asyncio.open_connection(
        host, int(port), ssl=context, server_hostname="localhost"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


async def test_rotated_certificate_is_served_without_restart(
    webhook_factory: Callable[..., Any], certs: DevCerts
) -> None:
    async with webhook_factory() as hook:
        first = await _served_serial(hook.injector.url, certs.ca_file)
        assert first == x509.load_pem_x509_certificate(certs.cert_file.read_bytes()).serial_number
        rotated = make_dev_certs(certs.cert_file.parent, dns=["localhost"], ips=["127.0.0.1"])
        deadline = asyncio.get_running_loop().time() + 5
        serial = first
        while serial == first and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            serial = await _served_serial(hook.injector.url, rotated.ca_file)
    expected = x509.load_pem_x509_certificate(rotated.cert_file.read_bytes()).serial_number
    assert serial == expected != first
