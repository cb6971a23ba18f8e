"""The HCS error tree. Third-party errors are wrapped at the adapters and
chained with ``from``; on the bus the error type decides the ack::

    HcsError
    ├── ConfigError            bad settings, flags or data files (exit 2)
    ├── PermanentError         retrying cannot help → term + dead letter
    │   ├── BadMessage         undecodable / invalid bus message
    │   └── StaleWrite         a publish found a later message on its subject
    ├── TemporaryError         retry later (``delay_s``) → nak(delay)
    │   ├── BusTimeout         a request or publish got no answer in time
    │   ├── BusUnavailable     no connection to NATS
    │   └── CasConflict        a KV compare-and-set lost the race
    │       └── KvContention   ... on every try, up to a bound (``hcs_bus.kvcas``)
    └── KubeError              a Kubernetes API call failed
        ├── KubeUnavailable    no cluster configured / unreachable
        ├── KubeNotFound       404
        ├── KubeConflict       409 (stale resourceVersion)
        ├── KubeTooManyRequests 429 (e.g. an Eviction refused by a PDB)
        └── KubeInvalid        400/422

    DemandError (ValueError)   a pod is unreadable or asks for something wrong:
    │                          admission refuses it, the scheduler fails it on every node
    └── JobError               which job the pod belongs to cannot be told
                               (two conventions give it different sizes, a count is no count)
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


class StaleWrite(PermanentError):
    """A publish expected its subject's last stream sequence and the stream
    holds another: something was stored there since. ``last_seq`` is the
    one it holds (0: the subject is empty)."""

    def __init__(self, message: str, *, last_seq: int) -> None:
        super().__init__(message)
        self.last_seq = last_seq


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


class KvContention(CasConflict):
    """A KV key kept changing under a compare-and-set: ``attempts`` writes in a
    row lost to other writers (``hcs_bus.kvcas``); the message names the key."""

    def __init__(self, key: str, *, attempts: int, delay_s: float = 1.0) -> None:
        super().__init__(
            f"hcs: {key}: {attempts} compare-and-set conflicts in a row", delay_s=delay_s
        )
        self.key, self.attempts = key, attempts


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


class DemandError(ValueError):
    """The pod is unreadable or asks for something wrong; the message says what."""


class JobError(DemandError):
    """The pod's job cannot be told; the message names the keys and values that disagree."""
