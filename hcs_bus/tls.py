"""A server SSLContext that follows its certificate files, and the names a
verified client certificate carries.

``ReloadingTls.check()`` compares the files' (mtime, size, inode) with what was
loaded and calls ``load_cert_chain`` on the same context when they change:
connections made afterwards get the new certificate, open ones keep theirs.
A half-written pair (key and certificate not matching yet) is logged and
retried at the next check.

With ``client_ca_file`` the server asks every client for a certificate and
refuses the handshake of one that does not chain to that CA (or is not for
client auth); a client that sends none is let through the handshake
(``CERT_OPTIONAL``), so the server can answer it with a 401 that says why and
still serve probes without one. A CA file that changes is loaded again
(added: a CA trusted before stays trusted until a restart).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hcs_bus.errors import ConfigError
from hcs_bus.telemetry import logger

_log = logger("hcs.tls")
Stamp = tuple[int, int, int]


def _stamp(path: Path) -> Stamp:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ReloadingTls:
    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        client_ca_file: str | Path | None = None,
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.client_ca_file = Path(client_ca_file) if client_ca_file else None
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.client_ca_file is not None:
            self.context.verify_mode = ssl.CERT_OPTIONAL
        self._loaded: tuple[Stamp, ...] | None = None
        self.reloads = 0
        self._load()

    def _files(self) -> tuple[Path, ...]:
        extra = (self.client_ca_file,) if self.client_ca_file is not None else ()
        return (self.cert_file, self.key_file, *extra)

    def _load(self) -> None:
        stamp = tuple(_stamp(p) for p in self._files())
        # Try a scratch context first: a failed load_cert_chain can leave a
        # context holding a certificate without its key.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
        self.context.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            self.context.load_verify_locations(cafile=self.client_ca_file)
        self._loaded = stamp

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was loaded."""
        try:
            stamp = tuple(_stamp(p) for p in self._files())
            if stamp == self._loaded:
                return False
            self._load()
        except (OSError, ssl.SSLError) as exc:
            _log.warning("tls_reload_failed", cert=str(self.cert_file), error=repr(exc))
            return False
        self.reloads += 1
        _log.info("tls_reloaded", cert=str(self.cert_file), reloads=self.reloads)
        return True

    async def watch(self, *, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.check()


def server_context(
    cert_file: str | Path,
    key_file: str | Path,
    *,
    client_ca_file: str | Path | None = None,
    settings: str,
) -> ReloadingTls:
    """``ReloadingTls`` for a server, or a ``ConfigError`` naming ``settings``
    (the settings that gave the files) and why they cannot be loaded."""
    try:
        return ReloadingTls(cert_file, key_file, client_ca_file=client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = f" {exc.filename}" if isinstance(exc, OSError) and exc.filename else ""
        raise ConfigError(f"{settings}: cannot load{where}: {why}") from exc


def peer_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """The subject Common Names and DNS / URI names of a verified peer
    certificate, as ``SSLSocket.getpeercert()`` decodes it (empty for none)."""
    if not peercert:
        return set()
    names = {
        value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"
    }
    names |= {value for kind, value in peercert.get("subjectAltName", ()) if kind in ("DNS", "URI")}
    return names


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
