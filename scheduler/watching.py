"""Releases driven by the cluster: a pod deleted, or finished (Succeeded /
Failed), releases its devices; reservations stuck in ``reserved`` expire."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus.errors import HcsError
from hcs_bus.messages import PodRef
from hcs_bus.telemetry import logger
from scheduler.booking import Booker, Kube, pods_key

_log = logger("hcs.scheduler.watching")
FINISHED = ("Succeeded", "Failed")


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
