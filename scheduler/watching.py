"""Releases driven by the cluster: a pod deleted, or finished (Succeeded /
Failed), releases its devices; reservations stuck in ``reserved`` expire.

The watch only sees what happens while it runs: a pod deleted while no
replica watched (a restart, a lost release) is found by ``reconcile``,
which lists the pods and releases every bound reservation whose pod is
gone or finished."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus.errors import HcsError
from hcs_bus.messages import PodRef, Reservation
from hcs_bus.telemetry import logger
from scheduler.booking import Booker, Kube, pods_key

_log = logger("hcs.scheduler.watching")
FINISHED = ("Succeeded", "Failed")
RECONCILE_S = 120.0


def release_reason(kind: str, pod: dict[str, Any]) -> str | None:
    """Why a watch event releases the pod's devices, or None."""
    if kind == "DELETED":
        return "pod deleted"
    phase = (pod.get("status") or {}).get("phase")
    if kind in ("ADDED", "MODIFIED") and phase in FINISHED:
        return f"pod {phase.lower()}"
    return None


def pod_ref(pod: dict[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
    )


async def watch_pods(kube: Kube, booker: Booker, *, retry_s: float = 2.0) -> None:
    """Follow pod events forever; the watch is re-opened when it ends."""
    while True:
        try:
            async for kind, pod in kube.watch_pods():
                await on_pod_event(booker, kind, pod)
        except HcsError as exc:
            _log.warning("pod_watch_failed", error=str(exc), retry_s=retry_s)
        await asyncio.sleep(retry_s)


async def on_pod_event(booker: Booker, kind: str, pod: dict[str, Any]) -> bool:
    reason = release_reason(kind, pod)
    if reason is None:
        return False
    ref = pod_ref(pod)
    if booker.state.find_pod(pods_key(ref)) is None:
        return False
    event = await booker.release(ref, reason=reason)
    if event is not None:
        _log.info("released", pod=ref.name, namespace=ref.namespace, node=event.node, reason=reason)
    return event is not None


async def expire_loop(booker: Booker, *, ttl_s: float) -> None:
    period = max(ttl_s / 4, 0.05)
    while True:
        await asyncio.sleep(period)
        try:
            await booker.expire(ttl_s=ttl_s)
        except HcsError as exc:
            _log.warning("expiry_failed", error=str(exc))


def orphans(
    held: list[tuple[str, Reservation]], pods: list[dict[str, Any]]
) -> list[tuple[str, Reservation, str]]:
    """Bound reservations whose pod is not in ``pods`` (or finished there),
    with the reason to release them. ``held`` must be read before ``pods``."""
    alive: dict[str, tuple[str, str | None]] = {}
    for pod in pods:
        ref = pod_ref(pod)
        alive[pods_key(ref)] = (ref.uid, (pod.get("status") or {}).get("phase"))
    out: list[tuple[str, Reservation, str]] = []
    for node, r in held:
        found = alive.get(pods_key(r.pod))
        if found is None or (r.pod.uid and found[0] and found[0] != r.pod.uid):
            out.append((node, r, "pod gone"))
        elif found[1] in FINISHED:
            out.append((node, r, f"pod {str(found[1]).lower()}"))
    return out


async def reconcile(kube: Kube, booker: Booker) -> int:
    """Release bound reservations of pods the cluster no longer runs."""
    held = [
        (node.name, r)
        for node in list(booker.state.nodes.values())
        for r in node.reservations.values()
        if r.state == "bound"
    ]
    if not held:
        return 0
    released = 0
    for node, r, reason in orphans(held, await kube.list_pods()):
        if await booker.release(r.pod, reason=reason, node=node) is not None:
            _log.info("released_orphan", pod=r.pod.name, namespace=r.pod.namespace, node=node)
            released += 1
    return released


async def reconcile_loop(
    kube: Kube, booker: Booker, *, ready: asyncio.Event, period_s: float = RECONCILE_S
) -> None:
    await ready.wait()
    while True:
        try:
            await reconcile(kube, booker)
        except HcsError as exc:
            _log.warning("reconcile_failed", error=str(exc))
        await asyncio.sleep(period_s)
