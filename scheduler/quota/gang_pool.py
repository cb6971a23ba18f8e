"""The shared pool applied to gangs: ``share_rules`` over gang records.
Pure: records, class figures and quota limits in, decisions out.

The gang loop (``scheduler.plan.gang_loop``) asks, each round:

* ``Pool.of``: the pool (one ``ClassRoom`` per class of the schedulable
  nodes), each namespace's ``Share`` (its ComputeQuota: guarantee, ceiling,
  weight) and what its gangs hold (the pledged records: ranks x devices x
  the class's ACU and VRAM per device);
* ``Pool.rank``: the queue order of the gangs ready to plan (priority, the
  namespace's weighted dominant share, age: ``share_rules.queue_order``),
  which ``gang_rules.admit_order`` follows (its starvation/backfill rule
  unchanged);
* ``Pool.refusal``: why a gang the plan would start may not take what it
  asks (its ceiling, or capacity kept for the unmet guarantees of other
  namespaces with gangs waiting: borrowing) — ``share_rules.entitled``;
* ``Pool.reclaim``: for the first waiting gang (in queue order) whose
  namespace stays within its guarantee once it runs, the pledged gangs of
  namespaces above their guarantee to take back (``share_rules.reclaim_for``:
  whole gangs, newest first, never a namespace below its own guarantee,
  within the ACU left of the budget this minute). Devices of gangs being
  reclaimed already (``freeing``) count as free, so one shortfall is
  reclaimed once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.plan.gang_records import GangRecord
from scheduler.plan.rules import ClassStats, QuotaLimits
from scheduler.quota import share_rules as sharing
from scheduler.quota.share_rules import NONE, Amount, ClassRoom, Job, Reclaim, Share


def rooms(classes: Iterable[ClassStats]) -> dict[str, ClassRoom]:
    """One room per class: its devices and the ACU/VRAM of one device."""
    return {c.key: ClassRoom(c.key, c.devices, c.acu, c.vram_mib) for c in classes if c.devices > 0}


def devices_per_rank(record: GangRecord) -> int:
    if record.ranks:
        return max(1, record.ranks[0].pledge.devices)
    asked = record.requests.devices if record.requests is not None else None
    return max(1, asked or 1)


def running_job(record: GangRecord) -> Job:
    """A pledged gang as ``share_rules`` counts it: whole ranks of its class,
    its age the time of its pledges (reclaim takes the newest first)."""
    ranks = len(record.ranks) or record.fewest
    return Job(
        key=record.key,
        namespace=record.namespace,
        ranks=ranks,
        devices_per_rank=devices_per_rank(record),
        classes=(record.class_key,),
        priority=record.priority,
        since_s=max((r.pledge.time_s for r in record.ranks), default=record.time_s),
        min_ranks=min(record.least, ranks) if record.elastic else None,
        max_ranks=record.size if record.elastic else None,
        cls=record.class_key,
    )


def waiting_job(record: GangRecord, *, priority: int) -> Job:
    """A gang ready to plan, on its pinned class, aged from its pinning (an
    elastic gang asks its least size: it starts with that and grows)."""
    return Job(
        key=record.key,
        namespace=record.namespace,
        ranks=record.fewest,
        devices_per_rank=devices_per_rank(record),
        classes=(record.class_key,),
        priority=priority,
        since_s=record.time_s,
    )


@dataclass(frozen=True, slots=True)
class Pool:
    classes: Mapping[str, ClassRoom]
    shares: Mapping[str, Share]
    running: tuple[Job, ...]
    used: Mapping[str, Amount] = field(default_factory=dict)

    @property
    def total(self) -> Amount:
        return sharing.pool_total(self.classes.values())

    @classmethod
    def of(
        cls,
        *,
        classes: Iterable[ClassStats],
        limits: Mapping[str, QuotaLimits | None],
        pledged: Iterable[GangRecord],
    ) -> Pool:
        room = rooms(classes)
        running = tuple(
            running_job(r) for r in pledged if r.state == "pledged" and r.class_key in room
        )
        total = sharing.pool_total(room.values())
        shares = {ns: sharing.share_of(ns, lim, pool=total) for ns, lim in limits.items()}
        return cls(room, shares, running, sharing.usage(running, room))

    def ask(self, job: Job) -> Amount:
        room = self.classes.get(job.classes[0]) if job.classes else None
        return room.amount(job.least * job.devices_per_rank) if room else NONE

    def rank(self, waiting: Sequence[Job]) -> dict[str, int]:
        """Each gang's place in the queue order (0 first)."""
        dominant = sharing.shares_of(self.used, self.shares, pool=self.total)
        return {j.key: i for i, j in enumerate(sharing.queue_order(waiting, dominant=dominant))}

    def refusal(self, job: Job, *, used: Mapping[str, Amount], hungry: Collection[str]) -> str:
        """Why ``job`` may not start now with ``used`` held ("" when it may)."""
        return sharing.entitled(
            job, self.ask(job), used=used, shares=self.shares, pool=self.total, hungry=hungry
        )

    def reclaim(
        self,
        waiting: Sequence[Job],
        *,
        free: Mapping[str, int],
        freeing: Mapping[str, int],
        budget_acu: float,
    ) -> tuple[Job, Reclaim] | None:
        """The first gang in ``waiting`` (queue order) owed room by a reclaim
        and what to take back for it (``ok`` False: why none is taken)."""
        room = {k: free.get(k, 0) + freeing.get(k, 0) for k in self.classes}
        for job in waiting:
            found = sharing.reclaim_for(
                job,
                running=self.running,
                classes=self.classes,
                shares=self.shares,
                used=self.used,
                free=room,
                budget_acu=budget_acu,
            )
            if found is not None:
                return job, found
        return None
