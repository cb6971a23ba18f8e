"""The webhook's server SSLContext (``hcs_bus.tls.ReloadingTls``: it follows
its certificate files), which also derives the plan-signing keys from the key
file, keeping the previous one so notes signed just before a rotation verify.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from hcs_bus import tls


class ReloadingTls(tls.ReloadingTls):
    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.keys: list[bytes] = []
        super().__init__(cert_file, key_file)

    def _load(self) -> None:
        super()._load()
        key = hashlib.sha256(b"hcs-plan-signing\0" + self.key_file.read_bytes()).digest()
        if not self.keys or self.keys[0] != key:
            self.keys = [key, *self.keys[:1]]
