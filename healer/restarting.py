"""Restarting gangs whole: a fault on one rank's device restarts every rank.

The ranks of a gang (pods carrying the same ``hcs.io/gang``, the injector's
``<namespace>/<job>/<run>``) only run together: a rank evicted alone leaves
its peers waiting in a collective for ever, and its replacement waits behind
HCS's gate for peers that never come. So when a pod to be evicted is a gang
member, the healer lists the pods of its namespace (``Kube.list_pods``),
finds every live member, asks the job to checkpoint when one of them runs the
checkpoint sidecar (``hcs.io/checkpoint-dir``; at most the checkpoint wait),
then evicts them all. Their controller re-creates them; the scheduler's gang
loop sees the replacements, pins the gang again and pledges it whole, and
the first rank's bind records the checkpoint every rank resumes from.

``split`` and ``members`` are pure; ``GangRestarts`` does the listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hcs_bus import vocabulary
from hcs_bus.errors import HcsError
from hcs_bus.telemetry import logger, meter, zero_init
from healer.bindings import Binding

_log = logger("hcs.healer.restarting")
RESTARTS = zero_init(
    meter("hcs.healer").create_counter(
        "hcs_healer_gang_restarts", description="gangs restarted whole, by outcome"
    ),
    {"outcome": "restarted"},
    {"outcome": "unlisted"},
)
FINISHED = vocabulary.POD_FINISHED


class Kube(Protocol):
    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        cached: bool = False,
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class Gang:
    """One gang to restart: its run key and every live member."""

    key: str  # <namespace>/<job>/<run>
    members: tuple[Binding, ...]
    sidecar: bool = False  # a member runs the checkpoint sidecar

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def job(self) -> str:
        return self.key.split("/")[1] if self.key.count("/") >= 1 else ""


@dataclass(frozen=True, slots=True)
class Split:
    """Victims of no gang (evicted as they are) and the gangs to restart whole."""

    alone: tuple[Binding, ...] = ()
    gangs: tuple[Gang, ...] = field(default_factory=tuple)


def gang_of(pod: Mapping[str, Any]) -> str:
    """The pod's ``hcs.io/gang`` run key; "" for a pod of no gang."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    found = notes.get(vocabulary.GANG)
    return found if isinstance(found, str) else ""


def live(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return phase not in FINISHED and not meta.get("deletionTimestamp")


def binding_of(pod: Mapping[str, Any], *, job: str) -> Binding:
    meta = pod.get("metadata") or {}
    return Binding(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        devices=frozenset(),
        job=job or None,
    )


def members(pods: Iterable[Mapping[str, Any]], key: str) -> Gang:
    """Every live pod of ``pods`` in gang ``key``."""
    found = [p for p in pods if gang_of(p) == key and live(p)]
    job = key.split("/")[1] if key.count("/") >= 1 else ""
    sidecar = any(
        vocabulary.CHECKPOINT_DIR in ((p.get("metadata") or {}).get("annotations") or {})
        for p in found
    )
    ordered = sorted((binding_of(p, job=job) for p in found), key=lambda b: b.key)
    return Gang(key=key, members=tuple(ordered), sidecar=sidecar)


def split(victims: Sequence[Binding], pods: Iterable[Mapping[str, Any]]) -> Split:
    """``victims`` (pods on a faulty device) as the pods of no gang and the
    gangs they are members of (``pods``: the pods of their namespaces). A
    victim is matched by name and uid; one not listed is evicted as it is."""
    listed = list(pods)
    by_name: dict[tuple[str, str], Mapping[str, Any]] = {}
    for pod in listed:
        meta = pod.get("metadata") or {}
        by_name[(str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = pod
    alone: list[Binding] = []
    keys: list[str] = []
    for victim in victims:
        found = by_name.get((victim.namespace, victim.name))
        uid = str(((found or {}).get("metadata") or {}).get("uid") or "")
        same = found is not None and (not victim.uid or uid == victim.uid)
        key = gang_of(found) if found is not None and same else ""
        if not key:
            alone.append(victim)
        elif key not in keys:
            keys.append(key)
    return Split(alone=tuple(alone), gangs=tuple(members(listed, k) for k in keys))


class GangRestarts:
    """Finds the gangs among a node's victims through the Kube adapter."""

    def __init__(self, kube: Kube | None) -> None:
        self.kube = kube

    async def split(self, victims: Sequence[Binding]) -> Split:
        """The victims of no gang and the gangs to restart whole; without a
        cluster (or when a namespace cannot be listed) the victims as they are."""
        if self.kube is None or not victims:
            return Split(alone=tuple(victims))
        pods: list[dict[str, Any]] = []
        alone = [v for v in victims if not v.job]  # a gang member always has a job
        for namespace in sorted({v.namespace for v in victims if v.job}):
            try:
                pods += await self.kube.list_pods(namespace=namespace)
            except (HcsError, OSError, TimeoutError) as exc:
                RESTARTS.add(1, {"outcome": "unlisted"})
                _log.warning("gang_members_unlisted", namespace=namespace, error=str(exc))
                alone += [v for v in victims if v.namespace == namespace]
        found = split([v for v in victims if v not in alone], pods)
        return Split(alone=(*alone, *found.alone), gangs=found.gangs)
