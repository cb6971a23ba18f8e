"""The shared pool's queue as the ledger shows it: each namespace's
guaranteed / used / borrowed / ceiling (ACU and VRAM) and weighted dominant
share (``scheduler.quota.share_rules``), the queue in the pool's order with
each entry's position and reason, and the running gangs. Pure: what
``hcs queue --json`` prints and the console's ``GET /api/queue`` answers,
from the reservations, the pledges, the gang records, the quotas and the
fleet's classes; no I/O, no clock (``now`` is passed in).

The queue holds the gangs waiting whole (their pinned gang records, holding
nothing; the reason names the ceiling, or the guarantees of other waiting
namespaces their borrowing would take, else the room they wait for) and the
pods admitted and not yet bound (their unspent pledges). The running gangs
are the holding reservations grouped by job, else by pod.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from hcs_bus.messages import NodeReservations
from scheduler.ledger.pledge_rules import NamespacePledges
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.rules import HOLDING, ClassStats, QuotaLimits
from scheduler.quota import gang_pool
from scheduler.quota import share_rules as rules
from scheduler.quota.share_rules import Amount, Job


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
    starvation_s: float = gang_pool.STARVATION_S,
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
    order = gang_pool.queue_order(
        waiting,
        used=used,
        shares=shares,
        pool=pool,
        classes=gang_pool.rooms((classes or {}).values()),
        now=now,
        starvation_s=starvation_s,
    )
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


def pool_of(classes: Mapping[str, ClassStats]) -> Amount:
    total = Amount()
    for c in classes.values():
        total += Amount(c.acu * c.devices, c.vram_mib * c.devices)
    return total


def namespaces_of(
    ledger: Iterable[NodeReservations],
    pledges: Iterable[NamespacePledges],
    gangs: Iterable[GangRecord] = (),
) -> set[str]:
    """The namespaces the ledger names: holding devices, pledging, or with a gang record."""
    held = {r.pod.namespace for doc in ledger for r in doc.reservations}
    return held | {doc.namespace for doc in pledges} | {g.namespace for g in gangs}
