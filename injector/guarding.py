"""Who may set which ``hcs.io/*`` annotation, and which pods may hold devices.

Deny by default: every ``hcs.io/*`` annotation is reserved for HCS's own
service accounts except the policy and opt-in annotations a user writes
(``USER_ANNOTATIONS`` and the ``hcs.io/engine-<param>`` family). The kubelet
resolves device env from reserved annotations at every container start, so a
user who could write them could pick any device on the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from hcs_bus import vocabulary

PREFIX: Final = vocabulary.PREFIX
USER_ANNOTATIONS: Final = frozenset(
    {
        vocabulary.VENDORS,
        vocabulary.MODELS,
        vocabulary.SUBSTITUTION,
        vocabulary.JOB,
        vocabulary.TOPOLOGY,
        vocabulary.REBIND,
        vocabulary.ENGINE,
        vocabulary.FRAMEWORK,
        vocabulary.CODE_PATH,
        vocabulary.REPLAN,
    }
)
USER_PREFIXES: Final = (vocabulary.ENGINE_PARAM_PREFIX,)
PLAN: Final = vocabulary.PLAN
PLAN_SIG: Final = vocabulary.PLAN_SIG
PLEDGE: Final = vocabulary.PLEDGE
# what the webhook itself writes at CREATE (a user's copy is refused or
# overwritten there); deploy/components/kubernetes-1.30 lets exactly these through
WRITTEN_AT_CREATE: Final = frozenset(
    {PLAN, PLAN_SIG, PLEDGE, vocabulary.TRACEPARENT, vocabulary.SUBMITTED}
)


def is_reserved(key: str) -> bool:
    if not key.startswith(PREFIX):
        return False
    return key not in USER_ANNOTATIONS and not key.startswith(USER_PREFIXES)


def reserved(annotations: Mapping[str, Any] | None) -> list[str]:
    """The reserved keys among ``annotations``, sorted."""
    if not annotations:
        return []
    return sorted(key for key in annotations if is_reserved(key))


def reserved_changes(new: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> list[str]:
    """Reserved keys added, removed or changed between ``old`` and ``new``."""
    new = new or {}
    old = old or {}
    keys = set(reserved(new)) | set(reserved(old))
    return sorted(key for key in keys if new.get(key) != old.get(key))


def is_hcs(username: str, service_accounts: Iterable[str]) -> bool:
    return username in set(service_accounts)


def privileged(containers: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the privileged containers among ``containers``."""
    names = []
    for container in containers:
        context = container.get("securityContext") or {}
        if isinstance(context, dict) and context.get("privileged") is True:
            names.append(str(container.get("name", "?")))
    return names


def reserved_message(keys: list[str], *, username: str) -> str:
    return (
        f"annotations {', '.join(keys)} are reserved for HCS and may only be set by its "
        f"service accounts (request by {username or 'an unknown user'}); "
        f"users may set {', '.join(sorted(USER_ANNOTATIONS))} and hcs.io/engine-<param>"
    )
