"""The shared pool applied to gangs: ``share_rules`` over gang records.
Pure: records, class figures and quota limits in, decisions out.

The gang loop (``scheduler.plan.gang_loop``) asks, each round:

* ``Pool.of``: the pool (one ``ClassRoom`` per class of the schedulable
  nodes), each namespace's ``Share`` (its ComputeQuota: guarantee, ceiling,
  weight) and what its gangs hold (the pledged records: ranks x devices x
  the class's ACU and VRAM per device);
* ``Pool.rank``: the queue order of the gangs ready to plan, as an
  admission pass of ``share_rules.admit`` takes it (``queue_order``, which
  ``hcs queue`` and the console show too): priority, then the weighted
  dominant share the namespace has once the gang runs (``share_after``: a
  large ask waits behind a small one, a namespace of low weight pays more
  for the same ask; a gang waiting longer than the starvation time counts
  the share now), then age. ``gang_rules.admit_order`` follows it (its
  starvation/backfill rule unchanged);
* ``Pool.refusal``: why a gang the plan would start may not take what it
  asks (its ceiling, or capacity kept for the unmet guarantees of other
  namespaces with gangs waiting: borrowing) — ``share_rules.entitled``;
* ``Pool.reclaim``: what to take back for a gang waiting for room (a
  ``Taking``, its ``kind`` named in the Events and the alert), the first
  rule that finds any: for the first waiting gang (in queue order) whose
  namespace stays within its guarantee once it runs, the pledged gangs of
  namespaces above their guarantee (``share_rules.reclaim_for``,
  ``GUARANTEE``); else elastic ranks above their least size, of any
  namespace, lent back to the first waiting gang (the starving head first)
  that they and the free devices let start (``lend_back_for``,
  ``LENT_BACK``: no work is lost); else, for that first gang, gangs of
  other namespaces of no higher priority whose weighted dominant share
  stays above its namespace's once it runs (``fair_reclaim_for``, ``FAIR``:
  a victim so queues behind it). Each takes elastic ranks above their
  least first, then whole gangs, newest first; never a namespace below
  its own guarantee; within the ACU left of the budget this minute.
  Devices of gangs being reclaimed already (``freeing``) count as free, so
  one shortfall is reclaimed once; the gangs started this round hold their
  room (and are no victims); the devices kept for the starving head are
  free to it alone.

The plan service asks, when a gang's first member is admitted:

* ``Pool.fairest``: the class the new gang is pinned to
  (``gang_service.GangPins``, through ``gang_records.pin``) when it fits
  whole now on several: the one its start leaves fairest
  (``share_rules.fairest_class``, as ``Rules.fair_class`` in ``admit``),
  the pinned gangs counted as the work waiting.
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


STARVATION_S = 300.0  # the gang loop's starvation rule, as ``hcs queue`` assumes it


def queue_order(
    waiting: Iterable[Job],
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
    now: float,
    starvation_s: float = STARVATION_S,
) -> list[Job]:
    """The pool's queue order (the gang loop's and ``hcs queue``'s): an
    admission pass's (``share_rules.pass_order``): priority, then the
    weighted dominant share the namespace has once the gang runs (the share
    now for a gang waiting longer than ``starvation_s``), then age."""
    jobs = list(waiting)
    return sharing.pass_order(
        jobs,
        used=used,
        shares=shares,
        pool=pool,
        classes=classes,
        fresh=sharing.fresh_keys(jobs, now=now, starvation_s=starvation_s),
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

    def rank(self, waiting: Sequence[Job], *, now: float, starvation_s: float) -> dict[str, int]:
        """Each gang's place in the queue order (0 first): an admission
        pass's (``share_rules.pass_order``)."""
        return {
            j.key: i for i, j in enumerate(self.order(waiting, now=now, starvation_s=starvation_s))
        }

    def order(self, waiting: Iterable[Job], *, now: float, starvation_s: float) -> list[Job]:
        return queue_order(
            waiting,
            used=self.used,
            shares=self.shares,
            pool=self.total,
            classes=self.classes,
            now=now,
            starvation_s=starvation_s,
        )

    def fairest(
        self, job: Job, able: Sequence[str], *, free: Mapping[str, int], waiting: Iterable[Job]
    ) -> str:
        """Of the classes ``able`` to hold ``job`` now, the one its start
        leaves fairest (``share_rules.fairest_class``), with the gangs
        ``waiting`` (each on its pinned class) as the work waiting."""
        asking = {job.namespace}
        pinned: dict[str, float] = {}
        for w in waiting:
            asking.add(w.namespace)
            for k in w.classes:
                pinned[k] = pinned.get(k, 0.0) + w.least * w.devices_per_rank / len(w.classes)
        return sharing.fairest_class(
            job,
            job.least * job.devices_per_rank,
            [k for k in able if k in self.classes],
            room=free,
            used=self.used,
            shares=self.shares,
            pool=self.total,
            classes=self.classes,
            asking=asking,
            pinned=pinned,
        )

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
        started: Sequence[Job] = (),
        hungry: Collection[str] = frozenset(),
        head: str = "",
        kept: Mapping[str, int] | None = None,
    ) -> Taking | None:
        """What to take back for whom (``reclaim.ok`` False: why nothing is
        taken): for the first gang in ``waiting`` (queue order, all waiting
        for room) owed room by a reclaim (``reclaim_for``); else ranks lent
        back to the first that they let start (the head first:
        ``lend_back_for``); else a fair reclaim for the first (the head
        first: ``fair_reclaim_for``). ``started``: the gangs started this
        round (on their class, ``cls``): they hold their room, and are no
        victims. ``kept``: the devices per class kept for the starving
        ``head``, free only to it."""
        room = {k: free.get(k, 0) + freeing.get(k, 0) for k in self.classes}
        used = dict(self.used)
        for job in started:
            if job.cls in room:
                room[job.cls] -= job.ranks * job.devices_per_rank
                used[job.namespace] = used.get(job.namespace, NONE) + sharing.holding(
                    job, self.classes
                )
        owed: Taking | None = None
        for job in waiting:
            found = sharing.reclaim_for(
                job,
                running=self.running,
                classes=self.classes,
                shares=self.shares,
                used=used,
                free=room,
                budget_acu=budget_acu,
            )
            if found is not None:
                owed = Taking(job, found, GUARANTEE)
                break
        if owed is not None and owed.reclaim.ok:
            return owed
        fair = self._toward_fair(
            waiting,
            used=used,
            room=room,
            budget_acu=budget_acu,
            hungry=hungry,
            head=head,
            kept=kept or {},
        )
        if fair is not None and (fair.reclaim.ok or owed is None):
            return fair
        return owed

    def _toward_fair(
        self,
        waiting: Sequence[Job],
        *,
        used: Mapping[str, Amount],
        room: Mapping[str, int],
        budget_acu: float,
        hungry: Collection[str],
        head: str,
        kept: Mapping[str, int],
    ) -> Taking | None:
        """Ranks lent back to the first gang (the head first) they let start;
        else a fair reclaim for the first (as ``share_rules.admit``)."""
        first = sorted(waiting, key=lambda j: j.key != head)  # stable: queue order kept
        others = {k: n - kept.get(k, 0) for k, n in room.items()}
        tries = [(job, sharing.lend_back_for, LENT_BACK) for job in first]
        tries += [(job, sharing.fair_reclaim_for, FAIR) for job in first[:1]]
        for job, find, kind in tries:
            free = room if job.key == head else others
            found = find(
                job,
                running=self.running,
                classes=self.classes,
                shares=self.shares,
                used=used,
                free=free,
                hungry=hungry,
                budget_acu=budget_acu,
            )
            if found is not None:
                return Taking(job, found, kind)
        return None


GUARANTEE, LENT_BACK, FAIR = "reclaimed for a guarantee", "lent back", "fair reclaim"


@dataclass(frozen=True, slots=True)
class Taking:
    """A reclaim for ``job``, and its kind: ``GUARANTEE`` (the gang runs
    within its namespace's guarantee), ``LENT_BACK`` (elastic ranks above
    their least) or ``FAIR`` (toward fair shares)."""

    job: Job
    reclaim: Reclaim
    kind: str
