"""``hcs queue [--json]``: the shared pool as the ledger shows it now.

Reads the ledger from the bus (KV ``hcs_alloc``: the reservations and the
pledges, as ``hcs check`` does), the fleet (the fingerprints, for the pool's
ACU and VRAM) and the ComputeQuotas (the cluster's, else
``scheduler.quota_file``), then prints:

* each namespace's guaranteed / used / borrowed / ceiling (ACU and VRAM) and
  its weighted dominant share (``scheduler.quota.share_rules``);
* the queue, in the shared pool's order (priority, weighted dominant share,
  age, key), each with its position and reason: the gangs waiting whole
  (their gang records ``gangs=<namespace>=<job>=<run>``, pinned: holding
  nothing; the reason names the ceiling, or the guarantees of other waiting
  namespaces their borrowing would take, else the room they wait for) and
  the pods admitted and not yet bound (their pledges);
* the running gangs (reservations grouped by job, else by pod).

What it prints is ``scheduler.quota.queue_view.view`` (the document the
console's ``GET /api/queue`` answers from a replica's memory).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from hcs_bus import kube as kube_mod
from hcs_bus import kvkeys, streams
from hcs_bus.bus import Bus
from hcs_bus.settings import Settings
from scheduler.ledger import audit_store
from scheduler.plan import gang_records
from scheduler.plan.rules import ClassStats, QuotaLimits, summarise
from scheduler.quota.queue_view import namespaces_of, pool_of, view
from scheduler.quota.source import QuotaSource, read_file
from scheduler.view.follow_loop import ClusterView

VIEW_TIMEOUT_S = 10.0


def table(found: Mapping[str, Any]) -> str:
    def acu(a: Mapping[str, Any] | None) -> str:
        return "-" if a is None or a["acu"] is None else f"{a['acu']:g}"

    def gib(a: Mapping[str, Any] | None) -> str:
        return "-" if a is None or a["vram_mib"] is None else f"{a['vram_mib'] / 1024:g}Gi"

    pool = found["pool"]
    lines = [f"pool: {pool['acu']:g} ACU, {pool['vram_mib'] / 1024:g}Gi VRAM (columns: ACU/VRAM)"]
    lines.append(
        f"{'NAMESPACE':<16}{'WEIGHT':>7}{'GUARANTEED':>18}{'USED':>18}{'BORROWED':>18}"
        f"{'CEILING':>18}{'SHARE':>8}"
    )
    for n in found["namespaces"]:
        cells = [f"{acu(n[k])}/{gib(n[k])}" for k in ("guaranteed", "used", "borrowed", "ceiling")]
        lines.append(
            f"{n['namespace']:<16}{n['weight']:>7g}"
            + "".join(f"{c:>18}" for c in cells)
            + f"{n['dominant_share']:>8.3f}"
        )
    lines.append("")
    if not found["queue"]:
        lines.append("queue: empty")
    for q in found["queue"]:
        lines.append(
            f"{q['position']:>3}. {q['job']} (priority {q['priority']}, waited "
            f"{q['waited_s']:g} s): {q['reason']}"
        )
    lines.append("")
    lines.append(f"running: {len(found['running'])} gangs")
    for r in found["running"]:
        lines.append(
            f"  {r['job']}: {r['ranks']} pods on {r['class']}, {r['acu']:g} ACU, "
            f"for {r['running_s']:g} s"
        )
    return "\n".join(lines)


def render(found: Mapping[str, Any], *, as_json: bool) -> str:
    return json.dumps(found, indent=2) if as_json else table(found)


async def pool_and_classes(bus: Bus, settings: Settings) -> dict[str, ClassStats]:
    """The fleet's classes as the scheduler's view summarises them (empty
    when no fingerprint arrives in ``VIEW_TIMEOUT_S``)."""
    fleet = ClusterView(bus, settings=settings.scheduler)
    await fleet.start()
    try:
        try:
            await fleet.wait_ready(timeout_s=VIEW_TIMEOUT_S)
        except TimeoutError:
            return {}
        return dict(summarise(fleet.state.schedulable()).classes)
    finally:
        await fleet.stop()


async def quota_limits(
    settings: Settings, namespaces: Iterable[str]
) -> dict[str, QuotaLimits | None]:
    """Each namespace's ComputeQuota limits: the cluster's when one is
    configured, else ``scheduler.quota_file`` (every namespace it names)."""
    kube = await kube_mod.connect(settings.kube)
    if kube is None:
        path = settings.scheduler.quota_file
        found = read_file(path) if path else {}
        return {ns: found.get(ns) for ns in sorted(set(namespaces) | set(found))}
    source = QuotaSource(kube=kube, file=None)
    try:
        return {ns: await source.limits(ns) for ns in sorted(set(namespaces))}
    finally:
        await kube.close()


async def run(bus: Bus, settings: Settings, *, as_json: bool, now: float) -> int:
    ledger = await audit_store.read_ledger(bus)
    pledges = await audit_store.read_pledges(bus)
    classes = await pool_and_classes(bus, settings)
    gangs = [
        gang_records.DECODER.decode(value)
        for _, value in await kvkeys.stored_values(
            bus, streams.KV_ALLOC, wanted=gang_records.is_gang_key
        )
    ]
    seen = namespaces_of(ledger.values(), pledges.values(), gangs)
    limits = await quota_limits(settings, seen)
    found = view(
        ledger.values(),
        pledges.values(),
        limits=limits,
        pool=pool_of(classes),
        now=now,
        gangs=gangs,
        classes=classes,
    )
    print(render(found, as_json=as_json))
    return 0
