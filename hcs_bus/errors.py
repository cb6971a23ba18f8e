"""The HCS error tree. Third-party errors are wrapped at the adapters and
chained with ``from``; on the bus the error type decides the ack::

    HcsError
    ├── ConfigError            bad settings, flags or data files (exit 2)
    ├── PermanentError         retrying cannot help → term + dead letter
    │   └── BadMessage         undecodable / invalid bus message
    ├── TemporaryError         retry later (``delay_s``) → nak(delay)
    │   ├── BusTimeout         a request or publish got no answer in time
    │   ├── BusUnavailable     no connection to NATS
    │   └── CasConflict        a KV compare-and-set lost the race
    └── KubeError              a Kubernetes API call failed
        ├── KubeUnavailable    no cluster configured / unreachable
        ├── KubeNotFound       404
        ├── KubeConflict       409 (stale resourceVersion)
        ├── KubeTooManyRequests 429 (e.g. an Eviction refused by a PDB)
        └── KubeInvalid        400/422
"""

from __future__ import annotations


class HcsError(Exception):
    """Base of every error HCS raises on purpose."""


class ConfigError(HcsError):
    """A setting, flag or data file is wrong; the message names field and value."""


class PermanentError(HcsError):
    """Retrying cannot help."""


class BadMessage(PermanentError):
    """A bus message that cannot be decoded or is invalid."""


class TemporaryError(HcsError):
    """Retrying later may help."""

    def __init__(self, message: str, *, delay_s: float = 1.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class BusTimeout(TemporaryError):
    pass


class BusUnavailable(TemporaryError):
    pass


class CasConflict(TemporaryError):
    pass


class KubeError(HcsError):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KubeUnavailable(KubeError):
    pass


class KubeNotFound(KubeError):
    pass


class KubeConflict(KubeError):
    pass


class KubeTooManyRequests(KubeError):
    pass


class KubeInvalid(KubeError):
    pass
