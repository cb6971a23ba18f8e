"""Who may set which ``hcs.io/*`` annotation, and which pods may hold devices.

Deny by default: every ``hcs.io/*`` annotation is reserved for HCS's own
service accounts except the policy and opt-in annotations a user writes
(``USER_ANNOTATIONS`` and the ``hcs.io/engine-<param>`` family). The kubelet
resolves device env from reserved annotations at every container start, so a
user who could write them could pick any device on the node.

A pod HCS places holds no container that reaches past its share of the
node's devices: none privileged, none adding a capability of
``PRIVILEGED_CAPABILITIES``, and the pod shares neither the host's PID nor IPC
namespace (``privileges``), unless its service account is allow-listed.
Names are compared as JSON decodes them: ``hcs.io\\u002fplan`` is
``hcs.io/plan``.
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
        vocabulary.JOB_SIZE,
        vocabulary.JOB_MIN,
        vocabulary.JOB_MAX,
        vocabulary.CHECKPOINT_DIR,
        vocabulary.RESUME_RUN,
    }
)
USER_PREFIXES: Final = (vocabulary.ENGINE_PARAM_PREFIX,)
PLAN: Final = vocabulary.PLAN
PLAN_SIG: Final = vocabulary.PLAN_SIG
PLEDGE: Final = vocabulary.PLEDGE
# what the webhook itself writes at CREATE (a user's copy is refused or
# overwritten there); deploy/components/kubernetes-1.30 lets exactly these through
WRITTEN_AT_CREATE: Final = frozenset(
    {
        PLAN,
        PLAN_SIG,
        PLEDGE,
        vocabulary.TRACEPARENT,
        vocabulary.SUBMITTED,
        vocabulary.GANG,
        vocabulary.GANG_SIZE,
    }
)
# a container granted one of these (Kubernetes spelling, ``CAP_`` optional) can
# reach devices, memory or processes outside its slice, or load eBPF programs
PRIVILEGED_CAPABILITIES: Final = frozenset(
    {"ALL", "SYS_ADMIN", "SYS_PTRACE", "SYS_MODULE", "SYS_RAWIO", "BPF"}
)
_HOST_NAMESPACES: Final = ("hostPID", "hostIPC")
_CONTAINER_FIELDS: Final = ("initContainers", "containers", "ephemeralContainers")


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


def privileges(pod: Mapping[str, Any]) -> list[str]:
    """What in ``pod`` reaches past its device share, each as ``field: value``
    naming the container: privileged containers, added capabilities among
    ``PRIVILEGED_CAPABILITIES``, the host's PID or IPC namespace."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    found = [f"spec.{key}: true" for key in _HOST_NAMESPACES if spec.get(key) is True]
    for field in _CONTAINER_FIELDS:
        items = spec.get(field)
        for index, container in enumerate(items if isinstance(items, list) else []):
            if isinstance(container, Mapping):
                found += _container_privileges(container, where=f"spec.{field}[{index}]")
    return found


def _container_privileges(container: Mapping[str, Any], *, where: str) -> list[str]:
    context = container.get("securityContext")
    if not isinstance(context, Mapping):
        return []
    head = f"{where} ({container.get('name', '?')}) securityContext"
    found = []
    if context.get("privileged") is True:
        found.append(f"{head}.privileged: true")
    capabilities = context.get("capabilities")
    added = capabilities.get("add") if isinstance(capabilities, Mapping) else None
    if isinstance(added, list):
        risky = [str(c) for c in added if _capability(c) in PRIVILEGED_CAPABILITIES]
        if risky:
            found.append(f"{head}.capabilities.add: {', '.join(risky)}")
    return found


def _capability(value: object) -> str:
    return str(value).strip().upper().removeprefix("CAP_")


def service_account(pod: Mapping[str, Any], *, namespace: str) -> str:
    """``namespace/name`` of the service account ``pod`` runs as (``default``
    when it names none, as the API server's own admission fills in)."""
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    name = spec.get("serviceAccountName") or spec.get("serviceAccount") or "default"
    return f"{namespace}/{name}"


def privileged_message(found: list[str], *, account: str) -> str:
    return (
        f"pods HCS places may not run privileged containers or share the host's PID or IPC "
        f"namespace (they reach every device on the node, outside the pod's share): "
        f"{'; '.join(found)}; service account {account} is not in "
        f"injector.privileged_service_accounts"
    )


def reserved_message(keys: list[str], *, username: str) -> str:
    return (
        f"annotations {', '.join(keys)} are reserved for HCS and may only be set by its "
        f"service accounts (request by {username or 'an unknown user'}); "
        f"users may set {', '.join(sorted(USER_ANNOTATIONS))} and hcs.io/engine-<param>"
    )
