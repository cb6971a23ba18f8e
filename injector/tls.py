"""A server SSLContext that follows its certificate files.

``ReloadingTls.check()`` compares the files' (mtime, size, inode) with what was
loaded and calls ``load_cert_chain`` on the same context when they change:
connections made afterwards get the new certificate, open ones keep theirs.
A half-written pair (key and certificate not matching yet) is logged and
retried at the next check. Also derives the plan-signing keys from the key
file, keeping the previous one so notes signed just before a rotation verify.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import ssl
from pathlib import Path

from hcs_bus.telemetry import logger

_log = logger("hcs.injector.tls")


def _stamp(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ReloadingTls:
    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.keys: list[bytes] = []
        self._loaded: tuple[tuple[int, int, int], ...] | None = None
        self.reloads = 0
        self._load()

    def _load(self) -> None:
        stamp = (_stamp(self.cert_file), _stamp(self.key_file))
        # Try a scratch context first: a failed load_cert_chain can leave a
        # context holding a certificate without its key.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
        self.context.load_cert_chain(self.cert_file, self.key_file)
        key = hashlib.sha256(b"hcs-plan-signing\0" + self.key_file.read_bytes()).digest()
        if not self.keys or self.keys[0] != key:
            self.keys = [key, *self.keys[:1]]
        self._loaded = stamp

    def check(self) -> bool:
        """Reload if the files changed; True when a new certificate was loaded."""
        try:
            stamp = (_stamp(self.cert_file), _stamp(self.key_file))
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
