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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from hcs_bus import kube as kube_mod
from hcs_bus import kvkeys, streams
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeReservations
from hcs_bus.settings import Settings
from scheduler.ledger import audit_store
from scheduler.ledger.pledge_rules import NamespacePledges
from scheduler.plan import gang_records
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.rules import HOLDING, ClassStats, QuotaLimits, summarise
from scheduler.quota import gang_pool
from scheduler.quota import share_rules as rules
from scheduler.quota.share_rules import Amount, Job
from scheduler.quota.source import QuotaSource, read_file
from scheduler.view.follow_loop import ClusterView

VIEW_TIMEOUT_S = 10.0


def _running(docs: Iterable[NodeReservations]) -> dict[str, tuple[Job, Amount]]:
    """Running gangs: the holding reservations grouped by (namespace, job or pod)."""
    out: dict[str, tuple[Job, Amount]] = {}
    for doc in docs:
        for r in doc.reservations:
            if r.state not in HOLDING:
                continue
            key = f"{r.pod.namespace}/{r.job or r.pod.name}"
            held = Amount(r.acu, sum(max(d.vram_mib, 0) for d in r.devices))
            was = out.get(key)
            if was is None:
                job = Job(
                    key=key,
                    namespace=r.pod.namespace,
                    ranks=1,
                    priority=r.priority,
                    since_s=r.time_s,
                    cls=f"{r.vendor}/{r.model}",
                )
                out[key] = (job, held)
            else:
                job, amount = was
                out[key] = (
                    Job(
                        key=key,
                        namespace=job.namespace,
                        ranks=job.ranks + 1,
                        priority=max(job.priority, r.priority),
                        since_s=min(job.since_s, r.time_s),
                        cls=job.cls,
                    ),
                    amount + held,
                )
    return out


def _waiting(docs: Iterable[NamespacePledges]) -> list[Job]:
    out = []
    for doc in docs:
        for p in doc.pledges:
            if p.spent_s is not None:
                continue
            name = p.name or p.generate_name or p.id
            out.append(
                Job(
                    key=f"{doc.namespace}/{name}#{p.id}",
                    namespace=doc.namespace,
                    ranks=1,
                    devices_per_rank=p.devices,
                    classes=(f"{p.vendor}/{p.model}",),
                    since_s=p.time_s,
                )
            )
    return out


ADMITTED = "admitted; its pledge holds room until the pod is bound"


def _gangs(found: Iterable[GangRecord]) -> dict[str, tuple[Job, GangRecord]]:
    """The gangs waiting whole (pinned records), as the gang loop ranks them."""
    out = {}
    for record in found:
        if record.state == "pinned":
            job = gang_pool.waiting_job(record, priority=record.priority)
            key = "/".join(p for p in (record.namespace, record.job, record.run) if p)
            out[key] = (replace(job, key=key), record)
    return out


def _gang_reason(
    job: Job,
    record: GangRecord,
    *,
    classes: Mapping[str, ClassStats],
    used: Mapping[str, Amount],
    shares: Mapping[str, rules.Share],
    pool: Amount,
    hungry: frozenset[str],
) -> str:
    devices = job.ranks * job.devices_per_rank
    stats = classes.get(record.class_key)
    if stats is not None:
        ask = Amount(stats.acu * devices, stats.vram_mib * devices)
        held = Amount()
        for amount in used.values():
            held += amount
        ceiling = shares[job.namespace].ceiling
        over = ceiling is not None and not (used.get(job.namespace, Amount()) + ask).within(ceiling)
        if over or ask.within((pool - held).floor0()):  # else: it waits for room
            why = rules.entitled(job, ask, used=used, shares=shares, pool=pool, hungry=hungry)
            if why:
                return f"gang waits whole, holding nothing: {why}"
    return (
        f"gang waits whole, holding nothing: {record.size} ranks need {devices} "
        f"{record.class_key} devices free at once"
    )


def view(
    ledger: Iterable[NodeReservations],
    pledges: Iterable[NamespacePledges],
    *,
    limits: Mapping[str, QuotaLimits | None],
    pool: Amount,
    now: float,
    gangs: Iterable[GangRecord] = (),
    classes: Mapping[str, ClassStats] | None = None,
) -> dict[str, Any]:
    """The queue and the namespaces' shares (pure: what ``hcs queue`` prints)."""
    running = _running(ledger)
    waiting_gangs = _gangs(gangs)
    waiting = _waiting(pledges) + [job for job, _ in waiting_gangs.values()]
    used: dict[str, Amount] = {}
    for job, amount in running.values():
        used[job.namespace] = used.get(job.namespace, Amount()) + amount
    names = sorted(set(used) | set(limits) | {j.namespace for j in waiting})
    shares = {ns: rules.share_of(ns, limits.get(ns), pool=pool) for ns in names}
    dominant = rules.shares_of(used, shares, pool=pool)
    order = rules.queue_order(waiting, dominant=dominant)
    hungry = frozenset(job.namespace for job, _ in waiting_gangs.values())
    reasons = {
        key: _gang_reason(
            job,
            record,
            classes=classes or {},
            used=used,
            shares=shares,
            pool=pool,
            hungry=hungry,
        )
        for key, (job, record) in waiting_gangs.items()
    }
    return {
        "pool": {"acu": round(pool.acu, 3), "vram_mib": pool.vram_mib},
        "namespaces": [
            _namespace(ns, shares[ns], used.get(ns, Amount()), dominant) for ns in names
        ],
        "queue": [
            {
                "position": i + 1,
                "job": j.key,
                "namespace": j.namespace,
                "priority": j.priority,
                "waited_s": round(max(now - j.since_s, 0.0), 1),
                "reason": reasons.get(j.key, ADMITTED),
            }
            for i, j in enumerate(order)
        ],
        "running": [
            {
                "job": job.key,
                "ranks": job.ranks,
                "class": job.cls,
                "acu": round(amount.acu, 3),
                "vram_mib": amount.vram_mib,
                "running_s": round(max(now - job.since_s, 0.0), 1),
            }
            for job, amount in sorted(running.values(), key=lambda x: x[0].key)
        ],
    }


def _namespace(
    ns: str, share: rules.Share, used: Amount, dominant: Mapping[str, float]
) -> dict[str, Any]:
    lent = rules.borrowed(used, share)
    ceiling = share.ceiling
    return {
        "namespace": ns,
        "weight": share.weight,
        "guaranteed": _amount(share.guaranteed),
        "used": _amount(used),
        "borrowed": _amount(lent),
        "ceiling": _amount(ceiling) if ceiling is not None else None,
        "dominant_share": round(dominant.get(ns, 0.0), 4),
    }


def _amount(a: Amount) -> dict[str, Any]:
    acu = None if a.acu == float("inf") else round(a.acu, 3)
    vram = None if a.vram_mib >= 1 << 60 else a.vram_mib
    return {"acu": acu, "vram_mib": vram}


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


def pool_of(classes: Mapping[str, ClassStats]) -> Amount:
    total = Amount()
    for c in classes.values():
        total += Amount(c.acu * c.devices, c.vram_mib * c.devices)
    return total


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
    seen = {r.pod.namespace for doc in ledger.values() for r in doc.reservations} | set(pledges)
    limits = await quota_limits(settings, seen | {g.namespace for g in gangs})
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
