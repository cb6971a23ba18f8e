"""A shared pool: queues, fair share, borrowing and reclaim, in ACU and VRAM.
Pure: figures in, decisions out; no I/O, no clock (``now`` is passed in).

Each namespace has a ``Share`` (from its ComputeQuotas): a *guarantee* (ACU
and VRAM it always gets back), a *ceiling* it may borrow up to (today's
``spec.hard``; None: the whole pool) and a *weight*. The rules:

* **Dominant share** of a namespace: the larger of its ACU and VRAM held over
  the pool's, divided by its weight (weighted DRF).
* **Queue order** of waiting gangs: priority (highest first), then the
  weighted dominant share of the gang's namespace (lowest first), then age
  (oldest first), then key. Keys are unique, so the order is total.
* **Borrowing.** What a namespace may take now (``headroom``): the idle
  capacity less what the other namespaces' guarantees still lack (their
  unmet guarantee stays free for them), up to its own ceiling. A start
  beyond the namespace's guarantee is *borrowed*.
* **Reclaim.** A gang of a namespace whose use stays within its guarantee
  once the gang runs may take capacity back: victims are gangs of
  namespaces above their guarantee that hold devices of a class the gang
  can use, newest first; a victim is never taken when its namespace would
  fall below its own guarantee; elastic victims give up their highest ranks
  (down to their minimum) before a whole gang goes; the ACU taken in any
  minute stays within ``reclaim_acu_per_min``. A reclaim that cannot free
  enough takes nothing. Nothing is evicted because a quota is bad
  (``guarantee_conditions`` only reports it).
* **Backfill** (as ``gang_rules.admit_order``): a gang that cannot start is
  passed over and smaller ones behind it start where they fit, until it has
  waited longer than ``starvation_s``; the first such gang (the *head*) then
  claims the free devices of the class it can use with the most room (up to
  what it asks) and the gangs behind it start only in what is left, so a
  backfilled gang never delays it: its claimed room only grows as work ends.
  A backfill is also *fair*: a gang may not take devices of a class that a
  gang ahead of it waits for room on when its namespace's weighted dominant
  share would end above that gang's namespace's (``Rules.fair_backfill``).
* **Elastic gangs** (``min_ranks < max_ranks``) start at ``min_ranks``, grow
  one rank at a time into devices left idle once the pass has started every
  gang it could and the head's claim is kept (lowest weighted dominant share
  first, within headroom), and shrink highest ranks first on reclaim.

Devices are counted per class (``ClassRoom``); a rank takes
``devices_per_rank`` devices of one class, and a gang's ranks all take one
class (one collective library). Placement on nodes is ``gang_rules``'s; these
rules decide who may take how much.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.plan.rules import QuotaLimits

_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Amount:
    acu: float = 0.0
    vram_mib: int = 0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.acu + other.acu, self.vram_mib + other.vram_mib)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.acu - other.acu, self.vram_mib - other.vram_mib)

    def times(self, n: float) -> Amount:
        return Amount(self.acu * n, round(self.vram_mib * n))

    def within(self, other: Amount) -> bool:
        """Not above ``other`` in either resource."""
        return self.acu <= other.acu + _EPS and self.vram_mib <= other.vram_mib

    def covers(self, other: Amount) -> bool:
        """Not below ``other`` in either resource."""
        return self.acu >= other.acu - _EPS and self.vram_mib >= other.vram_mib

    def floor0(self) -> Amount:
        return Amount(max(self.acu, 0.0), max(self.vram_mib, 0))


NONE = Amount()


@dataclass(frozen=True, slots=True)
class ClassRoom:
    """One device class of the pool: how many devices, what each is worth."""

    key: str  # vendor/model
    devices: int
    acu_per_device: float
    vram_mib_per_device: int
    library: str = ""

    def amount(self, devices: int) -> Amount:
        return Amount(self.acu_per_device * devices, self.vram_mib_per_device * devices)


@dataclass(frozen=True, slots=True)
class Share:
    """A namespace's entitlement."""

    namespace: str
    guaranteed: Amount = NONE
    ceiling: Amount | None = None  # None: the whole pool
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Job:
    """A gang, waiting (``since_s``: when it began to wait) or running
    (``since_s``: when it started; ``cls``: its class; ``ranks``: now)."""

    key: str  # namespace/name, unique
    namespace: str
    ranks: int  # running: ranks held; waiting: the ranks it asks (elastic: max)
    devices_per_rank: int = 1
    classes: tuple[str, ...] = ()  # the classes it may run on; () any
    priority: int = 0
    since_s: float = 0.0
    min_ranks: int | None = None  # elastic: the fewest it runs with
    max_ranks: int | None = None  # elastic: the most it grows to
    cls: str = ""  # running: the class it holds

    @property
    def least(self) -> int:
        return self.min_ranks if self.min_ranks is not None else self.ranks

    @property
    def most(self) -> int:
        return max(self.max_ranks or self.ranks, self.ranks)

    def may_use(self, cls: str) -> bool:
        return not self.classes or cls in self.classes


def pool_total(classes: Iterable[ClassRoom]) -> Amount:
    total = NONE
    for c in classes:
        total += c.amount(c.devices)
    return total


def holding(job: Job, classes: Mapping[str, ClassRoom]) -> Amount:
    """What a running job holds."""
    return classes[job.cls].amount(job.ranks * job.devices_per_rank)


def usage(running: Iterable[Job], classes: Mapping[str, ClassRoom]) -> dict[str, Amount]:
    out: dict[str, Amount] = {}
    for job in running:
        out[job.namespace] = out.get(job.namespace, NONE) + holding(job, classes)
    return out


# -------------------------------------------------------------- fair share --


def dominant_share(used: Amount, *, pool: Amount, weight: float) -> float:
    """The larger of ACU and VRAM held over the pool's, over ``weight``."""
    acu = used.acu / pool.acu if pool.acu > 0 else 0.0
    vram = used.vram_mib / pool.vram_mib if pool.vram_mib > 0 else 0.0
    return max(acu, vram, 0.0) / max(weight, _EPS)


def shares_of(
    used: Mapping[str, Amount], shares: Mapping[str, Share], *, pool: Amount
) -> dict[str, float]:
    names = set(used) | set(shares)
    return {
        ns: dominant_share(used.get(ns, NONE), pool=pool, weight=_share(shares, ns).weight)
        for ns in names
    }


def order_key(job: Job, *, dominant: Mapping[str, float]) -> tuple[int, float, float, str]:
    return (-job.priority, round(dominant.get(job.namespace, 0.0), 9), job.since_s, job.key)


def queue_order(waiting: Iterable[Job], *, dominant: Mapping[str, float]) -> list[Job]:
    """Priority, then weighted dominant share, then age, then key."""
    return sorted(waiting, key=lambda j: order_key(j, dominant=dominant))


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one holds all."""
    if not values:
        return 1.0
    square = sum(v * v for v in values)
    if square <= 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * square)


# --------------------------------------------------------------- borrowing --


def _share(shares: Mapping[str, Share], namespace: str) -> Share:
    return shares.get(namespace) or Share(namespace)


def unmet(
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    *,
    but: str,
    hungry: Collection[str] | None = None,
) -> Amount:
    """What the guarantees of the namespaces other than ``but`` still lack
    (only those in ``hungry``, the namespaces with work waiting, when given:
    an idle namespace lends its guarantee until it asks, then reclaims it)."""
    out = NONE
    for ns, share in shares.items():
        if ns != but and (hungry is None or ns in hungry):
            out += (share.guaranteed - used.get(ns, NONE)).floor0()
    return out


def headroom(
    namespace: str,
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    hungry: Collection[str] | None = None,
) -> Amount:
    """What ``namespace`` may take now: the idle capacity less the unmet
    guarantees of the other (hungry) namespaces, up to its ceiling."""
    held_all = NONE
    for amount in used.values():
        held_all += amount
    mine = used.get(namespace, NONE)
    room = (pool - held_all - unmet(used, shares, but=namespace, hungry=hungry)).floor0()
    ceiling = _share(shares, namespace).ceiling
    if ceiling is not None:
        left = (ceiling - mine).floor0()
        room = Amount(min(room.acu, left.acu), min(room.vram_mib, left.vram_mib))
    return room


def borrowed(used: Amount, share: Share) -> Amount:
    """The part of ``used`` beyond the guarantee."""
    return (used - share.guaranteed).floor0()


def entitled(
    job: Job,
    ask: Amount,
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    hungry: Collection[str] | None = None,
) -> str:
    """Why ``job`` may not take ``ask`` now ("" when it may)."""
    share = _share(shares, job.namespace)
    mine = used.get(job.namespace, NONE)
    if share.ceiling is not None and not (mine + ask).within(share.ceiling):
        return (
            f"namespace {job.namespace} at its ceiling: holds {_fmt(mine)}, "
            f"asks {_fmt(ask)}, ceiling {_fmt(share.ceiling)}"
        )
    if not ask.within(headroom(job.namespace, used=used, shares=shares, pool=pool, hungry=hungry)):
        lack = unmet(used, shares, but=job.namespace, hungry=hungry)
        return (
            f"idle capacity is kept for other namespaces' guarantees ({_fmt(lack)} unmet); "
            f"asks {_fmt(ask)}"
        )
    return ""


def _fmt(a: Amount) -> str:
    return f"{a.acu:g} ACU/{a.vram_mib // 1024} GiB"


# ------------------------------------------------------------------ admit --


@dataclass(frozen=True, slots=True)
class Start:
    key: str
    cls: str
    ranks: int
    borrowed: Amount  # the part beyond the namespace's guarantee


@dataclass(frozen=True, slots=True)
class Waiting:
    key: str
    position: int  # 1 = next
    reason: str


@dataclass(frozen=True, slots=True)
class Taken:
    """A victim: ``ranks`` of a running gang (all of them: the whole gang)."""

    key: str
    namespace: str
    ranks: int
    whole: bool
    amount: Amount


@dataclass(frozen=True, slots=True)
class Reclaim:
    ok: bool
    reason: str
    victims: tuple[Taken, ...] = ()
    cls: str = ""

    @property
    def amount(self) -> Amount:
        total = NONE
        for v in self.victims:
            total += v.amount
        return total


@dataclass(frozen=True, slots=True)
class Admission:
    order: tuple[str, ...]  # every waiting gang, in queue order
    start: tuple[Start, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    grow: tuple[tuple[str, int], ...] = ()  # (running key, ranks added)
    reclaim: Reclaim | None = None
    head: str = ""  # the starving gang whose room is claimed


@dataclass(frozen=True, slots=True)
class Rules:
    starvation_s: float = 300.0
    reclaim_acu_per_min: float = float("inf")
    fair_backfill: bool = True


def free_devices(classes: Mapping[str, ClassRoom], running: Iterable[Job]) -> dict[str, int]:
    free = {k: c.devices for k, c in classes.items()}
    for job in running:
        free[job.cls] = free.get(job.cls, 0) - job.ranks * job.devices_per_rank
    return free


def _best_class(
    job: Job, ranks: int, free: Mapping[str, int], classes: Mapping[str, ClassRoom]
) -> str:
    """The tightest class that holds the ranks now ("" none): large rooms stay whole."""
    need = ranks * job.devices_per_rank
    able = [k for k in sorted(classes) if job.may_use(k) and free.get(k, 0) >= need]
    return min(able, key=lambda k: (free[k], k), default="")


def admit(
    waiting: Iterable[Job],
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    now: float,
    rules: Rules = Rules(),
    reclaimed_last_min_acu: float = 0.0,
) -> Admission:
    """One pass over the queue: who starts (and on which class), who waits
    (position and reason), which elastic gangs grow, and at most one
    reclaim (for the first gang in the order that is owed its guarantee)."""
    pool = pool_total(classes.values())
    used = usage(running, classes)
    order = queue_order(waiting, dominant=shares_of(used, shares, pool=pool))
    free = free_devices(classes, running)
    hungry = frozenset(j.namespace for j in order if _best_class(j, j.least, free, classes))
    claimed: dict[str, int] = {}
    starts: list[Start] = []
    waits: list[tuple[Job, str]] = []
    blocked: list[Job] = []  # waiting for room
    head = ""
    for job in _taken_in_order(order, used=used, shares=shares, pool=pool):
        room = {k: free[k] - claimed.get(k, 0) for k in free}
        why, start = _try(
            job, room=room, classes=classes, used=used, shares=shares, pool=pool, hungry=hungry
        )
        if start is not None and rules.fair_backfill:
            passed = _passes(
                job, start, blocked, used=used, shares=shares, pool=pool, classes=classes
            )
            if passed:
                why, start = passed, None
        if start is not None:
            starts.append(start)
            free[start.cls] -= start.ranks * job.devices_per_rank
            amount = classes[start.cls].amount(start.ranks * job.devices_per_rank)
            used[job.namespace] = used.get(job.namespace, NONE) + amount
            continue
        if not head and now - job.since_s > rules.starvation_s and why.startswith("room"):
            cls = _claim_class(job, free, classes)
            if cls:
                head = job.key
                claimed[cls] = min(free[cls], job.least * job.devices_per_rank)
                why += f"; waiting over {rules.starvation_s:g} s: {claimed[cls]} free {cls} kept for it"
        if why.startswith("room"):
            blocked.append(job)
        waits.append((job, why))
    reclaim = _first_reclaim(
        [j for j, _ in waits],
        running=running,
        classes=classes,
        shares=shares,
        used=used,
        free=free,
        budget_acu=rules.reclaim_acu_per_min - reclaimed_last_min_acu,
    )
    idle = {k: free[k] - claimed.get(k, 0) for k in free}
    grow = _grow(
        running, classes=classes, shares=shares, used=used, free=idle, pool=pool, hungry=hungry
    )
    return Admission(
        order=tuple(j.key for j in order),
        start=tuple(starts),
        waiting=tuple(Waiting(j.key, i + 1, why) for i, (j, why) in enumerate(waits)),
        grow=grow,
        reclaim=reclaim,
        head=head,
    )


def _passes(
    job: Job,
    start: Start,
    blocked: Sequence[Job],
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    classes: Mapping[str, ClassRoom],
) -> str:
    """Why ``start`` would be an unfair backfill ("" when it is not): it
    takes devices of a class a gang ahead of it waits for room on, and its
    namespace's weighted dominant share would end above that gang's."""
    mine = used.get(job.namespace, NONE) + classes[start.cls].amount(
        start.ranks * job.devices_per_rank
    )
    after = dominant_share(mine, pool=pool, weight=_share(shares, job.namespace).weight)
    for ahead in blocked:
        if ahead.namespace == job.namespace or not ahead.may_use(start.cls):
            continue
        theirs = dominant_share(
            used.get(ahead.namespace, NONE),
            pool=pool,
            weight=_share(shares, ahead.namespace).weight,
        )
        if after > theirs + _EPS:
            return (
                f"fair backfill: {ahead.key} waits for {start.cls} devices and namespace "
                f"{ahead.namespace} has the lower weighted share ({theirs:.3f} < {after:.3f})"
            )
    return ""


def _taken_in_order(
    order: Sequence[Job],
    *,
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
) -> Iterator[Job]:
    """The queue as a pass takes it: each next gang by ``order_key`` with the
    dominant shares as the starts before it left them (``used`` is updated
    by the caller between steps); the same order as ``order`` until a start
    changes a namespace's share."""
    left = list(order)
    while left:
        dominant = shares_of(used, shares, pool=pool)
        job = min(left, key=lambda j: order_key(j, dominant=dominant))
        left.remove(job)
        yield job


def _try(
    job: Job,
    *,
    room: Mapping[str, int],
    classes: Mapping[str, ClassRoom],
    used: Mapping[str, Amount],
    shares: Mapping[str, Share],
    pool: Amount,
    hungry: Collection[str],
) -> tuple[str, Start | None]:
    """The start of ``job`` (at its least ranks) or why not."""
    ranks = job.least
    cls = _best_class(job, ranks, room, classes)
    if not cls:
        usable = [k for k in sorted(classes) if job.may_use(k)]
        most = max((room.get(k, 0) for k in usable), default=0)
        return (
            f"room: needs {ranks * job.devices_per_rank} devices of one class "
            f"({', '.join(job.classes) or 'any'}); most free {most}",
            None,
        )
    ask = classes[cls].amount(ranks * job.devices_per_rank)
    why = entitled(job, ask, used=used, shares=shares, pool=pool, hungry=hungry)
    if why:
        return why, None
    mine = used.get(job.namespace, NONE)
    lent = borrowed(mine + ask, _share(shares, job.namespace)) - borrowed(
        mine, _share(shares, job.namespace)
    )
    return "", Start(job.key, cls, ranks, lent.floor0())


def _claim_class(job: Job, free: Mapping[str, int], classes: Mapping[str, ClassRoom]) -> str:
    need = job.least * job.devices_per_rank
    able = [k for k in sorted(classes) if job.may_use(k) and classes[k].devices >= need]
    return min(able, key=lambda k: (-free.get(k, 0), k), default="")


def _grow(
    running: Sequence[Job],
    *,
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: dict[str, Amount],
    free: dict[str, int],
    pool: Amount,
    hungry: Collection[str],
) -> tuple[tuple[str, int], ...]:
    """Elastic gangs grow one rank at a time, lowest weighted dominant share
    first, into free devices of their class within their headroom: devices
    no waiting gang could take in this pass (every gang that fits and may
    start has started) and no starving head claims."""
    room = {j.key: j.ranks for j in running if j.most > j.ranks}
    most = {j.key: j.most for j in running}
    added: dict[str, int] = {}
    while True:
        dominant = shares_of(used, shares, pool=pool)
        able = [
            j
            for j in running
            if j.key in room
            and room[j.key] + added.get(j.key, 0) < most[j.key]
            and free.get(j.cls, 0) >= j.devices_per_rank
            and classes[j.cls]
            .amount(j.devices_per_rank)
            .within(headroom(j.namespace, used=used, shares=shares, pool=pool, hungry=hungry))
        ]
        if not able:
            break
        job = min(able, key=lambda j: order_key(j, dominant=dominant))
        added[job.key] = added.get(job.key, 0) + 1
        free[job.cls] -= job.devices_per_rank
        used[job.namespace] = used.get(job.namespace, NONE) + classes[job.cls].amount(
            job.devices_per_rank
        )
    return tuple(sorted(added.items()))


# ---------------------------------------------------------------- reclaim --


def owed(job: Job, ask: Amount, *, used: Mapping[str, Amount], shares: Mapping[str, Share]) -> bool:
    """Whether ``job`` runs within its namespace's guarantee (reclaim may serve it)."""
    share = _share(shares, job.namespace)
    return (used.get(job.namespace, NONE) + ask).within(share.guaranteed)


def _first_reclaim(
    waits: Sequence[Job],
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    budget_acu: float,
) -> Reclaim | None:
    for job in waits:
        found = reclaim_for(
            job,
            running=running,
            classes=classes,
            shares=shares,
            used=used,
            free=free,
            budget_acu=budget_acu,
        )
        if found is not None:
            return found
    return None


def reclaim_for(
    job: Job,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
    free: Mapping[str, int],
    budget_acu: float,
) -> Reclaim | None:
    """The victims whose devices let ``job`` start within its guarantee;
    None when it is not owed one (it would borrow), a refused ``Reclaim``
    (with its reason) when no class can be freed within the rules."""
    need = job.least * job.devices_per_rank
    tried: list[Reclaim] = []
    for cls in sorted(classes):
        if not job.may_use(cls) or classes[cls].devices < need:
            continue
        if not owed(job, classes[cls].amount(need), used=used, shares=shares):
            continue
        short = need - free.get(cls, 0)
        if short <= 0:
            continue  # room is there: it waits on nothing reclaim can give
        tried.append(
            _victims(job, cls, short, running=running, classes=classes, shares=shares, used=used)
        )
    if not tried:
        return None
    found = [r for r in tried if r.ok]
    if not found:
        return tried[0]
    best = min(found, key=lambda r: (r.amount.acu, len(r.victims), r.cls))
    if best.amount.acu > budget_acu + _EPS:
        return Reclaim(
            ok=False,
            reason=f"reclaim for {job.key} deferred: {best.amount.acu:g} ACU over the "
            f"budget left this minute ({max(budget_acu, 0.0):g} ACU)",
            cls=best.cls,
        )
    return best


def _victims(
    job: Job,
    cls: str,
    short: int,
    *,
    running: Sequence[Job],
    classes: Mapping[str, ClassRoom],
    shares: Mapping[str, Share],
    used: Mapping[str, Amount],
) -> Reclaim:
    left = dict(used)
    room = classes[cls]
    taken: list[Taken] = []
    freed = 0
    on_class = [r for r in running if r.cls == cls and r.namespace != job.namespace]
    newest = sorted(on_class, key=lambda r: (-r.since_s, r.key))
    # elastic ranks above their minimum first, then whole gangs; newest first in each
    for elastic_pass in (True, False):
        for victim in newest:
            if freed >= short:
                break
            spare = victim.ranks - victim.least
            if elastic_pass and spare <= 0:
                continue
            already = sum(t.ranks for t in taken if t.key == victim.key)
            if elastic_pass:
                ranks = min(spare, -(-(short - freed) // victim.devices_per_rank))
            else:
                ranks = victim.ranks - already
            if ranks <= 0:
                continue
            amount = room.amount(ranks * victim.devices_per_rank)
            after = left.get(victim.namespace, NONE) - amount
            if not after.covers(_share(shares, victim.namespace).guaranteed):
                continue  # never below its own guarantee
            left[victim.namespace] = after
            taken.append(
                Taken(victim.key, victim.namespace, ranks, ranks + already == victim.ranks, amount)
            )
            freed += ranks * victim.devices_per_rank
    if freed < short:
        return Reclaim(
            ok=False,
            reason=f"reclaim for {job.key}: namespaces above their guarantee hold "
            f"{freed} of the {short} {cls} devices it lacks",
            cls=cls,
        )
    return Reclaim(
        ok=True,
        reason=f"reclaim for {job.key} (within its guarantee): {freed} {cls} devices",
        victims=_merged(taken),
        cls=cls,
    )


def _merged(taken: Sequence[Taken]) -> tuple[Taken, ...]:
    out: dict[str, Taken] = {}
    for t in taken:
        was = out.get(t.key)
        if was is None:
            out[t.key] = t
        else:
            out[t.key] = replace(
                was, ranks=was.ranks + t.ranks, whole=t.whole, amount=was.amount + t.amount
            )
    return tuple(out.values())


def spent_last_minute(history: Iterable[tuple[float, float]], *, now: float) -> float:
    """ACU reclaimed in ``(now - 60, now]`` from (time, ACU) records."""
    return sum(acu for t, acu in history if now - 60.0 < t <= now)


# -------------------------------------------------------------- conditions --


@dataclass(frozen=True, slots=True)
class Condition:
    """One ``status.conditions`` entry of a ComputeQuota."""

    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


def guarantee_conditions(
    shares: Mapping[str, Share],
    *,
    pool: Amount,
    by_class: Mapping[str, Mapping[str, Amount]] | None = None,
    class_pool: Mapping[str, Amount] | None = None,
) -> dict[str, Condition]:
    """``GuaranteeFits`` per namespace: False with the reason when its
    guarantee is larger than the pool (``GuaranteeExceedsPool``), a class
    guarantee larger than that class (``ClassGuaranteeExceedsClass``), or all
    guarantees together exceed the pool (``GuaranteesOversubscribed``: every
    namespace with a guarantee is told). Reported only: nothing running is
    evicted because of it."""
    total = NONE
    for s in shares.values():
        total += s.guaranteed
    out: dict[str, Condition] = {}
    for ns, share in sorted(shares.items()):
        g = share.guaranteed
        if not g.within(pool):
            out[ns] = Condition(
                "GuaranteeFits",
                "False",
                "GuaranteeExceedsPool",
                f"guarantee {_fmt(g)} is larger than the pool ({_fmt(pool)})",
            )
            continue
        bad = _class_problem(by_class.get(ns, {}) if by_class else {}, class_pool or {})
        if bad:
            out[ns] = Condition("GuaranteeFits", "False", "ClassGuaranteeExceedsClass", bad)
            continue
        if g != NONE and not total.within(pool):
            out[ns] = Condition(
                "GuaranteeFits",
                "False",
                "GuaranteesOversubscribed",
                f"the guarantees of all namespaces sum to {_fmt(total)}, beyond the pool "
                f"({_fmt(pool)}); this one ({_fmt(g)}) may not be met in full",
            )
            continue
        out[ns] = Condition("GuaranteeFits", "True", "Fits", f"guarantee {_fmt(g)} fits the pool")
    return out


def _class_problem(mine: Mapping[str, Amount], class_pool: Mapping[str, Amount]) -> str:
    for cls, g in sorted(mine.items()):
        have = class_pool.get(cls, NONE)
        if not g.within(have):
            return f"guarantee on {cls} {_fmt(g)} is larger than that class ({_fmt(have)})"
    return ""


# ------------------------------------------------------------ from quotas --


def share_of(namespace: str, limits: QuotaLimits | None, *, pool: Amount | None = None) -> Share:
    """A namespace's share from its ComputeQuota limits: no quota, no
    guarantee and the whole pool as ceiling; a ceiling given in one resource
    only leaves the other unbounded; a guarantee given in one resource only
    guarantees the same fraction of ``pool`` in the other (nothing when the
    pool is not given)."""
    if limits is None:
        return Share(namespace)
    ceiling = None
    if limits.acu is not None or limits.vram_mib is not None:
        ceiling = Amount(
            limits.acu if limits.acu is not None else _UNBOUNDED_ACU,
            limits.vram_mib if limits.vram_mib is not None else _UNBOUNDED_MIB,
        )
    acu, vram = limits.guaranteed_acu, limits.guaranteed_vram_mib
    if pool is not None and pool.acu > 0 and pool.vram_mib > 0:
        if acu is not None and vram is None:
            vram = round(acu / pool.acu * pool.vram_mib)
        elif vram is not None and acu is None:
            acu = vram / pool.vram_mib * pool.acu
    if ceiling is not None:  # a derived guarantee stays under the ceiling
        acu = min(acu, ceiling.acu) if acu is not None else None
        vram = min(vram, ceiling.vram_mib) if vram is not None else None
    return Share(
        namespace,
        guaranteed=Amount(acu or 0.0, vram or 0),
        ceiling=ceiling,
        weight=limits.weight,
    )


def class_guarantees(limits: QuotaLimits | None) -> dict[str, Amount]:
    """Guarantees per class (vendor/model or collective library)."""
    if limits is None:
        return {}
    return {key: Amount(acu or 0.0, vram or 0) for key, vram, acu in limits.guaranteed_classes}


_UNBOUNDED_ACU = float("inf")
_UNBOUNDED_MIB = 1 << 62
