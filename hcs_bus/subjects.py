"""Subject builders and parsers (docs/architecture.md#subjects).

A Kubernetes node name becomes one subject token by replacing ``.`` with
``_``; node names never contain ``_`` so the mapping is reversible.

The healer's verdicts (and dry-run actions) about a node go on
``hcs.health._healer_<nodetoken>``: still one token under ``hcs.health.*`` (the
alert feed and stream ``HCS_HEALTH`` carry them), but a token no node can have
(a node name never starts with ``.``, so a node token never starts with ``_``).
No agent may publish there (``hcs_bus.permissions``), and consumers take a
``source: healer`` event only from there (``hcs_bus.identity``).

Plans come on two subjects so that NATS permissions say who may pledge:
``hcs.place`` (a plan that pledges: the injector's admissions only) and
``hcs.place.dry`` (dry runs: ``hcs place``, admission dry runs); the
service refuses a request whose ``dry_run`` disagrees with its subject.

A request-reply service answers only into an inbox (``is_inbox``):
``_INBOX.<…>`` or a per-user ``_INBOX_<USER>.<…>`` (``hcs_bus.permissions``),
never a stream, bucket or JetStream API subject a requester names.
"""

from __future__ import annotations

from typing import Final

FP_PREFIX: Final = "hcs.fp."
HEALTH_PREFIX: Final = "hcs.health."
ALLOC_PREFIX: Final = "hcs.alloc."
CKPT_PREFIX: Final = "hcs.ckpt."
CKPT_REQUEST_PREFIX: Final = "hcs.ckpt.request."
DLQ_PREFIX: Final = "hcs.dlq."
USAGE_PREFIX: Final = "hcs.usage."
HEALER_MARK: Final = "_healer_"  # a health token that is the healer's, never a node's
PLACE: Final = "hcs.place"  # plans that pledge (non-dry-run): the injector only
PLACE_DRY: Final = "hcs.place.dry"  # dry-run plans: nothing recorded
RELEASE: Final = "hcs.release"
PLACE_QUEUE: Final = "hcs-scheduler"
INBOX: Final = "_INBOX"  # nats-py's default inbox prefix; per-user ones are _INBOX_<USER>

FP_ALL: Final = "hcs.fp.*"
HEALTH_ALL: Final = "hcs.health.*"
ALLOC_ALL: Final = "hcs.alloc.*"
DLQ_ALL: Final = "hcs.dlq.>"
USAGE_ALL: Final = "hcs.usage.*"

_FORBIDDEN = set(" \t\r\n*>")


class SubjectError(ValueError):
    """A name that cannot become, or a subject that is not, an HCS subject."""


def node_token(node: str) -> str:
    if not node or "_" in node or node.startswith(".") or _FORBIDDEN & set(node):
        raise SubjectError(f"node name {node!r} cannot be a subject token")
    return node.replace(".", "_")


def node_from_token(token: str) -> str:
    if not token or "." in token:
        raise SubjectError(f"{token!r} is not a node token")
    return token.replace("_", ".")


def _plain_token(name: str, *, what: str) -> str:
    if not name or "." in name or _FORBIDDEN & set(name):
        raise SubjectError(f"{what} {name!r} cannot be a subject token")
    return name


def fp(node: str) -> str:
    return FP_PREFIX + node_token(node)


def health(node: str) -> str:
    return HEALTH_PREFIX + node_token(node)


def healer_health(node: str) -> str:
    """Where the healer publishes its verdicts and actions about ``node``."""
    return HEALTH_PREFIX + HEALER_MARK + node_token(node)


def is_healer_health(subject: str) -> bool:
    return subject.startswith(HEALTH_PREFIX + HEALER_MARK)


def alloc(node: str) -> str:
    return ALLOC_PREFIX + node_token(node)


def ckpt(namespace: str, job: str) -> str:
    ns = _plain_token(namespace, what="namespace")
    return f"{CKPT_PREFIX}{ns}.{_plain_token(job, what='job')}"


def ckpt_request(namespace: str, job: str) -> str:
    ns = _plain_token(namespace, what="namespace")
    return f"{CKPT_REQUEST_PREFIX}{ns}.{_plain_token(job, what='job')}"


NO_RUN: Final = "_"  # the run token of a job whose run is unknown


def ckpt_key(namespace: str, job: str, run: str = "") -> str:
    """Key of the latest checkpoint of one run of a job in KV ``hcs_ckpt``:
    ``<namespace>.<job>.<run>`` (``NO_RUN`` for a run that is unknown)."""
    return f"{ckpt_job_keys(namespace, job)[:-1]}{_plain_token(run or NO_RUN, what='run')}"


def ckpt_job_keys(namespace: str, job: str) -> str:
    """The keys of every run of a job in KV ``hcs_ckpt`` (``<namespace>.<job>.*``)."""
    return f"{_plain_token(namespace, what='namespace')}.{_plain_token(job, what='job')}.*"


def alloc_key(node: str) -> str:
    """Key of a node's reservations in KV ``hcs_alloc``."""
    return node_token(node)


def usage(namespace: str) -> str:
    """Where a namespace's usage alerts go (core NATS, ``UsageAlert``)."""
    return USAGE_PREFIX + _plain_token(namespace, what="namespace")


def place(*, dry_run: bool) -> str:
    """Where a plan request goes: dry runs and pledging plans apart."""
    return PLACE_DRY if dry_run else PLACE


def is_inbox(subject: str) -> bool:
    """Whether ``subject`` is a reply inbox (``_INBOX.<…>``, ``_INBOX_<USER>.<…>``):
    at least two tokens, none empty, no wildcard, no whitespace or control character."""
    first, dot, rest = subject.partition(".")
    if not dot or not rest or (first != INBOX and not first.startswith(INBOX + "_")):
        return False
    if any(ch in "*>" or ord(ch) <= 0x20 or ord(ch) == 0x7F for ch in subject):
        return False
    return "" not in subject.split(".")


def dlq(subject: str) -> str:
    return DLQ_PREFIX + subject


def node_of(subject: str) -> str:
    """The node a per-node subject (fp, health, the healer's health, alloc) is about."""
    for prefix in (FP_PREFIX, HEALTH_PREFIX + HEALER_MARK, HEALTH_PREFIX, ALLOC_PREFIX):
        if subject.startswith(prefix):
            return node_from_token(subject[len(prefix) :])
    raise SubjectError(f"{subject!r} is not a per-node HCS subject")
