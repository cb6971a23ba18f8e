"""Releases driven by the cluster: a pod deleted, or finished (Succeeded /
Failed), releases its devices; reservations stuck in ``reserved`` expire.
Node labels followed from the cluster: the Node watch hands each Node's
labels to the view (network group, RDMA fabric; a deleted Node's are dropped).

The watch only sees what happens while it runs: a pod deleted while no
replica watched (a restart, a lost release) is found by ``reconcile``,
which lists the pods and releases every bound reservation whose pod is
gone or finished. ``reconcile`` also rebuilds the ledger from the pods
(``scheduler.ledger.audit_rules``): a reservation on a node its pod is not bound to is
released, and a pod bound by HCS without a ``bound`` reservation gets it
back from its ``hcs.io/devices`` and ``hcs.io/vram-quota`` annotations.

The pod watch follows only the pods whose ``spec.schedulerName`` is HCS's
(a field selector): every pod HCS binds or pledges for carries it (the
injector sets it on every pod it plans), so the other pods' events are not
sent nor decoded. Anything else (a pod whose schedulerName was changed, a
reservation whose pod is not ours) is still found by ``reconcile``, which
lists every pod unfiltered. The same watch feeds ``PendingPods``, the
pending HCS pods the stranding scan reads instead of listing them."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus.errors import HcsError
from hcs_bus.messages import PodRef, Reservation
from hcs_bus.telemetry import logger
from scheduler.ledger import audit_rules as ledger
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.reservation_store import Booker, Kube, pods_key
from scheduler.replan.pending_pods import PendingPods
from scheduler.view.follow_loop import ClusterView
from scheduler.view.state import ClusterState

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


async def watch_pods(
    kube: Kube,
    booker: Booker,
    *,
    scheduler_name: str,
    pending: PendingPods | None = None,
    retry_s: float = 2.0,
) -> None:
    """Follow the events of HCS's pods forever; the watch is re-opened when
    it ends. ``pending`` is kept from them, emptied at each (re)start and
    synced again once the new watch's first list has been taken."""
    selector = f"spec.schedulerName={scheduler_name}"
    synced = pending.synced if pending is not None else None
    while True:
        if pending is not None:
            pending.restart()
        try:
            async for kind, pod in kube.watch_pods(field_selector=selector, synced=synced):
                if pending is not None:
                    pending.apply(kind, pod)
                await on_pod_event(booker, kind, pod)
        except HcsError as exc:
            _log.warning("pod_watch_failed", error=str(exc), retry_s=retry_s)
        await asyncio.sleep(retry_s)


async def on_pod_event(booker: Booker, kind: str, pod: dict[str, Any]) -> bool:
    reason = release_reason(kind, pod)
    if reason is None:
        return False
    ref = pod_ref(pod)
    pledge = pledges.pledge_of(pod)
    if pledge and booker.unpledge is not None:
        await booker.unpledge(ref.namespace, pledge, reason=reason)
    if booker.state.find_pod(pods_key(ref)) is None:
        return False
    event = await booker.release(ref, reason=reason)
    if event is not None:
        _log.info("released", pod=ref.name, namespace=ref.namespace, node=event.node, reason=reason)
    return event is not None


async def watch_nodes(kube: Kube, view: ClusterView, *, retry_s: float = 2.0) -> None:
    """Follow the Nodes' labels forever; the watch is re-opened when it ends."""
    while True:
        try:
            async for kind, node in kube.watch_nodes(synced=view.nodes_synced):
                on_node_event(view, kind, node)
        except HcsError as exc:
            _log.warning("node_watch_failed", error=str(exc), retry_s=retry_s)
        await asyncio.sleep(retry_s)


def on_node_event(view: ClusterView, kind: str, node: dict[str, Any]) -> bool:
    """Hand one Node event's labels, and whether it takes new pods, to the
    view; True when either changed."""
    meta = node.get("metadata") or {}
    name = meta.get("name")
    if not name or kind not in ("ADDED", "MODIFIED", "DELETED"):
        return False
    labels = None if kind == "DELETED" else dict(meta.get("labels") or {})
    blocked = None if kind == "DELETED" else node_block(node)
    changed = view.apply_node(str(name), labels, blocked=blocked)
    if changed:
        _log.info("node_changed", node=name, change=kind, blocked=blocked)
    return changed


LIFECYCLE_TAINTS = "node.kubernetes.io/"  # not-ready, unreachable, unschedulable, *-pressure, ...
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def node_block(node: dict[str, Any]) -> str | None:
    """Why kube-scheduler places no new pod on this Node, or None: cordoned
    (``spec.unschedulable``), or a node-lifecycle taint (``node.kubernetes.io/*``,
    set by the node controller and the kubelet) with effect NoSchedule or
    NoExecute. Pods asking for devices do not tolerate those (DaemonSets
    do); other taints are the pod's business and kube-scheduler's filter."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "cordoned (spec.unschedulable)"
    for taint in spec.get("taints") or []:
        key, effect = str(taint.get("key") or ""), str(taint.get("effect") or "")
        if key.startswith(LIFECYCLE_TAINTS) and effect in BLOCKING_EFFECTS:
            return f"taint {key}:{effect}"
    return None


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


def misplaced(
    held: list[tuple[str, Reservation]], pods: list[dict[str, Any]]
) -> list[tuple[str, Reservation, str]]:
    """Reservations on a node their pod is not bound to (it is bound to
    another), with that other node. ``held`` must be read before ``pods``."""
    bound_to: dict[str, tuple[str, str]] = {}
    for pod in pods:
        node = ledger.node_of(pod)
        if node:
            ref = pod_ref(pod)
            bound_to[pods_key(ref)] = (ref.uid, node)
    out: list[tuple[str, Reservation, str]] = []
    for node, r in held:
        found = bound_to.get(pods_key(r.pod))
        if found is None or (r.pod.uid and found[0] and found[0] != r.pod.uid):
            continue
        if found[1] != node:
            out.append((node, r, found[1]))
    return out


def unbooked(state: ClusterState, pods: list[dict[str, Any]]) -> list[ledger.Claim]:
    """Pods bound by HCS whose node's view holds no ``bound`` reservation for
    them (none at all, or one still ``reserved``)."""
    out: list[ledger.Claim] = []
    for pod in pods:
        try:
            claim = ledger.claim_of(pod)
        except ledger.BadClaim as exc:
            _log.error("pod_annotations_unreadable", pod=pods_key(pod_ref(pod)), error=str(exc))
            continue
        if claim is None:
            continue
        node = state.nodes.get(claim.node)
        held = node.reservations.get(pods_key(claim.pod)) if node is not None else None
        if held is None or held.state != "bound" or not ledger.same_pod(held.pod, claim.pod):
            out.append(claim)
    return out


async def reconcile(kube: Kube, booker: Booker) -> int:
    """Make the ledger agree with the pods: release reservations of pods gone,
    finished or bound to another node; restore (CAS) the reservation of every
    pod bound by HCS that has none, from its annotations, reporting any
    over-commit that reveals. Returns the number of documents changed."""
    held = [
        (node.name, r)
        for node in list(booker.state.nodes.values())
        for r in node.reservations.values()
    ]
    listed = await kube.list_pod_summaries()
    changed = 0
    bound = [(n, r) for n, r in held if r.state == "bound"]
    for node, r, reason in orphans(bound, listed):
        if await booker.release(r.pod, reason=reason, node=node) is not None:
            _log.info("released_orphan", pod=r.pod.name, namespace=r.pod.namespace, node=node)
            changed += 1
    for node, r, other in misplaced(held, listed):
        if await booker.release(r.pod, reason=f"pod bound to {other}", node=node) is not None:
            _log.warning("released_misplaced", pod=pods_key(r.pod), node=node, bound_to=other)
            changed += 1
    for claim in unbooked(booker.state, listed):
        changed += await _restore(kube, booker, claim)
    return changed


async def _restore(kube: Kube, booker: Booker, claim: ledger.Claim) -> int:
    """Re-read the pod (the list may be old), then CAS its reservation in."""
    try:
        fresh = ledger.claim_of(await kube.get_pod(claim.pod.namespace, claim.pod.name))
    except (HcsError, ledger.BadClaim) as exc:  # gone since the list, or unreadable
        _log.info("restore_skipped", pod=pods_key(claim.pod), reason=str(exc))
        return 0
    if fresh is None or fresh.node != claim.node or fresh.pod.uid != claim.pod.uid:
        return 0
    node = booker.state.nodes.get(claim.node)
    if node is None:
        _log.warning("restore_skipped", pod=pods_key(claim.pod), reason="node unknown to HCS")
        return 0
    devices = {i: d.fp for i, d in node.devices.items()}
    try:
        reservation = ledger.rebuilt(fresh, devices, now=booker.clock())
    except ledger.BadClaim as exc:
        _log.error("restore_failed", pod=pods_key(claim.pod), node=claim.node, error=str(exc))
        return 0
    if await booker.hold_bound(reservation, node=claim.node, reason="rebuilt from annotations"):
        await booker.announce(claim.node, reservation, state="bound", reason="rebuilt by reconcile")
        return 1
    return 0


async def first_reconcile(kube: Kube, booker: Booker, *, retry_s: float = 1.0) -> None:
    """The reconcile a replica runs before it takes binds (a step of the
    view's ``before_ready``), tried until it succeeds: a pod bound by HCS whose
    reservation the ledger lost (a crash, a KV restored from an old snapshot,
    an older version's expiry) holds its devices again before a bind could
    hand them out a second time. Without the API server no bind can be
    posted either, so the replica stays unready meanwhile."""
    while True:
        try:
            changed = await reconcile(kube, booker)
        except HcsError as exc:
            _log.warning("reconcile_failed", error=str(exc), before="ready")
            await asyncio.sleep(retry_s)
            continue
        _log.info("ledger_reconciled", changed=changed, before="ready")
        return


async def reconcile_loop(
    kube: Kube, booker: Booker, *, ready: asyncio.Event, period_s: float = RECONCILE_S
) -> None:
    """Reconcile every ``period_s`` once ready (the first pass came before it)."""
    await ready.wait()
    while True:
        await asyncio.sleep(period_s)
        try:
            await reconcile(kube, booker)
        except HcsError as exc:
            _log.warning("reconcile_failed", error=str(exc))
